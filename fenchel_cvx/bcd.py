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
runs :func:`algorithm_1` or :func:`algorithm_2`: the paper's pseudo-code line by line, over the
rounds of the ``schedule`` (``schedule.py``; docs/mathematics.md tabulates the lines). Each
round is a ``rounds.Round``: the explicit state of one round (the batch, W, X, W0 and the
pre-activations, ``pre_activations.py``), whose blocks are solved by the backend and checked
(``block_checks.py``, ``certificate.py``); then the observers (``observers.py``: checkpoints,
callback, progress bar). ``resume=DIR`` continues a checkpoint's schedule bit-identically
(``checkpoints.py``); Ctrl-C writes the last finished round's state, then re-raises. Backends
implement ``backends.Backend``.

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
from .arrays import Array
from .backends import BACKENDS, check_backend, get_backend  # noqa: F401 (importable from bcd)
from .evaluation import evaluate, initial_figures, is_one_hot  # noqa: F401 (importable from bcd)
from .history import History
from .network import LiftedNetwork
from .observers import gathered, interrupted
from .observers import observers as make_observers
from .reduce import Comm
from .rounds import Round
from .run_settings import PARAMETERS, RunSettings, validate_run  # noqa: F401 (importable from bcd)
from .schedule import BCDState, Step, batches, schedule  # noqa: F401 (importable from bcd)
from .threads import limit_for


@dataclass
class BCDResult:
    """What ``fit_bcd`` returns (see the module docstring)."""

    net: Any
    Xs: Any
    history: History
    batch: Any = None  # Algorithm 2: the column indices of the last batch (Xs's columns)
    W_prev: Any = None  # momentum: the weights before the last extrapolation (a next run's)


# --- Algorithms 1 and 2 ----------------------------------------------------------------------
def algorithm_1(
    net: LiftedNetwork,
    run: RunSettings,
    state: BCDState,
    observers: Sequence[Callable[[LiftedNetwork, BCDState, Step], object]],
) -> Step | None:
    """Algorithm 1 of the paper (non-batched BCD) over the rounds of ``run`` (a checked
    ``RunSettings``) from the position of ``state`` (a ``BCDState``); each round's record goes to
    the state and the ``observers``. Returns the last round's ``Step`` (None: none run)."""
    L, step = net.n_hidden, None
    # line 1: initialise (W_l)_{l=0}^L: the network's weights, ``net.W``
    for step in run.steps[state.iteration :]:
        r = Round(net, state, step, run)
        if step.new_w0:
            r.centre()  # (W0 <- W where gamma > 0 makes Algorithm 1 proximal; momentum)
        if step.new_x:
            # line 2: initialise X_0 with the input matrix X (``r.X0``)
            # line 3: initialise X_1, ..., X_L with the feed-forward rule
            r.feed_forward()
        # line 4: repeat (the schedule's rounds; the restart rule on carried-over X)
        r.begin()
        with r.recorded():
            # line 5: X_L <- argmin_Z L(Y, W_L Z) + lam B_{L-1}(Z, X^0_{L-1})
            # lines 6-8: for l = L-1, ..., 1:
            #     X_l <- argmin_Z B_l(X_{l+1}, W_l Z) + B_{l-1}(Z, X^0_{l-1})
            for l in run.x_order(L):
                r.x_block(l)
            r.x_swept()
            # line 9: W_L <- argmin_W L(Y, W X_L) + rho_L pi_L(W)
            r.w_block(L)
            # lines 10-12: for l = L-1, ..., 0:
            #     W_l <- argmin_W lam B_l(X_{l+1}, W X_l) + rho_l pi_l(W)
            for l in range(L - 1, -1, -1):
                r.w_block(l)
            r.w_swept()
        # line 13: until convergence: the last round, an observer's stop or a halted block
        if r.end(observers):
            break
    return step


def algorithm_2(
    net: LiftedNetwork,
    run: RunSettings,
    state: BCDState,
    observers: Sequence[Callable[[LiftedNetwork, BCDState, Step], object]],
) -> Step | None:
    """Algorithm 2 of the paper (batched BCD) over the rounds of ``run`` from the position of
    ``state``, as :func:`algorithm_1`: a batch's K alternations are K rounds of the schedule
    (a resumed run's first batch from its round). Returns the last round's ``Step``."""
    L, step = net.n_hidden, None
    # line 1: initialise (W_l)_{l=0}^L: the network's weights, ``net.W``
    # line 2: repeat (the schedule's batches)
    for alternations in batches(run.steps[state.iteration :]):
        first = Round(net, state, alternations[0], run)
        if first.step.new_w0:
            # line 3: (W^0_l) <- (W_l), after momentum's extrapolation where it is set
            first.centre()
        if first.step.new_x:
            # line 4: re-initialise X_0 with a batch sampled from X (``first.X0``: the columns)
            # line 5: re-initialise X_1, ..., X_L with the feed-forward rule
            first.feed_forward()
        # line 6: for alternation = 1, ..., K (each a round; the restart rule after the first)
        for r in first.alternations(alternations):
            r.begin()
            with r.recorded():
                # line 7: X_L <- argmin_Z L(Y, W_L Z) + lam B_{L-1}(Z, X^0_{L-1})
                # lines 8-10: for l = L-1, ..., 1:
                #     X_l <- argmin_Z lam B_l(X_{l+1}, W_l Z) + lam B_{l-1}(Z, X^0_{l-1})
                for l in run.x_order(L):
                    r.x_block(l)
                r.x_swept()
                # line 11: W_L <- argmin_W L(Y, W X_L) + rho_L pi_L(W) + gamma_L ||W - W^0_L||^2
                r.w_block(L)
                # lines 12-14: for l = L-1, ..., 0: W_l <- argmin_W lam B_l(X_{l+1}, W X_l)
                #     + rho_l pi_l(W) + gamma_l ||W - W^0_l||^2
                for l in range(L - 1, -1, -1):
                    r.w_block(l)
                r.w_swept()
            # lines 15-16: end for; until convergence: the last round, an observer's stop or a
            # halted block
            step = r.step
            if r.end(observers):
                return step
    return step


def _run(net, settings, state, observers):
    """Algorithm 1 or 2 (``settings.algorithm``) within the backend's thread budget; Ctrl-C
    writes the last finished round's state (``observers.interrupted``). Returns the last step."""
    algorithm = algorithm_1 if settings.algorithm == 1 else algorithm_2
    try:
        with limit_for(settings.backend):  # the backend's thread budget over the whole run
            return algorithm(net, settings, state, observers)
    except KeyboardInterrupt:
        interrupted(net, state, settings, observers)
        raise
    finally:
        for obs in observers:
            getattr(obs, "close", lambda: None)()


# --- the driver -----------------------------------------------------------------------------
def fit_bcd(
    net: LiftedNetwork,
    X0: Array,
    Y: Array,
    *,
    batch_size: int | None = None,
    epochs: int = 1,
    iterations: int = defaults.ITERATIONS,
    alternations: int = defaults.ALTERNATIONS,
    gamma: float | Sequence[float] | None = None,
    momentum: float | Sequence[float] = 0.0,
    W_prev: Sequence[Array] | None = None,
    backend: str | object = "cvxpy",
    strict: bool | None = None,
    tol: float = defaults.TOL,
    callback: Callable[[LiftedNetwork, dict], bool | None] | None = None,
    X_test: Array | None = None,
    Y_test: Array | None = None,
    progress: bool = False,
    eval_every: int | None = 1,
    check_every: int = 1,
    checkpoint: str | os.PathLike | None = None,
    checkpoint_every: int = 1,
    resume: str | os.PathLike | None = None,
    x_sweep: str = "backward",
    comm: Comm | None = None,
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
    comm : the ranks that train together (``parallel.py``; None: this process alone). Each
        rank passes the same arguments and its communicator (``fast.torch_comm.TorchComm``)
        and takes a share of every batch's columns (``reduce.share``); every figure and every
        decision is the whole batch's, and rank 0 alone evaluates, calls back, shows the bar
        and writes. Every rank returns the whole result (X gathered).

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
    if settings.comm.P > 1:  # every rank's columns of the last batch's X
        state = gathered(state, settings.comm)
    settings.comm.verify()  # the ranks agreed on the last round's figures too
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
