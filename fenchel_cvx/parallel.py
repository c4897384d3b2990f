"""Training on P ranks: Algorithms 1 and 2 of the paper with every batch split over processes.

FLN's blocks split over data points (Sec. 4.5 of the paper: each X-block, eqs. (14)-(16), is a
problem per column; each W-block, eqs. (17)-(20), a sum over the columns). ``fit_bcd(comm=)``
trains on the ranks of a communicator (``reduce.py``): each rank takes its share of every
batch (``reduce.share``), the fast backend's solvers reduce every figure over the ranks, and
the driver's certificate is the whole batch's. This module starts the ranks:

- :func:`fit_on_ranks` runs ``fit_bcd`` on ``nproc`` processes of this machine (gloo on
  127.0.0.1): this process is rank 0 and returns its result, the others are spawned;
- :func:`comm_from_environment` joins the ranks that ``torchrun`` started (its environment
  variables ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``), across machines too.

Each rank runs ``threads`` threads (default: this machine's cores divided by the ranks).
Needs PyTorch (``torch.distributed``); the oracle backend runs on one process (it has Dask).
Docs page "Training in parallel".
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import socket
from datetime import timedelta
from typing import Any

from .validation import COUNT, check

__all__ = ["comm_from_environment", "fit_on_ranks", "threads_per_rank"]

#: how long a rank waits in one collective for the others before it stops with an error
TIMEOUT = timedelta(minutes=10)


def threads_per_rank(nproc: int) -> int:
    """This machine's cores (those this process may use) divided by the ranks, at least 1.

    >>> threads_per_rank(1) >= 1
    True
    """
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, (cores or 1) // check("nproc", nproc, COUNT))


def _torch_distributed():
    try:
        import torch.distributed as dist
    except ImportError:
        raise ValueError(
            "training on ranks needs PyTorch (torch.distributed): pip install torch"
        ) from None
    if not dist.is_available():
        raise ValueError("training on ranks needs a PyTorch built with torch.distributed")
    return dist


def comm_from_environment(backend: str = "gloo") -> Any:
    """The communicator of the ranks ``torchrun`` started (``WORLD_SIZE`` > 1 in the
    environment: the process group is initialised here, ``env://``), or None where this
    process runs alone. ``backend``: ``"gloo"`` (CPU) or ``"nccl"`` (one GPU a rank)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return None
    dist = _torch_distributed()
    if not dist.is_initialized():
        dist.init_process_group(backend, timeout=TIMEOUT)
    from .fast.torch_comm import TorchComm

    return TorchComm()


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


def _rank(rank, nproc, port, threads, shared_memory, args, kwargs):
    """One rank of :func:`fit_on_ranks` (its own process): join the group, train, leave."""
    from .bcd import fit_bcd
    from .fast.torch_comm import TorchComm
    from .threads import limit_threads

    dist = _torch_distributed()
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=nproc,
        timeout=TIMEOUT,
    )
    try:
        with limit_threads(threads):
            return fit_bcd(*args, comm=TorchComm(shared_memory=shared_memory), **kwargs)
    finally:
        dist.destroy_process_group()


@contextlib.contextmanager
def _thread_env(threads):
    """The environment a spawned rank starts with: its native pools at ``threads`` threads
    (OpenMP's, OpenBLAS's, MKL's), before it loads them."""
    names = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
    before = {k: os.environ.get(k) for k in names}
    os.environ.update({k: str(threads) for k in names})
    try:
        yield
    finally:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _stopped(procs, err):
    """Rank 0 stopped with ``err``: where a collective failed (``CollectiveError``: a rank's
    connection closed), the ranks whose processes ended are named (each given a moment to
    end); the others are stopped."""
    from .reduce import CollectiveError

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
        ) from err


def _child(*args):
    """A spawned rank: :func:`_rank`, then its process ends at once with its status (0, or 1
    after its error's traceback), without the interpreter's teardown, in which PyTorch's
    native threads (the process group's, the compiled kernels') may abort the process after
    its work is done."""
    import sys
    import traceback

    status = 0
    try:
        _rank(*args)
    except BaseException:  # noqa: BLE001 - printed, and the exit status says it
        traceback.print_exc()
        status = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


def fit_on_ranks(
    net, X0, Y, *, nproc: int, threads: int | None = None, shared_memory: bool = True,
    **kwargs: Any,
):  # fmt: skip
    """``fit_bcd(net, X0, Y, **kwargs)`` on ``nproc`` ranks of this machine: this process is
    rank 0 (it trains ``net`` in place, shows the progress bar, calls ``callback`` and writes
    the checkpoints) and ``nproc - 1`` processes are spawned, each with a copy of the network
    and all the data. -> rank 0's ``BCDResult``, which is the whole batch's (every rank
    computes the same weights; X is gathered). ``threads``: per rank (None:
    :func:`threads_per_rank`). ``shared_memory``: the ranks' small collectives through shared
    memory (``fast.host_memory``; False: every one through gloo). A script that calls it runs
    it under
    ``if __name__ == "__main__":`` (the ranks are spawned processes, which import it).

    A rank that fails stops the others: each collective waits at most ``TIMEOUT``, and an
    error names the rank whose process ended."""
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
    _torch_distributed()
    port = _free_port()
    theirs = {k: v for k, v in kwargs.items() if k not in ("callback", "progress")}
    ctx = multiprocessing.get_context("spawn")
    procs = [
        ctx.Process(
            target=_child,
            args=(r, nproc, port, threads, shared_memory, (net, X0, Y), theirs),  # (pickled)
            name=f"fenchel_cvx rank {r}",
            daemon=True,
        )
        for r in range(1, nproc)
    ]
    with _thread_env(threads):  # (each rank's pools sized at its start, as torchrun does)
        for p in procs:
            p.start()
    try:
        result = _rank(0, nproc, port, threads, shared_memory, (net, X0, Y), kwargs)
    except BaseException as err:
        _stopped(procs, err)
        raise
    for r, p in enumerate(procs, start=1):
        p.join()
        if p.exitcode != 0:
            raise RuntimeError(f"training on ranks: rank {r} exited with code {p.exitcode}")
    return result
