"""The schedule and the state of a BCD run: Algorithms 1 and 2 of the paper (Sec. 4.5).

A run is a list of rounds (:class:`Step`, from :func:`schedule`): Algorithm 1's ``iterations``
rounds on all the data, or Algorithm 2's ``epochs`` passes over the batches of
``datasets.batch_order`` with ``alternations`` (K) rounds a batch, the batched model of eq. (13)
centred at W0 <- W where a batch starts. :class:`BCDState` is what a run carries from round to
round (and all that a checkpoint stores, ``checkpoints.py``); :class:`Batches` gathers each
round's columns of the data.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import threading
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, Any

import numpy as np
from array_api_compat import device

from .arrays import by_points, freeze
from .datasets import batch_order
from .history import History
from .reduce import LOCAL, Comm, share

if TYPE_CHECKING:
    from .arrays import Array
    from .layers import LinearMap
    from .network import LiftedNetwork
    from .pre_activations import Image


@dataclass(frozen=True)
class Step:
    """One round of a run's schedule: its position and what starts with it."""

    iteration: int  # 1, 2, ... over the run
    epoch: Any  # Algorithm 2: epoch, batch and alternation (k), from 1; None in Alg. 1
    batch: Any
    alternation: Any
    columns: Any  # the batch's column indices; None: all the data
    new_x: bool  # X <- the feed-forward point on the batch
    new_w0: bool  # W0 <- W (the centre of the proximal term)
    end_of_epoch: bool  # the last round of an epoch (of the run, in Algorithm 1)
    last: bool  # the last round of the run

    @property
    def idx(self) -> Array | None:
        """Deprecated name of :attr:`columns`."""
        warnings.warn("Step.idx is deprecated; use Step.columns", DeprecationWarning, stacklevel=2)
        return self.columns


def schedule(
    m: int, batch_size: int | None, epochs: int, iterations: int, alternations: int, seed: int
) -> list[Step]:
    """The rounds of Algorithm 1 (``batch_size=None``) or Algorithm 2, in order.

    Algorithm 2's batches are ``datasets.batch_order(m, batch_size, epochs, seed)``: a pure
    function of the seed, so a run's position in it (``BCDState.iteration``) is all the random
    state a checkpoint needs. A ``batch_size >= m`` gives every epoch the one batch
    ``arange(m)``: all the data in their own order.

    Examples
    --------
    >>> [(s.iteration, s.new_x, s.last) for s in schedule(4, None, 1, 2, 1, seed=0)]
    [(1, True, False), (2, False, True)]
    >>> [s.columns.tolist() for s in schedule(4, 4, 2, 0, 1, seed=0)]
    [[0, 1, 2, 3], [0, 1, 2, 3]]
    """
    if batch_size is None:
        return [
            Step(i, None, None, None, None, i == 1, True, i == iterations, i == iterations)
            for i in range(1, iterations + 1)
        ]
    order = (
        batch_order(m, batch_size, epochs, seed=seed)
        if batch_size < m
        else [[np.arange(m)]] * epochs
    )
    steps: list[Step] = []
    for e, batches in enumerate(order, start=1):
        for b, columns in enumerate(batches, start=1):
            for k in range(1, alternations + 1):
                end = b == len(batches) and k == alternations
                steps.append(
                    Step(len(steps) + 1, e, b, k, columns, k == 1, k == 1, end, end and e == epochs)
                )
    return steps


def batches(steps: list[Step]) -> list[list[Step]]:
    """``steps`` grouped by batch: each batch's consecutive rounds (its alternations; a resumed
    run's first batch from its round on).

    Examples
    --------
    >>> [tuple(s.alternation for s in b) for b in batches(schedule(4, 2, 1, 0, 3, seed=0)[2:])]
    [(3,), (1, 2, 3)]
    """
    return [list(g) for _, g in itertools.groupby(steps, key=lambda s: (s.epoch, s.batch))]


@dataclass
class BCDState:
    """What a run carries from round to round, and all that a checkpoint stores
    (``checkpoints.py``).

    ``W`` the weights after the last finished round, ``Xs`` the lifted variables of the
    current batch, ``W0`` the proximal centre, ``iteration`` the rounds done (the position in
    the schedule), ``history`` the records so far, ``W_prev`` the weights before the last
    extrapolation (``momentum``; None before the first), ``carried`` the first layer's
    pre-activation at ``W`` that the next round may take (``pre_activations.Image``; None: none).
    """

    W: list
    history: History
    Xs: Any = None
    W0: Any = None
    iteration: int = 0
    W_prev: Any = None
    carried: Any = None

    def advance(
        self,
        net: LiftedNetwork,
        Xs: list[Array] | None,
        record: dict[str, Any],
        W_prev: list[Array] | None = None,
        carried: Image | None = None,
    ) -> None:
        """The state after the round of ``record``: ``net``'s weights, ``Xs``, the record. Its
        fields change together: a Ctrl-C meanwhile is held until they have (the checkpoint
        that ``observers.interrupted`` writes then is the whole round's)."""
        with held_interrupt():
            self.W, self.Xs, self.iteration = list(net.W), Xs, record["iteration"]
            self.W_prev = self.W_prev if W_prev is None else W_prev
            self.carried = carried
            self.history.append(record)


@contextlib.contextmanager
def held_interrupt() -> Iterator[None]:
    """Ctrl-C (SIGINT) held while the body runs and delivered when it ends, as the handler in
    place would have received it (Python's: a ``KeyboardInterrupt``). Only the main thread
    receives signals: elsewhere, and where the handler in place was not installed from Python,
    the body runs as it is."""
    if threading.current_thread() is not threading.main_thread() or (
        signal.getsignal(signal.SIGINT) is None  # a handler not installed from Python: kept
    ):
        yield
        return
    held = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: held.append(frame))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if held and callable(previous):
            previous(signal.SIGINT, held[0])
        elif held and previous == signal.SIG_DFL:
            os.kill(os.getpid(), signal.SIGINT)


class Batches:
    """The training data and its batches (column gathers, the last one cached). Unbatched
    (Algorithm 1, or ``batch_size >= m``, whose one batch is all the data in order:
    ``schedule``) every round gets the data themselves. On the ranks of ``comm``
    (``reduce.py``) each gets its share of every batch's columns (``reduce.share``)."""

    def __init__(
        self,
        X0: Array,
        Y: Array,
        xp: ModuleType,
        batched: bool,
        comm: Comm = LOCAL,
        threads: int = 1,
    ) -> None:
        self.xp, self.batched, self.comm, self.threads = xp, batched, comm, threads
        self.X0, self.Y = X0, Y
        if not batched and comm.P > 1:  # this rank's columns of all the data, once
            mine = share(X0.shape[1], comm.P, comm.rank)
            X0, Y = X0[:, mine], Y[:, mine]
        self._last = (None, X0, Y)
        # (the batch, the layer, its patches)
        self._patches: tuple[Array | None, LinearMap | None, Array | None] = (None, None, None)
        # from a column-major copy each batch is one contiguous block per point (MNIST, 784 x
        # 60,000 float32: 0.1 ms a batch instead of 3 ms)
        self.cols = np.asfortranarray(X0) if batched and xp is np else X0

    def size(self, columns: Array) -> int:
        """The number of data points in the batch of ``columns`` (every rank's together)."""
        return int(self.X0.shape[1]) if not self.batched else len(columns)

    def batch(self, columns: Array) -> tuple[Array, Array]:
        """``(X0, Y)`` of the batch of ``columns`` (all the data where unbatched): on ranks,
        this rank's share of its columns."""
        if not self.batched:
            return self._last[1:]
        if columns is not self._last[0]:
            mine = columns[share(len(columns), self.comm.P, self.comm.rank)]
            if self.xp is np:
                Xb, Yb = np.ascontiguousarray(self.cols[:, mine]), self.Y[:, mine]
            else:
                j = self.xp.asarray(mine, device=device(self.X0))
                Xb, Yb = self.xp.take(self.X0, j, axis=1), self.xp.take(self.Y, j, axis=1)
            self._last = (columns, Xb, Yb)
        return self._last[1:]

    def patches(self, layer: LinearMap, Xb: Array) -> Array:
        """``layer.patches(Xb)`` of the batch ``Xb``, formed once per batch (unbatched: once
        per run), on the backend's check threads (``arrays.by_points``). The feed-forward
        pass and W_0's block use them, and W_0's Gram cache meets the very array it was formed
        from again (no comparison of contents). A NumPy array that owns its bytes (a dense
        layer's) is handed out read-only (``arrays.freeze``: the oracle's workers keep it by the
        digest of its bytes, which ``dask_rows.digest`` then forms once)."""
        if self._patches[0] is not Xb or self._patches[1] is not layer:
            self._patches = (None, None, None)  # the last batch's patches freed first
            self._patches = (Xb, layer, freeze(by_points(layer.patches, Xb, self.threads)))
        return self._patches[2]
