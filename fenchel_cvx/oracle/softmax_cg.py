"""The cross-entropy W_L block on many points: Newton directions by preconditioned CG.

The last W-block with a softmax cross-entropy loss (the paper's Sec. 4.5.2, eqs. (18) and (20);
docs/oracle.md, "Exact methods"),

    min_W  sum_j [s_j lse(W x~_j) - y_j^T W x~_j] + rho ||W||^2 + gamma ||W - W0||^2,

is smooth and strongly convex (``c = rho + gamma > 0``). ``exact.ce_direction`` forms its
Hessian (side ``K n``: ``(K n)^2 m`` flops, 3.7 TFLOP for MNIST's ``W_1`` on 60,000 points);
here the Newton direction ``-H^{-1} g`` comes from conjugate gradients on Hessian-vector
products instead,

    H V = (s * (P o U - P diag(P^T U))) X~^T + 2c V,   U = V X~,

two products of ``K x n x m`` (2 GFLOP on MNIST), preconditioned by the Gram matrix
``G = X~ diag(s / 2) X~^T + 2c I`` (``n x n``, the same for every class): since
``diag(p) - p p^T <= I / 2``, ``G`` majorises every class's curvature, so the preconditioned
spectrum lies in ``(0, 1]``. ``G`` does not depend on ``W``: it is formed and factored once per
solve. Each direction is solved to a relative residual ``min(0.1, ||g||)`` (an inexact Newton
method, superlinear near the optimum); the caller's line search and the block's recomputed KKT
residual decide, as for every exact method.

The CG steps run on one BLAS thread each: their products have ``K`` rows (10 on MNIST) and are
read from memory, and between them come the small solves of the preconditioner, so a second
thread of OpenBLAS wakes for every product and slows it (MNIST's ``W_1`` on 60,000 points, 481
CG steps on the 2-core VM: 23.2 s on one thread, 44.4 s on two). Several threads (``threads``:
the oracle's ``check_threads``) take the product on shares of the points instead, each
``U = V X~`` and its part of ``R X~^T`` on its own columns, the parts added in the shares'
order (``column_threads.over_columns``): each thread reads its share of ``X~`` alone (the
product of MNIST's ``W_1``: 38 ms on one thread, 19 ms on two shares).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from scipy.linalg import cho_factor, cho_solve

from ..column_threads import over_columns
from ..losses import softmax
from ..threads import one_blas_thread

if TYPE_CHECKING:
    from ..blocks import WLast

#: points above which the CE W_L block takes these steps (below: the Hessian is formed)
CG_MIN_POINTS = 4000
#: CG iterations per Newton direction, at most
CG_STEPS = 500


def applies(block: WLast) -> bool:
    """Whether the block has more than ``CG_MIN_POINTS`` points (and a dense ``X~``)."""
    return block.Xt.shape[1] > CG_MIN_POINTS


class SoftmaxCG:
    """The block's data for its Newton-CG directions: ``X~``, the column sums ``s`` of ``Y``, the
    curvature ``c`` and the factor of the preconditioner ``G``; the Hessian products on
    ``threads`` shares of the points."""

    def __init__(self, block: WLast, c: float, threads: int = 1) -> None:
        self.Xt, self.c, self.threads = block.Xt, c, threads
        self.s = block.Y.sum(axis=0)
        G = (self.Xt * (0.5 * self.s)) @ self.Xt.T
        G[np.diag_indices(G.shape[0])] += 2.0 * c
        self.factor = cho_factor(G, check_finite=False)

    def hessian_times(self, P: np.ndarray, V: np.ndarray) -> np.ndarray:
        """``H V`` at the softmax probabilities ``P`` (``K x m``)."""

        def summed(P, Xt, s, comm):  # the sum over the points (a share's: its part, reduced)
            U = V @ Xt
            R = s * (P * U - P * np.sum(P * U, axis=0))
            return comm.reduce([R @ Xt.T], "sum")[0]

        HV = over_columns(summed, P, self.Xt, self.s, threads=self.threads, chunk=None)
        return HV + 2.0 * self.c * V

    def precondition(self, R: np.ndarray) -> np.ndarray:
        """``R G^{-1}``: every class's row through the one factor."""
        return cho_solve(self.factor, R.T, check_finite=False).T

    def direction(self, W: np.ndarray, g: np.ndarray) -> tuple[np.ndarray, int]:
        """``-H^{-1} g`` at ``W`` by preconditioned CG to a relative residual
        ``min(0.1, ||g||)`` on one BLAS thread (the module doc); returns
        ``(D, CG iterations)``."""
        with one_blas_thread():
            return self._cg(W, g)

    def _cg(self, W, g):
        P = softmax(W @ self.Xt)
        D = np.zeros_like(g)
        R = -g
        Z = self.precondition(R)
        Pd, rz = Z, float(np.sum(R * Z))
        stop = min(0.1, float(np.linalg.norm(g))) * float(np.linalg.norm(g))
        for it in range(1, CG_STEPS + 1):
            HP = self.hessian_times(P, Pd)
            alpha = rz / float(np.sum(Pd * HP))
            D += alpha * Pd
            R -= alpha * HP
            if float(np.linalg.norm(R)) <= stop:
                return D, it
            Z = self.precondition(R)
            rz, old = float(np.sum(R * Z)), rz
            Pd = Z + (rz / old) * Pd
        return D, CG_STEPS


__all__ = ["SoftmaxCG", "CG_MIN_POINTS", "applies"]
