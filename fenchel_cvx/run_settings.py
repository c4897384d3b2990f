"""The checked settings of a BCD run: every argument of ``fit_bcd`` and its data, checked once.

``fit_bcd`` (Algorithms 1 and 2 of the paper, Sec. 4.5) checks every argument here before any
work: the cadences and flags against the constraints of ``validation.py``, gamma (the proximal
weight of eq. (13)) and momentum per layer, the data and targets against the network in its
dtype and array library (once per run: the rounds take them as checked), the backend (built by
name or adapted, ``backends.py``), a checkpoint to resume from (``checkpoints.py``) and, on
ranks, that every rank holds the same data, weights and settings (:func:`agreed`). The outcome
is a :class:`RunSettings`, which the driver reads and never changes.
"""

from __future__ import annotations

import json
import numbers
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import numpy as np
from array_api_compat import device

from . import defaults
from .arrays import Array, namespace
from .backends import Backend, check_backend, check_threads, get_backend
from .certificate import Certificate
from .checkpoints import load_checkpoint, restore, resume_file
from .evaluation import evaluator, is_one_hot
from .history import _plain
from .io import check_writable_dir, data_digest, memory_digest, remove_temporaries
from .layer_split import owners
from .reduce import LOCAL, Comm, share
from .schedule import Batches, BCDState, Step, schedule
from .validation import (
    BOOL,
    CALLABLE,
    COUNT,
    GAMMA,
    MOMENTUM,
    PATH,
    ROUNDS,
    TOL,
    Options,
    PerLayer,
    check,
    check_rounds,
    validate,
)

if TYPE_CHECKING:
    from .network import LiftedNetwork

#: the constraints of ``fit_bcd``'s arguments (``validation.py``); gamma's, per layer, need the
#: network, and the data's need its sizes
PARAMETERS = dict(
    batch_size=[COUNT, None],
    epochs=ROUNDS,
    iterations=ROUNDS,
    alternations=ROUNDS,
    strict=[BOOL, None],
    tol=TOL,
    callback=[CALLABLE, None],
    progress=BOOL,
    eval_every=[COUNT, None],
    check_every=COUNT,
    checkpoint=[PATH, None],
    checkpoint_every=COUNT,
    resume=[PATH, None],
    x_sweep=Options(("backward", "forward")),
)


@dataclass
class RunSettings:
    """A validated run: the backend, the certificate, gamma, the cadences, the data and its
    schedule, the state to resume from (None: a fresh run), the checkpoints'
    ``(folder, every, data digest)`` and momentum's beta per layer."""

    backend: Backend
    cert: Certificate
    gamma: list
    check_every: int
    evaluate: Any = None  # evaluation.evaluator's evaluate_round(net, step)
    config: Any = None
    test: tuple = (None, None)  # (X_test, Y_test)
    eval_every: Any = 1
    data: Any = None  # schedule.Batches
    steps: Any = None
    state: Any = None
    checkpoint: tuple = (None, 1, None)
    momentum: Any = None
    W_prev: Any = None  # the first batch's (fit_bcd(W_prev=...)), in the data's library
    x_sweep: str = "backward"  # the X-blocks' order (``x_order``)
    algorithm: int = 1  # the paper's Algorithm 1 (batch_size None) or 2
    comm: Comm = LOCAL  # the ranks that share every batch (``reduce.py``; one process: LOCAL)
    #: the W-blocks an unchecked round on ranks solves by layer, each on its rank
    #: (``layer_split.owners``; {} in one process)
    owners: dict = field(default_factory=dict)

    @property
    def carries_U0(self) -> bool:
        """Whether a round may take W_0 X~_0 from the round before (``pre_activations``): every
        round sees the same data, and no momentum moves W_0 between them."""
        return not self.data.batched and not any(self.momentum)

    def x_order(self, L: int) -> range:
        """The X-blocks' layers in the X-sweep's order: L, ..., 1 (Algorithms 1 and 2), or
        1, ..., L (``x_sweep="forward"``: each block sees the X below it just solved)."""
        return range(L, 0, -1) if self.x_sweep == "backward" else range(1, L + 1)


def weights_in(xp: ModuleType, net: LiftedNetwork, dev: object = None) -> list[Array]:
    """The network's weights as arrays of ``xp`` (the data's library) on ``dev`` (the data's
    device), without changing net."""
    try:
        return [
            W if namespace(W) is xp and device(W) == dev else xp.asarray(W, device=dev)
            for W in net.W
        ]
    except (TypeError, ValueError):
        raise ValueError(
            f"net.W must be arrays the data's library ({xp.__name__}) can take, got "
            f"{type(net.W[0]).__module__}.{type(net.W[0]).__name__}"
        ) from None


def check_data(
    net: LiftedNetwork,
    X0: Array,
    Y: Array,
    xname: str = "X0",
    yname: str = "Y",
    xp: ModuleType | None = None,
    on: Array | None = None,
) -> tuple[Array, Array]:
    """Data and targets in the network's dtype (no silent upcast of float32), in ``xp`` and on
    the device of the array ``on`` (None: X0's own, so that the targets follow the data)."""
    xp = namespace(X0) if xp is None else xp
    X0, Y = net.check_inputs(X0, Y, dtype=net.W[0].dtype, xp=xp, on=on, names=(xname, yname))
    net.loss.check_targets(yname, Y, xp)
    return X0, Y


def check_arguments(net: LiftedNetwork, args: Mapping[str, Any]) -> dict[str, Any]:
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
        raise ValueError(
            "X_test and Y_test must be given together, got only "
            + ("X_test" if args["Y_test"] is None else "Y_test")
        )
    return args


def check_W_prev(
    W_prev: Sequence[Array] | None, weights: Sequence[Array], xp: ModuleType, resume: bool
) -> list[Array] | None:
    """``fit_bcd``'s ``W_prev``: None, or one finite array per layer of the weights' shapes
    (not with ``resume``: a checkpoint holds its own), in the data's library and dtype."""
    if W_prev is None:
        return None
    if resume:
        raise ValueError("W_prev and resume exclude each other: a checkpoint holds its own W_prev")
    listed = isinstance(W_prev, Sequence) and not isinstance(W_prev, (str, bytes))
    if not listed or len(W_prev) != len(weights):
        got = f"{len(W_prev)} entries" if listed else type(W_prev).__name__
        raise ValueError(
            f"W_prev must be a sequence of {len(weights)} arrays (one per layer, "
            f"as BCDResult.W_prev), got {got}"
        )
    out = []
    for l, (P, W) in enumerate(zip(W_prev, weights)):
        try:
            P = xp.asarray(P, dtype=W.dtype, device=device(W))
        except (TypeError, ValueError):
            raise ValueError(
                f"W_prev[{l}] must be an array the data's library ({xp.__name__}) "
                f"can take, got {type(P).__module__}.{type(P).__name__}"
            ) from None
        if tuple(P.shape) != tuple(W.shape):
            raise ValueError(
                f"W_prev[{l}] must have W_{l}'s shape {tuple(W.shape)}, got {tuple(P.shape)}"
            )
        if not bool(xp.all(xp.isfinite(P))):
            raise ValueError(f"W_prev[{l}] must be finite, got NaN or infinite entries")
        out.append(P)
    return out


def check_comm(comm: Comm | None, backend: Backend, m: int, steps: Sequence[Step]) -> Comm:
    """``fit_bcd``'s ``comm``: None (one process) or a communicator of ``reduce.py``
    (``TorchComm``: the ranks of a ``torch.distributed`` group), whose P ranks each take a share
    of every batch (``reduce.share``): the backend must train on ranks (a ``comm`` of its own:
    the fast backend; the oracle has Dask workers), and every batch of the schedule ``steps``
    (of ``m`` points), the last partial one included, needs a data point for every rank.
    -> the communicator (LOCAL for None)."""
    if comm is None:
        return LOCAL
    if not all(hasattr(comm, k) for k in ("P", "rank", "reduce", "all_gather")):
        raise ValueError(
            f"comm must be None or a communicator (fenchel_cvx.reduce, TorchComm), got "
            f"{type(comm).__name__}"
        )
    if comm.P > 1 and getattr(backend, "comm", None) is None:
        raise ValueError(
            f"comm with P={comm.P} ranks needs a backend that trains on ranks (backend='fast'), "
            f"got backend {backend.name!r}"
            + (
                " (the oracle runs its blocks on Dask workers instead)"
                if backend.name == "cvxpy"
                else ""
            )
        )
    smallest = min((m if s.columns is None else len(s.columns) for s in steps), default=m)
    if comm.P > smallest:
        raise ValueError(
            f"comm has P={comm.P} ranks, more than the data points of the smallest batch "
            f"({smallest}): every rank needs a share of every batch"
        )
    return comm


def build_backend(
    backend: str | object, strict: bool | None, tol: float, xp: ModuleType, net: LiftedNetwork
) -> tuple[Backend, str]:
    """The backend object (``backends.Backend``) and its name; a name is built with ``tol``
    (and non-strict, so that inaccurate solves are recorded, in recorded mode). The backend
    checks ``net`` here (per-layer settings: ``FastBackend``), before any work."""
    opts = dict(strict=False) if strict is False and isinstance(backend, str) else {}
    backend = get_backend(backend, net, tol=tol, **opts)  # a backend object ignores them
    if xp is not np and backend.name == "cvxpy":
        raise ValueError(
            f"backend 'cvxpy' (the oracle) takes NumPy data, got X0 from {xp.__name__}: pass "
            f"a NumPy copy (fenchel_cvx.arrays.to_numpy), or train on the fast backend"
        )
    return backend, backend.name


def run_config(
    net: LiftedNetwork,
    m: int,
    m_test: int | None,
    args: Mapping[str, Any],
    backend: Backend,
    name: str,
    strict: bool,
    classification: bool,
) -> dict[str, Any]:
    """The run's settings as the history records them; ``backend_settings``: what the backend
    solves its blocks with (its ``settings()``, as JSON data: a value JSON cannot hold, such as
    an oracle's ``solver_opts`` callback, is recorded as its repr)."""
    settings = json.loads(json.dumps(_plain(backend.settings()), default=repr))
    return dict(
        layer_sizes=list(net.layer_sizes),
        activations=[x.name for x in net.activations],
        loss=net.loss.name,
        lam=net.lam,
        rho=net.rho,
        gamma=args["gamma"],
        momentum=args["momentum"],
        momentum_carried=args["W_prev"] is not None,
        batch_size=args["batch_size"],
        epochs=args["epochs"],
        iterations=args["iterations"],
        alternations=args["alternations"],
        backend=name,
        backend_settings=settings,
        strict=strict,
        tol=args["tol"],
        check_every=args["check_every"],
        x_sweep=args["x_sweep"],
        seed=net.seed,
        batch_seed=net.seed,
        m=m,
        m_test=m_test,
        task="classification" if classification else "regression",
        algorithm=1 if args["batch_size"] is None else 2,
    )


def certificate_of(backend: Backend, strict: bool, tol: float) -> Certificate:
    """The run's certificate. Block optimality is judged at the accuracy asked of the backend
    (its ``tol``, e.g. a FastBackend(tol=1e-3)), never looser than the certificate's own."""
    asked = backend.tol
    residual_tol = max(tol, float(asked)) if isinstance(asked, numbers.Real) else tol
    return Certificate(strict=strict, tol=tol, residual_tol=residual_tol)


def validate_run(net: LiftedNetwork, X0: Array, Y: Array, args: Mapping[str, Any]) -> RunSettings:
    """Check every argument and the data, before any work; return the run's ``RunSettings``.
    The network's weights move to the data's library once every check passed."""
    args = check_arguments(net, args)
    xp = namespace(X0)
    X0, Y = check_data(net, X0, Y, xp=xp)
    X_test, Y_test = args["X_test"], args["Y_test"]
    if X_test is not None:
        X_test, Y_test = check_data(net, X_test, Y_test, "X_test", "Y_test", xp=xp, on=X0)
    check_rounds(X0.shape[1], args["batch_size"], args["epochs"], args["alternations"])
    # a checkpoint failing the checked reader raises FileFormatError, which names the file
    resume = None if args["resume"] is None else resume_file(args["resume"])
    saved = None if resume is None else load_checkpoint(resume)
    backend: Any  # a Backend, with its own class's attributes too (a FastBackend's comm)
    backend, name = build_backend(args["backend"], args["strict"], args["tol"], xp, net)
    weights = weights_in(xp, net, device(X0))
    strict = (name == "cvxpy") if args["strict"] is None else args["strict"]
    classification = is_one_hot(Y)
    m_test = None if X_test is None else X_test.shape[1]
    config = run_config(net, X0.shape[1], m_test, args, backend, name, strict, classification)
    steps = schedule(
        X0.shape[1],
        args["batch_size"],
        args["epochs"],
        args["iterations"],
        args["alternations"],
        net.seed,
    )
    comm = check_comm(args["comm"], backend, X0.shape[1], steps)
    eval_every = args["eval_every"] if comm.rank == 0 else None  # (rank 0 evaluates)
    settings = RunSettings(
        backend,
        certificate_of(backend, strict, args["tol"]),
        args["gamma"],
        args["check_every"],
        evaluator(X0, Y, X_test, Y_test, classification, eval_every, check_threads(backend)),
        config,
        (X_test, Y_test),
        args["eval_every"],
        steps=steps,
        momentum=args["momentum"],
        x_sweep=args["x_sweep"],
        algorithm=config["algorithm"],
        comm=comm,
    )
    batched = args["batch_size"] is not None and args["batch_size"] < X0.shape[1]
    settings.data = Batches(X0, Y, xp, batched, comm, check_threads(backend))
    if getattr(backend, "comm", None) is not None:
        backend.comm = comm  # the ranks its solves reduce over
    settings.owners = owners(net, backend, comm.P, xp)
    digest = None if args["checkpoint"] is None and saved is None else data_digest(X0, Y)
    settings.state = (
        None
        if saved is None
        else on_rank(restore(net, saved, config, digest, xp, steps, device(X0)), comm)
    )
    settings.W_prev = check_W_prev(args["W_prev"], weights, xp, saved is not None)
    if comm.P > 1:  # (the ranks hold alike what they train on: ``agreed``)
        start = weights if settings.state is None else settings.state.W
        agreed(comm, (X0, Y), data_digest(*start), config, digest)
    # the checkpoint folder last, once every other check passed: a refused run makes none
    ckpt = checkpoint_folder(net, args["checkpoint"], resume, comm)
    settings.checkpoint = (ckpt, args["checkpoint_every"], digest)
    net.W = weights if settings.state is None else list(settings.state.W)
    return settings


#: what a rank's run holds that other ranks may hold otherwise: its test data (rank 0 evaluates)
RANK_OWN = ("m_test",)


def agreed(
    comm: Comm,
    data: Sequence[Array],
    weights: str,
    config: Mapping[str, Any],
    digest: str | None = None,
) -> None:
    """On ranks, before any work: every rank holds the same data (``data``, every rank holding
    all of it; ``digest``: its :func:`~fenchel_cvx.io.data_digest`, where the run has it),
    starts from the same weights (``weights``: their digest, after a checkpoint's restore) and
    runs the same settings (``config``, but for ``RANK_OWN``), or every rank raises naming each
    rank and what of it differs from rank 0's (a setting with both values): one
    ``all_gather``. The data are digested in their memory order, read in place
    (:func:`~fenchel_cvx.io.memory_digest`); where a rank holds them in another order than
    rank 0, every rank digests them in C order and gathers again. Ranks whose communicator
    runs on copies of rank 0's arguments (``copies``: ``parallel.Ranks.fit``) hold the same
    data by construction and digest none."""
    settings = {k: v for k, v in config.items() if k not in RANK_OWN}
    text = json.dumps(settings, sort_keys=True, default=repr).encode()
    if digest is None and comm.copies:  # (rank 0's data, copied to each: none to compare)
        digest = "00" * 32
    orders, held = ("C" * len(data), digest) if digest else memory_digest(*data)
    every = _gathered(comm, orders, held, weights, text)
    n = len(orders)
    if any(theirs[:n] != every[0][:n] for theirs in every):  # (the same data in other orders)
        every = _gathered(comm, "C" * n, digest or data_digest(*data), weights, text)
    first, differ = json.loads(every[0][n + 64 :]), []
    for r, theirs in enumerate(every):
        for name, part in (("data", slice(n, n + 32)), ("weights", slice(n + 32, n + 64))):
            if theirs[part] != every[0][part]:
                differ.append(f"rank {r}'s {name} differ")
        its = json.loads(theirs[n + 64 :])
        differ += [
            f"rank {r}'s {key} is {its.get(key)!r}, rank 0's {first.get(key)!r}"
            for key in sorted(set(first) | set(its))
            if its.get(key) != first.get(key)
        ]
    if differ:
        raise ValueError(
            f"the ranks disagree with rank 0: {'; '.join(differ)} (every rank trains on all the "
            "same data, from the same weights, with the same settings)"
        )


def _gathered(comm: Comm, orders: str, data: str, weights: str, text: bytes) -> list[bytes]:
    """Every rank's ``orders + data + weights + text`` (the digests as their 32 bytes), gathered
    to every rank: one ``all_gather``."""
    mine = orders.encode() + bytes.fromhex(data) + bytes.fromhex(weights) + text
    return [np.asarray(part).tobytes() for part in comm.all_gather(np.frombuffer(mine, np.uint8))]


def checkpoint_folder(
    net: LiftedNetwork,
    checkpoint: str | os.PathLike[str] | None,
    resume: Path | None,
    comm: Comm,
) -> str | os.PathLike[str] | None:
    """The run's checkpoint folder (None: none), checked writable (rank 0's, which writes
    there), without what a killed run left in it or in the folder resumed from."""
    if checkpoint is None:
        ckpt = None
    else:
        net.get_config()  # a network that a checkpoint cannot record is refused before any work
        ckpt = check_writable_dir("checkpoint", checkpoint) if comm.rank == 0 else checkpoint
    for folder in {ckpt, None if resume is None else resume.parent}:
        if folder is not None and comm.rank == 0:  # what a killed run left there
            remove_temporaries(folder)
    return ckpt


def on_rank(state: BCDState, comm: Comm) -> BCDState:
    """A checkpoint's state (every rank's columns: the batch's X and U_0) with this rank's
    share of its columns (``reduce.share``): a checkpoint reads at any number of ranks."""
    if comm.P == 1:
        return state
    if state.Xs is not None:
        mine = share(state.Xs[0].shape[1], comm.P, comm.rank)
        state.Xs = [X[:, mine] for X in state.Xs]
    if state.carried is not None:
        mine = share(state.carried.U.shape[1], comm.P, comm.rank)
        state.carried = replace(state.carried, U=state.carried.U[:, mine])
    return state
