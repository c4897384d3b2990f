"""The backprop baselines' learning rates, chosen from a grid on the split FLN was tuned on.

For one MNIST benchmark (``--network mlp``: ``mnist_mlp.py``'s 784-300-10; ``--network lenet5``:
``mnist_lenet5.py``'s LeNet-5) it trains SGD (heavy-ball momentum 0 and 0.9) and Adam at each
learning rate of a grid, on the benchmark's own validation split (its ``--validation 10000``:
the last 10,000 training images, ``common.data``'s rule for every network;
the test set is never read), for the benchmark's epochs or those of ``--epochs`` and
``--train-size`` (LeNet-5's grid below: its FLN screens' protocol, 10 epochs on the first
20,000 of the other images), with its batches (``batch_order``), its
initial weights and its training code (the benchmark's ``run_backprop``). Each setting's score is
the validation accuracy after the last epoch; per optimizer setting the chosen rate is the one
with the highest score (a tie: the higher mean over the epochs, then the larger rate).

Writes to ``--out``: ``tune_<network>.json`` (every setting's validation accuracy after each
epoch and training seconds, the chosen rates, the paper's), ``tune_<network>.md`` (the tables:
setting -> validation accuracy) and ``tune_<network>.png`` (the curves, one panel per optimizer
setting).

    python benchmarks/tune_baselines.py --network mlp          # 10 epochs, 18 settings
    python benchmarks/tune_baselines.py --network lenet5 --train-size 20000 --epochs 10 \
        --sgd-lrs 1,0.3,0.1,0.03,0.01 --sgd-momentum-lrs 0.1,0.03,0.01,0.003,0.001 \
        --adam-lrs 0.03,0.01,0.003,0.001,3e-4,1e-4
    python benchmarks/tune_baselines.py --network mlp --quick  # embedded 5k MNIST, 2 epochs

``--resume`` a previous report widens its grid without training its rates again. The reports of
the two commands above, whose choices are the benchmarks' ``TUNED_LR``, are
``benchmarks/results/tune_baselines_<network>.json``.
"""

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))

import mnist_lenet5  # noqa: E402
import mnist_mlp  # noqa: E402
from common import flags  # noqa: E402
from common.data import add_data_flags  # noqa: E402
from fenchel_cvx.datasets import batch_order  # noqa: E402
from fenchel_cvx.io import atomic_write, write_text  # noqa: E402
from fenchel_cvx.threads import limit_threads  # noqa: E402

#: --network -> the benchmark module
NETWORKS = {"mlp": mnist_mlp, "lenet5": mnist_lenet5}
#: the optimizer settings: key -> (optimizer, momentum), the keys of the benchmarks' TUNED_LR
SETTINGS = {
    "sgd": ("sgd", 0.0),
    "sgd_momentum": ("sgd", flags.TUNED_MOMENTUM),
    "adam": ("adam", 0.0),
}
#: the default grid per setting: half decades from the paper's rates up (SGD with momentum mu
#: takes steps of about lr / (1 - mu), so its grid sits a decade lower)
GRID = {
    "sgd": (3.0, 1.0, 0.3, 0.1, 0.03, 0.01),
    "sgd_momentum": (1.0, 0.3, 0.1, 0.03, 0.01, 0.003, 0.001),
    "adam": (0.01, 0.003, 0.001, 3e-4, 1e-4),
}
#: the last training images held out, as for the FLN screens (docs page "Tuning")
VALIDATION = 10000
QUICK_VALIDATION = 1000
#: the benchmarks' --eval-every here: no checkpoints between epochs (the score is per epoch)
EVAL_NEVER = 10**9


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--network",
        required=True,
        choices=sorted(NETWORKS),
        help="the benchmark's network: mlp (mnist_mlp.py, 784-300-10) or lenet5 (mnist_lenet5.py)",
    )
    add_data_flags(p, validation=False, train_size=False)
    p.add_argument(
        "--epochs",
        type=int,
        default=None,
        help="default: the benchmark's (MLP 10, LeNet-5 20; --quick 2)",
    )
    p.add_argument(
        "--validation",
        type=int,
        default=None,
        help=f"held-out training images (default {VALIDATION:,}; --quick {QUICK_VALIDATION:,})",
    )
    p.add_argument(
        "--train-size",
        type=int,
        default=None,
        help="LeNet-5 only: train on the first "
        "N images left after the split (its FLN screens' 20,000; default: all)",
    )
    for key in SETTINGS:
        flag = f"--{key.replace('_', '-')}-lrs"
        p.add_argument(
            flag,
            type=flags.learning_rates(flag),
            default=GRID[key],
            help=f"the grid of {key}'s learning rates (default {','.join(map(str, GRID[key]))})",
        )
    p.add_argument(
        "--settings",
        default=",".join(SETTINGS),
        help=f"the optimizer settings to tune (default {','.join(SETTINGS)})",
    )
    p.add_argument(
        "--resume",
        default=None,
        help="a previous tune_<network>.json of the same "
        "network, split, epochs and seed: its runs are kept, the grid's other rates "
        "trained (the grid: both sets of rates)",
    )
    p.add_argument("--seed", type=int, default=0, help="initial weights and batch order")
    p.add_argument("--threads", type=int, default=1, help="PyTorch's threads")
    p.add_argument("--quick", action="store_true", help="embedded 5k MNIST, 2 epochs: a smoke run")
    p.add_argument("--out", default=str(ROOT.parent / "runs" / "tune_baselines"))
    args = p.parse_args(argv)
    for name in ("epochs", "validation", "train_size", "threads"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.seed < 0:
        p.error(f"--seed must be >= 0, got {args.seed}")
    unknown = set(args.settings.split(",")) - set(SETTINGS)
    if unknown:
        p.error(f"--settings must name {', '.join(SETTINGS)}; got {sorted(unknown)}")
    if args.validation is None:
        args.validation = QUICK_VALIDATION if args.quick else VALIDATION
    return args


def benchmark_args(args):
    """The benchmark's own parsed arguments for this tuning run (its split, epochs, batches)."""
    bench = NETWORKS[args.network]
    argv = [
        "--methods",
        "adam,sgd",
        "--validation",
        str(args.validation),
        "--seed",
        str(args.seed),
        "--threads",
        str(args.threads),
        "--eval-every",
        str(EVAL_NEVER),
    ]
    argv += ["--epochs", str(args.epochs)] if args.epochs else []
    argv += ["--quick"] if args.quick else []
    argv += ["--no-progress"] if bench is mnist_lenet5 else []
    argv += ["--train-size", str(args.train_size)] if args.train_size else []
    argv += ["--data-dir", args.data_dir] if args.data_dir else []
    return bench.parse_args(argv)


def score(curve):
    """The order of settings: the last epoch's validation accuracy, then the mean over epochs."""
    return (curve[-1], float(np.mean(curve)))


def previous_runs(path, header):
    """``--resume``: the runs of a previous report (checked: readable, and of the same
    ``header``: network, split, epochs, batches and seed) by (setting, lr)."""
    try:
        report = json.loads(Path(path).read_text())
        runs = {(r["setting"], float(r["lr"])): r for r in report["runs"]}
        same = {k: report[k] for k in header}
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise SystemExit(
            f"--resume must be a tune_<network>.json report, got {path}: "
            f"{type(err).__name__}: {err}"
        ) from None
    if same != header:
        raise SystemExit(f"--resume {path} is of another run: {same}, this one {header}")
    return runs


def tune(args):
    """Every setting of the grid on the validation split -> the report's dict."""
    bench, bargs = NETWORKS[args.network], benchmark_args(args)
    ds, data_desc = bench.load(bargs)
    header = dict(
        network=args.network,
        data=data_desc,
        validation=args.validation,
        train_images=int(ds.X_train.shape[1]),
        epochs=bargs.epochs,
        batch_size=bargs.batch_size,
        seed=args.seed,
    )
    kept = previous_runs(args.resume, header) if args.resume else {}
    batches = batch_order(ds.X_train.shape[1], bargs.batch_size, bargs.epochs, seed=args.seed)
    runs, chosen = [], {}
    for key in args.settings.split(","):
        optimizer, momentum = SETTINGS[key]
        grid = set(getattr(args, f"{key}_lrs")) | {lr for k, lr in kept if k == key}
        for lr in sorted(grid, reverse=True):
            if (key, lr) in kept:
                runs.append(kept[key, lr])
                continue
            one = argparse.Namespace(
                **{**vars(bargs), f"{optimizer}_lr": lr, "sgd_momentum": momentum}
            )
            print(f"{args.network} {key} lr {lr:g}:", flush=True)
            t = time.perf_counter()
            with limit_threads(args.threads):
                record = bench.run_backprop(one, ds, batches, optimizer)
            runs.append(
                dict(
                    setting=key,
                    optimizer=optimizer,
                    momentum=momentum,
                    lr=lr,
                    validation_accuracy=record["test_accuracy"],
                    training_seconds=record["seconds"][-1],
                    wall=time.perf_counter() - t,
                )
            )
        best = max(
            (r for r in runs if r["setting"] == key), key=lambda r: score(r["validation_accuracy"])
        )
        chosen[key] = best["lr"]
    return dict(
        header,
        threads=args.threads,
        momentum=flags.TUNED_MOMENTUM,
        chosen=chosen,
        paper=flags.PAPER_LR,
        runs=runs,
    )


def markdown(report):
    """The tables: per optimizer setting, learning rate -> validation accuracy after the first,
    second, middle and last epochs; the chosen rate in bold."""
    n = report["epochs"]
    shown = sorted({1, min(2, n), max(1, n // 2), n})
    lines = [
        f"{report['network']}: {report['data']}; {report['train_images']:,} training images, "
        f"{n} epochs, batch {report['batch_size']}, seed {report['seed']}",
        "",
    ]
    for key, lr in report["chosen"].items():
        optimizer, momentum = SETTINGS[key]
        lines += [
            f"{optimizer}, momentum {momentum:g}:",
            "",
            "| learning rate | " + " | ".join(f"ep {e}" for e in shown) + " |",
            "|---" * (len(shown) + 1) + "|",
        ]
        for r in (r for r in report["runs"] if r["setting"] == key):
            acc = [f"{r['validation_accuracy'][e - 1]:.4f}" for e in shown]
            if r["lr"] == lr:
                acc[-1] = f"**{acc[-1]}**"
            name = f"**{r['lr']:g}** (chosen)" if r["lr"] == lr else f"{r['lr']:g}"
            lines.append(f"| {name} | " + " | ".join(acc) + " |")
        lines.append("")
    lines.append("Chosen: " + ", ".join(f"{key} {lr:g}" for key, lr in report["chosen"].items()))
    return "\n".join(lines) + "\n"


def plot(report, path):
    """Validation accuracy against epochs, one panel per optimizer setting, one line per rate."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = list(report["chosen"])
    fig, axes = plt.subplots(1, len(keys), figsize=(4.2 * len(keys), 3.6), squeeze=False)
    for ax, key in zip(axes[0], keys):
        for r in (r for r in report["runs"] if r["setting"] == key):
            acc = r["validation_accuracy"]
            ax.plot(range(1, len(acc) + 1), acc, marker=".", label=f"lr {r['lr']:g}")
        optimizer, momentum = SETTINGS[key]
        ax.set_title(f"{report['network']}: {optimizer}, momentum {momentum:g}")
        ax.set_xlabel("epoch")
        ax.set_ylabel("validation accuracy")
        best = max(max(r["validation_accuracy"]) for r in report["runs"] if r["setting"] == key)
        ax.set_ylim(max(0.0, best - 0.1), min(1.0, best + 0.01))
        ax.legend(fontsize=7)
    fig.tight_layout()
    atomic_write(path, lambda f: fig.savefig(f, format="png", dpi=100))
    plt.close(fig)


def main(argv=None):
    args = parse_args(argv)
    report = tune(args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = out / f"tune_{args.network}"
    write_text(stem.with_suffix(".json"), json.dumps(report, indent=1))
    table = markdown(report)
    write_text(stem.with_suffix(".md"), table)
    plot(report, stem.with_suffix(".png"))
    print(table)
    print(f"wrote {stem}.json, .md, .png")
    return report


if __name__ == "__main__":
    main()
