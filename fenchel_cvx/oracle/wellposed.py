"""Which W-blocks have a minimiser, checked before any solve; proximal-point solves of the others.

A W-block (the paper's Sec. 4.5.2, eqs. (17)-(20), the W-steps of Algorithms 1-2) with
``rho + gamma > 0`` is strongly convex: one minimiser. With ``rho + gamma = 0`` it is not:

* hidden W-blocks (every activation) and the MSE last W-block are bounded below and either
  piecewise quadratic (ReLU, leaky ReLU, MSE: a minimiser exists, Frank-Wolfe) or have a
  recession function ``sum_j (1 - v_j) (d.x_j)_+ + v_j (d.x_j)_-  > 0`` off the null space of
  ``X~^T`` (sigmoid, tanh with ``v`` inside the range): a minimiser exists, but the set of
  minimisers may be unbounded, and an interior-point solver then returns a far-away point;
* the cross-entropy last W-block ``sum_j s_j lse(W x_j) - y_j.(W x_j)`` has a minimiser iff no
  direction ``D`` has recession value ``R(D) = sum_j s_j max_k (D x_j)_k - y_j.(D x_j) = 0``
  while moving some column off the constant vectors (shifting every column of ``W X~`` by a
  constant is free). Such a ``D`` exists exactly when the data are (weakly) separable by a
  linear classifier; then the loss decreases along ``D`` forever and no minimiser exists.

``ce_separating_direction`` decides the last case by one linear program (HiGHS) and
``check_minimiser`` raises :class:`NoMinimiser` with the remedy (``rho`` or ``gamma`` > 0). It
asks the loss first: only a loss whose ``may_lack_minimiser`` holds is scored
(``recession_score``, registered by the loss's type: ``ce_separating_direction``).
``by_proximal_point`` says which blocks the oracle solves by proximal steps (both dispatch on
the block's class).

``proximal_point`` solves a block with ``rho + gamma = 0`` that has a minimiser: from the start
``W_0`` (the current weights) it solves the strongly convex blocks
``min_W f(W) + c ||W - W_k||^2`` (the same block with ``gamma = c``, ``W0 = W_k``) until the
KKT residual of the *original* block (``blocks.kkt_residual``: zero at every minimiser, unique or
not) is within tolerance. The iterates stay near the start (each step is a descent step of
bounded length), instead of drifting along the flat directions of the block.
"""

import functools
from collections.abc import Callable
from dataclasses import replace
from typing import TypeGuard

import numpy as np
from numpy.typing import ArrayLike
from scipy.optimize import linprog
from scipy.sparse import coo_matrix

from ..blocks import Block, BlockResult, WBlock, WLast
from ..errors import SolverError
from ..losses import CrossEntropy, Loss

# proximal point: the first weight c of ||W - W_k||^2 relative to the block's curvature scale,
# the factor it shrinks by at every step (so that directions of small curvature h converge too:
# the step contracts them by c / (c + h)), its floor, and the largest number of steps
PROX_WEIGHT = 1e-2
PROX_SHRINK = 0.25
PROX_FLOOR = 1e-11
PROX_STEPS = 40


class NoMinimiser(SolverError):
    """The block is bounded below but has no minimiser (found before any solve)."""


def ce_separating_direction(Xt: ArrayLike, Y: ArrayLike) -> tuple[float, np.ndarray]:
    """For the cross-entropy W-block without ``rho, gamma``: ``(score, D)``, where ``score > 0``
    iff the block has no minimiser (``D``: a direction along which the loss never increases and
    some column of ``D X~`` is not constant; ``|D| <= 1``). One LP in ``K n + m`` variables.

    >>> Y = np.eye(2)  # two points, one of each class; X~'s last row the bias's ones
    >>> score, D = ce_separating_direction(np.array([[-1.0, 1.0], [1.0, 1.0]]), Y)
    >>> score > 0, bool(np.abs(D).max() <= 1)  # separable: no minimiser
    (True, True)
    >>> ce_separating_direction(np.ones((2, 2)), Y)[0] > 0  # the same point twice: a minimiser
    False
    """
    Xt, Y = np.asarray(Xt, dtype=float), np.asarray(Y, dtype=float)
    s = Y.sum(axis=0)
    keep = np.flatnonzero(s > 0)
    # R(D) = 0 is unchanged by scaling a column of X~ by a positive number: unit columns keep
    # the LP well scaled (and bound t_j by n)
    norms = np.abs(Xt[:, keep]).max(axis=0)
    keep = keep[norms > 0]
    Xk, Yk, sk = Xt[:, keep] / np.abs(Xt[:, keep]).max(axis=0), Y[:, keep], s[keep]
    n, m = Xk.shape
    K = Yk.shape[0]
    if m == 0:
        return 0.0, np.zeros((K, n))
    nD = K * n  # D flattened row-major: D[k, i] at k * n + i
    # (D x_j)_k - t_j <= 0 for every j, k
    rows, cols, vals = [], [], []
    r = 0
    for j in range(m):
        for k in range(K):
            rows += [r] * (n + 1)
            cols += list(range(k * n, k * n + n)) + [nD + j]
            vals += list(Xk[:, j]) + [-1.0]
            r += 1
    # sum_j s_j t_j - sum_j y_j.(D x_j) <= 0:  coefficient of D[k, i] is -sum_j y_kj x_ij
    lin = -(Yk @ Xk.T).ravel()
    A = coo_matrix((vals, (rows, cols)), shape=(r, nD + m)).tocsr()
    from scipy.sparse import vstack

    A = vstack([A, np.concatenate([lin, sk])[None, :]]).tocsr()
    b = np.zeros(r + 1)
    # maximise sum_j s_j (K t_j - sum_k (D x_j)_k): coefficient of D[k, i] is -sum_j s_j x_ij
    obj_D = np.tile(-(Xk @ sk), K)
    c = -np.concatenate([obj_D, K * sk])
    bounds = [(-1.0, 1.0)] * nD + [(-float(n), float(n))] * m
    for method in ("highs-ds", "highs-ipm"):  # dual simplex; interior point if it fails
        res = linprog(c, A_ub=A, b_ub=b, bounds=bounds, method=method)
        if res.status == 0:
            break
    if res.status != 0:
        raise SolverError(WLast.kind, None, f"lp_{res.status}", f"separability LP: {res.message}")
    return float(-res.fun), res.x[:nD].reshape(K, n)


@functools.singledispatch
def by_proximal_point(block: Block) -> TypeGuard[WBlock]:
    """True for a block the oracle solves by proximal steps: a W-block with ``rho + gamma = 0``
    (not strictly convex). X-blocks are solved directly."""
    return False


@by_proximal_point.register
def _(block: WBlock):
    return block.rho + block.gamma == 0


@functools.singledispatch
def check_minimiser(block: Block) -> None:
    """Raise :class:`NoMinimiser` naming the block and the remedy when it has no minimiser
    (only a W_L block without ``rho``, ``gamma`` whose loss says it may lack one can:
    ``Loss.may_lack_minimiser``, cross-entropy; its ``recession_score`` decides)."""


@check_minimiser.register
def _(block: WLast):
    if block.rho + block.gamma > 0 or not block.loss.may_lack_minimiser:
        return
    score = recession_score(block.loss, block.Xt, block.Y)
    # score <= 2 K sum_j s_j (unit columns); |Y| keeps the threshold > 0 for any targets
    if score <= 1e-9 * (1.0 + float(np.sum(np.abs(np.asarray(block.Y, dtype=float))))):
        return
    raise NoMinimiser(
        block.kind,
        block.layer,
        "no_minimiser",
        f"{block.loss!r} recedes on X_L (cross-entropy: X_L is linearly "
        "separable): the loss decreases forever along a direction and the "
        "W-block has no minimiser; set rho > 0 or gamma > 0 for this layer",
    )


@functools.singledispatch
def recession_score(loss: Loss, Xt: ArrayLike, Y: ArrayLike) -> float:
    """A score > 0 iff the last W-block of ``loss`` without ``rho``, ``gamma`` has no minimiser,
    registered by the loss's type for each loss whose ``may_lack_minimiser`` holds (the others,
    MSE and Huber: bounded below and coercive in ``W X~``, are never scored)."""
    raise TypeError(
        f"{type(loss).__name__}.may_lack_minimiser holds, but no recession score is "
        "registered for it: register one with wellposed.recession_score.register"
    )


@recession_score.register
def _(loss: CrossEntropy, Xt, Y):
    return ce_separating_direction(Xt, Y)[0]


def curvature_scale(block: WBlock) -> float:
    """A scale of the block's Hessian: (lam or 1) * ||X~||_F^2 / rows of X~ (per unknown)."""
    Xt = np.asarray(block.Xt)
    lam = getattr(block, "lam", 1.0)
    return max(lam * float(np.sum(Xt * Xt)) / max(1, Xt.shape[0]), 1e-12)


def proximal_point(
    block: WBlock,
    start: ArrayLike,
    solve: Callable[[WBlock], BlockResult],
    tol: float,
    weight: float = PROX_WEIGHT,
    steps: int = PROX_STEPS,
) -> tuple[np.ndarray, float, int, int]:
    """Minimise the W-block ``block`` (``rho + gamma = 0``) by proximal steps from ``start``.

    ``solve(sub)`` solves a strongly convex block exactly and returns its ``BlockResult``; the
    steps stop at a residual ``<= tol``, after ``steps`` steps, or when a sub-solve fails (the
    caller then reports the residual it measured: it never relaxes ``tol``).
    Returns ``(W, residual, steps, iterations)``: the last iterate, the original block's KKT
    residual there, the number of proximal steps and the solver iterations they took.
    """
    scale = curvature_scale(block)
    c = weight * scale
    W = np.array(start, dtype=float, copy=True)
    residual, iters = float(block.kkt_residual(W)), 0
    k = 0
    while residual > tol and k < steps:
        try:
            res = solve(replace(block, gamma=c, W0=W))
        except SolverError:  # c too small for the solver: keep the last certified-or-not iterate
            break
        W, iters, k = res.argmin, iters + res.iterations, k + 1
        residual = float(block.kkt_residual(W))
        c = max(c * PROX_SHRINK, PROX_FLOOR * scale)
    return W, residual, k, iters
