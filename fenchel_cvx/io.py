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

Every file is written atomically: to a temporary file ``.<name>.<pid>.<random>.tmp`` in the
same folder (``pid``: the writing process's id), then renamed over the target, so an interrupted
write never leaves a half-written file; :func:`remove_temporaries` deletes the temporary files
whose writer is gone (killed while writing), never a live writer's (every ``fenchel-cvx``
command in a run folder, and a resumed ``fit_bcd``, calls it). The temporary is created as
``open()`` creates a file: mode 0666 less the process's umask, which the kernel applies.
:func:`recording_writes` collects the files written meanwhile (``fenchel-cvx train`` names
them). Destinations are checked before any work (:func:`check_destination`).

Every file is read through the checked reader of ``files.py``: the zip container, each array's
``.npy`` header (dtype, shape) against the config, the config's sizes against the memory budget
(``validation.check_memory``), the weights' finiteness, and, in a checkpoint, a round counter that
is an integer with a history of as many rounds. A file that fails raises ``FileFormatError``
naming the file, the array or field, and what was expected against what was found. Nothing is
unpickled. The ``format`` field carries the file's kind and version: files of this version (1)
load; a newer version is refused with what to do.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import re
import secrets
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Any, Protocol, TypeVar

import numpy as np

from .arrays import Array, to_numpy
from .errors import FileFormatError
from .files import NpzFile
from .schemas import NETWORK_CONFIG, check_meta

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
#: the file :func:`check_writable_dir` creates and deletes to prove a folder writable: named as
#: every temporary (``.probe.<pid>.<random>.tmp``), so that one a killed check left is removed
#: as theirs are (:func:`remove_temporaries`) and blocks no new run there
PROBE = "probe"


#: a file's path, as a caller gives it
_Path = str | os.PathLike[str]
_N = TypeVar("_N", bound="_Network")


class _Network(Protocol):
    """What this module reads and writes of a network (``LiftedNetwork``, which imports this
    module): its weights ``W``, its config, and the class's ``from_config``."""

    W: list[Any]

    def get_config(self) -> dict[str, Any]: ...

    @classmethod
    def from_config(cls: type[_N], config: dict[str, Any]) -> _N: ...


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
    """A new file ``.<name>.<pid>.<random>.tmp`` beside ``path`` (``pid``: this process's id, so
    that :func:`remove_temporaries` tells a live writer's temporary from a killed one's), open
    for writing (its descriptor), of mode 0666 less the process's umask, as ``open()`` creates a
    file."""
    pid = os.getpid()
    for _ in range(100):
        tmp = path.parent / f".{path.name}.{pid}.{secrets.token_hex(4)}.tmp"
        try:
            return os.open(tmp, _CREATE, 0o666), tmp
        except FileExistsError:  # another write's temporary: draw another name
            continue
    raise FileExistsError(f"no free name for a temporary file beside {str(path)!r}")


def atomic_write(
    path: _Path, write: Callable[..., object], check: Callable[[Path], Any] | None = None
) -> Path:
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


def write_text(path: _Path, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically."""
    return atomic_write(path, lambda f: f.write(text.encode()))


def write_json(path: _Path, obj: object) -> Path:
    """Write ``obj`` as JSON to ``path`` atomically."""
    return write_text(path, json.dumps(obj, indent=1))


def write_npz(path: _Path, arrays: dict[str, Array], meta: dict[str, Any]) -> Path:
    """Write ``arrays`` and the JSON object ``meta`` to ``path`` atomically; returns the path."""
    payload = {k: to_numpy(v) for k, v in arrays.items()}
    payload["meta"] = np.array(json.dumps(meta))
    return atomic_write(path, lambda f: np.savez(f, allow_pickle=False, **payload))


def read_npz(path: _Path, expected_format: str) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """The arrays and the meta object of a file written by :func:`write_npz`, every array read
    as its header announces it (for files whose arrays have no config to check against); the
    meta checked by the schema of its format (``schemas.check_meta``: a network's, a
    checkpoint's) where it has one."""
    with NpzFile(path, "fenchel_cvx .npz") as f:
        meta = check_meta(f.path, expected_format, f.meta(expected_format))
        arrays = {
            k: f.array(k, (None,) * len(shape), dtype)
            for k, (shape, dtype) in f.headers.items()
            if k != "meta"
        }
    return arrays, meta


# --- networks ---------------------------------------------------------------------------------
def network_config(net: _Network) -> dict[str, Any]:
    """The JSON-able architecture and hyperparameters of ``net`` (``LiftedNetwork.get_config``)."""
    return net.get_config()


def same_network(a: dict, b: dict) -> bool:
    """Whether two network configs describe the same network, a loss given by its name alone
    (files written before losses took parameters) reading as ``{"name": ...}``."""

    def loss_as_dict(cfg):
        loss = cfg.get("loss")
        return {**cfg, "loss": {"name": loss}} if isinstance(loss, str) else cfg

    return loss_as_dict(a) == loss_as_dict(b)


def network_from_config(
    cfg: Any, network_class: type[_N], path: _Path | None = None, field: str = "config"
) -> _N:
    """A freshly initialised network of ``network_class`` (``LiftedNetwork``) with the
    architecture of ``cfg``; a config that fails a check (its schema,
    ``schemas.NETWORK_CONFIG``: types, registered names, weights within the read budget; then
    the network's own) raises ``FileFormatError`` naming ``path`` (default: "config") and
    ``field``."""
    # (``cfg``: a JSON value as read from a file, checked here against the schema)
    path = "config" if path is None else path
    NETWORK_CONFIG.check(path, field, cfg)
    try:  # the network's own checks (validation.py, layers.build_maps, check_memory): each names
        return network_class.from_config(cfg)  # the parameter and the value it was given
    except (ValueError, TypeError) as err:  # TypeError: an activation's unknown parameter
        raise FileFormatError(path, field, "a valid network config", str(err)) from None


def _weights(f: NpzFile, net: _Network, prefix: str) -> list[np.ndarray]:
    """The arrays ``{prefix}0 .. {prefix}L`` of the NpzFile ``f``, of ``net``'s shapes and dtype."""
    return [f.array(f"{prefix}{l}", W.shape, W.dtype) for l, W in enumerate(net.W)]


def check_destination(name: str, path: _Path) -> Path:
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


def save_network(net: _Network, path: _Path) -> Path:
    """Write ``net`` (weights, architecture, hyperparameters, dtype, version) to ``path``."""
    from . import __version__

    path = check_destination("path", path)
    meta = dict(format=NETWORK_FORMAT, version=__version__, config=network_config(net))
    return write_npz(path, {f"W_{l}": W for l, W in enumerate(net.W)}, meta)


def load_network(path: _Path, network_class: type[_N]) -> _N:
    """The network saved at ``path`` by :func:`save_network` (NumPy weights), a
    ``network_class`` (``LiftedNetwork``), checked as the module docstring says before any
    weight is read."""
    with NpzFile(path, "network (LiftedNetwork.save)") as f:
        meta = check_meta(f.path, NETWORK_FORMAT, f.meta(NETWORK_FORMAT))
        net = network_from_config(meta.get("config"), network_class, f.path, "meta.config")
        f.require({f"W_{l}" for l in range(len(net.W))} | {"meta"})
        net.W = _weights(f, net, "W_")
    return net


# --- run folders ------------------------------------------------------------------------------
#: the bytes of an array that is not C-contiguous that :func:`data_digest` copies at a time
#: (whole rows of its first axis, at least one)
DIGEST_PART = 1 << 23


def data_digest(*arrays: Array) -> str:
    """A SHA-256 of the arrays' shapes, dtypes and bytes in C order (resume checks it is the
    same data). No array is copied whole: a C-contiguous one is read in place, any other in
    parts of whole rows of its first axis, :data:`DIGEST_PART` bytes or one row (MNIST's
    training images as loaded, the transpose of their file's layout: 376 MB in float64)."""
    return _digest(arrays, "C" * len(arrays))


def memory_digest(*arrays: Array) -> tuple[str, str]:
    """``(orders, digest)``: each array's memory order (``"F"`` where it is Fortran- and not
    C-contiguous, else ``"C"``) and a SHA-256 of the arrays' shapes, dtypes and bytes in those
    orders, so that a contiguous array is read in place, never copied (MNIST's training images
    as loaded, 188 MB in float32: 0.11 s, against 0.25 s for :func:`data_digest`, which copies
    a Fortran-ordered array in parts). Where every order is ``"C"`` it is
    :func:`data_digest`. Two holders of the same data compare their digests where their
    orders agree (the ranks' agreement, ``run_settings.agreed``)."""
    orders = "".join(
        "F" if np.ndim(A) > 1 and A.flags.f_contiguous and not A.flags.c_contiguous else "C"
        for A in (np.asarray(to_numpy(A)) for A in arrays)
    )
    return orders, _digest(arrays, orders)


def _digest(arrays: Iterable[Array], orders: str) -> str:
    """The SHA-256 of :func:`data_digest` and :func:`memory_digest`: each array's shape, dtype
    and bytes in its order of ``orders`` (``"F"``: its transpose's C order)."""
    h = hashlib.sha256()
    for A, order in zip(arrays, orders):
        A = np.asarray(to_numpy(A))
        A = A.reshape(1) if A.ndim == 0 else A  # (a scalar is digested as one entry)
        h.update(f"{A.shape}{A.dtype.str}".encode())
        for part in _c_order(A.T if order == "F" else A):
            h.update(part)
    return h.hexdigest()


def _c_order(A: np.ndarray) -> Iterator[bytes | memoryview]:
    """``A.tobytes()`` in parts: ``A``'s own bytes where it is C-contiguous, else consecutive
    blocks of its first axis, each copied alone (an array of objects: ``tobytes`` itself)."""
    if A.size == 0 or A.dtype.hasobject:
        yield np.ascontiguousarray(A).tobytes()
    elif A.flags.c_contiguous:
        yield A.reshape(-1).view(np.uint8).data
    else:
        rows = max(1, DIGEST_PART // max(1, A.nbytes // A.shape[0]))
        for i in range(0, A.shape[0], rows):
            yield np.ascontiguousarray(A[i : i + rows]).reshape(-1).view(np.uint8).data


#: a temporary's name between ``.<name>.`` and ``.tmp`` (:func:`_temporary`): the writer's pid
#: and a random part (one named before pids were, ``.<name>.<random>.tmp``, has no pid)
_WRITER = re.compile(r"(?:.*\.)?([0-9]{1,10})\.[0-9a-f]+")
#: seconds by which a process's start, as /proc gives it (to the second), may pass a file's mtime
#: before its pid reads as reused (a wall clock set forward by more, between a live writer's
#: last write and the check, would make its temporary read as a reused pid's)
_START_SLACK = 5.0


def _boot_time() -> float:
    """When the machine booted (seconds since the epoch, /proc/stat's ``btime``); OSError or
    ValueError where there is no such /proc."""
    for line in Path("/proc/stat").read_text().splitlines():
        if line.startswith("btime "):
            return float(line.split()[1])
    raise ValueError("/proc/stat has no btime")


def _started_after(pid: int, mtime: float, boot: float | None) -> bool:
    """Whether the process ``pid`` is dead but not yet reaped (a zombie), or started more than
    ``_START_SLACK`` s after ``mtime`` (another process got the pid); False where /proc cannot
    tell (no /proc: not Linux) or ``boot`` is unknown."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
        fields = stat[stat.rindex(b")") + 2 :].split()  # after the command, which may hold spaces
        state, ticks = fields[0], int(fields[19])  # fields 3 and 22 of proc(5)
        if state in (b"Z", b"X"):
            return True
        return boot is not None and boot + ticks / os.sysconf("SC_CLK_TCK") > mtime + _START_SLACK
    except (OSError, ValueError, IndexError):
        return False


def _writer_gone(tmp: Path, name: str, boot: float | None) -> bool:
    """Whether the process that wrote ``tmp``, a temporary of the file ``name``, is gone (see
    :func:`remove_temporaries`)."""
    named = _WRITER.fullmatch(tmp.name[len(name) + 2 : -len(".tmp")])
    if named is None:  # named before pids were: removed, as then
        return True
    pid = int(named[1])
    if pid <= 0:  # never a writer's (and os.kill would signal a process group)
        return True
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):  # no such process (or no such pid)
        return True
    except PermissionError:  # alive, another user's
        pass
    try:
        mtime = tmp.stat().st_mtime
    except OSError:  # renamed or removed meanwhile: its writer's, not ours to remove
        return False
    return _started_after(pid, mtime, boot)


def remove_temporaries(directory: _Path, names: Iterable[str] = (*RUN_FILES, PROBE)) -> list[Path]:
    """Delete the temporary files (``.<name>.<pid>.<random>.tmp``, :func:`atomic_write`) that a
    process killed while writing left in ``directory``; returns their paths. Only the temporaries
    of ``names`` (default: a run's own files, ``RUN_FILES``: ``checkpoint.npz``,
    ``history.json``, ``model.npz``, ``run.json`` and the plots, and the folder's writability
    probe, ``PROBE``), and only those whose writer is
    gone: no process of that pid exists (``os.kill(pid, 0)``), or, on Linux, it is a zombie or
    started after the temporary was last written (/proc/<pid>/stat: the pid was reused). A
    writer alive, of this user or another, keeps its temporary. Limit: a pid reused within
    ``_START_SLACK`` seconds of the temporary's last write, or anywhere without /proc, reads as
    its writer alive, and its temporary stays until a later call; and the pids are this
    machine's (this pid namespace's), so a folder that processes on other machines or in other
    containers write at the same time is not cleaned safely. A temporary named without a pid
    (``.<name>.<random>.tmp``, before this naming) is removed whatever wrote it, as then. One
    that cannot be deleted (a read-only folder) stays, unreported."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    try:
        boot: float | None = _boot_time()
    except (OSError, ValueError):
        boot = None
    removed = []
    for name in names:
        for tmp in sorted(directory.glob(f".{glob.escape(name)}.*.tmp")):
            if not _writer_gone(tmp, name, boot):
                continue
            try:
                tmp.unlink()
            except OSError:  # removed meanwhile, or a folder this user cannot write
                continue
            removed.append(tmp)
    return removed


def check_writable_dir(name: str, directory: _Path) -> Path:
    """Create ``directory`` if needed and prove it writable, or raise ValueError naming ``name``."""
    directory = Path(directory)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        fd, probe = _temporary(directory / PROBE)
        os.close(fd)
        os.unlink(probe)
    except OSError as err:
        raise ValueError(
            f"{name} must be a writable folder, got {str(directory)!r} ({err.strerror or err})"
        ) from None
    return directory
