"""The process's heap: freed large arrays kept for reuse instead of handed back to the system.

glibc's malloc serves a request above its mmap threshold (dynamic, at most 32 MiB on 64-bit
Linux) with fresh pages from the kernel and returns them when the block is freed. Every NumPy
temporary of that size is then new memory, which the kernel zero-fills page by page as it is
first written: on the full-batch model of Figure 1 (Algorithm 1 on all of MNIST, 300 x 60,000
float32 arrays of 72 MB), an elementwise operation that makes a new array takes twice the time
of the same operation into an existing one. :func:`keep_freed_memory` raises both thresholds
(``mallopt``), so a freed block goes back to malloc's free lists and the next temporary of its
size reuses it, already mapped; and it gives the threads started after it the one heap, whose
thresholds hold for every block (a thread's own arena maps any block above 64 MiB afresh).

The setting is the process's, not an array's: the command line (every command) and the MNIST
benchmarks call it; a program of your own calls it once at its start; the ranks that
``parallel.Ranks`` spawns take it where the process that spawns them has it
(:func:`freed_memory_kept`). Where malloc is not glibc's (macOS, Windows, musl) it does nothing
and says so by returning False. The peak memory is the arrays held at once, as before; what
changes is that the process keeps its freed heap until it exits.
"""

import ctypes
import ctypes.util
import functools

__all__ = ["freed_memory_kept", "keep_freed_memory"]

#: ``mallopt``'s parameters (glibc's malloc.h)
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD, M_ARENA_MAX = -1, -3, -8
#: blocks up to this size come from the heap and return to it when freed
MMAP_THRESHOLD = 1 << 30


@functools.cache
def keep_freed_memory() -> bool:
    """Make malloc keep freed blocks up to 1 GiB for reuse (glibc), in every thread: True where
    it took the settings, False where the C library has no ``mallopt`` or refused them.

    The threads started after the call allocate from the one heap (``M_ARENA_MAX`` 1; an arena
    made before it stays in use, so call it first): a thread's own arena grows by heaps of at
    most 64 MiB and maps any larger block afresh, whatever the thresholds (the
    oracle's figures on two column shares of Figure 1's 300 x 60,000 arrays, ``column_threads``:
    1.15 s with an arena a thread, 0.21 s with the one heap, 0.38 s on one thread; the 2-core
    VM, 2026-12-04)."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError, TypeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    # trim only beyond twice the largest block kept (a freed block at the heap's top stays)
    return (
        bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD))
        and bool(mallopt(M_TRIM_THRESHOLD, 2 * MMAP_THRESHOLD - 1))
        and bool(mallopt(M_ARENA_MAX, 1))
    )


def freed_memory_kept() -> bool:
    """Whether this process keeps its freed memory (:func:`keep_freed_memory` called here and
    its settings taken)."""
    return keep_freed_memory.cache_info().currsize > 0 and keep_freed_memory()
