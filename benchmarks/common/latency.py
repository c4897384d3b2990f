"""The latency of a reduction on P ranks of this machine: the table the cost model reads.

``latency_tables(P)`` starts P processes (one thread each, gloo on 127.0.0.1), each of which
runs ``TorchComm.reduce`` of one float32 array of each of ``SIZES`` bytes, 200 times (``times``)
after 5 to warm up, through shared memory where it holds the bytes, then the same through gloo
alone: two tables from one process group. The mean, tails included, is what a batch pays for
each of its collectives. ``latency`` interpolates a table (linear in bytes). Used by
``parallel_model.py``; each rank is this file run as a script.
"""

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

#: the message sizes of the latency table, bytes (1 MB - 1 KB: the largest through host memory's
#: slot; 1 MB and more: through gloo)
SIZES = (8, 1 << 10, 1 << 14, 1 << 17, 1 << 19, (1 << 20) - (1 << 10), 1 << 20, 1 << 22)


def latency_rank(rank, P, port, repeats=200):
    """One rank of the tables: the mean seconds of a reduction of each of ``SIZES``, through
    shared memory and through gloo alone; rank 0 prints them as JSON."""
    from datetime import timedelta

    import torch.distributed as dist

    from fenchel_cvx.fast.torch_comm import TorchComm
    from fenchel_cvx.heap import keep_freed_memory

    keep_freed_memory()  # as the ranks of a run (``parallel.Ranks``): buffers reuse the heap

    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=P,
        timeout=timedelta(seconds=120),
    )  # fmt: skip
    tables = {}
    for via in ("shared memory", "gloo alone"):
        comm, table = TorchComm(shared_memory=via == "shared memory"), {}
        for size in SIZES:
            a = np.ones(max(1, size // 4), np.float32)
            times = []
            for k in range(5 + repeats):
                t0 = time.perf_counter()
                comm.reduce([a], "sum")
                if k >= 5:
                    times.append(time.perf_counter() - t0)
            table[size] = statistics.mean(times)
        comm.close()
        tables[via] = table
    dist.destroy_process_group()
    if rank == 0:
        print(json.dumps(tables), flush=True)


def latency_tables(P, times=200):
    """``(shared, gloo)``: each ``{bytes: seconds}``, the mean of ``times`` reductions on P ranks
    of this machine (a process each), through shared memory where it holds the bytes, and
    through gloo alone."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, __file__, "--ranks", str(P), "--port", str(port), "--times", str(times)]
    procs = [
        subprocess.Popen(
            [*cmd, "--rank", str(r)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        for r in range(P)
    ]
    outs = [p.communicate(timeout=600) for p in procs]
    if any(p.returncode for p in procs):
        raise SystemExit("the latency ranks failed: " + outs[0][1][-2000:])
    tables = json.loads(outs[0][0].strip().splitlines()[-1])
    return tuple(
        {int(k): v for k, v in tables[via].items()} for via in ("shared memory", "gloo alone")
    )


def latency(table, nbytes):
    """The latency of a collective of ``nbytes``, interpolated in the table (linear in bytes)."""
    sizes = sorted(table)
    return float(np.interp(nbytes, sizes, [table[s] for s in sizes]))


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    p = argparse.ArgumentParser(description="one rank of the latency table")
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--ranks", type=int, required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--times", type=int, default=200)
    a = p.parse_args()
    latency_rank(a.rank, a.ranks, a.port, a.times)
