"""Large arrays sent to spawned ranks through files in shared memory (``parallel.Ranks``).

A run on ranks sends its arguments to every spawned rank: the data (all of it: each rank takes
its share of every batch, and the batches are drawn at random) and the network. Pickled through
a pipe, the 60,000 MNIST images take about a second to arrive, inside the run. ``outgoing``
writes each large NumPy argument once to a file in ``/dev/shm`` (memory, not disk) and sends
its name instead; ``incoming`` maps the file on the rank, copy on write, without reading it
through the pipe; ``discard`` removes the files once every rank has the run's result (a rank's
mapping outlives the file's name). Where no such folder exists or it is full, the array is
pickled. ``write`` writes one array to such a file, ``write_rows`` one from blocks of its rows
(the oracle's Dask workers map ``X~``'s points from such files: ``oracle/dask_rows.py``).
"""

from __future__ import annotations

import math
import os
import secrets
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, BinaryIO

import numpy as np

#: the folder of the files: memory on Linux
FOLDER = "/dev/shm"
#: arrays of at least this many bytes go through a file
LARGE = 1 << 20


@dataclass(frozen=True)
class ArrayFile:
    """The name of a file that holds one array (``.npy``), sent in the array's place."""

    path: str

    def load(self) -> np.ndarray:
        """The array, mapped copy on write: the pages are shared until the rank writes one."""
        return np.asarray(np.load(self.path, mmap_mode="c", allow_pickle=False))


def outgoing(
    args: tuple, kwargs: dict[str, Any]
) -> tuple[tuple, dict[str, Any], list[str]]:  # fmt: skip
    """``args`` and ``kwargs`` with each NumPy array of ``LARGE`` bytes or more written to a file
    and replaced by its :class:`ArrayFile`, and the files' paths (for :func:`discard`)."""
    paths: list[str] = []

    def send(value: Any) -> Any:
        if not (isinstance(value, np.ndarray) and value.nbytes >= LARGE):
            return value
        handle = write(value)
        if handle is None:  # (no folder, or a full one: the array is pickled)
            return value
        paths.append(handle.path)
        return handle

    return tuple(send(a) for a in args), {k: send(v) for k, v in kwargs.items()}, paths


def write(array: np.ndarray) -> ArrayFile | None:
    """``array`` written to a new file in ``FOLDER`` (C or F order kept, no pickle), or None
    where there is no such folder or it is full (a partly written file is removed)."""
    return _written(lambda f: np.lib.format.write_array(f, array, allow_pickle=False))


def write_rows(
    shape: tuple[int, ...], dtype: Any, parts: Iterable[np.ndarray]
) -> ArrayFile | None:  # fmt: skip
    """An array of ``shape`` and ``dtype`` (C order) written to a new file in ``FOLDER`` from
    ``parts``, consecutive blocks of its rows (the whole array need never be in memory), or
    None where there is no such folder or too little room in it (the file is then removed).
    Its bytes are reserved first: a full folder gives None before any part is made."""
    dtype, size = np.dtype(dtype), math.prod(shape)

    def fill(f):
        header = {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False}
        np.lib.format.write_array_header_1_0(f, {**header, "shape": tuple(shape)})
        if hasattr(os, "posix_fallocate"):  # (Linux; elsewhere the folder is missing anyway)
            os.posix_fallocate(f.fileno(), 0, f.tell() + size * dtype.itemsize)
        written = 0
        for part in parts:
            f.write(np.ascontiguousarray(part, dtype=dtype).data)
            written += part.size
        if written != size:
            raise ValueError(f"the parts hold {written} values, not the {size} of {shape}")

    return _written(fill)


def _written(fill: Callable[[BinaryIO], None]) -> ArrayFile | None:
    """A new file in ``FOLDER`` (readable by its owner alone) written by ``fill``; None where
    the folder is missing or full; a partly written file is removed."""
    path = os.path.join(FOLDER, f"fenchel_cvx_{secrets.token_hex(8)}.npy")
    try:
        with open(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600), "wb") as f:
            fill(f)
    except OSError:
        discard([path])
        return None
    except BaseException:
        discard([path])
        raise
    return ArrayFile(path)


def incoming(args: tuple, kwargs: dict[str, Any]) -> tuple[tuple, dict[str, Any]]:
    """``args`` and ``kwargs`` with each :class:`ArrayFile` replaced by its array."""
    take = lambda v: v.load() if isinstance(v, ArrayFile) else v  # noqa: E731
    return tuple(take(a) for a in args), {k: take(v) for k, v in kwargs.items()}


def discard(paths: list[str]) -> None:
    """Removes the files of :func:`outgoing` (those still there)."""
    for path in paths:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
