"""W-blocks: closed-form ridge, and preconditioned nonlinear conjugate gradients.

    WHidden:  min_W  lam B(V, W X~) + rho ||W||^2 + gamma ||W - W0||^2
    WLast:    min_W  L(Y, W X~)     + rho ||W||^2 + gamma ||W - W0||^2

**WLast, MSE** is a ridge regression:  ``W (X~ X~^T + (rho + gamma) I) = Y X~^T + gamma W0``,
solved through the Cholesky factor of the Gram matrix, then refined in the working precision
(``W <- W - grad/2 G^{-1}``) until the KKT residual is below ``tol``.

**WHidden and WLast, cross-entropy** are smooth but badly conditioned: the Hessian of a row of
WHidden is ``H_i = lam X~ D_i X~^T + 2c I`` (``c = rho + gamma``, ``D_i = diag(phi'(W X~)_i)``),
whose spectrum spans ``||X~||^2`` (1e4 on MNIST) down to ``2c`` (1e-2). The iteration is
Polak-Ribiere+ nonlinear CG with an *exact* line search, preconditioned by

- the *shared* Gram matrix ``G = lam sup(phi') X~ X~^T + 2c I`` (cross-entropy:
  ``1/2 X~ diag(1^T Y) X~^T + 2c I``), which majorises every row's Hessian (``gram``): with at
  least as many points as rows of ``X~``, inverted once per solve (cached while ``X~`` is
  unchanged; ``gram_reuse=k``: reused for k solves also when ``X~`` changes, as between the
  batches of a run: a stale preconditioner is still positive definite, so every step still
  descends) and applied as one matrix product; with fewer points (a batch of 500 MNIST images
  against W_0's 785 rows), by Woodbury in data space: an m x m factorisation per solve, and a
  step that also gives ``d X~`` without a product;
- for the WHidden rows whose active set ``{j : phi'(u_ij) > 0}`` is small (a ReLU unit that
  fires on few points: exactly the rows that ``G`` preconditions badly, since every inactive
  point leaves a direction of curvature ``2c`` only) and has stopped changing, after the first
  10 iterations, the row's exact Hessian, inverted in data space by Woodbury,
  ``H_i^{-1} = (I - X~ S (eps I + S K S)^{-1} S X~^T) / 2c`` with ``S = D_i^{1/2}``,
  ``K = X~^T X~``, ``eps = 2c / lam``, restricted to the active points: a batched semismooth
  Newton step costing ``O(|A_i|^3)`` per row (``K`` formed once where m <= ``K_POINTS``; on
  more points each row's entries among its active points, ``O(|A_i|^2 n)``). The size cap
  balances that cost against a CG step and grows as rows converge.

Rows whose gradient is below ``tol / 2`` are frozen and dropped from the batch (on MNIST most
rows converge within ~50 iterations; a few units that fire on few points need hundreds).
WHidden is separable by rows, so every row gets its own step length from a bracketed 1-D Newton
method that only needs ``phi``, ``phi'`` on ``U + t dU`` (``W X~`` and ``d X~`` are updated, not
recomputed), and a step that would raise a row's objective falls back to the bracket's left end:
every step decreases the objective (the BCD descent check holds for any ``w_steps``).
Cross-entropy couples the rows and takes one step length for the whole matrix (``LastLoss``: the
line search asks the loss for its derivatives along the direction and its change,
``Loss.line_derivs`` and ``Loss.line_change``, stable in float32 for cross-entropy). The loss
chooses its last W-block's method (``Loss.last_w_solver``): MSE's closed form, cross-entropy's
nonlinear CG, and for any other loss the general path ``solve_newton``, Newton-CG on its own
gradient and Hessian products, preconditioned by the Gram matrix of its curvature bound
(``Loss.column_curvature``). The first step
is the majorise-minimise step ``-grad G^{-1}`` with an exact length (``w_steps=1``); up to 10
steps are plain preconditioned CG, the cheap regime of inexact training steps. There, with
``rho = 0`` and a data-space preconditioner, the iteration runs on the coefficients of
``W = W0 + Z X~^T`` without a product per step (``span``).
"""

import functools
import math

from array_api_compat import device

from ..arrays import cheap_reads, clip, host_if_cheap, matmul_nt, vecdot
from ..blocks import WHidden, WLast
from . import fused, span
from ._util import (
    NEWTON_START,
    RESYNC,
    keep_descent,
    kkt,
    newton_1d,
    part,
    pr_plus,
    proves_above,
)
from .fused import EAGER
from .gram import DataGram, ParamGram, inverse_pays

#: points up to which Newton rows read ``K = X~^T X~`` formed once per solve (m x m: 134 MB in
#: float64 at 4,096); beyond, each row's entries among its active points (``active_gram``)
K_POINTS = 4096
#: the gathered columns of one chunk of Newton rows (``active_gram``)
GATHER_BYTES = 1 << 27


class _Problem:
    """Shared pieces: the regulariser (as in blocks.WBlock), forward map, line search."""

    def __init__(self, xp, block, pre, U0=None, kernels=EAGER):
        self.xp, self.block, self.pre = xp, block, pre
        self.kernels = kernels  # how the line search's chains and iterations run (``fused``)
        self.Xt, self.rho, self.gamma, self.W0 = block.Xt, block.rho, block.gamma, block.W0
        self.c = self.rho + self.gamma
        self.U0 = U0  # W0 X~, for the data-space preconditioner's P (``start``)

    def start(self, W, U):
        """Before the first step: ``W0 X~`` where a data-space preconditioner needs it."""
        xp = self.xp
        if self.pre.data_space and self.gamma and self.U0 is None:
            # at the centre by identity (``fit_bcd``'s first round on a batch); an equal copy
            # is seen where reads are cheap, else W0 X~ is formed (no read)
            at_centre = W is self.W0 or (cheap_reads(xp) and bool(xp.all(W == self.W0)))
            self.U0 = U if at_centre else self.forward(self.W0)

    def forward(self, W):
        return self.block.forward(W)

    def gradient(self, W, U):
        """``(parts, A)``: the gradient's terms ``[coef A X~^T, R]`` and ``A`` (dL/dU / coef)."""
        A = self.data_grad(U)
        return self.parts(A, self.reg_grad(W)), A

    def parts(self, A, R):
        G = matmul_nt(A, self.Xt)  # A X~^T
        return [G if self.coef == 1 else self.coef * G, R]

    def base_step(self, g, A, R, U):
        """``(g G^{-1}, its image under X~ or None)``; ``A``, ``R``: ``gradient``'s parts."""
        if not self.pre.data_space:
            return self.pre.apply(g), None
        P = 2 * self.rho * U  # P = R X~ from U = W X~ (R = 2 rho W + 2 gamma (W - W0))
        if self.gamma and U is not self.U0:  # W = W0 at the start: that term is 0
            P = P + 2 * self.gamma * (U - self.U0)
        return self.pre.split(A if self.coef == 1 else self.coef * A, R, P)

    def value(self, W, U):
        """The block's value at W from ``U = W X~`` at hand (``block.value`` recomputes it)."""
        return float(self.data_value(U) + self.block._reg_value(W))

    def reg_grad(self, W):
        return self.block._reg_grad(W)

    def line_search(self, R, U, d, dU, gd, lo=None):
        """Minimise the objective along d from W (t >= 0; ``R`` the regulariser's gradient at W,
        ``U = W X~``); never increases it. -> (t, iterations). ``lo``: see ``search``."""
        # d/dt of the regulariser at t = 0, and its (constant) curvature
        return self.search(self.dot(R, d), 2 * self.c * self.dot(d, d), U, dU, gd, lo=lo)

    def search(self, slope, curv, U, dU, gd, rtol=0.1, max_iter=10, lo=None):
        """``line_search`` given the regulariser's slope and (constant) curvature along the
        direction (``span`` computes them in data space). The first trial is the Newton length
        at 0; where the slope there is still negative, that length is kept (``newton_1d``'s
        open bracket). ``lo``: a length at which the slope is known to be <= 0 (None: 0); the
        bracket from it is first narrowed geometrically (``_narrow``), and a length the search
        cannot confirm falls back to ``lo`` or beyond it, never to 0."""
        xp = self.xp

        def derivs(t):
            d1, d2 = self.derivs_at(U, dU, t)
            return d1 + slope + curv * t, d2 + curv

        curv0 = self.data_curv(U, dU) + curv  # derivs(0)[1]: U + 0 dU is U
        pos = curv0 > 0
        t0 = xp.where(pos, -gd / xp.where(pos, curv0, xp.ones_like(curv0)), xp.ones_like(gd))
        t0 = xp.where(t0 > 0, t0, xp.ones_like(t0))
        hi, narrowing = xp.full_like(t0, xp.inf), 0
        if lo is None:
            lo = xp.zeros_like(t0)
        else:
            t0, lo, hi, narrowing = _narrow(xp, derivs, xp.where(t0 > lo, t0, 2 * lo), lo)
        t, lo, nls = newton_1d(
            xp, derivs, t0, lo, hi, rtol * xp.abs(gd), max_iter=max_iter, kernels=self.kernels
        )
        if narrowing:
            nls = nls + narrowing
        # descent safeguard: lo < t* and the objective decreases on [0, t*]
        change, size = self.change_along(U, dU, t)
        reg = (slope * t, 0.5 * curv * t * t)
        rise = change + reg[0] + reg[1]
        # the rounding of rise: a few eps of the terms it sums
        slack = 8 * xp.finfo(t.dtype).eps * (1 + xp.abs(size) + xp.abs(reg[0]) + xp.abs(reg[1]))
        return xp.where(rise <= slack, t, lo), nls

    def derivs_at(self, U, dU, t):
        """The data term's first and second derivatives in t at ``U + t dU`` along dU."""
        Ut = t * dU
        Ut += U
        return self.data_derivs(Ut, dU)

    def data_curv(self, U, dU):
        """The data term's second derivative along dU at U (``data_derivs``'s second part)."""
        return self.data_derivs(U, dU)[1]

    def change_along(self, U, dU, t):
        """``data_change`` from U to ``U + t dU``."""
        return self.data_change(U, t * dU)


class HiddenRows(_Problem):
    """WHidden: rows are independent; per-row inner products, step lengths and Newton rows."""

    def __init__(
        self,
        xp,
        block,
        pre,
        K=None,
        newton_cap=None,
        flip_tol=None,
        p0=None,
        newton_start=NEWTON_START,
        U0=None,
        kernels=EAGER,
    ):
        super().__init__(xp, block, pre, U0, kernels)
        self.act, self.V, self.lam = block.act, block.V, block.lam
        self.coef, self.K = block.lam, K if K is not None else getattr(pre, "K", None)
        n1, m = self.Xt.shape
        if newton_cap is None:  # a Newton row costs ~ (2/3) a^3, a CG row ~ 4 n1 m per iteration
            newton_cap = int(min(n1, m, round((24.0 * n1 * m) ** (1 / 3))))
        self.newton_cap = newton_cap
        # active-set changes (since the last iterate) tolerated for a Newton row
        self.flip_tol = max(2, m // 100) if flip_tol is None else flip_tol
        self.p0 = block.V.shape[0] if p0 is None else p0  # rows at the start of the solve
        self.newton_start = newton_start  # early iterations change active sets: CG steps only
        self.it = 0  # set by the solver loop
        self._largest_k = None  # max |K_jk|, once (``largest_k``)

    def dot(self, A, B):
        """``sum_j A_ij B_ij`` per row, as a column (``vecdot``: in NumPy one pass, no product
        array)."""
        return self.xp.reshape(vecdot(A, B), (-1, 1))

    def data_grad(self, U):
        return self.act.grad_u(self.V, U)

    def data_value(self, U):
        return self.lam * self.xp.sum(self.act.divergence(self.V, U))

    # the line search's chains on p x m arrays (most of a W solve's elementwise work), one
    # fused kernel each where ``kernels`` compiles them (``fused``)
    def derivs_at(self, U, dU, t):
        return self.kernels(fused.row_derivs)(self.act, self.lam, self.V, U, dU, t)

    def data_curv(self, U, dU):
        return self.kernels(fused.row_curv)(self.act, self.lam, U, dU)

    def change_along(self, U, dU, t):
        """``(change, size)``: the data term's change from U to ``U + t dU`` per row, and the
        size of the terms it sums (its rounding scale)."""
        return self.kernels(fused.row_change)(self.act, self.lam, self.V, U, dU, t)

    def precondition(self, g, A, R, U, prev_active=None):
        """``(s, s X~ or None, newton_rows, active)``: ``g G^{-1}``, with exact Newton rows where
        the active set is small and did not change since ``prev_active`` (the previous
        iterate's; ``active`` is only formed once Newton rows may start)."""
        xp = self.xp
        s, sU = self.base_step(g, A, R, U)
        if self.newton_cap <= 0 or self.it + 1 < self.newton_start:
            return s, sU, None, None
        active = self.act.dphi(U) > 0
        if prev_active is None or self.it < self.newton_start:
            return s, sU, None, active
        counts = xp.sum(xp.astype(active, xp.int64), axis=1)
        flips = xp.sum(xp.astype(active != prev_active, xp.int64), axis=1)
        # per-iteration Newton budget ~ p0 cap^3: the cap grows as rows are frozen
        cap = int(self.newton_cap * (self.p0 / g.shape[0]) ** (1 / 3))
        small = (counts <= cap) & (flips <= self.flip_tol)
        k = int(xp.sum(xp.astype(small, xp.int64)))
        if k == 0:
            return s, sU, None, active
        if self.K is None and self.Xt.shape[1] <= K_POINTS:
            self.K = self.Xt.T @ self.Xt
        p = g.shape[0]
        rows = xp.argsort(xp.astype(xp.logical_not(small), xp.int8), stable=True)[:k]
        sn = self.newton_rows(xp.take(g, rows, axis=0), xp.take(U, rows, axis=0))
        # scatter the Newton rows back: row i reads s_all[where] (p + its rank if small)
        rank = xp.cumulative_sum(xp.astype(small, xp.int64)) - 1
        where = xp.where(small, p + rank, xp.arange(p, dtype=rank.dtype, device=device(rank)))
        s = xp.take(xp.concat([s, sn], axis=0), where, axis=0)
        return s, None, xp.reshape(small, (p, 1)), active

    def newton_rows(self, g, U):
        """``H_i^{-1} g_i`` for the given rows, in data space restricted to their active points."""
        xp, K = self.xp, self.K
        m = U.shape[1]
        c = max(self.c, 64 * xp.finfo(U.dtype).eps * self.largest_k() / m)
        eps = 2 * c / self.lam
        S = xp.sqrt(self.act.dphi(U))
        r = (g @ self.Xt) * S
        active = S > 0
        counts = xp.sum(xp.astype(active, xp.int64), axis=1, keepdims=True)
        a = max(int(xp.max(counts)), 1)
        order = xp.argsort(xp.astype(xp.logical_not(active), xp.int8), axis=1, stable=True)
        idx = order[:, :a]  # active points first, padded
        valid = xp.arange(a, device=device(counts))[None, :] < counts
        zero = xp.zeros((U.shape[0], a), dtype=U.dtype, device=device(U))
        Sc = xp.where(valid, xp.take_along_axis(S, idx, axis=1), zero)
        rc = xp.where(valid, xp.take_along_axis(r, idx, axis=1), zero)
        if K is None:
            Kc = self.active_gram(idx)
        else:
            flat = idx[:, :, None] * m + idx[:, None, :]
            Kc = xp.reshape(
                xp.take(xp.reshape(K, (-1,)), xp.reshape(flat, (-1,)), axis=0), tuple(flat.shape)
            )
        M = Sc[:, :, None] * Kc * Sc[:, None, :] + eps * xp.eye(a, dtype=U.dtype, device=device(U))
        z = xp.linalg.solve(M, rc[:, :, None])[:, :, 0] * Sc
        if a < m:  # back to all points: invert each row's permutation
            z = xp.concat(
                [z, xp.zeros((z.shape[0], m - a), dtype=z.dtype, device=device(z))], axis=1
            )
            z = xp.take_along_axis(z, xp.argsort(order, axis=1), axis=1)
        return (g - z @ self.Xt.T) / (2 * c)

    def largest_k(self):
        """``max |K_jk|`` (``X~`` is fixed through a solve: formed once): ``K``'s own, or
        without ``K`` its largest diagonal entry, the largest column norm (Cauchy-Schwarz)."""
        if self._largest_k is None:
            xp, K = self.xp, self.K
            A = xp.sum(self.Xt * self.Xt, axis=0) if K is None else xp.abs(K)
            self._largest_k = float(xp.max(A))
        return self._largest_k

    def active_gram(self, idx):
        """``X~_a^T X~_a`` for each row's points ``idx`` (rows x a): the entries of ``K`` that
        a Newton row reads, formed from X~'s columns where ``K`` itself (m x m) is too large;
        rows in chunks of at most ``GATHER_BYTES`` of gathered columns."""
        xp, Xt = self.xp, self.Xt
        n1, (rows, a) = Xt.shape[0], idx.shape
        chunk = max(1, GATHER_BYTES // (a * n1 * (xp.finfo(Xt.dtype).bits // 8)))
        out = []
        for i in range(0, rows, chunk):
            part = idx[i : i + chunk, :]
            r = part.shape[0]
            Xa = xp.reshape(xp.take(Xt, xp.reshape(part, (-1,)), axis=1), (n1, r, a))
            Xa = xp.permute_dims(Xa, (1, 2, 0))  # r x a x n1
            out.append(Xa @ xp.permute_dims(Xa, (0, 2, 1)))
        return xp.concat(out, axis=0)


class LastLoss(_Problem):
    """WLast with a loss that is not quadratic: one step length for the whole matrix, the
    exact line search on the loss's own derivatives along the direction (``line_derivs``) and
    its change (``line_change``: cross-entropy's is stable in float32)."""

    coef = 1.0

    def __init__(self, xp, block, pre, kernels=EAGER):
        super().__init__(xp, block, pre, kernels=kernels)
        self.loss, self.Y = block.loss, block.Y

    def dot(self, A, B):
        return self.xp.reshape(self.xp.sum(A * B), (1, 1))

    def data_grad(self, U):
        return self.loss.grad(self.Y, U)

    def data_value(self, U):
        return self.loss.value(self.Y, U)

    def data_derivs(self, Ut, dU):
        d1, d2 = self.loss.line_derivs(self.Y, Ut, dU)
        return self.xp.reshape(d1, (1, 1)), self.xp.reshape(d2, (1, 1))

    def data_change(self, U, dU):
        """``(change, size)``: the loss's change from U to U + dU and the size of the terms it
        sums (``loss.line_change``)."""
        change, size = self.loss.line_change(self.Y, U, dU)
        return self.xp.reshape(change, (1, 1)), self.xp.reshape(size, (1, 1))

    def precondition(self, g, A, R, U, prev_active=None):
        s, sU = self.base_step(g, A, R, U)
        return s, sU, None, None


@functools.singledispatch
def _gram_terms(block, xp, c):
    """``(weights, shift, ridge)`` of the block's Gram matrix ``X~ diag(weights) X~^T + shift I``
    (``ridge``: MSE's closed form, whose factor is the exact inverse)."""
    raise TypeError(f"no Gram preconditioner for a {type(block).__name__}")


@_gram_terms.register
def _(block: WHidden, xp, c):
    sup = block.act.dphi_max
    return block.lam * (1.0 if sup is None else sup), 2 * c, False


@_gram_terms.register
def _(block: WLast, xp, c):
    if block.loss.last_w_solver == "ridge":  # the ridge matrix itself (MSE's Hessian
        return 1.0, c, True  # 2 X~ X~^T + 2c I, halved)
    return block.loss.column_curvature(block.Y, xp), 2 * c, False


def gram_preconditioner(xp, block, cache=None, reuse=1, rows=None):
    """The preconditioner ``(w X~ S X~^T + shift I)^{-1}`` of a W-block (``gram``), cached while
    X~ is unchanged.

    ``w S``: ``lam sup(phi')`` for WHidden, ``1/2 diag(1^T Y)`` for cross-entropy, with shift
    ``2 (rho + gamma)``; for MSE ``w = 1`` and shift ``rho + gamma``: the ridge matrix itself.
    In data space (``DataGram``) where X~ has fewer columns than rows, the weight is a positive
    scalar (cross-entropy: one-hot targets) and the shift positive, and the block is not MSE's
    closed form; in parameter space (``ParamGram``) otherwise. ``reuse=k > 1``: a cached
    parameter-space factor also serves a block whose X~ or weights changed (same shape, dtype
    and shift), up to k solves in all: in batched training the next batch's Gram matrix is close
    to the last one's (a data-space factor, ~10x cheaper, is never reused stale, nor MSE's exact
    one). ``rows``: how many rows of gradient a solve preconditions at most (rows of W times the
    step cap; None: many), which decides whether the inverse pays (``gram.inverse_pays``).
    Returns ``(pre, factor_kind)``, one of "new" (factorised now), "same" (the kept factor of
    this Gram matrix) and "stale" (a kept factor of an earlier one, ``reuse``).

    A factor serves as "same" where X~ and the weights are the very arrays it was formed from,
    or, where reads are cheap (``arrays.cheap_reads``), equal ones. Elsewhere the contents are
    not compared (a read back to the host): a factor that must be exact (data space, MSE's) is
    then not kept at all, since an array changed in place would pass as the same one.
    """
    Xt = block.Xt
    weights, shift, ridge = _gram_terms(block, xp, block.rho + block.gamma)
    key = (type(block), ridge, block.layer)
    if cache is not None and key in cache:
        X_c, w_c, s_c, pre, uses = cache[key]
        if (
            s_c == shift
            and type(X_c) is type(Xt)
            and X_c.shape == Xt.shape
            and X_c.dtype == Xt.dtype
            and isinstance(w_c, float) == isinstance(weights, float)
        ):
            if _same(xp, X_c, w_c, Xt, weights):
                return pre, "same"
            if uses < reuse and not (pre.data_space or ridge):
                cache[key] = (X_c, w_c, s_c, pre, uses + 1)
                return pre, "stale"
    w = _scalar(xp, weights) if not ridge and Xt.shape[1] < Xt.shape[0] else None
    if DataGram.applies(Xt, w, shift):
        pre = DataGram(xp, Xt, w, shift, inverse=rows is None or inverse_pays(Xt.shape[1], rows))
    else:
        pays = rows is None or inverse_pays(Xt.shape[0], rows * reuse)
        pre = ParamGram(xp, Xt, weights, shift, inverse=ridge or pays)
    # the data-space factor's K serves the Newton rows and span's U = U0 + Z K, and MSE's ridge
    # inverse is the exact one, so those must be X~'s own: a copy (small X~), compared by its
    # contents; a CG parameter-space factor only preconditions, and a stale one still descends: a
    # reference (LeNet-5's conv patches, 70 MB a batch, are not copied again)
    exact = pre.data_space or ridge
    if cache is not None and (cheap_reads(xp) or not exact):
        if len(cache) >= 8:
            cache.clear()
        cache[key] = (xp.asarray(Xt, copy=True) if exact else Xt, weights, shift, pre, 1)
    return pre, "new"


def _same(xp, X_c, w_c, Xt, weights):
    """Whether a cached factor's ``X_c``, ``w_c`` are the block's ``Xt``, ``weights``: the same
    arrays, or, where reads are cheap, equal ones."""
    scalar = isinstance(weights, float)
    if X_c is Xt and (w_c is weights or (scalar and w_c == weights)):
        return True
    if not cheap_reads(xp) or not (w_c == weights if scalar else bool(xp.all(w_c == weights))):
        return False
    # a new batch differs in a sample of its columns already: that test first (LeNet-5's conv
    # patches begin with padding, the same in every batch: not the first column)
    step = max(1, Xt.shape[1] // 64)
    return bool(xp.all(X_c[:, ::step] == Xt[:, ::step])) and bool(xp.all(X_c == Xt))


def _scalar(xp, weights):
    """A float for scalar weights or a vector of equal entries (one-hot targets), else None."""
    if isinstance(weights, float):
        return weights
    hi = float(xp.max(weights))
    return hi if weights.shape[1] and float(xp.min(weights)) == hi else None


def solve_ridge(xp, block, W, tol, max_iter, cache=None):
    """WLast with MSE: the normal equations through the Cholesky inverse, then refinement."""
    pre, factor_kind = gram_preconditioner(xp, block, cache)
    Ginv = pre.Ginv
    R = block.Y @ block.Xt.T
    if block.gamma:
        R = R + block.gamma * block.W0
    W = R @ Ginv
    parts = block.grad_parts(W)
    it, res, stalled = 1, kkt(xp, W, parts), False
    # iterative refinement (G^{-1} may be inexact in float32) with the gradient the residual
    # was formed from, while each step lowers the residual: a step that does not is at the
    # working precision's floor, where it only stirs rounding (and is not taken)
    while res > tol and it < max_iter:
        Wn = W - 0.5 * sum(parts[1:], parts[0]) @ Ginv
        parts_n = block.grad_parts(Wn)
        res_n = kkt(xp, Wn, parts_n)
        if not res_n < res:
            stalled = True
            break
        it, W, parts, res = it + 1, Wn, parts_n, res_n
    return (
        W,
        it,
        dict(
            method="cholesky",
            refinements=it - 1,
            cached_factor=factor_kind != "new",
            converged=res <= tol,
            stalled=stalled,
        ),
    )


def solve_newton(
    xp,
    block,
    W,
    tol,
    max_iter,
    cache=None,
    cg_iter=50,
    stall_window=10,
    capped_residual=True,
    capped_value=True,
):
    """WLast with a loss that is neither quadratic nor solved by its own method: Newton-CG on
    the loss's own gradient and Hessian products (``Loss.grad``, ``Loss.hvp``).

    Each step solves ``H d = -g`` for the block's Hessian ``H D = hvp(Y, W X~, D X~) X~^T +
    2 (rho + gamma) D`` by conjugate gradients preconditioned by the Gram matrix ``X~
    diag(column_curvature) X~^T + 2c I`` (``gram_preconditioner``), to a relative residual of
    ``min(1/2, sqrt(|g|))`` (superlinear near the optimum), then takes the exact line search of
    ``LastLoss`` along d (never a rise), bracketed from below by the majorise-minimise length
    (``_majorised_length``): where most residuals sit in a piecewise loss's flat pieces (Huber's
    linear tails), the Hessian at W sees little curvature, the Newton length overshoots the
    minimiser along d by orders of magnitude, and the bracket from 0 would not close in the
    search's iterations; from that length every step lowers the value at least as much as the
    Gram majoriser's along d. Stops at a KKT residual ``<= tol``, after ``max_iter`` steps, or
    where, at the working precision's floor (residual below sqrt(eps)), ``stall_window`` steps
    do not halve the residual (``info["stalled"]``): far from the optimum the residual of a
    piecewise loss need not fall while the active pieces change.
    ``capped_residual=False``: a capped solve reports the residual as NaN; ``capped_value=False``:
    no value."""
    pre, factor_kind = gram_preconditioner(xp, block, cache)
    prob = LastLoss(xp, block, pre)
    U = prob.forward(W)
    parts, _ = prob.gradient(W, U)
    res, best, best_it = kkt(xp, W, parts), math.inf, 0
    stall_level = math.sqrt(xp.finfo(W.dtype).eps)
    info = dict(
        method="newton",
        cached_factor=factor_kind != "new",
        line_search_iterations=0,
        cg_iterations=0,
        stalled=False,
    )
    it = 0
    while res > tol and it < max_iter:
        g = parts[0] + parts[1]
        d, k = _newton_direction(xp, prob, U, g, cg_iter)
        dU = prob.forward(d)
        gd = prob.dot(g, d)
        lo = _majorised_length(xp, prob, d, dU, gd)
        t, nls = prob.line_search(parts[1], U, d, dU, gd, lo=lo)
        W, it = W + t * d, it + 1
        U = prob.forward(W)
        parts, _ = prob.gradient(W, U)
        res = kkt(xp, W, parts)
        info["line_search_iterations"] += nls
        info["cg_iterations"] += k
        if res < 0.5 * best:
            best, best_it = res, it
        elif res <= stall_level and it - best_it >= stall_window:
            info["stalled"] = True  # at the precision's floor: no halving in a window
            break
    converged = res <= tol
    info.update(converged=converged, residual=res if converged or capped_residual else math.nan)
    if converged or capped_value:
        info["value"] = prob.value(W, U)
    return W, it, info


def _majorised_length(xp, prob, d, dU, gd):
    """The majorise-minimise length along d, ``-<g, d> / (sum_j c_j |dU_j|^2 + 2 c |d|^2)``
    (``c_j``: ``Loss.column_curvature``, a bound on each column's Hessian): the block's slope
    along d is still <= 0 there, so the exact line search's bracket starts at it."""
    block = prob.block
    weights = block.loss.column_curvature(block.Y, xp)
    bound = xp.sum(weights * xp.sum(dU * dU, axis=0)) + 2 * prob.c * xp.sum(d * d)
    return -gd / xp.reshape(bound, (1, 1))


def _narrow(xp, derivs, t, lo, ratio=2.0, max_iter=60):
    """``(t, lo, hi, evaluations)``: a bracket ``lo < t < hi`` of the minimiser of a convex
    function of one length (``derivs(t) -> (f', f'')``, 1 x 1 arrays; ``f'(lo) <= 0``), from a
    trial ``t > lo``, within ``hi <= ratio lo`` (or the minimiser itself: ``f'(t) = 0``).

    The trial halves the bracket's logarithmic width at every evaluation (``sqrt(lo hi)``;
    times 4 while there is no upper end): a bracket of ``10^k`` closes in about ``log2 k`` + 1
    evaluations, where ``newton_1d``'s arithmetic halving needs ``3.3 k``. A Newton trial from a
    point of small curvature (Huber's linear tails) lands orders of magnitude past the
    minimiser, and the loss's curvature bound puts ``lo`` orders short of it (``solve_newton``).
    """
    hi = xp.full_like(t, xp.inf)
    if not bool(xp.all(lo > 0)):
        return t, lo, hi, 0
    for k in range(1, max_iter + 1):
        d1 = derivs(t)[0]
        if not bool(xp.all(d1 != 0)):
            return t, lo, t, k
        below = d1 < 0
        lo, hi = xp.where(below, t, lo), xp.where(below, hi, t)
        if bool(xp.all(hi <= ratio * lo)):
            return xp.sqrt(lo * hi), lo, hi, k
        t = xp.where(xp.isinf(hi), 4 * t, xp.sqrt(lo * hi))
    return t, lo, hi, max_iter


def _newton_direction(xp, prob, U, g, cg_iter):
    """``(d, iterations)``: ``d ~ -H^{-1} g`` by preconditioned CG from 0 (``solve_newton``);
    the preconditioned gradient step where CG meets no positive curvature at once."""
    block, c2 = prob.block, 2 * prob.c
    loss, Y, Xt = block.loss, block.Y, block.Xt

    def hess(D):
        return loss.hvp(Y, U, D @ Xt) @ Xt.T + c2 * D

    gnorm = math.sqrt(float(xp.sum(g * g)))
    stop = min(0.5, math.sqrt(gnorm)) * gnorm
    x, r = xp.zeros_like(g), -g
    z = prob.pre.apply(r)
    p, rz = z, float(xp.sum(r * z))
    for k in range(1, cg_iter + 1):
        Hp = hess(p)
        pHp = float(xp.sum(p * Hp))
        if not pHp > 0:
            return (x, k) if k > 1 else (z, k)
        alpha = rz / pHp
        x, r = x + alpha * p, r - alpha * Hp
        if math.sqrt(float(xp.sum(r * r))) <= stop:
            return x, k
        z = prob.pre.apply(r)
        rz_n = float(xp.sum(r * z))
        p, rz = z + (rz_n / rz) * p, rz_n
    return x, cg_iter


def _scatter_rows(xp, full, sub, rows):
    """``full`` with its rows ``rows`` (sorted global indices) replaced by ``sub``, with no
    in-place writes."""
    p, k = full.shape[0], rows.shape[0]
    ar = xp.arange(p, dtype=rows.dtype, device=device(rows))
    pos = clip(xp.searchsorted(rows, ar), 0, k - 1)
    hit = xp.take(rows, pos) == ar
    return xp.take(xp.concat([full, sub], axis=0), xp.where(hit, p + pos, ar), axis=0)


def solve_pncg(
    xp,
    block,
    W,
    tol,
    max_iter,
    cache=None,
    resync=RESYNC,
    newton_cap=None,
    flip_tol=None,
    newton_start=NEWTON_START,
    compact_every=8,
    stall_window=50,
    gram_reuse=1,
    capped_residual=True,
    capped_value=True,
    kernels=EAGER,
):
    """Preconditioned PR+ nonlinear CG with exact line search (WHidden; WLast with a loss whose
    ``last_w_solver`` is ``"pncg"``: cross-entropy). A loss whose ``last_w_solver`` is
    ``"newton"`` (the general path: Huber, any loss with ``grad`` and ``hvp``) goes to
    ``solve_newton``.

    WHidden rows whose gradient is below ``tol / 2`` are frozen every ``compact_every``
    iterations: the loop goes on with the remaining rows only (rows are independent). Near the
    working precision's floor (residual below sqrt(eps)), ``stall_window`` iterations without
    halving the residual stop the loop (``info["stalled"]``). ``capped_residual=False``: the
    gradient after the last allowed step is not formed, the residual is reported as NaN;
    ``capped_value=False``: nor is the value at the returned point (``info`` has none).
    ``kernels``: how the WHidden line search's elementwise chains run (``fused``).

    A capped solve (fewer steps than ``stall_window``) with ``capped_residual=False`` is
    untested: it runs all its ``max_iter`` steps with no test of its residual (at the start nor
    on the way) and freezes no rows, so that, where reads are not cheap
    (``arrays.cheap_reads``), its steps read nothing back to the host (the line search's Newton
    iterations run a fixed count, ``newton_1d``; ``info``'s counters stay 0-d arrays).
    """
    hidden = isinstance(block, WHidden)
    if not hidden and block.loss.last_w_solver == "newton":  # the loss's own choice
        return solve_newton(
            xp,
            block,
            W,
            tol,
            max_iter,
            cache,
            capped_residual=capped_residual,
            capped_value=capped_value,
        )
    pre, factor_kind = gram_preconditioner(
        xp, block, cache, reuse=gram_reuse, rows=W.shape[0] * max_iter
    )
    prob = (
        HiddenRows(
            xp,
            block,
            pre,
            newton_cap=newton_cap,
            flip_tol=flip_tol,
            newton_start=newton_start,
            kernels=kernels,
        )
        if hidden
        else LastLoss(xp, block, pre, kernels=kernels)
    )
    factor = dict(
        cached_factor=factor_kind != "new",
        stale_factor=factor_kind == "stale",
        data_space=pre.data_space,
    )
    tested = capped_residual or max_iter >= stall_window
    if hidden and span.applies(xp, block, W, pre, max_iter, newton_start, newton_cap):
        W, it, info = span.solve_span(
            xp, prob, W, tol, max_iter, resync, capped_residual, capped_value, tested
        )
        return W, it, {**info, **factor}
    cg = _CG(xp, block, prob, W)
    cg.info.update(factor)
    if cg.optimal_at_start(tol, tested):
        cg.info.update(converged=True, value=prob.value(W, cg.U))
        return W, 0, cg.info
    best, best_it = math.inf, 0
    stall_level = math.sqrt(xp.finfo(W.dtype).eps)
    converged, it = False, 0
    returns_image = getattr(block, "return_U", False)  # (``_util.started``)
    for it in range(1, max_iter + 1):
        final = it == max_iter and not capped_residual
        # the last step's image only where it is reported: a value, or the caller's (return_U)
        cg.step(it, resync, gradient=not final, image=not final or capped_value or returns_image)
        if final:
            r = math.nan
            break
        if tested:
            r = cg.residual()
            if r <= tol:
                r = cg.confirm(tol)
                if r <= tol:
                    converged = True
                    break
            if r <= 0.5 * best:
                best, best_it = r, it
            elif r <= stall_level and it - best_it >= stall_window:
                cg.info["stalled"] = True  # at the precision's floor: no halving in a window
                break
        if it == max_iter:
            break
        if hidden and tested and it % compact_every == 0:
            cg.compact(tol)
        cg.next_direction(it)
    return cg.finish(converged, r, it, value=converged or capped_value or "stalled" in cg.info)


class _CG:
    """The state of one ``solve_pncg`` run: the iterate ``W`` and ``U = W X~`` (updated, re-synced
    every ``resync`` steps), the gradient's parts, the direction ``d`` and, when known without a
    product, ``dU = d X~``; WHidden rows still iterated (``rows``) and the frozen ones' figures."""

    def __init__(self, xp, block, prob, W):
        self.xp, self.block, self.prob = xp, block, prob
        U = getattr(block, "U", None)  # W X~ at the start, from the caller (bcd's forward pass)
        ok = U is not None and tuple(U.shape) == (W.shape[0], block.Xt.shape[1])
        self.W, self.U = W, U if ok else prob.forward(W)
        self.start = (W, self.U)  # the descent guard's (``finish``)
        prob.start(W, self.U)
        self.A, R = prob.data_grad(self.U), prob.reg_grad(W)
        self.parts = [None, R]  # the data part: formed when needed
        self.W_full, self.rows = W, None  # rows: global indices of the rows still iterated
        self.frozen_r = self.frozen_scale = 0.0  # max |grad| and max |part| over frozen rows
        self.n_newton = self.n_restart = 0  # counters stay on the device until the end
        self.gd = None  # the slope <g, d> along d (None: -gs, d = -s at first)
        self.info = dict(
            method="pncg", line_search_iterations=0, restarts=0, newton_rows=0, row_iterations=0
        )

    def optimal_at_start(self, tol, tested=True):
        """Whether the start is optimal (no step then), and the first direction if not;
        ``tested=False``: never optimal, no test.

        In data space the direction comes first and needs no parameter-space gradient; where
        it proves the residual above ``tol`` (``_above``), or no test is asked for, that
        gradient is never formed."""
        prob, R = self.prob, self.parts[1]
        if prob.pre.data_space:
            s, sU, self.newton, self.active = prob.precondition(None, self.A, R, self.U)
            self.s, self.d, self.dU = s, -s, -sU
            # g G^{-1} g^T = s G s^T = w |s X~|^2 + c2 |s|^2: no cancellation near the optimum
            self.gs = prob.pre.w * prob.dot(sU, sU) + prob.pre.c2 * prob.dot(s, s)
            if not tested or self._above(tol):
                return False
        self.parts = prob.parts(self.A, R)
        g = self.parts[0] + self.parts[1]
        if tested and kkt(self.xp, self.W, self.parts) <= tol:
            return True
        if not prob.pre.data_space:
            s, sU, self.newton, self.active = prob.precondition(g, self.A, R, self.U)
            self.s, self.gs, self.d, self.dU = s, prob.dot(g, s), -s, None
        return False

    def _above(self, tol):
        """A bound proving the KKT residual ``max|g| / (1 + max_i max|part_i|)`` above ``tol``
        from data-space figures: ``G >= c2 I`` gives ``|g_i|_2^2 >= c2 g_i G^{-1} g_i^T``, and
        ``|coef A X~^T|_max <= coef max_i |A_i|_2 max_j |X~_j|_2``; half the bound must pass.
        Rounding in s can only make it pass where the residual is within a few eps of the
        start's terms (the tol floor is 64 eps): then a step is taken, never a false optimum."""
        xp, prob = self.xp, self.prob
        per = math.prod(self.W.shape) // math.prod(self.gs.shape)  # entries per inner product
        a2 = float(xp.max(xp.sum(self.A * self.A, axis=1)))
        x2 = prob.pre.xt_norm2(xp)
        scale = max(abs(prob.coef) * math.sqrt(a2 * x2), float(xp.max(xp.abs(self.parts[1]))))
        return proves_above(xp, self.gs, prob.pre.c2, per, scale, tol)

    def residual(self):
        """The KKT residual from the parts at hand, the frozen rows included."""
        xp, parts = self.xp, self.parts
        g = xp.abs(parts[0] + parts[1])
        scale = max(self.frozen_scale, *(float(xp.max(xp.abs(q))) for q in parts))
        return max(self.frozen_r, float(xp.max(g))) / (1.0 + scale)

    def step(self, it, resync, gradient=True, image=True):
        """The exact line search along d, the move, ``U = W X~`` updated where ``image``
        (``U + t dU``: an elementwise pass; ``finish`` reports it), and the gradient at the new
        point where ``gradient``."""
        xp, prob = self.xp, self.prob
        self.info["row_iterations"] += self.W.shape[0]
        if self.newton is not None:
            self.n_newton = self.n_newton + xp.sum(xp.astype(self.newton, xp.int64))
        dU = prob.forward(self.d) if self.dU is None else self.dU
        gd = -self.gs if self.gd is None else self.gd
        t, nls = prob.line_search(self.parts[1], self.U, self.d, dU, gd)
        self.info["line_search_iterations"] += nls
        self.W, self.U, self.dU = self.W + t * self.d, self.U + t * dU if image else None, dU
        if image and it % resync == 0:
            self.U = prob.forward(self.W)  # no drift of the incrementally updated W X~
        if gradient:
            self.parts, self.A = prob.gradient(self.W, self.U)

    def full(self):
        """The whole matrix: the rows iterated scattered back among the frozen ones."""
        return (
            self.W if self.rows is None else _scatter_rows(self.xp, self.W_full, self.W, self.rows)
        )

    def confirm(self, tol):
        """At a residual <= tol from the updated W X~: the block's own residual at W decides.
        W X~ is formed again: the loop goes on from it, or ``finish`` reports the value from it
        (exact, not drifted by the updates; all rows only, as ``finish`` needs)."""
        self.W_full = self.full()
        r = self.block.kkt_residual(self.W_full)
        if r > tol or self.rows is None:
            self.U = self.prob.forward(self.W)
        if r > tol:
            self.parts, self.A = self.prob.gradient(self.W, self.U)
        return r

    def compact(self, tol):
        """Freeze the WHidden rows whose gradient is below ``tol / 2`` (if enough of them)."""
        xp, parts = self.xp, self.parts
        row_g = xp.max(xp.abs(parts[0] + parts[1]), axis=1)
        done = row_g <= 0.5 * tol
        n_done = int(xp.sum(xp.astype(done, xp.int64)))
        if not (n_done >= max(1, self.W.shape[0] // 8) and n_done < self.W.shape[0]):
            return
        keep, drop = xp.nonzero(xp.logical_not(done))[0], xp.nonzero(done)[0]
        self.frozen_r = max(self.frozen_r, float(xp.max(xp.take(row_g, drop))))
        self.frozen_scale = max(
            self.frozen_scale, *(float(xp.max(xp.abs(xp.take(q, drop, axis=0)))) for q in parts)
        )
        self.W_full = self.full()
        self.rows = keep if self.rows is None else xp.take(self.rows, keep)
        old, block = self.prob, self.block
        sub = dict(V=xp.take(block.V, self.rows, axis=0))
        if block.W0 is not None:
            sub["W0"] = xp.take(block.W0, self.rows, axis=0)

        def rows_of(a):
            return None if a is None else xp.take(a, keep, axis=0)

        self.prob = HiddenRows(
            xp,
            part(block, **sub),
            old.pre,
            K=old.K,
            newton_cap=old.newton_cap,
            flip_tol=old.flip_tol,
            p0=old.p0,
            newton_start=old.newton_start,
            U0=rows_of(old.U0),
            kernels=old.kernels,
        )
        self.W, self.U, self.A, self.d, self.dU, self.s, self.gs, self.active = (
            rows_of(a)
            for a in (self.W, self.U, self.A, self.d, self.dU, self.s, self.gs, self.active)
        )
        self.parts = [rows_of(q) for q in parts]

    def next_direction(self, it):
        """The PR+ direction from the preconditioned gradient (steepest where it points uphill)."""
        xp, prob = self.xp, self.prob
        gn = self.parts[0] + self.parts[1]
        prob.it = it
        sn, snU, newton, self.active = prob.precondition(
            gn, self.A, self.parts[1], self.U, self.active
        )
        gs = prob.dot(gn, sn)
        beta, uphill, self.gd = pr_plus(
            xp, gs, prob.dot(gn, self.s), self.gs, prob.dot(gn, self.d), zero=newton
        )
        self.n_restart = self.n_restart + xp.sum(xp.astype(uphill, xp.int64))
        self.d = -sn + beta * self.d
        self.dU = None if snU is None or self.dU is None else -snU + beta * self.dU
        self.newton, self.s, self.gs = newton, sn, gs

    def finish(self, converged, r, it, value=True):
        """``(W, iterations, info)``; the residual and, where ``value``, the value from what is
        at hand (exact when converged; otherwise from W X~ updated in place, re-synced every
        ``resync`` steps). An unconverged hidden solve with a data-space preconditioner ends
        with the descent guard (``_util.keep_descent``: no row above its start), whose value,
        from the true W X~, is reported. ``info["U"]``: ``W X~`` at the returned W where it is
        at hand for every row (the solver's updated one, or the guard's true one)."""
        xp, guarded = self.xp, None
        U = self.U if self.rows is None and getattr(self.block, "return_U", False) else None
        if not converged:
            self.W_full = self.full()
            if self.prob.pre.data_space and isinstance(self.block, WHidden):
                # the line searches saw W X~ through the data-space identity: the guard at the
                # true image (``_util.keep_descent``); a reported residual is then the guarded
                # point's (a tested loop reads it back anyway)
                self.W_full, U, guarded, reverted = keep_descent(
                    xp, self.block, *self.start, self.W_full
                )
                self.info["reverted_rows"] = host_if_cheap(xp, reverted, int)
                if not math.isnan(r) and int(reverted):
                    r = kkt(xp, self.W_full, self.block.grad_parts(self.W_full))
        self.info.update(
            converged=converged,
            newton_rows=host_if_cheap(xp, self.n_newton, int),
            restarts=host_if_cheap(xp, self.n_restart, int),
            residual=r,
            U=U,
        )
        if guarded is not None:
            if value:
                self.info["value"] = float(guarded)
        elif value and self.rows is None:  # U = W X~ is at hand for all rows
            self.info["value"] = self.prob.value(self.W_full, self.U)
        return self.W_full, it, self.info
