"""Exact block methods that beat the CVXPY templates, each certified by the block's KKT residual.

The CVXPY templates (``templates.py``) define the blocks and stay the reference; for the W-blocks
of the paper's Sec. 4.5.2 ("Updating W-variables": the non-batched sub-problems and the batched
ones with ``gamma ||W - W0||^2``) with ``c = rho + gamma > 0`` (strongly convex: one minimiser)
the structure below gives the minimiser by dense linear algebra instead:

* **WHidden, ReLU and leaky ReLU** (``rows.py``): row by row, a strongly convex piecewise
  quadratic. Its dual is a nonnegative least squares in the ``m`` data points (``2m`` for a
  leaky ReLU) whose Gram matrix ``X~^T X~ + (2c/lam) I`` is the same for every row
  (``nnls.solve_gram``), followed by a Newton step that removes the round-off of the primal
  recovery; or, with few inputs and many points, semismooth Newton on the row itself (for a
  ReLU on many points with each row's Gram kept and updated: ``active_rows.py``; the rule is
  ``rows.route``).
* **WLast, MSE**: a ridge regression, ``W (X~ X~^T + c I) = Y X~^T + gamma W0``, by Cholesky,
  then the same Newton step on the recomputed gradient.
* **WLast, cross-entropy**: smooth and strongly convex; Newton's method with a backtracking
  line search, from the start (the current weights) or from ``gamma W0 / c``. The Hessian
  ``sum_j s_j (diag p_j - p_j p_j^T) (x) x~_j x~_j^T + 2c I`` (``K n`` square: 3010 on MNIST) is
  inverted by Woodbury with few points (``ce_direction``: ``K`` factors of side ``n``, one of
  side ``m``), else formed and factored.
* **XLast, cross-entropy after a ReLU**: smooth and strongly convex on ``Z >= 0``, column by
  column: projected Newton (``ce_columns.py``).
* **XLast, MSE after a ReLU**: the nonnegative least squares of eq. (15) through its dual in the
  output dimension (``K`` unknowns a column), by batched semismooth Newton (``output_dual.py``);
  the backend's fallback is the nonnegative least squares of ``nnls.py``.

``attempt(block, start, tol)`` picks the method by the block's type and its activation's or
loss's type (``METHODS``: one entry per variant), runs it, and certifies the result by
``blocks.kkt_residual <= tol``; the backend falls back to the CVXPY template when there is no
method, or when the method fails or its certificate does not hold (``Exact.reason`` says why).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import ArrayLike
from scipy.linalg import LinAlgError, cho_factor, cho_solve

from ..activations import LeakyReLU, ReLU
from ..blocks import Block, WHidden, WLast, XLast
from ..column_threads import figures
from ..losses import MSE, CrossEntropy, softmax
from . import ce_columns as _ce_columns
from . import output_dual as _output_dual
from . import rows as _rows_mod
from . import softmax_cg as _softmax_cg

if TYPE_CHECKING:
    from .dask_rows import WorkerRows

# Newton's method on the cross-entropy W-block: the most steps
NEWTON_STEPS = 50
# Newton steps on the recomputed gradient after the ridge solve
REFINE_STEPS = 3
# Near the optimum the block value is a small difference of large sums (cross-entropy on MNIST:
# 1e-12 of noise on a value of 2.4): a Newton step that changes the value by less than this
# fraction of it is judged by its KKT residual instead.
VALUE_NOISE = 1e-10
# the residual the methods aim at, as a fraction of tol (so that a certified block ends well
# inside the tolerance)
TARGET = 0.01


@dataclass
class Exact:
    """What ``attempt`` returns: the certified argmin, or why the method did not certify one."""

    argmin: object  # None when the method failed before returning a point
    residual: float  # blocks.kkt_residual at argmin (inf without one)
    certified: bool  # residual <= tol
    iterations: int
    seconds: float
    info: dict = field(default_factory=dict)  # the method's name and counts
    reason: str = ""  # why not certified ("" when certified)
    value: float = math.nan  # the block's value at argmin (nan without one)


def attempt(
    block: Block,
    start: ArrayLike | None = None,
    tol: float = 1e-7,
    workers: WorkerRows | None = None,
    threads: int = 1,
) -> Exact | None:
    """Solve ``block`` by its exact method and certify it; ``None`` when no method applies.
    ``workers``: a ``dask_rows.WorkerRows`` for the methods that run pieces on Dask workers
    (``distributed``: the ReLU rows' ``active`` route); the certificate is the block's
    figures at the returned point on ``threads`` column shares (``column_threads``), and so is
    the block's value: formed here, or by a method that formed them at that point itself and
    hands them over (the ReLU rows', on ``WorkerRows.threads``; the cross-entropy W_L's Newton
    figures); the ``threaded`` methods (the X_L blocks' chunks of columns, the CE
    W_L block's CG products and figures) take the threads too."""
    method = method_for(block)
    if method is None:
        return None
    t0 = time.perf_counter()
    start = None if start is None else np.asarray(start, dtype=float)
    try:
        on: dict[str, Any] = {}
        if workers is not None and getattr(method, "distributed", False):
            on["workers"] = workers
        if threads > 1 and getattr(method, "threaded", False):
            on["threads"] = threads
        out = method(block, start, TARGET * tol, **on)
    except (LinAlgError, np.linalg.LinAlgError, FloatingPointError) as exc:
        return Exact(
            None,
            math.inf,
            False,
            0,
            time.perf_counter() - t0,
            {"solver": getattr(method, "label", method.__name__)},
            f"{type(exc).__name__}: {exc}",
        )
    if out is None:
        return None
    Z, iterations, info = out
    residual, value = math.inf, math.nan
    # a method that formed the block's figures at Z (``column_threads.figures``: the ReLU rows'
    # certificate, the cross-entropy Newton's last figures) hands them over; else formed here
    found = info.pop("figures", None)
    if found is not None or np.all(np.isfinite(Z)):
        found = figures(block, Z, threads=threads) if found is None else found
        residual, value = found.residual, found.value
    ok = residual <= tol
    reason = "" if ok else f"KKT residual {residual:.3g} > tol {tol:.3g} ({info['solver']})"
    return Exact(Z, residual, ok, iterations, time.perf_counter() - t0, info, reason, value)


# --- which method solves which block: by type, one registry entry per variant --------------
@functools.singledispatch
def method_for(block: Block) -> Callable[..., Any] | None:
    """The exact method for ``block`` (``f(block, start, target) -> (Z, iterations, info)``,
    or ``None`` where it does not apply), or ``None``: the CVXPY template solves it."""
    return None


@method_for.register
def _(block: WHidden):  # strongly convex W-blocks only (else: the proximal-point path)
    return METHODS.get((WHidden, type(block.act))) if _c(block) > 0 else None


@method_for.register
def _(block: WLast):
    return METHODS.get((WLast, type(block.loss))) if _c(block) > 0 else None


@method_for.register
def _(block: XLast):
    return METHODS.get((XLast, type(block.loss), type(block.act_in)))


def _label(text, distributed=False, threaded=False):
    """Marks a method with its ``label`` and what it takes besides ``(block, start, target)``:
    ``workers`` (``distributed``), ``threads`` (``threaded``)."""

    def mark(f):
        f.label, f.distributed, f.threaded = text, distributed, threaded
        return f

    return mark


def _c(block):
    return block.rho + block.gamma


def _usable(start, shape):
    """``start`` if it is a finite point of the block's shape, else None (a cold start)."""
    ok = start is not None and start.shape == shape and bool(np.all(np.isfinite(start)))
    return start if ok else None


def _linear_term(block, T):
    """``T X~^T + 2 gamma W0``: the linear coefficient of the block (``Q`` of the templates)."""
    Q = T @ block.Xt.T
    return Q + 2.0 * block.gamma * block.W0 if block.gamma else Q


# --- WHidden, ReLU and leaky ReLU: row by row (rows.py) --------------------------------------
def _rows(block, start, target, slope, label, workers=None):
    Q = _linear_term(block, block.lam * block.V)
    W, iterations, info = _rows_mod.solve(
        block, Q, _c(block), _usable(start, Q.shape), target, slope, VALUE_NOISE, workers
    )
    return (
        W,
        iterations,
        {
            "solver": f"{label} ({info.pop('route')})",
            **info,
            "n_subproblems": W.shape[0],
            "duality_gap": None,
        },
    )


@_label("exact: ReLU rows", distributed=True)  # the active route on the Dask workers
def relu_rows(
    block: WHidden, start: np.ndarray | None, target: float, workers: WorkerRows | None = None
) -> tuple[np.ndarray, int, dict[str, Any]]:
    return _rows(block, start, target, 0.0, relu_rows.label, workers)


@_label("exact: leaky ReLU rows")
def leaky_rows(block: Any, start: np.ndarray | None, target: float) -> tuple[np.ndarray, int, dict]:
    """``relu_rows`` for a leaky ReLU (``block``: a ``WHidden`` of a ``LeakyReLU``, whose
    ``slope`` it reads)."""
    return _rows(block, start, target, block.act.slope, leaky_rows.label)


# --- WLast, MSE: ridge regression ------------------------------------------------------------
@_label("exact: ridge (Cholesky)")
def ridge(
    block: WLast, start: np.ndarray | None, target: float
) -> tuple[np.ndarray, int, dict[str, Any]]:
    Xt, c = block.Xt, _c(block)
    factor = cho_factor(Xt @ Xt.T + c * np.eye(Xt.shape[0]), check_finite=False)
    W = cho_solve(factor, 0.5 * _linear_term(block, 2.0 * block.Y).T, check_finite=False).T
    steps = 0
    for steps in range(1, REFINE_STEPS + 1):  # Newton on the recomputed gradient (2 x ridge)
        if block.kkt_residual(W) <= target:
            steps -= 1
            break
        W = W - 0.5 * cho_solve(factor, block.grad(W).T, check_finite=False).T
    return (
        W,
        1 + steps,
        {
            "solver": ridge.label,
            "newton_steps": steps,
            "n_subproblems": W.shape[0],
            "duality_gap": None,
        },
    )


# --- WLast, cross-entropy: Newton's method (the Hessian by Woodbury or formed) ------------
def ce_direction(
    block: WLast, W: np.ndarray, g: np.ndarray, woodbury: bool | None = None
) -> np.ndarray:
    """The Newton direction ``-H^{-1} g`` of the cross-entropy W-block at ``W``.

    ``H = D - M M^T``: ``D`` block diagonal, ``D_k = X~ diag(s p_k) X~^T + 2c I`` (``n x n``),
    and ``M`` the ``K n x m`` matrix of columns ``sqrt(s_j) p_j (x) x~_j``. With few points
    (``m``) Woodbury, ``H^{-1} = D^{-1} + D^{-1} M C^{-1} M^T D^{-1}``, ``C = I - M^T D^{-1} M``
    (positive definite since ``H`` is), takes ``K`` factors of side ``n`` and one of side ``m``;
    else ``H`` itself is formed and factored (side ``K n``), whichever costs fewer flops
    (``woodbury=None``; ``True`` / ``False`` choose).
    """
    Xt, c = block.Xt, _c(block)
    (n, m), K = Xt.shape, W.shape[0]
    P = softmax(W @ Xt)
    s = block.Y.sum(axis=0)
    M = [Xt * (np.sqrt(s) * P[k]) for k in range(K)]
    D = []
    for k in range(K):
        D.append(Xt @ (Xt * (s * P[k])).T)
        D[-1][np.diag_indices(n)] += 2.0 * c
    if woodbury is None:
        woodbury = (K * n) ** 3 / 3.0 + (K * n) ** 2 * m > (
            K * (n**3 / 3.0 + 2 * n * n * m) + m**3 / 3.0 + 2.0 * K * n * m * m
        )
    if not woodbury:
        H = -np.vstack(M) @ np.vstack(M).T
        for k in range(K):
            H[k * n : (k + 1) * n, k * n : (k + 1) * n] += D[k]
        return -cho_solve(cho_factor(H, check_finite=False), g.ravel(), check_finite=False).reshape(
            K, n
        )
    factors = [cho_factor(Dk, check_finite=False) for Dk in D]
    Z = [cho_solve(f, Mk, check_finite=False) for f, Mk in zip(factors, M)]  # D_k^{-1} M_k
    C = np.eye(m) - sum(Mk.T @ Zk for Mk, Zk in zip(M, Z))
    h = np.stack([cho_solve(f, -gk, check_finite=False) for f, gk in zip(factors, g)])
    t = cho_solve(
        cho_factor(C, check_finite=False),
        sum(Mk.T @ hk for Mk, hk in zip(M, h)),
        check_finite=False,
    )
    return h + np.stack([Zk @ t for Zk in Z])


@_label("exact: cross-entropy Newton", threaded=True)  # CG's products on threads
def softmax_newton(
    block: WLast, start: np.ndarray | None, target: float, threads: int = 1
) -> tuple[np.ndarray, int, dict[str, Any]]:
    K, n = block.Y.shape[0], block.Xt.shape[0]
    start = _usable(start, (K, n))
    if start is not None:
        W = start.copy()
    else:
        W = (block.gamma / _c(block)) * block.W0 if block.gamma else np.zeros((K, n))
    at = figures(block, W, threads=threads, gradient=True)  # value, KKT residual, gradient
    steps = cg_steps = 0
    cg = _softmax_cg.SoftmaxCG(block, _c(block), threads) if _softmax_cg.applies(block) else None
    while at.residual > target and steps < NEWTON_STEPS:
        g = at.gradient
        if cg is None:
            D = ce_direction(block, W, g)
        else:
            D, k = cg.direction(W, g)
            cg_steps += k
        W, at, moved = _line_search(block, W, D, at, float(np.sum(g * D)), threads)
        steps += 1
        if not moved:
            break
    info = {
        "solver": softmax_newton.label,
        "newton_steps": steps,
        "n_subproblems": W.shape[0],
        "duality_gap": None,
        "figures": at,  # the block's figures at W: its certificate (``attempt``)
    }
    if cg is not None:
        info["cg_steps"] = cg_steps
    return W, steps, info


def _line_search(block, W, D, at, slope, threads):
    """Backtracking from the Newton step: a decrease by Armijo's rule or, near the optimum,
    where the value is flat to its round-off (``VALUE_NOISE``), a smaller KKT residual.
    ``at``: the block's figures at ``W``; -> (the new point, its figures with its gradient,
    whether it moved). The figures on ``threads`` column shares (``column_threads``)."""
    t = 1.0
    f, r = at.value, at.residual
    noise = VALUE_NOISE * (1.0 + abs(f))
    for _ in range(40):
        T = W + t * D
        trial = figures(block, T, threads=threads, residual=False)
        f1 = trial.value
        if math.isfinite(f1):
            armijo = f1 < f and f1 <= f + 1e-4 * t * slope
            if armijo or f1 <= f + noise:
                found = figures(block, T, trial.image, threads, gradient=True, value=False)
                if armijo or found.residual < r:
                    return T, dataclasses.replace(found, value=f1), True
        t *= 0.5
    return W, at, False


# --- XLast, cross-entropy after a ReLU: projected Newton by column (ce_columns.py) ---------
@_label("exact: cross-entropy X_L projected Newton", threaded=True)  # chunks on threads
def ce_relu_columns(
    block: XLast, start: np.ndarray | None, target: float, threads: int = 1
) -> tuple[np.ndarray, int, dict[str, Any]]:
    Z = _usable(start, block.U_prev.shape)
    Z = np.maximum(block.U_prev, 0.0) if Z is None else np.maximum(Z, 0.0)  # phi(U): feed-forward
    Z, steps = _ce_columns.solve(block, Z, target, VALUE_NOISE, threads)
    return (
        Z,
        steps,
        {
            "solver": ce_relu_columns.label,
            "newton_steps": steps,
            "n_subproblems": Z.shape[1],
            "duality_gap": None,
        },
    )


# --- XLast, MSE after a ReLU: the dual in the output dimension (output_dual.py) ------------
@_label("exact: MSE X_L dual Newton", threaded=True)  # the columns' chunks on threads
def mse_relu_dual(
    block: XLast, start: np.ndarray | None, target: float, threads: int = 1
) -> tuple[np.ndarray, int, dict[str, Any]]:
    start = _usable(start, block.U_prev.shape)
    Z, R, steps, unsolved = _output_dual.solve_x_last(block, start, threads=threads)
    W, p = block.dense_W(), Z.shape[0]
    gap = _output_dual.duality_gap(
        W[:, :p], W[:, p], block.Y, block.U_prev, block.lam_in, R, threads
    )
    return (
        Z,
        steps,
        {
            "solver": mse_relu_dual.label,
            "newton_steps": steps,
            "unsolved_columns": unsolved,
            "n_subproblems": Z.shape[1],
            "duality_gap": gap,
        },
    )


# One entry per variant: (block type, the activation's or the loss's type) -> its method.
METHODS = {
    (WHidden, ReLU): relu_rows,
    (WHidden, LeakyReLU): leaky_rows,
    (WLast, MSE): ridge,
    (WLast, CrossEntropy): softmax_newton,
    (XLast, CrossEntropy, ReLU): ce_relu_columns,
    (XLast, MSE, ReLU): mse_relu_dual,
}
