"""Block coordinate descent on the lifted objective: the paper's Algorithms 1 and 2.

``fit_bcd(net, X0, Y)`` minimises the lifted objective (eq. (7) of the paper; docs/mathematics.md)

    F(W, X) = L(Y, W_L X~_L) + sum_l rho_l ||W_l||^2 + sum_{l<L} lam_l B_l(X_{l+1}, W_l X~_l)

one convex block at a time (``blocks.py``), each block solved by a *backend*: ``"cvxpy"`` (the
oracle: every block to certified optimality) or ``"fast"`` (array solvers), or any object with
``.solve(block, start) -> BlockResult``. The driver is the same for every backend.

A *round* is one X-sweep then one W-sweep:

- X-sweep: the blocks X_L, X_{L-1}, ..., X_1 (backwards), each ``min_Z`` with the rest fixed;
- W-sweep: the blocks W_L, W_{L-1}, ..., W_0 (given X they are independent of each other).

**Algorithm 1** (``batch_size=None``): X starts at the feed-forward point; ``iterations`` rounds
on all the data. **Algorithm 2** (integer ``batch_size``): ``epochs`` passes over the batches of
``datasets.batch_order(m, batch_size, epochs, seed=net.seed)`` (the schedule the backprop
baselines share); per batch ``W0 <- W``, X <- the feed-forward pass on the batch, then
``alternations`` (K) rounds on the batch with the proximal term ``gamma_l ||W_l - W0_l||^2`` in
each W-block. A ``batch_size >= m`` is allowed: every epoch is then one batch of all the data,
taken in the data's own column order (the blocks' objectives are sums over the columns), so the
driver trains on ``X0`` itself, not on a permuted copy.
``iterations`` is used by Algorithm 1 only, ``epochs`` and ``alternations`` by Algorithm 2 only.
A ``gamma > 0`` in Algorithm 1 makes it proximal: W0 is the W at the start of each iteration.

**Momentum** (``momentum=beta``, a number or one per layer, in [0, 1); default 0: the paper's
algorithms). Where W0 is set (a new batch; every iteration of Algorithm 1), W first moves on
along its last change, ``W <- W + beta_l (W - W_prev)``, W_prev the weights the previous such
point saw: the inertial (heavy-ball) extrapolation of proximal BCD (Pock & Sabach's iPALM). The
feed-forward pass, the proximal centre W0 and the blocks' starts are all the extrapolated
point, so every block is the same convex problem as without momentum and the four checks
hold unchanged; only the run's objective may rise *between* rounds, at the extrapolation. It
accumulates the small, steady steps of layers far from the loss (LeNet-5's conv layers,
docs/results.md, "LeNet-5: momentum"). A run returns its last W_prev (``BCDResult.W_prev``) and
takes one (``W_prev=``), so that momentum goes on across runs on successive batches
(``FenchelClassifier.partial_fit``) as within one.

**Restart rule.** Before each X-sweep on carried-over X (every round but the first of a run or a
batch) the driver compares F(W, X) with J(W) = F(W, X^ff): after the W-sweep the old X may be
worse than the feed-forward point of the new weights; then X restarts from the feed-forward
point (recorded as ``restarted``). Restarting lowers F, so the run (without momentum, above)
stays a descent method, and the exact X-sweep from the feed-forward point keeps the lower bound
F(W, X) <= J(W) (check 3).

Every round runs the four checks of ``certificate.py`` (``check_every=k``: every k-th round and
the last; the rounds between check block optimality only); ``strict`` (default: True for the
``"cvxpy"`` oracle, False otherwise) raises ``CertificateError`` at the first violation. Block
optimality trusts no backend: the driver checks that every returned argmin has the block's
shape, is finite and lies in the block's domain, and recomputes its KKT residual
(``blocks.kkt_residual``, against ``tol``) from the point itself. A backend's ``SolverError``
propagates in strict mode; otherwise it is recorded as a ``block_optimality`` violation and the
block keeps its current value. In recorded mode (``strict=False``) an unusable argmin (NaN, inf,
outside the domain) is recorded against its own block, which keeps its value, and the run stops
after that round (its record has ``halted`` = the block's name) with its history kept; an
oracle built by name is then non-strict too, so inaccurate solves are recorded, not thrown away.

**Structure.** ``fit_bcd`` validates its arguments, builds the run's ``schedule`` (a list of
``Step``: position, whether a new batch starts) and a ``BCDState`` (weights, lifted X, W0,
position, history), and runs ``_run``: for each step, X-sweep, W-sweep, record, then the
observers (the callback, the progress bar, the checkpoint writer). A checkpoint
(``fit_bcd(checkpoint=DIR)``, ``io.py``) stores the state; ``resume=DIR`` continues the same
schedule from it, so an interrupted and resumed run ends bit-identical to the same run
uninterrupted, on the same BLAS threads (``tests/test_resume.py``; a checkpoint also drops the
fast backend's reused Gram factorisations, which a resumed run starts without). It refuses a
checkpoint of another run: other data, network or settings (the history's config, the backend's
``settings()`` among them; a checkpoint written before those were recorded is taken as this
run's). Ctrl-C (``KeyboardInterrupt``) between or inside rounds writes the state of the last
finished round, then re-raises.

The driver works in the array library of ``X0`` (NumPy; CuPy on a GPU with ``backend="fast"``:
any array-API library, ``array_api_strict`` in the tests); the network's weights move there
(``net.W`` becomes arrays of that library) once every argument is validated. The oracle takes
NumPy only. It returns ``BCDResult(net, Xs, history)``: the trained
network (the same object, updated in place), the final lifted variables and the
:class:`~fenchel_cvx.history.History`. After the last W-sweep every W-block is optimal at the
returned ``(net.W, Xs)`` (W-blocks depend on X only), so anyone can re-check them with
``blocks.w_block(net, X0, Y, Xs, l)``; in Algorithm 2, ``Xs`` belong to the last batch
(``result.batch`` holds its column indices).
"""
from __future__ import annotations

import contextlib
import json
import math
import numbers
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from array_api_compat import array_namespace

from . import defaults
from .arrays import cheap_reads, namespace
from .backends import (BACKENDS, STRICT_AWARE, check_backend,  # noqa: F401 (importable from bcd)
                       get_backend, optional)
from .blocks import kkt_residual, w_block, x_block
from .certificate import Certificate, argmin_usable
from .datasets import batch_order
from .errors import SolverError
from .history import History, _plain
from .network import LiftedNetwork
from .validation import (BOOL, CALLABLE, COUNT, GAMMA, MOMENTUM, PATH, ROUNDS, TOL, PerLayer,
                         check, check_rounds, validate)


# --- result ---------------------------------------------------------------------------------
@dataclass
class BCDResult:
    """What ``fit_bcd`` returns (see the module docstring)."""

    net: object
    Xs: list
    history: History
    batch: object = None     # Algorithm 2: the column indices of the last batch (Xs's columns)
    W_prev: object = None    # momentum: the weights before the last extrapolation (a next run's)


# --- validation (the checks themselves: validation.py) ---------------------------------------
def _weights_in(xp, net):
    """The network's weights as arrays of ``xp`` (the data's library), without changing net."""
    try:
        return [W if namespace(W) is xp else xp.asarray(W) for W in net.W]
    except (TypeError, ValueError):
        raise ValueError(f"net.W must be arrays the data's library ({xp.__name__}) can take, got "
                         f"{type(net.W[0]).__module__}.{type(net.W[0]).__name__}") from None


def _check_data(net, X0, Y, xname="X0", yname="Y", xp=None):
    """Data and targets in the network's dtype (no silent upcast of float32) and ``xp``."""
    xp = namespace(X0) if xp is None else xp
    X0, Y = net.check_inputs(X0, Y, dtype=net.W[0].dtype, xp=xp, names=(xname, yname))
    net.loss.check_targets(yname, Y, xp)
    return X0, Y


def is_one_hot(Y):
    """True iff every column of Y is a standard basis vector (a classification target)."""
    xp = namespace(Y)
    Y = xp.asarray(Y)
    return (math.prod(Y.shape) > 0 and bool(xp.all((Y == 0) | (Y == 1)))
            and bool(xp.all(xp.sum(Y, axis=0) == 1)))


# --- evaluation -----------------------------------------------------------------------------
def evaluate(net, X0, Y, classification=None):
    """Feed-forward ``(loss per data point, accuracy or None)`` of ``net`` on ``(X0, Y)``."""
    if classification is None:
        classification = is_one_hot(Y)
    Yhat = net.forward(X0)[1]
    loss = float(net.loss.value(Y, Yhat)) / Y.shape[1]
    xp = namespace(Yhat)
    hit = xp.argmax(Yhat, axis=0) == xp.argmax(Y, axis=0)
    acc = float(xp.mean(xp.astype(hit, Yhat.dtype))) if classification else None
    return loss, acc


# --- one round ------------------------------------------------------------------------------
class _Halt(Exception):
    """Recorded mode: a block returned a point that cannot be used (NaN, outside its domain)."""

    def __init__(self, block):
        super().__init__(block)
        self.block = block


class _Round:
    """The X-sweep, the W-sweep and the checks of one round on data (X0, Y).

    With ``check=False`` the objective-based checks (descent, lower bound, Fenchel-Young) and
    the objective values they need are skipped; block statuses are still checked.
    """

    def __init__(self, backend, net, cert, gamma, W0, check=True):
        self.backend, self.net, self.cert, self.gamma, self.W0 = backend, net, cert, gamma, W0
        self.check = check
        self.blocks = []
        self.held = {}      # layer l -> W_l X~_l at the current W_l, X_l, where a pass held it
        # an unchecked round where reads are not cheap (a GPU) reads its blocks' argmin checks
        # at once, at its end (``settle``): (name, block, argmin, start, its slot, the check's
        # 0-d flag, the records and violations before it)
        self.defer = not check and not cheap_reads(array_namespace(net.W[0]))
        self.pending = []

    def prox(self):
        return float(sum(g * array_namespace(W).sum((W - W0) ** 2)
                         for g, W, W0 in zip(self.gamma, self.net.W, self.W0) if g))

    def _solve(self, name, block, current, scale, slot):
        """Solve ``block`` from ``current`` (``slot[0][slot[1]]``, where the caller puts the
        result): ``(argmin, value change or 0, A(W, X) + b or None)``."""
        before = float(block.value(current)) if self.check else None
        t0 = time.perf_counter()
        try:
            res = self.backend.solve(block, start=current)
        except SolverError as err:
            if self.cert.strict:
                raise
            self.cert._fail("block_optimality", name, math.nan, 0.0, self.cert.tol, str(err))
            self.blocks.append(dict(block=name, kind=block.kind, layer=block.layer,
                                    value_before=before, value_after=before,
                                    seconds=time.perf_counter() - t0, solver_seconds=None,
                                    status=f"error: {err.status}", residual=None, iterations=None,
                                    converged=False))
            return current, 0.0, None
        wall = time.perf_counter() - t0
        Z = res.argmin
        # the certificate trusts no report: the argmin must be usable (every round), and on every
        # checked round (check_every) its KKT residual is recomputed here from the point itself;
        # the rounds between check the point and the status only, and their records say so
        usable = self._argmin_check(name, block, Z, current, slot)
        residual = kkt_residual(block, Z) if usable and self.check else None
        record = dict(block=name, kind=block.kind, layer=block.layer, value_before=before,
                      value_after=before, seconds=wall, solver_seconds=float(res.seconds),
                      status=res.status, residual=residual, reported_residual=float(res.residual),
                      iterations=int(res.iterations), converged=bool(res.converged))
        if not usable:          # recorded mode (strict raised): the block keeps its value, stop
            self.blocks.append(record)
            raise _Halt(name)
        self.cert.check_block(name, res, residual, capped=_capped(self.backend, block, res))
        after = float(res.value)  # the backend's value; the descent check recomputes it
        if self.check:
            after = float(block.value(Z))
            self.cert.check_descent(name, before, after, scale)
        record["value_after"] = after
        self.blocks.append(record)
        return Z, (after - before) if self.check else 0.0, res.U

    def _argmin_check(self, name, block, Z, current, slot):
        """The certificate's argmin check (finite, in the block's domain), read at once, or
        deferred to ``settle`` (``defer``): then True, unless Z is no array of the block's
        shape."""
        flag = argmin_usable(block, Z, current.shape) if self.defer else None
        if flag is None or flag is False:   # not deferred, or not even an array of the shape
            return self.cert.check_argmin(name, block, Z, current.shape)
        self.pending.append((name, block, Z, current, slot, flag, len(self.blocks),
                             len(self.cert.violations)))
        return True

    def settle(self):
        """The deferred argmin checks, in one read. Where one fails, the round goes back to
        where that block began (every block from it on keeps its start: the later ones were
        solved from an unusable point) and the block fails by name (strict: raises; recorded:
        the run halts after the round)."""
        pending, self.pending = self.pending, []
        if not pending:
            return
        xp = array_namespace(pending[0][2])
        if bool(xp.all(xp.stack([flag for *_, flag, _, _ in pending]))):
            return
        first = next(i for i, p in enumerate(pending) if not bool(p[5]))
        for _, _, _, current, (seq, i), *_ in reversed(pending[first:]):
            seq[i] = current
        name, block, Z, current, _, _, n_blocks, n_violations = pending[first]
        del self.blocks[n_blocks + 1:]
        if n_blocks < len(self.blocks):     # (strict: its status may have raised before it)
            self.blocks[n_blocks]["value_after"] = self.blocks[n_blocks]["value_before"]
        del self.cert.violations[n_violations:]
        self.cert.check_argmin(name, block, Z, current.shape)
        raise _Halt(name)

    def x_sweep(self, X0, Y, Xs, F, Us=None):
        """The X-blocks X_L, ..., X_1; updates the list ``Xs`` in place (kept if a block halts).

        ``Us``: the pre-activations of the feed-forward pass that gave ``Xs`` at the current
        weights (a fresh X): X_l's block takes U_{l-1} and, for its start, U_l from it (X_{l-1}
        is solved after X_l).
        Kept for the W-blocks (``held``), whose weights do not change before them: U_0 from
        ``Us``, and each solver's ``A(W_l, X_l) + b`` at its returned X_l (``BlockResult.U``)."""
        if Us is not None:
            self.held[0] = Us[0]
        for l in range(self.net.n_hidden, 0, -1):
            block = x_block(self.net, X0, Y, Xs, l, U_prev=None if Us is None else Us[l - 1],
                            U=None if Us is None else Us[l])
            Xs[l - 1], delta, self.held[l] = self._solve(f"X_{l}", block, Xs[l - 1], F,
                                                         (Xs, l - 1))
            F = None if F is None else F + delta
        return Xs

    def w_sweep(self, X0, Y, Xs, F, Xt0=None):
        """The W-blocks W_L, ..., W_0, each from the W_l X~_l the X-sweep ``held`` (W_0 and the
        data as the feed-forward pass saw them; W_l as X_l's solver did); ``Xt0``: the data's
        patches X~_0, if at hand (the feed-forward pass formed U_0 from them)."""
        net = self.net
        for l in range(net.n_hidden, -1, -1):
            g = self.gamma[l]
            block = w_block(net, X0, Y, Xs, l, gamma=g, W0=self.W0[l] if g else None,
                            U=self.held.get(l), Xt=Xt0 if l == 0 else None)
            net.W[l], delta, _ = self._solve(f"W_{l}", block, net.W[l], F, (net.W, l))
            F = None if F is None else F + delta


def _capped(backend, block, res):
    """Whether ``block`` stopped at the step cap its backend was configured with
    (``FastBackend(w_steps=..., x_steps=...)``: ``steps_of``), status ``"max_iter"``."""
    steps_of = optional(backend, "steps_of")
    cap = None if steps_of is None else steps_of(block)[1]
    return cap is not None and res.status == "max_iter" and res.iterations == cap


def _round(backend, net, cert, X0, Y, Xs, gamma, W0, fresh, check=True, Us=None, Xt0=None):
    """One round on (X0, Y) from lifted variables Xs; returns (Xs, record).

    ``check=False``: no objective values and no objective-based checks (see ``fit_bcd``'s
    ``check_every``); the restart rule on carried-over X still runs. ``Us``: with fresh X, the
    pre-activations of the feed-forward pass that gave them (``x_sweep``).
    """
    t0 = time.perf_counter()
    r = _Round(backend, net, cert, gamma, W0, check)
    J = F0 = None
    if check or not fresh:
        J = net.network_objective(X0, Y)
        F0 = J if fresh else net.lifted_objective(X0, Y, Xs)
        if F0 > J:  # the restart rule (carried-over X only: fresh X have F0 == J)
            (Xs, Us), F0 = net.feed_forward(X0), J
            cert.restarted = True
    Xs, halted = list(Xs), None
    F_x = B_x = None
    after_w = dict(lifted_w=None, network_w=None, divergence_w=None)
    try:
        try:
            r.x_sweep(X0, Y, Xs, None if F0 is None else F0 + r.prox(), Us)
            if check:
                F_x, B_x = net.lifted_objective(X0, Y, Xs), net.divergences(X0, Xs)
                cert.check_lower_bound(F_x, J)
            r.w_sweep(X0, Y, Xs, None if F_x is None else F_x + r.prox(), Xt0)
            if check:
                cert.check_fenchel_young(net, X0, Xs)
                after_w = dict(lifted_w=net.lifted_objective(X0, Y, Xs),
                               network_w=net.network_objective(X0, Y),
                               divergence_w=net.divergences(X0, Xs))
        except Exception:
            r.settle()        # an unusable argmin earlier in the round fails by name instead
            raise
        r.settle()
    except _Halt as stop:     # recorded mode: the run ends after this round, its history kept
        halted = stop.block
    # the proximal term's value (a read: where reads are not cheap, on checked rounds only)
    record = dict(m=int(X0.shape[1]), lifted_x=F_x, network_x=J if check else None, **after_w,
                  prox=None if r.defer else r.prox(), divergence_x=B_x,
                  restarted=bool(cert.restarted), checked=check, blocks=r.blocks, halted=halted)
    record["seconds"] = time.perf_counter() - t0
    return Xs, record


# --- the schedule -------------------------------------------------------------------------
@dataclass(frozen=True)
class Step:
    """One round of a run's schedule: its position and what starts with it."""

    iteration: int       # 1, 2, ... over the run
    epoch: object        # Algorithm 2: epoch, batch and alternation (k), from 1; None in Alg. 1
    batch: object
    alternation: object
    idx: object          # the batch's column indices; None: all the data
    new_x: bool          # X <- the feed-forward point on the batch
    new_w0: bool         # W0 <- W (the centre of the proximal term)
    end_of_epoch: bool   # the last round of an epoch (of the run, in Algorithm 1)
    last: bool           # the last round of the run


def schedule(m: int, batch_size: int | None, epochs: int, iterations: int, alternations: int,
             seed: int) -> list[Step]:
    """The rounds of Algorithm 1 (``batch_size=None``) or Algorithm 2, in order.

    Algorithm 2's batches are ``datasets.batch_order(m, batch_size, epochs, seed)``: a pure
    function of the seed, so a run's position in it (``BCDState.iteration``) is all the random
    state a checkpoint needs. A ``batch_size >= m`` gives every epoch the one batch
    ``arange(m)``: all the data in their own order.
    """
    if batch_size is None:
        return [Step(i, None, None, None, None, i == 1, True, i == iterations, i == iterations)
                for i in range(1, iterations + 1)]
    order = (batch_order(m, batch_size, epochs, seed=seed) if batch_size < m
             else [[np.arange(m)]] * epochs)
    steps = []
    for e, batches in enumerate(order, start=1):
        for b, idx in enumerate(batches, start=1):
            for k in range(1, alternations + 1):
                end = b == len(batches) and k == alternations
                steps.append(Step(len(steps) + 1, e, b, k, idx, k == 1, k == 1, end,
                                  end and e == epochs))
    return steps


# --- the state of a run ---------------------------------------------------------------------
@dataclass
class BCDState:
    """What a run carries from round to round, and all that a checkpoint stores (``io.py``).

    ``W`` the weights after the last finished round, ``Xs`` the lifted variables of the
    current batch, ``W0`` the proximal centre, ``iteration`` the rounds done (the position in
    the schedule), ``history`` the records so far, ``W_prev`` the weights before the last
    extrapolation (``momentum``; None before the first).
    """

    W: list
    history: History
    Xs: object = None
    W0: object = None
    iteration: int = 0
    W_prev: object = None

    def advance(self, net, Xs, record, W_prev=None):
        self.W, self.Xs, self.iteration = list(net.W), Xs, record["iteration"]
        self.W_prev = self.W_prev if W_prev is None else W_prev
        self.history.append(record)


class _Data:
    """The training data and its batches (column gathers, the last one cached). Unbatched
    (Algorithm 1, or ``batch_size >= m``, whose one batch is all the data in order:
    ``schedule``) every round gets the data themselves."""

    def __init__(self, X0, Y, xp, batched):
        self.X0, self.Y, self.xp, self.batched, self._last = X0, Y, xp, batched, (None, X0, Y)
        # from a column-major copy each batch is one contiguous block per point (MNIST, 784 x
        # 60,000 float32: 0.1 ms a batch instead of 3 ms)
        self.cols = np.asfortranarray(X0) if batched and xp is np else X0

    def batch(self, idx):
        if not self.batched:
            return self.X0, self.Y
        if idx is not self._last[0]:
            if self.xp is np:
                Xb, Yb = np.ascontiguousarray(self.cols[:, idx]), self.Y[:, idx]
            else:
                j = self.xp.asarray(idx)
                Xb, Yb = self.xp.take(self.X0, j, axis=1), self.xp.take(self.Y, j, axis=1)
            self._last = (idx, Xb, Yb)
        return self._last[1:]


# --- the loop: Algorithms 1 and 2 -----------------------------------------------------------
def _threads(backend):
    """``limit_threads(backend.threads)`` (``threads.py``), or nothing if it sets none."""
    threads = getattr(backend, "threads", None)
    if threads is None:
        return contextlib.nullcontext()
    from .threads import limit_threads

    return limit_threads(threads)


def _run(net, data, steps, state, run, observers):
    """For each round of the schedule: on a new batch X <- feed-forward and W0 <- W; then the
    X-sweep and the W-sweep (``_round``, with the restart rule and the checks); then record.
    An observer returning True stops the run."""
    xp = data.xp
    for step in steps[state.iteration:]:
        Xb, Yb = data.batch(step.idx)
        Us = Xt0 = W_prev = None
        if step.new_w0 and any(run.momentum):   # the state takes W_prev once the round is done
            W_prev = _extrapolate(net, state.W_prev, run.momentum, xp)
        if step.new_x:     # the data's patches serve the feed-forward pass and W_0's block
            Xt0 = net.layers[0].patches(Xb)
            Xs, Us = net.feed_forward(Xb, Xt0)
            state.Xs = list(Xs)
        if step.new_w0:
            state.W0 = ([xp.asarray(W, copy=True) for W in net.W] if any(run.gamma)
                        else [None] * len(net.W))
        check = step.iteration % run.check_every == 0 or step.last
        run.cert.begin(step.iteration, full=check)
        Xs, rec = _round(run.backend, net, run.cert, Xb, Yb, state.Xs, run.gamma, state.W0,
                         step.new_x, check, Us, Xt0)
        rec = dict(iteration=step.iteration, epoch=step.epoch, batch=step.batch,
                   alternation=step.alternation, **rec, **run.evaluate(net, step))
        rec["certificate"] = run.cert.outcome()
        state.advance(net, Xs, rec, W_prev)
        if any([obs(net, state, step) is True for obs in observers]) or rec["halted"]:
            break   # a callback asked to stop, or recorded mode met an unusable argmin
    return step


def _extrapolate(net, W_prev, beta, xp):
    """Momentum: ``W <- W + beta_l (W - W_prev)`` (none before a first W_prev); returns the W
    before it, the next W_prev."""
    W = [xp.asarray(W, copy=True) for W in net.W]
    if W_prev is not None:
        net.W = [Wl + b * (Wl - Pl) if b else Wl for Wl, Pl, b in zip(W, W_prev, beta)]
    return W


# --- validation of a run --------------------------------------------------------------------
#: the constraints of ``fit_bcd``'s arguments (``validation.py``); gamma's, per layer, need the
#: network, and the data's need its sizes
PARAMETERS = dict(batch_size=[COUNT, None], epochs=ROUNDS, iterations=ROUNDS,
                  alternations=ROUNDS, strict=[BOOL, None], tol=TOL, callback=[CALLABLE, None],
                  progress=BOOL, eval_every=[COUNT, None], check_every=COUNT,
                  checkpoint=[PATH, None], checkpoint_every=COUNT, resume=[PATH, None])


@dataclass
class _Settings:
    """A validated run: the backend, the certificate, gamma, the cadences, the data and its
    schedule, the state to resume from (None: a fresh run), the checkpoints'
    ``(folder, every, data digest)`` and momentum's beta per layer."""

    backend: object
    cert: Certificate
    gamma: list
    check_every: int
    evaluate: object = None
    config: dict = None
    test: tuple = (None, None)   # (X_test, Y_test)
    eval_every: object = 1
    data: object = None
    steps: list = None
    state: object = None
    checkpoint: tuple = (None, 1, None)
    momentum: list = None
    W_prev: list = None          # the first batch's (fit_bcd(W_prev=...)), in the data's library


def _evaluator(X0, Y, X_test, Y_test, classification, eval_every):
    """The train and test evaluation of a round (every ``eval_every`` rounds and at the end of
    every epoch; never for ``eval_every=None``)."""
    def run(net, step):
        due = eval_every is not None and (step.iteration % eval_every == 0 or step.end_of_epoch)
        tr = evaluate(net, X0, Y, classification) if due else (None, None)
        te = (evaluate(net, X_test, Y_test, classification) if due and X_test is not None
              else (None, None))
        return dict(train_loss=tr[0], train_accuracy=tr[1], test_loss=te[0], test_accuracy=te[1])
    return run


def _check_arguments(net, args):
    """``fit_bcd``'s arguments but the data, checked and normalised (gamma=None: the default
    of the algorithm, ``defaults.gamma_for``)."""
    if not (hasattr(net, "layer_sizes") and hasattr(net, "W") and hasattr(net, "forward")):
        raise ValueError(f"net must be a LiftedNetwork, got {type(net).__name__}")
    args = dict(args, **validate(PARAMETERS, {k: args[k] for k in PARAMETERS}))
    gamma = defaults.gamma_for(args["batch_size"]) if args["gamma"] is None else args["gamma"]
    args["gamma"] = check("gamma", gamma, PerLayer(GAMMA, net.n_hidden + 1))
    args["momentum"] = check("momentum", args["momentum"], PerLayer(MOMENTUM, net.n_hidden + 1))
    check_backend(args["backend"])
    if (args["X_test"] is None) != (args["Y_test"] is None):
        raise ValueError("X_test and Y_test must be given together, got only "
                         + ("X_test" if args["Y_test"] is None else "Y_test"))
    return args


def _backend(backend, strict, tol, xp, net):
    """The backend object and its name; a name is built with ``tol`` (and non-strict, so that
    inaccurate solves are recorded, in recorded mode). A backend with ``check_network``
    (per-layer settings: ``FastBackend``) checks ``net`` here, before any work."""
    by_name = isinstance(backend, str)
    opts = dict(strict=False) if strict is False and by_name and backend in STRICT_AWARE else {}
    backend = get_backend(backend, net, tol=tol, **opts)   # a backend object ignores them
    name = getattr(backend, "name", type(backend).__name__)
    if xp is not np and name == "cvxpy":
        raise ValueError(f"backend 'cvxpy' (the oracle) takes NumPy data, got X0 from {xp.__name__}")
    return backend, name


def _config(net, m, m_test, a, backend, name, strict, classification):
    """The run's settings as the history records them; ``backend_settings``: what the backend
    solves its blocks with (its ``settings()``; empty for a backend object without one)."""
    return dict(layer_sizes=list(net.layer_sizes), activations=[x.name for x in net.activations],
                loss=net.loss.name, lam=net.lam, rho=net.rho, gamma=a["gamma"],
                momentum=a["momentum"], momentum_carried=a["W_prev"] is not None,
                batch_size=a["batch_size"], epochs=a["epochs"], iterations=a["iterations"],
                alternations=a["alternations"], backend=name,
                backend_settings=_backend_settings(backend), strict=strict, tol=a["tol"],
                check_every=a["check_every"], seed=net.seed, batch_seed=net.seed, m=m,
                m_test=m_test, task="classification" if classification else "regression",
                algorithm=1 if a["batch_size"] is None else 2)


def _backend_settings(backend):
    """The backend's ``settings()`` as JSON data (none without such a method); a value JSON
    cannot hold (an oracle's ``solver_opts`` may pass a callback) is recorded as its repr."""
    settings = optional(backend, "settings")
    return {} if settings is None else json.loads(json.dumps(_plain(settings()), default=repr))


def _validate(net, X0, Y, args):
    """Check every argument and the data, before any work; return the run's ``_Settings``."""
    a = _check_arguments(net, args)
    xp = namespace(X0)
    X0, Y = _check_data(net, X0, Y, xp=xp)
    X_test, Y_test = a["X_test"], a["Y_test"]
    if X_test is not None:
        X_test, Y_test = _check_data(net, X_test, Y_test, "X_test", "Y_test", xp=xp)
    check_rounds(X0.shape[1], a["batch_size"], a["epochs"], a["alternations"])
    from .io import check_writable_dir, data_digest, load_checkpoint, remove_temporaries

    # a checkpoint failing the checked reader raises FileFormatError, which names the file
    resume = None if a["resume"] is None else _resume_file(a["resume"])
    saved = None if resume is None else load_checkpoint(resume)
    backend, name = _backend(a["backend"], a["strict"], a["tol"], xp, net)
    weights = _weights_in(xp, net)
    strict = (name == "cvxpy") if a["strict"] is None else a["strict"]
    classification = is_one_hot(Y)
    config = _config(net, X0.shape[1], None if X_test is None else X_test.shape[1], a, backend,
                     name, strict, classification)
    # block optimality is judged at the accuracy asked of the backend (its ``tol``, e.g. a
    # FastBackend(tol=1e-3)), never looser than the certificate's own tol
    asked = getattr(backend, "tol", a["tol"])
    residual_tol = max(a["tol"], float(asked)) if isinstance(asked, numbers.Real) else a["tol"]
    run = _Settings(backend, Certificate(strict=strict, tol=a["tol"], residual_tol=residual_tol),
                    a["gamma"], a["check_every"],
                    _evaluator(X0, Y, X_test, Y_test, classification, a["eval_every"]), config,
                    (X_test, Y_test), a["eval_every"], momentum=a["momentum"])
    run.steps = schedule(X0.shape[1], a["batch_size"], a["epochs"], a["iterations"],
                         a["alternations"], net.seed)
    run.data = _Data(X0, Y, xp, a["batch_size"] is not None and a["batch_size"] < X0.shape[1])
    digest = None if a["checkpoint"] is None and saved is None else data_digest(X0, Y)
    run.state = None if saved is None else _restore(net, saved, config, digest, xp, run.steps)
    run.W_prev = _check_W_prev(a["W_prev"], weights, xp, saved is not None)
    # the checkpoint folder last, once every other check passed: a refused run makes none
    ckpt = None if a["checkpoint"] is None else check_writable_dir("checkpoint", a["checkpoint"])
    for folder in {ckpt, None if resume is None else resume.parent}:
        if folder is not None:      # what a run killed while writing there left
            remove_temporaries(folder)
    run.checkpoint = (ckpt, a["checkpoint_every"], digest)
    net.W = weights if run.state is None else list(run.state.W)  # validation done: weights move
    return run


def _check_W_prev(W_prev, weights, xp, resume):
    """``fit_bcd``'s ``W_prev``: None, or one finite array per layer of the weights' shapes
    (not with ``resume``: a checkpoint holds its own), in the data's library and dtype."""
    if W_prev is None:
        return None
    if resume:
        raise ValueError("W_prev and resume exclude each other: a checkpoint holds its own W_prev")
    listed = isinstance(W_prev, Sequence) and not isinstance(W_prev, (str, bytes))
    if not listed or len(W_prev) != len(weights):
        got = f"{len(W_prev)} entries" if listed else type(W_prev).__name__
        raise ValueError(f"W_prev must be a sequence of {len(weights)} arrays (one per layer, "
                         f"as BCDResult.W_prev), got {got}")
    out = []
    for l, (P, W) in enumerate(zip(W_prev, weights)):
        try:
            P = xp.asarray(P, dtype=W.dtype)
        except (TypeError, ValueError):
            raise ValueError(f"W_prev[{l}] must be an array the data's library ({xp.__name__}) "
                             f"can take, got {type(P).__module__}.{type(P).__name__}") from None
        if tuple(P.shape) != tuple(W.shape):
            raise ValueError(f"W_prev[{l}] must have W_{l}'s shape {tuple(W.shape)}, got "
                             f"{tuple(P.shape)}")
        if not bool(xp.all(xp.isfinite(P))):
            raise ValueError(f"W_prev[{l}] must be finite, got NaN or infinite entries")
        out.append(P)
    return out


def _differences(old, new, prefix=""):
    """``[(name, new value, old value)]`` where two configs differ, entry by entry of the
    entries that are dicts on both sides (``backend_settings.w_steps``)."""
    out = []
    for k in sorted(set(old) | set(new)):
        o, n = old.get(k), new.get(k)
        if isinstance(o, dict) and isinstance(n, dict):
            out += _differences(o, n, f"{prefix}{k}.")
        elif o != n:
            out.append((prefix + k, n, o))
    return out


def _resume_file(resume):
    """``fit_bcd``'s ``resume``: a checkpoint file, or a folder holding ``checkpoint.npz``; a
    ValueError naming ``resume`` where it is neither."""
    from pathlib import Path

    from .io import checkpoint_path

    path = Path(resume)
    file = checkpoint_path(path) if path.is_dir() else path
    if not file.is_file():
        raise ValueError(f"resume must be a checkpoint file or a folder holding "
                         f"checkpoint.npz, got {str(resume)!r}")
    return file


def _restore(net, saved, config, digest, xp, steps):
    """The ``BCDState`` of a checkpoint (``io.load_checkpoint`` checked its structure), after
    checking it belongs to this run: same data, settings and network, a round counter within
    the run's schedule ``steps`` and lifted variables of the last round's batch size."""
    from .io import network_config

    arrays, meta = saved
    if meta["settings"]["data"] != digest:
        raise ValueError("resume: the checkpoint was written for other training data (X0, Y)")
    done = meta["iteration"]
    if done > len(steps):
        raise ValueError(f"resume: the checkpoint's round counter (meta.iteration) is {done}, "
                         f"past the {len(steps)} rounds of this run's schedule")
    last = steps[done - 1].idx if done else None
    m = config["m"] if last is None else len(last)
    bad = [k for k, A in arrays.items() if k.startswith("X_") and A.shape[1] != m]
    if bad:
        raise ValueError(f"resume: the checkpoint's {bad[0]} has {arrays[bad[0]].shape[1]} "
                         f"columns, the batch of its round {done} {m}")
    # a run given W_prev (momentum_carried) is resumed without it: the checkpoint holds its own
    old = {k: v for k, v in meta["history"]["config"].items()
           if k not in ("initial", "momentum_carried")}
    new = {k: v for k, v in History(config).config.items() if k != "momentum_carried"}
    old.setdefault("momentum", [0.0] * len(new["momentum"]))   # written before momentum existed
    # a checkpoint whose history records no backend settings: taken as this run's
    old.setdefault("backend_settings", new["backend_settings"])
    diff = _differences(old, new)
    if diff or meta["config"] != network_config(net):
        what = ", ".join(f"{k}={n!r} (checkpoint: {o!r})" for k, n, o in diff)
        raise ValueError(f"resume: the checkpoint was written by another run: "
                         f"{what or 'the network differs'}")
    L = len(net.W)
    Xs = [xp.asarray(arrays[f"X_{l}"]) for l in range(1, net.n_hidden + 1)] if meta["has_Xs"] else None
    W0 = [xp.asarray(arrays[f"W0_{l}"]) if f"W0_{l}" in arrays else None for l in range(L)]
    W_prev = ([xp.asarray(arrays[f"W_prev_{l}"]) for l in range(L)] if "W_prev_0" in arrays
              else None)
    return BCDState([xp.asarray(arrays[f"W_{l}"]) for l in range(L)],
                    History.from_dict(meta["history"]), Xs, W0, meta["iteration"], W_prev)


def _checkpointer(directory, every, digest, backend):
    """An observer writing the state every ``every`` rounds and at the end of the run. A backend
    with ``forget()`` (``FastBackend``: its Gram factorisations, reused across batches with
    ``gram_reuse > 1``) drops what it reuses there, as a run resumed from that checkpoint starts
    without it: both go on alike."""
    from .io import save_checkpoint

    forget = optional(backend, "forget") or (lambda: None)

    def write(net, state, step):
        if step.iteration % every == 0 or step.last:
            save_checkpoint(directory, net, state, dict(data=digest))
            forget()
    write.save = lambda net, state: save_checkpoint(directory, net, state, dict(data=digest))
    return write


def _progress_bar(total, done, name, compiling=False):
    """A tqdm bar over the rounds; ``compiling``: the backend compiles its kernels in the first
    round (``FastBackend(compile=True)``), which the bar says until that round ends."""
    from tqdm.auto import tqdm

    desc = f"BCD ({name})"
    bar = tqdm(total=total, initial=done, unit="round",
               desc=desc + (": compiling kernels in the first round" if compiling else ""))

    def show(net, state, step):
        nonlocal compiling
        if compiling:
            bar.set_description(desc, refresh=False)
            compiling = False
        rec, post = state.history.records[-1], {}
        if rec["checked"]:
            post = dict(F=f"{rec['lifted_x']:.4g}", J=f"{rec['network_x']:.4g}")
        if rec["test_accuracy"] is not None:
            post["test_acc"] = f"{rec['test_accuracy']:.3f}"
        elif rec["train_accuracy"] is not None:
            post["train_acc"] = f"{rec['train_accuracy']:.3f}"
        bar.set_postfix(post, refresh=False)
        bar.update(1)
    show.close = bar.close
    return show


def _initial(net, data, run):
    """The history's config, with the feed-forward figures before the first round."""
    config = dict(run.config, initial=None)  # eval_every=None: no pass over all the data
    X_test, Y_test = run.test
    if run.eval_every is not None:
        classification = config["task"] == "classification"
        tr = evaluate(net, data.X0, data.Y, classification)
        te = (evaluate(net, X_test, Y_test, classification) if X_test is not None
              else (None, None))
        config["initial"] = dict(network_objective=net.network_objective(data.X0, data.Y),
                                 train_loss=tr[0], train_accuracy=tr[1], test_loss=te[0],
                                 test_accuracy=te[1])
    return config


def _observers(run, callback, progress, state):
    """What runs after every round: the checkpoint writer (first), the callback, the progress bar."""
    observers = [] if callback is None else [lambda net, s, step: callback(net, s.history.records[-1])]
    folder, every, digest = run.checkpoint
    if folder is not None:
        observers.insert(0, _checkpointer(folder, every, digest, run.backend))
    if progress:
        observers.append(_progress_bar(len(run.steps), state.iteration, run.config["backend"],
                                       compiling=getattr(getattr(run.backend, "kernels", None),
                                                         "name", None) == "compiled"))
    return observers


# --- the driver -----------------------------------------------------------------------------
def fit_bcd(net: LiftedNetwork, X0: Any, Y: Any, *, batch_size: int | None = None, epochs: int = 1,
            iterations: int = defaults.ITERATIONS, alternations: int = defaults.ALTERNATIONS,
            gamma: float | Sequence[float] | None = None, momentum: float | Sequence[float] = 0.0,
            W_prev: Sequence[Any] | None = None, backend: str | Any = "cvxpy",
            strict: bool | None = None, tol: float = defaults.TOL,
            callback: Callable[[LiftedNetwork, dict], bool | None] | None = None,
            X_test: Any = None, Y_test: Any = None, progress: bool = False,
            eval_every: int | None = 1, check_every: int = 1,
            checkpoint: str | os.PathLike | None = None, checkpoint_every: int = 1,
            resume: str | os.PathLike | None = None) -> BCDResult:
    """Train ``net`` (a ``LiftedNetwork``) by block coordinate descent on the lifted objective.

    Parameters
    ----------
    X0, Y : data (features x m) and targets (outputs x m); one-hot Y is classification.
    batch_size : None for Algorithm 1 (all data), an integer >= 1 for Algorithm 2.
    epochs, alternations : Algorithm 2's passes over the batches and rounds per batch (K).
    iterations : Algorithm 1's number of rounds.
    gamma : gamma_l >= 0 of the proximal term, a number or one per layer (L + 1); None: the
        defaults (``defaults.py``): 3 for Algorithm 2 (> 0, as in the paper's batched model), 0
        for Algorithm 1.
    momentum, W_prev : beta_l in [0, 1), a number or one per layer (L + 1): where W0 is set, W
        first moves on along its last change, ``W <- W + beta_l (W - W_prev)`` (module doc; 0,
        the default: the paper's algorithms); ``W_prev``: an earlier run's ``BCDResult.W_prev``.
    backend : ``"cvxpy"``, ``"fast"`` or a backend object.
    strict : raise on a certificate violation (None: for the oracle only); ``False`` with
        ``"cvxpy"`` builds a non-strict oracle that records inaccurate solves and goes on.
    tol : tolerance of the certificate and, for a backend given by name, its ``tol``. A block
        passes check 4 when its recomputed KKT residual is <= max(tol, backend.tol).
    callback : ``callback(net, record)`` after every round; returning True stops the run.
    X_test, Y_test : held-out data, evaluated (feed-forward) with the training data.
    progress : show a tqdm progress bar with the current objectives and accuracy.
    eval_every : evaluate train/test loss and accuracy every that many rounds and after the
        last round of every epoch; None never (the records then hold None).
    check_every : run the whole certificate every that many rounds and on the last; the
        rounds between check block statuses only.
    checkpoint, checkpoint_every : a folder to write ``checkpoint.npz`` to (``io.py``) every
        that many rounds, at the end and on ``KeyboardInterrupt`` (then re-raised).
    resume : a checkpoint of this same run: it goes on and ends as if it had never stopped
        (each checkpoint drops the fast backend's reused Gram factors: ``FastBackend.forget``).

    Returns ``BCDResult(net, Xs, history)``. Every argument is validated before any solve; bad
    input raises ``ValueError`` naming the parameter and the value.
    """
    keywords = {k: v for k, v in locals().items() if k not in ("net", "X0", "Y")}
    run = _validate(net, X0, Y, keywords)
    state = run.state or _fresh_state(net, run)
    observers, step = _observers(run, callback, progress, state), None
    try:
        if state.iteration < len(run.steps):
            with _threads(run.backend):   # the backend's thread budget over the whole run
                step = _run(net, run.data, run.steps, state, run, observers)
    except KeyboardInterrupt:
        _interrupted(net, state, run, observers)
        raise
    finally:
        for obs in observers:
            getattr(obs, "close", lambda: None)()
    return BCDResult(net, state.Xs, state.history, None if step is None else step.idx,
                     state.W_prev if any(run.momentum) else None)


def _fresh_state(net, run):
    """A new run's state: the initial records, and momentum's ``W_prev`` if one was given."""
    return BCDState(list(net.W), History(_initial(net, run.data, run)), W_prev=run.W_prev)


def _interrupted(net, state, run, observers):
    """Ctrl-C: the weights of the last finished round, as the checkpoint (written now) holds."""
    net.W = list(state.W)
    if run.checkpoint[0] is not None:
        observers[0].save(net, state)
