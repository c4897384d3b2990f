"""Thread pools of the native libraries, limited per library (through threadpoolctl).

A process that imports NumPy, SciPy and PyTorch holds several independent thread pools: NumPy's
OpenBLAS, SciPy's own OpenBLAS (a second copy, used by ``scipy.linalg``), PyTorch's OpenMP. Each
sizes itself to the CPU count, so on a 2-core machine two BLAS pools of 2 threads oversubscribe
the cores whenever their work overlaps; a fast-backend batch (the paper's Algorithm 2 on MNIST)
then runs 2-3x slower than with 1 thread each. ``limit_threads`` sets each pool separately:

    with limit_threads(2):                       # the measured plan for 2 cores (``plan``)
        ...
    with limit_threads({"numpy": 2, "scipy": 1}):   # explicit, per library
        ...

Libraries are named by the package that ships the shared object (``numpy``, ``scipy``,
``torch``; anything else is ``other``). A pool not named is left as it is.
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Iterator
from contextlib import AbstractContextManager
from pathlib import PurePath
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from threadpoolctl import ThreadpoolController

    from .backends import Backend

from .validation import COUNT, check

__all__ = [
    "LIBRARIES",
    "controller",
    "cores",
    "limit_threads",
    "owner",
    "per_library",
    "plan",
    "pools",
]

LIBRARIES = ("numpy", "scipy", "torch", "other")


def cores() -> int:
    """The cores this process may use (its CPU affinity where the system has one), at least 1.

    >>> cores() >= 1
    True
    """
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return os.cpu_count() or 1


@functools.lru_cache(maxsize=64)
def owner(filepath: str | None) -> str:
    """The package whose files hold the shared object at ``filepath`` (``"other"`` if none)."""
    for part in reversed(PurePath(filepath or "").parts[:-1]):
        for name in LIBRARIES[:-1]:
            if part == name or part.startswith(name + "."):  # numpy/, numpy.libs/, scipy.libs/
                return name
    return "other"


def plan(threads: int, compiled: bool = False) -> dict[str, int]:
    """The per-library thread counts for a budget of ``threads`` cores.

    NumPy's pool runs the large products (all of them, in the fast backend) and gets every core;
    SciPy's pool (the Cholesky factorisation behind the W-block preconditioner) gets one. On a
    2-core machine both pools at 2 threads made a 784-300-10 MNIST batch slower than both at 1,
    and NumPy at 2 with SciPy at 1 was the fastest while the machine was otherwise idle; on a
    loaded machine every pool at 1 was fastest by far (docs page "Results", "The compiled
    path"), so budgets beyond the idle cores hurt. PyTorch's pools (the backprop baselines) and
    any other get ``threads``.

    ``compiled``: the fast backend's fused kernels (``FastBackend(compile=True)``) run in
    PyTorch's OpenMP pool, between NumPy's products; they get one thread. With both pools at 2
    on 2 cores, each pool's threads spin, waiting for work, on the core the other needs: a
    LeNet-5 batch took 198 ms against 145 ms with the kernels on one thread and 161 ms eager
    (docs page "Results", "The compiled path").
    """
    threads = check("threads", threads, COUNT)
    return {"numpy": threads, "scipy": 1, "torch": 1 if compiled else threads, "other": threads}


def per_library(threads: int | dict[str, int]) -> dict[str, int]:
    """``{library: count}`` from an integer budget (``plan``) or a dict (checked)."""
    if isinstance(threads, dict):
        unknown = set(threads) - set(LIBRARIES)
        if unknown:
            raise ValueError(
                f"threads names unknown libraries {sorted(unknown)}; expected some of {LIBRARIES}"
            )
        return {name: check(f"threads[{name!r}]", n, COUNT) for name, n in threads.items()}
    return plan(threads)


def pools() -> list[tuple[str, str, int, str]]:
    """``[(library, internal_api, num_threads, filepath)]`` for every pool loaded now."""
    from threadpoolctl import threadpool_info

    return [
        (owner(i["filepath"]), i["internal_api"], i["num_threads"], i["filepath"])
        for i in threadpool_info()
    ]


def controller() -> ThreadpoolController:
    """A ``threadpoolctl.ThreadpoolController`` of the pools loaded now (scanning them costs
    time: callers that limit often, e.g. once per block solve, keep one)."""
    import scipy.linalg  # noqa: F401  (loads SciPy's own BLAS, so that its pool is seen too)
    from threadpoolctl import ThreadpoolController

    return ThreadpoolController()


@functools.cache
def scanned_pools() -> ThreadpoolController:
    """``controller()`` scanned once in this process: NumPy's and SciPy's pools, which are
    loaded before the scan, for :func:`one_blas_thread`, which limits them at every step of a
    solver; a pool loaded later (PyTorch's) is not in it."""
    return controller()


@contextlib.contextmanager
def limit_threads(
    threads: int | dict[str, int], pools_now: ThreadpoolController | None = None
) -> Iterator[dict[str, int]]:
    """Limit each native thread pool for the duration of the block.

    ``threads``: an integer budget of cores (the measured ``plan``) or a dict
    ``{library: count}`` over ``LIBRARIES``. ``pools_now``: a ``controller()`` to reuse.
    Yields the per-library counts applied; the original sizes are restored on exit.
    """
    per = per_library(threads)
    controller_ = pools_now if pools_now is not None else controller()
    limiters = []
    try:
        for lib in controller_.lib_controllers:
            n = per.get(owner(lib.filepath))
            if n is not None and lib.num_threads != n:  # a pool already at n: nothing to do
                limiters.append(controller_.select(filepath=lib.filepath).limit(limits=n))
        yield per
    finally:
        for limiter in reversed(limiters):
            limiter.restore_original_limits()


def one_blas_thread() -> AbstractContextManager[dict[str, int]]:
    """NumPy's and SciPy's BLAS on one thread for the block (``limit_threads``, on the pools
    scanned once: :func:`scanned_pools`): for loops of small factors and products, where
    OpenBLAS's second thread costs more than it brings (the oracle's dual pivots and its
    cross-entropy CG steps: docs page "The CVXPY oracle"), and for column shares that run a
    thread each (``column_threads``)."""
    return limit_threads({"numpy": 1, "scipy": 1}, scanned_pools())


def limit_for(backend: Backend) -> AbstractContextManager[object]:
    """``limit_threads(backend.threads)`` over a run, or nothing where the backend sets no
    budget (``threads=None``)."""
    if backend.threads is None:
        return contextlib.nullcontext()
    return limit_threads(backend.threads)
