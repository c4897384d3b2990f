"""Newton polish: projected Newton-CG steps on a block, after the conic solver (optional).

Interior-point solvers stop on a duality gap; for a strongly convex block a gap eps only bounds
the distance to the argmin by ~sqrt(eps), and Clarabel's exponential cones stall near gap 1e-10
(measured: block KKT residuals up to ~1e-4 with status ``optimal``; tighter tolerances return
``optimal_inaccurate``). Starting from the solver's point, a few Newton steps on the block's own
objective (``blocks.py``: value and exact gradient; the Hessian-vector products below) drive the
scaled KKT residual to ~1e-12. The polish never replaces the solver: it runs only after an
``optimal`` status, moves a piece (a column of an X-block, a row of a W-block, the whole CE
W-block) only where that lowers the piece's objective (or keeps it within round-off while
lowering its residual), and the backend reports both residuals (``info["solver_residual"]``,
``info["polish_steps"]``).

Hessian-vector products (the activation's ``d2F(v) = 1/phi'(phi^{-1}(v))`` and
``d2Fstar(u) = phi'(u)``, the loss's ``hvp`` and ``hess_diag``):

    x_hidden  lam_in F_in''(Z) o D + lam_out W_x^T (phi_out'(U) o W_x D)
    x_last    lam_in F_in''(Z) o D + W_x^T H_loss[W_x D]      (mse: 2 I; ce: s (diag pi - pi pi^T))
    w_hidden  lam (phi'(W X~) o D X~) X~^T + 2 (rho + gamma) D
    w_last    H_loss[D X~] X~^T + 2 (rho + gamma) D

Bounds (the activation's range, X-blocks only) are handled as in Bertsekas' projected Newton:
coordinates within eps of a bound whose gradient pushes outward take a projected gradient step
(they land on the bound), the others a Newton-CG step. The Hessian, the piece values and the
bounds are registered per block class (``functools.singledispatch``); the pieces are the block's
own (``block.piece_axis``, ``block.restrict``). The polish is :func:`init` and :func:`step` on
an explicit problem (``PolishProblem``) and state (``PolishState``), as the fast solvers are.
"""

import functools
import math
from typing import Any, NamedTuple

import numpy as np
from numpy.typing import ArrayLike

from ..blocks import Block, WHidden, WLast, XBlock, XHidden, XLast, natural_residual
from ..network import augment


def _sum_axis(block):
    """The axis summed to get one value per piece: the other axis of the variable (None: the
    whole block is one piece)."""
    return None if block.piece_axis is None else 1 - block.piece_axis


@functools.singledispatch
def _operator(block, Z):
    """(hvp, diag): the Hessian-vector product at Z and the Hessian's diagonal (the CG
    preconditioner); one per block class, registered below."""
    raise TypeError(f"no Newton polish is registered for {type(block).__name__}")


def _x_curvature(block, Z):
    """An X-block's ``W_x``, the diagonal ``lam_in F_in''(Z)`` and ``U = W [Z; 1]``."""
    W = block.dense_W()
    return W[:, : Z.shape[0]], block.lam_in * block.act_in.d2F(Z), W @ augment(Z)


@_operator.register
def _(block: XHidden, Z):
    Wx, d_in, U = _x_curvature(block, Z)
    d_out = block.lam_out * block.act_out.d2Fstar(U)
    return (lambda D: d_in * D + Wx.T @ (d_out * (Wx @ D))), d_in + (Wx * Wx).T @ d_out


@_operator.register
def _(block: XLast, Z):
    Wx, d_in, U = _x_curvature(block, Z)
    loss, Y = block.loss, block.Y
    diag = d_in + (Wx * Wx).T @ loss.hess_diag(Y, U)
    return (lambda D: d_in * D + Wx.T @ loss.hvp(Y, U, Wx @ D)), diag


@_operator.register
def _(block: WHidden, Z):
    Xt, c2 = block.Xt, 2.0 * (block.rho + block.gamma)
    d = block.lam * block.act.d2Fstar(Z @ Xt)
    return (lambda D: (d * (D @ Xt)) @ Xt.T + c2 * D), d @ (Xt * Xt).T + c2


@_operator.register
def _(block: WLast, Z):
    Xt, c2 = block.Xt, 2.0 * (block.rho + block.gamma)
    S, loss, Y = Z @ Xt, block.loss, block.Y
    diag = loss.hess_diag(Y, S) @ (Xt * Xt).T + c2
    return (lambda D: loss.hvp(Y, S, D @ Xt) @ Xt.T + c2 * D), diag


def _dot(A, B, axis):
    return np.sum(A * B, axis=axis, keepdims=axis is not None)


def _cg(hvp, diag, b, mask, axis, rtol, maxiter):
    """Batched Jacobi-preconditioned conjugate gradients for H x = b on the free coordinates,
    one system per piece."""
    x = np.zeros_like(b)
    minv = mask / np.where(diag > 0, diag, 1.0)
    r = b * mask
    z = minv * r
    p = z.copy()
    rz = _dot(r, z, axis)
    stop = np.sqrt(_dot(r, r, axis)) * rtol
    for _ in range(maxiter):
        Hp = hvp(p) * mask
        pHp = _dot(p, Hp, axis)
        ok = pHp > 0
        alpha = np.where(ok, rz / np.where(ok, pHp, 1.0), 0.0)
        x += alpha * p
        r -= alpha * Hp
        if np.all((np.sqrt(_dot(r, r, axis)) <= stop) | ~ok):
            break
        z = minv * r
        rz_new = _dot(r, z, axis)
        beta = np.where(rz > 0, rz_new / np.where(rz > 0, rz, 1.0), 0.0)
        p = z + beta * p
        rz = rz_new
    return x


@functools.singledispatch
def piece_values(block: Block, Z: np.ndarray, axis: int | None) -> np.ndarray | float:
    """The block objective split by piece (summed along ``axis``; a scalar for ``None``)."""
    raise TypeError(f"no piece values are registered for {type(block).__name__}")


def _summer(axis):
    return lambda A: np.sum(A, axis=axis, keepdims=axis is not None)


def _x_in_term(block, Z, s):
    return block.lam_in * s(block.act_in.divergence(Z, block.U_prev))


def _w_reg_term(block, Z, s):
    return block.rho * s(Z * Z) + (block.gamma * s((Z - block.W0) ** 2) if block.gamma else 0.0)


@piece_values.register
def _(block: XHidden, Z, axis):
    s = _summer(axis)
    U = block.forward(Z)
    return _x_in_term(block, Z, s) + block.lam_out * s(block.act_out.divergence(block.V_next, U))


@piece_values.register
def _(block: XLast, Z, axis):
    s = _summer(axis)
    U = block.forward(Z)
    return _x_in_term(block, Z, s) + block.loss.piece_values(block.Y, U, axis)


@piece_values.register
def _(block: WHidden, Z, axis):
    s = _summer(axis)
    return _w_reg_term(block, Z, s) + block.lam * s(block.act.divergence(block.V, Z @ block.Xt))


@piece_values.register
def _(block: WLast, Z, axis):
    s = _summer(axis)
    reg, S = _w_reg_term(block, Z, s), Z @ block.Xt
    return reg + block.loss.piece_values(block.Y, S, axis)


def _piece_residual(block, Z, axis):
    g = block.grad(Z)
    R = np.abs(Z - block.project(Z - g))
    return np.max(R, axis=axis, keepdims=axis is not None) if R.size else np.zeros(()), g


@functools.singledispatch
def _bounds(block):
    """The box of the block's domain and whether it is open (W-blocks: unconstrained)."""
    return (-math.inf, math.inf), False


@_bounds.register
def _(block: XBlock):
    return block.act_in.v_range, block.act_in.open_range


def _newton_step(block, Z, cg_rtol, cg_maxiter):
    """One projected Newton-CG step with per-piece backtracking; returns the new point."""
    (lo, hi), open_domain = _bounds(block)
    hvp, diag = _operator(block, Z)
    axis = _sum_axis(block)
    res, g = _piece_residual(block, Z, axis)
    eps = np.minimum(1e-8, res)
    binding = ((Z <= lo + eps) & (g > 0)) | ((Z >= hi - eps) & (g < 0))
    free = (~binding).astype(float)
    # Newton on the free coordinates, a gradient step (then the projection) on the binding ones:
    # a coordinate a hair above its bound with an outward gradient lands on the bound.
    D = _cg(hvp, diag, -g, free, axis, cg_rtol, cg_maxiter) - g * (1.0 - free)
    f0 = piece_values(block, Z, axis)
    t = np.ones_like(f0, dtype=float)
    todo = np.ones_like(f0, dtype=bool)
    best = Z.copy()
    for _ in range(30):
        trial = Z + t * D
        if open_domain:  # stay strictly inside: halve the distance to a bound instead of crossing
            if math.isfinite(lo):
                trial = np.where(trial <= lo, lo + 0.5 * (Z - lo), trial)
            if math.isfinite(hi):
                trial = np.where(trial >= hi, hi - 0.5 * (hi - Z), trial)
        else:
            trial = block.project(trial)
        f1 = piece_values(block, trial, axis)
        r1, _ = _piece_residual(block, trial, axis)
        slack = 1e-13 * (1.0 + np.abs(f0))
        ok = todo & np.isfinite(f1) & ((f1 < f0) | ((f1 <= f0 + slack) & (r1 < res)))
        best = np.where(ok, trial, best)
        todo &= ~ok
        if not todo.any():
            break
        t = np.where(todo, 0.5 * t, t)
    return best


class PolishProblem(NamedTuple):
    """One polish, all that stays fixed through it: the block, the target ``tol`` of its KKT
    residual, the step cap, the inner CG's relative tolerance and iteration cap, and the axis
    summed to get one value per piece (``_sum_axis``)."""

    block: Any
    tol: float
    max_steps: int
    cg_rtol: float
    cg_maxiter: int
    axis: Any


class PolishState(NamedTuple):
    """The point ``Z`` after ``steps`` Newton steps; ``end`` None (go on), ``"converged"`` (the
    block's KKT residual at ``tol``) or ``"stalled"`` (a step that moved no piece)."""

    Z: Any
    steps: int
    end: Any


def init(p: PolishProblem, Z: ArrayLike) -> PolishState:
    """The state at the solver's point ``Z`` (a float64 copy)."""
    return PolishState(np.array(Z, dtype=float), 0, None)


def step(p: PolishProblem, s: PolishState) -> PolishState:
    """One projected Newton-CG step on the pieces (columns, rows) whose own residual is above
    ``tol`` on the block's scale (every piece where the block is one, or a gradient infinite);
    ``end`` where the residual is at ``tol`` already or the step moves nothing."""
    block, Z, axis = p.block, s.Z, p.axis
    R, scale = natural_residual(block, Z)
    bound = p.tol * (1.0 + scale)
    if not R.size or (math.isfinite(bound) and R.max() <= bound):
        return s._replace(end="converged")
    if axis is None or not math.isfinite(bound):  # an infinite gradient: every piece
        new = _newton_step(block, Z, p.cg_rtol, p.cg_maxiter)
        moved, Z = not np.array_equal(new, Z), new
    else:
        idx = np.flatnonzero(R.max(axis=axis) > bound)
        old = Z[:, idx] if axis == 0 else Z[idx]
        new = _newton_step(block.restrict(idx), old, p.cg_rtol, p.cg_maxiter)
        moved = not np.array_equal(new, old)
        if axis == 0:
            Z[:, idx] = new
        else:
            Z[idx] = new
    if not moved:
        return s._replace(Z=Z, end="stalled")
    return s._replace(Z=Z, steps=s.steps + 1)


def polish(
    block: Block,
    Z: ArrayLike,
    tol: float,
    max_steps: int = 30,
    cg_rtol: float = 1e-3,
    cg_maxiter: int = 100,
) -> tuple[np.ndarray, int]:
    """Projected Newton-CG from ``Z`` until ``block.kkt_residual <= tol``; returns ``(Z, steps)``:
    :func:`init`, then :func:`step` until the state ends or ``max_steps`` steps are taken.

    Each step works only on the pieces (columns, rows) whose own residual is above ``tol`` on the
    block's scale, so a block where the solver missed a few pieces costs a few pieces.
    """
    p = PolishProblem(block, tol, max_steps, cg_rtol, cg_maxiter, _sum_axis(block))
    s = init(p, Z)
    while s.end is None and s.steps < max_steps:
        s = step(p, s)
    return s.Z, s.steps
