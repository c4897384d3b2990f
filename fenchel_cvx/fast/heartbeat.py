"""Each rank's heartbeat: how the ranks tell a rank that hangs from one that works.

A rank waiting in a collective for another cannot tell, from the wait alone, whether the other
computes (a first batch may spend a minute compiling its kernels) or hangs: its process stopped
(SIGSTOP, a debugger), or its interpreter held. So every rank runs a :class:`Heartbeat`, a
thread that beats every ``BEAT`` seconds whatever the rank's main thread does, and a rank that
waits looks at the others' beats: one whose last beat is older than ``hang`` seconds (``HANG``)
hangs, and the waiting rank stops with ``reduce.CollectiveError`` naming it.

Where the beats go: on one host, into memory the ranks share (:class:`ClockBeats`: the time,
one clock for every process of the host; the ranks' segment of ``host_memory``, and the slots
that ``parallel.Ranks`` gives the processes it starts, which beat from their start);
across hosts, into the process group's store (:class:`StoreBeats`: a count, whose change each
rank times on its own clock). Docs page "Training in parallel".
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable
from typing import Any, Protocol

__all__ = [
    "BEAT",
    "HANG",
    "ClockBeats",
    "Heartbeat",
    "StoreBeats",
    "hangs",
    "store_beats",
    "watched",
]

#: seconds between a rank's heartbeats (at most: a ``hang`` under 4 s beats four times in it)
BEAT = 1.0
#: the age of a heartbeat past which its rank hangs (seconds)
HANG = 30.0
#: how often a waiting rank looks at the others (seconds)
LOOK = 0.05


class Beats(Protocol):
    """Where the ranks' beats go: ``stale()`` -> ``(rank, seconds)`` of each other rank whose
    last beat is older than its ``heartbeat.hang``, and ``name(rank)`` for an error."""

    heartbeat: Heartbeat

    def stale(self) -> list[tuple[int, float]]: ...

    def name(self, r: int) -> str: ...


class Heartbeat:
    """A daemon thread that calls ``beat()`` now and every ``min(BEAT, hang / 4)`` seconds,
    until ``beat``'s owner (a bound method's object) is dropped. ``hang``: None, ``HANG``."""

    def __init__(self, beat: Callable[[], None], rank: int, hang: float | None = None) -> None:
        self.rank, self.hang = rank, HANG if hang is None else float(hang)
        beat()
        owner, name = weakref.ref(beat.__self__), beat.__name__  # type: ignore[attr-defined]
        threading.Thread(
            target=_beating, args=(owner, name, min(BEAT, self.hang / 4)), daemon=True,
            name=f"fenchel_cvx heartbeat of rank {rank}",
        ).start()  # fmt: skip


def _beating(owner: weakref.ReferenceType, name: str, period: float) -> None:
    while True:
        time.sleep(period)
        if (obj := owner()) is None:
            return
        getattr(obj, name)()
        del obj


def hangs(beats: Beats, r: int, age: float, where: str) -> str:
    """The message of an error that names rank ``r`` as hung ``where`` (e.g. "during a
    collective of 2 ranks")."""
    return (
        f"rank {beats.heartbeat.rank}: {beats.name(r)} hangs: no heartbeat for {age:.0f} s "
        f"{where} (stopped, or its interpreter held)"
    )


def watched(fn: Callable[..., Any], look: Callable[[], None], *args: Any) -> Any:
    """``fn(*args)`` on a thread of its own while this thread calls ``look()`` (which raises
    where a rank ended or hangs) every ``LOOK`` seconds: -> its result, or its error. For a
    wait that cannot look itself (a rendezvous of the process group, a write to a pipe that a
    stopped rank no longer reads); where ``look`` raises, the thread is left to its wait."""
    out: list[Any] = []

    def run() -> None:
        try:
            out.append((True, fn(*args)))
        except BaseException as err:  # noqa: BLE001 - handed to the caller
            out.append((False, err))

    thread = threading.Thread(target=run, daemon=True, name="fenchel_cvx watched wait")
    thread.start()
    while thread.is_alive():
        thread.join(LOOK)
        if not out:
            look()
    ok, value = out[0]
    if not ok:
        raise value
    return value


class ClockBeats:
    """The ranks' beats as times (``time.monotonic_ns``) in shared int64 slots, ``beats[r]``
    rank ``r``'s, beside its process id ``pids[r]`` (arrays over memory the ranks share); this
    process beats as rank ``rank``. A rank counts once its process id and a beat are written."""

    def __init__(self, beats: Any, pids: Any, rank: int, hang: float | None = None) -> None:
        self.beats, self.pids, self.rank = beats, pids, rank
        self.heartbeat = Heartbeat(self._beat, rank, hang)

    def _beat(self) -> None:
        self.beats[self.rank] = time.monotonic_ns()

    def stale(self) -> list[tuple[int, float]]:
        now, ranks = time.monotonic_ns(), range(len(self.beats))
        on = [r for r in ranks if r != self.rank and self.pids[r] > 0 and self.beats[r] > 0]
        ages = [(r, (now - int(self.beats[r])) / 1e9) for r in on]
        return [(r, age) for r, age in ages if age > self.heartbeat.hang]

    def name(self, r: int) -> str:
        return f"rank {r}'s process ({int(self.pids[r])})"


class StoreBeats:
    """The ranks' beats in ``store`` (the process group's: ``torch.distributed``'s store, on
    every host): rank ``rank`` of ``P`` adds 1 to its key every beat; :meth:`stale` reads every
    rank's count and times each change on this rank's clock (the hosts' clocks may differ)."""

    PREFIX = "fenchel_cvx/heartbeat/"

    def __init__(self, store: Any, P: int, rank: int, hang: float | None = None) -> None:
        self.store, self.P, self.rank = store, P, rank
        self._beats = store.clone()  # (the heartbeat thread's own connection)
        self._seen: dict[int, tuple[bytes, float]] = {}
        self.heartbeat = Heartbeat(self._beat, rank, hang)

    def _beat(self) -> None:
        self._beats.add(self.PREFIX + str(self.rank), 1)

    def stale(self) -> list[tuple[int, float]]:
        others = [r for r in range(self.P) if r != self.rank]
        keys = [self.PREFIX + str(r) for r in others]
        try:
            counts = self.store.multi_get(keys) if self._all_beating(keys) else []
        except RuntimeError:  # (the store's host is gone: the collective's own error follows)
            return []
        now, out = time.monotonic(), []
        for r, count in zip(others, counts):
            last, since = self._seen.get(r, (b"", now))
            if count != last:
                self._seen[r] = (count, now)
            elif now - since > self.heartbeat.hang:
                out.append((r, now - since))
        return out

    def _all_beating(self, keys: list[str]) -> bool:
        return bool(self.store.check(keys))

    def name(self, r: int) -> str:
        return f"rank {r}"


def store_beats(group: Any, P: int, rank: int, hang: float | None = None) -> StoreBeats | None:
    """:class:`StoreBeats` in the store of ``group`` (None: the default group), or None where
    this PyTorch keeps the store out of reach (a hung rank then meets the group's timeout)."""
    from torch.distributed import distributed_c10d as c10d

    try:
        store = c10d._get_default_store() if group is None else c10d._world.pg_map[group][1]
        return StoreBeats(store, P, rank, hang)
    except (AttributeError, KeyError, RuntimeError, ValueError):
        return None
