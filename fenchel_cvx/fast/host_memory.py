"""The ranks of one host, gathering bytes through shared memory: ``TorchComm``'s fast path.

A P-rank batch of FLN takes a few dozen collectives (``reduce.py``: the descent and stopping
tests of every solver step, each a few bytes). gloo carries each over TCP, through its I/O
threads: on a busy 2-core machine a collective of 8 bytes took 0.36 ms at the median, 1 ms on
average and 2-5 ms in one case in four (the I/O thread waits for a core), and LeNet-5's 52 a
batch cost 80 ms of a 180 ms batch (docs page "Training in parallel"). Ranks on one host can
share memory instead: :class:`HostMemory` is one segment of it, a slot per rank, and
:meth:`HostMemory.gather` hands every rank's bytes to every rank in some microseconds.

The protocol, for the k-th gather: each rank writes its length and bytes into its slot of
buffer ``k % 2``, then its counter ``k``; it waits until every counter reaches ``k`` and
reads the slots. A rank can be one gather ahead of the slowest (it writes the other buffer),
never two (it waits for every rank's k-th write, made after that rank read the (k-1)-th
buffer). Writes are plain stores, read in the order they were made on x86-64 (its memory model
keeps stores in order, and loads): :func:`join` takes this path there, on Linux, and nowhere
else (gloo then carries every collective).

A waiting rank yields its core at every look (``os.sched_yield``), then, after ``SPIN``
seconds, sleeps ``NAP`` between looks; every ``LOOK`` seconds it checks that the other ranks'
processes are alive, and stops with ``CollectiveError`` naming a rank whose process ended, one
that hangs, or one that has not written within ``timeout``.

**The heartbeat.** A thread of each rank writes the time (``time.monotonic_ns``, one clock for
every process of the host) into the rank's header line every second (``heartbeat.py``),
whatever its main thread does: a first batch's minute of compiling beats like any other. A
rank whose heartbeat is older than ``hang`` seconds (``heartbeat.hang_seconds``) hangs: its
process is stopped (SIGSTOP, a debugger), or something holds its interpreter. A rank waiting
here for it stops with ``heartbeat.RankHangs`` naming it within ``hang`` seconds, and so does
one waiting for it in a transfer of the process group (``torch_comm``: it looks at
``HostMemory.beats`` while the transfer runs).
"""

from __future__ import annotations

import mmap
import os
import platform
import secrets
import sys
import time
from collections.abc import Callable

import numpy as np

from ..reduce import CollectiveError
from .heartbeat import ClockBeats, check

__all__ = ["HostMemory", "join"]

#: the most bytes a rank's slot holds: a larger gather goes through gloo
SLOT = 1 << 20
#: the most shared memory a segment takes, all slots together
BUDGET = 64 << 20
#: a waiting rank's phases: yield its core for SPIN seconds, then sleep NAP between looks
SPIN, NAP = 0.01, 1e-4
#: how often a waiting rank checks that the others' processes are alive (seconds)
LOOK = 0.05
#: where the segments live (a memory file system on Linux)
FOLDER = "/dev/shm"
#: bytes of a rank's header line: its counter; then its process id and heartbeat; a cache
#: line each
LINE = 64
#: bytes of rank 0's offer of a segment (its token, then its path) and of the token
OFFER, TOKEN = 256, 16


class HostMemory:
    """A shared-memory segment of ``P`` ranks of one host (the file ``path``, created by the
    rank that passes ``create``); this process is rank ``rank``. ``slot``: the most bytes a
    rank gathers through it; ``timeout``: the longest a gather waits for a rank that beats;
    ``hang``: the age of a heartbeat past which its rank hangs (None:
    ``heartbeat.hang_seconds()``; module doc)."""

    def __init__(
        self, path: str, P: int, rank: int, slot: int = SLOT, create: bool = False,
        timeout: float = 600.0, hang: float | None = None,
    ) -> None:  # fmt: skip
        self.path, self.P, self.rank, self.slot, self.timeout = path, P, rank, slot, timeout
        size = self.size(P, slot)
        flags = os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0)
        fd = os.open(path, flags, 0o600)
        try:
            if create:
                os.ftruncate(fd, size)
            elif os.fstat(fd).st_size != size:
                raise ValueError(f"{path}: {os.fstat(fd).st_size} bytes, expected {size}")
            self.map = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        heads = np.frombuffer(self.map, np.int64, 2 * P * LINE // 8)
        self.counters, self.pids = (
            heads[: P * LINE // 8 : LINE // 8],
            heads[P * LINE // 8 :: LINE // 8],
        )
        self.pids[rank] = os.getpid()
        self.k = int(self.counters[rank])
        #: the ranks' heartbeats, each beside its process id (``heartbeat.py``)
        self.beats = ClockBeats(heads[P * LINE // 8 + 1 :: LINE // 8], self.pids, rank, hang)

    @staticmethod
    def size(P: int, slot: int) -> int:
        """The segment's bytes: the header lines, then two buffers of P slots."""
        return 2 * P * LINE + 2 * P * (LINE + slot)

    def gather(self, data: bytes) -> list[bytes]:
        """Every rank's ``data`` (at most ``slot`` bytes), in rank order."""
        if len(data) > self.slot:
            raise ValueError(
                f"a gather through host memory takes <= {self.slot} bytes, got {len(data)}"
            )
        k = self.k + 1
        at = self._at(k, self.rank)
        self.map[at : at + 8] = len(data).to_bytes(8, "little")
        self.map[at + LINE : at + LINE + len(data)] = data
        self.counters[self.rank] = k  # (after the bytes: the others read them once they see k)
        self._wait(k)
        out = []
        for r in range(self.P):
            at = self._at(k, r)
            n = int.from_bytes(self.map[at : at + 8], "little")
            out.append(self.map[at + LINE : at + LINE + n])
        self.k = k
        return out

    def _at(self, k: int, r: int) -> int:
        return 2 * self.P * LINE + ((k % 2) * self.P + r) * (LINE + self.slot)

    def _wait(self, k: int) -> None:
        """Until every rank's counter reaches ``k`` (module doc: yield, then nap, and look)."""
        counters, start = self.counters, time.monotonic()
        looked = start
        while int(counters.min()) < k:
            now = time.monotonic()
            if now - start < SPIN:
                os.sched_yield()
                continue
            time.sleep(NAP)
            if now - looked >= LOOK:
                looked = now
                self._check(k, now - start)

    def _check(self, k: int, waited: float) -> None:
        late = [r for r in range(self.P) if int(self.counters[r]) < k]
        for r in late:
            if not _alive(int(self.pids[r])):
                raise CollectiveError(
                    f"rank {self.rank}: {self.beats.name(r)} ended during a collective of "
                    f"{self.P} ranks"
                )
        check(self.beats, f"during a collective of {self.P} ranks", among=late)
        if waited > self.timeout:
            raise CollectiveError(
                f"rank {self.rank}: ranks {late} did not reach a collective of {self.P} ranks "
                f"within {self.timeout:g} s"
            )


def state(pid: int) -> bytes:
    """The state letter of process ``pid`` (Linux's ``/proc``: ``R`` running, ``S`` asleep,
    ``T`` stopped, ``Z`` a zombie, ...), ``b""`` where there is none."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return b""


def _alive(pid: int) -> bool:
    """Whether the process ``pid`` runs (not ended, not a zombie awaiting its parent)."""
    return state(pid) not in (b"", b"Z", b"X")


def supported() -> bool:
    """Whether this machine takes the shared-memory path (module doc): Linux on x86-64."""
    return (
        sys.platform.startswith("linux")
        and platform.machine().lower() in ("x86_64", "amd64")
        and os.path.isdir(FOLDER)
    )


def join(
    gather: Callable[[bytes], list[bytes]], P: int, rank: int, timeout: float = 600.0
) -> HostMemory | None:
    """The segment of ``P`` ranks (this one ``rank``) where all of them run on this host and
    may share memory; else None (every rank gets the same answer). ``gather``: an all-gather
    of equal-sized bytes between the ranks (gloo's). Rank 0 creates the segment and offers its
    path and a token written in it; every rank attaches and checks the token, then that it
    sees every other rank's process; then the file is removed (the ranks keep their
    mappings), so that a run that fails later leaves nothing behind. Three gathers."""
    slot = min(SLOT, BUDGET // (2 * P) - LINE)
    host = _create(P, slot, timeout) if rank == 0 and supported() else None
    offer = b"" if host is None else _token(host) + host.path.encode()
    offer = gather(offer.ljust(OFFER, b"\0"))[0]  # (rank 0's)
    if not offer.strip(b"\0"):
        return None
    token, path = offer[:TOKEN], offer[TOKEN:].rstrip(b"\0").decode()
    try:
        if rank:
            host = HostMemory(path, P, rank, slot, timeout=timeout)
        attached = host is not None and _token(host) == token
    except (OSError, ValueError):
        attached = False
    seen = _all(gather(bytes([attached])))
    if seen and host is not None:  # (every rank attached: its process id written)
        seen = all(_alive(int(pid)) for pid in host.pids)
    agreed = _all(gather(bytes([seen])))
    if rank == 0:
        os.unlink(path)
    return host if agreed else None


def _all(flags: list[bytes]) -> bool:
    return all(flag == b"\1" for flag in flags)


def _token(host: HostMemory) -> bytes:
    """The segment's last ``TOKEN`` bytes, where rank 0 writes a token that the others check."""
    return bytes(host.map[len(host.map) - TOKEN :])


def _create(P: int, slot: int, timeout: float) -> HostMemory | None:
    """Rank 0's segment, its token written (where the memory file system has room for it
    twice; else None)."""
    size = HostMemory.size(P, slot)
    stat = os.statvfs(FOLDER)
    if stat.f_bavail * stat.f_frsize < 2 * size:
        return None
    path = os.path.join(FOLDER, f"fenchel_cvx_{os.getpid()}_{secrets.token_hex(8)}")
    try:
        host = HostMemory(path, P, 0, slot, create=True, timeout=timeout)
    except OSError:
        return None
    host.map[size - TOKEN :] = secrets.token_bytes(TOKEN)
    return host
