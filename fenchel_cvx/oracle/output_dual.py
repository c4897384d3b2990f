"""The MSE + ReLU last X-block through its dual in the output dimension (exact method).

With squared error and a ReLU in front of the output layer, the X_L block (the paper's
Sec. 4.5.1, eq. (15) and its nonnegative least squares form; docs/oracle.md, "Exact methods")
is, per data point j (column), with ``W_L = [W_x, b]`` (``K`` outputs, ``p`` units) and
``lam B(z, u) = lam/2 ||z - u||^2 + const`` on ``z >= 0``,

    min_{z >= 0}  ||W_x z + b - y_j||^2 + lam/2 ||z - u_j||^2 .

Name the output residual ``e = W_x z + b - y_j`` and give the constraint ``e = ...`` the
multiplier ``2 r`` (``r`` in R^K). Minimising the Lagrangian over ``e`` gives ``e = r``; over
``z >= 0``, with ``v(r) = u_j - (2/lam) W_x^T r``, it gives ``z(r) = v(r)_+``. The dual function
is ``-2 D(r) + lam/2 ||u_j||^2`` with

    D(r) = 1/2 ||r||^2 + (y_j - b)^T r + lam/4 ||v(r)_+||^2 ,

strongly convex and piecewise quadratic in ``K`` unknowns (10 on MNIST, against ``p`` = 300 for
the primal), ``grad D(r) = r - (W_x z(r) + b - y_j)`` and the generalised Hessian
``I + (2/lam) W_A W_A^T``, ``A = {i : v_i(r) > 0}`` (positive definite for any ``A``: no
degenerate case). Strong duality holds (a convex quadratic program with linear constraints),
so ``z(r*)`` is the block's unique minimiser, and the primal value at ``z(r)`` minus the dual
value at ``r`` is a duality gap.

Semismooth Newton solves every column at once: the ``m`` Hessians ``K x K`` by one product
(the indicator of ``A`` against the outer products ``w_i w_i^T`` of the columns of ``W_x``),
``m`` small solves, and an Armijo backtracking per column on ``D``. Finite termination: a
column is done when a full step leaves its active set unchanged (``grad D`` is affine on that
piece, so the step lands on its zero), or when its gradient is at round-off. The columns go in
chunks of ``CHUNK``, whose ``p x CHUNK`` temporaries stay in the cache (a block of the shape of
MNIST's X_1, 300 x 60,000 with random data, on one core: 2.0-2.3 s against 4.6-5.1 s for the
columns at once), on the backend's threads (``column_threads.by_chunks``; MNIST's X_1 on the
2-core VM: 1.4-1.6 s on one, 0.9-1.0 s on two). The start is the
feed-forward point ``z = u_+`` (or ``start``), ``r = W_x z + b - y``. The caller (``exact.py``)
certifies ``z(r)`` by the block's own recomputed KKT residual, and falls back to the nonnegative
least squares of ``nnls.py`` when it does not hold.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ..column_threads import by_chunks

if TYPE_CHECKING:
    from ..blocks import XLast

NEWTON_STEPS = 50
ARMIJO = 1e-4
# a column whose dual gradient is below this many machine epsilons of its scale is done
ROUNDOFF = 16
#: columns solved together (independent: the chunks only bound the temporaries' size)
CHUNK = 2048


def _dual_values(R, Z, C, lam):
    """``D(r)`` per column (``C = Y - b``, ``Z = z(R)``)."""
    return 0.5 * np.sum(R * R, axis=0) + np.sum(C * R, axis=0) + 0.25 * lam * np.sum(Z * Z, axis=0)


def duality_gap(
    Wx: np.ndarray,
    b: np.ndarray,
    Y: np.ndarray,
    U: np.ndarray,
    lam: float,
    R: np.ndarray,
    threads: int = 1,
) -> float:
    """Primal value at ``z(R)`` minus the dual value at ``R``, summed over the columns (>= 0),
    ``CHUNK`` columns at a time on ``threads`` threads (added in the chunks' order)."""

    def chunk(k: slice) -> float:
        Uk, Rk = U[:, k], R[:, k]
        Z = np.maximum(Uk - (2.0 / lam) * (Wx.T @ Rk), 0.0)
        C = Y[:, k] - b[:, None]
        E = Wx @ Z - C
        primal = np.sum(E * E) + 0.5 * lam * np.sum((Z - Uk) ** 2)
        dual = -2.0 * float(np.sum(_dual_values(Rk, Z, C, lam))) + 0.5 * lam * np.sum(Uk * Uk)
        return float(primal - dual)

    return sum(by_chunks(chunk, U.shape[1], CHUNK, threads), 0.0)


def solve(
    Wx: np.ndarray,
    b: np.ndarray,
    Y: np.ndarray,
    U: np.ndarray,
    lam: float,
    Z0: np.ndarray | None = None,
    max_steps: int | None = None,
    threads: int = 1,
) -> tuple[np.ndarray, np.ndarray, int, int]:
    """``argmin_{Z >= 0} ||W_x Z + b 1^T - Y||^2 + lam/2 ||Z - U||^2`` by the dual (see the
    module docstring), the chunks of columns on ``threads`` threads (one BLAS thread each).
    Returns ``(Z, R, steps, unsolved)``: the minimiser ``z(R)``, the dual point, the Newton
    steps taken and the number of columns not done after ``max_steps``."""
    Z, R = np.empty_like(U), np.empty((Wx.shape[0], U.shape[1]))

    def chunk(k: slice) -> tuple[int, int]:
        start = None if Z0 is None else Z0[:, k]
        Z[:, k], R[:, k], s, u = _solve_columns(Wx, b, Y[:, k], U[:, k], lam, start, max_steps)
        return s, u

    done = by_chunks(chunk, U.shape[1], CHUNK, threads)
    return Z, R, max((s for s, _ in done), default=0), sum(u for _, u in done)


def _solve_columns(Wx, b, Y, U, lam, Z0, max_steps):
    """``solve`` on one chunk of columns, every column at once."""
    K, p = Wx.shape
    max_steps = NEWTON_STEPS if max_steps is None else int(max_steps)
    s = 2.0 / lam
    C = Y - b[:, None]
    R = Wx @ (np.maximum(U, 0.0) if Z0 is None else np.maximum(Z0, 0.0)) - C
    outer = (Wx.T[:, :, None] * Wx.T[:, None, :]).reshape(p, K * K)  # w_i w_i^T by unit
    eye = np.eye(K)
    todo = np.arange(U.shape[1])
    steps = 0
    while todo.size and steps < max_steps:
        Ra, Ca = R[:, todo], C[:, todo]
        V = U[:, todo] - s * (Wx.T @ Ra)
        Za = np.maximum(V, 0.0)
        WZ = Wx @ Za
        G = Ra - WZ + Ca
        scale = 1.0 + np.maximum(np.max(np.abs(Ra), axis=0), np.max(np.abs(WZ - Ca), axis=0))
        small = np.max(np.abs(G), axis=0) <= ROUNDOFF * np.finfo(float).eps * scale
        A = V > 0
        H = eye + s * (A.T.astype(float) @ outer).reshape(-1, K, K)
        D = -np.linalg.solve(H, G.T[:, :, None])[:, :, 0].T
        WD = s * (Wx.T @ D)
        f0, slope = _dual_values(Ra, Za, Ca, lam), np.sum(G * D, axis=0)
        noise = 1e-14 * (1.0 + np.abs(f0))
        t = np.ones(todo.size)
        for _ in range(40):  # Armijo per column; the full step nearly always holds
            Vt = V - t * WD
            ft = _dual_values(Ra + t * D, np.maximum(Vt, 0.0), Ca, lam)
            bad = ft > f0 + ARMIJO * t * slope + noise
            if not bad.any():
                break
            t = np.where(bad, 0.5 * t, t)
        R[:, todo] = np.where(small, Ra, Ra + t * D)
        same = np.all((V - t * WD > 0) == A, axis=0) & (t == 1.0)
        steps += 1
        todo = todo[~(small | same)]
    Z = np.maximum(U - s * (Wx.T @ R), 0.0)
    return Z, R, steps, int(todo.size)


def solve_x_last(
    block: XLast,
    start: np.ndarray | None = None,
    max_steps: int | None = None,
    threads: int = 1,
) -> tuple[np.ndarray, np.ndarray, int, int]:
    """The MSE + ReLU X_L block's minimiser by ``solve``: ``(Z, R, steps, unsolved)``."""
    W = block.dense_W()
    p = block.U_prev.shape[0]
    U = block.U_prev
    return solve(W[:, :p], W[:, p], block.Y, U, block.lam_in, start, max_steps, threads)
