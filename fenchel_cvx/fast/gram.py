"""The Gram preconditioner of the W-blocks, in parameter space or in data space (Woodbury).

A W-block (the paper's Sec. 4.5.2 subproblems in W_l, eqs. (17)-(20)) is preconditioned by the
shared matrix

    G = w X~ X~^T + 2c I        (n x n, n the rows of X~; c = rho + gamma; w > 0),

``w = lam sup(phi')`` for a hidden block (it majorises every row's Hessian; ``wblocks``). Two
ways to apply ``s = g G^{-1}``:

- ``ParamGram`` (n <= m, the usual case): ``G^{-1}`` formed once (``spd_inverse``), one n x n
  product per step, or the Cholesky factor's two triangular solves (``spd_solver``) where the
  inverse does not pay (``inverse_pays``);
- ``DataGram`` (m < n: fewer points than inputs, as in a batch of 500 MNIST images against the
  785 rows of W_0's X~): by Woodbury, ``G^{-1} = (I - w X~ M^{-1} X~^T) / 2c`` with the m x m
  matrix ``M = 2c I + w K``, ``K = X~^T X~``. Forming and factorising K costs ``m^2 n + m^3/3``
  against ``n^2 m + n^3`` for G (785 x 500: about 3 ms against 25 ms on one core); ``M^{-1}``
  is formed, or applied by triangular solves, by the same rule as ``ParamGram``'s, where M is
  well conditioned for it.

With ``g = A X~^T + R`` (A the data-space gradient ``dL/dU``, R the regulariser's gradient) and
``P = R X~``, the data-space step needs one m x m solve and one product back to parameter space,
and gives ``s X~`` (the direction's image ``d X~``, which the line search needs) for free:

    B = (A - w P / 2c) M^{-1},     s = R / 2c + B X~^T,     s X~ = A / w - (2c / w) B

(from ``w K M^{-1} = I - 2c M^{-1}``). ``P = 2 rho U + 2 gamma (U - W0 X~)`` is itself in data
space, so no parameter-space gradient is needed to precondition it.
"""

from types import ModuleType

from ..arrays import Array, cheap_reads, in_blocks, matmul_nt
from ..reduce import LOCAL
from ._util import spd_inverse, spd_solver


def inverse_pays(n: int, rows: int) -> bool:
    """Whether ``rows`` rows in all (over the solves one n x n factor serves) pay for its
    inverse. It costs about n^3 more than the factor, and a product with it saves about p n^2
    (p rows) against two triangular solves, in time more than in FLOPs: a GEMM runs faster than
    a solve. Measured on one core, float32: n = 301, p = 10: factor + one solve 0.8 ms against
    inverse + one product 2.1 ms; n = 785, p = 300: 17 ms against 51 ms; n = 500, p = 300:
    potrf 0.8 ms, potri 2.5 ms more, a solve 2.6 ms against a product 1.4 ms."""
    return rows >= n


#: M^{-1} is formed only where eps times a bound of the condition number of ``M + shift I``,
#: ``(trace M + shift) / shift``, is at most this: a product with an explicit inverse is not
#: backward stable as triangular solves are, and its error grows with the condition number
#: (float32, 500 MNIST images as W_0's X~: the span identity ``sigma K = (lam / w) A - (c2 / w)
#: B`` held to 4e-5 with the inverse against 1e-6 with solves at cond 2e3, the benchmark's
#: setting, whose bound is 4.5e3, within this 8.4e3; at cond 9e5, 6e-3 against 1e-6)
INVERSE_COND_EPS = 1e-3


def well_conditioned(xp: ModuleType, M: Array, shift: float) -> bool:
    """Whether ``M + shift I`` (M symmetric positive semidefinite) may be inverted explicitly in
    its dtype (``INVERSE_COND_EPS``)."""
    bound = (float(xp.sum(xp.linalg.diagonal(M))) + shift) / shift
    return bound * float(xp.finfo(M.dtype).eps) <= INVERSE_COND_EPS


def _applier(xp, G, shift, inverse):
    """``(B -> B (G + s I)^{-1}, s, the inverse or None)``: the inverse formed (``spd_inverse``)
    and applied as one product, or the Cholesky factor's solves (``spd_solver``); s the shift
    used, grown from ``shift`` if the factorisation needed it."""
    if inverse:
        Ginv, shift = spd_inverse(xp, G, shift)
        return (lambda B: B @ Ginv), shift, Ginv
    apply, shift = spd_solver(xp, G, shift)
    return apply, shift, None


class ParamGram:
    """``s = g G^{-1}`` in parameter space; no data-space image of s.

    ``inverse=True``: ``G^{-1}`` formed once (``Ginv``), one product per step; False: the
    Cholesky factor only, two triangular solves per step (``inverse_pays`` chooses). ``comm``:
    the column shards of X~ (``reduce.py``), whose Gram matrices it sums.
    """

    data_space = False

    def __init__(self, xp, Xt, weights, shift, inverse=True, comm=LOCAL):
        scalar = isinstance(weights, float)
        if in_blocks(Xt, Xt):  # long, flat patches: in cache-sized blocks
            G = weights * matmul_nt(Xt, Xt) if scalar else matmul_nt(weights * Xt, Xt)
        else:
            G = weights * (Xt @ Xt.T) if scalar else (weights * Xt) @ Xt.T
        (G,) = comm.reduce([G], "sum")  # over the column shards of X~ (``reduce.py``)
        self.apply, self.shift, Ginv = _applier(xp, G, shift, inverse)
        if inverse:
            self.Ginv = Ginv


class DataGram:
    """Woodbury in data space (m < n), for a scalar weight ``w > 0`` and a shift ``2c > 0``;
    ``inverse``: ``M^{-1}`` formed (``Minv``; ``inverse_pays``) where M is well conditioned for
    it (``well_conditioned``), else applied by Cholesky solves (``Minv`` None)."""

    data_space = True

    def __init__(self, xp, Xt, w, shift, inverse=False):
        self.Xt, self.w = Xt, float(w)
        self._xt_norm2 = None
        self.K = Xt.T @ Xt  # m x m; also the Newton rows' kernel (wblocks)
        # c2: the shift actually used (grown if M would not factorise): G = w X~ X~^T + c2 I
        M = self.K if self.w == 1.0 else self.w * self.K
        # the choice is between an inverse and LAPACK's solves where those are at hand (NumPy);
        # elsewhere ``spd_solver`` applies an inverse too, and the test would only read back
        inverse = inverse and (not cheap_reads(xp) or well_conditioned(xp, M, float(shift)))
        self.solve, self.c2, self.Minv = _applier(xp, M, float(shift), inverse)

    def xt_norm2(self, xp: ModuleType) -> float:
        """``max_j |X~_j|_2^2`` over the rows of X~ (the data-space bounds of ``wblocks`` and
        ``span``: ``|a X~^T|_max <= max_i |a_i| max_j |X~_j|``), formed once per factor."""
        if self._xt_norm2 is None:
            self._xt_norm2 = float(xp.max(xp.sum(self.Xt * self.Xt, axis=1)))
        return self._xt_norm2

    @staticmethod
    def applies(Xt: Array, weights: float | Array | None, shift: float) -> bool:
        """Fewer points than rows of X~, a positive scalar weight and a positive shift."""
        return (
            Xt.shape[1] < Xt.shape[0] and isinstance(weights, float) and weights > 0 and shift > 0
        )

    def apply(self, g: Array) -> Array:
        """``g G^{-1}`` from g alone (three products; ``split`` needs one when A, R are known)."""
        B = self.solve(g @ self.Xt)
        return (g - self.w * (B @ self.Xt.T)) / self.c2

    def split(self, A: Array, R: Array, P: Array) -> tuple[Array, Array]:
        """``(s, s X~)`` for ``g = A X~^T + R``, ``P = R X~`` (see the module docstring)."""
        B = self.solve(A - (self.w / self.c2) * P)
        Aw = A if self.w == 1 else A / self.w
        return R / self.c2 + B @ self.Xt.T, Aw - (self.c2 / self.w) * B
