"""``fenchel_cvx.heap``: with ``keep_freed_memory`` a freed large array stays in the process's
heap for the next temporary (its pages stay resident); with malloc's defaults it goes back to
the system at once. Each case runs in a fresh process: the setting is the process's."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

CASE = """
import os, sys
import numpy as np
from fenchel_cvx.heap import keep_freed_memory
kept = keep_freed_memory() if sys.argv[1] == "kept" else False
assert sys.argv[1] != "kept" or keep_freed_memory() is kept  # once a process, then its answer
page = os.sysconf("SC_PAGE_SIZE")
def resident():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * page
def alloc_and_free(out):
    a = np.ones(3 * 2**23, np.float32)  # 96 MiB, every page written: above a thread heap's 64
    before = resident()
    del a
    out.append(before - resident())
fell = []
if sys.argv[2] == "thread":  # in another thread (its own arena, unless there is one heap)
    import threading
    t = threading.Thread(target=alloc_and_free, args=(fell,))
    t.start()
    t.join()
else:
    alloc_and_free(fell)
print(kept, fell[0])
"""
MIB = 2**20


def _freed(mode, where="main"):
    """(whether the setting took, the bytes the process's resident set fell by on the free of
    an array made in the main thread or in another ``where``)."""
    out = subprocess.run(  # the timeout is a hang guard only (the case takes about a second)
        [sys.executable, "-c", CASE, mode, where],
        capture_output=True,
        text=True,
        check=True,
        timeout=600,
    )
    kept, fell = out.stdout.split()
    return kept == "True", int(fell)


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="needs Linux's /proc")
@pytest.mark.parametrize("where", ["main", "thread"])
def test_a_freed_large_array_stays_in_the_heap_only_where_kept(where):
    took, fell_kept = _freed("kept", where)
    if not took:
        pytest.skip("this C library has no mallopt (not glibc): keep_freed_memory does nothing")
    _, fell_system = _freed("system", where)
    assert fell_system > 90 * MIB  # malloc's default: the 96 MiB block unmapped at once
    assert fell_kept < 4 * MIB  # kept: still the process's, for the next temporary


@pytest.mark.slow
def test_heap_benchmark_runs_both_modes_to_the_same_result():
    """``benchmarks/heap_ab.py`` on the embedded sample: one run with malloc's defaults and one
    with the kept heap, which train to the same accuracy (the setting changes no arithmetic)."""
    script = Path(__file__).resolve().parents[1] / "benchmarks" / "heap_ab.py"
    flags = ["--quick", "--methods", "lau", "--iterations", "2", "--repeats", "1"]
    out = subprocess.run(
        [sys.executable, str(script), *flags], capture_output=True, text=True, timeout=600
    )
    assert out.returncode == 0, out.stderr[-2000:]
    accuracy = {
        line.split(", ")[2].split(":")[0]: line.rsplit("accuracy ", 1)[1]
        for line in out.stdout.splitlines()
        if line.startswith("repeat 1, lau, ")
    }
    assert set(accuracy) == {"system", "kept"} and accuracy["system"] == accuracy["kept"]
    assert "with the kept heap" in out.stdout


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="needs Linux's /proc")
@pytest.mark.parametrize("mode", ["kept", "system"])
def test_a_spawned_rank_keeps_its_freed_memory_where_rank_0_does(mode):
    """``parallel.Ranks``: the spawned rank takes rank 0's heap setting, so that both ranks'
    temporaries cost alike (a rank without it zero-fills fresh pages for every large one)."""
    pytest.importorskip("torch", reason="ranks need PyTorch (fenchel_cvx[bench])")
    script = Path(__file__).resolve().parent / "_heap_ranks.py"
    out = subprocess.run(
        [sys.executable, str(script), mode], capture_output=True, text=True, timeout=600
    )
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    if mode == "kept" and not report["took"]:
        pytest.skip("this C library has no mallopt (not glibc): keep_freed_memory does nothing")
    for rank, fell in enumerate(report["fell"]):
        assert (fell < 4 * MIB) if mode == "kept" else (fell > 60 * MIB), (rank, fell)


CLUSTER = """
from fenchel_cvx.heap import freed_memory_kept, keep_freed_memory
from fenchel_cvx.oracle import OracleBackend
took = keep_freed_memory()
backend = OracleBackend(n_jobs=2)
try:
    print(took, *sorted(backend._dask().run(freed_memory_kept).values()))
finally:
    backend.close()
"""


def test_the_oracles_own_workers_keep_their_freed_memory_where_its_process_does():
    """``OracleBackend(n_jobs=2)`` starts its Dask workers with the heap setting of the process
    that starts them (their row tasks' temporaries are hundreds of MB at MNIST's size)."""
    pytest.importorskip("distributed", reason="the oracle's workers need Dask")
    out = subprocess.run(
        [sys.executable, "-c", CLUSTER], capture_output=True, text=True, timeout=600
    )
    assert out.returncode == 0, out.stderr[-3000:]
    took, *workers = out.stdout.split()
    if took != "True":
        pytest.skip("this C library has no mallopt (not glibc): keep_freed_memory does nothing")
    assert workers == ["True", "True"]
