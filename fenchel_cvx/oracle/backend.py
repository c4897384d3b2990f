"""OracleBackend: every block of the lifted objective solved to certified optimality by CVXPY.

``OracleBackend().solve(block)`` takes one of the four blocks of ``blocks.py`` (docs/mathematics.md,
"The four blocks"; the paper's Sec. 4.5), splits it into independent pieces (``templates.plan``:
X-blocks by column, hidden and MSE-last W-blocks by row), solves every piece on a cached DPP
template (re-solves only set parameter values), and returns a ``BlockResult`` whose ``value`` and
``residual`` are ``block.value`` and ``block.kkt_residual`` at the assembled argmin, computed in
NumPy. The MSE + ReLU X_L block is a nonnegative least squares (``nnls.py``). Everything that
differs between blocks (checks, plan, polish, route) is registered per block class
(``functools.singledispatch``), never chosen by the block's ``kind``.

Certificate (the project's docs, "The per-iteration certificate", check 4): every piece must end
with a usable point (status ``optimal``, or ``optimal_inaccurate`` / ``user_limit``, which the
Newton polish then refines) and the scaled KKT residual of the whole block must be ``<= tol``:
that residual, not the solver's status, is the proof; otherwise a typed ``SolverError``
naming the block kind, the layer and the status is raised (``strict=False`` turns an inaccurate
status or residual into ``converged=False`` with ``info["warning"]``; a failed or infeasible
solve always raises). ``info`` holds the solver, the summed |primal - dual| objective gap of
the pieces (``duality_gap``, in the block's units), ``n_subproblems``, ``retries``, the
residual of the solver's own point (``solver_residual``) and the Newton ``polish_steps``.

Solver choice (measured; docs/oracle.md): Clarabel, structural zeros dropped. Quadratic pieces
(ReLU, leaky ReLU, MSE) are solved with 1e-12 tolerances, exponential-cone pieces (sigmoid, tanh,
cross-entropy) with the default 1e-8 (tighter ones stall near a 1e-10 gap and end
``optimal_inaccurate``); when the block residual still exceeds ``tol`` (an interior point's gap
eps bounds the distance to the argmin only by ~sqrt(eps)), the Newton polish of ``polish.py``
finishes the job. A non-optimal piece is re-solved with the next settings of ``ATTEMPTS`` before
an error is raised. OSQP solves the quadratic blocks only; SCS solves all blocks, to ~1e-8 with
~50x Clarabel's iterations, and is polished the same way.
"""

import functools
import math
import os
import time
import warnings
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import cvxpy as cp
import numpy as np

from ..arrays import Array
from ..backends import BackendDefaults
from ..blocks import Block, BlockResult, WBlock, WHidden, WLast, XBlock, XHidden, XLast
from ..column_threads import figures
from ..errors import SolverError, SolverInaccurate, SolverInfeasible
from ..threads import cores
from ..validation import TOL, check
from . import atoms as _atoms
from . import cluster as _cluster
from . import dask_rows as _dask_rows
from . import exact as _exact
from . import nnls as _nnls
from . import polish as _polish
from . import templates as _tpl
from . import wellposed as _wp

DEFAULT_SOLVER = "CLARABEL"

# Settings per solver (measured in docs/oracle.md). Clarabel drops the structural zeros of the
# data (MNIST pixels are mostly zero: ~8x faster W-rows) and reuses its cached solver. Quadratic
# templates (ReLU / leaky ReLU / MSE) first try 1e-12 gap and feasibility tolerances (MNIST W-rows:
# residual 3e-8 instead of 6e-5 at 1e-8, for 50% more iterations); exponential-cone templates
# (sigmoid, tanh, cross-entropy) stall near a 1e-10 gap and end ``optimal_inaccurate`` when asked
# for more, so they keep the default 1e-8 and rely on the Newton polish.
SOLVER_OPTS: dict[str, dict[str, Any]] = {
    "CLARABEL": dict(max_iter=400, input_sparse_dropzeros=True),
    "OSQP": dict(eps_abs=1e-9, eps_rel=1e-9, polishing=True, max_iter=100000),
    "SCS": dict(eps_abs=1e-8, eps_rel=1e-8, max_iters=100000),
}
# Clarabel's own defaults for every setting an attempt changes: each attempt spells them all out,
# because a cached Clarabel solver keeps the settings of its previous run.
_CLARABEL_BASE: dict[str, Any] = dict(
    tol_gap_abs=1e-8,
    tol_gap_rel=1e-8,
    tol_feas=1e-8,
    tol_ktratio=1e-6,
    max_step_fraction=0.99,
    equilibrate_enable=True,
    static_regularization_constant=1e-8,
)
_TIGHT = dict(tol_gap_abs=1e-12, tol_gap_rel=1e-12, tol_feas=1e-12, tol_ktratio=1e-10)

# The settings tried in turn on a piece until one run ends ``optimal`` (the status that counts is
# that of the last run; each fallback was measured to rescue cases the previous one missed).
# ``(qp, conic)``: the sequence for quadratic templates and for exponential-cone templates.
_CLARABEL_CHANGES: tuple[list[dict[str, Any]], ...] = (
    [
        _TIGHT,
        {**_TIGHT, "max_step_fraction": 0.95},
        {},
        {"max_step_fraction": 0.95},
        {"equilibrate_enable": False},
    ],
    [
        {},
        {"max_step_fraction": 0.95},
        {"equilibrate_enable": False},
        {"static_regularization_constant": 1e-11},
    ],
)
ATTEMPTS = {
    "CLARABEL": tuple([{**_CLARABEL_BASE, **a} for a in seq] for seq in _CLARABEL_CHANGES),
}

# Per block family (the class XBlock / WBlock), settings measured to be faster: Clarabel's QDLDL
# factorises the X-block columns (a dense W_x coupling every coordinate) 3.4x faster than faer
# (MNIST X_1 columns: 86 vs 290 ms CPU); faer ("auto") is 2.5x faster on the W-rows (MNIST X~
# 785 x 500).
BLOCK_OPTS = {"CLARABEL": {XBlock: {"direct_solve_method": "qdldl"}, WBlock: {}}}

# Parametrised coefficients per piece. CVXPY's DPP compile time grows faster than linearly in
# the piece (digits CE X_L block: 31 columns 0.13 s, 125 columns 1.2 s, 500 columns 17 s CPU)
# while the solve time per column is flat (~1 ms), so pieces are small: a few MNIST columns
# (W_x is 10 x 300), ~37 digits columns (10 x 32), one W-row (X~ is at least 65 x 1000).
DEFAULT_BUDGET = 12_000

# Once the residual exceeds tol, the polish works on every piece above POLISH_TARGET * tol, so
# that a block it touched ends well inside the tolerance.
POLISH_TARGET = 0.1

# statuses whose point the Newton polish may finish (then certified by the KKT residual)
_REFINABLE = {cp.OPTIMAL, cp.OPTIMAL_INACCURATE, cp.USER_LIMIT}
_FAILED = {cp.INFEASIBLE, cp.UNBOUNDED, cp.INFEASIBLE_INACCURATE, cp.UNBOUNDED_INACCURATE}
_BLOCKS = (XHidden, XLast, WHidden, WLast)


def _check_finite(name, A):
    if A is not None and not np.all(np.isfinite(np.asarray(A))):
        raise ValueError(f"{name} must be finite, got NaN or inf entries")


#: an X-block column's parametrised coefficients (the dense ``W_x`` of the map it feeds) up to
#: which its CVXPY template compiles in reasonable memory: LeNet-5's X_1, which feeds conv2, has
#: 1600 x 4704 = 7.5M, whose DPP compile asks for 528 GiB
MAX_COLUMN_COEFFICIENTS = 1_000_000


def beyond_reach(block: Block, exact: bool = True) -> str | None:
    """Why the oracle cannot solve ``block``, in words (None: it can): an X-block whose one
    column's template has more than ``MAX_COLUMN_COEFFICIENTS`` coefficients (a large
    convolution's Toeplitz matrix), unless an exact method takes it (``exact``: counted; the
    template, where the method's certificate fails, checks again with ``exact=False``)."""
    if not isinstance(block, XBlock) or (exact and _exact.method_for(block) is not None):
        return None
    one = block.restrict(np.arange(1))
    rows = one.forward(np.zeros((block.shape[0], 1))).shape[0]
    if rows * block.shape[0] <= MAX_COLUMN_COEFFICIENTS:
        return None
    return (
        f"one column's problem has {rows} x {block.shape[0]} = {rows * block.shape[0]:,} "
        f"coefficients (the layer's map as a dense matrix), over the CVXPY templates' "
        f"{MAX_COLUMN_COEFFICIENTS:,}"
    )


def check_block(block: object) -> None:
    """Validate a block's data before solving (``ValueError`` naming the parameter and value)."""
    if not isinstance(block, _BLOCKS):
        raise ValueError(f"block must be one of XHidden, XLast, WHidden, WLast, got {block!r}")
    for act in block.activations:
        _atoms.require_forms(act, _atoms.ACTIVATION_FORMS)
    _check_data(block)
    why = beyond_reach(block)
    if why is not None:
        raise ValueError(f"block {block.kind} (layer {block.layer}) is beyond the oracle: {why}")


@functools.singledispatch
def _check_data(block):
    """The checks of one block class (registered below, one per class of ``_BLOCKS``)."""
    raise TypeError(f"no checks are registered for {type(block).__name__}")


@_check_data.register
def _(block: XHidden):
    _check_hidden(block.act_out, block.V_next, "V_next", lam_in=block.lam_in, lam_out=block.lam_out)
    _check_x(block)


@_check_data.register
def _(block: XLast):
    _check_x(block)
    _check_labels(block)


@_check_data.register
def _(block: WHidden):
    _check_hidden(block.act, block.V, "V", lam=block.lam)
    _check_w(block)


@_check_data.register
def _(block: WLast):
    _check_w(block)
    _check_labels(block, w_block=True)


def _check_hidden(act, V, name, **lams):
    """The output ``V`` of a hidden layer in the range of its activation; its weights > 0."""
    _check_finite(name, V)
    act.check_range(name, np.asarray(V))
    if any(lam <= 0 for lam in lams.values()):
        raise ValueError(
            f"{' and '.join(lams)} must be > 0, got {', '.join(str(lam) for lam in lams.values())}"
        )


def _check_x(block):
    _check_finite("U_prev", block.U_prev)
    _check_finite("W", block.W)


def _check_w(block):
    _check_finite("Xt", block.Xt)
    _check_finite("W0", block.W0)
    if block.rho < 0 or block.gamma < 0:
        raise ValueError(f"rho and gamma must be >= 0, got {block.rho}, {block.gamma}")


def _check_labels(block, w_block=False):
    _check_finite("Y", block.Y)
    _atoms.require_forms(block.loss, _atoms.LOSS_FORMS)
    block.loss.check_labels("Y", np.asarray(block.Y), w_block)


def _block_opts(solver, block):
    """The settings of ``BLOCK_OPTS[solver]`` for the block's family (looked up by class)."""
    table = BLOCK_OPTS.get(solver, {})
    return next((table[c] for c in type(block).__mro__ if c in table), {})


def _gap(raw):
    """|primal - dual objective| reported by the solver, or None."""
    try:
        if hasattr(raw, "obj_val_dual"):  # Clarabel
            return abs(raw.obj_val - raw.obj_val_dual)
        if isinstance(raw, dict) and "info" in raw:  # SCS
            return abs(float(raw["info"]["gap"]))
        if hasattr(raw, "info") and hasattr(raw.info, "duality_gap"):  # OSQP
            return abs(float(raw.info.duality_gap))
    except (TypeError, KeyError, AttributeError):
        pass
    return None


def solve_piece(
    template: _tpl.Template, solver: str, opts: Mapping[str, Any], warm: Array | None = None
) -> tuple[Any, str, int, float | None, float]:
    """Solve one template with its parameters set: ``(x, status, iterations, gap, seconds)``."""
    prob = template.problem
    t0 = time.perf_counter()
    if warm is not None:
        template.var.value = warm
    try:
        data, chain, inverse = prob.get_problem_data(solver, solver_opts=dict(opts))
    except cp.error.SolverError as exc:
        raise ValueError(
            f"solver {solver} cannot solve the {template.key[0]} template (it needs "
            f"exponential cones for sigmoid, tanh, cross-entropy; use CLARABEL or "
            f"SCS): {exc}"
        ) from None
    try:
        # warm_start lets Clarabel update the cached solver in place (same pattern: no new
        # symbolic factorisation), and OSQP/SCS start from ``warm``
        raw = chain.solve_via_data(
            prob, data, warm is not None or solver == "CLARABEL", False, dict(opts)
        )
        with warnings.catch_warnings():  # an inaccurate status is reported by the status itself
            warnings.simplefilter("ignore", UserWarning)
            prob.unpack_results(raw, chain, inverse)
    except cp.error.SolverError as exc:
        return None, f"solver_error: {exc}", 0, None, time.perf_counter() - t0
    stats = prob.solver_stats
    return (
        template.var.value,
        prob.status,
        int(stats.num_iters or 0),
        _gap(raw),
        time.perf_counter() - t0,
    )


class TemplateSpec(NamedTuple):
    """Which template solves a block's pieces: its key, the activations and the constants
    compiled into it (``templates.build``)."""

    key: Any
    acts: Any
    consts: Any


class SolveWith(NamedTuple):
    """How the pieces are solved: the CVXPY solver, its options (the user's and the block
    family's, ``BLOCK_OPTS``) and ``attempts = (qp, conic)``, the setting overrides tried in
    turn until a run ends ``optimal`` (``opts`` override them)."""

    solver: Any
    opts: dict
    attempts: tuple = ((), ())


def solve_chunk(
    cache: "TemplateCache",
    spec: TemplateSpec,
    how: SolveWith,
    shared: Mapping[str, Any],
    pieces: Sequence[Mapping[str, Any]],
    warms: Sequence[Any] | None = None,
) -> list[tuple]:
    """Solve a list of piece parameter dicts on one template (``spec``: a
    :class:`TemplateSpec`, built once, cached in ``cache``) as ``how`` says (a
    :class:`SolveWith`).

    A template whose compiled-in constants differ from ``spec.consts`` is rebuilt in place (one
    template per key). Returns one ``(x, status, iterations, gap, seconds, retries)`` per piece.
    """
    key, (solver, opts, attempts) = spec.key, how
    template = cache.get(key)
    if template is None or not template.matches(spec.consts):
        template = cache[key] = _tpl.build(key, spec.acts, spec.consts)
        cache.builds[key] = cache.builds.get(key, 0) + 1
    template.set(shared)
    sequence = list(attempts[0] if template.problem.is_qp() else attempts[1]) or [{}]
    out, start = [], 0  # the setting that succeeded last, within this chunk only
    for i, values in enumerate(pieces):
        template.set(values)
        warm = None if warms is None else warms[i]
        # start where the previous piece succeeded (a setting that failed on one piece of a
        # block usually fails on the next); the earlier settings are tried last
        order = list(range(start, len(sequence))) + list(range(start))
        res: tuple | None = None
        for tried, a in enumerate(order):  # noqa: B007 (read after the loop: settings tried)
            again = solve_piece(template, solver, {**sequence[a], **opts}, warm)
            res = (
                again
                if res is None
                else (again[0], again[1], res[2] + again[2], again[3], res[4] + again[4])
            )
            if res[1] == "optimal" or res[1] in _FAILED:
                start = a if res[1] == "optimal" else start
                break
        assert res is not None  # ``order`` is never empty: ``sequence`` holds a setting at least
        out.append(res + (tried,))
    return out


class TemplateCache(dict[tuple, _tpl.Template]):
    """Compiled templates by key, with the number of (re)builds of each key in ``builds``."""

    def __init__(self) -> None:
        super().__init__()
        self.builds: dict[tuple, int] = {}


_WORKER_CACHE = TemplateCache()  # in each Dask worker process: its templates, kept between tasks
DASK_RETRIES = 2


def worker_cache_info() -> dict[tuple, int]:
    """``{key: builds}`` of the templates compiled in this process (run it on the workers with
    ``client.run(worker_cache_info)``)."""
    return dict(_WORKER_CACHE.builds)


def _worker(spec, how, shared, pieces, warms):
    return solve_chunk(_WORKER_CACHE, spec, how, shared, pieces, warms)


class OracleBackend(BackendDefaults):
    """The CVXPY correctness oracle for the four blocks (see the module docstring).

    Parameters
    ----------
    solver : CVXPY solver name, or None for the measured default (``"CLARABEL"``).
    tol : the largest accepted scaled KKT residual (``blocks.kkt_residual``) of a solve.
    n_jobs : Dask workers for the independent pieces of a block (1: in this process; -1: one
        per core). ``n_jobs > 1`` starts a Dask ``LocalCluster`` of that many single-threaded
        worker processes on first use (a script then needs the ``if __name__ == "__main__":``
        guard; that is why 1 is the default), with Dask's background work that would take a
        busy worker's core turned off (``cluster.QUIET``). Each worker keeps its compiled
        templates, and its freed memory where this process does (``heap.keep_freed_memory``).
    client : a ``distributed.Client`` of your own cluster (``Client("tcp://scheduler:8786")``):
        the pieces run on its workers, split in as many chunks as it has worker threads (with
        one, the templates' pieces run in this process, and the ReLU rows of ``dask_rows`` on
        its worker, which keeps their Grams between calls). It overrides ``n_jobs``; the
        backend never closes a client it did not start.
    nnls : solve the MSE + ReLU X_L block as a nonnegative least squares (``nnls.py``; else
        by CVXPY).
    exact : solve the blocks that have a faster exact method (``exact.py``: the (leaky) ReLU
        hidden, MSE and cross-entropy last W-blocks with ``rho + gamma > 0``, the
        cross-entropy X_L block after a ReLU) by it, certified by the block's KKT residual;
        the CVXPY template solves the block when that certificate fails. The nnls X_L block
        then shares one Gram matrix between its columns (``False``: the CVXPY templates and
        ``scipy.optimize.nnls`` column by column, as before these methods).
    strict : raise ``SolverInaccurate`` on an inaccurate status or a residual above ``tol``;
        with ``False`` the result has ``converged=False`` and ``info["warning"]``.
    solver_opts : options passed to the solver; they override ``SOLVER_OPTS[solver]`` and every
        entry of ``ATTEMPTS[solver]``.
    budget : parametrised coefficients per piece (columns or rows are grouped up to it).
    polish : after an ``optimal`` solve whose residual exceeds ``tol``, take projected Newton
        steps on the block (``polish.py``); ``False`` returns the solver's point as it is.

    Examples
    --------
    The hidden W-block of a 2-3-2 ReLU network with a proximal term, at lifted X_1 off the
    feed-forward point: by the exact ReLU row method, by CVXPY's templates, by the fast backend.

    >>> import numpy as np
    >>> from fenchel_cvx.blocks import w_block
    >>> from fenchel_cvx.fast import FastBackend
    >>> from fenchel_cvx.network import LiftedNetwork
    >>> net = LiftedNetwork([2, 3, 2], seed=1)
    >>> X0, Y = np.linspace(-1, 1, 10).reshape(2, 5), np.eye(2)[:, [0, 1, 0, 1, 1]]
    >>> Xs = [np.maximum(X + 0.5, 0) for X in net.forward(X0)[0]]
    >>> block = w_block(net, X0, Y, Xs, 0, gamma=1.0, W0=net.W[0])
    >>> res = OracleBackend(tol=1e-8).solve(block)
    >>> res.status, res.residual <= 1e-8, round(float(res.value), 6), res.info["solver"]
    ('optimal', True, 0.393033, 'exact: ReLU rows (dual)')
    >>> by_cvxpy = OracleBackend(tol=1e-8, exact=False).solve(block)
    >>> by_fast = FastBackend(tol=1e-10).solve(block)
    >>> by_cvxpy.info["solver"], [bool(np.abs(r.argmin - res.argmin).max() < 1e-8)
    ...                           for r in (by_cvxpy, by_fast)]
    ('CLARABEL', [True, True])
    """

    name = "cvxpy"

    def __init__(
        self,
        solver: str | None = None,
        tol: float = 1e-7,
        n_jobs: int = 1,
        nnls: bool = True,
        strict: bool = True,
        solver_opts: dict[str, Any] | None = None,
        budget: int = DEFAULT_BUDGET,
        polish: bool = True,
        client: Any = None,
        exact: bool = True,
    ) -> None:
        installed = cp.installed_solvers()
        name = DEFAULT_SOLVER if solver is None else str(solver).upper()
        if name not in installed:
            raise ValueError(
                f"solver must be one of the installed solvers {installed}, got {solver!r}"
            )
        tol = check("tol", tol, TOL)  # the one tolerance rule (validation.TOL)
        if n_jobs == -1:
            n_jobs = os.cpu_count() or 1
        if not (isinstance(n_jobs, int) and n_jobs >= 1):
            raise ValueError(f"n_jobs must be a positive integer or -1, got {n_jobs!r}")
        if not (isinstance(budget, int) and budget >= 1):
            raise ValueError(f"budget must be a positive integer, got {budget!r}")
        self.solver, self.tol, self.n_jobs = name, float(tol), n_jobs
        self.nnls, self.strict, self.exact = bool(nnls), bool(strict), bool(exact)
        self.solver_opts = {**SOLVER_OPTS.get(name, {}), **(solver_opts or {})}
        self.attempts = ATTEMPTS.get(name, ((), ()))
        self.budget, self.polish = budget, bool(polish)
        self._templates = TemplateCache()
        self._client = client
        self._own: tuple[Any, Any] | None = None  # (client, cluster) of a LocalCluster started here
        self._worker_rows: _dask_rows.WorkerRows | None = None
        if client is not None:
            if not callable(getattr(client, "submit", None)):
                raise ValueError(f"client must be a distributed.Client, got {client!r}")
            self.n_jobs = max(1, sum(client.nthreads().values()))
        # with Dask workers, as many threads as workers (at most this machine's cores) for the
        # figures that certify a block (``column_threads``): the exact methods' certificates,
        # the values here and the driver's checks, which run while the workers wait
        dask = self.n_jobs > 1 or client is not None
        self.check_threads = min(self.n_jobs, cores()) if dask else 1

    def settings(self) -> dict[str, Any]:
        """What decides its solves, as a run's history records them (``fit_bcd``'s config
        ``backend_settings``): not the workers, nor ``strict``, which only decides whether an
        inaccurate solve raises."""
        return dict(
            solver=self.solver,
            tol=self.tol,
            solver_opts=self.solver_opts,
            nnls=self.nnls,
            exact=self.exact,
            polish=self.polish,
            budget=self.budget,
        )

    def __repr__(self):
        return (
            f"OracleBackend(solver={self.solver!r}, tol={self.tol}, n_jobs={self.n_jobs}, "
            f"nnls={self.nnls}, strict={self.strict})"
        )

    # --- housekeeping ---------------------------------------------------------------------
    def cache_info(self) -> dict[tuple, int]:
        """``{key: builds}`` of the templates compiled in this process (workers keep their own).

        A key is ``(builder, dims, activations)``; ``builds`` counts compilations: re-solves with
        new parameter values do not add any, new constants (a W-block's X~) rebuild in place.
        """
        return dict(self._templates.builds)

    def close(self, wait: bool = True) -> None:
        """Shut down the LocalCluster this backend started (a user's client is left alone) and
        remove the files through which data went to the workers."""
        if self._worker_rows is not None:
            self._worker_rows.close()
        if self._own is not None:
            client, cluster = self._own
            self._own, self._client, self._worker_rows = None, None, None
            client.close()
            cluster.close()

    def __del__(self):
        try:
            self.close(wait=False)
        except Exception:
            pass

    # --- solving --------------------------------------------------------------------------
    def solve(self, block: Block, start: Array | None = None) -> BlockResult:
        """Solve ``block`` exactly; ``start`` warm-starts solvers that can use it (OSQP, SCS).

        A W-block with ``rho + gamma = 0`` (not strictly convex) is first checked for a
        minimiser (``wellposed.check_minimiser``: ``NoMinimiser`` with the remedy, before any
        solve), then solved by proximal steps from ``start`` (``wellposed.proximal_point``) and
        certified by its own KKT residual, which is zero at every minimiser, unique or not.
        """
        t0 = time.perf_counter()
        check_block(block)
        if _wp.by_proximal_point(block):
            _wp.check_minimiser(block)
            return self._solve_by_prox(block, start, t0)
        return self._solve_exact(block, start, t0)

    def _solve_by_prox(self, block: WBlock, start: Array | None, t0: float) -> BlockResult:
        start = np.zeros(block.shape) if start is None else np.asarray(start, dtype=float)
        W, residual, steps, iters = _wp.proximal_point(
            block, start, lambda sub: self._solve_exact(sub, None, time.perf_counter()), self.tol
        )
        info: dict[str, Any] = {
            "solver": f"{self.solver} proximal point",
            "proximal_steps": steps,
            "duality_gap": None,
            "n_subproblems": steps,
        }
        if residual > self.tol:
            info["solver"] += (
                f" after {steps} steps; rho + gamma = 0, so the block is not "
                "strictly convex and its minimisers lie far from the start: set "
                "rho > 0 or gamma > 0 for this layer"
            )
        return self._finish(block, W, "optimal", iters, info, t0, polish=False)

    def _solve_exact(self, block: Block, start: Array | None, t0: float) -> BlockResult:
        info: dict[str, Any] = {"solver": self.solver}
        found = None
        if self.exact:
            found = _exact.attempt(block, start, self.tol, self._rows_on(), self.check_threads)
        if found is not None and found.certified:
            return self._finish(
                block,
                found.argmin,
                "optimal",
                found.iterations,
                found.info,
                t0,
                (found.residual, found.value),
            )
        if found is not None:  # the method's certificate failed: the CVXPY template solves it
            info["exact_fallback"] = found.reason
        if self.nnls and _nnls.applies(block):
            try:
                Z = self._nnls(block)
            except RuntimeError as exc:
                raise SolverError(block.kind, block.layer, "nnls_failed", str(exc)) from None
            info.update(solver="nnls", duality_gap=None, n_subproblems=Z.shape[1])
            return self._finish(block, Z, "optimal", 0, info, t0)
        why = beyond_reach(block, exact=False)  # the template's own bound, where it is taken
        if why is not None:
            raise SolverError(block.kind, block.layer, "beyond_reach", why)
        plan = _tpl.plan(block, self.budget)
        argmin, status, iters, gaps, retried = self._solve_plan(block, plan, start)
        gap = None if any(g is None for g in gaps) else float(sum(gaps)) * plan.scale
        info.update(
            retries=retried, duality_gap=gap, n_subproblems=sum(p.size for p in plan.pieces)
        )
        return self._finish(block, argmin, status, iters, info, t0)

    def _nnls(self, block):
        m = block.U_prev.shape[1]
        if self.n_jobs == 1 or m < 8 * self.n_jobs:
            return _nnls.solve_x_last(block, self.exact)
        bounds = np.linspace(0, m, self.n_jobs + 1).astype(int)
        parts = self._run(
            block,
            [
                (
                    _nnls.solve_columns,
                    block.dense_W(),
                    block.Y[:, a:b],
                    block.U_prev[:, a:b],
                    block.lam_in,
                    self.exact,
                )
                for a, b in zip(bounds[:-1], bounds[1:])
            ],
        )
        return np.concatenate(parts, axis=1)

    def _rows_on(self):
        """With Dask (``n_jobs > 1`` or a client, even of one worker: the workers keep the
        rows' Grams between calls): the driver's side of the rows on the workers
        (``dask_rows.WorkerRows``: the data sent once, by digest), made once; else None."""
        if self.n_jobs == 1 and self._client is None:
            return None
        if self._worker_rows is None:
            self._worker_rows = _dask_rows.WorkerRows(self._dask, threads=self.check_threads)
        return self._worker_rows

    def _dask(self):
        """The Dask client: the user's, or a LocalCluster of ``n_jobs`` workers started once."""
        if self._client is None:
            self._own = _cluster.local_cluster(self.n_jobs)
            self._client = self._own[0]
        return self._client

    def _run(self, block, tasks):
        """Run ``(function, *args)`` tasks on the Dask workers; all results, or a SolverError.

        A task whose worker is lost is retried (``DASK_RETRIES``) on another worker; if it still
        fails, or the scheduler cannot be reached, the block fails as a whole: no partial block.
        """
        try:
            client = self._dask()
            futures = [client.submit(*task, pure=False, retries=DASK_RETRIES) for task in tasks]
            return client.gather(futures)
        except Exception as exc:  # lost workers, unreachable scheduler, errors in a task
            raise _dask_rows.distributed_error(block, "pieces", exc) from exc

    def _solve_plan(self, block, plan, start):
        key, size = plan.key, plan.dims[-1]
        warms = None
        if start is not None and self.solver in ("OSQP", "SCS"):
            start = np.asarray(start, dtype=float)
            warms = [
                _tpl.pad(start[:, p.index] if plan.axis else start[p.index], plan.axis, size)
                for p in plan.pieces
            ]
        values = [p.values for p in plan.pieces]
        opts = {**_block_opts(self.solver, block), **self.solver_opts}
        if not values:
            results = []
        elif self.n_jobs == 1 or len(values) == 1:
            spec, how = TemplateSpec(key, plan.acts, plan.consts), self._how(opts)
            results = solve_chunk(self._templates, spec, how, plan.shared, values, warms)
        else:
            results = self._parallel(block, key, plan, opts, values, warms)
        argmin = np.empty(block.shape)
        worst, iters, gaps, retried = "optimal", 0, [], 0
        for piece, (x, status, it, gap, _, tried) in zip(plan.pieces, results):
            iters += it
            gaps.append(gap)
            retried += tried
            if status != "optimal":
                where = f"{'columns' if plan.axis else 'rows'} {_describe(piece.index)}"
                if x is None or status not in _REFINABLE:
                    cls = SolverInfeasible if status in _FAILED else SolverError
                    raise cls(block.kind, block.layer, status, f"{self.solver}, {where}")
                worst = status  # refined and judged by its KKT residual in _finish
            if plan.axis == 1:
                argmin[:, piece.index] = x[:, : piece.size]
            else:
                argmin[piece.index] = x[: piece.size]
        for cols, Z in plan.fixed:
            argmin[:, cols] = Z
        return argmin, worst, iters, gaps, retried

    def _how(self, opts):
        """This backend's :class:`SolveWith` with the block's options ``opts``."""
        return SolveWith(self.solver, opts, self.attempts)

    def _parallel(self, block, key, plan, opts, values, warms):
        n = min(self.n_jobs, len(values))
        bounds = np.linspace(0, len(values), n + 1).astype(int)
        chunks = self._run(
            block,
            [
                (
                    _worker,
                    TemplateSpec(key, plan.acts, plan.consts),
                    self._how(opts),
                    plan.shared,
                    values[a:b],
                    None if warms is None else warms[a:b],
                )
                for a, b in zip(bounds[:-1], bounds[1:])
            ],
        )
        return [r for chunk in chunks for r in chunk]

    def _finish(self, block, argmin, status, iters, info, t0, certified=None, polish=True):
        """The ``BlockResult`` of ``argmin`` clipped into the block's domain, polished where its
        KKT residual misses ``tol``; ``certified``: ``(residual, value)`` an exact method's
        certificate computed from ``argmin`` (taken where the clip moved nothing)."""
        argmin, info["projected"] = _into_domain(block, argmin)
        if certified is None or info["projected"]:
            certified = self._figures(block, argmin)
        residual, value = certified
        info["solver_residual"], info["polish_steps"] = residual, 0
        if residual > self.tol and polish and self.polish and status in _REFINABLE:
            argmin, info["polish_steps"] = _polish.polish(block, argmin, POLISH_TARGET * self.tol)
            residual, value = self._figures(block, argmin)
        if status in _REFINABLE and residual <= self.tol:
            # an inaccurate solver point that the Newton polish finished: its KKT residual is
            # the proof of optimality, whatever the solver said
            info["solver_status"], status = status, "optimal"
        converged = status == "optimal"
        if not math.isfinite(value):
            raise SolverError(block.kind, block.layer, status, f"non-finite block value {value}")
        if residual > self.tol:
            msg = f"KKT residual {residual:.3g} > tol {self.tol:.3g} ({info['solver']})"
            if self.strict:
                raise SolverInaccurate(block.kind, block.layer, status, msg)
            converged = False
            info["warning"] = msg
        elif not converged:
            info["warning"] = f"solver status {status!r} accepted with strict=False"
        return BlockResult(
            argmin=argmin,
            value=value,
            status=status,
            residual=residual,
            seconds=time.perf_counter() - t0,
            iterations=iters,
            converged=converged,
            info=info,
        )

    def _figures(self, block, Z):
        """``(KKT residual, value)`` of ``block`` at ``Z``, on ``check_threads`` threads."""
        found = figures(block, Z, threads=self.check_threads)
        return found.residual, found.value


@functools.singledispatch
def _into_domain(block, Z):
    """Clip a solver's point into the block's domain (solvers are feasible only to their tolerance).

    An X-block's domain is the range of ``act_in``; for sigmoid and tanh (F' is infinite on the
    boundary of [0, 1], [-1, 1]) the clip keeps 1e-12 inside; a W-block is unconstrained. Returns
    the point and the largest distance moved (recorded in ``info["projected"]``).
    """
    return Z, 0.0


@_into_domain.register
def _(block: XBlock, Z):
    lo, hi = block.act_in.v_range
    if block.act_in.open_range:
        lo, hi = lo + 1e-12, hi - 1e-12
    # a point inside is returned as it is: two reductions, no array of Z's size (Figure 1's X_1
    # is 144 MB); a NaN fails the test and is clipped, its distance NaN
    if not Z.size or lo <= float(np.min(Z)) and float(np.max(Z)) <= hi:
        return Z, 0.0
    C = np.clip(Z, None if math.isinf(lo) else lo, None if math.isinf(hi) else hi)
    return C, float(np.max(np.abs(C - Z)))


def _describe(index):
    if isinstance(index, slice):
        return f"{index.start}..{index.stop - 1}"
    index = np.asarray(index)
    return f"{index[0]}..{index[-1]}" if len(index) else "none"
