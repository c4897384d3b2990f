"""Training on P ranks: Algorithms 1 and 2 of the paper with every batch split over processes.

FLN's blocks split over data points (Sec. 4.5 of the paper: each X-block, eqs. (14)-(16), is a
problem per column; each W-block, eqs. (17)-(20), a sum over the columns). ``fit_bcd(comm=)``
trains on the ranks of a communicator (``reduce.py``): each rank takes its share of every
batch (``reduce.share``), the fast backend's solvers reduce every figure over the ranks, and
the driver's certificate is the whole batch's. This module starts the ranks:

- :func:`fit_on_ranks` runs ``fit_bcd`` on ``nproc`` processes of this machine (gloo on
  127.0.0.1): this process is rank 0 and returns its result, the others are spawned;
  :class:`Ranks` keeps such processes for several runs (a warm-up, then the timed run);
- :func:`comm_from_environment` joins the ranks that ``torchrun`` started (its environment
  variables ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``), across machines too;
- :func:`one_rank_group` makes a process group of this process alone (gloo, or NCCL on a GPU),
  whose communicator takes every reduction through ``torch.distributed``: the collectives'
  own cost on one device, against ``comm=None``'s, which takes none.

Each rank runs ``threads`` threads (default: this machine's cores divided by the ranks).
Needs PyTorch (``torch.distributed``); the oracle backend runs on one process (it has Dask).
Docs page "Training in parallel".
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import math
import multiprocessing
import os
import signal
import socket
import sys
import threading
import time
from datetime import timedelta
from typing import Any

from .threads import cores
from .validation import COUNT, check

__all__ = [
    "Ranks",
    "comm_from_environment",
    "fit_on_ranks",
    "one_rank_group",
    "ranks_for",
    "threads_per_rank",
]

#: how long a rank waits in one collective for the others before it stops with an error
TIMEOUT = timedelta(minutes=10)
#: how long a rank tries to reach the ranks' rendezvous (the store at MASTER_ADDR:MASTER_PORT),
#: in seconds, where ``FENCHEL_RENDEZVOUS`` is unset
RENDEZVOUS = 120.0
#: the environment variable that sets how long a rank tries to reach the rendezvous
RENDEZVOUS_VARIABLE = "FENCHEL_RENDEZVOUS"
#: torchrun's variable: "True" where its agent serves the store (every rank connects to it)
AGENT_STORE = "TORCHELASTIC_USE_AGENT_STORE"
#: how often rank 0 of ``Ranks`` looks at the spawned ranks while it waits for them (seconds)
LOOK = 0.05
#: how long rank 0 waits for a spawned rank's process to end once its pipe has closed (seconds)
STOP = 5.0


def threads_per_rank(nproc: int) -> int:
    """This machine's cores (those this process may use) divided by the ranks, at least 1.

    >>> threads_per_rank(1) >= 1
    True
    """
    return max(1, cores() // check("nproc", nproc, COUNT))


#: what a run on ranks is told where PyTorch is missing
NO_TORCH = "training on ranks needs PyTorch (torch.distributed): pip install torch"


def _torch_distributed():
    try:
        import torch.distributed as dist
    except ImportError:
        raise ValueError(NO_TORCH) from None
    if not dist.is_available():
        raise ValueError("training on ranks needs a PyTorch built with torch.distributed")
    return dist


def comm_from_environment(backend: str = "gloo") -> Any:
    """The communicator of the ranks ``torchrun`` started (``WORLD_SIZE`` > 1 in the
    environment: the process group is initialised here, ``env://``), or None where this
    process runs alone. ``backend``: ``"gloo"`` (CPU) or ``"nccl"`` (one GPU a rank). A rank
    that connects to the group's store (every rank but 0; each where torchrun's agent serves
    it, ``TORCHELASTIC_USE_AGENT_STORE`` "True") and cannot reach it at
    ``MASTER_ADDR:MASTER_PORT`` within ``FENCHEL_RENDEZVOUS`` seconds (``RENDEZVOUS`` where
    unset) stops with an error naming the address, before any work."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return None
    dist = _torch_distributed()
    if not dist.is_initialized():
        if os.environ.get("RANK", "0") != "0" or os.environ.get(AGENT_STORE) == "True":
            _reachable(os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT"))
        dist.init_process_group(backend, timeout=TIMEOUT)
    from .fast.torch_comm import TorchComm

    return TorchComm()


#: the backends of a process group of one rank (``one_rank_group``)
GROUP_BACKENDS = ("gloo", "nccl")


@contextlib.contextmanager
def one_rank_group(backend: str = "gloo"):
    """A context manager: a ``torch.distributed`` process group of this process alone (rank 0
    of 1) on ``backend`` (``"gloo"``, host buffers; ``"nccl"``, buffers on the current CUDA
    device), and its ``TorchComm``; the group is destroyed on exit. ``fit_bcd(comm=...)``
    through it trains as with ``comm=None`` (one rank holds every column), but every
    reduction is a collective of the group.

    >>> with one_rank_group("gloo") as comm:  # doctest: +SKIP
    ...     result = fit_bcd(net, X, Y, backend="fast", comm=comm)
    """
    if backend not in GROUP_BACKENDS:
        raise ValueError(f"backend must be one of {GROUP_BACKENDS}, got {backend!r}")
    dist = _torch_distributed()
    if dist.is_initialized():
        raise ValueError(
            f"one_rank_group makes its own process group, but one is initialised already "
            f"({dist.get_backend()}, {dist.get_world_size()} ranks)"
        )
    if backend == "nccl":
        import torch

        if not (dist.is_nccl_available() and torch.cuda.is_available()):
            raise ValueError(
                "backend 'nccl' needs a PyTorch built with NCCL and a CUDA GPU, got "
                f"NCCL {'available' if dist.is_nccl_available() else 'unavailable'}, "
                f"{torch.cuda.device_count()} CUDA device(s)"
            )
    from .fast.torch_comm import TorchComm

    # (a store in this process: a group of one rank needs no rendezvous, nor a port)
    dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1, timeout=TIMEOUT)
    try:
        yield TorchComm()
    finally:
        dist.destroy_process_group()


def _reachable(addr: str | None, port: str | None) -> None:
    """Until ``addr:port`` (the store's address, from the environment) accepts a connection,
    within ``FENCHEL_RENDEZVOUS`` seconds (``RENDEZVOUS`` where unset: rank 0, or its host's
    name, may come later than this rank); else a ``ValueError`` naming it."""
    from .fast.heartbeat import seconds_in_environment

    where = f"MASTER_ADDR={addr!r}, MASTER_PORT={port!r}"
    number = int(port) if port is not None and port.isdigit() else 0
    if not addr or not 0 < number < 65536:
        raise ValueError(f"the ranks' rendezvous needs MASTER_ADDR and a port, got {where}")
    seconds = seconds_in_environment(RENDEZVOUS_VARIABLE, RENDEZVOUS)
    deadline = time.monotonic() + seconds
    while True:
        try:
            with socket.create_connection((addr, number), timeout=1.0):
                return
        except OSError as err:  # (refused, no such name yet, no route: each may pass)
            if time.monotonic() > deadline:
                raise ValueError(
                    f"the ranks' rendezvous cannot be reached at {where} within {seconds:g} s "
                    f"({err}): rank 0 serves it (torchrun: its agent); start it, or name its "
                    f"address ({RENDEZVOUS_VARIABLE}: how long a rank tries)"
                ) from err
            time.sleep(10 * LOOK)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _refused(kwargs: dict) -> None:
    """What ``fit_bcd`` refuses on ranks, refused here before any process starts."""
    backend = kwargs.get("backend", "cvxpy")
    if isinstance(backend, str) and backend != "fast":
        raise ValueError(
            f"fit_on_ranks needs backend='fast' (or a backend object that trains on ranks), got "
            f"backend={backend!r}"
            + (
                " (the oracle runs its blocks on Dask workers instead)"
                if backend == "cvxpy"
                else ""
            )
        )


def _join(rank, nproc, port, shared_memory):
    """This process as rank ``rank`` of the group on 127.0.0.1: its communicator."""
    from .fast.torch_comm import TorchComm

    dist = _torch_distributed()
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=nproc,
        timeout=TIMEOUT,
    )
    return TorchComm(shared_memory=shared_memory)


def _work(comm, threads, fn, args, kwargs):
    """``fn(*args, comm=comm, **kwargs)`` on this rank, its native pools at ``threads``."""
    from .threads import limit_threads

    with limit_threads(threads):
        return fn(*args, comm=comm, **kwargs)


def _fit_on_copies(*args: Any, comm: Any, **kwargs: Any):
    """``fit_bcd`` on a rank of :meth:`Ranks.fit`, whose arguments are rank 0's, copied to it
    (``comm.on_copies()``: the ranks agree on the settings and weights, and hold the same data
    by construction)."""
    from .bcd import fit_bcd

    return fit_bcd(*args, comm=comm.on_copies(), **kwargs)


@contextlib.contextmanager
def _thread_env(threads):
    """The environment a spawned rank starts with: its native pools at ``threads`` threads
    (OpenMP's, OpenBLAS's, MKL's), before it loads them, and PyTorch's kernel compiler in the
    rank's own process (a pool of compile workers would outlive the rank's immediate exit)."""
    values = dict.fromkeys(("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"), threads)
    values["TORCHINDUCTOR_COMPILE_THREADS"] = 1
    before = {k: os.environ.get(k) for k in values}
    os.environ.update({k: str(v) for k, v in values.items()})
    try:
        yield
    finally:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _stopped(procs, err):
    """Rank 0 stopped with ``err``: a rank that hangs (``heartbeat.RankHangs``) is ended at
    once (SIGKILL: it is stopped, or its interpreter held) and ``err`` stands; where a
    collective failed otherwise (``CollectiveError``: a rank's connection closed, or its
    process ended while the others waited in shared memory), the ranks whose processes ended
    are named (each given a moment to end), after rank 0's own error; the others are
    stopped."""
    from .fast.heartbeat import RankHangs
    from .reduce import CollectiveError

    if isinstance(err, RankHangs):
        for p in procs:
            p.kill()
        return
    lost = isinstance(err, CollectiveError)
    for p in procs:
        if lost:
            p.join(timeout=5)  # (a rank killed a moment ago: its exit code)
        if p.is_alive():
            p.terminate()
    dead = [(r, p.exitcode) for r, p in enumerate(procs, start=1) if p.exitcode not in (None, 0)]
    if lost and dead:
        raise RuntimeError(
            "training on ranks stopped: "
            + ", ".join(f"rank {r} exited with code {code}" for r, code in dead)
            + f" ({err})"
        ) from err


def _beats(slots, rank):
    """Rank ``rank``'s heartbeat in ``slots`` (``Ranks``' shared int64s: the ranks' beats, then
    their process ids), its process id written: a ``heartbeat.ClockBeats``."""
    import numpy as np

    from .fast.heartbeat import ClockBeats

    both = np.frombuffer(slots, np.int64)
    beats, pids = both[: len(both) // 2], both[len(both) // 2 :]
    pids[rank] = os.getpid()
    return ClockBeats(beats, pids, rank)


def _on_a_thread(look, fn, *args):
    """``fn(*args)`` on a thread of its own while this thread calls ``look()`` every ``LOOK``
    seconds until it ends: -> ``(True, its result)`` or ``(False, its error)``. A look that
    raises stops the wait, and the thread is left to it."""
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
    return out[0]


def _rank_0_lives(parent: int) -> None:
    """Raises where rank 0's process (``parent``, which spawned this one) has ended."""
    if os.getppid() != parent:
        raise RuntimeError(f"rank 0 (process {parent}) ended before the ranks joined")


def _child(rank, nproc, port, threads, shared_memory, heap, slots, conn, parent):
    """A spawned rank: leaves Ctrl-C to rank 0 (a terminal's SIGINT reaches every process of the
    command: rank 0 stops the run, and ends this rank, at its own pace), beats in ``slots``
    from its start (``_beats``), keeps its freed memory where rank 0 does (``heap``:
    ``heap.py``, so that the ranks' temporaries cost alike), joins the group (and ends where
    rank 0's process, ``parent``, ends first: a rank 0 killed while it prepared its run), then
    runs each ``(fn, args, kwargs)`` that rank 0 sends (:meth:`Ranks.run`), answering
    ``"done"``, until None; then its process ends at once with its status (0, or 1 after its
    error's traceback: the group is then broken), without the interpreter's teardown, in which
    PyTorch's native threads (the process group's, the compiled kernels') may abort the process
    after its work is done."""
    import traceback

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    status = 0
    try:
        beats = _beats(slots, rank)  # noqa: F841 - it beats while it is referenced
        if heap:
            from .heap import keep_freed_memory

            keep_freed_memory()
        from .rank_arrays import incoming

        _torch_distributed()  # (the imports: most of a rank's start)
        conn.send("joining")
        joined, comm = _on_a_thread(
            lambda: _rank_0_lives(parent), _join, rank, nproc, port, shared_memory
        )
        if not joined:
            raise comm
        while (work := conn.recv()) is not None:
            fn, args, kwargs = work
            _work(comm, threads, fn, *incoming(args, kwargs))  # (the large arrays mapped)
            conn.send("done")
    except BaseException:  # noqa: BLE001 - printed, and the exit status says it
        traceback.print_exc()
        status = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


class Ranks:
    """``nproc`` ranks of this machine, kept for several runs: this process is rank 0 and
    ``nproc - 1`` processes are spawned at once, each joining the group (gloo on 127.0.0.1)
    and waiting for work. :meth:`fit` trains on all of them (:meth:`run`: any function of the
    ranks' communicator); a context manager (or
    :meth:`close`) ends them. ``threads``: per rank (None: :func:`threads_per_rank`);
    ``shared_memory``: the ranks' small collectives through shared memory
    (``fast.host_memory``; False: every one through gloo); ``join=False``: return once the
    ranks are spawned, so that this process prepares the run (its data, its network) while they
    start, and join them in the first :meth:`run` (or :meth:`join`). A script that makes it does
    so under ``if __name__ == "__main__":`` (the ranks are spawned processes, which import it).

    Each rank sets up once (its process, PyTorch, the process group) and compiles its kernels
    in its first run: a second :meth:`fit` starts at once (a warm-up run, then the timed one).
    A rank that fails stops the others and ends the ranks: the error names the rank whose
    process ended, or that hangs (``fast.heartbeat``: its heartbeat ``FENCHEL_HANG`` seconds
    old, 30 where unset); a collective waits at most ``TIMEOUT`` for a rank that runs."""

    def __init__(
        self, nproc: int, threads: int | None = None, shared_memory: bool = True, join: bool = True
    ) -> None:
        self.nproc = check("nproc", nproc, COUNT)
        self.threads = (
            threads_per_rank(self.nproc) if threads is None else check("threads", threads, COUNT)
        )
        if self.nproc < 2:
            raise ValueError(f"Ranks needs nproc >= 2 (one process: fit_bcd), got {nproc}")
        if importlib.util.find_spec("torch") is None:  # (imported as the ranks join)
            raise ValueError(NO_TORCH)
        from .heap import freed_memory_kept

        port, ctx = _free_port(), multiprocessing.get_context("spawn")
        heap = freed_memory_kept()
        slots = ctx.RawArray("q", 2 * self.nproc)  # (the ranks' heartbeats: ``_beats``)
        self.beats = _beats(slots, 0)
        self.conns, self.procs = [], []
        self.comm: Any = None  # (this rank's communicator, once the ranks have joined)
        self._joining: Any = (self.nproc, port, shared_memory)  # (None: joined, or ended)
        self._in_group = False  # (whether this process has joined, or tried to join, the group)
        self._stopped_since: dict[int, float] = {}  # (ranks not yet beating, seen stopped)
        with _thread_env(self.threads):  # (each rank's pools sized at its start, as torchrun)
            for r in range(1, self.nproc):
                mine, theirs = ctx.Pipe()
                proc = ctx.Process(
                    target=functools.partial(_child, parent=os.getpid()),
                    args=(r, self.nproc, port, self.threads, shared_memory, heap, slots, theirs),
                    name=f"fenchel_cvx rank {r}",
                    daemon=True,
                )
                proc.start()
                self.beats.pids[r] = proc.pid
                theirs.close()  # (the rank's copy is the only one: its end is EOF here)
                self.conns.append(mine)
                self.procs.append(proc)
        if join:
            self.join()

    def join(self) -> Ranks:
        """Until every spawned rank has joined the group with this process (at once where they
        have): -> self. A rank whose process ends or hangs first is named, and the ranks end;
        ranks that have ended refuse by name."""
        if self._joining is None:
            if self.comm is None:
                raise ValueError("these ranks have ended (close, or a failed run): make new Ranks")
            return self
        try:
            _torch_distributed()  # (imported here, while the spawned ranks import it too)
            self._started()
            self._in_group = True
            self.comm = self._watched("while joining the others", _join, 0, *self._joining)
        except BaseException as err:
            self._end(err)
            raise
        self._joining = None
        return self

    def _look(self, where: str) -> None:
        """Raises naming a spawned rank whose process ended, or that hangs ``where`` (e.g.
        "before joining the others"): its heartbeat stale (``fast.heartbeat``), or, before its
        first beat (its process starting), its process stopped for as long."""
        from .fast.heartbeat import RankHangs, check
        from .fast.host_memory import state

        for r, proc in enumerate(self.procs, start=1):
            if not proc.is_alive():
                proc.join(STOP)
                raise RuntimeError(
                    f"training on ranks: rank {r} exited with code {proc.exitcode} {where}"
                )
        check(self.beats, where)
        now = time.monotonic()
        for r, proc in enumerate(self.procs, start=1):
            if self.beats.beats[r] == 0 and state(proc.pid or 0) in (b"T", b"t"):
                since = self._stopped_since.setdefault(r, now)
                if now - since > self.beats.heartbeat.hang:
                    raise RankHangs(
                        f"rank 0: {self.beats.name(r)} hangs: stopped for "
                        f"{now - since:.0f} s {where}"
                    )
            else:
                self._stopped_since.pop(r, None)

    def _watched(self, where: str, fn, *args: Any):
        """``fn(*args)`` on a thread of its own while this thread looks at the spawned ranks
        every ``LOOK`` seconds (``_look``): -> its result, or its error. For a wait that cannot look
        itself (the group's rendezvous, a write to a pipe that a stopped rank no longer
        reads); where a look raises, the thread is left to its wait (the rendezvous's
        ``TIMEOUT``, or the pipe's end when the rank is ended)."""
        ok, value = _on_a_thread(lambda: self._look(where), fn, *args)
        if not ok:
            if isinstance(value, ConnectionError):  # (a pipe whose rank's process ended)
                self._ended(where, value)
            raise value
        return value

    def _ended(self, where: str, err: BaseException) -> None:
        """After ``err``, a pipe's write or read that failed as a spawned rank's process ended:
        raises naming the rank (``_look``, once a rank's process has ended, within ``STOP``
        seconds), from ``err``; returns where none has, and the caller raises ``err``."""
        deadline = time.monotonic() + STOP
        while all(p.is_alive() for p in self.procs) and time.monotonic() < deadline:
            time.sleep(LOOK)
        try:
            self._look(where)
        except BaseException as named:  # noqa: BLE001 - raised, from the pipe's error
            raise named from err

    def _started(self) -> None:
        """Until every spawned rank is about to join the group (its imports done, within
        ``TIMEOUT``); a rank whose process ends or hangs before is named (the group's
        rendezvous would wait for it until ``TIMEOUT``)."""
        deadline = time.monotonic() + TIMEOUT.total_seconds()
        for r in range(1, self.nproc):
            self._answer(r, "before joining the others", deadline)

    def _answer(self, r: int, where: str, deadline: float = math.inf) -> Any:
        """Rank ``r``'s next message, while this process looks at the spawned ranks
        (``_look``: a rank that ends or hangs first is named ``where``)."""
        conn = self.conns[r - 1]
        while not conn.poll(LOOK):
            self._look(where)
            if time.monotonic() > deadline:
                raise RuntimeError(f"training on ranks: rank {r} did not answer {where}")
        try:
            return conn.recv()
        except (EOFError, ConnectionError) as err:  # (its process ends: its end of the pipe closed)
            self._ended(where, err)
            raise

    def fit(self, net, X0, Y, **kwargs: Any):
        """``fit_bcd(net, X0, Y, **kwargs)`` on every rank: rank 0 (this process) trains
        ``net`` in place, shows the progress bar, calls ``callback`` and writes the
        checkpoints; each other rank trains a copy of the network and all the data (pickled
        to it). -> rank 0's ``BCDResult``, which is the whole batch's (every rank computes the
        same weights; X is gathered)."""
        _refused(kwargs)
        return self.run(_fit_on_copies, net, X0, Y, **kwargs)

    def run(self, fn, *args: Any, **kwargs: Any):
        """``fn(*args, comm=comm, **kwargs)`` on every rank, ``comm`` the rank's communicator
        (``fast.torch_comm.TorchComm``, whose ``group`` is the process group): rank 0 in this
        process, the others on copies of the arguments (pickled to them, a NumPy array of 1 MB
        or more through a file in shared memory: ``rank_arrays``; ``fn`` is a module-level
        function, pickled by name). ``callback`` and ``progress`` stay with rank 0.
        -> rank 0's result. :meth:`fit` runs ``fit_bcd`` through it;
        ``run(baselines.train_backprop, ...)`` trains under PyTorch DDP (docs page "Training
        in parallel")."""
        if kwargs.get("comm") is not None:
            raise ValueError("Ranks gives each rank its comm: do not pass comm")
        self.join()
        from .rank_arrays import discard, outgoing

        theirs = {k: v for k, v in kwargs.items() if k not in ("callback", "progress")}
        sent, theirs, paths = outgoing(args, theirs)  # (the data through shared memory)
        try:
            for conn in self.conns:  # (a pipe's write waits while its rank does not read)
                self._watched("as it took its work", conn.send, (fn, sent, theirs))
            result = _work(self.comm, self.threads, fn, args, kwargs)
            for r in range(1, self.nproc):
                if self._answer(r, "before it finished the run") != "done":
                    raise RuntimeError(f"training on ranks: rank {r} answered out of turn")
        except BaseException as err:
            self._end(err)
            raise
        finally:
            discard(paths)
        return result

    def close(self) -> None:
        """Ends the ranks (each spawned process exits; the group is left); a rank that ends
        with an error, or hangs instead of ending, is named."""
        from .fast.heartbeat import check

        if self.comm is None:  # (never joined: its spawned ranks are stopped; or ended)
            self._end(None)
            return
        try:
            for conn in self.conns:  # (a rank whose process ended since its last answer: named)
                self._watched("as it ended", conn.send, None)
            for proc in self.procs:
                while proc.is_alive():
                    proc.join(LOOK)
                    alive = [r for r, p in enumerate(self.procs, start=1) if p.is_alive()]
                    check(self.beats, "as it ended", among=alive)
            for r, proc in enumerate(self.procs, start=1):
                if proc.exitcode != 0:
                    raise RuntimeError(
                        f"training on ranks: rank {r} exited with code {proc.exitcode} as it ended"
                    )
        except BaseException as err:
            self._end(err)
            raise
        self._end(None)

    def _end(self, err) -> None:
        """The ranks stop: after ``err`` (rank 0's), the ranks whose processes ended are named
        (``_stopped``); the others are stopped; this process leaves the group. Ranks that
        have ended end again as they are."""
        comm, self.comm, self._joining = self.comm, None, None
        in_group, self._in_group = self._in_group, False
        try:
            if err is not None:
                _stopped(self.procs, err)
        finally:
            for proc in self.procs:
                if proc.is_alive():
                    proc.terminate()
                    proc.join(timeout=5)
                if proc.is_alive():  # (SIGTERM caught or ignored: the process must not outlive us)
                    proc.kill()
                    proc.join()
            if comm is not None:
                comm.close()
            dist = _torch_distributed() if in_group else None
            if dist is not None and dist.is_initialized():
                dist.destroy_process_group()

    def __enter__(self) -> Ranks:
        return self

    def __exit__(self, kind, err, tb) -> None:
        if err is None:
            self.close()
        else:
            self._end(None)


def ranks_for(nproc: int, threads: int | None = None) -> Any:
    """A context manager: :class:`Ranks` of ``nproc`` processes (``threads`` each), or, for
    ``nproc=1``, a null context that gives None (the caller trains in its own process).

    >>> with ranks_for(1) as ranks:
    ...     print(ranks)
    None
    """
    if check("nproc", nproc, COUNT) == 1:
        return contextlib.nullcontext()
    return Ranks(nproc, threads)


def fit_on_ranks(
    net, X0, Y, *, nproc: int, threads: int | None = None, shared_memory: bool = True,
    **kwargs: Any,
):  # fmt: skip
    """``fit_bcd(net, X0, Y, **kwargs)`` on ``nproc`` ranks of this machine, started for this
    run and ended after it (:class:`Ranks`: this process is rank 0, trains ``net`` in place
    and returns the whole batch's ``BCDResult``; ``threads`` and ``shared_memory`` are its).
    ``nproc=1``: ``fit_bcd`` in this process, any backend. A script that calls it runs it
    under ``if __name__ == "__main__":`` (the ranks are spawned processes, which import it)."""
    nproc = check("nproc", nproc, COUNT)
    threads = threads_per_rank(nproc) if threads is None else check("threads", threads, COUNT)
    if kwargs.get("comm") is not None:
        raise ValueError("fit_on_ranks makes each rank's comm itself: do not pass comm")
    if nproc == 1:
        from .bcd import fit_bcd
        from .threads import limit_threads

        with limit_threads(threads):
            return fit_bcd(net, X0, Y, **kwargs)
    _refused(kwargs)
    with Ranks(nproc, threads, shared_memory) as ranks:
        return ranks.fit(net, X0, Y, **kwargs)
