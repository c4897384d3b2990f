"""SIGKILL (or SIGSTOP) one rank of a 2-rank training run at seeded moments: the run stops
naming the rank, its files stay whole, and ``resume`` ends where the uninterrupted run ends,
bit for bit.

``fenchel-cvx train --nproc 2`` (the fast backend on the embedded digits, batches of 100, a
checkpoint every round) runs once uncut: its model is the reference, and the span in which its
rank 1 (the command's spawned process) lived sets the moments. For each of ``--kills``
moments drawn from ``--seed`` (uniform in that span less its last tenth, in seconds after the
command starts), the same command starts in a new folder and, at the moment, rank 1 gets
SIGKILL, or with ``--signal stop`` SIGSTOP (a rank that hangs: its process lives, stopped);
``--signal kill stop`` cuts a run at each moment with each, beside the one uncut run. Each kill
is judged:

- the command exits with an error within ``LIMIT`` seconds of the kill, its message naming
  rank 1 (``parallel.Ranks``: rank 0's collective fails, or its wait for the rank to join,
  and the rank's exit code is named; a stopped rank is named as hung once its heartbeat is
  ``heartbeat.hang_seconds()`` old, 30 s), and no rank 1 is left behind;
- every run file in the folder is whole: ``run.json`` and ``history.json`` parse, the ``.npz``
  files load every array (no pickle); a temporary left is one of a killed writer's;
- ``fenchel-cvx resume`` on the folder (2 ranks again, from the last checkpoint; where none
  was written, ``train`` anew) ends with the uncut run's ``model.npz``, every array equal.

A moment at which the command has no rank 1 (not yet started, or ended) is reported as missed.
Prints a line per kill and a summary per signal; the exit status is 1 if any check failed.

    python benchmarks/rank_faults.py --kills 10 --seed 0 --epochs 10 [--signal kill stop]
"""

import argparse
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from common.run_files import half_written

ROOT = Path(__file__).resolve().parents[1]
#: the run: the fast backend on the embedded digits, 2 ranks, a checkpoint every round
#: (``--epochs`` epochs follow)
TRAIN = [
    "train", "--backend", "fast", "--batch-size", "100", "--arch", "64-32-10",
    "--nproc", "2", "--threads", "1", "--checkpoint-every", "1", "--quiet", "--no-baseline",
]  # fmt: skip
#: how long after the kill the command must have ended (seconds)
LIMIT = 60.0
#: ``--signal``'s choices
SIGNALS = {"kill": signal.SIGKILL, "stop": signal.SIGSTOP}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--kills", type=int, default=10, help="moments to kill rank 1 at (default 10)")
    p.add_argument("--seed", type=int, default=0, help="draws the moments (default 0)")
    p.add_argument("--epochs", type=int, default=10, help="the run's epochs (default 10)")
    p.add_argument(
        "--signal", nargs="+", choices=sorted(SIGNALS), default=["kill"],
        help="what rank 1 gets at each moment, a run for each signal given: kill (SIGKILL: its "
        "process ends), stop (SIGSTOP: it hangs)",
    )  # fmt: skip
    args = p.parse_args(argv)
    for flag in ("kills", "epochs"):
        if getattr(args, flag) < 1:
            p.error(f"--{flag} must be >= 1, got {getattr(args, flag)}")
    return args


def command(*flags):
    return [sys.executable, "-m", "fenchel_cvx", *flags]


def spawned_rank(pid):
    """The pid of the command's spawned rank (a child running multiprocessing's spawn, not its
    resource tracker), or None while there is none."""
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return None
    for child in children:
        line = cmdline(child)
        if b"spawn_main" in line and b"resource_tracker" not in line:
            return int(child)
    return None


def cmdline(pid):
    """The command line of process ``pid`` (empty where it has ended)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
    except OSError:
        return b""


def same_model(a, b):
    with np.load(a, allow_pickle=False) as za, np.load(b, allow_pickle=False) as zb:
        return za.files == zb.files and all(np.array_equal(za[k], zb[k]) for k in za.files)


def one_kill(base, train, at, reference, name, sig=signal.SIGKILL):
    """Send ``sig`` to rank 1 of ``train`` (the run's flags) ``at`` seconds after the command
    starts, in a new folder, ``name``: its verdict."""
    out = base / name
    proc = subprocess.Popen(
        command(*train, "--out", str(out)), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, cwd=base,
    )  # fmt: skip
    t0 = time.monotonic()
    while time.monotonic() - t0 < at and proc.poll() is None:
        time.sleep(0.01)
    rank = spawned_rank(proc.pid)
    if proc.poll() is not None or rank is None:
        proc.communicate()
        return dict(at=at, missed=True)
    os.kill(rank, sig)
    killed = time.monotonic()
    try:
        _, err = proc.communicate(timeout=LIMIT + 60)
    except subprocess.TimeoutExpired:
        err = None
    ended = time.monotonic() - killed
    left = Path(f"/proc/{rank}").exists() and b"spawn_main" in cmdline(rank)
    if left:  # (a stopped rank that the command left behind: a failure, cleaned up here)
        os.kill(rank, signal.SIGKILL)
    if err is None:  # (the command hung: ended here, once no rank of it holds its pipes)
        proc.kill()
        _, err = proc.communicate()
    named = "rank 1" in err
    broken = half_written(out)
    if (out / "checkpoint.npz").is_file():
        how, flags, model = "resumed", ["resume", str(out), "--quiet"], out / "model.npz"
    else:  # (killed before its first checkpoint: nothing to resume, the run starts anew)
        how, flags = "started anew", [*train, "--out", str(out / "anew")]
        model = out / "anew" / "model.npz"
    again = subprocess.run(command(*flags), capture_output=True, text=True, cwd=base, timeout=600)
    resumed = again.returncode == 0 and same_model(model, reference)
    ok = proc.returncode != 0 and ended <= LIMIT and named and not left and not broken and resumed
    return dict(
        at=at, missed=False, code=proc.returncode, ended_s=ended, named=named, broken=broken,
        left=left, how=how, resumed=resumed, ok=ok,
        message=err.strip().splitlines()[-1] if err.strip() else "",
    )  # fmt: skip


def uncut(base, train):
    """The uncut run of ``train`` in ``base / "uncut"``: ``((first, last), length)``, the seconds
    after its start at which its rank 1 was first and last seen, and the command's length."""
    proc = subprocess.Popen(
        command(*train, "--out", str(base / "uncut")), stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, cwd=base,
    )  # fmt: skip
    t0, seen = time.monotonic(), []
    while proc.poll() is None:
        if spawned_rank(proc.pid) is not None:
            seen.append(time.monotonic() - t0)
        time.sleep(0.01)
    _, err = proc.communicate()
    if proc.returncode != 0 or not seen:
        raise SystemExit("the uncut run failed (or started no rank):\n" + err[-3000:])
    return (seen[0], seen[-1]), time.monotonic() - t0


def main(argv=None):
    args = parse_args(argv)
    train = [*TRAIN, "--epochs", str(args.epochs)]
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        span, length = uncut(base, train)
        print(
            f"uncut run: {length:.1f} s, its rank 1 alive from {span[0]:.1f} s to {span[1]:.1f} s "
            f"(2 ranks, fast backend, digits, {args.epochs} epochs)",
            flush=True,
        )
        rng = random.Random(args.seed)
        first, last = span  # (the last tenth: the rank's end, where a run's may come sooner)
        moments = sorted(
            rng.uniform(first, first + 0.9 * (last - first)) for _ in range(args.kills)
        )
        verdicts = {sig: [] for sig in args.signal}
        for n, at in enumerate(moments):
            for sig, kept in verdicts.items():
                v = one_kill(
                    base, train, at, base / "uncut" / "model.npz", f"{sig}{n}", SIGNALS[sig]
                )
                kept.append(v)
                if v["missed"]:
                    print(f"{sig} {n} at {at:.1f} s: missed (no rank 1 then)", flush=True)
                    continue
                print(
                    f"{sig} {n} at {at:.1f} s: exit {v['code']} {v['ended_s']:.2f} s after the "
                    f"kill, rank 1 named: {v['named']}, left behind: {v['left']}, "
                    f"files whole: {not v['broken']}, {v['how']}, "
                    f"ends equal: {v['resumed']} -> {'ok' if v['ok'] else 'FAILED'} "
                    f"({v['message'][:120]})",
                    flush=True,
                )
    failed = 0
    for sig, kept in verdicts.items():
        judged = [v for v in kept if not v["missed"]]
        failed_here = sum(not v["ok"] for v in judged)
        failed += failed_here
        slowest = max((v["ended_s"] for v in judged), default=float("nan"))
        print(
            f"{len(judged)} SIG{sig.upper()}s judged ({len(kept) - len(judged)} missed), "
            f"{failed_here} failed; "
            f"the slowest stop {slowest:.2f} s after its kill (limit {LIMIT:.0f} s)"
        )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
