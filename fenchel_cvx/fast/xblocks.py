"""X-blocks by accelerated proximal gradient (FISTA with adaptive restart).

    XHidden:  min_Z  lam_in B_in(Z, U_prev) + lam_out B_out(V_next, A(W, Z))
    XLast:    min_Z  L(Y, A(W, Z))           + lam_in B_in(Z, U_prev)

The objective splits into a smooth part ``f`` (the term through the layer's linear map ``A``:
its gradient is ``A(W, .)^T grad_U``; dense: ``W_p^T grad_U``, ``W_p`` the weights without the
bias column; a convolution: the transposed convolution of ``layers.py``) and a separable part

    h(Z) = lam_in [F_in(Z) - U_prev * Z]  (+ the indicator of phi_in's range),

whose curvature ``1 / phi'(phi^{-1}(Z))`` is unbounded at the ends of a sigmoid or tanh range.
So ``h`` is never linearised: it enters through its proximal map, which is elementwise,

    prox(R) = argmin_z  L/2 (z - R)^2 + lam_in (F(z) - u z)   <=>   z + tau phi^{-1}(z) = R + tau u,

with ``tau = lam_in / L``: the activation's own closed form where it has one (``act.x_prox``;
ReLU: ``z = max(0, r / (1 + tau))``; leaky ReLU: ``r / (1 + tau)`` or ``r / (1 + tau / a)``); for
any other activation (sigmoid, tanh, ELU, ...) ``z = phi(s)`` with ``phi(s) + tau s = r``, a
strictly monotone scalar equation solved by bracketed Newton in ``s``, which keeps ``z``
strictly inside an open range (``act.open_range``).

``L`` is ``sup phi_out' * lam_out * ||A||_2^2`` (``act.dphi_max``) (``2 ||A||^2`` for MSE,
``max_j (1^T y_j) / 2 ||A||^2`` for cross-entropy, the softmax Hessian being ``<= I / 2``),
``A = A(W, .)`` the layer's map (dense: ``W_p``). Where its eigenproblems have at most
``EXACT_EIG_MAX`` rows (``LinearMap.norm2_bound``: ``W_p``'s smaller side; a convolution's channels,
per frequency of its filters' DFT; LeNet-5's maps and the MLP's last layer), ``||A||_2^2`` has a
certified upper bound and ``L`` is a certified Lipschitz constant: no line search. Otherwise
``||A||_2^2`` comes from power iteration and a backtracking test on the smooth term's value guards
it. The block is a sum of independent problems, one per data point (column), which share L:
each column's momentum restarts when it stops helping that column (O'Donoghue & Candes'
gradient test, column by column), so the momentum needs no figure of another column: on
column shards a solve with a certified L and no stopping test meets the other ranks only at its
start (an open range's clip test, cross-entropy's curvature bound) and at its descent guard.
Each step starts from FISTA's point ``y = z + beta (z - z_prev)``, formed inside the step's
chain (``fused.fista_step``: compiled, the extrapolation's passes over Z fuse with the step's,
which on Figure 1's 300 x 60,000 X-block saves a quarter of a step's time). The loop stops when
the block's own ``kkt_residual`` is ``<= tol``; it is evaluated only where the same formula,
with the gradient the loop holds, comes within ``2 tol``.
"""

import dataclasses
import functools
import math
from types import ModuleType
from typing import Any, NamedTuple

from array_api_compat import array_namespace, device

from ..arrays import Array, cheap_reads, clip, host_if_cheap
from ..blocks import XBlock, XHidden, XLast
from ..reduce import LOCAL, Comm
from . import fused
from ._util import kkt, newton_1d, select, top_eig
from .fused import EAGER


def _prox_newton(xp, act, r, tau, s):
    """Solve phi(s) + tau s = r elementwise (bracketed Newton) and return z = phi(s) inside the
    range."""
    if s is None:
        s = r / (1 + tau)
    g0 = act.phi(s) + tau * s - r
    # phi' >= 0 gives |s - s*| <= |g(s)| / tau;
    # the range of phi gives (r - hi)/tau < s* < (r - lo)/tau
    lo, hi = s - xp.abs(g0) / tau, s + xp.abs(g0) / tau
    vlo, vhi = act.v_range
    if math.isfinite(vhi):
        lo = xp.maximum(lo, (r - vhi) / tau)
    if math.isfinite(vlo):
        hi = xp.minimum(hi, (r - vlo) / tau)
    s = clip(s, lo, hi)
    tol = 8 * xp.finfo(r.dtype).eps * (1 + xp.abs(r))

    def derivs(s_):
        return act.phi(s_) + tau * s_ - r, act.dphi(s_) + tau

    s, _, _ = newton_1d(xp, derivs, s, (lo, hi), tol, max_iter=60)
    return _inside(xp, act, act.phi(s)), s


def _prox(act):
    """The X-blocks' proximal map of ``act``: its closed form, else the Newton solve."""
    return act.x_prox if act.x_prox is not None else _prox_newton


def _inside(xp, act, Z, tested=True, comm=LOCAL):
    """Clip Z into the range of phi, strictly inside where F' is unbounded (sigmoid, tanh); Z
    itself where it is inside already (read, not copied: the usual start, a previous iterate).

    An untested solve (``solve_x``) on a closed range (ReLU's, leaky ReLU's) starts at Z as it
    is, with nothing read back: its first step is a proximal one, which lands in the range from
    any point, with no momentum (theta = 1), so Z enters no later step; and outside the range
    Z's value is +inf, so the descent guard never returns it."""
    lo, hi = act.v_range
    lo, hi = (None if math.isinf(lo) else lo), (None if math.isinf(hi) else hi)
    if act.open_range:  # open ranges: strictly inside; closed ones (ReLU's): the range
        fi = xp.finfo(Z.dtype)
        lo = None if lo is None else lo + max(abs(lo) * fi.eps, fi.smallest_normal)
        hi = None if hi is None else hi - max(abs(hi) * fi.eps, fi.smallest_normal)
    elif not tested:
        return Z
    ends = [(b, op) for b, op in ((lo, "min"), (hi, "max")) if b is not None]
    seen = comm.reduce([getattr(xp, op)(Z) for _, op in ends], [op for _, op in ends])  # shards'
    if all(float(v) >= b if op == "min" else float(v) <= b for v, (b, op) in zip(seen, ends)):
        return Z  # (NaN fails both)
    return clip(Z, lo, hi)


class _Smooth:
    """The smooth term of an X-block as a function of U = A(W, Z): value, dvalue/dU, Lipschitz
    (its curvature bound the whole block's: ``comm``)."""

    def __init__(self, xp, block, kernels=EAGER, comm=LOCAL):
        self.xp, self.block, self.kernels = xp, block, kernels
        A = block.map
        self.Wp = None
        if A.is_dense:
            p = block.U_prev.shape[0]
            self.Wp, self.b = block.W[:, :p], block.W[:, p:]
        # ||A(W, .)||^2: a certified bound where its eigenproblems are small (dense: exact from
        # the smaller Gram matrix; a convolution: from its filters' spectrum; pooling: exact),
        # else power iteration, which approaches it from below
        nrm2 = A.norm2_bound(block.W, EXACT_EIG_MAX)
        exact = nrm2 is not None
        if exact:  # 1.001: rounding of the eigensolver and of the map (a 0-d array off NumPy)
            nrm2 = 1.001 * nrm2
        elif self.Wp is not None:
            nrm2 = 1.02 * top_eig(xp, self.Wp)
        else:
            nrm2 = 1.05 * A.norm2(block.W, iters=50)
        curv, known = _curvature(block, xp, comm)
        self.L = curv * nrm2
        exact = exact and known
        # the smooth term of the block's class, looked up once (value and grad_U run every step)
        self._value = _smooth_value.dispatch(type(block))
        self._grad_U = _smooth_grad.dispatch(type(block))
        # a certified ||A|| and a known curvature bound make L a certified Lipschitz constant: no
        # backtracking (whose value test is at the mercy of rounding in float32)
        self.certified = exact

    def forward(self, Z):
        return self.Wp @ Z + self.b if self.Wp is not None else self.block.forward(Z)

    def adjoint(self, G):
        return self.Wp.T @ G if self.Wp is not None else self.block.adjoint(G)

    def value(self, U):
        """The smooth term at U (up to a constant), as a 0-d array (no device sync)."""
        return self._value(self.block, self.xp, U)

    def grad_U(self, U):
        return self._grad_U(self.block, U, self.kernels)


# --- the smooth term of each X-block class, as a function of U = A(W, Z) ---------------------
@functools.singledispatch
def _curvature(block, xp, comm=LOCAL):
    """``(c, known)``: the smooth term's curvature bound in U over the whole block (``comm``:
    its shards) and whether it is certified."""
    raise TypeError(f"no smooth term is registered for {type(block).__name__}")


@_curvature.register
def _(block: XHidden, xp, comm=LOCAL):
    """lam_out sup phi_out' (1 where phi_out has no known bound): the same on every shard."""
    curv = block.act_out.dphi_max
    return block.lam_out * (curv if curv is not None else 1.0), curv is not None


@_curvature.register
def _(block: XLast, xp, comm=LOCAL):
    """The loss's Hessian bound (``losses``): MSE 2, cross-entropy max_j (1^T y_j) / 2 (a
    maximum over the columns: over every shard's)."""
    (curv,) = comm.reduce([block.loss.curvature(block.Y, xp)], "max")
    return curv, True


@functools.singledispatch
def _smooth_value(block, xp, U):
    raise TypeError(f"no smooth term is registered for {type(block).__name__}")


@_smooth_value.register
def _(block: XHidden, xp, U):
    return block.lam_out * xp.sum(block.act_out.Fstar(U) - block.V_next * U)


@_smooth_value.register
def _(block: XLast, xp, U):
    return block.loss.value(block.Y, U)


@functools.singledispatch
def _smooth_grad(block, U, kernels):
    raise TypeError(f"no smooth term is registered for {type(block).__name__}")


@_smooth_grad.register
def _(block: XHidden, U, kernels):
    return kernels(fused.scaled_grad_u)(block.act_out, block.lam_out, block.V_next, U)


@_smooth_grad.register
def _(block: XLast, U, kernels):
    return block.loss.grad(block.Y, U)


def default_start(xp: ModuleType, block: XBlock) -> Array:
    """The feed-forward value phi_in(U_prev): B_in = 0 there."""
    return block.act_in.phi(block.U_prev)


EXACT_EIG_MAX = 128  # certified ||A(W, .)||^2 where its eigenproblems are at most this size
MAX_BACKTRACKS = 60  # doublings of L in one iteration; past that the precision is exhausted


@dataclasses.dataclass(frozen=True)
class FistaProblem:
    """One X-block's FISTA solve, all that stays fixed through it: the block, its smooth term
    ``sm`` and its activation's prox and step chain (``_stepper``), the tolerance, the step
    cap, the stall window, the stopping tests (None: a capped solve that reports no residual
    tests none) and the reports asked for (``solve_x``)."""

    xp: Any
    block: Any
    sm: _Smooth
    prox: Any
    step: Any
    max_iter: int
    momentum_last: bool  # the last step forms its momentum too (compiled: one chain for all)
    tests: Any
    reports: tuple  # (capped_residual, capped_value)
    comm: Comm = LOCAL  # the block's shards (``reduce``): every figure below is the whole block's


class FistaState(NamedTuple):
    """FISTA's iterate after ``it`` steps: ``z`` and its image ``Uz`` = A(W, z) + b, the last
    point ``z_prev`` and momentum ``beta`` (one per column) with which the next point
    y = z + beta (z - z_prev) forms (``z_prev`` None: y is z), y's image ``Uy``, ``theta`` (one
    per column), the Lipschitz estimate ``L`` and the prox's ``(L, tau U_prev)``, the prox's
    warm start ``prox``, the smooth term's gradient ``(G, Gy)`` at y where at hand (else None:
    formed from ``Uy``), the counts, the start ``(z0, Uz0)`` (the descent guard's) and ``end``
    (None: go on; ``"converged"``, ``"stalled"`` or ``"capped"``)."""

    z: Any
    Uz: Any
    z_prev: Any
    beta: Any
    Uy: Any
    theta: Any
    L: Any
    tauU: tuple
    prox: Any
    grad: Any
    restarts: Any
    backtracks: int
    it: int
    start: tuple
    end: Any


def init(p: FistaProblem, Z: Array) -> FistaState:
    """The state at the start ``Z``: clipped into the domain (tested solves), its image (the
    caller's where it fits), the gradient there; ``end`` ``"converged"`` where an uncapped
    solve's start passes the block's own KKT test."""
    xp, block, sm, act = p.xp, p.block, p.sm, p.block.act_in
    z = _inside(xp, act, Z, p.tests is not None, p.comm)
    Uz = _image(xp, block, sm, Z, z)
    G = sm.grad_U(Uz)
    Gy = sm.adjoint(G)  # the smooth term's gradient at z: also the first step's (y = z)
    L = _lipschitz(xp, sm.L, block.lam_in, Z.dtype)
    s = FistaState(
        z, Uz, None, 0.0, Uz, 1.0, L, (None, None), None, (G, Gy), 0, 0, 0, (z, Uz), None
    )
    capped = p.max_iter < (p.tests.stall_window if p.tests is not None else math.inf)
    if p.tests is not None and not capped and _optimal(block, z, Gy, p.tests.tol, p.comm):
        if (res := kkt(z, block.grad_parts(z), block.project, p.comm)) <= p.tests.tol:
            p.tests.residual = res
            return s._replace(end="converged")
    return s


def step(p: FistaProblem, s: FistaState) -> FistaState:
    """One FISTA step from ``s``: the proximal-gradient step at y (backtracking on L where it is
    not certified), the stopping tests, then the momentum for the next one (restarted where it
    points uphill) and the next point's image (no product: the map is affine)."""
    xp, sm, lam_in, it = p.xp, p.sm, p.block.lam_in, s.it + 1
    G, Gy = s.grad if s.grad is not None else (g := sm.grad_U(s.Uy), sm.adjoint(g))
    fy_d = None if sm.certified else sm.value(s.Uy)
    y = None if sm.certified else fused.extrapolated(s.z, s.z_prev, s.beta)  # backtracking's
    L, tauU, backtracks = s.L, s.tauU, s.backtracks
    for _ in range(MAX_BACKTRACKS):
        tau = lam_in / L
        if tauU[0] is not L:
            tauU = (L, tau * p.block.U_prev)
        zn, prox, *figures = p.step(
            p.prox, p.block.act_in, Gy, (s.z, s.z_prev, s.beta), (1.0 / L, tau), tauU[1],
            s.prox, momentum=it < p.max_iter or p.momentum_last,
        )  # fmt: skip
        Uzn = sm.forward(zn)
        if sm.certified or _sufficient(p, fy_d, Uzn, Gy, zn - y, L):
            break
        L, backtracks = 2 * L, backtracks + 1
    else:  # no step passes the test at this precision (rounding, overflow): stop here
        return s._replace(it=it, L=L, tauU=tauU, backtracks=backtracks, end="stalled")
    s = s._replace(it=it, L=L, tauU=tauU, backtracks=backtracks, prox=prox, grad=None)
    if p.tests is None and it == p.max_iter:  # no test and no next step: nothing to decide
        return s._replace(z=zn, Uz=Uzn, end="capped")
    if p.tests is not None:  # the proxy's max D and min D: the whole block's
        figures[:2] = p.comm.reduce(figures[:2], ("max", "min"))
        if end := p.tests.after(it, zn, Uzn, figures, (G, Gy, L), p.comm):
            return s._replace(z=zn, Uz=Uzn, end=end)
    # each column's (y - zn).(zn - z) = -D.dz exactly: > 0 where its momentum points uphill
    theta_n, beta, restarted = _momentum(xp, s.theta, -figures[2])
    s = s._replace(restarts=s.restarts + restarted)
    if it == p.max_iter:  # no next step: no momentum to form
        return s._replace(z=zn, Uz=Uzn, end="capped")
    moves = not isinstance(beta, float) or beta  # on the device: formed, 0 or not
    z_prev, beta = (s.z, beta) if moves else (None, 0.0)
    Uy = fused.extrapolated(Uzn, s.Uz if moves else None, beta)
    return s._replace(z=zn, Uz=Uzn, z_prev=z_prev, beta=beta, Uy=Uy, theta=theta_n)


def finish(p: FistaProblem, s: FistaState) -> tuple[Array, int, dict[str, Any]]:
    """``(z, iterations, info)`` of the final state: an inexact solve never ends above its start
    (``_closing``), its reports as asked (``solve_x``)."""
    converged, stalled = s.end == "converged", s.end == "stalled"
    if converged and s.it == 0:  # the start itself (``init``)
        return s.z, 0, _info(s.L, 0, 0, converged=True, residual=p.tests.residual, U=s.Uz)
    checks = 0 if p.tests is None else p.tests.checks
    info = _info(s.L, s.restarts, s.backtracks, reverted=False, kkt_checks=checks)
    info.update(converged=converged, stalled=stalled)
    if converged:
        info["residual"] = p.tests.residual
    start = None if _descends(p.sm, p.block.act_in, s.it, stalled) else s.start
    z, info["U"] = _closing(p, (s.z, s.Uz), start, info)
    return z, s.it, info


@dataclasses.dataclass(frozen=True)
class FistaSettings:
    """The options of the X-blocks' FISTA (``solve_x``) that a backend fixes once for all its
    solves: ``stall_window``, ``capped_residual``, ``capped_value`` and ``kernels``, as
    ``solve_x`` says.

    >>> FistaSettings(capped_residual=False).stall_window
    100
    """

    stall_window: int = 100
    capped_residual: bool = True
    capped_value: bool = True
    kernels: Any = EAGER


#: the settings of a solve given none
DEFAULT_SETTINGS = FistaSettings()


def solve_x(
    xp: ModuleType,
    block: XBlock,
    Z: Array,
    tol: float,
    max_iter: int,
    settings: FistaSettings = DEFAULT_SETTINGS,
    comm: Comm = LOCAL,
) -> tuple[Array, int, dict[str, Any]]:
    """FISTA with restart on an XHidden / XLast block from ``Z``: ``(Z, iterations, info)``,
    :func:`init`, then :func:`step` until the state ends, then :func:`finish`. ``comm``: the
    block's column shards (``reduce.py``; the block and ``Z`` are this shard's columns), through
    which every figure that decides for the whole block passes. ``settings``
    (:class:`FistaSettings`):

    Near the working precision's floor (gradient-mapping residual below sqrt(eps)),
    ``stall_window`` iterations without halving it stop the loop (``info["stalled"]``). Stopped
    by ``max_iter``: with ``capped_residual=False`` ``info["residual"]`` is NaN (the caller
    does not evaluate it); with ``capped_value=False`` ``info`` has no value, unless the
    descent guard formed it where reads are cheap. ``kernels``: how the step's elementwise
    chains run (``fused``).

    A capped solve (fewer steps than ``stall_window``) that reports no residual
    (``capped_residual=False``) runs all its ``max_iter`` steps with no test of its residual on
    the way; with a certified L it then reads nothing back to the host where reads are not
    cheap (``arrays.cheap_reads``): L, the momentum's restarts and the descent guard stay on the
    device as 0-d arrays and ``where`` (``info``'s ``lipschitz``, ``restarts`` and
    ``reverted`` are then 0-d arrays)."""
    kernels, stall_window = settings.kernels, settings.stall_window
    capped_residual, capped_value = settings.capped_residual, settings.capped_value
    sm = _Smooth(xp, block, kernels, comm)
    eps = xp.finfo(Z.dtype).eps
    # a capped solve (fewer steps than the stall window) tests its first step, not its start:
    # an optimal start is a fixed point of the step, whose gradient mapping passes the proxy;
    # one that reports no residual tests none of its steps (``tests`` None)
    capped = max_iter < stall_window
    tests = (
        None
        if capped and not capped_residual
        else _Tests(xp, block, sm, tol, eps, stall_window, capped)
    )
    act = block.act_in
    p = FistaProblem(
        xp, block, sm, _prox(act), _stepper(kernels, act), max_iter, kernels.compiled, tests,
        (capped_residual, capped_value), comm,
    )  # fmt: skip
    s = init(p, Z)
    while s.end is None and s.it < max_iter:
        s = step(p, s)
    return finish(p, s)


def _info(L, restarts, backtracks, **more):
    """``solve_x``'s ``info``: its method, last L, restarts (the columns' momentum restarts,
    over all the steps) and backtracks, then ``more``."""
    return dict(method="fista", lipschitz=L, restarts=restarts, backtracks=backtracks, **more)


def _stepper(kernels, act):
    """The proximal-gradient step's chain (``fused.fista_step``): one fused kernel where
    ``kernels`` compiles and the prox has a closed form (compiled, it forms D.dz at every step,
    so that one kernel per shape serves them all); the Newton prox iterates with tests of its
    own, eagerly."""
    return (kernels if act.x_prox is not None else EAGER)(fused.fista_step)


def _lipschitz(xp, L, lam_in, dtype):
    """``max(L, 1e-12 lam_in)``: a Python float, or a 0-d array of the block's dtype where the
    bound stayed on the device (``LinearMap.norm2_bound``)."""
    if isinstance(L, float):
        return max(L, 1e-12 * lam_in)
    return xp.astype(clip(L, 1e-12 * lam_in, None), dtype)


def _image(xp, block, sm, Z, z):
    """``A(W, z) + b`` at the start z: the caller's image ``block.U`` (``FastBackend.solve``'s
    ``image``: the driver's pre-activation) where it is of the right shape and z is Z itself
    (inside the domain), else formed here."""
    U = getattr(block, "U", None)  # (``_util.started``)
    held = U is not None and tuple(U.shape) == (block.map.n_out, Z.shape[1]) and z is Z
    return U if held else sm.forward(z)


class _Tests:
    """The stopping tests of a tested FISTA solve after each step: the gradient-mapping proxy
    of the KKT residual within 2 tol, confirmed by the block's own KKT residual; and, near the
    working precision's floor (proxy below sqrt(eps)), ``stall_window`` steps without halving
    it. Each reads its figures back to the host."""

    def __init__(self, xp, block, sm, tol, eps, stall_window, capped):
        self.xp, self.block, self.sm, self.tol, self.stall_window = xp, block, sm, tol, stall_window
        self.best, self.best_it, self.checks, self.residual = math.inf, 0, 0, None
        self.floor = math.sqrt(eps)
        # capped: max|Gy| only where |W_p^T G| <= max_i |W_p e_i|_1 max|G| lets the proxy pass
        self.colsum = (
            float(xp.max(xp.sum(xp.abs(sm.Wp), axis=0))) if capped and sm.Wp is not None else None
        )

    def after(self, it, zn, Uzn, figures, gradient, comm):
        """``"converged"`` (``residual`` its KKT residual), ``"stalled"`` or None (go on) after
        step ``it`` to ``zn`` (``Uzn = A(W, zn) + b``); ``figures`` the step's (the whole
        block's), ``gradient`` ``(G, Gy, L)`` at its point y, ``comm`` the block's shards."""
        xp, block, sm, tol = self.xp, self.block, self.sm, self.tol
        proxy = _proxy(xp, figures, gradient, tol, self.colsum, comm)
        if math.isnan(proxy):  # a NaN in the block's data or iterate: no step can mend it
            return "stalled"
        if proxy <= 2 * tol:
            self.checks += 1
            if (
                _optimal(block, zn, sm.adjoint(sm.grad_U(Uzn)), tol, comm)
                and (res := kkt(zn, block.grad_parts(zn), block.project, comm)) <= tol
            ):
                self.residual = res
                return "converged"
        if proxy < 0.5 * self.best:  # (proxy inf by colsum: no stall test fires by max_iter)
            self.best, self.best_it = proxy, it
        elif proxy <= self.floor and it - self.best_it >= self.stall_window:
            return "stalled"
        return None


def _proxy(xp, figures, gradient, tol, colsum, comm):
    """The gradient-mapping proxy of the KKT residual, ``L max|D| / (1 + max|Gy|)`` (a Python
    float), from a step's figures ``(max D, min D, D . dz)`` (``fused.fista_step``: 0-d arrays
    but D . dz, one per column; max |D| as max(max D, -min D), no temporary) and ``gradient``
    ``(G, Gy, L)``; inf (above 2 tol), with no max|Gy|, where the bound ``colsum`` (None: none)
    shows that it cannot pass 2 tol. Maxima over the block's shards (``comm``)."""
    G, Gy, L = gradient
    maxD, L = max(float(figures[0]), -float(figures[1])), float(L)
    if colsum is not None:
        (maxG,) = comm.reduce([xp.max(xp.abs(G))], "max")
        if L * maxD > 2 * tol * (1 + 1.001 * colsum * float(maxG)):
            return math.inf
    hi, lo = comm.reduce([xp.max(Gy), xp.min(Gy)], ("max", "min"))
    return L * maxD / (1 + max(float(hi), -float(lo)))


def _sufficient(p, fy_d, Uzn, Gy, D, L):
    """The backtracking test of an uncertified L: the smooth term at the new point below its
    quadratic model at y, ``f(zn) <= f(y) + <Gy, D> + L/2 |D|^2`` (to a few eps of f(y)); the
    sums over the block's shards (``p.comm``)."""
    xp, eps = p.xp, p.xp.finfo(D.dtype).eps
    sums = p.comm.reduce([fy_d, p.sm.value(Uzn), xp.sum(Gy * D), xp.sum(D * D)], "sum")
    fy, fzn, gd, dd = (float(v) for v in sums)
    return fzn <= fy + gd + 0.5 * L * dd + 16 * eps * (1 + abs(fy))


def _descends(sm, act, it, stalled):
    """Whether the returned point provably lies no higher than the start: one step from it with
    a certified L and an exact prox (``act.x_prox``: ReLU, leaky ReLU) is a proximal-gradient step,
    which descends (Beck & Teboulle 2009, Lemma 2.3: F(z1) <= F(z0) - L/2 |z1 - z0|^2).
    Sigmoid's and tanh's prox is an iterative solve, whose float32 rounding can raise the value
    by more than the evaluation's: their descent guard stays."""
    return sm.certified and act.x_prox is not None and it == 1 and not stalled


def _momentum(xp, theta, uphill):
    """FISTA's next ``(theta, beta, restarted)``, a theta and a beta per column: the block is a
    sum of independent problems, one per column (data point), and each column's momentum
    restarts, theta 1 and beta 0, where it points uphill (``uphill > 0``, one per column:
    O'Donoghue & Candes' gradient test), with no figure of another column, so that on column
    shards no rank waits for another; ``restarted`` counts the columns that restart. theta is
    float64 (1.0 at the first step) and beta of uphill's dtype (as a Python float is rounded to
    it in the step); beta is 0.0 where reads are cheap and every column's beta is 0 (the next
    point is z: no pass forms it), else decided on the device, with ``restarted`` there too."""
    up = uphill > 0
    if isinstance(theta, float):  # the first step's: filled on the device, no copy from the host
        theta = xp.full((), theta, dtype=xp.float64, device=device(uphill))
    theta_n = 0.5 * (1 + xp.sqrt(1 + 4 * theta * theta))
    beta = xp.astype(xp.where(up, xp.zeros_like(theta_n), (theta - 1) / theta_n), uphill.dtype)
    theta_n = xp.where(up, xp.ones_like(theta_n), theta_n)
    restarted = xp.sum(xp.astype(up, xp.int64))
    if cheap_reads(xp):
        return theta_n, (beta if bool(xp.any(beta)) else 0.0), int(restarted)
    return theta_n, beta, restarted


def _optimal(block, Z, grad_smooth, tol, comm=LOCAL):
    """Whether the block's KKT residual at Z may be ``<= tol``, from the smooth term's gradient
    ``A^T grad_U`` at Z that the loop holds (no second ``A(W, Z)``): that residual within 2 tol.
    Only then is ``block.kkt_residual(Z)`` evaluated, which decides (the factor 2 keeps the
    rounding of a differently ordered gradient from vetoing a point the block accepts)."""
    return kkt(Z, [block.grad_in(Z), grad_smooth], block.project, comm) <= 2 * tol


def _closing(p, last, start, info):
    """``(z, A(W, z))`` of the returned point: an inexact solve (a cap, a stall) never ends above
    its start (BCD descent holds); its value goes to ``info``, and NaN as residual for a cap
    with ``capped_residual=False``. ``last``, ``start``: such pairs the loop holds, so that
    neither value needs the map again; ``start`` None where the step is known to descend (then
    only the last point's value is formed, and none for a cap with ``capped_value=False``).
    Where reads are not cheap the guard's choice is made on the device (``select``), and a cap
    with ``capped_value=False`` leaves its value there, unreported. The values are the whole
    block's (``p.comm``)."""
    block, (capped_residual, capped_value) = p.block, p.reports
    z, Uz = last
    if info["converged"]:
        return z, Uz
    xp, capped = array_namespace(z), not info["stalled"]
    if start is not None or capped_value or not capped:
        values = [block.value_with_forward(*pair) for pair in ((z, Uz), start) if pair]
        (value, *value0), reverted = p.comm.reduce(values, "sum"), False
        if start is not None:
            reverted = value > value0[0]
            z, Uz, value = select(xp, reverted, (*start, value0[0]), (z, Uz, value))
        info["reverted"] = host_if_cheap(xp, reverted, bool)
        if capped_value or not capped or cheap_reads(xp):
            info["value"] = float(value)
    if capped and not capped_residual:
        info["residual"] = math.nan
    return z, Uz
