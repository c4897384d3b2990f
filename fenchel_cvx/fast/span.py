"""A few warm-started WHidden steps in the span of the batch: ``W = W0 + Z X~^T``.

The batched model's hidden W-block (the paper's Sec. 4.5.2 W-update with its proximal term,
eq. (19))

    min_W  lam B(V, W X~) + gamma ||W - W0||^2        (rho = 0, as in the paper's batched runs)

has the gradient ``g = (lam A + 2 gamma Z) X~^T`` wherever ``W - W0 = Z X~^T``
(``A = phi(W X~) - V``), and so does the Gram-preconditioned direction ``s = g G^{-1}`` of
``gram.DataGram`` (Woodbury, ``M = w K + c2 I``, ``K = X~^T X~``):

    s = sigma X~^T,  sigma = (2 gamma / c2) Z + B,  B = (lam A - (2 gamma w / c2)(U - U0)) M^{-1}

Starting at ``W = W0`` (``Z = 0``), every iterate of ``wblocks.solve_pncg``'s preconditioned
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
(``_util.proves_above``, as ``wblocks._CG._above``). A solve never reports a ``tol`` it did not
reach: ``converged`` comes from the block's residual at the returned W. Nor does it end above
its start: the image ``s X~`` above is a difference of two terms of size ``|A| / w`` and near
the optimum loses its relative accuracy (then the line search's own safeguard, which tests
the rise on it, is blind), so an unconverged solve forms ``W X~`` at its end and puts back the
start's rows where the value rose (``_util.keep_descent``). An untested solve (a
capped one that reports no residual, ``solve_pncg``) runs all its steps with no stopping test,
and reads nothing back to the host where reads are not cheap (``arrays.cheap_reads``).
"""

import math

from ..arrays import cheap_reads, host_if_cheap
from ._util import RESYNC, keep_descent, kkt, pr_plus, proves_above


def applies(xp, block, W, pre, max_iter, newton_start, newton_cap=None):
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


def solve_span(
    xp, prob, W0, tol, max_iter, resync=RESYNC, capped_residual=True, capped_value=True, tested=True
):
    """Up to ``max_iter`` PR+ CG steps of ``prob`` (a ``wblocks.HiddenRows``) from ``W0``, in
    the coefficients Z of ``W = W0 + Z X~^T``. -> ``(W, iterations, info)`` as ``solve_pncg``;
    ``tested=False``: all ``max_iter`` steps, no stopping test."""
    block, pre = prob.block, prob.pre
    U0 = getattr(block, "U", None)  # W0 X~ from the caller (``_util.started``), where it fits
    if U0 is None or tuple(U0.shape) != (W0.shape[0], block.Xt.shape[1]):
        U0 = prob.forward(W0)
    # Z, U, d and dU are this loop's own arrays, updated in place (U0 stays: U - U0 is P)
    Z, U = xp.zeros_like(U0), xp.asarray(U0, copy=True)
    two_g = 2 * block.gamma
    x2 = pre.xt_norm2(xp) if tested else None  # max_j |X~_j|^2, rows of X~
    info = dict(
        method="pncg-span", line_search_iterations=0, restarts=0, newton_rows=0, row_iterations=0
    )
    A = prob.data_grad(U)
    r = prob.coef * A  # g = r X~^T, r = lam A + 2 gamma Z (Z = 0 here)
    sigma, sigmaK = direction(pre, two_g, r, Z, U, U0)
    gs = prob.dot(r, sigmaK)  # g G^{-1} g^T, per row
    W, res = None, math.inf
    if tested:
        W, res = _residual_unless_above(xp, prob, W0, Z, A, gs, x2, tol)
    if res <= tol:  # the start is optimal: no step, as solve_pncg
        info.update(converged=True, residual=res, value=prob.value(W0, U0))
        return W0, 0, info
    d, dU, gd = -sigma, -sigmaK, -gs  # gd: the slope <g, d> along d
    restarts, converged, res, it = 0, False, math.nan, 0
    for it in range(1, max_iter + 1):
        t, nls = prob.search(two_g * prob.dot(Z, dU), 2 * prob.c * prob.dot(d, dU), U, dU, gd)
        info["line_search_iterations"] += nls
        info["row_iterations"] += Z.shape[0]
        Z += t * d
        U += t * dU
        restart = None
        if it % resync == 0:
            U = U0 + Z @ pre.K  # no drift of the incrementally updated U
            # and CG restarts: the re-formed U moves the gradient of rows already converged to
            # rounding by more than their gradient, and PR+ scaled that noise by up to 4e5
            restart = xp.ones_like(gs) > 0
        if it == max_iter:
            break
        A = prob.data_grad(U)
        cA = prob.coef * A
        r = cA + two_g * Z
        sigma_n, sigmaK_n = direction(pre, two_g, cA, Z, U, U0)
        gs_n = prob.dot(r, sigmaK_n)
        if tested:
            W, res = _residual_unless_above(xp, prob, W0, Z, A, gs_n, x2, tol)
            if res <= tol:
                converged = True
                break
        beta, uphill, gd = pr_plus(xp, gs_n, prob.dot(r, sigmaK), gs, prob.dot(r, dU), restart)
        restarts = restarts + xp.sum(xp.astype(uphill | (restart is not None), xp.int64))
        d *= beta
        d -= sigma_n
        dU *= beta
        dU -= sigmaK_n
        sigmaK, gs = sigmaK_n, gs_n
    value = None
    if not converged:  # the descent guard, at the true image (``_util.keep_descent``)
        # W X~ = U0 + Z K: a product (0.3x the flops of W @ X~), not the direction's identity
        W, U, value, reverted = keep_descent(xp, block, W0, U0, W0 + Z @ block.Xt.T, U0 + Z @ pre.K)
        info["reverted_rows"] = host_if_cheap(xp, reverted, int)
        res = math.nan
        if capped_residual:
            res = kkt(xp, W, block.grad_parts(W))
            converged = res <= tol
    info.update(converged=converged, restarts=host_if_cheap(xp, restarts, int), residual=res)
    if converged and value is None:
        value = prob.value(W, U)
    if converged or capped_value:
        info["value"] = float(value)
    return W, it, info


def direction(pre, two_g, cA, Z, U, U0):
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


def _residual_unless_above(xp, prob, W0, Z, A, gs, x2, tol):
    """``(W, residual)`` at ``W0 + Z X~^T``, or ``(None, inf)`` where data-space figures prove
    the residual ``max|g| / (1 + scale)`` above ``tol`` without forming W (``proves_above``;
    ``|a X~^T|_max <= max_i |a_i| sqrt(x2)`` bounds both terms of the scale, ``x2 = max_j
    |X~_j|^2``)."""
    rows = lambda M: math.sqrt(float(xp.max(prob.dot(M, M))) * x2)  # noqa: E731
    scale = max(abs(prob.coef) * rows(A), 2 * prob.block.gamma * rows(Z))
    if proves_above(xp, gs, prob.pre.c2, W0.shape[1], scale, tol):
        return None, math.inf
    W = W0 + Z @ prob.block.Xt.T
    return W, kkt(xp, W, prob.block.grad_parts(W))
