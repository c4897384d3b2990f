"""Each rank's heartbeat: how the ranks tell a rank that hangs from one that works.

A rank waiting in a collective for another cannot tell, from the wait alone, whether the other
computes (a first batch may spend a minute compiling its kernels) or hangs: its process stopped
(SIGSTOP, a debugger), or its interpreter held. So every rank runs a :class:`Heartbeat`, a
thread that beats every ``BEAT`` seconds whatever the rank's main thread does, and a rank that
waits looks at the others' beats (:func:`check`): one whose last beat is older than
:func:`hang_seconds` hangs, and the waiting rank stops with :class:`RankHangs` naming it.

Where the beats go: on one host, into memory the ranks share (:class:`ClockBeats`: the time,
one clock for every process of the host; the ranks' segment of ``host_memory``, and the slots
that ``parallel.Ranks`` gives the processes it starts); across hosts, into the process group's
store (:class:`StoreBeats`: a count, whose change each rank times on its own clock). A look
made while this rank's own beat is stale too names no one: the whole host stalled (a paused
VM), not one rank. Docs page "Training in parallel".
"""

from __future__ import annotations

import os
import threading
import time
import weakref
from collections.abc import Callable, Collection
from datetime import timedelta
from typing import Any, Protocol

from ..reduce import CollectiveError

__all__ = [
    "BEAT",
    "HANG",
    "ClockBeats",
    "Heartbeat",
    "RankHangs",
    "StoreBeats",
    "check",
    "hang_seconds",
    "store_beats",
]

#: seconds between a rank's heartbeats (at most: a hang limit under 4 s beats four times in it)
BEAT = 1.0
#: the age of a heartbeat past which its rank hangs (seconds), where ``FENCHEL_HANG`` is unset
HANG = 30.0
#: the environment variable that sets the hang limit of every rank started from this one
HANG_VARIABLE = "FENCHEL_HANG"
#: the longest a look at the store's beats waits for the store (seconds)
STORE_LOOK = 1.0


class RankHangs(CollectiveError):
    """A rank whose heartbeat stopped: its process is stopped, or its interpreter held."""


def hang_seconds() -> float:
    """The hang limit: ``FENCHEL_HANG`` (seconds, > 0) where set, else ``HANG``."""
    text = os.environ.get(HANG_VARIABLE)
    if text is None:
        return HANG
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value > 0:
        raise ValueError(f"{HANG_VARIABLE} must be a number of seconds > 0, got {text!r}")
    return value


class Beats(Protocol):
    """Where the ranks' beats go, this process beating as ``rank``: ``stale()`` ->
    ``(rank, seconds)`` of each other rank whose last beat is older than its
    ``heartbeat.hang`` (none where this rank's own beat is stale too), and ``name(rank)`` for
    an error."""

    rank: int
    heartbeat: Heartbeat

    def stale(self) -> list[tuple[int, float]]: ...

    def name(self, r: int) -> str: ...


class Heartbeat:
    """A daemon thread that calls ``beat()`` now and every ``min(BEAT, hang / 4)`` seconds,
    until ``beat``'s owner (a bound method's object) is dropped; a beat that fails (the
    store's connection) is tried again at the next. ``hang``: None, :func:`hang_seconds`.
    ``age()``: the seconds since this thread last beat."""

    def __init__(self, beat: Callable[[], None], rank: int, hang: float | None = None) -> None:
        self.hang = hang_seconds() if hang is None else float(hang)
        self.last = time.monotonic()
        beat()
        threading.Thread(
            target=_beating, args=(weakref.WeakMethod(beat), self, min(BEAT, self.hang / 4)),
            daemon=True, name=f"fenchel_cvx heartbeat of rank {rank}",
        ).start()  # fmt: skip

    def age(self) -> float:
        return time.monotonic() - self.last


def _beating(beat: weakref.WeakMethod, heart: Heartbeat, period: float) -> None:
    while True:
        time.sleep(period)
        if (method := beat()) is None:
            return
        try:
            method()
            heart.last = time.monotonic()
        except Exception:  # noqa: BLE001, S110 - the next beat tries again; a rank that
            pass  # cannot beat for ``hang`` seconds is named by the others
        del method


def check(beats: Beats, where: str, among: Collection[int] | None = None) -> None:
    """Raises :class:`RankHangs` naming a rank (of ``among``; None: any) whose heartbeat is
    stale, ``where`` (e.g. "during a collective of 2 ranks")."""
    for r, age in beats.stale():
        if among is None or r in among:
            raise RankHangs(
                f"rank {beats.rank}: {beats.name(r)} hangs: no heartbeat for "
                f"{age:.0f} s {where} (stopped, or its interpreter held)"
            )


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
        if self.heartbeat.age() > self.heartbeat.hang / 2:  # (the host stalled)
            return []
        now, ranks = time.monotonic_ns(), range(len(self.beats))
        on = [r for r in ranks if r != self.rank and self.pids[r] > 0 and self.beats[r] > 0]
        ages = [(r, (now - int(self.beats[r])) / 1e9) for r in on]
        return [(r, age) for r, age in ages if age > self.heartbeat.hang]

    def name(self, r: int) -> str:
        return f"rank {r}'s process ({int(self.pids[r])})"


class StoreBeats:
    """The ranks' beats in ``store`` (the process group's: ``torch.distributed``'s store, on
    every host): rank ``rank`` of ``P`` adds 1 to its key every beat, through a connection of
    its own; :meth:`stale` reads every rank's count through another, which waits at most
    ``STORE_LOOK`` seconds (a store that does not answer names no one: the collective's own
    timeout stands), and times each change on this rank's clock (the hosts' clocks may
    differ)."""

    PREFIX = "fenchel_cvx/heartbeat/"

    def __init__(self, store: Any, P: int, rank: int, hang: float | None = None) -> None:
        self.P, self.rank = P, rank
        self._beats, self._looks = store.clone(), store.clone()
        self._looks.set_timeout(timedelta(seconds=STORE_LOOK))
        self._seen: dict[int, tuple[bytes, float]] = {}
        self.heartbeat = Heartbeat(self._beat, rank, hang)

    def _beat(self) -> None:
        self._beats.add(self.PREFIX + str(self.rank), 1)

    def stale(self) -> list[tuple[int, float]]:
        if self.heartbeat.age() > self.heartbeat.hang / 2:  # (the host stalled)
            return []
        others = [r for r in range(self.P) if r != self.rank]
        keys = [self.PREFIX + str(r) for r in others]
        try:
            counts = self._looks.multi_get(keys) if self._looks.check(keys) else []
        except RuntimeError:  # (the store does not answer)
            return []
        now, out = time.monotonic(), []
        for r, count in zip(others, counts):
            last, since = self._seen.get(r, (b"", now))
            if count != last:
                self._seen[r] = (count, now)
            elif now - since > self.heartbeat.hang:
                out.append((r, now - since))
        return out

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
