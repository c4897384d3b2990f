"""Seconds per iteration of Figure 1's methods with malloc's defaults against the kept heap.

``fenchel_cvx.heap.keep_freed_memory`` keeps freed blocks in malloc's free lists, so a NumPy
temporary of the size of one just freed reuses it instead of faulting in new pages. The setting
is the process's and cannot be undone, so each measurement runs in a fresh process: for every
repeat, each method of ``--methods`` (``benchmarks/mnist_lifted.py``'s, at its settings) runs
``--iterations`` full-batch iterations on the full MNIST with malloc's defaults, then with the
kept heap (alternating, so that drift on a shared machine falls on both). Prints each run's
seconds per iteration (the first, which pays one-off costs, apart), its peak memory and the
final test accuracy (the same in both: the setting changes no arithmetic), and the ratio.

    python benchmarks/heap_ab.py --methods fln,lau --iterations 5 --repeats 2
    python benchmarks/heap_ab.py --quick --iterations 2 --repeats 1   # a smoke run
"""

import argparse
import json
import resource
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common.data import add_data_flags  # noqa: E402

MODES = ("system", "kept")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--methods", default="fln,lau", help="methods of benchmarks/mnist_lifted.py")
    p.add_argument("--iterations", type=int, default=5)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--threads", type=int, default=1)
    add_data_flags(p, validation=False, train_size=False)
    p.add_argument("--quick", action="store_true", help="the embedded 5k MNIST: a smoke run")
    p.add_argument("--child", nargs=2, metavar=("METHOD", "MODE"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    from fenchel_cvx.baselines.lifted import METHODS

    args.method_list = args.methods.split(",")
    unknown = sorted(set(args.method_list) - set(METHODS))
    if unknown:
        p.error(f"--methods must name methods of {sorted(METHODS)}; got {unknown}")
    for flag in ("iterations", "repeats", "threads"):
        if getattr(args, flag) < 1:
            p.error(f"--{flag} must be >= 1, got {getattr(args, flag)}")
    return args


def child(args, method, mode):
    """One run in this process: malloc's defaults, or the kept heap; its figures as JSON."""
    from fenchel_cvx.heap import keep_freed_memory

    kept = keep_freed_memory() if mode == "kept" else False
    from threadpoolctl import threadpool_limits

    import mnist_lifted
    from fenchel_cvx.baselines.lifted import fit_lifted

    flags = ["--methods", method, "--threads", str(args.threads)] + ["--quick"] * args.quick
    largs = mnist_lifted.parse_args(
        flags + (["--data-dir", args.data_dir] if args.data_dir else [])
    )
    data, _ = mnist_lifted.load(largs)
    with threadpool_limits(args.threads):
        run = fit_lifted(method, *data, iterations=args.iterations, **largs.hyper[method])
    steps = run.series("step_seconds")
    return dict(
        method=method,
        mode=mode,
        kept=kept,
        first=float(steps[0]),
        per_iteration=float(np.mean(steps[1:])) if len(steps) > 1 else float(steps[0]),
        peak_mib=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        accuracy=run.final_test_accuracy,
    )


def main(argv=None):
    args = parse_args(argv)
    if args.child:
        print(json.dumps(child(args, *args.child)))
        return
    rows = []
    for r in range(args.repeats):
        for method in args.method_list:
            for mode in MODES:
                flags = sys.argv[1:] if argv is None else list(argv)
                cmd = [sys.executable, __file__, *flags, "--child", method, mode]
                out = subprocess.run(cmd, capture_output=True, text=True, check=True)
                row = json.loads(out.stdout.strip().splitlines()[-1])
                rows.append(row)
                print(
                    f"repeat {r + 1}, {method}, {mode}: {row['per_iteration']:.2f} s / iteration "
                    f"(first {row['first']:.2f}), peak {row['peak_mib']:.0f} MiB, "
                    f"accuracy {row['accuracy']:.4f}",
                    flush=True,
                )
    for method in args.method_list:
        mean = {
            m: np.mean(
                [r["per_iteration"] for r in rows if r["method"] == method and r["mode"] == m]
            )
            for m in MODES
        }
        print(
            f"{method}: {mean['system']:.2f} s / iteration with malloc's defaults, "
            f"{mean['kept']:.2f} with the kept heap ({mean['kept'] / mean['system']:.2f}x)"
        )


if __name__ == "__main__":
    main()
