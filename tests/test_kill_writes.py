"""A run killed while writing leaves no half-written file, and the next command its temporaries.

Every file goes through ``io.atomic_write``: a temporary ``.<name>.<pid>.<random>.tmp`` beside
the target, renamed over it. ``io.remove_temporaries`` deletes the temporaries whose writer is
gone and never a live writer's; every command in a run folder calls it.

The unit tests: a live writer's temporary is kept (this process, in the middle of a write), a
SIGKILLed writer's is removed, so are one of a zombie and one older than its pid's process (the
pid reused), and one named before pids were; ``predict`` removes a dead writer's and says so.

The kill test (``slow``): ``benchmarks/kill_writes.py``'s ``kill_test`` with 30 seeded moments
(the script's default, 110, is the long run): ``fenchel-cvx train`` and ``resume`` SIGKILLed in
chains of commands, some while a file is written (the plots among them); after every kill no
final-named file is half-written and every temporary is a killed command's, and after the
command that ends a chain none is left and that command named those it removed.
"""

import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import fenchel_cvx
from _benchmarks import import_benchmark
from fenchel_cvx import cli
from fenchel_cvx.io import atomic_write, remove_temporaries

kill_writes = import_benchmark("kill_writes")  # (its forked commands' functions pickle by name)
temporaries, writer_pid = kill_writes.temporaries, kill_writes.writer_pid
HANG = 120  # a guard on every wait


def _killed(script, path):
    """The process that ran ``script`` on ``path`` (``sys.argv[1]``) with this checkout's
    package, once it has SIGKILLed itself."""
    root = str(Path(fenchel_cvx.__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, "-c", script, str(path)], env=env)
    assert proc.wait(timeout=HANG) == -signal.SIGKILL
    return proc


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
    assert writer_pid(name) == os.getpid() and name.startswith(".checkpoint.npz.")
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
    proc = _killed(script, tmp_path / "history.json")
    left = temporaries(tmp_path)
    assert len(left) == 1 and writer_pid(left[0]) == proc.pid  # named with its writer's pid
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


def test_a_killed_folder_checks_probe_blocks_no_run_and_is_removed(tmp_path, capsys):
    """``train`` proves its folder writable by a probe file it creates and deletes
    (``io.check_writable_dir``); one killed between the two leaves the probe, named as every
    temporary (``.probe.<pid>.<random>.tmp``). The next ``train`` into that folder reuses it,
    removes the probe and says so (a probe named otherwise read as a run's file, and the
    folder was refused: the kill test met it under load)."""
    script = (
        "import os, signal, sys\n"
        "from fenchel_cvx import io\n"
        "io.os.unlink = lambda path: os.kill(os.getpid(), signal.SIGKILL)\n"
        "io.check_writable_dir('--out', sys.argv[1])\n"
    )
    out = tmp_path / "run"
    proc = _killed(script, out)
    (probe,) = [p.name for p in out.iterdir()]
    assert probe.startswith(".probe.") and writer_pid(probe) == proc.pid
    assert cli.main([*kill_writes.TRAIN, "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert "fenchel-cvx train: removed 1 temporary file(s)" in err and probe in err
    assert not (out / probe).exists() and (out / "model.npz").is_file()


# --- SIGKILL at seeded moments ------------------------------------------------------------------
@pytest.mark.slow
def test_sigkill_at_seeded_moments_leaves_whole_files_and_no_temporaries(tmp_path, capsys):
    figures, problems = kill_writes.kill_test(tmp_path, kills=30)
    with capsys.disabled():
        print(f"\nkill test: {dict(figures)}")
    assert problems == []
    assert figures["kills"] >= 25 and figures["kills while plotting"] >= 3
    assert figures["kills of resume"] > 0
    assert figures["half-written files"] == 0 and figures["temporaries left"] == 0
