"""The reduction seam: every sum and maximum over a block's data points, taken in one place.

An X-block separates by column (eqs. (14)-(16) of the paper: each data point's column is its
own problem), and so does most of a W-block's work. Split a block's columns over P shards and
every step of a solver is local to its shard, except the figures that decide for the whole
block: the descent tests and CG's restarts (sums: values, inner products) and the stopping
tests (maxima: KKT residuals, step sizes). A solver takes each such figure through its
communicator's :meth:`reduce`, in one call per decision (``"sum"``, ``"max"`` or ``"min"``,
one op for all the values or one each), so that every shard decides alike:

- :data:`LOCAL` (:class:`Local`): one process holds every column, and a reduction is the
  figure itself (no copy, no host read: a 0-d array stays on its device);
- :class:`SimulatedComm`: ``P`` shards in one process, a thread each, whose reductions add the
  shards' parts in shard order: one process reproduces a P-way split's iterates, so a test
  shows that the seam catches every sum (a figure that bypasses it decides per shard).

A W-block splits two ways: by its columns (each shard its data points, W whole: the sums over
the points are reduced) or by its rows (each shard some rows of W and every column: the
figures over the rows are reduced, the stopping tests' maxima, the values, the counts). A
communicator names its split (``split``), and a solver asks it for the two roles: ``columns``
(the communicator of the sums over data points: itself where it splits columns, else
:data:`LOCAL`) and ``rows`` (the one of the figures over W's rows). :meth:`all_gather` hands
every shard's part to every shard, and :meth:`to_rows` moves an array held by columns to rows,
each shard its rows over every column: the move from a column split to a row split (a hidden
W-block whose solve needs every column of its rows: data space, Newton rows).

The FISTA solver of the X-blocks (``xblocks.py``) and the nonlinear CG of the W-blocks
(``pncg.py``, ``span.py``, ``wblocks.py``) go through it. Which decisions are global: every
decision of CG (its step lengths, tests and frozen rows see the whole block) and FISTA's
stopping tests, backtracking and descent guard (the whole block's values), as the one-process
solvers take them. FISTA's momentum is per column, as its step is: each column restarts on its
own inner product, in one process as on shards, so the momentum reduces nothing.
"""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import numpy as np
from array_api_compat import array_namespace

from .arrays import Array

__all__ = ["LOCAL", "CollectiveError", "Comm", "Local", "SimulatedComm", "share"]


class CollectiveError(RuntimeError):
    """A collective that did not complete: another rank's process ended, its connection closed,
    it hangs (``fast.heartbeat``), or it did not come within the timeout."""


#: the ways a block splits over shards
SPLITS = ("columns", "rows")

#: how each op combines the shards' parts (in shard order)
OPS: dict[str, Callable[[Any, Any], Any]] = {
    "sum": lambda a, b: a + b,
    "max": np.maximum,
    "min": np.minimum,
}


def _check_split(split: str) -> str:
    """``split`` where it is one of ``SPLITS``; else a ``ValueError`` naming it."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    return split


def _ops(values: Sequence[Any], op: str | Sequence[str]) -> list[str]:
    ops = [op] * len(values) if isinstance(op, str) else list(op)
    if len(ops) != len(values) or not set(ops) <= set(OPS):
        raise ValueError(f"op must be one of {sorted(OPS)} or one per value, got {op!r}")
    return ops


class Comm(Protocol):
    """What a solver asks of a communicator (:data:`LOCAL`, a shard of a
    :class:`SimulatedComm`, ``fast.torch_comm.TorchComm``): the shards' count ``P``, this
    shard's ``rank``, its ``split``, the collectives and the two roles (module doc).
    ``copies``: every shard runs on copies of shard 0's arguments, so they hold its data by
    construction (``parallel.Ranks.fit``; ``run_settings.agreed`` then digests none)."""

    P: int
    rank: int
    split: str
    copies: bool

    def reduce(self, values: Sequence[Any], op: str | Sequence[str]) -> list[Any]:
        """``values`` (0-d arrays or numbers), each reduced over the shards by its op."""
        ...

    def all_gather(self, value: Array, shapes: Sequence[tuple] | None = None) -> list[Any]:
        """Every shard's ``value``, in shard order (``shapes``: theirs, where the caller knows
        them)."""
        ...

    def to_rows(
        self, A: Array, counts: Sequence[int], columns: Sequence[int] | None = None
    ) -> Array:  # fmt: skip
        """This shard's rows of a ``p x m`` array from its columns ``A``."""
        ...

    def with_split(self, split: str) -> Comm:
        """This communicator's shards, split the other way."""
        ...

    def verify(self) -> None:
        """Raises where the shards reduced different figures and no reduction said so at once
        (``TorchComm``'s reductions on a device are checked here: ``block_checks``, at the end
        of every round, and ``fit_bcd``, at the end of a run)."""
        ...

    @property
    def columns(self) -> Comm:
        """The communicator of the sums over a block's data points."""
        ...

    @property
    def rows(self) -> Comm:
        """The communicator of the figures over a W-block's rows."""
        ...


class _Moves:
    """What every communicator does with its ``all_gather``: the move from columns to rows,
    and its two roles (``columns``, ``rows``); none runs on copies unless made so."""

    P: int
    rank: int
    split: str
    copies: bool = False

    def all_gather(self, value: Any, shapes: Sequence[tuple] | None = None) -> list:
        raise NotImplementedError

    def to_rows(self, A: Any, counts: Sequence[int], columns: Sequence[int] | None = None) -> Any:
        """This shard's rows of a ``p x m`` array from its columns ``A`` (``p x m_r``): the
        rows ``counts[0]`` to shard 0, the next ``counts[1]`` to shard 1, ..., each over every
        column in shard order (``columns``: every shard's column count, where the caller knows
        them: a gather on a device then reads no shapes back).

        >>> import numpy as np
        >>> A = np.arange(12.0).reshape(3, 4)        # 3 rows, 4 columns
        >>> def move(shard):                         # each shard holds 2 of the columns
        ...     return shard.to_rows(A[:, 2 * shard.rank : 2 * shard.rank + 2], (2, 1))
        >>> [part.tolist() for part in SimulatedComm(2).run(move)]   # rows 0-1, then row 2
        [[[0.0, 1.0, 2.0, 3.0], [4.0, 5.0, 6.0, 7.0]], [[8.0, 9.0, 10.0, 11.0]]]
        """
        if len(counts) != self.P or sum(counts) != A.shape[0]:
            raise ValueError(
                f"counts must be {self.P} row counts summing to {A.shape[0]}, got {counts!r}"
            )
        lo = sum(counts[: self.rank])
        parts = self.all_gather(A, None if columns is None else [(A.shape[0], c) for c in columns])
        mine = [part[lo : lo + counts[self.rank]] for part in parts]
        return mine[0] if len(mine) == 1 else array_namespace(A).concat(mine, axis=1)

    def with_split(self, split: str) -> Any:
        """This communicator's shards, split the other way (``"columns"`` or ``"rows"``)."""
        raise NotImplementedError

    def verify(self) -> None:
        """Nothing deferred to check: a reduction that checks what the shards reduce does so
        as it combines them."""

    @property
    def columns(self) -> Any:
        """The communicator of the sums over a block's data points (its columns)."""
        return self if self.split == "columns" else LOCAL

    @property
    def rows(self) -> Any:
        """The communicator of the figures over a W-block's rows."""
        return self if self.split == "rows" else LOCAL


class Local(_Moves):
    """The communicator of one process holding every column: a reduction is the figure."""

    P = 1
    rank = 0
    split = "columns"

    def reduce(self, values: Sequence[Any], op: str | Sequence[str]) -> list:
        """``values`` (0-d arrays or numbers), each reduced over the shards by its op: here
        themselves.

        >>> LOCAL.reduce([3.0, 4.0], ("max", "sum"))
        [3.0, 4.0]
        """
        return list(values)

    def all_gather(self, value: Array, shapes: Sequence[tuple] | None = None) -> list:
        """Every shard's ``value``, in shard order: here this one's.

        >>> LOCAL.all_gather(3.0)
        [3.0]
        """
        return check_shapes(shapes, [value])

    def with_split(self, split: str) -> Local:
        return self

    @property
    def columns(self) -> Local:
        return self

    @property
    def rows(self) -> Local:
        return self


#: the communicator of a solve in one process
LOCAL = Local()


def check_shapes(shapes: Sequence[tuple] | None, parts: list) -> list:
    """``parts`` (every shard's array of a gather), where they have the ``shapes`` a caller
    gave (None: any); else a ``ValueError`` naming both."""
    found = [tuple(getattr(part, "shape", ())) for part in parts]
    if shapes is not None and [tuple(s) for s in shapes] != found:
        raise ValueError(f"shapes must be the shards' shapes {found}, got {list(shapes)!r}")
    return parts


def share(n: int, P: int, rank: int) -> slice:
    """The rank's share of ``n`` data points on ``P`` ranks: consecutive, the first ``n % P``
    ranks one point more than the others (NumPy's ``array_split``).

    >>> [share(10, 3, r) for r in range(3)]   # 10 points on 3 ranks: 4, 3 and 3
    [slice(0, 4, None), slice(4, 7, None), slice(7, 10, None)]
    """
    small, extra = divmod(n, P)
    lo = rank * small + min(rank, extra)
    return slice(lo, lo + small + (rank < extra))


class SimulatedComm:
    """``P`` column shards of one block in one process, a thread each (:meth:`run`).

    >>> comm = SimulatedComm(3)
    >>> out = comm.run(lambda shard: shard.reduce([float(shard.rank), 1.0], ("max", "sum")))
    >>> [[float(v) for v in shard] for shard in out]   # every shard sees the same figures
    [[2.0, 3.0], [2.0, 3.0], [2.0, 3.0]]
    """

    def __init__(
        self,
        P: int,
        timeout: float | None = 60.0,
        split: str = "columns",
        running: int | None = None,
    ) -> None:
        if not (isinstance(P, int) and P >= 1):
            raise ValueError(f"P must be an integer >= 1, got {P!r}")
        if running is not None and not (isinstance(running, int) and running >= 1):
            raise ValueError(f"running must be an integer >= 1 or None, got {running!r}")
        self.P, self.split = P, _check_split(split)
        self.running = P if running is None else min(P, running)
        if timeout is not None and self.running < P:
            raise ValueError(
                f"timeout must be None where fewer shards run at once than there are "
                f"(running={running!r} of P={P}): a shard's wait would count the others' turns, "
                f"got timeout={timeout!r}"
            )
        # at most ``running`` shards compute at once (None: all P); a shard gives its turn up
        # while it waits in a collective, so P shards of a large array on fewer cores hold a
        # shard's temporaries only where they compute (``column_threads``: Figure 1's figures
        # in chunks of columns)
        self._turns = threading.BoundedSemaphore(self.running)
        # a shard that waits this long for the others stops the run: they took another path
        # (None: no limit, for shards that run the same code on shares of one size)
        self._barrier = threading.Barrier(P, timeout=timeout)
        self._parts: list[Any] = [None] * P
        self._finished: list[bool] = [False] * P
        # the collectives each shard has entered, and the lock under which a shard enters one
        # or finishes: a shard that finishes sees every shard already inside a collective it
        # never makes (it has entered more of them), and a shard that enters one sees every
        # shard that has finished
        self._entered: list[int] = [0] * P
        self._gate = threading.Lock()

    def run(self, work: Callable[[_Shard], Any]) -> list:
        """``work(shard)`` for every shard (``shard.rank`` 0 .. P-1, ``shard.reduce``), each in
        its own thread (shard 0 in the calling one); -> their results in shard order. A shard
        that raises stops the others (their next reduction raises) and its error is raised
        here."""
        results: list[Any] = [None] * self.P
        errors: list[BaseException | None] = [None] * self.P

        def one(rank: int) -> None:
            try:
                with self._turns:
                    if self._barrier.broken:  # a shard has failed: this one stops unstarted
                        raise threading.BrokenBarrierError
                    results[rank] = work(_Shard(self, rank))
            except BaseException as err:  # noqa: BLE001 - handed to the caller below
                errors[rank] = err
                self._barrier.abort()
            with self._gate:
                self._finished[rank] = True
                stranded = max(self._entered) > self._entered[rank]
            if stranded:  # a shard is inside a collective this one never makes
                self._barrier.abort()

        self._finished, self._entered = [False] * self.P, [0] * self.P
        threads = [threading.Thread(target=one, args=(r,)) for r in range(1, self.P)]
        for t in threads:
            t.start()
        # shard 0 in this thread, in a fresh context: a new thread's starts empty (NumPy's
        # error state at its defaults) where threads do not inherit their starter's
        contextvars.Context().run(one, 0)
        for t in threads:
            t.join()
        self._barrier.reset()
        first = next((e for e in errors if e is not None and not _broken(e)), None)
        if first is None and any(e is not None for e in errors):
            first = RuntimeError(
                "the shards took different paths: some reduced where others had finished"
            )
        if first is not None:
            raise first
        return results

    def _exchange(self, rank: int, what: Any, part: Any) -> list:
        """Every shard's ``part``, in shard order, once every shard has given its own; ``what``
        names the collective (shards that call different ones took different paths)."""
        with self._gate:
            finished = any(self._finished)
            self._entered[rank] += 1
        if finished:
            self._barrier.abort()
            raise RuntimeError(
                f"the shards took different paths: shard {rank} reduces where shard "
                f"{self._finished.index(True)} has finished"
            )
        self._parts[rank] = (what, part)
        self._wait()  # every shard's part is in
        if any(p[0] != what for p in self._parts):
            self._barrier.abort()
            raise RuntimeError(
                f"the shards reduce different figures at once: {[p[0] for p in self._parts]}"
            )
        parts = [p[1] for p in self._parts]
        self._wait()  # every shard has read them before the next collective writes
        return parts

    def _wait(self) -> None:
        """The barrier of every shard, this shard's turn given up while it waits."""
        self._turns.release()
        try:
            self._barrier.wait()
        finally:
            self._turns.acquire()

    def _reduce(self, rank: int, values: Sequence[Any], op: str | Sequence[str]) -> list:
        ops = _ops(values, op)
        parts = self._exchange(rank, ops, list(values))
        out = []
        for i, name in enumerate(ops):
            total = parts[0][i]
            for part in parts[1:]:
                total = OPS[name](total, part[i])
            out.append(total)
        return out


class _Shard(_Moves):
    """One shard's view of a :class:`SimulatedComm`: its ``rank``, ``reduce`` and
    ``all_gather``."""

    def __init__(self, comm: SimulatedComm, rank: int, split: str | None = None) -> None:
        self.comm, self.rank, self.P = comm, rank, comm.P
        self.split = comm.split if split is None else split

    def with_split(self, split: str) -> _Shard:
        return _Shard(self.comm, self.rank, split)

    def reduce(self, values: Sequence[Any], op: str | Sequence[str]) -> list:
        return self.comm._reduce(self.rank, values, op)

    def all_gather(self, value: Any, shapes: Sequence[tuple] | None = None) -> list:
        return check_shapes(shapes, self.comm._exchange(self.rank, "all_gather", value))


def _broken(err: BaseException) -> bool:
    return isinstance(err, threading.BrokenBarrierError)
