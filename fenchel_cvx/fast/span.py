"""A few warm-started WHidden steps in the span of the batch: ``W = W0 + Z X~^T``.

The batched model's hidden W-block (the paper's Sec. 3 W-update with its proximal term)

    min_W  lam B(V, W X~) + gamma ||W - W0||^2        (rho = 0, as in the paper's batched runs)

has the gradient ``g = (lam A + 2 gamma Z) X~^T`` wherever ``W - W0 = Z X~^T``
(``A = phi(W X~) - V``), and so does the Gram-preconditioned direction ``s = g G^{-1}`` of
``gram.DataGram`` (Woodbury, ``M = w K + c2 I``, ``K = X~^T X~``):

    s = sigma X~^T,    sigma = (2 gamma / c2) Z + B,    B = (lam A - (2 gamma w / c2)(U - U0)) M^{-1}

Starting at ``W = W0`` (``Z = 0``), every iterate of ``wblocks.solve_pncg``'s preconditioned
CG stays in that span. The iteration can therefore run on the m-column coefficients Z (m the
batch: 500 against the 785 rows of MNIST's W_0), with the images ``U = U0 + Z K`` and

    sigma K = (lam / w) A - (c2 / w) B        (from ``w K M^{-1} = I - c2 M^{-1}``)

known without a product, and every parameter-space inner product an elementwise one:
``<a X~^T, b X~^T> = <a, b K>``. A step costs one m x m triangular-solve pair and elementwise
work. ``W = W0 + Z X~^T`` is formed once, at the end; two n x m products a step are saved.

The iterates are ``solve_pncg``'s, up to rounding, as long as no semismooth-Newton row starts.
So this path serves capped solves of at most ``newton_start`` steps (the training regime,
``FastBackend(w_steps=k)``); longer solves and ``rho > 0`` stay in parameter space. The
residual of ``tol`` is bounded from data space, ``|g_ij| <= |r_i| |X~_j|``, and computed at W
only once that bound is below ``tol``: a capped solve may take a few more steps than the
parameter-space loop to notice a loose ``tol``, never reports one it did not reach.
"""
import math

from ._util import kkt


def applies(xp, block, W, pre, max_iter, newton_start):
    """Whether ``solve_span`` reproduces ``solve_pncg``'s capped solve: a data-space
    preconditioner, ``rho = 0 < gamma``, the start at the proximal centre and no Newton row."""
    return (pre.data_space and block.rho == 0 and block.gamma > 0 and max_iter <= newton_start
            and (W is block.W0 or (tuple(W.shape) == tuple(block.W0.shape)
                                   and bool(xp.all(W == block.W0)))))


def solve_span(xp, prob, W0, tol, max_iter, resync=16, capped_residual=True):
    """Up to ``max_iter`` PR+ CG steps of ``prob`` (a ``wblocks.HiddenRows``) from ``W0``, in
    the coefficients Z of ``W = W0 + Z X~^T``. -> ``(W, iterations, info)`` as ``solve_pncg``."""
    block, pre = prob.block, prob.pre
    U0 = block.U if block.U is not None and tuple(block.U.shape) == (
        W0.shape[0], block.Xt.shape[1]) else prob.forward(W0)
    Z, U = xp.zeros_like(U0), U0
    two_g = 2 * block.gamma
    x2 = float(xp.max(xp.sum(block.Xt * block.Xt, axis=1)))
    A = prob.data_grad(U)
    sigma, sigmaK = direction(pre, prob.coef, two_g, A, Z, U, U0)
    r = prob.coef * A                   # g = r X~^T, r = lam A + 2 gamma Z (Z = 0 here)
    gs = prob.dot(r, sigmaK)            # g G^{-1} g^T
    d, dU = -sigma, -sigmaK
    info = dict(method="pncg-span", line_search_iterations=0, restarts=0, newton_rows=0,
                row_iterations=0)
    restarts, converged, res, it = 0, False, math.nan, 0
    for it in range(1, max_iter + 1):
        gd = -gs if it == 1 else prob.dot(r, dU)
        t, nls = prob.search(two_g * prob.dot(Z, dU), 2 * prob.c * prob.dot(d, dU), U, dU, gd)
        info["line_search_iterations"] += nls
        info["row_iterations"] += Z.shape[0]
        Z, U = Z + t * d, U + t * dU
        if it % resync == 0:
            U = U0 + Z @ pre.K     # no drift of the incrementally updated U
        if it == max_iter and not capped_residual:
            break
        A = prob.data_grad(U)
        r = prob.coef * A + two_g * Z
        if _may_be_below(xp, r, x2, tol):
            W = W0 + Z @ block.Xt.T
            res = kkt(xp, W, block.grad_parts(W))
            if res <= tol:
                converged = True
                break
        if it == max_iter:
            break
        sigma_n, sigmaK_n = direction(pre, prob.coef, two_g, A, Z, U, U0)
        beta = prob.dot(r, sigmaK_n - sigmaK)
        beta = xp.clip(xp.where(gs > 0, beta / xp.where(gs > 0, gs, xp.ones_like(gs)),
                                xp.zeros_like(gs)), 0, None)
        d, dU = -sigma_n + beta * d, -sigmaK_n + beta * dU
        uphill = prob.dot(r, dU) >= 0
        restarts = restarts + xp.sum(xp.astype(uphill, xp.int64))
        d, dU = xp.where(uphill, -sigma_n, d), xp.where(uphill, -sigmaK_n, dU)
        sigma, sigmaK, gs = sigma_n, sigmaK_n, prob.dot(r, sigmaK_n)
    W = W0 + Z @ block.Xt.T
    if capped_residual and not converged:
        res = kkt(xp, W, block.grad_parts(W))
        converged = res <= tol
    info.update(converged=converged, restarts=int(restarts), residual=res,
                value=prob.value(W, U))
    return W, it, info


def direction(pre, coef, two_g, A, Z, U, U0):
    """``(sigma, sigma K)``: the preconditioned gradient ``s = sigma X~^T = g G^{-1}`` at
    ``W0 + Z X~^T`` and its image ``s X~``, from ``gram.DataGram``'s split with
    ``R = 2 gamma Z X~^T`` and ``P = R X~ = 2 gamma (U - U0)``."""
    w, c2 = pre.w, pre.c2
    B = pre.solve(coef * A - (w * two_g / c2) * (U - U0))
    return (two_g / c2) * Z + B, (coef / w) * A - (c2 / w) * B


def _may_be_below(xp, r, x2, tol):
    """Whether the residual ``max|g| / (1 + scale)`` can be ``<= tol``: ``|g_ij| = |r_i . X~_j|
    <= |r_i|_2 |X~_j|_2`` bounds it above (``x2 = max_j |X~_j|_2^2``); only then is ``W``
    formed and its residual computed."""
    r2 = float(xp.max(xp.sum(r * r, axis=1)))
    return math.sqrt(r2 * x2) <= tol
