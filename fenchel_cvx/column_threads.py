"""A block's figures at a point (its image, value and KKT residual) on column shares, a thread each.

The figures that certify a block (docs/certificate.md, checks 2 and 4: the block's value and the
KKT residual of ``blocks.kkt_residual``) are sums and maxima over the columns of the block's
image: its data points (the paper's Sec. 4.5: an X-block, eqs. (14)-(16), is a problem per
column; a W-block, eqs. (17)-(20), a sum over them). On Figure 1's 300 x 60,000 arrays they are
mostly elementwise passes, which NumPy runs on one core. :func:`figures` splits the columns
into ``threads`` consecutive shares (``reduce.share``), forms each share's figures in its own
thread (``Block.columns``: the block of those columns), and adds and takes maxima over the
shares through the reduction seam (``reduce.SimulatedComm``: in shard order, so the figures do
not depend on which thread finishes first). NumPy releases the GIL in its loops, so the shares
run on as many cores; BLAS keeps one thread a share meanwhile (``threads.one_blas_thread``).

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
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from .blocks import residual_and_scale
from .reduce import LOCAL, Comm, SimulatedComm, share
from .threads import one_blas_thread

if TYPE_CHECKING:
    from .arrays import Array
    from .blocks import Block

T = TypeVar("T")

#: the fewest columns a share takes (fewer: fewer threads)
MIN_COLUMNS = 2048


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
    """The image, value and (``residual``) KKT residual of ``block`` at ``Z``, on ``threads``
    column shares, one thread each (at most one a ``min_columns`` columns); with ``gradient``,
    the block's gradient too; without ``value``, no value (nan). ``image``:
    ``block.forward(Z)`` where the caller holds it (else formed here, by the shares).
    ``comm``: the ranks that hold shares of the block's data points (``reduce.py``): the whole
    block's figures, on one thread (a rank's share is not split again).

    >>> import numpy as np
    >>> from fenchel_cvx.blocks import XLast
    >>> block = XLast.example()
    >>> Z = np.abs(block.U_prev)
    >>> one, two = figures(block, Z), figures(block, Z, threads=2, min_columns=1)
    >>> bool(np.allclose(one.value, two.value) and np.allclose(one.residual, two.residual))
    True
    """
    P = _shares(threads, block.n_columns, min_columns, comm, Z)
    if P == 1:
        U = block.forward(Z) if image is None else image
        return Figures(U, *_at(block, Z, U, comm, residual, gradient, value))
    out = _empty_image(block, Z) if image is None else image

    def work(shard: Any) -> tuple:
        index = share(block.n_columns, P, shard.rank)
        part, z = block.columns(index), block.variable_columns(Z, index)
        if image is None:
            out[:, index] = part.forward(z)
        return _at(part, z, out[:, index], shard, residual, gradient, value)

    with one_blas_thread():
        shares = SimulatedComm(P, timeout=None).run(work)
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
    r, scale = residual_and_scale(block, Z, parts, comm)
    return f, r, scale, sum(parts[1:], parts[0]) if gradient else None


def over_columns(
    fn: Callable[..., Any],
    *arrays: Any,
    threads: int = 1,
    comm: Comm = LOCAL,
    min_columns: int = MIN_COLUMNS,
) -> Any:
    """``fn(*arrays, comm=comm)``, a figure whose sums and maxima over the data points go
    through ``comm`` (the network's objectives, divergences and Fenchel-Young check), on
    ``threads`` shares of the arrays' columns (the data points: the last axis of each array, of
    each array in a list), a thread each. -> shard 0's result, which every shard shares.

    >>> import numpy as np
    >>> def total(A, comm):
    ...     return comm.reduce([A.sum()], "sum")[0]
    >>> A = np.arange(12.0).reshape(3, 4)
    >>> float(over_columns(total, A)), float(over_columns(total, A, threads=2, min_columns=1))
    (66.0, 66.0)
    """
    first = _first(arrays)
    m = 0 if first is None else first.shape[-1]
    P = _shares(threads, m, min_columns, comm, first)
    if P == 1:
        return fn(*arrays, comm=comm)

    def work(shard: Any) -> Any:
        index = share(m, P, shard.rank)
        return fn(*(_columns(a, index) for a in arrays), comm=shard)

    with one_blas_thread():
        return SimulatedComm(P, timeout=None).run(work)[0]


def by_chunks(work: Callable[[slice], T], m: int, chunk: int, threads: int = 1) -> list[T]:
    """``work`` on each slice of ``chunk`` of the ``m`` columns (independent problems: the
    oracle's X_L columns), on ``threads`` threads, one BLAS thread each (the chunks' products
    are small); -> the results in the chunks' order.

    >>> by_chunks(lambda k: (k.start, k.stop), 5, 2, threads=2)
    [(0, 2), (2, 4), (4, 6)]
    """
    chunks = [slice(a, a + chunk) for a in range(0, m, chunk)]
    if threads <= 1 or len(chunks) <= 1:
        return [work(k) for k in chunks]
    with one_blas_thread(), ThreadPoolExecutor(min(threads, len(chunks))) as pool:
        return list(pool.map(work, chunks))


def _shares(threads: int, m: int, min_columns: int, comm: Comm, like: Any) -> int:
    """How many shares of ``m`` columns: ``threads``, at most one a ``min_columns`` columns; one
    on the ranks of a communicator (``comm``: its collectives take the figures, a group of one
    rank's too) and for an array other than NumPy's (``like``)."""
    if comm is not LOCAL or not isinstance(like, np.ndarray):
        return 1
    return max(1, min(threads, m // min_columns))


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
