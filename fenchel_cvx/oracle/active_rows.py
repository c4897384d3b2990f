"""The rows of a ReLU hidden W-block by an active-set Newton method (exact, for many points).

Row ``i`` of the hidden W-block (the paper's Sec. 4.5.2, eqs. (17) and (19); ``rows.py``) solves,
with ``c = rho + gamma > 0`` and ``q = lam X~ v_i + 2 gamma w0_i``,

    min_w  f(w) = lam/2 ||(X~^T w)_+||^2 - q^T w + c ||w||^2 ,

strongly convex and piecewise quadratic: on the piece where the active set
``A = {j : x~_j^T w > 0}`` is fixed, ``f`` is a quadratic with Hessian ``lam X~_A X~_A^T + 2c I``.
The oracle takes this method for ReLU blocks on many points (``rows.route``: above
``rows.ACTIVE_MIN`` points, or beyond ``rows.DUAL_SIDE`` points an input where the dual would be
taken; the ``active`` route of ``rows.solve``, which certifies each row by its recomputed gradient
and falls back to the primal route's Newton steps on the rows that miss it). ``rows.py``'s dual is
a nonnegative least squares in the ``m`` data points, its pivots factors of side up to ``m``; its
primal route forms the Hessian ``n^2 m`` afresh at every step. Here the Hessian's Gram
``G_A = X~_A X~_A^T`` is kept per row and updated by the points that change sides: formed first
at the start's sign pattern by the smaller of ``A`` and its complement ``I``
(``G_A = T - X~_I X~_I^T``, with ``T = X~ X~^T`` formed once per block: ``Rows``; cost
``n^2 min(|A|, |I|)``), then ``G += X~_in X~_in^T - X~_out X~_out^T`` (``n^2`` a point that
changes sides; formed again when the changes outnumber ``min(|A|, |I|)``). Inputs that are 0 at
every point (MNIST's border pixels) stay out of the Grams.

**Single-precision Grams.** On at least ``SINGLE_MIN`` points the Grams' products, and those of
their updates by the points that change sides, run in float32 (twice the float64 rate; MNIST's
full W_0 block: 0.74x the time) and are added up in float64; ``T`` stays float64, so a
complement ``T - X~_I X~_I^T`` errs by float32's rounding of the smaller part alone. Such a Gram
is the true one to about 1e-7 of its size, so its Newton step is inexact: the gradient contracts
by about 1e4 a step once the active set is right (cond. of ``lam G_A + 2c I`` up to 2e5 on
MNIST), there is no finite termination, and the row's residual alone decides when it stops. A
step that changes no point's side and leaves the residual above 1% of what it was, or a Gram
whose matrix is not positive definite, forms that row's Gram again in float64 (and its later
updates).

**First steps without a Gram.** A row that starts without a kept Gram (``solve_rows``' ``kept``)
first takes ``SCALED_STEPS`` steps ``d = -(lam alpha T + 2c I)^{-1} grad f``, with ``alpha``
the share of its points that are active: ``alpha T`` is what ``G_A`` would be if the active
points were drawn at random. One eigendecomposition of ``T`` a block serves every row and every
``alpha`` (``Rows.scaled``), so such a step costs the row's products with ``X~`` alone. They
bring the active set near its final one before the row forms its Gram: MNIST's W_0 from the
Xavier rows (32 rows, m = 60,000, one core) then forms its Grams with 1,496 points to change
sides on the first Newton step instead of 5,801, in 0.22 s a row instead of 0.27. Rows warm-
started near their minimiser gain nothing from them (0.18 s a row either way).

Each Newton step ``d = -(lam G_A + 2c I)^{-1} grad f`` takes Armijo's backtracking on ``f``
(``X~^T d`` computed once a step, ``u = X~^T w`` moved along it; each trial ``O(m)``); the
Cholesky factor of ``lam G_A + 2c I`` is kept while no point changes sides (a row's last steps
on a single-precision Gram, above, reuse it). The rows go in batches of ``BATCH``: their
products with ``X~`` (memory-bound matrix-vector products, half a row's time on MNIST one at a
time) become one matrix product a step. Finite termination: a full step that leaves the active
set unchanged lands on the zero of the piece's affine gradient, i.e. on the minimiser; a row
also stops when its KKT residual (``blocks.kkt_residual``'s scale, row by row) is at the target.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
from numpy.typing import ArrayLike
from scipy.linalg import cho_factor, cho_solve

from ..arrays import transposed

if TYPE_CHECKING:
    from ..blocks import WHidden

NEWTON_STEPS = 50
ARMIJO = 1e-4
# rows solved together: their products with X~ (m x n, read from memory at every step) are
# shared; each row keeps its own Gram (|S|^2 doubles: 4 MB on MNIST). MNIST's W_0 on 2 workers
# (150 rows each, m = 60,000): a warm worker's rows 7.5-8.4 s in batches of 75, 8.0-9.8 s in
# batches of 32, 7.8-8.3 s all at once (+0.4 GiB a worker)
BATCH = 75
#: points from which the Grams' products run in float32 (the module doc)
SINGLE_MIN = 4000
#: steps scaled by ``lam alpha T + 2c I`` before a row without a kept Gram forms its own
SCALED_STEPS = 2


def inputs(Xt: np.ndarray) -> np.ndarray:
    """``S``: the inputs (rows of ``X~``) that are nonzero at some point."""
    return np.flatnonzero(np.any(Xt != 0.0, axis=1))


def single(m: int) -> type | None:
    """The dtype of the Grams' products on ``m`` points where it is not float64 (float32 from
    ``SINGLE_MIN`` points: the module doc), else None."""
    return np.float32 if m >= SINGLE_MIN else None


@dataclass
class Rows:
    """The data every row shares. Only the inputs ``S`` that are nonzero at some point enter the
    Grams (MNIST: 718 of 785 with the bias; off ``S`` a row's Hessian is ``2c I`` and its Newton
    step exact by itself; ``inputs``): the points ``P = X~_S^T`` (``m x |S|``, C order, to
    gather points), of ``n`` inputs in all, the same in the Grams' precision ``G_src`` (float32
    on many points, the module doc; made here where not given), ``T = P^T P`` (formed on first
    use), and a gather buffer of ``m // 2 + 1`` points for the Grams and their updates in each
    precision (a fresh array of that size costs more in page faults than its copy).
    ``Rows.of(X~, lam, c)`` builds them from the block's data."""

    P: np.ndarray
    S: np.ndarray
    n: int
    lam: float
    c: float
    G_src: np.ndarray | None = field(default=None, repr=False)
    _T: np.ndarray | None = field(default=None, repr=False)
    _spectrum: tuple[np.ndarray, np.ndarray] | None = field(default=None, repr=False)
    _bufs: dict = field(default_factory=dict, repr=False)  # a gather buffer by dtype

    def __post_init__(self):
        if self.G_src is None:
            precision = single(self.P.shape[0])
            self.G_src = self.P if precision is None else self.P.astype(precision)
        self.exact = self.G_src.dtype == self.P.dtype

    @classmethod
    def of(cls, Xt: np.ndarray, lam: float, c: float) -> Rows:
        """The rows of the data ``X~`` (``n x m``)."""
        S = inputs(Xt)
        return cls(transposed(Xt, S), S, Xt.shape[0], lam, c)

    @property
    def T(self) -> np.ndarray:
        if self._T is None:
            self._T = self.P.T @ self.P
        return self._T

    @property
    def spectrum(self) -> tuple[np.ndarray, np.ndarray]:
        """``(values, vectors)`` of ``T`` (formed on first use)."""
        if self._spectrum is None:
            self._spectrum = np.linalg.eigh(self.T)
        return self._spectrum

    def scaled(self, g: np.ndarray, alpha: np.ndarray) -> np.ndarray:
        """``-(lam alpha_i T + 2c I)^{-1} g_i`` on ``S`` for each row ``g_i`` of ``g``,
        ``-g_i / 2c`` off it (``alpha``: a share in [0, 1] a row)."""
        d = -g / (2.0 * self.c)
        if self.S.size:
            values, vectors = self.spectrum
            scale = self.lam * alpha[:, None] * values[None, :] + 2.0 * self.c
            d[:, self.S] = -((g[:, self.S] @ vectors) / scale) @ vectors.T
        return d

    def forward(self, W: np.ndarray) -> np.ndarray:
        """``W X~`` (``b x m`` for ``b`` rows ``W``: one product for the batch)."""
        return W[:, self.S] @ self.P.T

    def back(self, V: np.ndarray) -> np.ndarray:
        """``V X~^T`` (``b x n`` for ``V`` of ``b x m``; 0 off ``S``)."""
        out = np.zeros((V.shape[0], self.n))
        out[:, self.S] = V @ self.P
        return out

    def _gather(self, idx, src):
        buf = self._bufs.get(src.dtype)
        if buf is None:
            buf = self._bufs[src.dtype] = np.empty(
                (self.P.shape[0] // 2 + 1, self.S.size), src.dtype
            )
        return np.take(src, idx, axis=0, out=buf[: idx.size], mode="clip")

    def _outer(self, idx, src):
        """``X~_idx X~_idx^T`` on ``S`` (products in ``src``'s precision), in float64."""
        B = self._gather(idx, src)
        return (B.T @ B).astype(np.float64, copy=False)

    def _source(self, exact):
        """The points' rows for the Grams' products: in float64 (``exact``) or as the rows take
        them (None: ``self.exact``)."""
        return self.P if (self.exact if exact is None else exact) else self.G_src

    def gram(self, A: np.ndarray, exact: bool | None = None) -> np.ndarray:
        """``X~_{S,A} X~_{S,A}^T`` by the smaller of ``A`` and its complement (``exact``: in
        float64; None: as the rows take them, ``self.exact``)."""
        src = self._source(exact)
        k = int(A.sum())
        small = A if 2 * k <= A.size else ~A
        G = self._outer(np.flatnonzero(small), src)
        return G if small is A else self.T - G

    def update(
        self, G: np.ndarray, enter: np.ndarray, leave: np.ndarray, exact: bool | None = None
    ) -> np.ndarray:
        """``G + X~_in X~_in^T - X~_out X~_out^T`` in place (``enter``, ``leave``: masks), the
        products in ``G``'s precision (``exact`` as :meth:`gram`)."""
        src = self._source(exact)
        for mask, sign in ((enter, 1.0), (leave, -1.0)):
            idx = np.flatnonzero(mask)
            if idx.size:
                if sign > 0:
                    G += self._outer(idx, src)
                else:
                    G -= self._outer(idx, src)
        return G

    def factor(self, G: np.ndarray) -> tuple[np.ndarray, bool] | None:
        """The Cholesky factor of the piece's Hessian on ``S``, ``lam G + 2c I`` (None where
        ``S`` is empty); ``LinAlgError`` where it is not positive definite."""
        if not self.S.size:
            return None
        H = self.lam * G
        H[np.diag_indices(self.S.size)] += 2.0 * self.c
        return cho_factor(H, overwrite_a=True, check_finite=False)

    def newton(self, factor: tuple[np.ndarray, bool] | None, g: np.ndarray) -> np.ndarray:
        """``-(lam G + 2c I)^{-1} g`` on ``S`` (``factor``: :meth:`factor` of ``G``),
        ``-g / 2c`` off it."""
        d = -g / (2.0 * self.c)
        if factor is not None:
            d[self.S] = -cho_solve(factor, g[self.S], check_finite=False)
        return d

    def ridge(self, Q: np.ndarray) -> np.ndarray:
        """The rows' minimisers with every pre-activation positive, ``(lam T + 2c I) w = q``."""
        W = Q / (2.0 * self.c)
        if self.S.size:
            H = self.lam * self.T
            H[np.diag_indices(self.S.size)] += 2.0 * self.c
            W[:, self.S] = cho_solve(
                cho_factor(H, check_finite=False), Q[:, self.S].T, check_finite=False
            ).T
        return W


@dataclass
class RowReport:
    """One row's solve: Newton steps, points that changed sides at each step, the residual."""

    steps: int = 0
    changes: list = field(default_factory=list)
    residual: float = math.inf
    exact: bool = False  # stopped by finite termination (a full step, the active set unchanged)
    kept_gram: bool = False  # its first Gram updated from a kept one (``solve_rows``' grams)
    refined: bool = False  # its single-precision Gram formed again in float64 (``Rows``)


def _value(lam, q, c, w, u):
    up = np.maximum(u, 0.0)
    return 0.5 * lam * float(up @ up) - float(q @ w) + c * float(w @ w)


def row_residual(
    rows: Rows, Q: np.ndarray, W: np.ndarray, U: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Each row's scaled natural residual ``|grad f|_inf / (1 + max_i |g_i|_inf)`` (the scale of
    ``blocks.kkt_residual``, with the row's own gradient parts ``lam X~ u_+ - q`` and ``2c w``),
    for the rows ``W`` (``b x n``) with ``U = W X~``; returns ``(residuals, gradients)``."""
    g0 = rows.lam * rows.back(np.maximum(U, 0.0)) - Q
    g1 = 2.0 * rows.c * W
    g = g0 + g1
    scale = 1.0 + np.maximum(np.max(np.abs(g0), axis=1), np.max(np.abs(g1), axis=1))
    return np.max(np.abs(g), axis=1) / scale, g


def solve_row(
    rows: Rows, q: np.ndarray, w: np.ndarray, target: float, max_steps: int | None = None
) -> tuple[np.ndarray, RowReport]:
    """The argmin of one row from ``w``; returns ``(w, RowReport)``."""
    W, reports = solve_rows(rows, q[None, :], w[None, :], target, max_steps)
    return W[0], reports[0]


def solve_rows(
    rows: Rows,
    Q: np.ndarray,
    start: ArrayLike,
    target: float,
    max_steps: int | None = None,
    batch: int | None = None,
    kept: list[tuple[np.ndarray, np.ndarray] | None] | None = None,
) -> tuple[np.ndarray, list[RowReport]]:
    """The rows ``q_i`` of ``Q`` from the rows of ``start``, ``batch`` rows at a time
    (``BATCH``); returns ``(W, reports)``. ``kept``: a list of one ``(A, G)`` or ``None`` a
    row, the active set and Gram a row ended with in an earlier call on the same ``X~``: a row
    then starts from ``G`` updated by the points that changed sides (``n^2`` a point instead of
    ``n^2 min(|A|, |I|)``); the list is overwritten with the rows' final ``(A, G)``."""
    W = np.array(start, dtype=float)
    reports = [RowReport() for _ in range(Q.shape[0])]
    batch = BATCH if batch is None else int(batch)
    max_steps = NEWTON_STEPS if max_steps is None else int(max_steps)
    for lo in range(0, Q.shape[0], batch):
        k = slice(lo, min(lo + batch, Q.shape[0]))
        if kept is None:
            W[k] = _solve_batch(rows, Q[k], W[k], target, max_steps, reports[k])
        else:
            part = kept[k]
            W[k] = _solve_batch(rows, Q[k], W[k], target, max_steps, reports[k], part)
            kept[k] = part
    return W, reports


def _first_gram(rows, A, kept, report):
    """The Gram of the active set ``A``: from a kept ``(A0, G0)`` updated when fewer points
    changed sides than ``min(|A|, |I|)``, else formed."""
    if kept is not None:
        A0, G0 = kept
        enter, leave = A & ~A0, A0 & ~A
        k = int(A.sum())
        if int(enter.sum() + leave.sum()) <= min(k, A.size - k):
            report.kept_gram = True
            return rows.update(G0, enter, leave)
    return rows.gram(A)


def _direction(rows, grams, factors, A, g, k, report):
    """Row ``k``'s Newton direction, by the factor of its Gram (formed where the Gram changed
    since the last: ``factors[k]`` is None); a single-precision Gram whose matrix is not
    positive definite (its rounding larger than ``2c``) is formed again in float64 first."""
    if factors[k] is None:
        try:
            factors[k] = rows.factor(grams[k])
        except np.linalg.LinAlgError:
            if rows.exact or report.refined:
                raise
            _refine(rows, grams, factors, A, k, report)
            factors[k] = rows.factor(grams[k])
    return rows.newton(factors[k], g[k])


def _refine(rows, grams, factors, A, k, report):
    """Row ``k``'s single-precision Gram formed again in float64 (its factor dropped with it)."""
    grams[k], factors[k], report.refined = rows.gram(A[k], exact=True), None, True


def _solve_batch(rows, Q, W, target, max_steps, reports, kept=None):
    """Newton steps on the rows of a batch in lockstep: each row its own Gram, direction and
    line search; the products with ``X~`` (``u``, ``X~^T d``, the gradient) one for the batch.
    ``kept`` (``solve_rows``): overwritten with the rows' final ``(A, G)``."""
    lam, c = rows.lam, rows.c
    U = rows.forward(W)
    cold = [k for k in range(len(W)) if kept is None or kept[k] is None]
    _scaled_steps(rows, Q, W, U, np.array(cold, dtype=int), target)
    A = U > 0
    if kept is None:
        grams = [rows.gram(A[k]) for k in range(W.shape[0])]
    else:
        grams = [_first_gram(rows, A[k], kept[k], reports[k]) for k in range(W.shape[0])]
    factors = [None] * W.shape[0]  # each Gram's Cholesky factor, None once the Gram changed
    res, g = row_residual(rows, Q, W, U)
    live = np.flatnonzero(res > target)
    while live.size:
        live = live[[reports[k].steps < max_steps for k in live]]
        if not live.size:
            break
        D = np.stack([_direction(rows, grams, factors, A, g, k, reports[k]) for k in live])
        UD = rows.forward(D)
        for j, k in enumerate(live):
            t = _armijo(lam, c, Q[k], (W[k], U[k]), (D[j], UD[j]), float(g[k] @ D[j]))
            W[k] += t * D[j]
            U[k] += t * UD[j]  # u = w X~ along the step (the residual below recomputes g)
            # finite termination: a full step on an exact Gram, until the active set changes
            reports[k].exact = t == 1.0 and (rows.exact or reports[k].refined)
        before = res[live].copy()
        for k in live:
            if _new_active_set(rows, grams, A, U[k] > 0, k, reports[k]):
                factors[k] = None
        res[live], g[live] = row_residual(rows, Q[live], W[live], U[live])
        for j, k in enumerate(live if not rows.exact else ()):  # single precision: stuck rows
            stuck = not reports[k].changes[-1] and res[k] > 0.01 * before[j] and res[k] > target
            if stuck and not reports[k].refined:
                _refine(rows, grams, factors, A, k, reports[k])
        live = live[[res[k] > target and not reports[k].exact for k in live]]
    for i, report in enumerate(reports):
        report.residual = float(res[i])
    if kept is not None:
        kept[:] = [(A[k].copy(), grams[k]) for k in range(W.shape[0])]
    return W


def _scaled_steps(rows, Q, W, U, live, target):
    """``SCALED_STEPS`` steps of the rows ``live`` along ``-(lam alpha T + 2c I)^{-1} grad f``,
    each with Armijo's backtracking (``W`` and ``U = W X~`` moved in place); a row at the
    ``target`` residual takes none."""
    for _ in range(SCALED_STEPS):
        res, g = row_residual(rows, Q[live], W[live], U[live])
        live, g = live[res > target], g[res > target]
        if not live.size:
            return
        D = rows.scaled(g, np.mean(U[live] > 0, axis=1))
        UD = rows.forward(D)
        for j, k in enumerate(live):
            t = _armijo(rows.lam, rows.c, Q[k], (W[k], U[k]), (D[j], UD[j]), float(g[j] @ D[j]))
            W[k] += t * D[j]
            U[k] += t * UD[j]


def _armijo(lam, c, q, at, along, slope):
    """The backtracking step length of one row from ``at = (w, u)`` (``u = w X~``) along
    ``along = (d, d X~)`` with slope ``g . d``: halved from 1 until the value falls by Armijo's
    fraction (within rounding), 40 halvings at most."""
    (w, u), (d, ud), t = at, along, 1.0
    f0 = _value(lam, q, c, w, u)
    noise = 1e-14 * (1.0 + abs(f0))
    for _ in range(40):
        if _value(lam, q, c, w + t * d, u + t * ud) <= f0 + ARMIJO * t * slope + noise:
            break
        t *= 0.5
    return t


def _new_active_set(rows, grams, A, A_new, k, report):
    """Row ``k``'s active set after its step is ``A_new``: its Gram updated by the points that
    entered and left (formed again where more changed than it holds), its report counted;
    returns whether the Gram changed."""
    enter, leave = A_new & ~A[k], A[k] & ~A_new
    n_changed = int(enter.sum() + leave.sum())
    report.steps += 1
    report.changes.append(n_changed)
    if n_changed > min(int(A_new.sum()), A_new.size - int(A_new.sum())):
        grams[k] = rows.gram(A_new, exact=report.refined or None)
    elif n_changed:
        rows.update(grams[k], enter, leave, exact=report.refined or None)
    A[k] = A_new
    report.exact = report.exact and not n_changed
    return bool(n_changed)


def solve(
    block: WHidden,
    start: np.ndarray | None,
    target: float,
    max_steps: int | None = None,
    batch: int | None = None,
) -> tuple[np.ndarray, list[RowReport]]:
    """Every row of a ReLU ``WHidden`` block (``rho + gamma > 0``) from ``start`` (else zeros);
    returns ``(W, reports)``."""
    c = block.rho + block.gamma
    rows = Rows.of(np.asarray(block.Xt, dtype=float), block.lam, c)
    Q = block.lam * (block.V @ block.Xt.T)
    if block.gamma:
        Q = Q + 2.0 * block.gamma * block.W0
    W = np.zeros(Q.shape) if start is None else start
    return solve_rows(rows, Q, W, target, max_steps, batch)
