"""The rows of a (leaky) ReLU hidden W-block, solved exactly: dual pivoting or Newton steps.

Row ``i`` of the hidden W-block (the paper's Sec. 4.5.2, "Updating W-variables", eqs. (17) and (19);
docs/oracle.md, "Exact methods") solves, with ``c = rho + gamma > 0`` and
``q = lam X~ v_i + 2 gamma w0_i`` (the templates' ``Q``),

    min_w  f(w) = lam sum_j F*(x~_j^T w) - q^T w + c ||w||^2 ,

a strongly convex piecewise quadratic (``F*(u) = u_+^2/2 + a u_-^2/2``, ``a`` the slope:
0 for ReLU). Three exact routes:

* **dual** (few data points against the ``n`` inputs: MNIST's W_0 on a batch): writing
  ``phi(X~^T w)`` through multipliers ``mu = lam phi(X~^T w)`` gives ``w = (q - X~ mu) / 2c``
  and, for ReLU, the nonnegative least squares ``min_{mu >= 0} 1/2 mu^T H mu - b^T mu``,
  ``H = X~^T X~ + (2c/lam) I``, ``b = X~^T q``, with one Gram matrix ``H`` for every row
  (``nnls.solve_gram``: block principal pivoting, each pivot a factor of side up to ``m``).
  Leaky ReLU: ``mu = p - q`` with ``p, q >= 0`` and ``+ delta/2 ||q||^2``,
  ``delta = (1/a - 1) 2c / lam``, a nonnegative least squares in ``2m`` variables on
  ``[[H, -H], [-H, H + delta I]]`` (``RowDual``);
* **primal** (few inputs, many points: the digits, a convolution's patches): from ``start``, or
  from the point where every pre-activation is positive, semismooth Newton on ``f`` with the
  generalised Hessian ``lam X~ D X~^T + 2c I``, ``D = diag(phi'(X~^T w))`` (``n x n``);
* **active** (ReLU on many points: all of MNIST): the same Newton steps with each row's Gram
  ``X~_A X~_A^T`` kept and updated by the points that change sides (``active_rows.py``), where
  the primal route would form its Hessian afresh, ``n^2 m`` a step and a row.

The rule (``route``): the dual where a flop count finds its factor cheaper than a primal step
(``use_dual``), and for a ReLU only while ``m <= DUAL_SIDE n`` (or ``m <= DUAL_POINTS``, a
small block): beyond that the dual's pivots (factors of side about ``m / 2``) cost more than
the active route's ``n x n`` steps (MNIST's W_0, ``n = 785``: docs page "The CVXPY oracle",
"Below 4,000 points"); else ``active`` for a ReLU off the dual or above ``ACTIVE_MIN`` points;
else ``primal`` (below ``ACTIVE_MIN`` the primal route is as cheap, and its iterates are the
ones the tests pin). The dual's pivoting and refinement run on one BLAS thread: their factors
are small, and a second OpenBLAS thread made MNIST's W_0 on 680 points 12 times slower (22.7 s
against 1.9 s on the 2-core VM).

Each row of the active route is certified by its gradient recomputed here on the block's scale
(``blocks.kkt_residual``); the rows that miss it take the primal route's Newton steps from
where ``active_rows`` left them (the fallback), and the caller certifies the block.

The dual and the primal routes end with the same loop (``newton_rows``): Newton steps on each
row whose gradient exceeds the target on the block's scale, with a backtracking line search on
the row's own ``f``. After the dual route the first full step lands on the optimum (it only
removes the round-off that ``w = (q - X~ mu) / 2c`` amplifies by ``||X~||^2 / 2c``); there the
inverse comes from the dual's matrix by Woodbury,
``(lam X~ D X~^T + 2c I)^{-1} = (I - X~ (H + delta diag(u <= 0))^{-1}_A X~^T) / 2c``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from scipy.linalg import cho_factor, cho_solve

from ..column_threads import Figures, figures
from ..threads import one_blas_thread
from . import active_rows as _active_rows
from . import nnls as _nnls

if TYPE_CHECKING:
    from ..blocks import WHidden
    from .dask_rows import WorkerRows

# the dual's Gram matrix has one row per data point (two with a leaky ReLU): formed up to this
DUAL_MAX = 4000
# ReLU rows take the dual while m <= DUAL_SIDE n (its pivots' side ~ m / 2 against the active
# route's n; the module doc), and on at most DUAL_POINTS points whatever n (small blocks, where
# the active route's setup, T = X~ X~^T and its spectrum, outweighs the pivots)
DUAL_SIDE = 2
DUAL_POINTS = 1000
# ReLU rows off the dual route take active_rows above this many points, else the primal route
ACTIVE_MIN = DUAL_MAX
# pivoting rounds per row (None: nnls.solve_gram's default, 5 m + 20); Newton steps per row
# after the dual route and for the primal route
PIVOT_ROUNDS = None
REFINE_STEPS = 3
NEWTON_STEPS = 50
ARMIJO = 1e-4


@dataclass
class RowDual:
    """The dual of the rows: one ``SharedGram`` for every row; ``lift`` / ``lower`` map between
    ``mu``'s space and the split one of a leaky ReLU (``split``)."""

    gram: _nnls.SharedGram
    m: int
    split: bool

    def lift(self, b: np.ndarray) -> np.ndarray:
        return np.concatenate([b, -b]) if self.split else b

    def lower(self, x: np.ndarray) -> np.ndarray:
        return x[: self.m] - x[self.m :] if self.split else x

    def passive(self, pos: np.ndarray) -> np.ndarray:
        return np.concatenate([pos, ~pos]) if self.split else pos

    def inverse(self, z: np.ndarray, pos: np.ndarray) -> np.ndarray:
        """``(H + delta diag(~pos))^{-1} z`` on ``pos`` (ReLU: ``H_AA^{-1} z_A``, 0 elsewhere)."""
        return self.lower(self.gram.solve(self.lift(z), self.passive(pos))[0])


def use_dual(n: int, m: int, slope: float) -> bool:
    """The dual when its pivots (a factor of about half its side) cost less than primal
    Newton steps (``n^2 m`` to form the Hessian, ``n^3 / 3`` to factor it)."""
    md = m * (2 if slope else 1)
    return md <= DUAL_MAX and (md / 2.0) ** 3 / 3.0 < n * n * m + n**3 / 3.0


def route(n: int, m: int, slope: float) -> str:
    """The rows' exact route (module doc): ``"dual"`` where ``use_dual`` (for a ReLU while
    ``m <= max(DUAL_SIDE n, DUAL_POINTS)``); ``"active"`` for a ReLU beyond that, or above
    ``ACTIVE_MIN`` points; else ``"primal"``.

    >>> [route(785, m, 0.0) for m in (500, 1570, 1571, 60000)]  # MNIST's W_0
    ['dual', 'dual', 'active', 'active']
    >>> route(2000, 1600, 0.0), route(7, 30, 0.0)  # a wide layer; a small block
    ('dual', 'dual')
    >>> route(785, 1000, 0.01), route(785, 3000, 0.01)  # leaky ReLU: no active route
    ('dual', 'primal')
    >>> route(65, 1347, 0.0), route(26, 3000, 0.0), route(26, 4001, 0.0)  # digits, patches
    ('primal', 'primal', 'active')
    """
    dual = use_dual(n, m, slope)
    if dual and (slope or m <= max(DUAL_SIDE * n, DUAL_POINTS)):
        return "dual"
    if not slope and (dual or m > ACTIVE_MIN):
        return "active"
    return "primal"


def solve(
    block: WHidden,
    Q: np.ndarray,
    c: float,
    start: np.ndarray | None,
    target: float,
    slope: float,
    noise: float,
    workers: WorkerRows | None = None,
) -> tuple[np.ndarray, int, dict[str, Any]]:
    """The argmin of the rows; returns ``(W, iterations, info)``. ``noise``: the relative
    round-off of a row's value near its optimum (the line search then judges by the gradient).
    ``workers``: a ``dask_rows.WorkerRows``, on whose Dask workers the ``active`` route's rows
    run (None: in this process), and whose ``threads`` form their certificate here."""
    Xt, lam = block.Xt, block.lam
    n, m = Xt.shape
    way = route(n, m, slope)
    if way == "dual":
        return _dual(block, Q, c, start, target, slope, noise)
    if way == "active":
        return _active(block, Q, c, start, target, noise, workers)
    if start is None:  # every pre-activation positive: (lam X~ X~^T + 2c I) w = q
        H = lam * (Xt @ Xt.T)
        H[np.diag_indices(n)] += 2.0 * c
        start = cho_solve(cho_factor(H, check_finite=False), Q.T, check_finite=False).T
    W, steps = newton_rows(
        block,
        np.array(start, dtype=float),
        Q,
        c,
        target,
        NEWTON_STEPS,
        noise,
        lambda w, g: _primal_inverse(block, c, w, g),
    )
    return W, steps, {"route": "primal", "newton_steps": steps}


def _dual(block, Q, c, start, target, slope, noise):
    """The ``dual`` route: the rows' NNLS duals on one shared Gram (``RowDual``), then Newton
    refinement on the primal rows; ``(W, iterations, info)`` as ``solve``."""
    Xt, lam, m = block.Xt, block.lam, block.Xt.shape[1]
    H = Xt.T @ Xt
    H[np.diag_indices(m)] += 2.0 * c / lam
    if slope:
        delta = (1.0 / slope - 1.0) * 2.0 * c / lam
        H = np.block([[H, -H], [-H, H + delta * np.eye(m)]])
    dual = RowDual(_nnls.SharedGram(H), m, bool(slope))
    passive = None if start is None else dual.passive((start @ Xt > 0).T)
    with one_blas_thread():  # small factors (module doc)
        M, pivots, unsolved = _nnls.solve_gram(
            dual.gram, dual.lift((Q @ Xt).T), passive, PIVOT_ROUNDS
        )
        W = (Q - (Xt @ dual.lower(M)).T) / (2.0 * c)
        W, steps = newton_rows(
            block,
            W,
            Q,
            c,
            target,
            REFINE_STEPS,
            noise,
            lambda w, g: (g - Xt @ dual.inverse(Xt.T @ g, w @ Xt > 0)) / (2.0 * c),
        )
    info = {"route": "dual", "pivots": pivots, "newton_steps": steps}
    return W, pivots + steps, {**info, "unsolved_rows": len(unsolved)}


def _active(block, Q, c, start, target, noise, workers=None):
    """The ``active`` route: ``active_rows`` on every row (on the Dask workers of ``workers``,
    ``dask_rows.py``), each row certified here by its recomputed gradient (on the workers'
    ``threads`` column shares, while they wait), the primal route's Newton steps on the rows
    that miss it. Where none missed, ``info["figures"]`` holds the block's figures at the
    returned rows."""
    shares, threads = 0, 1 if workers is None else workers.threads
    if workers is not None:  # the workers start from the ridge point when start is None
        W, reports, shares = workers.solve(block, Q, c, start, target)
    else:
        rows = _active_rows.Rows.of(np.asarray(block.Xt, dtype=float), block.lam, c)
        if start is None:  # every pre-activation positive (T is formed anyway)
            start = rows.ridge(Q)
        W, reports = _active_rows.solve_rows(rows, Q, start, target)
    missed, _, found = uncertified(block, W, target, threads, value=True)
    fallback, kept = 0, found if not missed.size else None
    if missed.size:  # the primal route's Newton steps, on the rows that miss the target
        W, fallback = newton_rows(
            block,
            W,
            Q,
            c,
            target,
            NEWTON_STEPS,
            noise,
            lambda w, g: _primal_inverse(block, c, w, g),
        )
    steps = max((rep.steps for rep in reports), default=0)
    return (
        W,
        steps + fallback,
        {
            "route": "active",
            "newton_steps": steps,
            "changes": int(sum(sum(rep.changes) for rep in reports)),
            "uncertified_rows": int(missed.size),
            "fallback_steps": fallback,
            **({"figures": kept} if kept is not None else {}),
            **(
                {
                    "worker_shares": shares,
                    "kept_grams": int(sum(rep.kept_gram for rep in reports)),
                }
                if shares
                else {}
            ),
        },
    )


def uncertified(
    block: WHidden, W: np.ndarray, target: float, threads: int = 1, value: bool = False
) -> tuple[np.ndarray, np.ndarray, Figures]:
    """The rows whose gradient exceeds ``target`` on the block's scale
    (``blocks.kkt_residual``'s: ``1 + max_i |g_i|_inf`` over the whole block), the gradient, and
    the block's figures at W (``column_threads.figures`` on ``threads`` column shares; its
    value with ``value``)."""
    found = figures(block, W, threads=threads, gradient=True, value=value)
    G, bound = found.gradient, target * found.scale
    return np.flatnonzero(np.max(np.abs(G), axis=1) > bound), G, found


def _primal_inverse(block, c, w, g):
    """``(lam X~ D X~^T + 2c I)^{-1} g`` with ``D = diag(phi'(X~^T w))``."""
    Xt = block.Xt
    H = block.lam * ((Xt * block.act.dphi(w @ Xt)) @ Xt.T)
    H[np.diag_indices(Xt.shape[0])] += 2.0 * c
    return cho_solve(cho_factor(H, check_finite=False), g, check_finite=False)


def newton_rows(
    block: WHidden,
    W: np.ndarray,
    Q: np.ndarray,
    c: float,
    target: float,
    max_steps: int,
    noise: float,
    inverse: Callable[[np.ndarray, np.ndarray], np.ndarray],
) -> tuple[np.ndarray, int]:
    """Newton steps ``-inverse(w, g)`` with a line search, on every row whose gradient exceeds
    ``target`` on the block's scale (``blocks.kkt_residual``); returns ``(W, steps)``."""
    steps = 0
    for _ in range(max_steps):
        rows, G, _ = uncertified(block, W, target)
        if not rows.size:
            break
        for i in rows:
            W[i] = _row_search(block, Q[i], c, W[i], -inverse(W[i], G[i]), G[i], noise)
        steps += 1
    return W, steps


def _row(block, q, c, w):
    """``(f(w), grad f(w))`` of one row."""
    u = w @ block.Xt
    f = block.lam * float(np.sum(block.act.Fstar(u))) - float(q @ w) + c * float(w @ w)
    return f, block.lam * (block.Xt @ block.act.phi(u)) - q + 2.0 * c * w


def _row_search(block, q, c, w, d, g, noise):
    """Backtracking from the full step: Armijo, or (near the optimum, where ``f`` is flat to its
    round-off) no increase beyond ``noise`` with a smaller gradient."""
    f, _ = _row(block, q, c, w)
    size, slope, t = float(np.max(np.abs(g))), float(g @ d), 1.0
    for _ in range(40):
        T = w + t * d
        fT, gT = _row(block, q, c, T)
        if math.isfinite(fT) and (
            (fT < f and fT <= f + ARMIJO * t * slope)
            or (fT <= f + noise * (1.0 + abs(f)) and float(np.max(np.abs(gT))) < size)
        ):
            return T
        t *= 0.5
    return w
