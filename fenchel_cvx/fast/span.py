"""A few warm-started WHidden steps in the span of the batch: ``W = W0 + Z X~^T``.

The batched model's hidden W-block (the paper's Sec. 4.5.2 W-update with its proximal term,
eq. (19))

    min_W  lam B(V, W X~) + gamma ||W - W0||^2        (rho = 0, as in the paper's batched runs)

has the gradient ``g = (lam A + 2 gamma Z) X~^T`` wherever ``W - W0 = Z X~^T``
(``A = phi(W X~) - V``), and so does the Gram-preconditioned direction ``s = g G^{-1}`` of
``gram.DataGram`` (Woodbury, ``M = w K + c2 I``, ``K = X~^T X~``):

    s = sigma X~^T,  sigma = (2 gamma / c2) Z + B,  B = (lam A - (2 gamma w / c2)(U - U0)) M^{-1}

Starting at ``W = W0`` (``Z = 0``), every iterate of ``pncg.solve_pncg``'s preconditioned
CG stays in that span. The iteration can therefore run on the coefficients Z, p x m (m the
batch: 500 against X~'s 785 rows for MNIST's W_0), with the images ``U = U0 + Z K`` and

    sigma K = (lam / w) A - (c2 / w) B        (from ``w K M^{-1} = I - c2 M^{-1}``)

known without a product, and every parameter-space inner product an elementwise one:
``<a X~^T, b X~^T> = <a, b K>``. A step costs one m x m solve (a product with ``M^{-1}``
where ``gram.DataGram`` formed it, else a triangular-solve pair) and elementwise work; the two
p x n x m products of a parameter-space step are gone, and ``W = W0 + Z X~^T`` is formed once,
at the end.

The iterates are ``solve_pncg``'s up to rounding as long as no semismooth-Newton row starts and
fewer than ``resync`` (16) steps are taken, so this path serves capped solves of at most
``newton_start`` steps (the training regime, ``FastBackend(w_steps=k)``), and solves of any
length where Newton steps are off (``FastBackend(newton_cap=0)``); other solves and ``rho > 0``
stay in parameter space. Past 16 steps the step after U is formed again restarts every row
(steepest direction): that re-forming moves the gradients of rows converged to rounding by more
than the gradients themselves, and PR+ would scale the noise up. Two more things differ and only
cost work: rows whose gradient is below ``tol / 2`` are not frozen (the
parameter-space loop drops them after 8 steps), and the stopping test at ``tol`` forms W and its
residual only where a bound from data space cannot prove the residual above ``tol``
(``_util.proves_above``, as ``pncg._above``). A solve never reports a ``tol`` it did not
reach: ``converged`` comes from the block's residual at the returned W. Nor does it end above
its start: the image ``s X~`` above is a difference of two terms of size ``|A| / w`` and near
the optimum loses its relative accuracy (then the line search's own safeguard, which tests
the rise on it, is blind), so an unconverged solve forms ``W X~`` at its end and puts back the
start's rows where the value rose (``_util.keep_descent``). An untested solve (a
capped one that reports no residual, ``solve_pncg``) runs all its steps with no stopping test,
and reads nothing back to the host where reads are not cheap (``arrays.cheap_reads``).
"""

from __future__ import annotations

import dataclasses
import math
from types import ModuleType
from typing import TYPE_CHECKING, Any, NamedTuple

from ..arrays import Array, cheap_reads, host_if_cheap
from ._util import keep_descent, kkt, most, pr_plus, proves_above

if TYPE_CHECKING:
    from ..blocks import WHidden
    from .gram import DataGram, ParamGram


def applies(
    xp: ModuleType,
    block: WHidden,
    W: Array,
    pre: ParamGram | DataGram,
    max_iter: int,
    newton_start: int,
    newton_cap: int | None = None,
) -> bool:
    """Whether ``solve_span`` reproduces ``solve_pncg``'s capped solve: a data-space
    preconditioner, ``rho = 0 < gamma``, the start at the proximal centre (by identity, as
    ``fit_bcd`` hands it; an equal copy too where reads are cheap) and no Newton row (at most
    ``newton_start`` steps, or Newton steps off: ``newton_cap == 0``)."""
    no_newton = max_iter <= newton_start or newton_cap == 0
    return (
        pre.data_space
        and block.rho == 0
        and block.gamma > 0
        and no_newton
        and tuple(W.shape) == tuple(block.W0.shape)
        and (W is block.W0 or (cheap_reads(xp) and bool(xp.all(W == block.W0))))
    )


@dataclasses.dataclass(frozen=True)
class SpanProblem:
    """A span solve, all that stays fixed through it: the nonlinear CG's problem ``cg`` (a
    ``pncg.PncgProblem`` of a WHidden block), the proximal centre ``W0`` and its image ``U0 =
    W0 X~``, and ``x2 = max_j |X~_j|^2`` over the rows of X~ (the stopping tests' bound; None
    where the steps are not tested)."""

    cg: Any
    W0: Any
    U0: Any
    x2: Any


class SpanState(NamedTuple):
    """The iterate after ``it`` steps: the coefficients ``Z`` of ``W = W0 + Z X~^T`` and the
    image ``U = U0 + Z K`` (both this solve's own arrays, updated in place, as are ``d`` and
    ``dU``), the direction ``d`` and its image ``dU``, its slope ``gd``, the last preconditioned
    gradient's image ``sigmaK`` and ``gs = <g, s>``, the counts, ``W`` and its residual ``res``
    where the stopping test formed them, and ``end`` (None: go on; ``"converged"`` or
    ``"capped"``)."""

    Z: Any
    U: Any
    d: Any
    dU: Any
    gd: Any
    sigmaK: Any
    gs: Any
    restarts: Any
    searches: int
    row_iterations: int
    W: Any
    res: float
    it: int
    end: Any


def problem(p, W0):
    """The :class:`SpanProblem` of ``p`` (a ``pncg.PncgProblem``) from ``W0``: ``W0 X~`` the
    caller's (``_util.started``) where it fits, else formed."""
    objective, block = p.objective, p.block
    U0 = getattr(block, "U", None)
    if U0 is None or tuple(U0.shape) != (W0.shape[0], block.Xt.shape[1]):
        U0 = objective.forward(W0)
    return SpanProblem(p, W0, U0, objective.pre.xt_norm2(p.xp) if p.tested else None)


def init(sp: SpanProblem) -> SpanState:
    """The state at ``Z = 0`` (W = W0): the first direction, and ``end`` ``"converged"`` where
    a tested start is optimal."""
    p = sp.cg
    xp, prob, U0 = p.xp, p.objective, sp.U0
    Z, U = xp.zeros_like(U0), xp.asarray(U0, copy=True)
    A = prob.data_grad(U)
    r = prob.coef * A  # g = r X~^T, r = lam A + 2 gamma Z (Z = 0 here)
    sigma, sigmaK = direction(prob.pre, 2 * p.block.gamma, r, Z, U, U0)
    gs = prob.dot(r, sigmaK)  # g G^{-1} g^T, per row
    W, res = None, math.inf
    if p.tested:
        W, res = _residual_unless_above(sp, Z, A, gs)
    end = "converged" if res <= p.tol else None
    # gd: the slope <g, d> along d
    return SpanState(Z, U, -sigma, -sigmaK, -gs, sigmaK, gs, 0, 0, 0, W, res, 0, end)


def step(sp: SpanProblem, s: SpanState) -> SpanState:
    """One step: the exact line search along d and the move of Z and U (re-formed every
    ``resync`` steps, and CG restarted there); then, unless it was the last, the stopping test
    and the PR+ direction."""
    p = sp.cg
    xp, prob, pre, two_g, it = p.xp, p.objective, p.objective.pre, 2 * p.block.gamma, s.it + 1
    Z, U, d, dU = s.Z, s.U, s.d, s.dU
    t, nls = prob.search(two_g * prob.dot(Z, dU), 2 * prob.c * prob.dot(d, dU), U, dU, s.gd)
    Z += t * d
    U += t * dU
    restart = None
    if it % p.settings.resync == 0:
        U = sp.U0 + Z @ pre.K  # no drift of the incrementally updated U
        # and CG restarts: the re-formed U moves the gradient of rows already converged to
        # rounding by more than their gradient, and PR+ scaled that noise by up to 4e5
        restart = xp.ones_like(s.gs) > 0
    s = s._replace(
        U=U, it=it, searches=s.searches + nls, row_iterations=s.row_iterations + Z.shape[0]
    )
    if it == p.max_iter:
        return s._replace(end="capped")
    A = prob.data_grad(U)
    cA = prob.coef * A
    r = cA + two_g * Z
    sigma_n, sigmaK_n = direction(pre, two_g, cA, Z, U, sp.U0)
    gs_n = prob.dot(r, sigmaK_n)
    if p.tested:
        W, res = _residual_unless_above(sp, Z, A, gs_n)
        if res <= p.tol:
            return s._replace(W=W, res=res, end="converged")
    beta, uphill, gd = pr_plus(xp, gs_n, prob.dot(r, s.sigmaK), s.gs, prob.dot(r, dU), restart)
    restarts = s.restarts + xp.sum(xp.astype(uphill | (restart is not None), xp.int64))
    d *= beta
    d -= sigma_n
    dU *= beta
    dU -= sigmaK_n
    return s._replace(gd=gd, sigmaK=sigmaK_n, gs=gs_n, restarts=restarts)


def finish(sp: SpanProblem, s: SpanState) -> tuple[Array, int, dict[str, Any]]:
    """``(W, iterations, info)`` as ``solve_pncg``'s: an unconverged solve ends with the
    descent guard at the true image (``_util.keep_descent``), then its residual where asked."""
    p = sp.cg
    xp, prob, block, W0, U0 = p.xp, p.objective, p.block, sp.W0, sp.U0
    info = dict(
        method="pncg-span", line_search_iterations=s.searches, restarts=0, newton_rows=0,
        row_iterations=s.row_iterations,
    )  # fmt: skip
    if s.end == "converged" and s.it == 0:  # the start is optimal: no step, as solve_pncg
        info.update(converged=True, residual=s.res, value=prob.value(W0, U0))
        return W0, 0, info
    converged, W, U, value, res = s.end == "converged", s.W, s.U, None, s.res
    if not converged:
        # W X~ = U0 + Z K: a product (0.3x the flops of W @ X~), not the direction's identity
        Z, K = s.Z, prob.pre.K
        W, U, value, reverted = keep_descent(xp, block, W0, U0, W0 + Z @ block.Xt.T, U0 + Z @ K)
        value, reverted = p.comm.rows.reduce([value, reverted], "sum")  # over the row shards
        info["reverted_rows"] = host_if_cheap(xp, reverted, int)
        res = math.nan
        if p.settings.capped_residual:
            res = kkt(W, block.grad_parts(W), comm=p.comm.rows)
            converged = res <= p.tol
    info.update(converged=converged, restarts=host_if_cheap(xp, s.restarts, int), residual=res)
    if converged or p.settings.capped_value:  # (no value yet: converged in the loop)
        info["value"] = float(prob.value(W, U) if value is None else value)
    return W, s.it, info


def solve_span(p, W0):
    """Up to ``p.max_iter`` PR+ CG steps of ``p`` (a ``pncg.PncgProblem`` of a WHidden block)
    from ``W0``, in the coefficients Z of ``W = W0 + Z X~^T``: :func:`init`, :func:`step` until
    the state ends, :func:`finish`. -> ``(W, iterations, info)`` as ``solve_pncg``; ``p.tested``
    False: all ``max_iter`` steps, no stopping test."""
    sp = problem(p, W0)
    s = init(sp)
    while s.end is None and s.it < p.max_iter:
        s = step(sp, s)
    return finish(sp, s)


def direction(
    pre: DataGram, two_g: float, cA: Array, Z: Array, U: Array, U0: Array
) -> tuple[Array, Array]:
    """``(sigma, sigma K)``: the preconditioned gradient ``s = sigma X~^T = g G^{-1}`` at
    ``W0 + Z X~^T`` and its image ``s X~``, from ``gram.DataGram``'s split with
    ``R = 2 gamma Z X~^T`` and ``P = R X~ = 2 gamma (U - U0)``; ``cA = lam A``. Temporaries
    are scaled in place: a step's elementwise passes over p x m arrays are most of its time."""
    w, c2 = pre.w, pre.c2
    P = U - U0
    P *= -w * two_g / c2
    P += cA
    B = pre.solve(P)
    sigma = (two_g / c2) * Z
    sigma += B
    sigmaK = B * (-c2 / w)
    sigmaK += cA if w == 1 else cA / w
    return sigma, sigmaK


def _residual_unless_above(sp, Z, A, gs):
    """``(W, residual)`` at ``W0 + Z X~^T``, or ``(None, inf)`` where data-space figures prove
    the residual ``max|g| / (1 + scale)`` above ``tol`` without forming W (``proves_above``;
    ``|a X~^T|_max <= max_i |a_i| sqrt(x2)`` bounds both terms of the scale, ``x2 = max_j
    |X~_j|^2``); maxima over the block's row shards."""
    p = sp.cg
    xp, prob = p.xp, p.objective
    maxima = [most(xp, prob.dot(A, A)), most(xp, prob.dot(Z, Z)), most(xp, gs)]
    a2, z2, g2 = (float(m) for m in p.comm.rows.reduce(maxima, "max"))
    scale = max(
        abs(prob.coef) * math.sqrt(a2 * sp.x2), 2 * prob.block.gamma * math.sqrt(z2 * sp.x2)
    )
    if proves_above(xp, xp.asarray(g2), prob.pre.c2, sp.W0.shape[1], scale, p.tol):
        return None, math.inf
    W = sp.W0 + Z @ prob.block.Xt.T
    return W, kkt(W, prob.block.grad_parts(W), comm=p.comm.rows)
