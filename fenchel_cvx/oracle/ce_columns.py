"""The cross-entropy + ReLU last X-block by projected Newton, column by column (exact method).

With a ReLU in front of the softmax output layer, the block of X_L (the paper's Sec. 4.5.1,
eq. (16), the X_L sub-problem for a cross-entropy loss; docs/oracle.md, "Exact methods") is, per
data point j, with ``s_j = 1^T y_j`` and ``W_L = [W_x, b]``,

    min_{z >= 0}  s_j lse(W_x z + b) - y_j^T (W_x z + b) + lam (1/2 ||z||^2 - u_j^T z)  (+ const),

smooth and ``lam``-strongly convex on the box ``z >= 0``. Bertsekas' projected Newton method
(1982) solves every column at once: coordinates at the bound whose gradient pushes outward
(``z_i <= eps``, ``g_i > 0``, ``eps`` the column's own natural residual) take a gradient step
and are projected back to 0; the free ones take a Newton step with the Hessian
``lam I + W_F^T D W_F``, ``D = s_j (diag p_j - p_j p_j^T)`` (``K x K``, ``K`` classes), inverted by
the push-through identity ``(lam I + U D V)^{-1} = (I - U (lam I + D V U)^{-1} D V) / lam``: one
``K x K`` system per column. Each column backtracks along the projection arc with Armijo's
rule; near the optimum, where its value is flat to round-off (``exact.VALUE_NOISE``), a step
is judged by the column's natural residual. The columns go in chunks of ``CHUNK``, whose
``p x CHUNK`` temporaries stay in the cache, on the backend's threads (``column_threads.by_chunks``:
one a Dask worker, whose core waits meanwhile). The backend certifies the result by the block's
KKT residual and falls back to the CVXPY template.
"""

from dataclasses import replace

import numpy as np
from numpy.typing import ArrayLike

from ..blocks import XLast, natural_residual
from ..column_threads import by_chunks
from ..losses import softmax

NEWTON_STEPS = 50
ARMIJO = 1e-4
#: columns solved together (independent pieces: the chunks bound the temporaries' size)
CHUNK = 2048


def column_values(block: XLast, Z: np.ndarray) -> np.ndarray:
    """The block objective split by column (constants included, as in ``block.value``)."""
    loss = block.loss.column_values(block.Y, block.forward(Z))
    return loss + block.lam_in * np.sum(block.act_in.divergence(Z, block.U_prev), axis=0)


def _column_residual(block, Z):
    G = block.grad(Z)
    return np.max(np.abs(Z - np.maximum(Z - G, 0.0)), axis=0), G


def direction(block: XLast, Z: np.ndarray, G: np.ndarray, res: np.ndarray) -> np.ndarray:
    """The projected Newton direction of every column (see the module docstring)."""
    p, lam = Z.shape[0], block.lam_in
    Wx = block.dense_W()[:, :p]
    K = Wx.shape[0]
    P = softmax(block.forward(Z))
    s = block.Y.sum(axis=0)
    free = ~((Z <= np.minimum(1e-3, res)) & (G > 0))
    Gf = np.where(free, G, 0.0)
    WFW = np.einsum("ki,ij,li->jkl", Wx, free.astype(float), Wx, optimize=True)  # (m, K, K)
    Pt = P.T
    D = s[:, None, None] * (Pt[:, :, None] * np.eye(K) - Pt[:, :, None] * Pt[:, None, :])
    t = np.linalg.solve(lam * np.eye(K) + D @ WFW, D @ (Wx @ Gf).T[:, :, None])[:, :, 0]
    return np.where(free, -(Gf - Wx.T @ t.T) / lam, -G)


def search(
    block: XLast, Z: np.ndarray, D: np.ndarray, G: np.ndarray, res: np.ndarray, noise: float
) -> tuple[np.ndarray, np.ndarray]:
    """Per-column backtracking along ``max(Z + t D, 0)``; returns the new point and which
    columns moved."""
    f = column_values(block, Z)
    t = np.ones(Z.shape[1])
    todo = np.ones(Z.shape[1], dtype=bool)
    new = Z.copy()
    for _ in range(40):
        T = np.maximum(Z + t * D, 0.0)
        fT = column_values(block, T)
        armijo = (fT < f) & (fT <= f + ARMIJO * np.sum(G * (T - Z), axis=0))
        flat = fT <= f + noise * (1.0 + np.abs(f))
        if flat.any():
            flat &= _column_residual(block, T)[0] < res
        ok = todo & np.isfinite(fT) & (armijo | flat)
        new[:, ok] = T[:, ok]
        todo &= ~ok
        if not todo.any():
            break
        t = np.where(todo, 0.5 * t, t)
    return new, ~todo


def solve(
    block: XLast, Z: ArrayLike, target: float, noise: float, threads: int = 1
) -> tuple[np.ndarray, int]:
    """Projected Newton from ``Z`` until ``block.kkt_residual <= target``, ``CHUNK`` columns at
    a time on ``threads`` threads, each step on the columns still above it; returns
    ``(Z, steps)`` (the most any chunk took)."""
    Z = np.array(Z, dtype=float)

    def chunk(k: slice) -> int:
        part = replace(block, U_prev=block.U_prev[:, k], Y=block.Y[:, k])
        Z[:, k], steps = _solve_columns(part, Z[:, k], target, noise)
        return steps

    return Z, max(by_chunks(chunk, Z.shape[1], CHUNK, threads), default=0)


def _solve_columns(block, Z, target, noise):
    """``solve`` on one chunk: its columns' residuals on the chunk's own scale (at most the
    block's, so that every chunk at the target puts the block there)."""
    steps = 0
    while steps < NEWTON_STEPS:
        R, scale = natural_residual(block, Z)
        cols = np.flatnonzero(np.max(R, axis=0) > target * (1.0 + scale))
        if not cols.size:
            break
        sub = replace(block, U_prev=block.U_prev[:, cols], Y=block.Y[:, cols])
        res, G = _column_residual(sub, Z[:, cols])
        new, moved = search(sub, Z[:, cols], direction(sub, Z[:, cols], G, res), G, res, noise)
        Z[:, cols] = new
        steps += 1
        if not moved.any():
            break
    return Z, steps
