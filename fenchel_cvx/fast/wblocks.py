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

This module holds what a step of the iteration works on: the blocks' problems (``HiddenRows``,
``LastLoss``: forward map, gradient, preconditioned direction, line search), the Gram
preconditioners, and the closed-form and Newton-CG solves. The nonlinear CG itself, ``init``
and ``step`` on an explicit state, is ``pncg.py``.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import math
from types import ModuleType
from typing import Any, NamedTuple

from array_api_compat import device

from ..arrays import Array, cheap_reads, matmul_nt, vecdot
from ..blocks import WBlock, WHidden, WLast
from ..reduce import LOCAL, Comm
from . import fused
from ._util import NEWTON_START, RESYNC, kkt, newton_1d
from .fused import EAGER
from .gram import DataGram, ParamGram, inverse_pays

#: points up to which Newton rows read ``K = X~^T X~`` formed once per solve (m x m: 134 MB in
#: float64 at 4,096); beyond, each row's entries among its active points (``active_gram``)
K_POINTS = 4096
#: the gathered columns of one chunk of Newton rows (``active_gram``)
GATHER_BYTES = 1 << 27
#: Newton-CG steps without halving the residual, at the precision's floor, that stop a solve
NEWTON_STALL = 10
#: CG iterations of a Newton-CG direction at most (``solve_newton``)
NEWTON_CG_ITER = 50


@dataclasses.dataclass(frozen=True)
class PncgSettings:
    """The options of the W-blocks' nonlinear CG (``pncg.solve_pncg``) that a backend fixes
    once for all its solves.

    ``resync``: steps between the re-formings of ``W X~`` (updated in between);
    ``newton_cap``: the largest active set of a Newton row (None: from the block's size, a
    Newton row's cost against a CG row's; 0: no Newton rows); ``flip_tol``: the active-set
    changes since the last iterate that a Newton row tolerates (None: 1 % of the points);
    ``newton_start``: the first step that may take Newton rows; ``compact_every``: steps
    between the freezings of converged rows; ``stall_window``: steps without halving the
    residual, at the precision's floor, that stop a solve; ``gram_reuse``: solves a
    parameter-space preconditioner serves (``gram_preconditioner``); ``capped_residual`` and
    ``capped_value``: whether a solve stopped by its step cap reports its residual and value;
    ``kernels``: how the line search's elementwise chains run (``fused``).

    >>> PncgSettings(newton_cap=0).newton_start
    10
    """

    resync: int = RESYNC
    newton_cap: int | None = None
    flip_tol: int | None = None
    newton_start: int = NEWTON_START
    compact_every: int = 8
    stall_window: int = 50
    gram_reuse: int = 1
    capped_residual: bool = True
    capped_value: bool = True
    kernels: Any = EAGER


#: the settings of a solve given none
DEFAULT_SETTINGS = PncgSettings()


class _Problem:
    """Shared pieces: the regulariser (as in blocks.WBlock), forward map, line search.

    ``comm``: the block's shards (``reduce.py``): split by columns (the block's X~ and targets
    are this shard's columns, W is whole), every sum over the columns (the gradient's data
    part, the line search's derivatives and change, the value) passes through its ``columns``
    role; split by rows (this shard's rows of W, every column), the value's sum over the rows
    through its ``rows`` role. A subclass gives the data term: ``coef``, ``data_value``,
    ``data_grad``, ``dot`` and, for the line search, ``data_derivs`` and ``data_change`` (or
    its own ``derivs_at``, ``data_curv`` and ``change_along``)."""

    #: the data term's factor in the gradient: ``coef A X~^T`` with ``A = data_grad(U)``
    coef: Any

    def data_value(self, U: Array) -> Array:
        """The data term's value at ``U = W X~`` (this shard's columns)."""
        raise NotImplementedError

    def data_grad(self, U: Array) -> Array:
        """The data term's gradient in U, divided by ``coef``."""
        raise NotImplementedError

    def dot(self, A: Array, B: Array) -> Array:
        """The inner product of A and B by which the line search's lengths are taken: per
        row (a column) where the rows are independent, else over the whole (1 x 1)."""
        raise NotImplementedError

    def data_derivs(self, Ut: Array, dU: Array) -> tuple[Array, Array]:
        """The data term's first and second derivatives along dU at Ut."""
        raise NotImplementedError

    def data_change(self, U: Array, dU: Array) -> tuple[Array, Array]:
        """``(change, size)``: the data term's change from U to U + dU, and the size of the
        terms it sums."""
        raise NotImplementedError

    def __init__(self, xp, block, pre, kernels=EAGER, comm=LOCAL):
        self.xp, self.block, self.pre, self.comm = xp, block, pre, comm
        self.kernels = kernels  # how the line search's chains and iterations run (``fused``)
        self.Xt, self.rho, self.gamma, self.W0 = block.Xt, block.rho, block.gamma, block.W0
        self.c = self.rho + self.gamma
        self.U0 = None  # W0 X~, for the data-space preconditioner's P (``start``)

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
        (G,) = self.comm.columns.reduce([matmul_nt(A, self.Xt)], "sum")  # A X~^T, every column
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
        (data,) = self.comm.columns.reduce([self.data_value(U)], "sum")
        (value,) = self.comm.rows.reduce([data + self.block._reg_value(W)], "sum")
        return float(value)

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

        comm = self.comm.columns
        # each trial may also sum the data term's change at its length, in the same chain and
        # collective as its derivatives (``safeguard_in_trials``): the descent safeguard then
        # reads it wherever the search returns the length it tried last
        last: list[Any] | None = [] if self.safeguard_in_trials(U, dU) else None

        def derivs(t):
            if last is None:
                d1, d2 = comm.reduce(self.derivs_at(U, dU, t), "sum")
            else:
                d1, d2, *change = comm.reduce(self.derivs_change_at(U, dU, t), "sum")
                last[:] = [t, change]
            return d1 + slope + curv * t, d2 + curv

        (curv0,) = comm.reduce([self.data_curv(U, dU)], "sum")
        curv0 = curv0 + curv  # derivs(0)[1]: U + 0 dU is U
        pos = curv0 > 0
        t0 = xp.where(pos, -gd / xp.where(pos, curv0, xp.ones_like(curv0)), xp.ones_like(gd))
        t0 = xp.where(t0 > 0, t0, xp.ones_like(t0))
        hi, narrowing = xp.full_like(t0, xp.inf), 0
        if lo is None:
            lo = xp.zeros_like(t0)
        else:
            t0, lo, hi, narrowing = _narrow(xp, derivs, xp.where(t0 > lo, t0, 2 * lo), lo)
        t, lo, nls = newton_1d(
            xp, derivs, t0, (lo, hi), rtol * xp.abs(gd), max_iter=max_iter, kernels=self.kernels
        )
        if narrowing:
            nls = nls + narrowing
        # descent safeguard: lo < t* and the objective decreases on [0, t*]
        if last is None:
            change, size = comm.reduce(self.change_along(U, dU, t), "sum")
        else:
            if not bool(xp.all(t == last[0])):  # a length not tried (a step below rounding, the
                derivs(t)  # cap): tried now, by the same chain (nothing new to compile mid-run)
            change, size = last[1]
        reg = (slope * t, 0.5 * curv * t * t)
        rise = change + reg[0] + reg[1]
        # the rounding of rise: a few eps of the terms it sums
        slack = 8 * xp.finfo(t.dtype).eps * (1 + xp.abs(size) + xp.abs(reg[0]) + xp.abs(reg[1]))
        return xp.where(rise <= slack, t, lo), nls

    def derivs_at(self, U: Array, dU: Array, t: float | Array) -> tuple[Array, Array]:
        """The data term's first and second derivatives in t at ``U + t dU`` along dU."""
        Ut = t * dU
        Ut += U
        return self.data_derivs(Ut, dU)

    def data_curv(self, U: Array, dU: Array) -> Array:
        """The data term's second derivative along dU at U (``data_derivs``'s second part)."""
        return self.data_derivs(U, dU)[1]

    def change_along(self, U: Array, dU: Array, t: float | Array) -> tuple[Array, Array]:
        """``data_change`` from U to ``U + t dU``."""
        return self.data_change(U, t * dU)

    def derivs_change_at(
        self, U: Array, dU: Array, t: float | Array
    ) -> tuple[Array, Array, Array, Array]:
        """``derivs_at`` and ``change_along`` at one length: ``(d1, d2, change, size)``."""
        return (*self.derivs_at(U, dU, t), *self.change_along(U, dU, t))

    def one_pass(self, U: Array, dU: Array) -> bool:
        """Whether ``derivs_change_at`` takes one pass over U and dU where ``derivs_at`` and
        ``change_along`` take one each (a chain compiled into one kernel)."""
        return False

    def safeguard_in_trials(self, U: Array, dU: Array) -> bool:
        """Whether each trial of the line search also sums the data term's change at its length:
        where that saves a collective (column shards) or a pass (``one_pass``), and reads are
        cheap (the safeguard compares the returned length with the last one tried). Elsewhere
        the safeguard takes a pass and a collective of its own, and each trial none extra."""
        return cheap_reads(self.xp) and (self.comm.columns.P > 1 or self.one_pass(U, dU))


class HiddenRows(_Problem):
    """WHidden: rows are independent; per-row inner products, step lengths and Newton rows."""

    def __init__(self, xp, block, pre, settings=None, K=None, comm=LOCAL):
        settings = DEFAULT_SETTINGS if settings is None else settings
        super().__init__(xp, block, pre, kernels=settings.kernels, comm=comm)
        self.act, self.V, self.lam = block.act, block.V, block.lam
        self.coef, self.K = block.lam, K if K is not None else getattr(pre, "K", None)
        n1, m = self.Xt.shape
        newton_cap = settings.newton_cap
        if newton_cap is None:  # a Newton row costs ~ (2/3) a^3, a CG row ~ 4 n1 m per iteration
            newton_cap = int(min(n1, m, round((24.0 * n1 * m) ** (1 / 3))))
        self.newton_cap = newton_cap
        # active-set changes (since the last iterate) tolerated for a Newton row
        self.flip_tol = max(2, m // 100) if settings.flip_tol is None else settings.flip_tol
        (self.p0,) = comm.rows.reduce([block.V.shape[0]], "sum")  # rows at the solve's start
        self.newton_start = settings.newton_start  # early iterations change active sets: CG only
        self._largest_k = None  # max |K_jk|, once (``largest_k``)

    def of_rows(self, block: WHidden, keep: Array) -> HiddenRows:
        """This problem on ``block``, a part of the solve's block (the rows still iterated),
        ``keep`` the indices of those rows among this problem's: the preconditioner, ``K``, the
        Newton settings and the row count at the start stay."""
        sub = copy.copy(self)
        sub.block, sub.V, sub.W0 = block, block.V, block.W0
        sub.U0 = None if self.U0 is None else self.xp.take(self.U0, keep, axis=0)
        return sub

    def dot(self, A: Array, B: Array) -> Array:
        """``sum_j A_ij B_ij`` per row, as a column (``vecdot``: in NumPy one pass, no product
        array)."""
        return self.xp.reshape(vecdot(A, B), (-1, 1))

    def data_grad(self, U: Array) -> Array:
        return self.act.grad_u(self.V, U)

    def data_value(self, U: Array) -> Array:
        return self.lam * self.xp.sum(self.act.divergence(self.V, U))

    # the line search's chains on p x m arrays (most of a W solve's elementwise work), one
    # fused kernel each where ``kernels`` compiles them (``fused``)
    def derivs_at(self, U: Array, dU: Array, t: float | Array) -> tuple[Array, Array]:
        return self.kernels(fused.row_derivs)(self.act, self.lam, self.V, U, dU, t)

    def data_curv(self, U: Array, dU: Array) -> Array:
        return self.kernels(fused.row_curv)(self.act, self.lam, U, dU)

    def change_along(self, U: Array, dU: Array, t: float | Array) -> tuple[Array, Array]:
        """``(change, size)``: the data term's change from U to ``U + t dU`` per row, and the
        size of the terms it sums (its rounding scale)."""
        return self.kernels(fused.row_change)(self.act, self.lam, self.V, U, dU, t)

    def derivs_change_at(
        self, U: Array, dU: Array, t: float | Array
    ) -> tuple[Array, Array, Array, Array]:
        """``derivs_at`` and ``change_along`` at one length, one chain."""
        return self.kernels(fused.row_derivs_change)(self.act, self.lam, self.V, U, dU, t)

    def one_pass(self, U: Array, dU: Array) -> bool:
        return self.kernels.fuses(U, dU)

    def precondition(
        self, g: Array, A: Array, R: Array, U: Array, it: int, prev_active: Array | None = None
    ) -> tuple[Array, Array | None, Array | None, Array | None]:
        """``(s, s X~ or None, newton_rows, active)``: ``g G^{-1}`` after ``it`` steps, with exact
        Newton rows where the active set is small and did not change since ``prev_active`` (the
        previous iterate's; ``active`` is only formed once Newton rows may start)."""
        xp = self.xp
        s, sU = self.base_step(g, A, R, U)
        if self.newton_cap <= 0 or it + 1 < self.newton_start:
            return s, sU, None, None
        active = self.act.dphi(U) > 0
        if prev_active is None or it < self.newton_start:
            return s, sU, None, active
        counts = xp.sum(xp.astype(active, xp.int64), axis=1)
        flips = xp.sum(xp.astype(active != prev_active, xp.int64), axis=1)
        # per-iteration Newton budget ~ p0 cap^3: the cap grows as rows are frozen
        (p_all,) = self.comm.rows.reduce([g.shape[0]], "sum")
        cap = int(self.newton_cap * (self.p0 / p_all) ** (1 / 3))
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

    def newton_rows(self, g: Array, U: Array) -> Array:
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

    def largest_k(self) -> float:
        """``max |K_jk|`` (``X~`` is fixed through a solve: formed once): ``K``'s own, or
        without ``K`` its largest diagonal entry, the largest column norm (Cauchy-Schwarz)."""
        if self._largest_k is None:
            xp, K = self.xp, self.K
            A = xp.sum(self.Xt * self.Xt, axis=0) if K is None else xp.abs(K)
            self._largest_k = float(xp.max(A))
        return self._largest_k

    def active_gram(self, idx: Array) -> Array:
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

    def __init__(self, xp, block, pre, kernels=EAGER, comm=LOCAL):
        super().__init__(xp, block, pre, kernels=kernels, comm=comm)
        self.loss, self.Y = block.loss, block.Y

    def dot(self, A: Array, B: Array) -> Array:
        return self.xp.reshape(self.xp.sum(A * B), (1, 1))

    def data_grad(self, U: Array) -> Array:
        return self.loss.grad(self.Y, U)

    def data_value(self, U: Array) -> Array:
        return self.loss.value(self.Y, U)

    def data_derivs(self, Ut: Array, dU: Array) -> tuple[Array, Array]:
        d1, d2 = self.loss.line_derivs(self.Y, Ut, dU)
        return self.xp.reshape(d1, (1, 1)), self.xp.reshape(d2, (1, 1))

    def data_change(self, U: Array, dU: Array) -> tuple[Array, Array]:
        """``(change, size)``: the loss's change from U to U + dU and the size of the terms it
        sums (``loss.line_change``)."""
        change, size = self.loss.line_change(self.Y, U, dU)
        return self.xp.reshape(change, (1, 1)), self.xp.reshape(size, (1, 1))

    def precondition(
        self, g: Array, A: Array, R: Array, U: Array, it: int, prev_active: Array | None = None
    ) -> tuple[Array, Array | None, Array | None, Array | None]:
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


def gram_preconditioner(
    xp: ModuleType,
    block: WHidden | WLast,
    cache: dict[Any, Any] | None = None,
    reuse: int = 1,
    rows: int | None = None,
    comm: Comm = LOCAL,
) -> tuple[ParamGram | DataGram, str]:
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

    ``comm``: the block's column shards (``reduce.py``): the Gram matrix sums every shard's
    columns. Data space needs every column in one place: a block on more than one shard with
    fewer points than rows of X~ (and not MSE's) is refused (split such a block by rows).
    """
    Xt = block.Xt
    weights, shift, ridge = _gram_terms(block, xp, block.rho + block.gamma)
    if comm.columns.P > 1 and not ridge and not isinstance(block, WHidden):
        # (a hidden block on column shards has its points counted by ``pncg`` already: one
        # needing data space moved to rows; MSE's ridge never takes data space)
        _column_split_allowed(block, comm.columns)
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
    data = comm.columns.P == 1 and not ridge and Xt.shape[1] < Xt.shape[0]
    w = _scalar(xp, weights) if data else None
    if DataGram.applies(Xt, w, shift):
        pre = DataGram(xp, Xt, w, shift, inverse=rows is None or inverse_pays(Xt.shape[1], rows))
    else:
        pays = rows is None or inverse_pays(Xt.shape[0], rows * reuse)
        pre = ParamGram(xp, Xt, weights, shift, inverse=ridge or pays, comm=comm.columns)
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


def _column_split_allowed(block, comm):
    """A ``ValueError`` where a block split over its columns would need data space: fewer
    points in all than rows of X~ (the one-process solve would take ``DataGram``, which needs
    every column's Gram ``X~^T X~``)."""
    (points,) = comm.reduce([block.Xt.shape[1]], "sum")
    if points < block.Xt.shape[0]:
        raise ValueError(
            f"a W-block with fewer points ({points}) than rows of X~ ({block.Xt.shape[0]}) "
            "solves in data space, which needs every column: split it by rows, not columns "
            f"(got {comm.P} column shards)"
        )


def block_parts(block: WBlock, W: Array, comm: Comm = LOCAL) -> list[Array]:
    """``block.grad_parts(W)``, its data part summed over the block's column shards."""
    parts = block.grad_parts(W)
    (parts[0],) = comm.columns.reduce([parts[0]], "sum")
    return parts


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


def solve_ridge(
    xp: ModuleType,
    block: WLast,
    W: Array,
    tol: float,
    max_iter: int,
    cache: dict[Any, Any] | None = None,
    comm: Comm = LOCAL,
) -> tuple[Array, int, dict[str, Any]]:
    """WLast with MSE: the normal equations through the Cholesky inverse, then refinement;
    ``comm``: the block's column shards (``reduce.py``), over which every sum is taken."""
    pre: Any  # (MSE's ridge matrix: a ParamGram with its inverse, ``Ginv``)
    pre, factor_kind = gram_preconditioner(xp, block, cache, comm=comm)
    Ginv = pre.Ginv
    (R,) = comm.columns.reduce([block.Y @ block.Xt.T], "sum")
    if block.gamma:
        R = R + block.gamma * block.W0
    W = R @ Ginv
    parts = block_parts(block, W, comm)
    it, res, stalled = 1, kkt(W, parts), False
    # iterative refinement (G^{-1} may be inexact in float32) with the gradient the residual
    # was formed from, while each step lowers the residual: a step that does not is at the
    # working precision's floor, where it only stirs rounding (and is not taken)
    while res > tol and it < max_iter:
        Wn = W - 0.5 * sum(parts[1:], parts[0]) @ Ginv
        parts_n = block_parts(block, Wn, comm)
        res_n = kkt(Wn, parts_n)
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
    xp: ModuleType,
    block: WLast,
    W: Array,
    tol: float,
    max_iter: int,
    cache: dict[Any, Any] | None = None,
    settings: PncgSettings = DEFAULT_SETTINGS,
    comm: Comm = LOCAL,
) -> tuple[Array, int, dict[str, Any]]:
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
    where, at the working precision's floor (residual below sqrt(eps)), ``NEWTON_STALL`` steps
    do not halve the residual (``info["stalled"]``): far from the optimum the residual of a
    piecewise loss need not fall while the active pieces change. The steps are
    ``newton_init`` and ``newton_step`` on a ``NewtonState``.
    ``settings.capped_residual=False``: a capped solve reports the residual as NaN;
    ``settings.capped_value=False``: no value. ``comm``: the block's column shards
    (``reduce.py``), over which every sum is taken."""
    pre, factor_kind = gram_preconditioner(xp, block, cache, comm=comm)
    prob = LastLoss(xp, block, pre, comm=comm)
    s = newton_init(prob, W)
    while s.res > tol and s.it < max_iter and not s.stalled:
        s = newton_step(prob, s)
    W, converged = s.W, s.res <= tol
    reported = converged or settings.capped_residual
    res = kkt(W, block_parts(block, W, comm), block.project) if reported else math.nan
    info = dict(
        method="newton",
        cached_factor=factor_kind != "new",
        line_search_iterations=s.line_search_iterations,
        cg_iterations=s.cg_iterations,
        stalled=s.stalled,
        converged=converged,
        residual=res,  # the block's own residual at W (``blocks.kkt_residual``'s formula)
    )
    if converged or settings.capped_value:
        info["value"] = prob.value(W, s.U)
    return W, s.it, info


class NewtonState(NamedTuple):
    """A Newton-CG solve (``solve_newton``) after ``it`` steps: the point ``W``, its image
    ``U = W X~``, the gradient's ``parts`` and KKT residual ``res``; the best residual so far
    and its step (the stall test); the line searches' and CG's iterations."""

    W: Array
    U: Array
    parts: list[Array]
    res: float
    best: float
    best_it: int
    it: int
    stalled: bool
    line_search_iterations: int
    cg_iterations: int


def newton_init(prob: LastLoss, W: Array) -> NewtonState:
    """The state at the start ``W``."""
    U = prob.forward(W)
    parts, _ = prob.gradient(W, U)
    return NewtonState(W, U, parts, kkt(W, parts), math.inf, 0, 0, False, 0, 0)


def newton_step(prob: LastLoss, s: NewtonState) -> NewtonState:
    """One Newton-CG step from ``s``: the direction by preconditioned CG, the exact line search
    from the majorised length, the move; ``stalled`` where, at the working precision's floor,
    ``NEWTON_STALL`` steps have not halved the residual."""
    xp = prob.xp
    g = s.parts[0] + s.parts[1]
    d, k = _newton_direction(xp, prob, s.U, g)
    dU = prob.forward(d)
    gd = prob.dot(g, d)
    lo = _majorised_length(xp, prob, d, dU, gd)
    t, nls = prob.line_search(s.parts[1], s.U, d, dU, gd, lo=lo)
    W, it = s.W + t * d, s.it + 1
    U = prob.forward(W)
    parts, _ = prob.gradient(W, U)
    res, best, best_it, stalled = kkt(W, parts), s.best, s.best_it, False
    if res < 0.5 * best:
        best, best_it = res, it
    elif res <= math.sqrt(xp.finfo(W.dtype).eps) and it - best_it >= NEWTON_STALL:
        stalled = True  # at the precision's floor: no halving in a window
    return NewtonState(
        W, U, parts, res, best, best_it, it, stalled,
        s.line_search_iterations + nls, s.cg_iterations + k,
    )  # fmt: skip


def _majorised_length(xp, prob, d, dU, gd):
    """The majorise-minimise length along d, ``-<g, d> / (sum_j c_j |dU_j|^2 + 2 c |d|^2)``
    (``c_j``: ``Loss.column_curvature``, a bound on each column's Hessian): the block's slope
    along d is still <= 0 there, so the exact line search's bracket starts at it."""
    block = prob.block
    weights = block.loss.column_curvature(block.Y, xp)
    (data,) = prob.comm.columns.reduce([xp.sum(weights * xp.sum(dU * dU, axis=0))], "sum")
    bound = data + 2 * prob.c * xp.sum(d * d)
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


def _newton_direction(xp, prob, U, g, cg_iter=NEWTON_CG_ITER):
    """``(d, iterations)``: ``d ~ -H^{-1} g`` by preconditioned CG from 0 (``solve_newton``);
    the preconditioned gradient step where CG meets no positive curvature at once."""
    block, c2 = prob.block, 2 * prob.c
    loss, Y, Xt = block.loss, block.Y, block.Xt

    def hess(D):
        (HD,) = prob.comm.columns.reduce([loss.hvp(Y, U, D @ Xt) @ Xt.T], "sum")  # every column
        return HD + c2 * D

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
