"""A run killed while writing leaves no half-written file, and the next command its temporaries.

Every file goes through ``io.atomic_write``: a temporary ``.<name>.<pid>.<random>.tmp`` beside
the target, renamed over it. ``io.remove_temporaries`` deletes the temporaries whose writer is
gone and never a live writer's; every command in a run folder calls it.

The unit tests: a live writer's temporary is kept (this process, in the middle of a write), a
SIGKILLed writer's is removed, so are one of a zombie and one older than its pid's process (the
pid reused), and one named before pids were; ``predict`` removes a dead writer's and says so.

The kill test (``slow``): ``fenchel-cvx train`` on the embedded digits, run as a chain of
commands in one folder (``train``, then ``resume`` once a checkpoint is there), each SIGKILLed at
a moment of a list drawn from ``SEED``: a fraction of an uncut run's length after the command
starts (the faster of two uncut runs, then of any ``train`` that ended before its moment), or,
for ``AT_WRITE`` of them (14 at the plots), the moment a file's temporary appears (its write
begun) plus a fraction of the time that write took in the uncut run. After every kill no
final-named file is half-written, and every temporary carries the pid of a command killed in
that folder; after the command that ends a chain (run in this process: ``resume``, ``train``
where no checkpoint was written, ``evaluate`` where the run had finished, or a forked command
that ended before its moment) no temporary is left, and the command named those it removed. A
moment that two commands end before is dropped. The commands run in processes forked from a
server that has imported the package (``multiprocessing``'s forkserver), so that a command's
time is its work, not Python's start-up.
"""

import json
import multiprocessing
import os
import random
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

import fenchel_cvx
from fenchel_cvx import cli
from fenchel_cvx.io import RUN_FILES, atomic_write, remove_temporaries

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
KILLS = 110  # seeded moments; a moment a command ends before is dropped (``missed``)
#: of them, those that wait for a file's temporary to appear (its write begun), by file
AT_WRITE = {
    "objectives.png": 7,
    "accuracy.png": 7,
    "checkpoint.npz": 4,
    "history.json": 3,
    "model.npz": 3,
    "run.json": 2,
}
CHAIN = (3, 8)  # kills in one folder before the command that ends it
#: what the forkserver imports once (sklearn: the digits' loader)
PRELOAD = [
    "fenchel_cvx.cli",
    "fenchel_cvx.bcd",
    "fenchel_cvx.fast",
    "fenchel_cvx.checkpoints",
    "fenchel_cvx.plotting",
    "sklearn.datasets",
    "matplotlib.font_manager",
]
PNG_START = b"\x89PNG\r\n\x1a\n"
PNG_END = b"\x00\x00\x00\x00IEND\xaeB`\x82"
PLOTS = ("objectives.png", "accuracy.png")
PLOT_TEMPORARIES = tuple(f".{plot}." for plot in PLOTS)
HANG = 120  # a guard on every wait


def _temporaries(folder):
    """The temporaries of a run's files in ``folder``, by name."""
    return sorted(
        p.name
        for p in (folder.iterdir() if folder.is_dir() else ())
        if p.name.endswith(".tmp") and any(p.name.startswith(f".{n}.") for n in RUN_FILES)
    )


def _pid(temporary):
    """The writer's pid in a temporary's name (None: a name without one)."""
    m = re.fullmatch(r"\..+\.([0-9]+)\.[0-9a-f]{8}\.tmp", temporary)
    return None if m is None else int(m[1])


# --- remove_temporaries -----------------------------------------------------------------------
def test_a_live_writers_temporary_is_kept(tmp_path, monkeypatch):
    seen = []

    def write(f):  # another command cleans the folder while this process writes
        f.write(b"half")
        f.flush()
        seen.append(sorted(p.name for p in tmp_path.iterdir()))
        seen.append(remove_temporaries(tmp_path))

    atomic_write(tmp_path / "checkpoint.npz", write)
    (name,), removed = seen
    assert _pid(name) == os.getpid() and name.startswith(".checkpoint.npz.")
    assert removed == [] and (tmp_path / "checkpoint.npz").read_bytes() == b"half"
    # a live writer of another user: os.kill says so with PermissionError
    (tmp_path / name).write_bytes(b"half")

    def kill(pid, sig):
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "kill", kill)
    assert remove_temporaries(tmp_path) == [] and (tmp_path / name).exists()


def test_a_killed_writers_temporary_is_removed(tmp_path):
    script = (
        "import os, signal, sys\n"
        "from fenchel_cvx.io import atomic_write\n"
        "def write(f):\n"
        "    f.write(b'half'); f.flush(); os.kill(os.getpid(), signal.SIGKILL)\n"
        "atomic_write(sys.argv[1], write)\n"
    )
    root = str(Path(fenchel_cvx.__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, "-c", script, str(tmp_path / "history.json")], env=env)
    assert proc.wait(timeout=HANG) == -signal.SIGKILL
    left = _temporaries(tmp_path)
    assert len(left) == 1 and _pid(left[0]) == proc.pid  # named with its writer's pid
    assert not (tmp_path / "history.json").exists()
    assert remove_temporaries(tmp_path) == [tmp_path / left[0]]
    assert list(tmp_path.iterdir()) == []


def test_an_old_style_temporary_is_removed(tmp_path):
    old = [".checkpoint.npz.abc123.tmp", ".history.json.x.tmp", ".accuracy.png.5f3e9a0c.tmp"]
    live = f".model.npz.{os.getpid()}.0123abcd.tmp"
    others = ["keep.tmp", ".notes.txt.1.abcdef01.tmp", ".model.npz.tmp"]
    for name in [*old, live, *others]:
        (tmp_path / name).write_bytes(b"half")
    assert sorted(p.name for p in remove_temporaries(tmp_path)) == sorted(old)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([live, *others])


@pytest.mark.skipif(not Path("/proc/self/stat").is_file(), reason="needs Linux's /proc")
def test_a_zombies_or_a_reused_pids_temporary_is_removed(tmp_path):
    zombie = subprocess.Popen([sys.executable, "-c", "pass"])
    os.waitid(os.P_PID, zombie.pid, os.WEXITED | os.WNOWAIT)  # exited, not yet reaped
    try:
        os.kill(zombie.pid, 0)  # a zombie is there for os.kill
        of_zombie = tmp_path / f".run.json.{zombie.pid}.00aa11bb.tmp"
        of_zombie.write_bytes(b"half")
        # this process's pid on a file last written before this process started: the pid's
        # earlier owner wrote it
        reused = tmp_path / f".history.json.{os.getpid()}.22cc33dd.tmp"
        reused.write_bytes(b"half")
        os.utime(reused, (1e9, 1e9))  # 2001
        live = tmp_path / f".history.json.{os.getpid()}.44ee55ff.tmp"
        live.write_bytes(b"half")
        assert sorted(remove_temporaries(tmp_path)) == sorted([of_zombie, reused])
        assert [p.name for p in tmp_path.iterdir()] == [live.name]
    finally:
        zombie.wait()


def test_predict_removes_a_killed_writes_temporary_and_says_so(tmp_path, capsys):
    from fenchel_cvx.network import LiftedNetwork

    LiftedNetwork([64, 4, 10], seed=0).save(tmp_path / "model.npz")
    np.savetxt(tmp_path / "x.csv", np.ones((2, 64)), delimiter=",")
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait(timeout=HANG)
    stale = tmp_path / f".model.npz.{gone.pid}.0a1b2c3d.tmp"
    live = tmp_path / f".model.npz.{os.getpid()}.4e5f6a7b.tmp"
    for path in (stale, live):
        path.write_bytes(b"half")
    assert cli.main(["predict", str(tmp_path / "model.npz"), str(tmp_path / "x.csv")]) == 0
    err = capsys.readouterr().err
    assert "fenchel-cvx predict: removed 1 temporary file(s) that a killed write left in " in err
    assert stale.name in err and not stale.exists() and live.exists()


# --- SIGKILL at seeded moments ------------------------------------------------------------------
def _main(argv):
    """A forked command: its exit status is the process's."""
    raise SystemExit(cli.main(argv))


def _half_written(folder):
    """The final-named files of ``folder`` that do not read whole: JSON that does not parse, an
    .npz whose members do not load, a PNG without its signature or its IEND chunk."""
    bad = []
    for path in sorted(folder.iterdir() if folder.is_dir() else ()):
        if path.name.startswith("."):
            continue
        try:
            if path.suffix == ".json":
                json.loads(path.read_text())
            elif path.suffix == ".npz":
                with np.load(path, allow_pickle=False) as z:
                    for key in z.files:
                        z[key]
            elif path.suffix == ".png":
                data = path.read_bytes()
                if not (data.startswith(PNG_START) and data.endswith(PNG_END)):
                    raise ValueError(f"{len(data)} bytes, not a whole PNG")
        except Exception as err:  # noqa: BLE001 - every failure is a finding
            bad.append(f"{path.name}: {type(err).__name__}: {err}")
    return bad


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
    assert p.exitcode == 0
    return first


def _moments(rng):
    """``KILLS`` moments ``(file, fraction)``: ``fraction`` of the time the file's write took in
    an uncut run after its temporary appears, or, ``file`` None, of the uncut run's length after
    the command starts."""
    files = [name for name, n in AT_WRITE.items() for _ in range(n)]
    files += [None] * (KILLS - len(files))
    rng.shuffle(files)
    return [(name, rng.random()) for name in files]


@pytest.mark.slow
def test_sigkill_at_seeded_moments_leaves_whole_files_and_no_temporaries(
    tmp_path, monkeypatch, capsys
):
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        monkeypatch.setenv(var, "1")  # the forkserver's BLAS: no pool to fork
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload([__name__, *PRELOAD])
    started = time.monotonic()
    # uncut runs: how long a run takes, and each write (the faster: the first warms up)
    uncut = [tmp_path / "uncut0", tmp_path / "uncut1"]
    timeline = min(
        (_watch(ctx, [*TRAIN, "--out", str(u)], u) for u in uncut), key=lambda t: t["end"]
    )
    run_length = timeline["end"]
    # (a write too short for the polling to see its temporary: 0)
    write = {n: timeline[n] - timeline.get(f".{n}.tmp", timeline[n]) for n in RUN_FILES}
    assert all(_half_written(u) == [] and _temporaries(u) == [] for u in uncut)

    rng = random.Random(SEED)
    moments = _moments(rng)
    figures = Counter()
    left_by = Counter()  # the file whose temporary a kill left (it was writing it)
    problems = []
    chain = None  # [folder, kills to go, pids killed]
    retried = False
    while moments:
        if chain is None:
            folder = tmp_path / f"run{figures['chains']:03d}"
            chain = [folder, rng.randint(*CHAIN), set()]
            figures["chains"] += 1
        folder, to_go, killed = chain
        if to_go == 0 or _finished(folder):  # the command that ends the chain, in this process
            problems += _end_chain(folder, capsys)
            figures["ended by a command in this process"] += 1
            chain = None
            continue
        name, fraction = moments[0]
        resume = (folder / "checkpoint.npz").is_file()
        argv = ["resume", str(folder), "--quiet"] if resume else [*TRAIN, "--out", str(folder)]
        before = set(_temporaries(folder))
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
            left = _temporaries(folder)
            problems += [
                f"{folder.name}: {n} is no killed command's" for n in left if _pid(n) not in killed
            ]
            writing = [n for n in left if n not in before]  # what it was writing
            left_by.update(re.sub(r"(\.[0-9]+)?\.[0-9a-f]{8}\.tmp$", "", n)[1:] for n in writing)
            figures["kills while plotting"] += any(n.startswith(PLOT_TEMPORARIES) for n in writing)
            bad = _half_written(folder)
            figures["half-written files"] += len(bad)
            problems += [f"{folder.name} after a kill of {argv[0]}: {b}" for b in bad]
        else:  # the command ended before the moment: its run is done, the moment retried once
            figures["commands that ended before their moment"] += 1
            if argv[0] == "train":  # a whole run, faster than the uncut ones
                run_length = min(run_length, time.monotonic() - t0)
            if p.exitcode != 0:
                problems.append(f"{folder.name}: {' '.join(argv)} exited {p.exitcode}")
            left = _temporaries(folder)
            figures["temporaries left"] += len(left)
            problems += [f"{folder.name}: {name} left by {argv[0]}" for name in left]
            if retried:
                moments.pop(0)
                figures["missed"] += 1
            retried = not retried
            chain = None
        p.close()
    if chain is not None:
        problems += _end_chain(chain[0], capsys)
    figures["temporaries left"] += sum(len(_temporaries(f)) for f in tmp_path.iterdir())
    with capsys.disabled():
        print(
            f"\nkill test: {dict(figures)}; kills while writing, by file: {dict(left_by)}; an "
            f"uncut run: {run_length:.2f} s, its writes "
            f"{', '.join(f'{k} {v:.3f} s' for k, v in write.items())}; in all "
            f"{time.monotonic() - started:.0f} s"
        )
    assert problems == []
    assert figures["kills"] >= 100 and figures["kills while plotting"] >= 10
    assert figures["half-written files"] == 0 and figures["temporaries left"] == 0


def _finished(folder):
    """Whether the run in ``folder`` wrote all its files (a chain is one run: its last)."""
    return all((folder / name).is_file() for name in RUN_FILES)


def _end_chain(folder, capsys):
    """Run the command that comes after the chain's last kill, in this process: ``evaluate``
    where the run finished, else ``resume`` (``train`` where no checkpoint was written). It
    removes every temporary, and names them in one line on standard error."""
    before = _temporaries(folder)
    if _finished(folder):
        argv = ["evaluate", str(folder)]
    elif (folder / "checkpoint.npz").is_file():
        argv = ["resume", str(folder), "--quiet"]
    else:
        argv = [*TRAIN, "--out", str(folder)]
    capsys.readouterr()
    rc = cli.main(argv)
    err = capsys.readouterr().err
    problems = [] if rc == 0 else [f"{folder.name}: {' '.join(argv)} exited {rc}"]
    problems += [f"{folder.name}: {name} left by {argv[0]}" for name in _temporaries(folder)]
    problems += [f"{folder.name}: {b}" for b in _half_written(folder)]
    said = [line for line in err.splitlines() if "temporary file(s)" in line]
    if before and not (
        len(said) == 1
        and f"fenchel-cvx {argv[0]}: removed {len(before)} temporary file(s)" in said[0]
        and all(name in said[0] for name in before)
    ):
        problems.append(f"{folder.name}: {argv[0]} removed {before} and said {said}")
    return problems
