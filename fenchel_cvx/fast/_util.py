"""Small array-API helpers shared by the fast solvers (standard functions, one NumPy shortcut).

- ``started``: a block with where its solve starts beside its data: the start's image and
  whether the caller takes the argmin's image back (``FastBackend.solve``'s ``image`` and
  ``return_image``), as fields of a subclass of the block's class that only the fast solvers
  see (the package's blocks carry their data alone);
- ``kkt``: the scaled natural residual of ``blocks.kkt_residual``, from gradient parts already
  at hand (same formula, no extra matrix product); ``proves_above``: a lower bound of it from a
  preconditioned gradient, with no product at all;
- ``spd_inverse``: the inverse of a symmetric positive definite matrix through its Cholesky
  factor, ``G^{-1} = L^{-T} L^{-1}`` (positive semidefinite by construction, also in float32),
  with a diagonal shift added until the factorisation succeeds (NumPy arrays go straight to
  LAPACK's ``potrf`` / ``potri``, which the array API standard does not expose; PyTorch tensors
  to ``cholesky_ex`` and ``solve_triangular``, which check nothing on the host);
- ``spd_solver``: ``B -> B G^{-1}`` for the same matrices without forming the inverse where
  LAPACK is at hand (NumPy: ``potrf`` once, ``potrs`` per call), the same shift rule;
- ``top_eig``: a power-iteration estimate of ``||A||_2^2``;
- ``newton_1d``: a batched, bracketed Newton method for the exact line searches, an iteration
  at a time (``newton_step``);
- ``select``: a choice between two tuples of arrays on a 0-d condition, without a host read
  where reads are not cheap;
- ``keep_descent``: the descent guard of a WHidden solve (eq. (19)) whose line searches saw
  its image through the data-space identity, row by row, at the true image ``W X~``.
"""

import dataclasses
import functools
import math
from typing import Any

import numpy as np
from array_api_compat import array_namespace, device, is_torch_array

from ..arrays import cheap_reads, clip, vecdot
from ..blocks import residual_maxima, scaled_residual

# the CG W-loops (``wblocks``, ``span``) form W X~ again from W every ``RESYNC`` steps, so that
# the incrementally updated one does not drift (the driver's bound on a carried one, too)
from ..pre_activations import RESYNC  # noqa: F401
from ..reduce import LOCAL
from .fused import EAGER

#: the CG step from which hidden W rows may take semismooth-Newton steps (early steps change
#: the active sets too much); capped solves of at most this many steps stay in ``span`` and read
#: nothing back (``whole``)
NEWTON_START = 10


@functools.cache
def _started_class(cls: type) -> type:
    """``cls`` with the fields ``U`` (the start's image, None where the caller has none) and
    ``return_U`` (the caller takes the argmin's image back)."""
    return dataclasses.make_dataclass(
        "Started" + cls.__name__,
        [("U", Any, dataclasses.field(default=None)), ("return_U", bool, False)],
        bases=(cls,),
    )


def started(block, U=None, return_U=False):
    """``block`` with the start's image ``U`` and ``return_U`` (``_started_class``)."""
    if hasattr(block, "return_U"):
        return dataclasses.replace(block, U=U, return_U=return_U)
    fields = {f.name: getattr(block, f.name) for f in dataclasses.fields(block) if f.init}
    cls = _started_class(type(block))  # type: ignore[arg-type]  # a class is hashable
    return cls(**fields, U=U, return_U=return_U)


def part(block, **changes):
    """``block`` with ``changes`` (a part of it: some rows), without the start's image of the
    whole block where it has one (``started``)."""
    image = {"U": None} if hasattr(block, "return_U") else {}
    return dataclasses.replace(block, **changes, **image)


def block_arrays(block):
    """The block's array fields, by name (a dataclass of ``fenchel_cvx.blocks``)."""
    return {
        f.name: getattr(block, f.name)
        for f in dataclasses.fields(block)
        if hasattr(getattr(block, f.name), "shape") and hasattr(getattr(block, f.name), "dtype")
    }


def kkt(Z, parts, project=None, comm=LOCAL):
    """``||Z - P(Z - g)||_inf / (1 + max_i ||g_i||_inf)`` with ``g = sum(parts)``
    (``blocks.residual_parts``; ``blocks.kkt_residual`` forms the parts itself), its maxima over
    the block's shards (``comm``: ``reduce``)."""
    return scaled_residual(comm.reduce(residual_maxima(Z, parts, project), "max"))[0]


def most(xp, A):
    """``max(A)``, and 0 where A is empty (a row shard whose rows are all frozen, or that holds
    none): a 0-d array of A's dtype on A's device either way, so that every shard reduces the
    same figures the same way (``TorchComm``'s device path takes tensors alone)."""
    return xp.max(A) if math.prod(A.shape) else xp.zeros((), dtype=A.dtype, device=device(A))


def proves_above(xp, gs, c2, per, scale, tol):
    """Whether ``max|g| / (1 + scale) > tol`` follows from a Gram preconditioner ``G >= c2 I``:
    ``|g_i|_2^2 >= c2 g_i G^{-1} g_i^T = c2 gs_i`` gives ``max|g| >= sqrt(c2 max_i gs_i / per)``
    (``per`` entries in each ``g_i``; ``scale`` an upper bound of the residual's scale). Half the
    bound must pass: rounding in gs can then not prove a residual that is not there."""
    low = math.sqrt(c2 * max(float(xp.max(gs)), 0.0) / per)
    return 0.5 * low / (1.0 + scale) > tol


def pr_plus(xp, gs, cross, gs_old, g_d, zero=None):
    """Nonlinear CG's PR+ coefficient, row by row (or one scalar), with its restarts.

    ``beta = max(0, (gs - cross) / gs_old)``: Polak-Ribiere on the preconditioned gradient
    ``s = g G^{-1}``, with ``gs = <g, s>`` and ``cross = <g, s_old>``; 0 where ``gs_old`` is 0 or
    ``zero`` holds. It is 0 too where the new direction ``-s + beta d`` would not descend: its
    slope ``<g, -s + beta d> = beta g_d - gs`` (``g_d = <g, d>``) is >= 0; such a row restarts
    at ``-s``. -> ``(beta, restarted, slope)``, the new direction's slope with no product.
    """
    pos = gs_old > 0
    beta = xp.where(
        pos, (gs - cross) / xp.where(pos, gs_old, xp.ones_like(gs_old)), xp.zeros_like(gs_old)
    )
    beta = clip(beta, 0, None)
    if zero is not None:
        beta = xp.where(zero, xp.zeros_like(beta), beta)
    slope = beta * g_d - gs
    uphill = slope >= 0
    return xp.where(uphill, xp.zeros_like(beta), beta), uphill, xp.where(uphill, -gs, slope)


def floor_tol(xp, dtype, tol):
    """The tolerance a loop can reach in ``dtype``: ``max(tol, 64 eps)`` (4e-13 / 8e-6)."""
    return max(float(tol), 64 * float(xp.finfo(dtype).eps))  # a Python float, not a NumPy scalar


def spd_inverse(xp, G, shift=0.0):
    """``(G + shift I)^{-1}`` for symmetric positive (semi)definite G, through Cholesky.

    If the factorisation fails or is not finite (G singular to working precision), the shift
    grows from ``n eps max(diag G)`` by factors of 10. Returns ``(inverse, shift used)``.
    """
    return _shifted(xp, G, shift, _inverse_of(G))


def spd_solver(xp, G, shift=0.0):
    """``(solve, shift used)`` with ``solve(B) = B (G + shift I)^{-1}`` (B: rows of length n).

    NumPy: one Cholesky factorisation, then two triangular solves per call (LAPACK ``potrs``:
    no inverse, no ``potri``); other libraries: the inverse of ``spd_inverse``, applied as one
    product. The shift grows as in ``spd_inverse`` until the factorisation succeeds.
    """
    if type(G) is not np.ndarray:
        Ginv, shift = _shifted(xp, G, shift, _inverse_of(G))
        return (lambda B: B @ Ginv), shift
    from scipy.linalg import lapack

    L, shift = _shifted(xp, G, shift, _lapack_cholesky)
    potrs = lapack.get_lapack_funcs("potrs", (L,))

    def solve(B):  # G is symmetric: B G^{-1} = (G^{-1} B^T)^T; B^T of a C-ordered B is F-ordered
        X, info = potrs(L, B.T, lower=True)
        if info != 0:
            raise FloatingPointError(f"potrs failed (info {info})")
        return X.T

    return solve, shift


def _shifted(xp, G, shift, attempt):
    """``(attempt(G + s I), s)`` for the first shift s (from ``shift``) whose result is finite.

    Where reads are not cheap (``arrays.cheap_reads``: a GPU) and ``shift > 0``, G (positive
    semidefinite) + shift I is positive definite and factorises: its result is taken unread.
    Should rounding break that, it is not finite, and so is the block's argmin, which the
    certificate's argmin check then fails by name."""
    n = G.shape[0]
    if n == 0:
        return xp.zeros((0, 0), dtype=G.dtype, device=device(G)), float(shift)
    eye = xp.eye(n, dtype=G.dtype, device=device(G))
    shift, floor = max(float(shift), 0.0), None
    if shift > 0 and not cheap_reads(xp):
        out = attempt(xp, G + shift * eye, eye)
        if out is not None:  # (a library that raises on a matrix that is not PD has read)
            return out, shift
    for _ in range(40):
        out = attempt(xp, G + shift * eye, eye)
        if out is not None and bool(xp.all(xp.isfinite(out))):  # one read where it succeeds
            return out, shift
        if floor is None:
            dmax = float(xp.max(xp.abs(xp.linalg.diagonal(G))))
            floor = n * xp.finfo(G.dtype).eps * max(dmax, 1e-300)
        shift = max(10 * shift, floor)
    raise FloatingPointError("could not factorise the preconditioner: not finite")


def _inverse_of(G):
    """``_shifted``'s attempt that inverts G's shifted matrices in G's library: LAPACK's for
    NumPy (``_lapack_inverse``), PyTorch's unchecked forms for tensors (``_torch_inverse``),
    the standard ``cholesky`` and ``solve`` elsewhere (``_generic_inverse``)."""
    if type(G) is np.ndarray:
        return _lapack_inverse
    return _torch_inverse if is_torch_array(G) else _generic_inverse


def _generic_inverse(xp, A, eye):
    """``L^{-T} L^{-1}`` from the standard ``cholesky`` and ``solve`` (None if not PD; not finite
    where the factor is not: CuPy returns NaN for a matrix that is not PD)."""
    try:
        L = xp.linalg.cholesky(A)
        Linv = xp.linalg.solve(L, eye)
    except Exception:  # numpy / array-api-strict raise LinAlgError on a non-PD (singular) matrix
        return None
    return Linv.T @ Linv


def _torch_inverse(xp, A, eye):
    """``L^{-T} L^{-1}`` for the square 2-D tensor A (L its lower Cholesky factor), NaN where A
    is not positive definite.

    ``cholesky`` and ``solve`` check their result and raise, which on a GPU waits for the
    device; ``cholesky_ex`` leaves its status (``info``) on the device, where a failed factor
    is set to NaN here, and ``solve_triangular`` (a triangular solve, not an LU factorisation)
    checks nothing. ``L^{-1}`` on one core of the 2-core VM, float32, 2026-11-28: 3.4 ms at
    500 x 500 and 11.7 at 785 x 785, against 7.7 and 26.0 ms by ``cholesky`` and ``solve``."""
    import torch

    L, info = torch.linalg.cholesky_ex(A)
    L = torch.where(info == 0, L, torch.nan)
    Linv = torch.linalg.solve_triangular(L, eye, upper=False)
    return Linv.T @ Linv


def _lapack_cholesky(xp, A, eye):
    """NumPy arrays: LAPACK's potrf, the lower factor (the upper triangle left as A's); None if
    A is not positive definite."""
    from scipy.linalg import lapack

    potrf = lapack.get_lapack_funcs("potrf", (A,))
    L, info = potrf(A, lower=True, clean=False, overwrite_a=True)  # A is a fresh G + shift I
    return L if info == 0 else None


def _lapack_inverse(xp, A, eye):
    """NumPy arrays: LAPACK's potrf + potri, the same inverse 9x faster than ``_generic_inverse``
    (785 x 785 float32, one thread: 10 ms against 90 ms, where a general ``solve(L, I)`` is
    63 ms). None if A is not positive definite."""
    from scipy.linalg import lapack

    L = _lapack_cholesky(xp, A, eye)
    if L is None:
        return None
    potri = lapack.get_lapack_funcs("potri", (L,))
    inv, info = potri(L, lower=True, overwrite_c=True)
    if info != 0:
        return None
    inv = np.tril(inv)
    return inv + np.tril(inv, -1).T


def top_eig(xp, A, iters=30):
    """An estimate of ``||A||_2^2`` (largest eigenvalue of ``A^T A``) by power iteration.

    Iterates on the smaller Gram matrix without reading back to the host until the end; the
    estimate approaches the true value from below, so callers add a margin and keep a
    backtracking safeguard. Falls back to the (upper) bound ``max_i sum_j |M_ij|``.
    """
    M = A @ A.T if A.shape[0] <= A.shape[1] else A.T @ A
    if M.shape[0] == 0:
        return 0.0
    bound = float(xp.max(xp.sum(xp.abs(M), axis=1)))
    x = xp.ones((M.shape[0], 1), dtype=M.dtype, device=device(M)) / math.sqrt(M.shape[0])
    for _ in range(iters):
        y = M @ x
        x = y / xp.sqrt(xp.sum(y * y))
    lam = float(xp.sqrt(xp.sum((M @ x) ** 2)))
    return lam if math.isfinite(lam) and lam > 0 else bound


def newton_1d(xp, derivs, t, bracket, tol, max_iter=50, fixed=None, kernels=EAGER):
    """Minimise convex 1-D functions elementwise: find ``t`` in ``[lo, hi]`` with ``f'(t) = 0``.

    ``derivs(t) -> (d1, d2)`` gives ``f'`` and ``f''`` at ``t`` (arrays shaped like ``t``);
    ``bracket = (lo, hi)``, ``lo < t`` with ``f'(lo) < 0`` and ``hi`` (possibly ``inf``),
    brackets the root. Newton steps
    that leave the bracket are replaced by bisection. An element stops for good where
    ``|f'(t)| <= tol`` (elementwise, broadcast), where its step is below rounding, or where its
    bracket is still open (``hi`` infinite: no point with ``f' > 0`` seen): a trial below the
    root is taken as it is, since ``f`` decreases up to it (``f'`` is increasing and
    ``f'(t) < 0``). Its ``t`` and bracket are frozen from then on. The loop ends when every
    element has stopped, or after ``max_iter`` iterations; ``fixed`` (None: where host reads are
    not cheap, ``arrays.cheap_reads``) runs all ``max_iter`` with no test read back, which
    returns the same ``t`` and ``lo`` (the stopped elements frozen by the mask). Each iteration
    is ``newton_step``, run as ``kernels.region`` gives it (``whole.Blocks``: one subgraph of a
    block's graph, compiled once for all its iterations).
    Returns ``(t, lo, iterations)``: ``lo`` is the largest point seen with ``f' < 0`` and
    ``iterations`` those until every element stopped (a 0-d array where ``fixed``).
    """
    fixed = not cheap_reads(xp) if fixed is None else fixed
    lo, hi = bracket
    step = kernels.region(newton_step)
    stopped = xp.zeros(t.shape, dtype=xp.bool, device=device(t))
    one, moving = xp.ones_like(t), []
    for it in range(1, max_iter + 1):
        if fixed and it > 1:  # this iteration counts where an element had not stopped before it
            moving.append(xp.any(~stopped))
        t, lo, hi, stopped = step(derivs, t, lo, hi, stopped, tol, one)
        if not fixed and bool(xp.all(stopped)):
            return t, lo, it
    if not fixed:
        return t, lo, max_iter
    counted = xp.sum(xp.astype(xp.stack(moving), xp.int64)) if moving else 0
    return t, lo, counted + 1


def newton_step(derivs, t, lo, hi, stopped, tol, one):
    """One iteration of ``newton_1d`` on the elements not yet ``stopped``: -> ``(t, lo, hi,
    stopped)``, the stopped elements' ``t`` and bracket frozen; ``one``: ones shaped like ``t``."""
    xp = array_namespace(t)
    eps = xp.finfo(t.dtype).eps
    d1, d2 = derivs(t)
    lo_n = xp.where(d1 < 0, t, lo)
    hi_n = xp.where(d1 > 0, t, hi)
    curved = d2 > 0
    # the Newton step where f'' > 0; elsewhere its value is never used (not ``inside``)
    tn = t - d1 / xp.where(curved, d2, one)
    inside = (tn > lo_n) & (tn < hi_n) & curved
    tn = xp.where(inside, tn, 0.5 * (lo_n + hi_n))
    is_open = xp.isinf(hi_n)
    done = (xp.abs(d1) <= tol) | is_open | (hi_n - lo_n <= 4 * eps * xp.abs(hi_n))
    small = xp.abs(tn - t) <= 4 * eps * xp.abs(t)
    tn = xp.where(done, t, tn)
    t, lo, hi = xp.where(stopped, t, tn), xp.where(stopped, lo, lo_n), xp.where(stopped, hi, hi_n)
    return t, lo, hi, stopped | done | small


def select(xp, cond, a, b):
    """``a`` where the 0-d boolean array ``cond`` holds, else ``b`` (tuples of arrays, entry by
    entry): a Python branch where reads are cheap (``arrays.cheap_reads``), elsewhere ``where``
    on the device, with nothing read back."""
    if cheap_reads(xp):
        return a if bool(cond) else b
    return tuple(xp.where(cond, u, v) for u, v in zip(a, b))


def sqnorm(xp, A):
    return xp.sum(A * A)


def row_values(xp, block, W, U):
    """The WHidden block's value (eq. (19)) row by row, a p x 1 column: ``lam sum_j
    B(V_ij, U_ij) + rho |W_i|^2 + gamma |W_i - W0_i|^2`` with ``U = W X~`` at hand
    (``blocks.WHidden.value`` is their sum)."""
    val = block.lam * xp.sum(block.act.divergence(block.V, U), axis=1, keepdims=True)
    if block.rho:
        val = val + block.rho * xp.reshape(vecdot(W, W), (-1, 1))
    if block.gamma:
        D = W - block.W0
        val = val + block.gamma * xp.reshape(vecdot(D, D), (-1, 1))
    return val


def keep_descent(xp, block, start, U_start, W, U=None):
    """The descent guard of an inexact WHidden solve from ``start`` (``U_start = start X~``, as
    the solver held it) to ``W``: every row whose value at ``W`` is above its value at the start
    (or NaN) takes the start's row (the rows are independent pieces). -> ``(W, U, value,
    reverted)``: ``U = W X~``, the block's value and the number of rows put back (0-d arrays:
    no host read). ``U``: ``W X~`` formed by a product where the caller has a cheaper one (the
    span loop's ``U_start + Z K``, ``K = X~^T X~``); None: ``W @ X~`` here.

    The value at ``W`` is formed from the true image ``W X~`` (a product), as
    ``blocks.WHidden.value`` forms it, not from the image a data-space loop carried
    (``span``, ``gram.DataGram.split``): there the direction's image ``s X~ = A / w - (c2 / w)
    B`` is a difference of two terms of size ``|A| / w``, so its absolute rounding stays at
    ``eps |A| / w`` while ``s X~`` itself shrinks as CG nears the optimum. Past that the
    computed curvature ``<d, d X~>`` loses its sign, the exact line search steps 1e4 times too
    far, and the loop's image drifts from ``W X~`` by that step times the rounding, so the
    per-row safeguard of the line search, which tests the rise on that same image, passes a
    row whose value rose (a 10-step W_0 solve of the depth-8 MNIST screen: one row from 3e-9 to
    8e-6). The start's image is the solver's (the driver's feed-forward product, or its own):
    it differs from ``start X~`` by rounding only, ``eps |W| |X~|`` an entry, which moves the
    value by ``|phi(U) - V|`` times that."""
    U = block.forward(W) if U is None else U
    end, begin = row_values(xp, block, W, U), row_values(xp, block, start, U_start)
    worse = xp.logical_not(end <= begin)  # (a NaN row too)
    W, U = xp.where(worse, start, W), xp.where(worse, U_start, U)
    value = xp.sum(xp.where(worse, begin, end))
    return W, U, value, xp.sum(xp.astype(worse, xp.int64))
