"""``HostMemory`` (``fast/host_memory.py``): the ranks of one host gathering bytes through a
shared segment. Ranks as threads of this process, each with its own mapping of one file: every
gather hands every rank's bytes, of any length up to the slot, in rank order, for hundreds of
gathers in a row (the two buffers alternate; a rank runs at most one gather ahead); a gather
past the slot is refused by name; a rank whose process ended is named, and one that never
comes is timed out. The gloo ranks' run on it is ``test_torch_comm.py``'s."""

import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from fenchel_cvx.fast import host_memory
from fenchel_cvx.fast.host_memory import HostMemory
from fenchel_cvx.reduce import CollectiveError


def message(rank, k):
    """Rank ``rank``'s bytes at its ``k``-th gather: a length that varies with both (0 too)."""
    n = (rank * 7919 + k * 104729) % 300
    return bytes((rank + k + i) % 256 for i in range(n))


def on_threads(path, P, gathers, slot=512):
    """``P`` ranks as threads, each with its own mapping, ``gathers`` gathers each: -> each
    rank's results, or the error it raised."""
    HostMemory(path, P, 0, slot, create=True)  # (the creator's mapping: rank 0 maps it again)
    results, errors = [None] * P, [None] * P

    def rank(r):
        try:
            host = HostMemory(path, P, r, slot, timeout=30)
            results[r] = [host.gather(message(r, k)) for k in range(gathers)]
        except BaseException as err:  # noqa: BLE001 - handed to the test
            errors[r] = err

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(P)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return results, errors


@pytest.mark.parametrize("P", [2, 3])
def test_every_rank_gathers_every_rank_s_bytes_in_rank_order(tmp_path, P):
    results, errors = on_threads(str(tmp_path / "segment"), P, gathers=300)
    assert errors == [None] * P
    for r in range(P):
        for k, got in enumerate(results[r]):
            assert got == [message(q, k) for q in range(P)], (r, k)


def test_a_gather_past_the_slot_is_refused_by_name(tmp_path):
    host = HostMemory(str(tmp_path / "segment"), 1, 0, slot=64, create=True)
    assert host.gather(b"x" * 64) == [b"x" * 64]
    with pytest.raises(ValueError, match="takes <= 64 bytes, got 65"):
        host.gather(b"x" * 65)


def ended_pid():
    """The id of a process that has ended (and been reaped)."""
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_a_rank_whose_process_ended_is_named(tmp_path):
    path = str(tmp_path / "segment")
    host = HostMemory(path, 2, 0, slot=64, create=True)
    HostMemory(path, 2, 1, slot=64).pids[1] = ended_pid()  # rank 1 attached, then its process ended
    with pytest.raises(CollectiveError, match=r"rank 0: rank 1's process \(\d+\) ended"):
        host.gather(b"figures")


def test_a_rank_that_never_comes_is_timed_out(tmp_path):
    path = str(tmp_path / "segment")
    host = HostMemory(path, 2, 0, slot=64, create=True, timeout=0.2)
    HostMemory(path, 2, 1, slot=64)  # rank 1 (this process: alive) never gathers
    with pytest.raises(CollectiveError, match=r"ranks \[1\] did not reach a collective of 2"):
        host.gather(b"figures")


def test_a_zombie_is_not_alive():
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    for _ in range(200):  # ended, not yet reaped by its parent (this process): a zombie
        if not host_memory._alive(p.pid):
            break
        time.sleep(0.01)
    assert not host_memory._alive(p.pid)
    p.wait()
    assert not host_memory._alive(p.pid) and host_memory._alive(os.getpid())


def test_a_segment_of_another_size_is_refused(tmp_path):
    path = str(tmp_path / "segment")
    HostMemory(path, 2, 0, slot=64, create=True)
    with pytest.raises(ValueError, match="expected"):
        HostMemory(path, 2, 1, slot=128)


#: rank 1 of a segment in a process of its own: attached (its heartbeat thread beating), then
#: its main thread busy in Python until the test ends it
RANK_1 = """
import sys
from fenchel_cvx.fast.host_memory import HostMemory
host = HostMemory(sys.argv[1], 2, 1, slot=64, hang=float(sys.argv[2]))
print("attached", flush=True)
while True:
    pass
"""


def rank_1_process(path, hang):
    """Rank 1 of the segment at ``path`` as a process (``RANK_1``), once it has attached."""
    p = subprocess.Popen(
        [sys.executable, "-c", RANK_1, path, str(hang)], stdout=subprocess.PIPE, text=True
    )
    assert p.stdout.readline().strip() == "attached"
    return p


def test_a_rank_whose_process_is_stopped_is_named_as_hung_within_hang_seconds(tmp_path):
    """Rank 1's process stopped (SIGSTOP): its heartbeat stops, and rank 0's gather names it
    as hung after ``hang`` seconds (1 s), not as late after the timeout (60 s)."""
    path = str(tmp_path / "segment")
    host = HostMemory(path, 2, 0, slot=64, create=True, timeout=60, hang=1.0)
    p = rank_1_process(path, hang=1.0)
    try:
        p.send_signal(signal.SIGSTOP)
        with pytest.raises(CollectiveError, match=rf"rank 1's process \({p.pid}\) hangs: no heart"):
            host.gather(b"figures")
    finally:
        p.kill()
        p.wait()


def test_a_rank_that_computes_beats_and_is_not_named_as_hung(tmp_path):
    """Rank 1's main thread busy in Python, never gathering: its heartbeat thread beats (its
    beat moves on while rank 0 waits), so rank 0 waits for it past ``hang`` until the timeout,
    which names it as late, not hung."""
    path = str(tmp_path / "segment")
    host = HostMemory(path, 2, 0, slot=64, create=True, timeout=8.0, hang=2.0)
    p = rank_1_process(path, hang=2.0)
    try:
        first = int(host.beats.beats[1])
        with pytest.raises(CollectiveError, match=r"ranks \[1\] did not reach .* within 8 s"):
            host.gather(b"figures")
        assert int(host.beats.beats[1]) > first
    finally:
        p.kill()
        p.wait()


@pytest.mark.parametrize("text", ["0", "-1", "abc", "nan", ""])
def test_a_hang_limit_that_is_not_a_positive_number_is_refused_by_name(tmp_path, monkeypatch, text):
    from fenchel_cvx.fast import heartbeat

    monkeypatch.setenv("FENCHEL_HANG", text)
    with pytest.raises(
        ValueError, match=rf"FENCHEL_HANG must be a number of seconds > 0, got '{text}'"
    ):
        HostMemory(str(tmp_path / "segment"), 1, 0, slot=64, create=True)
    monkeypatch.setenv("FENCHEL_HANG", "2.5")
    assert heartbeat.hang_seconds() == 2.5


def test_a_look_while_this_ranks_own_beat_is_stale_names_no_one():
    """The whole host stalled (a paused VM: every heartbeat thread late, this rank's too):
    a look then names no rank; once this rank beats again, a rank still silent is named."""
    import numpy as np

    from fenchel_cvx.fast.heartbeat import ClockBeats, RankHangs, check

    beats, pids = np.zeros(2, np.int64), np.array([os.getpid(), os.getpid()], np.int64)
    mine = ClockBeats(beats, pids, 0, hang=1.0)
    mine.heartbeat.stop()  # (its beat stays where this test puts it)
    beats[1] = time.monotonic_ns() - 10**10  # (rank 1's last beat: 10 s ago)
    mine.heartbeat.last = time.monotonic() - 10.0  # (and this rank's own)
    check(mine, "in this test")
    mine.heartbeat.last = time.monotonic()
    with pytest.raises(RankHangs, match=r"rank 0: rank 1's process \(\d+\) hangs"):
        check(mine, "in this test")
