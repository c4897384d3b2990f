"""Freed memory kept for reuse by the C library's allocator (glibc's ``mallopt``).

glibc serves an allocation above its mmap threshold with fresh pages from the kernel and unmaps
them when the array is freed; the threshold starts at 128 KiB and adapts upwards, and freed
memory at the top of its heap beyond the trim threshold goes back to the kernel too. A batch of
the fast backend on LeNet-5 allocates and frees arrays of megabytes many times (conv 0's output,
4,704 x 500 float32, is 9.4 MB; its patches 41 MB), so much of it is page-faulted and zeroed by
the kernel again and again: 15-20 % of the batch on a 2-core VM (docs page "Results", LeNet-5,
"Freed memory kept"). Dense networks (MNIST's 300 x 500 arrays) do not gain.

``keep_freed_memory()`` fixes the mmap threshold at glibc's largest (32 MiB on 64-bit systems:
larger arrays are still mapped afresh) and the trim threshold far above it, so that freed blocks
serve the next allocations. It changes the whole process, for good (glibc keeps no record of
the adaptive state to go back to), so the package calls it only in ``fenchel-cvx train`` and
``resume`` and in the two MNIST benchmarks' method processes. A script calls it once at its
start. Its True says that glibc took the settings; an allocator preloaded in glibc's place
(``LD_PRELOAD`` of jemalloc or tcmalloc) has its own policy and ignores them.
"""
import functools

__all__ = ["keep_freed_memory"]

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3      # glibc's <malloc.h>
MMAP_THRESHOLD = 32 * 2 ** 20                    # DEFAULT_MMAP_THRESHOLD_MAX, 64-bit
TRIM_THRESHOLD = 2 ** 30


@functools.lru_cache(maxsize=1)
def _mallopt():
    """glibc's ``mallopt`` in this process, or None (another C library: macOS, musl, Windows;
    or a Python without ctypes)."""
    try:
        import ctypes

        libc = ctypes.CDLL(None)
    except (ImportError, OSError, TypeError):   # TypeError: Windows has no process-wide handle
        return None
    gnu = getattr(libc, "gnu_get_libc_version", None)   # musl has a mallopt that does nothing
    return getattr(libc, "mallopt", None) if gnu is not None else None


def keep_freed_memory():
    """Keep freed memory for reuse (glibc only). Returns whether glibc took both settings.

    The trim threshold is set only once the mmap threshold is: a trim threshold set alone also
    stops the mmap threshold's adaptation, and every array above 128 KiB is then mapped afresh
    (LeNet-5's batch took twice as long, measured)."""
    mallopt = _mallopt()
    if mallopt is None:
        return False
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(
        mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))
