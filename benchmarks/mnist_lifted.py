"""The paper's Figure 1: non-batched lifted methods against FLN and backprop, MNIST, MSE.

784-300-10 ReLU network, MSE on one-hot targets, all 60,000 training images in every
iteration (non-batched). Five methods on one entry point (``fenchel_cvx.baselines.lifted``):
Taylor et al. 2016 (ADMM), Lau et al. 2018 (proximal BCD), Askari et al. 2018 (lifted networks),
FLN (non-batched, fast backend; its X re-fed forward every round, ``restart=True``) and SGD
(backprop, lr 1e-2; iterations are epochs). All start
from the same Xavier weights and are scored the same way: the test accuracy of the feed-forward
network, after every iteration.

Prints and writes to ``--out``: ``results.json`` (one entry per method: curves, final test
accuracy, seconds per iteration), ``results.md`` (a markdown table beside the paper's figures)
and ``accuracy.png`` (test accuracy against iterations and against training seconds).

    python benchmarks/mnist_lifted.py --data-dir DIR    # the full run ($FENCHEL_DATA/mnist)
    python benchmarks/mnist_lifted.py --quick           # embedded 5k MNIST, about a minute
    python benchmarks/mnist_lifted.py --validation 10000 --methods fln --set fln.w_steps=4
                                                        # tune on the last 10,000 training images
    python benchmarks/mnist_lifted.py --validation 10000 --train-size 10000 --methods fln \
        --iterations fln=40 --set 'fln.rho=(1e-2,10)'  # a short tuning run on 10,000 images

``--set METHOD.NAME=VALUE`` overrides a hyperparameter (a Python literal); ``--iterations``
takes ``METHOD=N`` pairs. With ``--validation N`` the last N training images are held out and
play the test set's role (the test set is not read): tune there, never on the test set.
"""

import argparse
import ast
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import data  # noqa: E402
from common.devices import machine  # noqa: E402
from fenchel_cvx.baselines.lifted import METHODS, LiftedRun, fit_lifted  # noqa: E402
from fenchel_cvx.datasets import one_hot  # noqa: E402
from fenchel_cvx.heap import keep_freed_memory  # noqa: E402
from fenchel_cvx.io import atomic_write, write_text  # noqa: E402

PAPER = dict(taylor=0.834, lau=0.914, askari=0.863, sgd=0.957, fln=0.961)
ORDER = ("lau", "sgd", "fln", "askari", "taylor")
# iterations (epochs for SGD) of the full run recorded in docs/results.md, sized so that the five
# finish in under 45 minutes on 2 cores (Askari is flat after its first iteration)
FULL_ITERATIONS = dict(taylor=50, lau=30, askari=8, sgd=20, fln=150)
QUICK_ITERATIONS = dict(taylor=8, lau=8, askari=8, sgd=8, fln=5)
# the benchmark's FLN setting, tuned on a validation split (docs/lifted.md, "Tuning FLN"): X re-fed
# forward every round, rho_0 = 1 (the paper: 1e-2), inexact warm-started blocks
SETTINGS = dict(
    fln=dict(w_steps=2, x_steps=10, check_every=5, max_iter=10, restart=True, rho=(1.0, 10.0)),
    askari=dict(x_steps=10),
)


#: the lifted peers of FLN (``baselines.lifted``); they define ReLU and MSE only
PEERS = ("lau", "askari", "taylor")


def _pairs(text, flag, parse):
    out = {}
    for item in filter(None, text.split(",")):
        key, sep, val = item.partition("=")
        if not sep:
            raise argparse.ArgumentTypeError(f"{flag} takes KEY=VALUE pairs, got {item!r}")
        out[key.strip()] = parse(val.strip())
    return out


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    data.add_data_flags(p)
    p.add_argument("--methods", default=",".join(ORDER))
    p.add_argument("--iterations", default="", help="METHOD=N pairs overriding the defaults")
    p.add_argument("--set", action="append", default=[], help="METHOD.NAME=VALUE hyperparameter")
    p.add_argument(
        "--threads",
        type=int,
        default=1,
        help="BLAS threads (default 1: on a shared 2-core machine 2 threads ran 10x slower)",
    )
    p.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true", help="embedded 5k MNIST, few iterations")
    p.add_argument("--out", default=str(ROOT / "runs" / "mnist_lifted"))
    args = p.parse_args(argv)
    methods = args.methods.split(",")
    unknown = sorted(set(methods) - set(METHODS))
    if unknown:
        p.error(f"--methods must name {', '.join(ORDER)}; got {unknown}")
    try:
        iters = _pairs(args.iterations, "--iterations", int)
    except (argparse.ArgumentTypeError, ValueError) as e:
        p.error(f"--iterations: {e}")
    if set(iters) - set(METHODS) or any(n < 1 for n in iters.values()):
        p.error(
            f"--iterations must be METHOD=N with N >= 1 for known methods, got {args.iterations!r}"
        )
    hyper = {m: dict(SETTINGS.get(m, {})) for m in methods}
    for item in args.set:
        key, sep, val = item.partition("=")
        m, dot, name = key.partition(".")
        if not (sep and dot) or m not in hyper:
            p.error(f"--set takes METHOD.NAME=VALUE for a method of --methods, got {item!r}")
        try:
            hyper[m][name] = ast.literal_eval(val)
        except (ValueError, SyntaxError):
            p.error(f"--set {item!r}: VALUE must be a Python literal")
    for m in methods:  # refuse bad hyperparameters before any work
        try:
            METHODS[m](**hyper[m])
        except ValueError as e:
            p.error(f"--set {m}: {e}")
    if args.threads < 1:
        p.error(f"--threads must be >= 1, got {args.threads}")
    data.check_data_flags(p, args)
    base = QUICK_ITERATIONS if args.quick else FULL_ITERATIONS
    args.method_list, args.hyper = methods, hyper
    args.iters = {m: iters.get(m, base[m]) for m in methods}
    return args


def load(args):
    """``((X, Y, Xt, Yt), desc)``: the run's data (``common.data.load``) as contiguous arrays of
    ``--dtype``, the labels one-hot."""
    ds, desc = data.load(args)
    cast = lambda A: np.ascontiguousarray(A, dtype=np.dtype(args.dtype))  # noqa: E731
    Y, Yt = one_hot(ds.y_train, 10), one_hot(ds.y_test, 10)
    return (cast(ds.X_train), cast(Y), cast(ds.X_test), cast(Yt)), desc


def run_peer(args, ds, method):
    """A lifted peer (``PEERS``) of ``args.width`` x ``args.depth`` hidden units on the whole
    training set, ``args.peer_iterations[method]`` full-batch iterations at this benchmark's
    setting, scored on the test set after each; where it fails, the reason (``not_run``) in place
    of its curve (another benchmark's hook: ``mnist_deep.py``)."""
    from fenchel_cvx.baselines.lifted import fit_lifted

    dtype = np.dtype(args.dtype)
    cast = lambda A: np.ascontiguousarray(A, dtype=dtype)  # noqa: E731
    data = (cast(ds.X_train), cast(one_hot(ds.y_train, 10)))
    data += (cast(ds.X_test), cast(one_hot(ds.y_test, 10)))
    try:
        run = fit_lifted(
            method,
            *data,
            hidden=(args.width,) * args.depth,
            iterations=args.peer_iterations[method],
            seed=args.seed,
            **SETTINGS.get(method, {}),
        )
    except (ArithmeticError, ValueError, np.linalg.LinAlgError, MemoryError) as err:
        return dict(not_run=f"{type(err).__name__}: {err}", test_accuracy=[], seconds=[])
    return dict(
        initial_test_accuracy=run.initial_test_accuracy,
        test_accuracy=run.series("test_accuracy").tolist(),
        seconds=run.series("seconds").tolist(),
        iterations=len(run.records),
    )


def summarise(runs, args, desc, wall):
    rows = {}
    for name, run in runs.items():
        rows[name] = dict(
            final_test_accuracy=run.final_test_accuracy,
            paper=PAPER[name],
            iterations=len(run.records),
            seconds_per_iteration=run.seconds_per_iteration,
            train_seconds=run.records[-1]["seconds"],
            wall=wall[name],
        )
    return dict(
        data=desc,
        settings={k: v for k, v in vars(args).items() if k != "method_list"},
        machine=machine(args),
        methods=rows,
        total_seconds=sum(wall.values()),
        raw={n: r.to_dict() for n, r in runs.items()},
    )


def markdown(summary):
    lines = [
        f"MNIST 784-300-10, ReLU, MSE, non-batched ({summary['data']}), "
        f"{summary['machine']['threads']} threads, {summary['settings']['dtype']}",
        "",
        "| method | final test acc | paper | iterations | s / iteration | train s | wall s |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, r in summary["methods"].items():
        lines.append(
            f"| {name} | {r['final_test_accuracy']:.4f} | {r['paper']:.3f} | {r['iterations']} | "
            f"{r['seconds_per_iteration']:.2f} | {r['train_seconds']:.1f} | {r['wall']:.1f} |"
        )
    lines.append(f"\ntotal wall time: {summary['total_seconds']:.0f} s")
    return "\n".join(lines) + "\n"


def plot(summary, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4))
    for name, d in summary["raw"].items():
        run = LiftedRun.from_dict(d)
        it = np.concatenate([[0], run.series("iteration")])
        sec = np.concatenate([[0], run.series("seconds")])
        acc = np.concatenate([[run.initial_test_accuracy], run.series("test_accuracy")])
        label = f"{name} ({acc[-1]:.3f}; paper {PAPER[name]:.3f})"
        a1.plot(it, acc, label=label)
        a2.plot(sec, acc, label=label)
    for ax, xl in ((a1, "iterations (epochs for SGD)"), (a2, "training seconds")):
        ax.set_xlabel(xl)
        ax.set_ylabel("test accuracy")
        ax.set_ylim(0.5, 1.0)
        ax.legend(fontsize=8)
    fig.tight_layout()
    atomic_write(path, lambda f: fig.savefig(f, format="png", dpi=110))  # never half-written
    plt.close(fig)


def write(out, summary):
    for name, text in (
        ("results.json", json.dumps(summary, indent=1, default=str)),
        ("results.md", markdown(summary)),
    ):
        write_text(out / name, text)
    plot(summary, out / "accuracy.png")


def main(argv=None):
    from threadpoolctl import threadpool_limits

    args = parse_args(argv)
    keep_freed_memory()  # the full-batch temporaries reuse the heap (``fenchel_cvx.heap``)
    (X, Y, Xt, Yt), desc = load(args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    runs, wall = {}, {}
    for m in args.method_list:
        print(f"{m} ({args.iters[m]} iterations, {args.hyper[m] or 'defaults'}):", flush=True)
        hyper = dict(args.hyper[m], threads=args.threads) if m == "sgd" else args.hyper[m]
        t = time.perf_counter()
        with threadpool_limits(args.threads):
            runs[m] = fit_lifted(
                m,
                X,
                Y,
                Xt,
                Yt,
                iterations=args.iters[m],
                seed=args.seed,
                callback=lambda r: print(
                    f"  {r.method} {len(r.records)}: test accuracy "
                    f"{r.records[-1]['test_accuracy']:.4f}, "
                    f"{r.records[-1]['seconds']:.1f} s",
                    flush=True,
                ),
                **hyper,
            )
        wall[m] = time.perf_counter() - t
        summary = summarise(runs, args, desc, wall)
        write(out, summary)  # after every method: a partial run keeps what it has
    print(markdown(summary))
    print(f"wrote {out / 'results.json'}, {out / 'results.md'}, {out / 'accuracy.png'}")


if __name__ == "__main__":
    main()
