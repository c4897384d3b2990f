"""The rows of the ``active`` route (``rows.py``, ``active_rows.py``) on the Dask workers.

When the ``OracleBackend`` works with Dask (``n_jobs > 1`` or a ``client``), the rows of a ReLU
hidden W-block on the ``active`` route (the paper's Sec. 4.5.2, eqs. (17) and (19)) are split
into one contiguous share per worker. What is sent when:

* **once per data set**: the block's fixed data ``X~`` (``n x m``; MNIST's ``X~_0``: 377 MB),
  remembered in the driver by a digest of its bytes (``digest``), so that a later call with the
  same ``X~`` (the W_0 block at every BCD iteration) sends nothing of it again. A large ``X~``
  (``FILE_MIN`` bytes or more) goes as its points laid out as the rows take them
  (``SharedPoints``: ``P = X~_S^T`` and its float32 copy, written once by the driver to files
  in shared memory, ``rank_arrays.FOLDER``), which every worker maps, where every worker can
  open them (the workers share their pages: no worker copies or transposes ``X~``; an array of
  ``X~_0``'s shape reached two workers this way in 1.0 s, against 2.8-5.6 s through
  ``client.scatter``, on the 2-core VM with a test run beside it); the files are removed when
  their data set leaves the driver's ``KEEP`` or the backend closes. Otherwise (remote
  workers, no shared memory, a small ``X~``) ``X~`` is scattered to every worker
  (``client.scatter(..., broadcast=True)``) and each worker lays out its points itself. Each
  worker then keeps, under the same digest, the ``active_rows.Rows`` of them (``T = X~_S
  X~_S^T`` formed there once; ``_WORKER_ROWS``);
* **every call**: only what changes, each worker's share of the rows' linear terms
  ``q_i = lam X~ v_i + 2 gamma w0_i`` (the targets and the ``W0`` rows in one array), their
  start rows (or none: the worker starts from the ridge point, ``Rows.ridge``), ``lam``, ``c``
  and the target; back come the share's rows and their ``RowReport`` s.

Warm rows (``keep_grams``, the default): each worker keeps, under the data's digest, the active
set and Gram ``X~_A X~_A^T`` each of its rows ended with, and the next call starts each row from
its kept Gram updated by the points that changed sides (``n^2`` a point, instead of
``n^2 min(|A|, |I|)`` to form it; ``active_rows.solve_rows``' ``kept``). The shares are the same
contiguous rows in every call; a row whose share went to another worker forms its Gram afresh.

The driver trusts no worker: ``rows._active`` certifies every gathered row by its gradient
recomputed from the block (``rows.uncertified``), takes the primal Newton fallback on the rows
that miss it, and ``exact.attempt`` certifies the whole block by ``blocks.kkt_residual``. A
non-finite row from a worker is replaced by zeros before that fallback. Each task runs with one
BLAS thread (``threadpoolctl``), its worker's single core.

Memory on a worker (MNIST, ``m = 60,000``, ``|S| = 718``): ``P`` 345 MB and its float32 copy
172 MB (shared by the workers when they come by file; else its own, with ``X~``, 377 MB), ``T``
and its eigenvectors 4 MB each, gather buffers of ``m / 2`` points during a task (172 MB in
float64, 86 MB in float32: ``active_rows.Rows``), and one Gram and its factor (4 MB each) a
row of the batch being solved; ``KEEP`` data sets at most. The kept Grams add ``|S|^2``
doubles a row: 4.1 MB, 1.24 GB for W_0's 300 rows, 620 MB a worker on two workers.
"""

from __future__ import annotations

import copy
import hashlib
import os
import weakref
from collections import OrderedDict
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import ArrayLike

from .. import rank_arrays as _rank_arrays
from ..arrays import frozen_memo, transposed_tiles
from ..errors import SolverError
from . import active_rows as _active_rows

if TYPE_CHECKING:
    from ..blocks import Block, WHidden

# data sets (X~) kept scattered and built on the workers, the most recent first
KEEP = 2
DASK_RETRIES = 2
# X~ of at least this many bytes goes to the workers by a file in shared memory, where they can
# open it
FILE_MIN = _rank_arrays.LARGE

# in each worker process, kept between tasks: digest -> active_rows.Rows (P, S and T formed);
# digest -> {row: (A, G)}, the active set and Gram each row ended with (``keep_grams``); and
# digest -> the number of times its Rows were built
_WORKER_ROWS: OrderedDict = OrderedDict()
_WORKER_GRAMS: dict = {}
_WORKER_BUILDS: dict = {}


def digest(Xt: ArrayLike) -> str:
    """A digest of ``X~``'s shape, type and bytes (SHA-256: 0.22 s for MNIST's 377 MB ``X~_0``
    on one core of the 2-core VM, where the CPU's SHA instructions take it; blake2b 0.49 s).
    An array made read-only by ``arrays.freeze`` (a run's dense ``X~_0``: ``schedule.Batches``)
    is digested once while it lives (its ``arrays.frozen_memo``); any other array at every
    call. (Were the bytes of such an array changed all the same, the workers would solve on the
    old ones; the driver's certificate of every row, ``rows.uncertified``, would then catch the
    rows.)"""
    memo = frozen_memo(Xt)
    if memo is not None and "digest" in memo:
        return memo["digest"]
    A = np.ascontiguousarray(Xt, dtype=float)
    h = hashlib.sha256()
    h.update(repr(A.shape).encode())
    h.update(A.data.cast("B"))
    key = h.hexdigest()
    if memo is not None:
        memo["digest"] = key
    return key


def worker_rows_info() -> dict[str, tuple[int, int]]:
    """``{digest: (builds, kept Grams)}`` of the data sets kept in this process (run it on the
    workers with ``client.run(worker_rows_info)``)."""
    return {k: (_WORKER_BUILDS.get(k, 0), len(_WORKER_GRAMS.get(k, {}))) for k in _WORKER_ROWS}


def _one_thread():
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # pragma: no cover - threadpoolctl comes with scikit-learn
        return nullcontext()
    return threadpool_limits(limits=1, user_api="blas")


def can_open(path: str, size: int) -> bool:
    """Whether this process sees the file ``path`` with ``size`` bytes (run on every worker
    before the data goes by file)."""
    try:
        return os.stat(path).st_size == size
    except OSError:
        return False


@dataclass(frozen=True)
class SharedPoints:
    """A data set's points as the rows take them (``active_rows.Rows``: ``P = X~_S^T`` and its
    copy in the Grams' precision), each in a file in shared memory that every worker maps (they
    share its pages), with the inputs ``S`` and their number ``n``. The driver lays them out
    once (``points``): no worker copies or transposes ``X~`` (MNIST's ``P``, 345 MB, and its
    float32 copy took two processes making them at once 2.8 and 1.9 s, where one alone took
    0.25 s: fresh pages written by both at once)."""

    P: _rank_arrays.ArrayFile
    G_src: _rank_arrays.ArrayFile | None
    S: np.ndarray
    n: int

    @property
    def paths(self) -> list[str]:
        return [f.path for f in (self.P, self.G_src) if f is not None]

    def rows(self, lam: float, c: float) -> _active_rows.Rows:
        G_src = None if self.G_src is None else self.G_src.load()
        return _active_rows.Rows(self.P.load(), self.S, self.n, lam, c, G_src)


def points(Xt: np.ndarray) -> SharedPoints | None:
    """``X~``'s points written to files in shared memory (``SharedPoints``), copied from ``X~``
    a tile at a time (``arrays.transposed_tiles``: the driver holds no copy), or None where
    the folder cannot hold them (the files written so far are removed)."""
    S, m = _active_rows.inputs(Xt), Xt.shape[1]
    files: list[_rank_arrays.ArrayFile] = []
    for dtype in [d for d in (np.float64, _active_rows.single(m)) if d is not None]:
        made = _rank_arrays.write_rows((m, S.size), dtype, transposed_tiles(Xt, S, dtype))
        if made is None:
            _rank_arrays.discard([f.path for f in files])
            return None
        files.append(made)
    return SharedPoints(files[0], files[1] if len(files) > 1 else None, S, Xt.shape[0])


def _rows_for(Xt, key, lam, c):
    """This worker's ``Rows`` of the data ``key`` (built and ``T`` formed on first use), as a
    shallow copy with this call's ``lam`` and ``c`` and its own gather buffer. ``Xt`` is the
    array, or the ``SharedPoints`` of it (mapped: the workers share their pages)."""
    kept = _WORKER_ROWS.get(key)
    if kept is None:
        if isinstance(Xt, SharedPoints):
            kept = Xt.rows(lam, c)
        else:
            kept = _active_rows.Rows.of(np.asarray(Xt, dtype=float), lam, c)
        kept.spectrum  # noqa: B018 (T and its spectrum formed once here, for every later call)
        kept._bufs = {}
        _WORKER_ROWS[key] = kept
        _WORKER_BUILDS[key] = _WORKER_BUILDS.get(key, 0) + 1
        while len(_WORKER_ROWS) > KEEP:
            _WORKER_GRAMS.pop(_WORKER_ROWS.popitem(last=False)[0], None)
    _WORKER_ROWS.move_to_end(key)
    rows = copy.copy(kept)
    rows.lam, rows.c, rows._bufs = lam, c, {}
    return rows


def solve_share(
    Xt: ArrayLike,
    block: tuple[str, float, float],
    Q: np.ndarray,
    start: np.ndarray | None,
    target: float,
    first: int = 0,
    keep_grams: bool = False,
) -> tuple[np.ndarray, list[_active_rows.RowReport]]:
    """On a worker: the rows ``Q`` (the block's rows ``first, first + 1, ...``) from ``start``
    (None: the ridge point), ``block = (key, lam, c)`` (X~'s key, the block's lam and
    ``c = rho + gamma``); returns ``(W, reports)`` as ``active_rows.solve_rows``. With
    ``keep_grams`` each row starts from the Gram it ended with in an earlier call on this
    worker (taken out while the rows are solved: a failed task leaves none behind) and leaves
    its final one."""
    key = block[0]
    with _one_thread():
        rows = _rows_for(Xt, *block)
        if start is None:
            start = rows.ridge(Q)
        if not keep_grams:
            return _active_rows.solve_rows(rows, Q, start, target)
        grams = _WORKER_GRAMS.setdefault(key, {})
        index = range(first, first + Q.shape[0])
        kept = [grams.pop(i, None) for i in index]
        W, reports = _active_rows.solve_rows(rows, Q, start, target, kept=kept)
        grams.update(zip(index, kept))
        return W, reports


def distributed_error(block: Block, what: str, exc: BaseException) -> SolverError:
    """The ``SolverError`` of a block whose pieces Dask could not solve (no partial block)."""
    return SolverError(
        block.kind,
        block.layer,
        "distributed_error",
        f"Dask could not solve the {what} ({type(exc).__name__}: {exc}); "
        f"no partial block is returned",
    )


class WorkerRows:
    """The driver's side: the Dask client (from ``connect``, called on first use) and the data
    sets sent to its workers, by digest (``sends`` counts them; ``files`` holds the paths of
    those that went by file). ``keep_grams``: each worker keeps the final Gram of each of its
    rows for the next call on the same data. ``threads``: the driver's threads for the rows'
    certificate while the workers wait (``column_threads``; the backend's ``check_threads``).
    ``close`` removes the files (so does the garbage collector, and the interpreter's exit)."""

    def __init__(
        self, connect: Callable[[], Any], keep_grams: bool = True, threads: int = 1
    ) -> None:
        self._connect, self.keep_grams, self.threads = connect, bool(keep_grams), int(threads)
        self._sent: OrderedDict = OrderedDict()  # digest -> (a future or SharedPoints, files)
        self.files: list[str] = []
        self.sends = 0
        self._finalizer = weakref.finalize(self, _rank_arrays.discard, self.files)

    def data(self, client: Any, Xt: ArrayLike) -> tuple[str, Any]:
        """``(digest, handle)`` of ``X~`` on every worker, sent once: its ``SharedPoints`` where
        every worker can open their files and ``X~`` has ``FILE_MIN`` bytes or more, else a
        scattered future."""
        key = digest(Xt)
        if key not in self._sent:
            self._sent[key] = self._send(client, np.asarray(Xt, dtype=float))
            self.sends += 1
            while len(self._sent) > KEEP:  # a future is released on the workers, a file removed
                self._drop(self._sent.popitem(last=False)[1][1])
        self._sent.move_to_end(key)
        return key, self._sent[key][0]

    def _send(self, client: Any, Xt: np.ndarray) -> tuple[Any, list[str]]:
        shared = points(Xt) if Xt.nbytes >= FILE_MIN else None
        if shared is not None:
            self.files.extend(shared.paths)
            seen = (client.run(can_open, p, os.stat(p).st_size).values() for p in shared.paths)
            if all(all(answers) for answers in seen):
                return shared, shared.paths
            self._drop(shared.paths)
        return client.scatter(Xt, broadcast=True, hash=False), []

    def _drop(self, paths: list[str]) -> None:
        _rank_arrays.discard(paths)
        for path in paths:
            self.files.remove(path)

    def close(self) -> None:
        """Removes the files of the data sent by file (a worker's mapping outlives the name)."""
        _rank_arrays.discard(self.files)
        self.files.clear()
        self._sent.clear()

    def solve(
        self, block: WHidden, Q: np.ndarray, c: float, start: np.ndarray | None, target: float
    ) -> tuple[np.ndarray, list[_active_rows.RowReport], int]:
        """Every row of the block on the workers, one contiguous share each; returns
        ``(W, reports, shares)``. A lost worker's share is retried (``DASK_RETRIES``); a share
        that still fails fails the block (``SolverError``, no partial block)."""
        try:
            client = self._connect()
            key, data = self.data(client, block.Xt)
            workers = sorted(client.nthreads())
            k = max(1, min(len(workers), Q.shape[0]))
            bounds = np.linspace(0, Q.shape[0], k + 1).astype(int)
            futures = [
                client.submit(
                    solve_share,
                    data,
                    (key, float(block.lam), float(c)),
                    Q[a:b],
                    None if start is None else start[a:b],
                    float(target),
                    int(a),
                    self.keep_grams,
                    pure=False,
                    retries=DASK_RETRIES,
                    workers=[w],
                    allow_other_workers=True,
                )
                for w, a, b in zip(workers, bounds[:-1], bounds[1:])
            ]
            parts = client.gather(futures)
        except Exception as exc:  # lost workers, unreachable scheduler, errors in a task
            raise distributed_error(block, "rows", exc) from exc
        W = np.concatenate([np.asarray(p[0], dtype=float).reshape(-1, Q.shape[1]) for p in parts])
        if W.shape != Q.shape:
            raise SolverError(
                block.kind,
                block.layer,
                "distributed_error",
                f"the workers returned rows of shape {W.shape}, not {Q.shape}",
            )
        W[~np.all(np.isfinite(W), axis=1)] = 0.0  # the driver's fallback starts from there
        return W, [rep for p in parts for rep in p[1]], k
