"""``memory.keep_freed_memory``: freed arrays serve the next allocations (glibc's mallopt)."""
import subprocess
import sys

import pytest

PROBE = """
import resource, numpy as np
from fenchel_cvx.memory import keep_freed_memory

def faults():   # page faults of allocating and freeing two 16 MB arrays, 20 times
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(20):
        a = np.ones(4_000_000, np.float32)
        b = a * 2
        del a, b
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before

faults()
plain = faults()
kept = keep_freed_memory()
faults()
print(plain, kept, faults())
"""


def test_freed_arrays_serve_the_next_ones():
    """In a fresh process (the setting is the whole process's, for good): before, every 16 MB
    array is faulted in afresh (1,100 faults an iteration here: the kernel maps several pages a
    fault); after, the freed blocks are reused."""
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                         timeout=120, check=True).stdout.split()
    plain, kept, after = int(out[0]), out[1] == "True", int(out[2])
    if not kept:
        pytest.skip("not glibc: mallopt is not there to take the settings")
    assert plain > 20 * 500, plain         # two arrays of ~3,900 pages, 20 times, mapped afresh
    assert after < plain / 20, (plain, after)


def test_it_can_be_called_again():
    """A second call takes the same settings again (in a fresh process: they are for good)."""
    out = subprocess.run([sys.executable, "-c", (
        "from fenchel_cvx.memory import _mallopt, keep_freed_memory as k; "
        "print(k(), k(), _mallopt() is not None)")], capture_output=True, text=True,
        timeout=120, check=True).stdout.split()
    assert out[0] == out[1] == out[2], out
