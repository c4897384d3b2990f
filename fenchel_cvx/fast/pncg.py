"""The W-blocks' nonlinear CG as ``init`` and ``step`` on an explicit state.

The hidden W-blocks (eqs. (17), (19) of the paper: rows ``min lam B(V_i, w_i X~) + rho |w_i|^2 +
gamma |w_i - w0_i|^2``, independent of each other) and the last W-block with a loss that is not
quadratic (eqs. (18), (20) with cross-entropy) are solved by Polak-Ribiere+ nonlinear CG with
an exact line search, preconditioned by a Gram matrix and, for rows whose active set is small
and settled, by their exact Newton step (the method: ``wblocks.py``). Written as optax and
jaxopt write their solvers:

- :class:`PncgProblem`: all that stays fixed through one solve (the block, its objective as
  ``wblocks.HiddenRows`` or ``wblocks.LastLoss``, the tolerance, the step cap, the settings);
- :class:`PncgState`: the iterate after ``it`` steps, with its direction and counts;
- :func:`init` (the start and its first direction), :func:`step` (one move and its tests, then
  the next direction) and :func:`finish` (the descent guard and the report);
- :func:`solve_pncg` runs them, or hands a solve to its faster equivalent (``span``) or to the
  loss's own method (``wblocks.solve_newton``).

One step:

    t    = argmin_t f(W + t d)            exact line search (per row for WHidden)
    W    = W + t d,  U = U + t d X~       (U = W X~ formed again every ``resync`` steps)
    stop where the KKT residual <= tol (confirmed on the block's own), or stalled (no halving
         in a window at the precision's floor; at once where it is not finite)
    freeze the rows whose gradient <= tol / 2 (every ``compact_every`` steps)
    s    = g G^{-1}  (Newton rows: H_i^{-1} g_i),  d = -s + beta d   (PR+, restarted uphill)
"""

import dataclasses
import math
from types import ModuleType
from typing import Any, NamedTuple

from array_api_compat import device

from ..arrays import Array, clip, host_if_cheap
from ..blocks import WHidden, WLast
from ..reduce import LOCAL, Comm
from . import span
from ._util import keep_descent, kkt, most, part, pr_plus, proves_above
from .wblocks import (
    DEFAULT_SETTINGS,
    HiddenRows,
    LastLoss,
    PncgSettings,
    block_parts,
    gram_preconditioner,
    solve_newton,
)

__all__ = ["PncgProblem", "PncgSettings", "PncgState", "finish", "init", "solve_pncg", "step"]


@dataclasses.dataclass(frozen=True)
class PncgProblem:
    """One W-block's nonlinear-CG solve, all that stays fixed through it: the block, its
    objective (``wblocks.HiddenRows`` for WHidden, ``wblocks.LastLoss`` otherwise), the
    tolerance, the step cap, the settings, whether the steps are tested (``tested``: a capped
    solve that reports no residual tests none), whether the caller takes the returned point's
    image (``returns_image``), the preconditioner's report (``factor``) and the block's column
    shards (``comm``, ``reduce.py``: the objective's sums go through it)."""

    xp: Any
    block: Any
    objective: Any
    tol: float
    max_iter: int
    settings: PncgSettings
    tested: bool
    returns_image: bool
    factor: dict
    comm: Comm = LOCAL


class PncgState(NamedTuple):
    """The iterate after ``it`` steps: ``W`` (the rows still iterated) and its image ``U = W X~``
    (updated; None where the last step formed none), ``A`` (the data term's dL/dU / coef) and the
    gradient's ``parts`` (its data part None until formed), the preconditioned gradient ``s`` and
    ``gs = <g, s>``, the direction ``d``, its image ``dU`` where known without a product, its
    slope ``gd`` (None: ``-gs``), the Newton rows of ``s`` and the active sets; ``objective``
    (of the rows still iterated), ``rows`` (their indices; None: all), ``W_full`` (every row),
    the frozen rows' ``(max |g|, max |part|)``; the counts; the best residual and its step, the
    last residual ``r``, the start ``(W, U)`` (the descent guard's) and ``end`` (None: go on;
    ``"converged"``, ``"stalled"`` or ``"capped"``)."""

    W: Any
    U: Any
    A: Any
    parts: list
    s: Any
    gs: Any
    d: Any
    dU: Any
    gd: Any
    newton: Any
    active: Any
    objective: Any
    rows: Any
    W_full: Any
    frozen: tuple
    n_newton: Any
    n_restart: Any
    searches: int
    row_iterations: int
    best: tuple
    r: float
    it: int
    start: tuple[Any, Any]
    end: Any


def problem(
    xp: ModuleType,
    block: WHidden | WLast,
    tol: float,
    max_iter: int,
    cache: dict[Any, Any] | None = None,
    settings: PncgSettings = DEFAULT_SETTINGS,
    comm: Comm = LOCAL,
) -> PncgProblem:
    """The :class:`PncgProblem` of ``block``: its Gram preconditioner (from ``cache`` where one
    serves, ``wblocks.gram_preconditioner``) and its objective. A last W-block whose loss
    couples its rows (cross-entropy) is refused on row shards."""
    hidden = isinstance(block, WHidden)
    if comm.rows.P > 1 and not hidden and block.piece_axis is None:
        raise ValueError(
            f"the last W-block of a {type(block.loss).__name__} couples its rows: split it by "
            f"columns, not over {comm.rows.P} row shards"
        )
    pre, factor_kind = gram_preconditioner(
        xp, block, cache, reuse=settings.gram_reuse, rows=block.shape[0] * max_iter, comm=comm
    )
    objective = (
        HiddenRows(xp, block, pre, settings, comm=comm)
        if hidden
        else LastLoss(xp, block, pre, kernels=settings.kernels, comm=comm)
    )
    factor = dict(
        cached_factor=factor_kind != "new",
        stale_factor=factor_kind == "stale",
        data_space=pre.data_space,
    )
    tested = settings.capped_residual or max_iter >= settings.stall_window
    # the last step's image where it is reported: the caller's (``_util.started``)
    returns_image = getattr(block, "return_U", False)
    return PncgProblem(
        xp, block, objective, tol, max_iter, settings, tested, returns_image, factor, comm
    )


def init(p: PncgProblem, W: Array) -> PncgState:
    """The state at the start ``W``: its image (the caller's where it fits), the gradient's
    parts, the first direction; ``end`` ``"converged"`` where the start passes the KKT test."""
    block, objective = p.block, p.objective
    U = getattr(block, "U", None)  # W X~ at the start, from the caller (bcd's forward pass)
    if U is None or tuple(U.shape) != (W.shape[0], block.Xt.shape[1]):
        U = objective.forward(W)
    objective.start(W, U)
    A, R = objective.data_grad(U), objective.reg_grad(W)
    s = PncgState(
        W, U, A, [None, R], None, None, None, None, None, None, None, objective, None, W,
        (0.0, 0.0), 0, 0, 0, 0, (math.inf, 0), math.nan, 0, (W, U), None,
    )  # fmt: skip
    return _first_direction(p, s)


def _first_direction(p, s):
    """The first direction ``-s``, or ``end`` ``"converged"`` at an optimal start (tested
    solves only). In data space the direction comes first and needs no parameter-space
    gradient; where it proves the residual above ``tol`` (``_above``), or no test is asked for,
    that gradient is never formed."""
    objective, R = s.objective, s.parts[1]
    data_space = objective.pre.data_space
    if data_space:
        sd, sU, newton, active = objective.precondition(None, s.A, R, s.U, 0)
        # g G^{-1} g^T = s G s^T = w |s X~|^2 + c2 |s|^2: no cancellation near the optimum
        pre = objective.pre
        gs = pre.w * objective.dot(sU, sU) + pre.c2 * objective.dot(sd, sd)
        s = s._replace(s=sd, gs=gs, d=-sd, dU=-sU, newton=newton, active=active)
        if not p.tested or _above(p, s):
            return s
    parts = objective.parts(s.A, R)
    s = s._replace(parts=parts)
    g = parts[0] + parts[1]
    if p.tested and kkt(s.W, parts, comm=p.comm.rows) <= p.tol:
        return s._replace(end="converged")
    if not data_space:
        sd, _, newton, active = objective.precondition(g, s.A, R, s.U, 0)
        s = s._replace(s=sd, gs=objective.dot(g, sd), d=-sd, dU=None, newton=newton, active=active)
    return s


def _above(p, s):
    """A bound proving the KKT residual ``max|g| / (1 + max_i max|part_i|)`` above ``tol``
    from data-space figures: ``G >= c2 I`` gives ``|g_i|_2^2 >= c2 g_i G^{-1} g_i^T``, and
    ``|coef A X~^T|_max <= coef max_i |A_i|_2 max_j |X~_j|_2``; half the bound must pass.
    Rounding in s can only make it pass where the residual is within a few eps of the
    start's terms (the tol floor is 64 eps): then a step is taken, never a false optimum."""
    xp, objective = p.xp, s.objective
    per = math.prod(s.W.shape) // max(1, math.prod(s.gs.shape))  # entries per inner product
    maxima = [most(xp, xp.sum(s.A * s.A, axis=1)), most(xp, xp.abs(s.parts[1])), most(xp, s.gs)]
    a2, r1, gs = (float(m) for m in p.comm.rows.reduce(maxima, "max"))
    x2 = objective.pre.xt_norm2(xp)
    scale = max(abs(objective.coef) * math.sqrt(a2 * x2), r1)
    return proves_above(xp, xp.asarray(gs), objective.pre.c2, per, scale, p.tol)


def step(p: PncgProblem, s: PncgState) -> PncgState:
    """One step from ``s``: the move along d, the stopping tests, then the rows frozen and the
    next direction. The last allowed step of a solve that reports no residual forms no
    gradient (and no image unless a value or the caller needs it)."""
    it = s.it + 1
    final = it == p.max_iter and not p.settings.capped_residual
    image = not final or p.settings.capped_value or p.returns_image
    s = _move(p, s, it, gradient=not final, image=image)
    if final:
        return s._replace(r=math.nan, end="capped")
    if p.tested and (s := _tests(p, s)).end is not None:
        return s
    if it == p.max_iter:
        return s._replace(end="capped")
    if isinstance(s.objective, HiddenRows) and p.tested and it % p.settings.compact_every == 0:
        s = _compact(p, s)
    return _next_direction(p, s)


def _move(p, s, it, gradient=True, image=True):
    """The exact line search along d, the move, ``U = W X~`` updated where ``image`` (``U +
    t dU``: an elementwise pass), and the gradient at the new point where ``gradient``."""
    xp, objective = p.xp, s.objective
    n_newton = s.n_newton
    if s.newton is not None:
        n_newton = n_newton + xp.sum(xp.astype(s.newton, xp.int64))
    dU = objective.forward(s.d) if s.dU is None else s.dU
    gd = -s.gs if s.gd is None else s.gd
    t, searches = objective.line_search(s.parts[1], s.U, s.d, dU, gd)
    W, U = s.W + t * s.d, s.U + t * dU if image else None
    if image and it % p.settings.resync == 0:
        U = objective.forward(W)  # no drift of the incrementally updated W X~
    parts, A = objective.gradient(W, U) if gradient else (s.parts, s.A)
    return s._replace(
        W=W, U=U, dU=dU, parts=parts, A=A, it=it, n_newton=n_newton,
        searches=s.searches + searches, row_iterations=s.row_iterations + s.W.shape[0],
    )  # fmt: skip


def _tests(p, s):
    """The stopping tests after a move: a residual at ``tol`` confirmed by the block's own
    (``_confirm``) converges; near the precision's floor, ``stall_window`` steps without
    halving it stall."""
    r = _residual(p, s)
    if r <= p.tol:
        s, r = _confirm(p, s)
        if r <= p.tol:
            return s._replace(r=r, end="converged")
    if not math.isfinite(r):  # a NaN or inf in the block's data: no step brings it to tol
        return s._replace(r=r, end="stalled")
    best, best_it = s.best
    if r <= 0.5 * best:
        return s._replace(r=r, best=(r, s.it))
    stall_level = math.sqrt(p.xp.finfo(s.W.dtype).eps)
    if r <= stall_level and s.it - best_it >= p.settings.stall_window:
        return s._replace(r=r, end="stalled")  # at the precision's floor: no halving in a window
    return s._replace(r=r)


def _residual(p, s):
    """The KKT residual from the parts at hand, the frozen rows included (maxima over the
    block's row shards)."""
    xp = p.xp
    g = xp.abs(s.parts[0] + s.parts[1])
    maxima = [most(xp, g), *s.frozen, *(most(xp, xp.abs(q)) for q in s.parts)]
    r, frozen_r, *scales = (float(m) for m in p.comm.rows.reduce(maxima, "max"))
    return max(frozen_r, r) / (1.0 + max(scales))


def _confirm(p, s):
    """At a residual <= tol from the updated W X~: the block's own residual at W decides.
    W X~ is formed again: the loop goes on from it, or ``finish`` reports the value from it
    (exact, not drifted by the updates; all rows only, as ``finish`` needs)."""
    W_full = _full(p, s)
    r = kkt(W_full, block_parts(p.block, W_full, p.comm), p.block.project, p.comm.rows)
    U, parts, A = s.U, s.parts, s.A
    if r > p.tol or s.rows is None:
        U = s.objective.forward(s.W)
    if r > p.tol:
        parts, A = s.objective.gradient(s.W, U)
    return s._replace(W_full=W_full, U=U, parts=parts, A=A), r


def _full(p, s):
    """Every row: the rows iterated scattered back among the frozen ones."""
    return s.W if s.rows is None else _scatter_rows(p.xp, s.W_full, s.W, s.rows)


def _compact(p, s):
    """Freeze the WHidden rows whose gradient is below ``tol / 2`` (if enough of them): the
    steps go on with the others only (rows are independent)."""
    xp, parts = p.xp, s.parts
    row_g = xp.max(xp.abs(parts[0] + parts[1]), axis=1)
    done = row_g <= 0.5 * p.tol
    n_done = int(xp.sum(xp.astype(done, xp.int64)))
    # the decision is the whole block's (over its row shards); each shard freezes its own rows
    n_all, p_all = p.comm.rows.reduce([n_done, s.W.shape[0]], "sum")
    if not (n_all >= max(1, p_all // 8) and n_all < p_all) or n_done == 0:
        return s
    keep, drop = xp.nonzero(xp.logical_not(done))[0], xp.nonzero(done)[0]
    frozen = (
        max(s.frozen[0], float(xp.max(xp.take(row_g, drop)))),
        max(s.frozen[1], *(float(xp.max(xp.abs(xp.take(q, drop, axis=0)))) for q in parts)),
    )
    rows = keep if s.rows is None else xp.take(s.rows, keep)
    block = p.block
    sub = dict(V=xp.take(block.V, rows, axis=0))
    if block.W0 is not None:
        sub["W0"] = xp.take(block.W0, rows, axis=0)

    def rows_of(a):
        return None if a is None else xp.take(a, keep, axis=0)

    return s._replace(
        objective=s.objective.of_rows(part(block, **sub), keep), rows=rows, W_full=_full(p, s),
        frozen=frozen, W=rows_of(s.W), U=rows_of(s.U), A=rows_of(s.A), d=rows_of(s.d),
        dU=rows_of(s.dU), s=rows_of(s.s), gs=rows_of(s.gs), active=rows_of(s.active),
        parts=[rows_of(q) for q in parts],
    )  # fmt: skip


def _next_direction(p, s):
    """The PR+ direction from the preconditioned gradient (steepest where it points uphill)."""
    xp, objective = p.xp, s.objective
    gn = s.parts[0] + s.parts[1]
    sn, snU, newton, active = objective.precondition(gn, s.A, s.parts[1], s.U, s.it, s.active)
    gs = objective.dot(gn, sn)
    beta, uphill, gd = pr_plus(
        xp, gs, objective.dot(gn, s.s), s.gs, objective.dot(gn, s.d), zero=newton
    )
    d = -sn + beta * s.d
    dU = None if snU is None or s.dU is None else -snU + beta * s.dU
    n_restart = s.n_restart + xp.sum(xp.astype(uphill, xp.int64))
    return s._replace(
        s=sn, gs=gs, d=d, dU=dU, gd=gd, newton=newton, active=active, n_restart=n_restart
    )


def finish(p: PncgProblem, s: PncgState) -> tuple[Array, int, dict[str, Any]]:
    """``(W, iterations, info)`` of the final state; the residual and, where asked, the value
    from what is at hand (exact when converged; otherwise from W X~ updated in place, re-synced
    every ``resync`` steps). An unconverged hidden solve with a data-space preconditioner ends
    with the descent guard (``_util.keep_descent``: no row above its start), whose value, from
    the true W X~, is reported. ``info["U"]``: ``W X~`` at the returned W where it is at hand
    for every row (the solver's updated one, or the guard's true one)."""
    xp, converged, stalled = p.xp, s.end == "converged", s.end == "stalled"
    info = dict(
        method="pncg", line_search_iterations=s.searches, restarts=0, newton_rows=0,
        row_iterations=s.row_iterations, **p.factor,
    )  # fmt: skip
    if converged and s.it == 0:  # the start itself (``init``)
        info.update(converged=True, value=s.objective.value(s.W, s.U))
        return s.W, 0, info
    if stalled:
        info["stalled"] = True
    W, r, guarded = s.W_full, s.r, None
    U = s.U if s.rows is None and p.returns_image else None
    if not converged:
        W = _full(p, s)
        if s.objective.pre.data_space and isinstance(p.block, WHidden):
            # the line searches saw W X~ through the data-space identity: the guard at the true
            # image (``_util.keep_descent``); a reported residual is then the guarded point's
            start, U_start = s.start
            W, U, guarded, reverted = keep_descent(xp, p.block, start, U_start, W)
            guarded, reverted = p.comm.rows.reduce([guarded, reverted], "sum")
            info["reverted_rows"] = host_if_cheap(xp, reverted, int)
            if not math.isnan(r) and int(reverted):
                r = kkt(W, p.block.grad_parts(W), comm=p.comm.rows)
    info.update(
        converged=converged, newton_rows=host_if_cheap(xp, s.n_newton, int),
        restarts=host_if_cheap(xp, s.n_restart, int), residual=r, U=U,
    )  # fmt: skip
    if converged or p.settings.capped_value or stalled:
        if guarded is not None:
            info["value"] = float(guarded)
        elif _every_row_at_hand(p, s):  # U = W X~ is at hand for all rows
            info["value"] = s.objective.value(W, s.U)
    return W, s.it, info


def _every_row_at_hand(p, s):
    """Whether the solve holds ``U = W X~`` for all its rows (none frozen away), on every row
    shard (each freezes its own rows: the answer is reduced where rows are split)."""
    if p.comm.rows.P == 1:
        return s.rows is None
    (frozen,) = p.comm.rows.reduce([float(s.rows is not None)], "max")
    return not frozen


def solve_pncg(xp, block, W, tol, max_iter, cache=None, settings=DEFAULT_SETTINGS, comm=LOCAL):
    """``(W, iterations, info)``: PR+ nonlinear CG from ``W`` on a WHidden block, or on a WLast
    block whose loss's ``last_w_solver`` is ``"pncg"`` (cross-entropy): :func:`init`, then
    :func:`step` until the state ends, then :func:`finish`. A loss whose ``last_w_solver`` is
    ``"newton"`` (Huber, any loss with ``grad`` and ``hvp``) goes to ``wblocks.solve_newton``;
    a capped hidden solve from the proximal centre with a data-space preconditioner runs in
    the batch's span (``span.solve_span``: the same iterates, no product a step).

    ``cache``: the Gram factors at hand (``wblocks.gram_preconditioner``). ``settings``
    (:class:`PncgSettings`): rows whose gradient is below ``tol / 2`` are frozen every
    ``compact_every`` steps; near the working precision's floor (residual below sqrt(eps)),
    ``stall_window`` steps without halving the residual stop the loop (``info["stalled"]``);
    ``capped_residual=False``: the gradient after the last allowed step is not formed, the
    residual is reported as NaN; ``capped_value=False``: nor is the value at the returned point.

    A capped solve (fewer steps than ``stall_window``) with ``capped_residual=False`` is
    untested: it runs all its ``max_iter`` steps with no test of its residual (at the start nor
    on the way) and freezes no rows, so that, where reads are not cheap
    (``arrays.cheap_reads``), its steps read nothing back to the host (the line search's Newton
    iterations run a fixed count, ``newton_1d``; ``info``'s counters stay 0-d arrays).

    ``comm``: the block's shards (``reduce.py``). Split by columns (the block's X~ and targets
    are this shard's columns, ``W`` is whole), every sum over the columns goes through its
    ``columns`` role, so every shard takes the same steps and returns the same W; a WHidden
    solve that needs every column of its rows (data space, Newton rows) moves to rows first
    (``_by_rows``). Split by rows (this shard's rows of W, every column), the figures over the
    rows (the tests' maxima, the values, the counts of frozen rows) go through its ``rows``
    role. All decisions are the whole block's: the step lengths, the tests, the rows frozen.
    """
    hidden = isinstance(block, WHidden)
    if not hidden and block.loss.last_w_solver == "newton":  # the loss's own choice
        return solve_newton(xp, block, W, tol, max_iter, cache, settings, comm)
    if hidden and comm.columns.P > 1:
        columns = _columns(block, comm.columns)
        if _needs_every_column(block, sum(columns), max_iter, settings):
            return _by_rows(xp, block, W, columns, (tol, max_iter), cache, settings, comm)
    p = problem(xp, block, tol, max_iter, cache, settings, comm)
    pre = p.objective.pre
    if hidden and span.applies(
        xp, block, W, pre, max_iter, settings.newton_start, settings.newton_cap
    ):
        W, it, info = span.solve_span(p, W)
        return W, it, {**info, **p.factor}
    s = init(p, W)
    while s.end is None and s.it < max_iter:
        s = step(p, s)
    return finish(p, s)


def _columns(block, comm):
    """Every shard's count of X~'s columns, in shard order: one reduction of host numbers (a
    count in this shard's place), which no shard reads back from a device."""
    mine = [block.Xt.shape[1] if r == comm.rank else 0 for r in range(comm.P)]
    return [int(c) for c in comm.reduce(mine, "sum")]


def _needs_every_column(block, points, max_iter, settings):
    """Whether a WHidden solve on column shards of ``points`` columns in all needs every
    column of its rows: data space (fewer points than rows of X~: the batch's Gram
    ``X~^T X~``) or Newton rows (a row's Hessian among all its active points, possible past
    ``newton_start`` steps)."""
    newton = settings.newton_cap != 0 and max_iter > settings.newton_start
    return points < block.Xt.shape[0] or newton


def _by_rows(xp, block, W, columns, stop: tuple[Any, Any], cache, settings, comm):
    """A WHidden block held by columns (this shard's X~ and V columns, W whole; ``columns``:
    every shard's count of them), moved to row shards (``reduce.to_rows``: each shard its rows
    of W and V over every column, X~ whole), solved there (``stop = (tol, max_iter)``), and W
    gathered whole on every shard; ``info``'s ``U`` is None (the image of this shard's columns
    is not formed). The gathers take every shard's shape from ``columns``: none is read back
    from a device."""
    p, n, P, rank = block.V.shape[0], block.Xt.shape[0], comm.P, comm.rank
    if p < P:  # (every shard sees p and P: all raise, before any collective)
        raise ValueError(
            f"W_{block.layer} moves to rows on {P} shards but has {p} rows: a row shard "
            f"needs one; take at most {p} ranks, or keep the block on its columns "
            f"(FastBackend(newton_cap=0), and batches of at least {n} points a W-block)"
        )
    counts = [p // P + (r < p % P) for r in range(P)]
    lo = sum(counts[:rank])
    mine = slice(lo, lo + counts[rank])
    moved = part(
        block,
        Xt=xp.concat(comm.all_gather(block.Xt, [(n, c) for c in columns]), axis=1),
        V=comm.to_rows(block.V, counts, columns),
        W0=None if block.W0 is None else block.W0[mine],
    )
    rows = comm.with_split("rows")
    W_rows, it, info = solve_pncg(xp, moved, W[mine], *stop, cache, settings, rows)
    W = xp.concat(comm.all_gather(W_rows, [(c, n) for c in counts]), axis=0)
    return W, it, {**info, "U": None}


def _scatter_rows(xp, full, sub, rows):
    """``full`` with its rows ``rows`` (sorted global indices) replaced by ``sub``, with no
    in-place writes."""
    p, k = full.shape[0], rows.shape[0]
    if k == 0:  # every row frozen (a row shard's)
        return full
    ar = xp.arange(p, dtype=rows.dtype, device=device(rows))
    pos = clip(xp.searchsorted(rows, ar), 0, k - 1)
    hit = xp.take(rows, pos) == ar
    return xp.take(xp.concat([full, sub], axis=0), xp.where(hit, p + pos, ar), axis=0)
