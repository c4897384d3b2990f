"""The reduction seam: every sum and maximum over a block's data points, taken in one place.

An X-block separates by column (eqs. (14)-(16) of the paper: each data point's column is its
own problem), and so does most of a W-block's work. Split a block's columns over P shards and
every step of a solver is local to its shard, except the figures that decide for the whole
block: the descent and restart tests (sums: values, inner products) and the stopping tests
(maxima: KKT residuals, step sizes). A solver takes each such figure through its
communicator's :meth:`reduce`, in one call per decision (``"sum"``, ``"max"`` or ``"min"``,
one op for all the values or one each), so that every shard decides alike:

- :data:`LOCAL` (:class:`Local`): one process holds every column, and a reduction is the
  figure itself (no copy, no host read: a 0-d array stays on its device);
- :class:`SimulatedComm`: ``P`` shards in one process, a thread each, whose reductions add the
  shards' parts in shard order: one process reproduces a P-way split's iterates, so a test
  shows that the seam catches every sum (a figure that bypasses it decides per shard).

The FISTA solver of the X-blocks (``xblocks.py``) goes through it. Which decisions are global:
all of FISTA's (its restart test is one inner product over the whole block, its descent guard
compares the whole block's values), as the one-process solver takes them; none is per column.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

__all__ = ["LOCAL", "Local", "SimulatedComm"]

#: how each op combines the shards' parts (in shard order)
OPS: dict[str, Callable[[Any, Any], Any]] = {
    "sum": lambda a, b: a + b,
    "max": np.maximum,
    "min": np.minimum,
}


def _ops(values: Sequence[Any], op: str | Sequence[str]) -> list[str]:
    ops = [op] * len(values) if isinstance(op, str) else list(op)
    if len(ops) != len(values) or not set(ops) <= set(OPS):
        raise ValueError(f"op must be one of {sorted(OPS)} or one per value, got {op!r}")
    return ops


class Local:
    """The communicator of one process holding every column: a reduction is the figure."""

    P = 1
    rank = 0

    def reduce(self, values: Sequence[Any], op: str | Sequence[str]) -> list:
        """``values`` (0-d arrays or numbers), each reduced over the shards by its op: here
        themselves.

        >>> LOCAL.reduce([3.0, 4.0], ("max", "sum"))
        [3.0, 4.0]
        """
        return list(values)


#: the communicator of a solve in one process
LOCAL = Local()


class SimulatedComm:
    """``P`` column shards of one block in one process, a thread each (:meth:`run`).

    >>> comm = SimulatedComm(3)
    >>> out = comm.run(lambda shard: shard.reduce([float(shard.rank), 1.0], ("max", "sum")))
    >>> [[float(v) for v in shard] for shard in out]   # every shard sees the same figures
    [[2.0, 3.0], [2.0, 3.0], [2.0, 3.0]]
    """

    def __init__(self, P: int, timeout: float = 60.0) -> None:
        if not (isinstance(P, int) and P >= 1):
            raise ValueError(f"P must be an integer >= 1, got {P!r}")
        self.P = P
        # a shard that waits this long for the others stops the run: they took another path
        self._barrier = threading.Barrier(P, timeout=timeout)
        self._parts: list[Any] = [None] * P
        self._finished: list[bool] = [False] * P

    def run(self, work: Callable[[_Shard], Any]) -> list:
        """``work(shard)`` for every shard (``shard.rank`` 0 .. P-1, ``shard.reduce``), each in
        its own thread; -> their results in shard order. A shard that raises stops the others
        (their next reduction raises) and its error is raised here."""
        results: list[Any] = [None] * self.P
        errors: list[BaseException | None] = [None] * self.P

        def one(rank: int) -> None:
            try:
                results[rank] = work(_Shard(self, rank))
            except BaseException as err:  # noqa: BLE001 - handed to the caller below
                errors[rank] = err
                self._barrier.abort()
            self._finished[rank] = True
            if self._barrier.n_waiting:  # a shard waits for a reduction this one never makes
                self._barrier.abort()

        self._finished = [False] * self.P
        threads = [threading.Thread(target=one, args=(r,)) for r in range(self.P)]
        for t in threads:
            t.start()
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

    def _reduce(self, rank: int, values: Sequence[Any], op: str | Sequence[str]) -> list:
        ops = _ops(values, op)
        if any(self._finished):
            self._barrier.abort()
            raise RuntimeError(
                f"the shards took different paths: shard {rank} reduces where shard "
                f"{self._finished.index(True)} has finished"
            )
        self._parts[rank] = (ops, list(values))
        self._barrier.wait()  # every shard's part is in
        if any(p[0] != ops for p in self._parts):
            self._barrier.abort()
            raise RuntimeError(
                f"the shards reduce different figures at once: {[p[0] for p in self._parts]}"
            )
        parts = [p[1] for p in self._parts]
        out = []
        for i, name in enumerate(ops):
            total = parts[0][i]
            for part in parts[1:]:
                total = OPS[name](total, part[i])
            out.append(total)
        self._barrier.wait()  # every shard has read them before the next reduction writes
        return out


class _Shard:
    """One shard's view of a :class:`SimulatedComm`: its ``rank`` and ``reduce``."""

    def __init__(self, comm: SimulatedComm, rank: int) -> None:
        self.comm, self.rank, self.P = comm, rank, comm.P

    def reduce(self, values: Sequence[Any], op: str | Sequence[str]) -> list:
        return self.comm._reduce(self.rank, values, op)


def _broken(err: BaseException) -> bool:
    return isinstance(err, threading.BrokenBarrierError)
