"""A block's figures at a point (its image, value and KKT residual) on column shares, a thread each.

The figures that certify a block (docs/certificate.md, checks 2 and 4: the block's value and the
KKT residual of ``blocks.kkt_residual``) are sums and maxima over the columns of the block's
image: its data points (the paper's Sec. 4.5: an X-block, eqs. (14)-(16), is a problem per
column; a W-block, eqs. (17)-(20), a sum over them). On Figure 1's 300 x 60,000 arrays they are
mostly elementwise passes, which NumPy runs on one core. :func:`figures` splits the columns
into consecutive shares of at most :data:`CHUNK` columns (a W-block's: :data:`W_ENTRIES` of
its image; ``reduce.share``), forms each share's figures in its own thread (``Block.columns``:
the block of those columns), ``threads`` of them at once (at most one a ``min_columns``
columns), and adds and takes maxima over the shares through the reduction seam
(``reduce.SimulatedComm(P, running=...)``: in shard order, so the figures do not depend on
which thread finishes first). NumPy releases the GIL in its loops, so the running shares use as
many cores; BLAS keeps one thread a share while several compute at once
(``threads.one_blas_thread``), and the process's BLAS threads where they compute in turn. A
share's temporaries (the gradient's terms, the residual's elements: about five arrays of its
size) are a few MB, reused share after share, not five arrays of the block's size (Figure 1's
X_1: 300 x 60,000, 144 MB each) whose fresh pages cost more than the passes (the docs
page of the oracle, "A whole iteration at full size"). On the ranks of a communicator that
splits the columns, a rank's columns make shares alike, on one thread, and their reductions go
through the ranks once a figure (a group of one rank gives the one process's figures bit for
bit).

:func:`over_columns` does the same for any figure written against a communicator: a round's
objectives F and J, its divergences and Fenchel-Young check (``rounds.py``) and the accuracies
(``evaluation.py``). The figures are the one-thread figures to round-off (the sums add in
another order). NumPy arrays only (a GPU's arrays make one share). The ``OracleBackend`` checks
on as many threads as it has Dask workers (``check_threads``): the workers wait while the
driver checks, so their cores are free.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from .arrays import by_slices
from .blocks import residual_maxima, scaled_residual
from .reduce import LOCAL, Comm, SimulatedComm, share
from .threads import one_blas_thread

if TYPE_CHECKING:
    from .arrays import Array
    from .blocks import Block

T = TypeVar("T")

#: the fewest columns a share takes (fewer: fewer threads)
MIN_COLUMNS = 2048
#: the most columns a share takes: more columns make more shares, ``threads`` of them computing
#: at once (a share's temporaries are a few arrays of its columns, reused share after share)
CHUNK = 2048
#: the most shares a figure takes, each a thread waiting for its turn: beyond MAX_SHARES x CHUNK
#: columns (131,072) the shares widen instead of growing in number
MAX_SHARES = 64
#: the most entries of its image a share of a W-block takes (rows x columns): a W-block's share
#: also forms the whole-W figures (the penalty, the residual over W) and a product over its
#: columns, so its shares are wider (Figure 1's W_0, 300 x 60,000, on two threads: the first
#: figures 1.4 s and later ones 0.51-0.61 s in these shares of 10,000 columns, 1.6 and 0.76 s in
#: shares of 2,048, 2.4 and 0.46 s in two; LeNet-5's conv W-blocks on a batch of 500, 2.4 M
#: entries and less: one share; the 2-core Intel Xeon VM, 2026-12-05)
W_ENTRIES = 3_000_000


@dataclass(frozen=True)
class Figures:
    """A block's figures at a point ``Z``."""

    image: Any  # ``block.forward(Z)``
    value: float  # the block's value at Z
    residual: float  # ``blocks.kkt_residual`` at Z (nan: not asked for)
    scale: float = math.nan  # the residual's scale, ``1 + max_i ||g_i||_inf``
    gradient: Any = None  # the block's gradient at Z, where asked for


def figures(
    block: Block,
    Z: Array,
    image: Array | None = None,
    threads: int = 1,
    residual: bool = True,
    comm: Comm = LOCAL,
    min_columns: int = MIN_COLUMNS,
    gradient: bool = False,
    value: bool = True,
) -> Figures:
    """The image, value and (``residual``) KKT residual of ``block`` at ``Z``, on shares of at
    most :data:`CHUNK` columns (a W-block's: :data:`W_ENTRIES` of its image), ``threads`` of
    them computing at once (at most one a ``min_columns`` columns); with ``gradient``, the
    block's gradient too; without ``value``, no value (nan). ``image``: ``block.forward(Z)``
    where the caller holds it (else formed here, by the shares). ``comm``: the ranks that hold
    shares of the block's data points by columns (``reduce.py``): the whole block's figures, a
    rank's columns on one thread.

    >>> import numpy as np
    >>> from fenchel_cvx.blocks import XLast
    >>> block = XLast.example()
    >>> Z = np.abs(block.U_prev)
    >>> one, two = figures(block, Z), figures(block, Z, threads=2, min_columns=1)
    >>> bool(np.allclose(one.value, two.value) and np.allclose(one.residual, two.residual))
    True
    """
    chunk = CHUNK if block.piece_axis == 1 else max(1, W_ENTRIES // block.shape[0])
    P, running = _shares(threads, block.n_columns, min_columns, comm, Z, chunk)
    if P == 1:
        U = block.forward(Z) if image is None else image
        return Figures(U, *_at(block, Z, U, comm, residual, gradient, value))
    out = _empty_image(block, Z) if image is None else image

    def work(shard: Any) -> tuple:
        index = share(block.n_columns, P, shard.rank)
        part, z = block.columns(index), block.variable_columns(Z, index)
        if image is None:
            out[:, index] = part.forward(z)
        return _at(part, z, out[:, index], _within(shard, comm), residual, gradient, value)

    with _blas_for(running):
        shares = SimulatedComm(P, timeout=None, running=running).run(work)
    value, r, scale, g = shares[0]
    if gradient:  # each share's part of the gradient (a W-block's: the whole, on every share)
        g = np.empty_like(g, shape=Z.shape)
        for rank, (*_, part_g) in enumerate(shares):
            block.variable_columns(g, share(block.n_columns, P, rank))[...] = part_g
    return Figures(out, value, r, scale, g)


def _at(
    block: Block, Z: Array, U: Array, comm: Comm, residual: bool, gradient: bool, value: bool
) -> tuple:
    """``(value, residual, scale, gradient)`` of the block (``comm``: the whole block's)."""
    f = float(block.value_over(Z, U, comm)) if value else math.nan
    if not (residual or gradient):
        return f, math.nan, math.nan, None
    parts = block.summed(block.grad_parts_with_forward(Z, U), comm)
    maxima = residual_maxima(Z, parts, block.project)
    g = sum(parts[1:], parts[0]) if gradient else None
    del parts  # (an X-block's share holds none of its terms while it waits in the maxima)
    r, scale = scaled_residual(block.maxima(maxima, comm))
    return f, r, scale, g


def over_columns(
    fn: Callable[..., Any],
    *arrays: Any,
    threads: int = 1,
    comm: Comm = LOCAL,
    min_columns: int = MIN_COLUMNS,
    chunk: int | None = CHUNK,
) -> Any:
    """``fn(*arrays, comm=comm)``, a figure whose sums and maxima over the data points go
    through ``comm`` (the network's objectives, divergences and Fenchel-Young check), on
    shares of the arrays' columns (the data points: the last axis of each array, of each array
    in a list) of at most ``chunk`` columns (None: ``threads`` shares, for a figure whose
    temporaries are small: a few rows over the columns), ``threads`` of them computing at once.
    -> shard 0's result, which every shard shares.

    >>> import numpy as np
    >>> def total(A, comm):
    ...     return comm.reduce([A.sum()], "sum")[0]
    >>> A = np.arange(12.0).reshape(3, 4)
    >>> float(over_columns(total, A)), float(over_columns(total, A, threads=2, min_columns=1))
    (66.0, 66.0)
    """
    first = _first(arrays)
    m = 0 if first is None else first.shape[-1]
    P, running = _shares(threads, m, min_columns, comm, first, chunk)
    if P == 1:
        return fn(*arrays, comm=comm)

    def work(shard: Any) -> Any:
        index = share(m, P, shard.rank)
        return fn(*(_columns(a, index) for a in arrays), comm=_within(shard, comm))

    with _blas_for(running):
        return SimulatedComm(P, timeout=None, running=running).run(work)[0]


def by_chunks(work: Callable[[slice], T], m: int, chunk: int, threads: int = 1) -> list[T]:
    """``work`` on each slice of ``chunk`` of the ``m`` columns (independent problems: the
    oracle's X_L columns), on ``threads`` threads, one BLAS thread each (the chunks' products
    are small); -> the results in the chunks' order.

    >>> by_chunks(lambda k: (k.start, k.stop), 5, 2, threads=2)
    [(0, 2), (2, 4), (4, 6)]
    """
    with _blas_for(min(threads, -(-m // chunk))):
        return by_slices(work, m, chunk, threads)


def _shares(
    threads: int, m: int, min_columns: int, comm: Comm, like: Any, chunk: int | None = CHUNK
) -> tuple[int, int]:
    """``(shares, running)``: how many shares of ``m`` columns, each at most ``chunk`` columns
    wide (None: any) and at most :data:`MAX_SHARES` of them, and how many compute at once:
    ``threads``, at most one a ``min_columns`` columns (one on the ranks of a communicator:
    ``comm``, whose collectives take the figures, a group of one rank's too); one share for a
    communicator that splits W by rows and for an array other than NumPy's (``like``)."""
    if comm.split != "columns" or not isinstance(like, np.ndarray):
        return 1, 1
    running = 1 if comm is not LOCAL else max(1, min(threads, m // min_columns))
    chunks = 1 if chunk is None else min(-(-m // chunk), MAX_SHARES)
    return max(running, chunks), running


def _blas_for(running: int) -> AbstractContextManager[object]:
    """One BLAS thread a share where several shares compute at once; else the process's BLAS
    threads (shares taken in turn: a backend checking on one thread keeps its BLAS budget for
    the shares' products)."""
    return one_blas_thread() if running > 1 else nullcontext()


class _WithinRank:
    """A share of one rank's columns (``shard``, of a ``SimulatedComm`` in the rank's process)
    where the ranks of ``comm`` hold the block's columns: a reduction adds the rank's shares in
    share order, then the ranks' (one collective, made by share 0), and every share sees the
    whole figure; so a rank's figures are the one process's figures of its columns, bit for
    bit (a group of one rank: the run without one). It reduces and nothing else: the figures
    of ``figures`` and ``over_columns`` are sums and maxima over the columns."""

    def __init__(self, shard: Any, comm: Comm) -> None:
        self.shard, self.comm = shard, comm
        self.P, self.rank, self.split = comm.P, comm.rank, comm.split

    def reduce(self, values: Sequence[Any], op: str | Sequence[str]) -> list:
        mine = self.shard.reduce(values, op)
        whole = self.comm.reduce(mine, op) if self.shard.rank == 0 else None
        return self.shard.all_gather(whole)[0]


def _within(shard: Any, comm: Comm) -> Any:
    """The communicator of a share of the columns: the share's own in one process (``comm``
    :data:`LOCAL`), else its reductions over the ranks too (:class:`_WithinRank`)."""
    return shard if comm is LOCAL else _WithinRank(shard, comm)


def _first(arrays: Sequence[Any]) -> Any:
    """The first array among ``arrays`` (or in their lists); None where there is none (a
    network without hidden layers has no divergences)."""
    for a in arrays:
        if isinstance(a, (list, tuple)):
            a = next((x for x in a if x is not None), None)
        if a is not None:
            return a
    return None


def _columns(a: Any, index: slice) -> Any:
    """The columns ``index`` of an array, of each array in a list (None stays None)."""
    if a is None:
        return None
    if isinstance(a, (list, tuple)):
        return [_columns(x, index) for x in a]
    return a[..., index]


def _empty_image(block: Block, Z: Array) -> np.ndarray:
    """An empty array of ``block.forward(Z)``'s shape and dtype (from the image of one column)."""
    one = slice(0, 1)
    column = block.columns(one).forward(block.variable_columns(Z, one))
    return np.empty((column.shape[0], block.n_columns), dtype=column.dtype)
