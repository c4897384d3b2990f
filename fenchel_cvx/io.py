"""Saving and loading networks and training checkpoints: one ``.npz`` file each, no pickle.

Format (portable: NumPy's ``.npz`` is a zip of ``.npy`` arrays, readable from any language
with a zip and an ``.npy`` reader):

- a **network** file (``LiftedNetwork.save(path)``) holds the arrays ``W_0 .. W_L`` (weights, the
  last column the bias, as in eq. (2) of the paper) and ``meta``: a 0-d string array with a JSON
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

Every file is written atomically: to a temporary file ``.<name>.<random>.tmp`` in the same
folder, then renamed over the target, so an interrupted write never leaves a half-written file;
:func:`remove_temporaries` deletes the temporary files a killed run left (a resumed run, or a new
one in the same folder, calls it). Destinations are checked before any work
(:func:`check_destination`).

Every file is read through the checked reader of ``files.py``: the zip container, each array's
``.npy`` header (dtype, shape) against the config, the config's sizes against the memory budget
(``validation.check_memory``), the weights' finiteness, and, in a checkpoint, a round counter that
is an integer with a history of as many rounds. A file that fails raises ``FileFormatError``
naming the file, the array or field, and what was expected against what was found. Nothing is
unpickled. The ``format`` field carries the file's kind and version: files of this version (1)
load; a newer version is refused with what to do.
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
from .errors import FileFormatError
from .files import NpzFile
from .network import LiftedNetwork

NETWORK_FORMAT = "fenchel_cvx.LiftedNetwork/1"
CHECKPOINT_FORMAT = "fenchel_cvx.BCDCheckpoint/1"
CHECKPOINT_FILE = "checkpoint.npz"
#: the files a run writes in its folder (``fenchel-cvx train``; ``fit_bcd(checkpoint=DIR)``)
RUN_FILES = (CHECKPOINT_FILE, "history.json", "model.npz", "run.json", "objectives.png",
             "accuracy.png")


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
    """The arrays and the meta object of a file written by :func:`write_npz`, every array read
    as its header announces it (for files whose arrays have no config to check against)."""
    with NpzFile(path, "fenchel_cvx .npz") as f:
        meta = f.meta(expected_format)
        arrays = {k: f.array(k, (None,) * len(shape), dtype)
                  for k, (shape, dtype) in f.headers.items() if k != "meta"}
    return arrays, meta


# --- networks ---------------------------------------------------------------------------------
def network_config(net) -> dict:
    """The JSON-able architecture and hyperparameters of ``net`` (``LiftedNetwork.get_config``)."""
    return net.get_config()


#: the config's entries and their JSON types (``LiftedNetwork.get_config``)
_CONFIG = {"input_shape": list, "layers": list, "activations": list, "loss": str,
           "lam": list, "rho": list, "seed": int, "dtype": str}


def network_from_config(cfg: dict, path=None, field="config") -> LiftedNetwork:
    """A freshly initialised ``LiftedNetwork`` with the architecture of ``cfg``; a config that
    fails a check raises ``FileFormatError`` naming ``path`` (default: "config") and ``field``."""
    path = "config" if path is None else path
    if not isinstance(cfg, dict):
        raise FileFormatError(path, field, "a JSON object (LiftedNetwork.get_config)",
                              type(cfg).__name__)
    for key, cls in _CONFIG.items():
        if not isinstance(cfg.get(key), cls) or isinstance(cfg.get(key), bool):
            found = "nothing" if key not in cfg else f"{type(cfg[key]).__name__} {cfg[key]!r}"[:200]
            raise FileFormatError(path, f"{field}.{key}", f"a {cls.__name__}", found)
    if not all(isinstance(a, dict) and isinstance(a.get("name"), str) for a in cfg["activations"]):
        raise FileFormatError(path, f"{field}.activations", "a list of objects with a name",
                              repr(cfg["activations"])[:200])
    try:   # the network's own checks (validation.py, layers.build_maps, check_memory): each names
        return LiftedNetwork.from_config(cfg)   # the parameter and the value it was given
    except (ValueError, TypeError) as err:   # TypeError: an activation's unknown parameter
        raise FileFormatError(path, field, "a valid network config", str(err)) from None


def _weights(f, net, prefix: str) -> list:
    """The arrays ``{prefix}0 .. {prefix}L`` of the NpzFile ``f``, of ``net``'s shapes and dtype."""
    return [f.array(f"{prefix}{l}", W.shape, W.dtype) for l, W in enumerate(net.W)]


def check_destination(name: str, path) -> Path:
    """``path`` as a Path once a file can be written there: its folder exists and is a folder,
    and ``path`` itself is not a folder; else a ValueError naming ``name`` (the argument or the
    flag), before any work."""
    path = Path(path)
    parent = path.parent
    if path.is_dir():
        raise ValueError(f"{name} must be a file path, got {str(path)!r}, which is a folder")
    if not parent.is_dir():
        what = "is a file" if parent.exists() else "does not exist"
        raise ValueError(f"{name} must be in an existing folder, got {str(path)!r}: "
                         f"{str(parent)!r} {what}")
    if not os.access(parent, os.W_OK):
        raise ValueError(f"{name} must be in a writable folder, got {str(path)!r}")
    return path


def save_network(net, path) -> Path:
    """Write ``net`` (weights, architecture, hyperparameters, dtype, version) to ``path``."""
    from . import __version__

    path = check_destination("path", path)
    meta = dict(format=NETWORK_FORMAT, version=__version__, config=network_config(net))
    return write_npz(path, {f"W_{l}": W for l, W in enumerate(net.W)}, meta)


def load_network(path) -> LiftedNetwork:
    """The network saved at ``path`` by :func:`save_network` (NumPy weights), checked as the
    module docstring says before any weight is read."""
    with NpzFile(path, "network (LiftedNetwork.save)") as f:
        meta = f.meta(NETWORK_FORMAT)
        net = network_from_config(meta.get("config"), f.path, "meta.config")
        f.require({f"W_{l}" for l in range(len(net.W))} | {"meta"})
        net.W = _weights(f, net, "W_")
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
    """``(arrays, meta)`` of a checkpoint: ``path`` is its folder or its ``.npz`` file. Checked
    before use: the meta's fields and their types, the network config (``network_from_config``),
    every array's shape and dtype against it and its finiteness, and a round counter
    ``iteration``, an integer >= 0 matched by a history of as many rounds. (That the counter is
    within the run's schedule, and the data and settings those of the run, ``fit_bcd`` checks.)"""
    path = Path(path)
    with NpzFile(checkpoint_path(path) if path.is_dir() else path, "checkpoint (fit_bcd)") as f:
        meta = f.meta(CHECKPOINT_FORMAT)
        _check_checkpoint_meta(f.path, meta)
        net = network_from_config(meta["config"], f.path, "meta.config")
        names = _checkpoint_arrays(f, net, meta["has_Xs"])
        f.require(names | {"meta"})
        arrays = {}
        for name in sorted(names):
            prefix, _, l = name.rpartition("_")
            if prefix == "X":    # X_l: the layer's size by the current batch's columns
                arrays[name] = f.array(name, (net.layer_sizes[int(l)], None), net.W[0].dtype)
            else:
                arrays[name] = f.array(name, net.W[int(l)].shape, net.W[0].dtype)
    return arrays, meta


def _checkpoint_arrays(f, net, has_Xs) -> set:
    """The arrays a checkpoint of ``net`` holds: ``W_l``; ``X_1 .. X_L`` where it says it has
    them; ``W0_l`` and ``W_prev_l`` of the layers (all or none) the file has them for."""
    L = len(net.W)
    names = {f"W_{l}" for l in range(L)}
    names |= {f"X_{l}" for l in range(1, net.n_hidden + 1)} if has_Xs else set()
    names |= {f"W0_{l}" for l in range(L) if f"W0_{l}" in f.headers}
    if any(f"W_prev_{l}" in f.headers for l in range(L)):
        names |= {f"W_prev_{l}" for l in range(L)}
    return names


def _check_checkpoint_meta(path, meta) -> None:
    """The fields of a checkpoint's meta: their types, and a history of ``iteration`` rounds."""
    fields = {"config": (dict, "an object"), "iteration": (int, "an integer >= 0"),
              "has_Xs": (bool, "true or false"), "history": (dict, "an object"),
              "settings": (dict, "an object")}
    for key, (cls, words) in fields.items():
        value = meta.get(key)
        if not isinstance(value, cls) or (cls is int and (isinstance(value, bool) or value < 0)):
            raise FileFormatError(path, f"meta.{key}", words,
                                  "nothing" if key not in meta else repr(value)[:200])
    if not isinstance(meta["settings"].get("data"), str):
        raise FileFormatError(path, "meta.settings.data", "the training data's digest (text)",
                              repr(meta["settings"].get("data"))[:200])
    history = meta["history"]
    records = history.get("records")
    if not isinstance(history.get("config"), dict) or not isinstance(records, list):
        raise FileFormatError(path, "meta.history", "an object with 'config' and 'records'",
                              f"the keys {sorted(history)}")
    rounds = [r.get("iteration") if isinstance(r, dict) else None for r in records]
    if len(rounds) != meta["iteration"] or rounds != list(range(1, len(rounds) + 1)):
        raise FileFormatError(path, "meta.history.records",
                              f"rounds 1..{meta['iteration']} (meta.iteration)",
                              f"{len(records)} records, rounds {rounds[:3]}"
                              f"{'...' if len(rounds) > 3 else ''}")


def remove_temporaries(directory) -> list:
    """Delete the temporary files (``.<name>.<random>.tmp``, :func:`atomic_write`) that a run
    killed while writing left in ``directory``; returns their paths. Only the run's own files'
    temporaries: those of ``checkpoint.npz``, ``history.json``, ``model.npz``, ``run.json`` and
    the plots."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    removed = []
    for name in RUN_FILES:
        for tmp in directory.glob(f".{name}.*.tmp"):
            tmp.unlink(missing_ok=True)
            removed.append(tmp)
    return removed


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
