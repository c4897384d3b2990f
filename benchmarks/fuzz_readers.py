"""Seeded fuzzing of every file reader: each mutated file loads, or is refused by name.

The contract of every reader of the package (docs page "Installation", "Reliability"): a file
either loads, or raises the package's error (a ``FenchelError``, a ``FileFormatError`` among
them) whose message names the file; through the command line, exit status 2 and one line naming
it. Nothing else: no raw exception, no crash, no hang, no memory out of proportion.

Each reader is one class of ``READERS``: the file it reads (``seed`` writes a valid one), and
``read(path)``, the package's own entry point. A case is the seed file after a few seeded
mutations (``mutate``: flipped, inserted, deleted, duplicated and truncated bytes, and integers
set to extremes), read in a child forked from this warm process (``common.children.run_case``)
under ``RLIMIT_AS`` (this process's address space plus ``--memory-gib``) and ``RLIMIT_CPU``
(``--cpu-seconds``): a crash, a hang or a memory bomb shows as the child's death, never this
process's. The test suite runs a short pass (tests/test_fuzz_readers.py); the long one is

    python benchmarks/fuzz_readers.py --cases 10000          # every reader, 10,000 files each
    python benchmarks/fuzz_readers.py --cases 200 --readers network,checkpoint --seed 3

which prints, per reader, how many cases loaded, were refused by name, escaped as a raw
exception, crashed, hit the CPU limit or the memory limit, the slowest case's seconds and the
count over 10 s, and the largest rise of a read's resident set and the count over 64 MiB; it
exits 1 where any case broke the contract.
"""

import argparse
import contextlib
import io
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common.children import MEMORY_FLOOR, SLOW, run_case, trim  # noqa: E402, F401
from fenchel_cvx.errors import FenchelError  # noqa: E402

#: the outcomes that keep the contract
KEPT = ("loaded", "named")


class Reader:
    """A file the package reads: ``name``, the file's name in its folder, ``seed(folder)``
    writing a valid one there, and ``read(path)`` reading it as the package does."""

    name = ""
    filename = ""

    def seed(self, folder: Path) -> Path:
        raise NotImplementedError

    def read(self, path: Path) -> None:
        raise NotImplementedError


def _trained_run(folder):
    """``folder``/run: a copy of a finished one-round run of ``fenchel-cvx train`` on 30
    digits, trained once into ``folder``/pristine."""
    from fenchel_cvx import cli

    pristine, run = folder / "pristine", folder / "run"
    if not (pristine / "checkpoint.npz").is_file():
        argv = ["train", "--train-size", "30", "--iterations", "1", "--arch", "64-4-10"]
        argv += ["--backend", "fast", "--out", str(pristine), "--quiet", "--no-baseline"]
        with contextlib.redirect_stdout(io.StringIO()):
            cli.main(argv)
    shutil.copytree(pristine, run, dirs_exist_ok=True)
    return run


class RunFile(Reader):
    """A file of a run folder, read through ``fenchel-cvx evaluate``: exit 0, or exit 2 with
    a message naming the file."""

    def seed(self, folder):
        return _trained_run(folder) / self.filename

    def read(self, path):
        from fenchel_cvx import cli

        err = io.StringIO()
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
            try:
                code = cli.main(["evaluate", str(path.parent)])
            except SystemExit as exc:
                code = exc.code
        if code not in (0, None):
            text = err.getvalue()
            if code != 2 or "Traceback" in text or path.name not in text:
                raise AssertionError(f"exit {code}: {text[-500:]}")
            raise FenchelError(f"{path}: {text.strip()}")


class RunJson(RunFile):
    name, filename = "run_json", "run.json"


class HistoryJson(Reader):
    name, filename = "history", "history.json"

    def seed(self, folder):
        return _trained_run(folder) / self.filename

    def read(self, path):
        from fenchel_cvx.history import History

        History.load(path)


class Checkpoint(Reader):
    name, filename = "checkpoint", "checkpoint.npz"

    def seed(self, folder):
        return _trained_run(folder) / self.filename

    def read(self, path):
        from fenchel_cvx.checkpoints import load_checkpoint

        load_checkpoint(path)


class Network(Reader):
    name, filename = "network", "model.npz"

    def seed(self, folder):
        return _trained_run(folder) / self.filename

    def read(self, path):
        from fenchel_cvx.io import load_network
        from fenchel_cvx.network import LiftedNetwork

        load_network(path, LiftedNetwork)


class Idx(Reader):
    """An IDX image file (MNIST's format), 5 images of 4 x 4 unsigned bytes."""

    name, filename = "idx", "images-idx3-ubyte"

    def seed(self, folder):
        path = folder / self.filename
        pixels = np.random.default_rng(0).integers(0, 256, (5, 4, 4), dtype=np.uint8)
        path.write_bytes(b"\0\0\x08\x03" + np.array([5, 4, 4], ">u4").tobytes() + pixels.tobytes())
        return path

    def read(self, path):
        from fenchel_cvx.datasets import parse_idx

        parse_idx(path.read_bytes(), source=str(path))


class CifarBatch(Reader):
    """A CIFAR-10 python batch (protocol 2), the other five batches of its folder valid."""

    name, filename = "cifar10", "data_batch_1"

    def seed(self, folder):
        import pickle

        rng = np.random.default_rng(0)
        batches = folder / "cifar"
        batches.mkdir(exist_ok=True)
        for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
            d = {
                b"batch_label": b"b",
                b"data": rng.integers(0, 256, (2, 3072), dtype=np.uint8),
                b"labels": [int(v) for v in rng.integers(0, 10, 2)],
                b"filenames": [b"a.png", b"b.png"],
            }
            (batches / name).write_bytes(pickle.dumps(d, protocol=2))
        return batches / self.filename

    def read(self, path):
        from fenchel_cvx.datasets import load_cifar10

        load_cifar10(path.parent)


class PointsNpy(Reader):
    """The ``.npy`` input of ``fenchel-cvx predict``: 3 points of 4 features."""

    name, filename = "points_npy", "points.npy"

    def seed(self, folder):
        path = folder / self.filename
        np.save(path, np.arange(12, dtype=np.float64).reshape(3, 4), allow_pickle=False)
        return path

    def read(self, path):
        from fenchel_cvx.files import read_points

        read_points(path, 4)


class PointsCsv(PointsNpy):
    name, filename = "points_csv", "points.csv"

    def seed(self, folder):
        path = folder / self.filename
        path.write_text("0,1,2,3\n4,5,6,7\n8,9,10,11\n")
        return path


READERS = {r.name: r for r in (RunJson(), HistoryJson(), Checkpoint(), Network(), Idx())}
READERS.update({r.name: r for r in (CifarBatch(), PointsNpy(), PointsCsv())})


def mutate(data: bytes, rng) -> bytes:
    """1 to 4 seeded edits of ``data``: a flipped byte, an inserted or deleted run, a duplicated
    chunk, a truncation, or 4 bytes set to an extreme integer; most edits fall in the first
    512 bytes, where the headers and directories are (a zip's directory: the last 512)."""
    raw = bytearray(data)
    for _ in range(int(rng.integers(1, 5))):
        n = len(raw)
        if n == 0:
            raw += bytes(rng.integers(0, 256, 8, dtype=np.uint8))
            continue
        head = rng.random() < 0.7
        i = int(rng.integers(0, min(n, 512))) if head else int(rng.integers(0, n))
        if rng.random() < 0.3 and raw[:2] == b"PK":  # a zip: its directory at the end
            i = max(0, n - 1 - int(rng.integers(0, min(n, 512))))
        edit = rng.random()
        if edit < 0.35:
            raw[i] ^= int(rng.integers(1, 256))
        elif edit < 0.5:
            raw[i:i] = bytes(rng.integers(0, 256, int(rng.integers(1, 9)), dtype=np.uint8))
        elif edit < 0.65:
            del raw[i : i + int(rng.integers(1, 9))]
        elif edit < 0.75:
            j = int(rng.integers(i, n + 1))
            raw[j:j] = raw[i : min(n, i + int(rng.integers(1, 257)))]
        elif edit < 0.85:
            del raw[int(rng.integers(0, n)) :]
        else:
            extreme = [0, 1, 0x7FFFFFFF, 0xFFFFFFFF, 0x80000000][int(rng.integers(0, 5))]
            raw[i : i + 4] = extreme.to_bytes(4, "little" if rng.random() < 0.5 else "big")
    return bytes(raw)


def fuzz(reader, cases, seed, folder, **limits):
    """``cases`` seeded mutations of ``reader``'s seed file, each read by ``run_case``: the
    outcomes (the seed file's own first; a seed that does not load is a failure)."""
    rng = np.random.default_rng([seed, sum(map(ord, reader.name))])
    path = reader.seed(folder)
    valid = path.read_bytes()
    trim()  # the seed's freed memory (a trained run) handed back: each read's peak its own
    outcomes = [run_case(reader, valid, path, **limits)]
    for _ in range(cases):
        outcomes.append(run_case(reader, mutate(valid, rng), path, **limits))
    reader.seed(folder)  # the folder as it was, for the next reader
    return outcomes


def summary(outcomes):
    """Counts by kind, the slowest case's seconds, the cases over ``SLOW``, the largest peak
    memory of a read and the cases over ``MEMORY_FLOOR``, and the first few breaches of the
    contract (a read over the floor among them)."""
    kinds = {}
    for o in outcomes:
        kinds[o["kind"]] = kinds.get(o["kind"], 0) + 1
    peaks = [o["peak"] for o in outcomes if "peak" in o]
    breaches = [o for o in outcomes if o["kind"] not in KEPT or o.get("peak", 0) > MEMORY_FLOOR]
    return dict(
        cases=len(outcomes),
        kinds=kinds,
        slowest=max(o["seconds"] for o in outcomes),
        over_10_s=sum(o["seconds"] > SLOW for o in outcomes),
        peak=max(peaks, default=0),
        over_floor=sum(p > MEMORY_FLOOR for p in peaks),
        breaches=breaches[:5],
    )


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cases", type=int, default=200, help="mutated files per reader")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--readers", default=",".join(READERS), help="a comma list; default all")
    p.add_argument("--memory-gib", type=float, default=1.0, help="each child's extra memory")
    p.add_argument("--cpu-seconds", type=int, default=20, help="each child's CPU limit")
    args = p.parse_args(argv)
    names = args.readers.split(",")
    unknown = sorted(set(names) - set(READERS))
    if unknown:
        p.error(f"--readers must name {', '.join(READERS)}; got {unknown}")
    if args.cases < 1 or args.cpu_seconds < 1 or not args.memory_gib > 0:
        p.error("--cases and --cpu-seconds must be >= 1 and --memory-gib > 0")
    broken = 0
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            limits = dict(memory_gib=args.memory_gib, cpu_seconds=args.cpu_seconds)
            s = summary(fuzz(READERS[name], args.cases, args.seed, Path(tmp), **limits))
            broken += len(s["breaches"])
            print(
                f"{name}: {s['cases']} cases, {s['kinds']}, slowest {s['slowest']:.2f} s, "
                f"{s['over_10_s']} over {SLOW:g} s, largest peak {s['peak'] / 2**20:.1f} MiB, "
                f"{s['over_floor']} over {MEMORY_FLOOR >> 20} MiB",
                flush=True,
            )
            for b in s["breaches"]:
                peak = b.get("peak", 0) / 2**20
                print(f"  {b['kind']}: {b.get('error', '')} (peak {peak:.1f} MiB)", flush=True)
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
