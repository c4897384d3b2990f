"""Saving and loading networks and training checkpoints: one ``.npz`` file each, no pickle.

Format (portable: NumPy's ``.npz`` is a zip of ``.npy`` arrays, readable from any language
with a zip and an ``.npy`` reader):

- a **network** file (``LiftedNetwork.save(path)``) holds the arrays ``W_0 .. W_L`` (weights, the
  last column the bias, as in eq. (1) of the paper) and ``meta``: a 0-d string array with a JSON
  object ``{"format": "fenchel_cvx.LiftedNetwork/1", "version": <package version>, "config":
  {...}}``. ``config`` is the architecture and the hyperparameters: ``input_shape``, ``layers``
  (``[{"kind": "dense", "units": 300}, ...]``), ``activations`` (``[{"name": "relu"}, ...]``,
  with any parameter such as a leaky ReLU's ``slope``), ``loss``, ``lam``, ``rho``, ``seed`` and
  ``dtype``;
- a **checkpoint** (``fit_bcd(checkpoint=DIR)``) is ``DIR/checkpoint.npz``: the network's
  arrays, the run's state (``X_1 .. X_L`` of the current batch, the proximal centre ``W0_l``,
  and with ``momentum`` the weights before the last extrapolation ``W_prev_l``) and ``meta``
  (format ``"fenchel_cvx.BCDCheckpoint/1"``): the network's config, the position in the
  schedule (rounds done), the history so far, a digest of the training data and the settings
  of the run (``bcd.BCDState``).

Every file is written atomically: to a temporary file in the same folder, then renamed over
the target, so an interrupted write never leaves a half-written file. Loading uses
``np.load(..., allow_pickle=False)``.
"""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from .arrays import to_numpy
from .network import LiftedNetwork

NETWORK_FORMAT = "fenchel_cvx.LiftedNetwork/1"
CHECKPOINT_FORMAT = "fenchel_cvx.BCDCheckpoint/1"
CHECKPOINT_FILE = "checkpoint.npz"


def atomic_write(path, write) -> Path:
    """Call ``write(binary_file)`` on a temporary file beside ``path``, then rename it over
    ``path``: readers see the old file or the whole new one, never a half-written one."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def write_text(path, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically."""
    return atomic_write(path, lambda f: f.write(text.encode()))


def write_json(path, obj) -> Path:
    """Write ``obj`` as JSON to ``path`` atomically."""
    return write_text(path, json.dumps(obj, indent=1))


def write_npz(path, arrays: dict[str, Any], meta: dict) -> Path:
    """Write ``arrays`` and the JSON object ``meta`` to ``path`` atomically; returns the path."""
    payload = {k: to_numpy(v) for k, v in arrays.items()}
    payload["meta"] = np.array(json.dumps(meta))
    return atomic_write(path, lambda f: np.savez(f, allow_pickle=False, **payload))


def read_npz(path, expected_format: str) -> tuple[dict[str, np.ndarray], dict]:
    """The arrays and the meta object of a file written by :func:`write_npz`."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"path must be an existing file written by fenchel_cvx, got {str(path)!r}")
    try:
        with np.load(path, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
        meta = json.loads(str(arrays.pop("meta")))
    except (OSError, ValueError, KeyError) as err:
        raise ValueError(f"{str(path)!r} is not a fenchel_cvx file: {err}") from None
    if meta.get("format") != expected_format:
        raise ValueError(f"{str(path)!r} holds {meta.get('format')!r}, expected {expected_format!r}")
    return arrays, meta


# --- networks ---------------------------------------------------------------------------------
def network_config(net) -> dict:
    """The JSON-able architecture and hyperparameters of ``net`` (``LiftedNetwork.get_config``)."""
    return net.get_config()


def network_from_config(cfg: dict) -> LiftedNetwork:
    """A freshly initialised ``LiftedNetwork`` with the architecture of ``cfg``."""
    try:
        return LiftedNetwork.from_config(cfg)
    except (KeyError, TypeError) as err:
        raise ValueError(f"not a network config (LiftedNetwork.get_config): {err!r}") from None


def _weights(net, arrays: dict, prefix: str, source) -> list:
    W = [arrays[f"{prefix}{l}"] for l in range(len(net.W))]
    for l, (new, old) in enumerate(zip(W, net.W)):
        if new.shape != old.shape:
            raise ValueError(f"{source}: {prefix}{l} has shape {new.shape}, the architecture "
                             f"needs {old.shape}")
    return W


def save_network(net, path) -> Path:
    """Write ``net`` (weights, architecture, hyperparameters, dtype, version) to ``path``."""
    from . import __version__

    meta = dict(format=NETWORK_FORMAT, version=__version__, config=network_config(net))
    return write_npz(path, {f"W_{l}": W for l, W in enumerate(net.W)}, meta)


def load_network(path) -> LiftedNetwork:
    """The network saved at ``path`` by :func:`save_network` (NumPy weights)."""
    arrays, meta = read_npz(path, NETWORK_FORMAT)
    net = network_from_config(meta["config"])
    net.W = _weights(net, arrays, "W_", path)
    return net


# --- checkpoints ------------------------------------------------------------------------------
def data_digest(*arrays) -> str:
    """A SHA-256 of the arrays' shapes, dtypes and bytes (resume checks it is the same data)."""
    h = hashlib.sha256()
    for A in arrays:
        A = np.ascontiguousarray(to_numpy(A))
        h.update(f"{A.shape}{A.dtype.str}".encode())
        h.update(A.tobytes())
    return h.hexdigest()


def checkpoint_path(directory) -> Path:
    return Path(directory) / CHECKPOINT_FILE


def save_checkpoint(directory, net, state, settings: dict) -> Path:
    """Write the state of a run (``bcd.BCDState``) to ``directory/checkpoint.npz``."""
    from . import __version__

    arrays = {f"W_{l}": W for l, W in enumerate(state.W)}
    arrays.update({f"X_{l + 1}": X for l, X in enumerate(state.Xs or [])})
    arrays.update({f"W0_{l}": W for l, W in enumerate(state.W0 or []) if W is not None})
    arrays.update({f"W_prev_{l}": W for l, W in enumerate(state.W_prev or [])})
    meta = dict(format=CHECKPOINT_FORMAT, version=__version__, config=network_config(net),
                iteration=state.iteration, has_Xs=state.Xs is not None,
                history=state.history.to_dict(), settings=settings)
    return write_npz(checkpoint_path(directory), arrays, meta)


def load_checkpoint(path) -> tuple[dict, dict]:
    """``(arrays, meta)`` of a checkpoint: ``path`` is its folder or its ``.npz`` file."""
    path = Path(path)
    return read_npz(checkpoint_path(path) if path.is_dir() else path, CHECKPOINT_FORMAT)


def check_writable_dir(name: str, directory) -> Path:
    """Create ``directory`` if needed and prove it writable, or raise ValueError naming ``name``."""
    directory = Path(directory)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".probe.", dir=directory)
        os.close(fd)
        os.unlink(probe)
    except OSError as err:
        raise ValueError(f"{name} must be a writable folder, got {str(directory)!r} "
                         f"({err.strerror or err})") from None
    return directory
