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
- a **checkpoint** (``fit_bcd(checkpoint=DIR)``): ``checkpoints.py``, written by
  :func:`write_npz`.

``LiftedNetwork.save`` and ``LiftedNetwork.load`` call :func:`save_network` and
:func:`load_network`; this module imports no network (it is handed the class to build), so
``network`` imports ``io`` and nothing imports back.

Every file is written atomically: to a temporary file ``.<name>.<random>.tmp`` in the same
folder, then renamed over the target, so an interrupted write never leaves a half-written file;
:func:`remove_temporaries` deletes the temporary files a killed run left (a resumed run, or a new
one in the same folder, calls it). The temporary is created as ``open()`` creates a file: mode
0666 less the process's umask, which the kernel applies. :func:`recording_writes` collects the
files written meanwhile (``fenchel-cvx train`` names them). Destinations are checked before any
work (:func:`check_destination`).

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
import secrets
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Any

import numpy as np

from .arrays import to_numpy
from .errors import FileFormatError
from .files import NpzFile

NETWORK_FORMAT = "fenchel_cvx.LiftedNetwork/1"
#: the files a run writes in its folder (``fenchel-cvx train``; ``fit_bcd(checkpoint=DIR)``)
RUN_FILES = (
    "checkpoint.npz",
    "history.json",
    "model.npz",
    "run.json",
    "objectives.png",
    "accuracy.png",
)


#: the list :func:`recording_writes` collects the written files in (None: none is collecting)
_WRITTEN: ContextVar[list[Path] | None] = ContextVar("fenchel_cvx_written", default=None)
#: how :func:`atomic_write` opens its temporary: a new file (never an existing one or a link)
_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0)


@contextmanager
def recording_writes() -> Iterator[list[Path]]:
    """A list that collects the path of every file :func:`atomic_write` writes within the
    block (in this thread), each once, in the order first written."""
    written: list[Path] = []
    token = _WRITTEN.set(written)
    try:
        yield written
    finally:
        _WRITTEN.reset(token)


def _temporary(path: Path) -> tuple[int, Path]:
    """A new file ``.<name>.<random>.tmp`` beside ``path``, open for writing (its descriptor),
    of mode 0666 less the process's umask, as ``open()`` creates a file."""
    for _ in range(100):
        tmp = path.parent / f".{path.name}.{secrets.token_hex(4)}.tmp"
        try:
            return os.open(tmp, _CREATE, 0o666), tmp
        except FileExistsError:  # another write's temporary: draw another name
            continue
    raise FileExistsError(f"no free name for a temporary file beside {str(path)!r}")


def atomic_write(path, write, check: Callable[[Path], Any] | None = None) -> Path:
    """Call ``write(binary_file)`` on a temporary file beside ``path``, then rename it over
    ``path``: readers see the old file or the whole new one, never a half-written one.
    ``check(temporary_path)``, where given, runs on the written file before the rename; what
    it raises leaves ``path`` as it was. The file is created with mode 0666 less the umask."""
    path = Path(path)
    fd, tmp = _temporary(path)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        if check is not None:
            check(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    written = _WRITTEN.get()
    if written is not None and path not in written:
        written.append(path)
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
        arrays = {
            k: f.array(k, (None,) * len(shape), dtype)
            for k, (shape, dtype) in f.headers.items()
            if k != "meta"
        }
    return arrays, meta


# --- networks ---------------------------------------------------------------------------------
def network_config(net) -> dict:
    """The JSON-able architecture and hyperparameters of ``net`` (``LiftedNetwork.get_config``)."""
    return net.get_config()


#: the config's entries and their JSON types (``LiftedNetwork.get_config``)
_CONFIG: dict[str, tuple[type, ...]] = {
    "input_shape": (list,),
    "layers": (list,),
    "activations": (list,),
    "loss": (str, dict),  # a name, or {"name": ..., **params} (``Loss.config``)
    "lam": (list,),
    "rho": (list,),
    "seed": (int,),
    "dtype": (str,),
}


def same_network(a: dict, b: dict) -> bool:
    """Whether two network configs describe the same network, a loss given by its name alone
    (files written before losses took parameters) reading as ``{"name": ...}``."""

    def loss_as_dict(cfg):
        loss = cfg.get("loss")
        return {**cfg, "loss": {"name": loss}} if isinstance(loss, str) else cfg

    return loss_as_dict(a) == loss_as_dict(b)


def network_from_config(cfg: dict, network_class: Any, path=None, field="config") -> Any:
    """A freshly initialised network of ``network_class`` (``LiftedNetwork``) with the
    architecture of ``cfg``; a config that fails a check raises ``FileFormatError`` naming
    ``path`` (default: "config") and ``field``."""
    path = "config" if path is None else path
    if not isinstance(cfg, dict):
        raise FileFormatError(
            path, field, "a JSON object (LiftedNetwork.get_config)", type(cfg).__name__
        )
    for key, cls in _CONFIG.items():
        if not isinstance(cfg.get(key), cls) or isinstance(cfg.get(key), bool):
            found = "nothing" if key not in cfg else f"{type(cfg[key]).__name__} {cfg[key]!r}"[:200]
            names = " or a ".join(c.__name__ for c in cls)
            raise FileFormatError(path, f"{field}.{key}", f"a {names}", found)
    if isinstance(cfg["loss"], dict) and not isinstance(cfg["loss"].get("name"), str):
        raise FileFormatError(
            path,
            f"{field}.loss",
            "a loss's name, or an object with a name",
            repr(cfg["loss"])[:200],
        )
    if not all(isinstance(a, dict) and isinstance(a.get("name"), str) for a in cfg["activations"]):
        raise FileFormatError(
            path,
            f"{field}.activations",
            "a list of objects with a name",
            repr(cfg["activations"])[:200],
        )
    try:  # the network's own checks (validation.py, layers.build_maps, check_memory): each names
        return network_class.from_config(cfg)  # the parameter and the value it was given
    except (ValueError, TypeError) as err:  # TypeError: an activation's unknown parameter
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
        raise ValueError(
            f"{name} must be in an existing folder, got {str(path)!r}: {str(parent)!r} {what}"
        )
    if not os.access(parent, os.W_OK):
        raise ValueError(f"{name} must be in a writable folder, got {str(path)!r}")
    return path


def save_network(net, path) -> Path:
    """Write ``net`` (weights, architecture, hyperparameters, dtype, version) to ``path``."""
    from . import __version__

    path = check_destination("path", path)
    meta = dict(format=NETWORK_FORMAT, version=__version__, config=network_config(net))
    return write_npz(path, {f"W_{l}": W for l, W in enumerate(net.W)}, meta)


def load_network(path, network_class: Any) -> Any:
    """The network saved at ``path`` by :func:`save_network` (NumPy weights), a
    ``network_class`` (``LiftedNetwork``), checked as the module docstring says before any
    weight is read."""
    with NpzFile(path, "network (LiftedNetwork.save)") as f:
        meta = f.meta(NETWORK_FORMAT)
        net = network_from_config(meta.get("config"), network_class, f.path, "meta.config")
        f.require({f"W_{l}" for l in range(len(net.W))} | {"meta"})
        net.W = _weights(f, net, "W_")
    return net


# --- run folders ------------------------------------------------------------------------------
def data_digest(*arrays) -> str:
    """A SHA-256 of the arrays' shapes, dtypes and bytes (resume checks it is the same data)."""
    h = hashlib.sha256()
    for A in arrays:
        A = np.ascontiguousarray(to_numpy(A))
        h.update(f"{A.shape}{A.dtype.str}".encode())
        h.update(A.tobytes())
    return h.hexdigest()


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
        raise ValueError(
            f"{name} must be a writable folder, got {str(directory)!r} ({err.strerror or err})"
        ) from None
    return directory
