"""Every reader's contract under seeded fuzzing (``benchmarks/fuzz_readers.py``): each mutated
file loads or is refused with the package's error naming the file; through ``fenchel-cvx
evaluate``, exit 2 and one line naming it. Each case runs in a child forked from this process
under ``RLIMIT_AS`` and ``RLIMIT_CPU``, so a crash, a hang or a memory bomb fails its case, not
the test run. CI's pass is short and seeded; the long one is the script's ``--cases 10000``."""

import pytest

from _benchmarks import load_benchmark

fuzz = load_benchmark("fuzz_readers")
CASES = 40  # per reader, seeded: the same files on every run


@pytest.mark.parametrize("name", sorted(fuzz.READERS))
def test_every_mutated_file_loads_or_is_refused_by_name(name, tmp_path):
    outcomes = fuzz.fuzz(fuzz.READERS[name], CASES, seed=0, folder=tmp_path)
    assert outcomes[0]["kind"] == "loaded", outcomes[0]  # the seed file itself
    s = fuzz.summary(outcomes)
    assert s["breaches"] == [], s
    assert s["kinds"].get("named", 0) >= CASES // 4  # the mutations reach the checks


def test_the_harness_reports_a_reader_that_breaks_the_contract(tmp_path):
    """A planted reader that raises a raw exception, one that exhausts memory and one that
    crashes are each reported as a breach, by kind."""

    class Raw(fuzz.PointsCsv):
        name = "raw"

        def read(self, path):
            raise KeyError("a raw exception")

    class Bomb(fuzz.PointsCsv):
        name = "bomb"

        def read(self, path):
            bytearray(8 << 30)

    class Crash(fuzz.PointsCsv):
        name = "crash"

        def read(self, path):
            import os
            import signal

            os.kill(os.getpid(), signal.SIGSEGV)

    kinds = {}
    for reader in (Raw(), Bomb(), Crash()):
        path = reader.seed(tmp_path)
        kinds[reader.name] = fuzz.run_case(reader, path.read_bytes(), path)["kind"]
    assert kinds == {"raw": "raw", "bomb": "memory", "crash": "crash"}
