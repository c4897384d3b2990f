"""The hostile-file battery: each hostile file of the tests read in a child, timed and measured.

Every hostile case of the tests' tables is read as the package reads it, in a child, with its
outcome, its seconds and its peak memory: issue 55's measurement.

Issue 55's target over the table of hostile files: 0 crashes, 0 hangs over 10 s, 0 reads whose
peak memory exceeds max(64 MiB, 4 x the declared uncompressed size), 0 raw exceptions, 0 silent
accepts. The table (benchmarks/hostile_cases.py) is the tests', imported, so this needs the test
extras (pytest among them): the parameter tables of tests/test_trusted_files.py,
test_read_budget.py, test_cifar_pickle.py and test_schemas.py, the hostile files their single
tests build (memory bombs, deep nesting, huge integers, millions of opcodes) and the fuzzing
harness's valid seed files; the tests' fixtures (a checkpoint, a small trained run) are built
once. A case's label is what it must do: ``named``, refused with a ``FenchelError`` naming the
file (through the command line: exit 2, a line naming it); ``argument``, a ``ValueError`` naming
the argument (a checkpoint outside its run's schedule); or ``loaded``.

Each case writes its files into a folder of its own, read in a child forked from this warm
process by fuzz_readers.py's ``run_case`` (``RLIMIT_AS``: this process's address space and
--memory-gib more; ``RLIMIT_CPU``: --cpu-seconds): its outcome, seconds and peak (the rise of the
child's resident set during the read). A peak over 64 MiB is judged against 4 x what the case's
files declare uncompressed (a zip's member sizes, a gzip's ISIZE, any other file's size).

    python benchmarks/hostile_battery.py                       # every case, a few minutes
    python benchmarks/hostile_battery.py --only cifar,idx --memory-gib 2 --each

prints a line per category (network, checkpoint, json, cifar, idx, points) and a total: cases,
outcomes by kind, outcomes other than the label (silent accepts: loaded where a refusal was
required), the slowest case and the count over 10 s, the largest peak and the count over its
bound; then a line per breach (``--each``: per case). It exits 1 on any breach.
"""

import argparse
import contextlib
import re
import resource
import shutil
import sys
import tempfile
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE)]

import fuzz_readers as fuzz  # noqa: E402
import hostile_cases as hc  # noqa: E402
from hostile_cases import CATEGORIES, Case, collect  # noqa: E402, F401


def declared(folder):
    """The uncompressed bytes the files under ``folder`` declare: a zip's member sizes, a gzip's
    ISIZE, a CSV's numbers as float64 (what the read budget charges), each at least the file's
    own size."""
    total = 0
    for path in (p for p in [folder, *folder.rglob("*")] if p.is_file()):
        size = path.stat().st_size
        with contextlib.suppress(OSError, ValueError, NotImplementedError, zipfile.BadZipFile):
            if zipfile.is_zipfile(path):
                with zipfile.ZipFile(path) as z:
                    size = max(size, sum(i.file_size for i in z.infolist()))
            elif path.suffix == ".gz" and size >= 4:
                size = max(size, int.from_bytes(path.read_bytes()[-4:], "little"))
            elif path.suffix == ".csv":  # a number after each comma and each newline, 8 bytes
                data = path.read_bytes()
                size = max(size, 8 * (data.count(b",") + data.count(b"\n")))
        total += size
    return total


def battery(cases, folder, memory_gib=3.0, cpu_seconds=60):
    """Each case made in a folder of its own under ``folder`` (removed after) and read by
    ``run_case``: a dict a case, ``run_case``'s with the case's category, name and label, its
    memory ``bound`` and its ``breach`` reasons; a raw ValueError naming an argument (``resume:
    ...``) is of the kind ``argument``."""
    hc.start(folder / "fixtures")
    outcomes = []
    for i, case in enumerate(cases):
        (where := folder / f"case{i}").mkdir()
        try:
            path = Path(case.make(where))
        except Exception as err:  # the battery's own fault, reported as a breach
            o = dict(kind="unbuilt", error=f"{type(err).__name__}: {err}"[:300], seconds=0.0)
        else:
            fuzz.trim()  # what building the case freed, handed back: the read's peak its own
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            o = fuzz.run_case(case, None, path, memory_gib, cpu_seconds)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)  # the child's, once reaped
            o["cpu"] = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
            if o["kind"] == "raw" and re.match(r"ValueError: \w+: ", o["error"]):
                o["kind"] = "argument"
        o.update(category=case.category, name=case.name, label=case.label, bound=fuzz.MEMORY_FLOOR)
        if o.get("peak", 0) > fuzz.MEMORY_FLOOR:
            files = where if path == where or where in path.parents else path.parent
            o["bound"] = max(fuzz.MEMORY_FLOOR, 4 * declared(files))
        wrong = "silent accept" if o["kind"] == "loaded" else "wrong outcome"
        o["breach"] = [wrong] if o["kind"] != case.label else []
        o["breach"] += [f"over {fuzz.SLOW:g} s"] if o["seconds"] > fuzz.SLOW else []
        o["breach"] += ["memory"] if o.get("peak", 0) > o["bound"] else []
        shutil.rmtree(where, ignore_errors=True)
        outcomes.append(o)
    return outcomes


def summary(outcomes):
    """Per category, and ``total``: cases, counts by kind, outcomes other than the label
    (``silent`` accepts among them), the slowest case and the count over 10 s, the largest peak
    and the count over its bound, and the breaches."""
    out = {}
    for group in [*dict.fromkeys(o["category"] for o in outcomes), "total"]:
        mine = [o for o in outcomes if group in ("total", o["category"])]
        slowest = max(mine, key=lambda o: o["seconds"])
        largest = max(mine, key=lambda o: o.get("peak", 0))
        out[group] = dict(
            cases=len(mine),
            kinds={
                k: sum(o["kind"] == k for o in mine) for k in dict.fromkeys(o["kind"] for o in mine)
            },
            wrong=sum(o["kind"] != o["label"] for o in mine),
            silent=sum("silent accept" in o["breach"] for o in mine),
            slowest=(slowest["seconds"], slowest.get("cpu", 0.0), slowest["name"]),
            over_10_s=sum(o["seconds"] > fuzz.SLOW for o in mine),
            largest=(largest.get("peak", 0), largest["name"]),
            over_bound=sum("memory" in o["breach"] for o in mine),
            breaches=[o for o in mine if o["breach"]],
        )
    return out


def _line(o, error=0):
    """A case's line: its outcome and label, seconds (of CPU), peak, bound (and ``error`` chars
    of its error)."""
    said = f": {o['error'][:error]}" if error and o.get("error") else ""
    return (
        f"{o['category']} / {o['name']}: {o['kind']} (label {o['label']}), {o['seconds']:.2f} s "
        f"({o.get('cpu', 0):.2f} s of CPU), peak {o.get('peak', 0) / 2**20:.1f} MiB (bound "
        f"{o['bound'] / 2**20:.0f} MiB){said}"
    )


def main(argv=None, cases=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--memory-gib", type=float, default=3.0, help="each child's extra memory")
    p.add_argument("--cpu-seconds", type=int, default=60, help="each child's CPU limit")
    p.add_argument("--only", default=",".join(CATEGORIES), help="a comma list of categories")
    p.add_argument("--each", action="store_true", help="a line per case too")
    args = p.parse_args(argv)
    only = args.only.split(",")
    if set(only) - set(CATEGORIES):
        p.error(f"--only must name some of {', '.join(CATEGORIES)}; got {args.only}")
    if args.cpu_seconds < 1 or not args.memory_gib > 0:
        p.error("--cpu-seconds must be >= 1 and --memory-gib > 0")
    cases = [c for c in (collect() if cases is None else cases) if c.category in only]
    with tempfile.TemporaryDirectory() as tmp:
        outcomes = battery(cases, Path(tmp), args.memory_gib, args.cpu_seconds)
    for o in outcomes if args.each else []:
        print("  " + _line(o, 160 if o["breach"] else 0))
    s = summary(outcomes)
    for group, g in s.items():
        print(
            f"{group}: {g['cases']} cases, {g['kinds']}, {g['wrong']} not as labelled "
            f"({g['silent']} silent accepts), slowest {g['slowest'][0]:.2f} s "
            f"({g['slowest'][1]:.2f} s of CPU; {g['slowest'][2]}), "
            f"{g['over_10_s']} over {fuzz.SLOW:g} s, largest peak {g['largest'][0] / 2**20:.1f} "
            f"MiB ({g['largest'][1]}), {g['over_bound']} over the memory bound",
            flush=True,
        )
    for o in s["total"]["breaches"]:
        print(f"BREACH ({', '.join(o['breach'])}) {_line(o, 300)}")
    return 1 if s["total"]["breaches"] else 0


if __name__ == "__main__":
    sys.exit(main())
