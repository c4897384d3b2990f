"""The MSE + ReLU last-layer X-block as nonnegative least squares (docs/mathematics.md, "The nonnegative least squares reduction").

With squared error and a ReLU in front of the output layer, the block of X_L is, per data
point j (column), up to a constant

    min_{z >= 0}  ||y_j - W_x z - b||^2 + lam (1/2)||z - u_j||^2
               =  min_{z >= 0} || [W_x; sqrt(lam/2) I] z - [y_j - b; sqrt(lam/2) u_j] ||^2,

since lam B(z, u) = lam (z^2/2 + u_+^2/2 - u z) = (lam/2)||z - u||^2 + const on z >= 0. That is a
nonnegative least squares problem, solved exactly (active set, finite termination) by
``scipy.optimize.nnls``; the tests cross-check it against the CVXPY form of the block.
``W_x = W[:, :p]``, ``b = W[:, p]``: the weights and bias of the output layer (``block.dense_W()``:
a convolution's explicit matrix).
"""
import functools
import math

import numpy as np
from scipy.optimize import nnls as _nnls

from ..blocks import XLast


@functools.singledispatch
def applies(block):
    """True for the X_L block of a ReLU network with squared-error loss."""
    return False


@applies.register
def _(block: XLast):
    return block.loss.name == "mse" and block.act_in.name == "relu"


def solve_columns(W, Y, U, lam):
    """argmin_{Z >= 0} ||Y - W [Z; 1]||^2 + lam (1/2) ||Z - U||^2, column by column (NumPy data).

    ``scipy.optimize.nnls`` raises ``RuntimeError`` if its active-set loop hits its iteration
    limit (the backend turns that into a ``SolverError``).
    """
    p = U.shape[0]
    s = math.sqrt(lam / 2.0)
    A = np.vstack([W[:, :p], s * np.eye(p)])
    R = np.vstack([Y - W[:, p:p + 1], s * U])
    Z = np.empty(U.shape)
    for j in range(U.shape[1]):
        Z[:, j], _ = _nnls(A, R[:, j], maxiter=50 * p)
    return Z


def solve_x_last(block):
    """The argmin of the MSE + ReLU X-last block."""
    return solve_columns(block.dense_W(), block.Y, block.U_prev, block.lam_in)
