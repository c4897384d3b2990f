"""Block coordinate descent on the lifted objective: the paper's Algorithms 1 and 2.

``fit_bcd(net, X0, Y)`` minimises the lifted objective (eq. (7) of the paper; docs/mathematics.md)

    F(W, X) = L(Y, W_L X~_L) + sum_l rho_l ||W_l||^2 + sum_{l<L} lam_l B_l(X_{l+1}, W_l X~_l)

one convex block at a time (``blocks.py``), each block solved by a *backend*: ``"cvxpy"`` (the
oracle: every block to certified optimality) or ``"fast"`` (array solvers), or any object with
``.solve(block, start) -> BlockResult``. The driver is the same for every backend.

A *round* is one X-sweep then one W-sweep:

- X-sweep: the blocks X_L, X_{L-1}, ..., X_1 (backwards; ``x_sweep="forward"``: X_1, ...,
  X_L), each ``min_Z`` with the rest fixed;
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
algorithms). Where W0 is set, W first moves on along its last change,
``W <- W + beta_l (W - W_prev)`` (the inertial extrapolation of Pock & Sabach's iPALM); the
feed-forward pass, W0 and the blocks' starts are the extrapolated point, so every block is the
same convex problem and the four checks hold unchanged (docs page "Tuning", LeNet-5, "Momentum
across batches").
``BCDResult.W_prev`` and ``W_prev=`` carry it across runs (``FenchelClassifier.partial_fit``).

**Restart rule.** Before each X-sweep on carried-over X (every round but the first of a run or a
batch) the driver compares F(W, X) with J(W) = F(W, X^ff): after the W-sweep the old X may be
worse than the feed-forward point of the new weights; then X restarts from the feed-forward
point (recorded as ``restarted``). Restarting lowers F, so the run (without momentum, above)
stays a descent method, and the exact X-sweep from the feed-forward point keeps the lower bound
F(W, X) <= J(W) (check 3).

Every round runs the four checks of ``certificate.py`` (``check_every=k``: every k-th round and
the last; the rounds between check block optimality only), which trust no backend's report;
``strict`` (default: True for the ``"cvxpy"`` oracle) raises ``CertificateError`` at the first
violation. In recorded mode (``strict=False``) a backend's ``SolverError`` or an unusable argmin
(NaN, inf, outside the domain) is recorded against its own block, which keeps its value; after
an unusable argmin the run stops after that round (its record's ``halted``: the block's name).

**Structure.** ``fit_bcd`` checks every argument and the data once (``run_settings.py``), then
runs the rounds of the ``schedule`` (``schedule.py``): each is :func:`bcd_round`, a function of
the explicit state (its sweeps and checks: ``sweeps.py``), then the observers (``observers.py``:
checkpoints, callback, progress bar). ``resume=DIR`` continues a checkpoint's schedule
bit-identically (``checkpoints.py``); Ctrl-C writes the last finished round's state, then
re-raises. Backends implement ``backends.Backend``.

The driver works in the array library of ``X0`` (NumPy; CuPy or PyTorch tensors on a GPU with
``backend="fast"``; ``array_api_strict`` in the tests); ``net.W`` moves there once every argument
is validated (the oracle takes NumPy only). ``BCDResult(net, Xs, history)``: the network (updated
in place), the final lifted variables and the :class:`~fenchel_cvx.history.History`; every
W-block is optimal at the returned ``(net.W, Xs)``, so ``blocks.w_block(net, X0, Y, Xs, l)``
re-checks it (Algorithm 2: ``Xs`` of the last batch, whose columns are ``result.batch``).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from . import defaults, evaluation
from .backends import BACKENDS, check_backend, get_backend  # noqa: F401 (importable from bcd)
from .evaluation import evaluate, initial_figures, is_one_hot  # noqa: F401 (importable from bcd)
from .history import History
from .network import LiftedNetwork
from .observers import interrupted
from .observers import observers as make_observers
from .run_settings import PARAMETERS, validate_run  # noqa: F401 (importable from bcd)
from .schedule import BCDState, Step, schedule  # noqa: F401 (importable from bcd)
from .sweeps import sweeps
from .threads import limit_for


@dataclass
class BCDResult:
    """What ``fit_bcd`` returns (see the module docstring)."""

    net: Any
    Xs: Any
    history: History
    batch: Any = None  # Algorithm 2: the column indices of the last batch (Xs's columns)
    W_prev: Any = None  # momentum: the weights before the last extrapolation (a next run's)


# --- the rounds: Algorithms 1 and 2 ---------------------------------------------------------
def bcd_round(net, state, step, settings):
    """The round ``step`` of the schedule from ``state`` (a ``BCDState``), by the checked
    ``settings`` (a ``RunSettings``): on a new batch W0 <- W (after momentum's extrapolation)
    and X <- the feed-forward point; then the sweeps and the checks (:func:`sweeps`); then the
    record, which ``state`` takes with the round's weights. Returns the record."""
    xp = settings.data.xp
    Xb, Yb = settings.data.batch(step.columns)
    Us = W_prev = None
    if step.new_w0 and any(settings.momentum):  # the state takes W_prev once the round is done
        W_prev = _extrapolate(net, state.W_prev, settings.momentum, xp)
    check = step.iteration % settings.check_every == 0 or step.last
    carried = state.carried  # W_0 X~_0 from the round before, where this round may take it
    if carried is not None and not carried.usable(check):
        carried = None
    Xt0 = settings.data.patches(net.layers[0], Xb)  # the feed-forward pass's and W_0's block's
    if step.new_x:
        Xs, Us = net.feed_forward(Xb, Xt0, known=() if carried is None else [carried.U])
        state.Xs = list(Xs)
    if step.new_w0:  # the weights themselves (no block writes into its start: each W-block
        # starts at its centre by identity, which the fast backend sees without a read)
        state.W0 = list(net.W) if any(settings.gamma) else [None] * len(net.W)
    Xs, rec, carried = sweeps(
        settings.backend,
        net,
        settings.cert,
        Xb,
        Yb,
        state.Xs,
        settings.gamma,
        state.W0,
        step.new_x,
        iteration=step.iteration,
        check=check,
        Us=Us,
        Xt0=Xt0,
        carried=carried,
        carry=settings.carries_U0,
        order=settings.x_sweep,
    )
    rec = dict(
        iteration=step.iteration,
        epoch=step.epoch,
        batch=step.batch,
        alternation=step.alternation,
        **rec,
        **settings.evaluate(net, step),
    )
    rec["certificate"] = settings.cert.outcome()
    state.advance(net, Xs, rec, W_prev, carried)
    return rec


def _run(net, settings, state, observers):
    """Every round of the schedule from the state's position (:func:`bcd_round`), each followed
    by the observers, within the backend's thread budget; an observer returning True, or a
    halted round (recorded mode met an unusable argmin), stops the run. Ctrl-C writes the
    last finished round's state (``observers.interrupted``). Returns the last step."""
    step = None
    try:
        with limit_for(settings.backend):  # the backend's thread budget over the whole run
            for step in settings.steps[state.iteration :]:
                record = bcd_round(net, state, step, settings)
                if any([obs(net, state, step) is True for obs in observers]) or record["halted"]:
                    break
    except KeyboardInterrupt:
        interrupted(net, state, settings, observers)
        raise
    finally:
        for obs in observers:
            getattr(obs, "close", lambda: None)()
    return step


def _extrapolate(net, W_prev, beta, xp):
    """Momentum: ``W <- W + beta_l (W - W_prev)`` (none before a first W_prev); returns the W
    before it, the next W_prev."""
    W = [xp.asarray(W, copy=True) for W in net.W]
    if W_prev is not None:
        net.W = [Wl + b * (Wl - Pl) if b else Wl for Wl, Pl, b in zip(W, W_prev, beta)]
    return W


# --- the driver -----------------------------------------------------------------------------
def fit_bcd(
    net: LiftedNetwork,
    X0: Any,
    Y: Any,
    *,
    batch_size: int | None = None,
    epochs: int = 1,
    iterations: int = defaults.ITERATIONS,
    alternations: int = defaults.ALTERNATIONS,
    gamma: float | Sequence[float] | None = None,
    momentum: float | Sequence[float] = 0.0,
    W_prev: Sequence[Any] | None = None,
    backend: str | Any = "cvxpy",
    strict: bool | None = None,
    tol: float = defaults.TOL,
    callback: Callable[[LiftedNetwork, dict], bool | None] | None = None,
    X_test: Any = None,
    Y_test: Any = None,
    progress: bool = False,
    eval_every: int | None = 1,
    check_every: int = 1,
    checkpoint: str | os.PathLike | None = None,
    checkpoint_every: int = 1,
    resume: str | os.PathLike | None = None,
    x_sweep: str = "backward",
) -> BCDResult:
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
    x_sweep : the X-blocks' order: ``"backward"`` (X_L, ..., X_1: Algorithms 1 and 2) or
        ``"forward"`` (X_1, ..., X_L: each block sees the X below it just solved).

    Returns ``BCDResult(net, Xs, history)``. Every argument is validated before any solve; bad
    input raises ``ValueError`` naming the parameter and the value.

    Examples
    --------
    >>> import numpy as np
    >>> X0, Y = np.random.default_rng(0).standard_normal((3, 8)), np.eye(2)[:, [0, 1] * 4]
    >>> h = fit_bcd(LiftedNetwork([3, 4, 2], seed=0), X0, Y, iterations=2, backend="fast").history
    >>> len(h), h.certificate_held, all(r["lifted_x"] <= r["network_x"] + 1e-9 for r in h)
    (2, True, True)
    """
    keywords = {k: v for k, v in locals().items() if k not in ("net", "X0", "Y")}
    settings = validate_run(net, X0, Y, keywords)
    state = settings.state or BCDState(
        list(net.W), History(evaluation.history_config(net, settings)), W_prev=settings.W_prev
    )
    # a run starts with none of the factors an earlier run left in the backend (reused across
    # batches: ``Backend.forget``): its iterates do not depend on the backend's earlier runs
    settings.backend.forget()
    step = _run(net, settings, state, make_observers(settings, callback, progress, state))
    return BCDResult(
        net,
        state.Xs,
        state.history,
        None if step is None else step.columns,
        state.W_prev if any(settings.momentum) else None,
    )


def __getattr__(name):
    """``bcd.optional`` and ``bcd.STRICT_AWARE``: deprecated (``backends.Backend``)."""
    if name in ("optional", "STRICT_AWARE"):
        from . import backends

        return getattr(backends, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
