"""SIGKILL ``fenchel-cvx train`` and ``resume`` at seeded moments: no run file is ever half-written,
and the next command in the folder removes the temporaries the kills left.

Every file goes through ``io.atomic_write``: a temporary ``.<name>.<pid>.<random>.tmp`` beside
the target, renamed over it; ``io.remove_temporaries``, called by every command in a run folder,
deletes the temporaries whose writer is gone and never a live writer's (docs page
"Installation", "Reliability").

``kill_test``: ``fenchel-cvx train`` on the embedded digits, run as a chain of commands in one
folder (``train``, then ``resume`` once a checkpoint is there), each SIGKILLed at a moment of a
list drawn from ``--seed``: a fraction of an uncut run's length after the command starts (the
faster of two uncut runs, then of any ``train`` that ended before its moment), or, for
``AT_WRITE`` of them (scaled to ``--kills``; 14 of 110 at the plots), the moment a file's
temporary appears (its write begun) plus a fraction of the time that write took in the uncut
run. After every kill no final-named file is half-written, and every temporary carries the pid
of a command killed in that folder; after the command that ends a chain (run in this process:
``resume``, ``train`` where no checkpoint was written, ``evaluate`` where the run had finished,
or a forked command that ended before its moment) no temporary is left, and the command named
those it removed. A moment that two commands end before is dropped (``missed``). The commands
run in processes forked from a server that has imported the package (``multiprocessing``'s
forkserver), so that a command's time is its work, not Python's start-up.

    python benchmarks/kill_writes.py                  # 110 kills, 14 of them while plotting
    python benchmarks/kill_writes.py --kills 300 --seed 1

prints the figures (kills, kills of each command, while plotting, half-written files, temporaries
left, missed moments) and every problem; the exit status is 1 where there is one. The test suite
runs 30 kills (tests/test_kill_writes.py).
"""

import argparse
import contextlib
import io
import multiprocessing
import multiprocessing.forkserver
import os
import random
import re
import signal
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common.run_files import half_written  # noqa: E402
from fenchel_cvx import cli  # noqa: E402
from fenchel_cvx.io import RUN_FILES  # noqa: E402

#: the fastest train run the CLI allows on digits (``test_cli._quick``), in three rounds, each
#: checkpointed
TRAIN = [
    "train",
    "--train-size",
    "30",
    "--iterations",
    "3",
    "--arch",
    "64-4-10",
    "--backend",
    "fast",
    "--checkpoint-every",
    "1",
    "--quiet",
    "--no-baseline",
]
SEED = 20240607
#: of 110 moments, those that wait for a file's temporary to appear (its write begun), by file
AT_WRITE = {
    "objectives.png": 7,
    "accuracy.png": 7,
    "checkpoint.npz": 4,
    "history.json": 3,
    "model.npz": 3,
    "run.json": 2,
}
CHAIN = (3, 8)  # kills in one folder before the command that ends it
#: what the forkserver imports once
PRELOAD = [
    "fenchel_cvx.cli",
    "fenchel_cvx.bcd",
    "fenchel_cvx.fast",
    "fenchel_cvx.checkpoints",
    "fenchel_cvx.plotting",
    "matplotlib.font_manager",
]
PLOTS = ("objectives.png", "accuracy.png")
PLOT_TEMPORARIES = tuple(f".{plot}." for plot in PLOTS)
HANG = 120  # a guard on every wait


def temporaries(folder):
    """The temporaries of a run's files in ``folder``, by name."""
    return sorted(
        p.name
        for p in (folder.iterdir() if folder.is_dir() else ())
        if p.name.endswith(".tmp") and any(p.name.startswith(f".{n}.") for n in RUN_FILES)
    )


def writer_pid(temporary):
    """The writer's pid in a temporary's name (None: a name without one)."""
    m = re.fullmatch(r"\..+\.([0-9]+)\.[0-9a-f]{8}\.tmp", temporary)
    return None if m is None else int(m[1])


def _main(argv):
    """A forked command, its output discarded: its exit status is the process's."""
    with open(os.devnull, "w") as null:
        os.dup2(null.fileno(), 1)
        os.dup2(null.fileno(), 2)
    raise SystemExit(cli.main(argv))


def _writing(folder, name):
    """Whether a temporary of the file ``name`` is in ``folder``: the file is being written."""
    return folder.is_dir() and any(p.name.startswith(f".{name}.") for p in os.scandir(folder))


def _watch(ctx, argv, folder):
    """Run ``argv`` uncut; when each file and temporary first appeared, and when it ended
    (``"end"``), in seconds from its start."""
    first = {}
    p = ctx.Process(target=_main, args=(argv,))
    p.start()
    t0 = time.monotonic()
    while p.exitcode is None and time.monotonic() < t0 + HANG:
        if folder.is_dir():
            for entry in os.scandir(folder):
                key = re.sub(r"(\.[0-9]+)?\.[0-9a-f]{8}\.tmp$", ".tmp", entry.name)
                first.setdefault(key, time.monotonic() - t0)
        time.sleep(0.0005)
    first["end"] = time.monotonic() - t0
    p.join(HANG)
    if p.exitcode != 0:
        raise RuntimeError(f"an uncut {argv[0]} exited {p.exitcode}")
    return first


def _moments(rng, kills):
    """``kills`` moments ``(file, fraction)``: ``fraction`` of the time the file's write took in
    an uncut run after its temporary appears, or, ``file`` None, of the uncut run's length after
    the command starts; ``AT_WRITE``'s counts scaled to ``kills`` (at least one each)."""
    files = [name for name, n in AT_WRITE.items() for _ in range(max(1, n * kills // 110))]
    files += [None] * (kills - len(files))
    rng.shuffle(files)
    return [(name, rng.random()) for name in files]


@contextlib.contextmanager
def _one_thread():
    """The BLAS and OpenMP thread counts set to 1 in this process's environment, for the
    processes it starts meanwhile."""
    names = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")
    saved = {n: os.environ.get(n) for n in names}
    os.environ.update({n: "1" for n in names})
    try:
        yield
    finally:
        for n, v in saved.items():
            if v is None:
                os.environ.pop(n)
            else:
                os.environ[n] = v


def kill_test(root, kills=110, seed=SEED):
    """``(figures, problems)`` of ``kills`` seeded SIGKILLs of chains of commands in folders under
    ``root`` (module doc): ``figures`` a ``Counter`` (``"kills"``, ``"kills while plotting"``,
    ``"half-written files"``, ``"temporaries left"``, ...) with ``"left_by"`` (the file whose
    temporary a kill left, by name), ``"run_length"`` and ``"writes"`` (the uncut run's seconds
    and each file's write) beside; ``problems`` one line each (none where every kill kept the
    contract)."""
    root, ctx = Path(root), multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload([__name__, *PRELOAD])  # (where the server is not running yet)
    with _one_thread():  # the forkserver's BLAS, where this starts it: no pool to fork
        multiprocessing.forkserver.ensure_running()
    # uncut runs: how long a run takes, and each write (the faster: the first warms up)
    uncut = [root / "uncut0", root / "uncut1"]
    timeline = min(
        (_watch(ctx, [*TRAIN, "--out", str(u)], u) for u in uncut), key=lambda t: t["end"]
    )
    run_length = timeline["end"]
    # (a write too short for the polling to see its temporary: 0)
    write = {n: timeline[n] - timeline.get(f".{n}.tmp", timeline[n]) for n in RUN_FILES}
    problems = [f"{u.name}: {b}" for u in uncut for b in half_written(u)]
    problems += [f"{u.name}: {t} left" for u in uncut for t in temporaries(u)]

    rng = random.Random(seed)
    moments = _moments(rng, kills)
    figures = Counter()
    left_by = Counter()  # the file whose temporary a kill left (it was writing it)
    chain = None  # [folder, kills to go, pids killed]
    retried = False
    while moments:
        if chain is None:
            chain = [root / f"run{figures['chains']:03d}", rng.randint(*CHAIN), set()]
            figures["chains"] += 1
        folder, to_go, killed = chain
        if to_go == 0 or _finished(folder):  # the command that ends the chain, in this process
            problems += _end_chain(folder)
            figures["ended by a command in this process"] += 1
            chain = None
            continue
        name, fraction = moments[0]
        resume = (folder / "checkpoint.npz").is_file()
        argv = ["resume", str(folder), "--quiet"] if resume else [*TRAIN, "--out", str(folder)]
        before = set(temporaries(folder))
        p = ctx.Process(target=_main, args=(argv,))
        p.start()
        t0 = time.monotonic()
        if name is None:
            p.join(fraction * run_length)
        else:
            while (
                p.exitcode is None and not _writing(folder, name) and time.monotonic() < t0 + HANG
            ):
                time.sleep(0.0005)
            time.sleep(fraction * write[name])
        if p.exitcode is None:
            try:
                os.kill(p.pid, signal.SIGKILL)
            except ProcessLookupError:  # it ended meanwhile
                pass
        p.join(HANG)
        if p.exitcode == -signal.SIGKILL:
            moments.pop(0)
            retried = False
            figures["kills"] += 1
            figures[f"kills of {argv[0]}"] += 1
            figures["kills at a write's start"] += name is not None
            chain[1] -= 1
            killed.add(p.pid)
            left = temporaries(folder)
            problems += [
                f"{folder.name}: {n} is no killed command's"
                for n in left
                if writer_pid(n) not in killed
            ]
            writing = [n for n in left if n not in before]  # what it was writing
            left_by.update(re.sub(r"(\.[0-9]+)?\.[0-9a-f]{8}\.tmp$", "", n)[1:] for n in writing)
            figures["kills while plotting"] += any(n.startswith(PLOT_TEMPORARIES) for n in writing)
            bad = half_written(folder)
            figures["half-written files"] += len(bad)
            problems += [f"{folder.name} after a kill of {argv[0]}: {b}" for b in bad]
        else:  # the command ended before the moment: its run is done, the moment retried once
            figures["commands that ended before their moment"] += 1
            if argv[0] == "train":  # a whole run, faster than the uncut ones
                run_length = min(run_length, time.monotonic() - t0)
            if p.exitcode != 0:
                problems.append(f"{folder.name}: {' '.join(argv)} exited {p.exitcode}")
            left = temporaries(folder)
            figures["temporaries left"] += len(left)
            problems += [f"{folder.name}: {name} left by {argv[0]}" for name in left]
            if retried:
                moments.pop(0)
                figures["missed"] += 1
            retried = not retried
            chain = None
        p.close()
    if chain is not None:
        problems += _end_chain(chain[0])
    figures["temporaries left"] += sum(len(temporaries(f)) for f in root.iterdir())
    figures["left_by"], figures["run_length"], figures["writes"] = dict(left_by), run_length, write
    return figures, problems


def _finished(folder):
    """Whether the run in ``folder`` wrote all its files (a chain is one run: its last)."""
    return all((folder / name).is_file() for name in RUN_FILES)


def _end_chain(folder):
    """Run the command that comes after the chain's last kill, in this process: ``evaluate``
    where the run finished, else ``resume`` (``train`` where no checkpoint was written). It
    removes every temporary, and names them in one line on standard error."""
    before = temporaries(folder)
    if _finished(folder):
        argv = ["evaluate", str(folder)]
    elif (folder / "checkpoint.npz").is_file():
        argv = ["resume", str(folder), "--quiet"]
    else:
        argv = [*TRAIN, "--out", str(folder)]
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()) as e:
        rc = cli.main(argv)
    err = e.getvalue()
    problems = [] if rc == 0 else [f"{folder.name}: {' '.join(argv)} exited {rc}"]
    problems += [f"{folder.name}: {name} left by {argv[0]}" for name in temporaries(folder)]
    problems += [f"{folder.name}: {b}" for b in half_written(folder)]
    said = [line for line in err.splitlines() if "temporary file(s)" in line]
    if before and not (
        len(said) == 1
        and f"fenchel-cvx {argv[0]}: removed {len(before)} temporary file(s)" in said[0]
        and all(name in said[0] for name in before)
    ):
        problems.append(f"{folder.name}: {argv[0]} removed {before} and said {said}")
    return problems


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--kills", type=int, default=110, help="seeded moments (default 110)")
    p.add_argument("--seed", type=int, default=SEED, help=f"draws the moments (default {SEED})")
    args = p.parse_args(argv)
    if args.kills < 1:
        p.error(f"--kills must be >= 1, got {args.kills}")
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="kill_writes-") as root:
        figures, problems = kill_test(root, args.kills, args.seed)
    left_by, length, writes = (figures.pop(k) for k in ("left_by", "run_length", "writes"))
    print(
        f"kill test: {dict(figures)}; kills while writing, by file: {left_by}; an uncut run: "
        f"{length:.2f} s, its writes {', '.join(f'{k} {v:.3f} s' for k, v in writes.items())}; "
        f"in all {time.monotonic() - started:.0f} s"
    )
    for line in problems:
        print("problem:", line)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
