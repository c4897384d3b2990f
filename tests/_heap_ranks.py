"""Two ranks' heaps (``test_heap.py``), run as a script: ``python tests/_heap_ranks.py MODE``,
``MODE`` ``kept`` (this process calls ``keep_freed_memory`` first) or ``system``. Prints, for
rank 0 and the spawned rank 1, the bytes its resident set fell by when it freed a 64 MiB array
(about 0 where freed memory is kept)."""

import json
import os
import sys

import numpy as np


def freed_bytes(comm):
    """This rank's fall of its resident set on freeing a 64 MiB array, gathered from every
    rank (in rank order)."""
    page = os.sysconf("SC_PAGE_SIZE")

    def resident():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * page

    a = np.ones(2**24, np.float32)  # every page written
    before = resident()
    del a
    fell = np.array([before - resident()], np.int64)
    return [int(part[0]) for part in comm.all_gather(fell)]


if __name__ == "__main__":
    from fenchel_cvx.heap import keep_freed_memory
    from fenchel_cvx.parallel import Ranks

    took = keep_freed_memory() if sys.argv[1] == "kept" else False
    with Ranks(2, threads=1) as ranks:
        print(json.dumps(dict(took=took, fell=ranks.run(freed_bytes))))
