"""FLN on deep networks, the paper's future work (its Sec. 6): test accuracy against depth.

Networks 784-(width x depth)-10 (``--width``, default 300; ``--depths``, default 1, 2, 4, 8,
16 hidden layers), ReLU or tanh (``--activation``), cross-entropy, batch 500, 10 epochs on the
full MNIST. Every method trains the same architecture from the same initial weights on the same
batches in the same order (``datasets.batch_order``), each in its own process (its peak memory
its own), with the same thread count:

- FLN, the batched model (Algorithm 2) on the fast backend, in the package's dense training
  setting for that depth (``defaults.training("dense", depth, batched=True)``: the rule of
  ``defaults.Dense.for_layers``, which at depth 1 is the MNIST MLP's tuned setting). A ``Plan``
  (``run_fln(..., plan)``) trains it otherwise: another per-layer setting, more alternations, the
  He or orthogonal initialisation (``initialise``), a layer-wise lam schedule
  (``benchmarks/deep_screen.py`` screens them);
- Adam and SGD in PyTorch (``baselines.train_backprop``), each at the learning rate chosen per
  depth from a grid (``--adam-lrs``, ``--sgd-lrs``) on a validation split, as FLN's setting was
  chosen: ``--tune-epochs`` epochs on 50,000 of the training images, validated on the other
  10,000 (``mnist_mlp.load``'s split), seed 0; the test set is read by the final runs only.
  ``--no-tune`` takes the MNIST MLP's tuned rates instead (``mnist_mlp.TUNED_LR``).

FLN records, on every checked round (every ``--check-every`` rounds and each epoch's last), each
layer's divergence ``B_l`` (the history's ``divergence_x``, after the X-sweep) and the relaxation
gap ``J - F`` of the batch (``network_x - lifted_x``: the network objective against its lifted
lower bound, the paper's eqs. (7) and (3)), so that where depth makes FLN fail can be seen.

Prints and writes to ``--out``: ``results.json`` (every run, with its per-epoch accuracy and
seconds, the tuning grid's validation accuracies and FLN's relaxation log), ``results.md`` (a
table per depth: test accuracy, mean and spread over seeds, seconds per epoch, peak memory, the
chosen learning rate) and ``accuracy_vs_depth.png``.

    python benchmarks/mnist_deep.py                          # depths 1-16, width 300, ReLU
    python benchmarks/mnist_deep.py --activation tanh --depths 4,8
    python benchmarks/mnist_deep.py --quick                  # embedded 5k MNIST: a smoke run
"""

import argparse
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from fenchel_cvx import defaults  # noqa: E402
from fenchel_cvx.activations import activation_names  # noqa: E402
from fenchel_cvx.datasets import one_hot  # noqa: E402
from fenchel_cvx.io import atomic_write  # noqa: E402
from mnist_mlp import (  # noqa: E402
    TUNED_LR,
    add_compile_flag,
    backprop_record,
    fln_backend,
    learning_rates,
    load,
    machine,
    peak_text,
    run_methods,
    seed_summary,
    train_fln,
    write_report,
)

DEPTHS = (1, 2, 4, 8, 16)
ADAM_LRS = (3e-4, 1e-3, 3e-3, 1e-2)
SGD_LRS = (0.01, 0.03, 0.1, 0.3, 1.0)
#: the initialisations of FLN's hidden-layer weights (``initialise``)
INITS = ("xavier", "he", "orthogonal")
#: the training images held out to choose the baselines' learning rates (``mnist_mlp.load``)
VALIDATION = 10000
os.environ.setdefault("FENCHEL_DATA", str(Path(__file__).resolve().parents[2] / "shared" / "data"))


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--data",
        default=None,
        help="folder of the MNIST IDX files (default: "
        "$FENCHEL_DATA/mnist, else ../shared/data/mnist beside the repository)",
    )
    p.add_argument(
        "--depths",
        type=_counts,
        default=DEPTHS,
        help=f"hidden layers of each network, a comma list; default {','.join(map(str, DEPTHS))}",
    )
    p.add_argument("--width", type=int, default=300, help="units of every hidden layer")
    p.add_argument("--activation", default="relu", choices=activation_names())
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--batch-size", type=int, default=500)
    p.add_argument("--methods", default="fln,adam,sgd")
    p.add_argument(
        "--adam-lrs",
        type=learning_rates("--adam-lrs"),
        default=ADAM_LRS,
        help=f"Adam's learning-rate grid (default {','.join(map(str, ADAM_LRS))})",
    )
    p.add_argument(
        "--sgd-lrs",
        type=learning_rates("--sgd-lrs"),
        default=SGD_LRS,
        help=f"SGD's learning-rate grid (default {','.join(map(str, SGD_LRS))})",
    )
    p.add_argument(
        "--tune-epochs",
        type=int,
        default=3,
        help="epochs of each grid point on the validation split",
    )
    p.add_argument(
        "--no-tune",
        action="store_true",
        help="no grid: the MNIST MLP's tuned rates "
        f"(Adam {TUNED_LR['adam']:g}, SGD {TUNED_LR['sgd']:g}) at every depth",
    )
    p.add_argument("--threads", type=int, default=1, help="cores per method")
    add_compile_flag(p)
    p.add_argument("--jobs", type=int, default=1, help="runs at once, each in its own process")
    p.add_argument("--seed", type=int, default=0, help="the first seed of the final runs")
    p.add_argument("--seeds", type=int, default=1, help="final runs with seeds seed..seed+N-1")
    p.add_argument(
        "--check-every",
        type=int,
        default=20,
        help="FLN rounds between full certificate checks (and entries of its relaxation log)",
    )
    p.add_argument("--eval-every", type=int, default=20, help="batches between test evaluations")
    p.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    p.add_argument(
        "--quick",
        action="store_true",
        help="the embedded 5k MNIST, depths 1 and 2, "
        "width 32, 2 epochs, a 2-point grid of 1 epoch: a smoke run",
    )
    p.add_argument("--out", default=str(ROOT / "runs" / "mnist_deep"))
    args = p.parse_args(argv)
    for name in (
        "width",
        "epochs",
        "batch_size",
        "tune_epochs",
        "threads",
        "jobs",
        "seeds",
        "check_every",
        "eval_every",
    ):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    unknown = set(args.methods.split(",")) - {"fln", "adam", "sgd"}
    if unknown:
        p.error(f"--methods must name fln, adam, sgd; got {sorted(unknown)}")
    if args.quick:
        args.depths = (1, 2) if args.depths == DEPTHS else args.depths
        args.width, args.epochs, args.tune_epochs = min(args.width, 32), min(args.epochs, 2), 1
        args.adam_lrs, args.sgd_lrs = args.adam_lrs[1:3], args.sgd_lrs[-2:]
    return args


def _counts(text):
    """A comma list of integers >= 1 (an ``argparse`` type)."""
    try:
        values = tuple(int(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected integers like 1,2,4, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected integers >= 1, got {text!r}")
    return values


def sizes(args, n_in):
    """The layer sizes of the network of ``args.depth`` hidden layers."""
    return [n_in] + [args.width] * args.depth + [10]


@dataclass(frozen=True)
class Plan:
    """How FLN trains a network of some depth: the per-layer ``setting`` (``defaults.Setting``),
    ``alternations`` (rounds per batch, K), the weights' ``init`` (``INITS``: the network's
    Xavier-uniform, or He / orthogonal scaling of the hidden layers' weights for ReLU) and
    ``lam_schedule``: None, or ``lam_schedule(epoch, lam)`` -> the per-hidden-layer lam of the
    epoch after ``epoch`` (a layer-wise schedule; the setting's lam trains the first epoch)."""

    setting: defaults.Setting
    alternations: int = 1
    init: str = "xavier"
    lam_schedule: Callable | None = None


def dense_plan(depth):
    """The package's dense setting for ``depth`` hidden layers (``defaults.Dense.for_layers``)."""
    return Plan(defaults.training("dense", depth, batched=True))


def network(args, n_in, setting=None):
    """The lifted network of ``args.depth`` hidden layers, its lam and rho from ``setting``
    (default: the dense setting for that depth); the baselines start from its weights (the
    same ``seed``)."""
    from fenchel_cvx import LiftedNetwork

    s = setting or defaults.training("dense", args.depth, batched=True)
    return LiftedNetwork(
        sizes(args, n_in),
        args.activation,
        "cross_entropy",
        lam=list(s.lam),
        rho=list(s.rho),
        seed=args.seed,
        dtype=np.dtype(args.dtype),
    )


def initialise(net, init, seed):
    """Redraw the hidden layers' weights of ``net`` by ``init`` (``INITS``), biases 0; the output
    layer keeps its Xavier-uniform weights. ``"xavier"``: the network's own, unchanged."""
    if init not in INITS:
        raise ValueError(f"init must be one of {INITS}, got {init!r}")
    if init == "xavier":
        return net
    rng = np.random.default_rng([seed, 1])
    for l in range(net.n_hidden):
        W = np.zeros_like(net.W[l])
        p_out, p_in = W.shape[0], W.shape[1] - 1
        if init == "he":  # Var = 2 / fan_in: the ReLU gain of He et al. (2015)
            W[:, :-1] = rng.normal(0.0, np.sqrt(2.0 / p_in), size=(p_out, p_in))
        else:  # orthogonal rows or columns (Saxe et al., 2014), gain sqrt(2) for ReLU
            Q, R = np.linalg.qr(rng.standard_normal((max(p_out, p_in), min(p_out, p_in))))
            Q = Q * np.sign(np.diag(R))
            W[:, :-1] = np.sqrt(2.0) * (Q if p_out >= p_in else Q.T)
        net.W[l] = W
    return net


def run_fln(args, ds, batches, plan=None):
    """FLN by ``plan`` (default: ``dense_plan(args.depth)``), its relaxation log recorded."""
    plan = plan or dense_plan(args.depth)
    s = plan.setting
    args.gamma, args.momentum, args.alternations = (
        list(s.gamma),
        list(s.momentum),
        plan.alternations,
    )
    args.w_steps, args.x_steps, args.gram_reuse = s.w_steps, s.x_steps, s.gram_reuse or 1
    dtype = np.dtype(args.dtype)
    X, Xte = ds.X_train.astype(dtype, copy=False), ds.X_test.astype(dtype, copy=False)
    net = initialise(network(args, X.shape[0], s), plan.init, args.seed)

    def test_accuracy():
        return float(np.mean(np.argmax(net.forward(Xte)[1], axis=0) == ds.y_test))

    def next_epoch(epoch):
        net.lam = [float(v) for v in plan.lam_schedule(epoch, s.lam)]

    return train_fln(
        args,
        net,
        X,
        one_hot(ds.y_train, 10).astype(dtype),
        test_accuracy,
        batches,
        fln_backend(args),
        relaxation=True,
        epoch_end=next_epoch if plan.lam_schedule else None,
    )


def run_backprop(args, ds, batches, optimizer):
    from fenchel_cvx.baselines import train_backprop

    r = train_backprop(
        network(args, ds.X_train.shape[0]),
        ds.X_train,
        ds.y_train,
        ds.X_test,
        ds.y_test,
        batches=batches,
        optimizer=optimizer,
        lr=args.lr,
        activation=args.activation,
        seed=args.seed,
        threads=args.threads,
        eval_every=args.eval_every,
    )
    return backprop_record(r, len(batches[0]))


def _task(args, method, depth, **changes):
    return method, argparse.Namespace(
        **{**vars(args), "depth": depth, "validation": 0, "lr": None, **changes}
    )


def tune(args):
    """``{depth: {optimizer: {"grid": {lr: validation accuracy}, "lr": the best}}}``: every grid
    point trained ``--tune-epochs`` epochs with seed 0, validated on the held-out images."""
    grids = {m: getattr(args, f"{m}_lrs") for m in ("adam", "sgd") if m in args.methods.split(",")}
    if args.no_tune:
        return {d: {m: dict(grid={}, lr=TUNED_LR[m]) for m in grids} for d in args.depths}
    validation = min(VALIDATION, 1000) if args.quick else VALIDATION
    tasks = [
        _task(args, m, d, lr=lr, seed=0, epochs=args.tune_epochs, validation=validation)
        for d in args.depths
        for m, grid in grids.items()
        for lr in grid
    ]
    print(
        f"tuning: {len(tasks)} runs of {args.tune_epochs} epoch(s) on the validation split",
        flush=True,
    )
    chosen = {d: {m: dict(grid={}) for m in grids} for d in args.depths}
    for (m, a), r in zip(tasks, run_methods(tasks, args.jobs, **HOOKS)):
        chosen[a.depth][m]["grid"][a.lr] = r["test_accuracy"][-1]  # the held-out images
    for d, by in chosen.items():
        for m, c in by.items():
            c["lr"] = max(c["grid"], key=c["grid"].get)
            print(
                f"  depth {d}, {m}: lr {c['lr']:g} (validation {c['grid'][c['lr']]:.4f})",
                flush=True,
            )
    return chosen


def final_runs(args, chosen):
    """``{depth: {method: [one result per seed]}}`` on the test set."""
    seeds = range(args.seed, args.seed + args.seeds)
    tasks = [
        _task(args, m, d, seed=s, lr=chosen[d][m]["lr"] if m != "fln" else None)
        for d in args.depths
        for m in args.methods.split(",")
        for s in seeds
    ]
    results = {d: {m: [] for m in args.methods.split(",")} for d in args.depths}
    for (m, a), r in zip(tasks, run_methods(tasks, args.jobs, **HOOKS)):
        results[a.depth][m].append(r)
    return results


def summarise(args, chosen, results, data_desc):
    rows = {}
    for d, by in results.items():
        rows[d] = {}
        for m, runs in by.items():
            per_seed = [
                dict(
                    final_test_accuracy=r["test_accuracy"][-1],
                    test_accuracy=r["test_accuracy"],
                    peak_mib=r["peak_mib"],
                    peak_gpu_mib=r.get("peak_gpu_mib"),
                    seconds_per_epoch=r["seconds"][-1] / len(r["seconds"]),
                )
                for r in runs
            ]
            rows[d][m] = dict(seed_summary(per_seed), lr=chosen[d].get(m, {}).get("lr"))
            if m == "fln":
                rows[d][m]["certificate"] = [r["certificate"] for r in runs]
    return dict(
        data=data_desc,
        settings=dict(vars(args)),
        machine=machine(args),
        tuning=chosen,
        methods=rows,
        raw=results,
    )


def markdown(summary):
    s = summary["settings"]
    lines = [
        f"MNIST, 784-({s['width']} x depth)-10, {s['activation']}, batch {s['batch_size']}, "
        f"{s['epochs']} epochs, {summary['machine']['threads']} thread(s), seeds "
        f"{s['seed']}..{s['seed'] + s['seeds'] - 1} (means; +- is the spread max - min); "
        f"{summary['data']}",
        "",
        "| depth | method | test acc | s / epoch | peak MiB | lr (validation) | certificate |",
        "|---|---|---|---|---|---|---|",
    ]
    for d, by in summary["methods"].items():
        for m, r in by.items():
            lr = "" if r["lr"] is None else f"{r['lr']:g}"
            cert = (
                ""
                if "certificate" not in r
                else "held"
                if all(c["violations"] == 0 for c in r["certificate"])
                else "violated"
            )
            lines.append(
                f"| {d} | {m} | {r['final_test_accuracy']:.4f} +- "
                f"{r['final_test_accuracy_spread']:.4f} | {r['seconds_per_epoch']:.2f} | "
                f"{peak_text(r)} | {lr} | {cert} |"
            )
    return "\n".join(lines) + "\n"


def plot(summary, path):
    """Test accuracy (seed mean) against depth, one line per method."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    depths = list(summary["methods"])
    for m in summary["methods"][depths[0]]:
        ax.plot(
            depths,
            [summary["methods"][d][m]["final_test_accuracy"] for d in depths],
            marker="o",
            label=m,
        )
    ax.set_xscale("log", base=2)
    ax.set_xticks(depths, [str(d) for d in depths])
    ax.set_xlabel("hidden layers")
    ax.set_ylabel("test accuracy")
    ax.set_title(
        f"784-({summary['settings']['width']} x depth)-10, {summary['settings']['activation']}"
    )
    ax.legend()
    fig.tight_layout()
    atomic_write(path, lambda f: fig.savefig(f, format="png", dpi=110))
    plt.close(fig)


HOOKS = dict(load=load, run_fln=run_fln, run_backprop=run_backprop)


def main(argv=None):
    args = parse_args(argv)
    ds, data_desc = load(argparse.Namespace(**{**vars(args), "validation": 0}))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    chosen = tune(args)
    summary = summarise(args, chosen, final_runs(args, chosen), data_desc)
    write_report(
        out,
        summary,
        markdown(summary),
        lambda path: plot(summary, path),
        figure="accuracy_vs_depth.png",
    )


if __name__ == "__main__":
    main()
