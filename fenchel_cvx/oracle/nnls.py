"""Nonnegative least squares with a shared Gram matrix, and the MSE + ReLU last X-block
(docs/mathematics.md, "The nonnegative least squares reduction").

``solve_gram(H, B)`` solves, for every column ``b`` of ``B`` and one symmetric positive definite
``H`` shared by all columns, the bound-constrained quadratic program (a linear complementarity
problem: ``x >= 0``, ``y = H x - b >= 0``, ``x . y = 0``)

    min_{x >= 0}  1/2 x^T H x - b^T x

by block principal pivoting (Judice & Pires 1994; Kim & Park 2011, "Fast nonnegative matrix
factorization: an active-set-like method and comparisons"): guess the passive set ``F``
(``x_F > 0``), solve ``H_FF x_F = b_F`` (``SharedGram``: a Cholesky factor of ``H_FF``, or of
the complement's block of ``H^{-1}`` when that is smaller), and exchange every index that violates
``x_F >= 0`` or ``y_G >= 0``; when the number of violations stops decreasing for three rounds,
exchange only the largest violating index (Murty's rule), which terminates finitely for a
positive definite ``H``. A column is exact once no index violates its sign (up to 64 machine
epsilons of its scale); the callers certify the result by the block's own KKT residual.

With squared error and a ReLU in front of the output layer, the block of X_L is, per data
point j (column), up to a constant

    min_{z >= 0}  ||y_j - W_x z - b||^2 + lam (1/2)||z - u_j||^2
               =  min_{z >= 0} || [W_x; sqrt(lam/2) I] z - [y_j - b; sqrt(lam/2) u_j] ||^2,

since lam B(z, u) = lam (z^2/2 + u_+^2/2 - u z) = (lam/2)||z - u||^2 + const on z >= 0: a
nonnegative least squares problem whose Gram matrix ``W_x^T W_x + lam/2 I`` is the same for
every column. ``solve_columns`` solves it by ``solve_gram``; a column the pivoting leaves
unsolved is handed to ``scipy.optimize.nnls`` (Lawson-Hanson active set, finite termination).
The tests cross-check both against the CVXPY form of the block. ``W_x = W[:, :p]``,
``b = W[:, p]``: the weights and bias of the output layer (``block.dense_W()``: a convolution's
explicit matrix).
"""

import functools
import math
from collections.abc import Sequence

import numpy as np
from numpy.typing import ArrayLike
from scipy.linalg import LinAlgError, cho_factor, cho_solve
from scipy.optimize import nnls as _nnls

from ..activations import ReLU
from ..blocks import Block, XLast
from ..losses import MSE

# Kim & Park's number of full exchanges allowed without fewer violations before Murty's rule
BACKUP_EXCHANGES = 3
# The shared Gram matrix pays off from this many unknowns per column: below it, the compiled
# scipy.optimize.nnls beats the pivoting's Python overhead (500 random columns, 10 outputs:
# p = 32: 0.17 s against 0.05 s CPU; p = 100: 0.23 s against 0.42 s; p = 300: 1.1 s against 5.3 s)
SHARED_MIN = 80


@functools.singledispatch
def applies(block: Block) -> bool:
    """True for the X_L block of a ReLU network with squared-error loss."""
    return False


@applies.register
def _(block: XLast):
    return (type(block.loss), type(block.act_in)) in PAIRS


#: the (loss, activation) types whose X_L block is this nonnegative least squares, registered
#: by type as the exact methods are (``exact.METHODS``)
PAIRS = {(MSE, ReLU)}


class SharedGram:
    """``H`` (symmetric positive definite, ``m x m``), shared by many columns, and its inverse.

    ``solve(b, F)`` gives ``x`` with ``H_FF x_F = b_F``, ``x = 0`` off ``F``, and
    ``y = H x - b`` (0 on ``F``) by the cheaper of two exact routes: the Cholesky factor of
    ``H_FF`` when ``|F| <= m / 2``, else, with ``P = H^{-1}`` (computed once) and ``G`` the
    complement of ``F``, the Schur complement ``H_FF^{-1} = P_FF - P_FG P_GG^{-1} P_GF``: a
    factor of ``P_GG``, of side ``m - |F|``. The second route loses digits to cancellation
    (``P`` is as ill-conditioned as ``H``), so every solve takes one step of iterative
    refinement on ``b_F - H_FF x_F``.

    >>> gram = SharedGram(np.array([[2.0, 1.0], [1.0, 2.0]]))
    >>> gram.solve(np.array([1.0, -1.0]), [True, False])  # x_F = H_FF^{-1} b_F, y = H x - b
    (array([0.5, 0. ]), array([0. , 1.5]))
    """

    def __init__(self, H: np.ndarray) -> None:
        self.H = H
        self._P: np.ndarray | None = None  # H^{-1}, formed on first use

    @property
    def P(self) -> np.ndarray:
        if self._P is None:
            self._P = cho_solve(
                cho_factor(self.H, check_finite=False), np.eye(self.H.shape[0]), check_finite=False
            )
        return self._P

    def solve(self, b: np.ndarray, F: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
        F = np.asarray(F, dtype=bool)
        idx = np.flatnonzero(F)
        x = np.zeros(b.shape[0])
        if idx.size:
            inverse = self._inverse(idx, F)
            x[idx] = inverse(b)
            r = np.where(F, b - self.H @ x, 0.0)  # one step of iterative refinement
            x[idx] += inverse(r)
        y = self.H @ x - b
        y[idx] = 0.0
        return x, y

    def _inverse(self, idx, F):
        """``b -> H_FF^{-1} b_F`` through the smaller factorisation (see the class docstring)."""
        if 2 * idx.size <= F.size:
            factor = cho_factor(self.H[np.ix_(idx, idx)], check_finite=False)
            return lambda b: cho_solve(factor, b[idx], check_finite=False)
        P, G = self.P, np.flatnonzero(~F)
        if not G.size:
            return lambda b: P @ b
        factor = cho_factor(P[np.ix_(G, G)], check_finite=False)
        PG = P[:, G]

        def inverse(b):
            u = P @ b
            return (u - PG @ cho_solve(factor, u[G], check_finite=False))[idx]

        return inverse


def pivot_column(
    gram: SharedGram, b: np.ndarray, F: ArrayLike, max_iter: int
) -> tuple[np.ndarray, np.ndarray, int, bool]:
    """Block principal pivoting for one column from the passive set ``F`` (boolean, copied).

    Returns ``(x, F, iterations, solved)``; ``solved`` is False when ``max_iter`` was reached.
    """
    F = np.array(F, dtype=bool)
    best, backup = F.size + 1, BACKUP_EXCHANGES
    tol_y = 64 * np.finfo(float).eps * max(1.0, float(np.max(np.abs(b), initial=0.0)))
    for it in range(1, max_iter + 1):
        x, y = gram.solve(b, F)
        tol_x = 64 * np.finfo(float).eps * max(1.0, float(np.max(np.abs(x), initial=0.0)))
        bad = np.where(F, x < -tol_x, y < -tol_y)
        n_bad = int(bad.sum())
        if n_bad == 0:
            return np.maximum(x, 0.0), F, it, True
        if n_bad < best:
            best, backup = n_bad, BACKUP_EXCHANGES
            F ^= bad
        elif backup > 0:
            backup -= 1
            F ^= bad
        else:  # Murty's rule: the largest violating index only
            j = np.flatnonzero(bad)[-1]
            F[j] = not F[j]
    return np.maximum(x, 0.0), F, max_iter, False


def solve_gram(
    gram: SharedGram,
    B: np.ndarray,
    passive: np.ndarray | None = None,
    max_iter: int | None = None,
) -> tuple[np.ndarray, int, list[int]]:
    """``argmin_{x >= 0} 1/2 x^T H x - b^T x`` for every column ``b`` of ``B`` (see the module
    docstring), ``gram`` a ``SharedGram`` of ``H``; ``passive`` (boolean, like ``B``) is the
    first guess of ``x > 0``, by default the sign of the unconstrained solution ``H^{-1} B``.

    Returns ``(X, iterations, unsolved)``: the solutions, the pivoting rounds summed over the
    columns, and the columns that reached ``max_iter`` (default ``5 m + 20``) or met a
    factorisation that failed (their ``X`` column holds the last iterate).

    >>> H = np.array([[2.0, 1.0], [1.0, 2.0]])
    >>> X, rounds, unsolved = solve_gram(SharedGram(H), np.array([[1.0, -1.0], [-1.0, 3.0]]))
    >>> X, unsolved  # each column's unconstrained solution has a negative entry
    (array([[0.5, 0. ],
           [0. , 1.5]]), [])
    """
    m, r = B.shape
    max_iter = 5 * m + 20 if max_iter is None else int(max_iter)
    if passive is None:
        passive = gram.P @ B > 0
    X = np.zeros((m, r))
    total, unsolved = 0, []
    for j in range(r):
        try:
            X[:, j], _, it, solved = pivot_column(gram, B[:, j], passive[:, j], max_iter)
        except LinAlgError:
            it, solved = 1, False
        total += it
        if not solved:
            unsolved.append(j)
    return X, total, unsolved


def solve_columns(
    W: np.ndarray, Y: np.ndarray, U: np.ndarray, lam: float, shared: bool = True
) -> np.ndarray:
    """argmin_{Z >= 0} ||Y - W [Z; 1]||^2 + lam (1/2) ||Z - U||^2, column by column (NumPy data).

    ``shared``: one Gram matrix for every column (``solve_gram``) when ``p >= SHARED_MIN``; a
    column it leaves unsolved, or every column otherwise, goes to ``scipy.optimize.nnls``, which
    raises ``RuntimeError`` if its active-set loop hits its iteration limit (the backend turns
    that into a ``SolverError``).
    """
    p = U.shape[0]
    s = math.sqrt(lam / 2.0)
    Wx, R = W[:, :p], Y - W[:, p : p + 1]
    Z = np.zeros(U.shape)
    unsolved: Sequence[int] = range(U.shape[1])
    if shared and p >= SHARED_MIN:
        H = Wx.T @ Wx + (lam / 2.0) * np.eye(p)
        Z, _, unsolved = solve_gram(SharedGram(H), Wx.T @ R + (lam / 2.0) * U)
    if unsolved:
        A = np.vstack([Wx, s * np.eye(p)])
        for j in unsolved:
            Z[:, j], _ = _nnls(A, np.concatenate([R[:, j], s * U[:, j]]), maxiter=50 * p)
    return Z


def solve_x_last(block: XLast, shared: bool = True) -> np.ndarray:
    """The argmin of the MSE + ReLU X-last block (``shared``: see ``solve_columns``)."""
    return solve_columns(block.dense_W(), block.Y, block.U_prev, block.lam_in, shared)
