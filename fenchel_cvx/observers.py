"""What runs after every round of a BCD run (Algorithms 1 and 2 of the paper, Sec. 4.5).

An *observer* is called as ``observer(net, state, step)`` once a round is recorded
(``schedule.BCDState``, ``schedule.Step``); one that returns True stops the run. ``fit_bcd``
builds them with :func:`observers`, in this order: the checkpoint writer
(:class:`CheckpointWriter`, ``fit_bcd(checkpoint=DIR)``), the user's ``callback(net, record)``,
and the progress bar (:class:`ProgressBar`, ``progress=True``). Each observer may have a
``close()``, which the driver calls at the end of the run.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from array_api_compat import array_namespace

from .checkpoints import save_checkpoint
from .reduce import LOCAL, Comm

if TYPE_CHECKING:
    from .backends import Backend
    from .network import LiftedNetwork
    from .run_settings import RunSettings
    from .schedule import BCDState, Step


class CheckpointWriter:
    """Writes the state every ``every`` rounds and at the end of the run. Where the backend
    drops what it reuses across solves at a checkpoint (``Backend.forget``: ``FastBackend``'s
    Gram factorisations, reused across batches with ``gram_reuse > 1``), as a run resumed from
    that checkpoint starts without it, both go on alike. On ranks (``comm``) every rank gives
    its columns of the batch's X and U_0, and rank 0 writes the whole state."""

    def __init__(
        self,
        directory: str | os.PathLike[str],
        every: int,
        digest: str | None,
        backend: Backend,
        comm: Comm = LOCAL,
    ) -> None:
        self.directory, self.every, self.digest, self.backend = directory, every, digest, backend
        self.comm = comm

    def __call__(self, net: LiftedNetwork, state: BCDState, step: Step) -> None:
        if step.iteration % self.every == 0 or step.last:
            self.save(net, state)
            self.backend.forget()

    def save(self, net: LiftedNetwork, state: BCDState) -> None:
        """Write ``state`` now (``KeyboardInterrupt``: the last finished round's)."""
        if self.comm.P > 1:
            state = gathered(state, self.comm)
        if self.comm.rank == 0:
            save_checkpoint(self.directory, net, state, dict(data=self.digest))


class ProgressBar:
    """A tqdm bar over the rounds with the current objectives and accuracy. While a kernel of
    the backend's kind compiles in this process (``Backend.on_compile``: the fast backend's
    fused chains, in a run's first batch), the bar names it."""

    def __init__(self, total: int, done: int, name: str, backend: Backend) -> None:
        from tqdm.auto import tqdm

        self.desc = f"BCD ({name})"
        self.bar = tqdm(total=total, initial=done, unit="round", desc=self.desc)
        self._stop = backend.on_compile(self.compiling)

    def compiling(self, chain: str | None) -> None:
        """``chain``: the name of the kernel compiling now; None: done."""
        self.bar.set_description(self.desc + (f": compiling {chain}" if chain else ""))

    def __call__(self, net: LiftedNetwork, state: BCDState, step: Step) -> None:
        rec, post = state.history.records[-1], {}
        if rec["checked"]:
            post = dict(F=f"{rec['lifted_x']:.4g}", J=f"{rec['network_x']:.4g}")
        if rec["test_accuracy"] is not None:
            post["test_acc"] = f"{rec['test_accuracy']:.3f}"
        elif rec["train_accuracy"] is not None:
            post["train_acc"] = f"{rec['train_accuracy']:.3f}"
        self.bar.set_postfix(post, refresh=False)
        self.bar.update(1)

    def close(self) -> None:
        self._stop()
        self.bar.close()


def observers(
    settings: RunSettings,
    callback: Callable[[LiftedNetwork, dict[str, Any]], object] | None,
    progress: bool,
    state: BCDState,
) -> list[Callable[[LiftedNetwork, BCDState, Step], object]]:
    """What runs after every round of the run of ``settings`` (``run_settings.RunSettings``):
    the checkpoint writer (first), the callback, the progress bar."""
    comm = settings.comm
    if comm.rank > 0:  # (rank 0 calls back and shows the bar; its stop is every rank's)
        callback, progress = None, False
    out = [] if callback is None else [lambda net, s, step: callback(net, s.history.records[-1])]
    folder, every, digest = settings.checkpoint
    if folder is not None:
        out.insert(0, CheckpointWriter(folder, every, digest, settings.backend, comm))
    if progress:
        out.append(
            ProgressBar(
                len(settings.steps),
                state.iteration,
                settings.config["backend"],
                settings.backend,
            )
        )
    return out


def interrupted(
    net: LiftedNetwork, state: BCDState, settings: RunSettings, observers: Sequence[Any]
) -> None:
    """Ctrl-C: the weights of the last finished round, as the checkpoint (written now) holds.
    On ranks the last checkpoint written stands (a rank interrupted alone cannot gather)."""
    net.W = list(state.W)
    if settings.checkpoint[0] is not None and settings.comm.P == 1:
        observers[0].save(net, state)


def gathered(state: BCDState, comm: Comm) -> BCDState:
    """The run state with every rank's columns of the batch's X and U_0, in rank order (the
    whole batch's columns: ``reduce.share``)."""

    def whole(A):
        return array_namespace(A).concat(comm.all_gather(A), axis=1)

    Xs = None if state.Xs is None else [whole(X) for X in state.Xs]
    carried = state.carried
    if carried is not None:
        carried = replace(carried, U=whole(carried.U))
    return replace(state, Xs=Xs, carried=carried)
