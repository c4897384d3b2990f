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
store (:class:`StoreBeats`: a count, whose changes each rank's heartbeat thread reads and times
on its own clock, so that a look never waits for the store). A look made while this rank's own
beat is stale too names no one: the whole host stalled (a paused VM), not one rank; but a store
that takes no beat while this rank's heartbeat tries is named (its server hangs). A heartbeat
ends with :meth:`Heartbeat.stop` (``TorchComm.close``), and at the latest when the interpreter
exits (``atexit``), waiting ``STOP`` seconds at most for its beat in flight: a beat into the
store that returns while the interpreter tears down aborts the process. Docs page "Training in
parallel".
"""

from __future__ import annotations

import atexit
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
#: the longest a heartbeat's connection to the store waits where it waits (to connect, for a
#: key): seconds. A store whose server is stopped holds a beat until it answers.
STORE_WAIT = 1.0
#: the longest :meth:`Heartbeat.stop` waits for a beat in flight (seconds)
STOP = 2 * STORE_WAIT + BEAT


class RankHangs(CollectiveError):
    """A rank whose heartbeat stopped (its process is stopped, or its interpreter held), or a
    store that takes no rank's beat (the process that serves it hangs)."""


def hang_seconds() -> float:
    """The hang limit: ``FENCHEL_HANG`` (seconds, > 0) where set, else ``HANG``."""
    return seconds_in_environment(HANG_VARIABLE, HANG)


def seconds_in_environment(variable: str, default: float) -> float:
    """The environment's ``variable`` as seconds (a number > 0, else a ``ValueError`` naming
    it and its value) where set, else ``default``."""
    text = os.environ.get(variable)
    if text is None:
        return default
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value > 0:
        raise ValueError(f"{variable} must be a number of seconds > 0, got {text!r}")
    return value


class Beats(Protocol):
    """Where the ranks' beats go, this process beating as ``rank``: ``stale()`` ->
    ``(rank, seconds)`` of each other rank whose last beat is older than its
    ``heartbeat.hang``; ``silent()``: what keeps this rank's heartbeat from landing though it
    tries (None: nothing, or the host stalled); and ``name(rank)`` for an error."""

    rank: int
    heartbeat: Heartbeat

    def stale(self) -> list[tuple[int, float]]: ...

    def silent(self) -> str | None: ...

    def name(self, r: int) -> str: ...


class Heartbeat:
    """A daemon thread that calls ``beat()`` now and every ``min(BEAT, hang / 4)`` seconds,
    until :meth:`stop`, or until ``beat``'s owner (a bound method's object) is dropped; a beat
    that fails (the store's connection) is tried again at the next. ``hang``: None,
    :func:`hang_seconds`. ``age()``: the seconds since this thread last beat; ``calling``:
    when the beat in flight began (None: none is); ``failed``: when a beat last failed. Every
    heartbeat still beating stops when the interpreter exits (``atexit``, before its
    teardown)."""

    def __init__(self, beat: Callable[[], None], rank: int, hang: float | None = None) -> None:
        self.hang = hang_seconds() if hang is None else float(hang)
        self.calling: float | None = None
        self.failed = float("-inf")
        beat()
        self.last = time.monotonic()
        self.stopped = threading.Event()
        self._thread = threading.Thread(
            target=_beating, args=(weakref.WeakMethod(beat), self, min(BEAT, self.hang / 4)),
            daemon=True, name=f"fenchel_cvx heartbeat of rank {rank}",
        )  # fmt: skip
        _stopped_at_exit(self)
        self._thread.start()

    def age(self) -> float:
        return time.monotonic() - self.last

    def stop(self) -> None:
        """Ends the thread: at once, or after the beat in flight (waiting for it ``STOP``
        seconds at most: a beat held by a stopped store outlives the wait)."""
        self.stopped.set()
        if self._thread is not threading.current_thread():
            self._thread.join(STOP)


def _beating(beat: weakref.WeakMethod, heart: Heartbeat, period: float) -> None:
    while not heart.stopped.wait(period):
        if (method := beat()) is None:
            return
        heart.calling = time.monotonic()
        try:
            method()
            heart.last = time.monotonic()
        except Exception:  # noqa: BLE001 - the next beat tries again; a rank that cannot
            heart.failed = time.monotonic()  # beat for ``hang`` seconds is named by the others
        finally:
            heart.calling = None
        del method


#: the heartbeats that beat, each stopped when the interpreter exits (``_stop_all``)
_HEARTS: weakref.WeakSet[Heartbeat] = weakref.WeakSet()


def _stopped_at_exit(heart: Heartbeat) -> None:
    """``heart`` stops when the interpreter exits: the hook is registered anew with each
    heartbeat, after every hook registered before it (``atexit`` runs the last one first)."""
    atexit.unregister(_stop_all)
    atexit.register(_stop_all)
    _HEARTS.add(heart)


def _stop_all() -> None:
    hearts = list(_HEARTS)
    for heart in hearts:
        heart.stopped.set()
    for heart in hearts:
        heart.stop()


def check(beats: Beats, where: str, among: Collection[int] | None = None) -> None:
    """Raises :class:`RankHangs` naming a rank (of ``among``; None: any) whose heartbeat is
    stale, or what keeps this rank's own from landing (``beats.silent()``), ``where`` (e.g.
    "during a collective of 2 ranks"). While this rank's own beat is stale too, no rank is
    named: the whole host stalled (a paused VM), not one rank."""
    if (silent := beats.silent()) is not None:
        raise RankHangs(f"rank {beats.rank}: {silent} {where}")
    if beats.heartbeat.age() > beats.heartbeat.hang / 2:  # (the host stalled)
        return
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
        now, ranks = time.monotonic_ns(), range(len(self.beats))
        on = [r for r in ranks if r != self.rank and self.pids[r] > 0 and self.beats[r] > 0]
        ages = [(r, (now - int(self.beats[r])) / 1e9) for r in on]
        return [(r, age) for r, age in ages if age > self.heartbeat.hang]

    def silent(self) -> None:
        """None: a beat into memory always lands."""

    def name(self, r: int) -> str:
        return f"rank {r}'s process ({int(self.pids[r])})"


class StoreBeats:
    """The ranks' beats in ``store`` (the process group's: ``torch.distributed``'s store, on
    every host), through a connection of this rank's own: each beat of rank ``rank`` of ``P``
    adds 1 to its key and reads the others' counts, timing each change on this rank's clock
    (the hosts' clocks may differ). :meth:`stale` reads those times alone: a look never waits
    for the store. A store that takes no beat of this rank for ``hang`` seconds while its
    heartbeat tries (a beat held in flight, or failing) is :meth:`silent` through a row of
    looks a beat long: its server hangs (under a ``tcp://`` or ``env://`` start without
    torchrun, it runs in rank 0's process); a stall of this process alone ends within a
    beat."""

    PREFIX = "fenchel_cvx/heartbeat/"

    def __init__(self, store: Any, P: int, rank: int, hang: float | None = None) -> None:
        self.rank = rank
        self._store = store.clone()
        self._store.set_timeout(timedelta(seconds=STORE_WAIT))
        self._others = [r for r in range(P) if r != rank]
        self._keys = [self.PREFIX + str(r) for r in self._others]
        self._seen: dict[int, tuple[bytes, float]] = {}  # (rank: its count, when it changed)
        self._suspect: float | None = None  # (the first look of a row to find it silent)
        self._looked = float("-inf")  # (the last look)
        self.heartbeat = Heartbeat(self._beat, rank, hang)

    def _beat(self) -> None:
        self._store.add(self.PREFIX + str(self.rank), 1)
        counts = self._store.multi_get(self._keys) if self._store.check(self._keys) else []
        now, seen = time.monotonic(), dict(self._seen)
        for r, count in zip(self._others, counts):
            if seen.get(r, (None,))[0] != count:
                seen[r] = (count, now)
        self._seen = seen  # (rebound whole: a look reads one beat's times)

    def stale(self) -> list[tuple[int, float]]:
        now = time.monotonic()
        ages = [(r, now - since) for r, (_, since) in self._seen.items()]
        return [(r, age) for r, age in ages if age > self.heartbeat.hang]

    def silent(self) -> str | None:
        heart, now = self.heartbeat, time.monotonic()
        held = heart.calling is not None and now - heart.calling > heart.hang / 2
        failing = now - heart.failed < heart.hang / 2
        looked, self._looked = self._looked, now
        if not ((held or failing) and heart.age() > heart.hang):
            self._suspect = None
            return None
        if self._suspect is None or now - looked > BEAT:  # (a row of looks, a beat apart)
            self._suspect = now
        if now - self._suspect < BEAT:
            return None
        return (
            f"the process group's store has taken no heartbeat of this rank for "
            f"{heart.age():.0f} s (the process that serves it hangs, or has ended)"
        )

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
