"""The median time of a call, the figure the kernel benchmarks print."""

import time

import numpy as np


def median_ms(fn, repeats, warm=True):
    """The median of ``repeats`` calls of ``fn`` in milliseconds, after one call (``warm``)
    that fills caches and compiles kernels."""
    if warm:
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1e3 * float(np.median(times))
