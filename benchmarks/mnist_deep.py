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
  10,000 (``common.data``: the last 10,000), seed 0; the test set is read by the final runs only.
  ``--no-tune`` takes the MNIST MLP's tuned rates instead (``mnist_mlp.TUNED_LR``);
- the lifted peers of the paper's Figure 1 (``lau``, ``askari``, ``taylor``:
  ``baselines.lifted``), as they are defined: full-batch iterations on the whole training set,
  MSE, ReLU only, at the settings and iteration counts of ``benchmarks/mnist_lifted.py``
  (``--peer-iterations``), from the same initial weights. A peer that fails at some depth is
  reported as not run there, with the reason, and the other runs go on.

FLN records, on every checked round (every ``--check-every`` rounds and each epoch's last), each
layer's divergence ``B_l`` (the history's ``divergence_x``, after the X-sweep) and the relaxation
gap ``J - F`` of the batch (``network_x - lifted_x``: the network objective against its lifted
lower bound, the paper's eqs. (7) and (3)), so that where depth makes FLN fail can be seen.

Prints and writes to ``--out``: ``results.json`` (every run, with its per-epoch accuracy and
seconds, the tuning grid's validation accuracies and FLN's relaxation log), ``results.md`` (a
table per depth: test accuracy, mean and spread over seeds, seconds per epoch, peak memory, the
chosen learning rate) and ``accuracy_vs_depth.png``. Every run's result is also kept in
``--out``/runs/ as it finishes; ``--resume`` reads the kept runs of the same settings instead of
running them again, so that an interrupted benchmark goes on where it stopped; ``--kept-only``
starts no run and reports the kept runs alone (the others as not kept yet), so that a long
benchmark's figures can be read while it runs.

    python benchmarks/mnist_deep.py --seeds 3 --jobs 2 --resume   # depths 1-16, width 300, ReLU
    python benchmarks/mnist_deep.py --methods fln,adam,sgd   # no lifted peers
    python benchmarks/mnist_deep.py --activation tanh --depths 4,8
    python benchmarks/mnist_deep.py --quick                  # embedded 5k MNIST: a smoke run
"""

import argparse
import json
from dataclasses import asdict
from pathlib import Path

import numpy as np

import common  # noqa: F401  (puts the repository on the path)
from common import data, flags, fln, kept, reports, runner
from deep_plans import CarriedX, dense_plan, initialise, network
from deep_report import markdown, plot, summarise
from fenchel_cvx.activations import activation_names
from fenchel_cvx.datasets import one_hot
from mnist_lifted import FULL_ITERATIONS, PEERS, QUICK_ITERATIONS, run_peer
from mnist_mlp import TUNED_LR

DEPTHS = (1, 2, 4, 8, 16)
ADAM_LRS = (3e-4, 1e-3, 3e-3, 1e-2)
SGD_LRS = (0.01, 0.03, 0.1, 0.3, 1.0)
METHODS = ("fln", "adam", "sgd", *PEERS)
#: the training images held out to choose the baselines' learning rates (``common.data``: the
#: last 10,000)
VALIDATION = 10000


#: the flags that take integers >= 1
COUNTS = ("width", "epochs", "batch_size", "tune_epochs", "threads", "jobs", "seeds")
COUNTS += ("peer_seeds", "check_every", "eval_every")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    data.add_data_flags(p, validation=False, train_size=False)
    p.add_argument(
        "--depths",
        type=flags.counts,
        default=DEPTHS,
        help=f"hidden layers of each network, a comma list; default {','.join(map(str, DEPTHS))}",
    )
    p.add_argument("--width", type=int, default=300, help="units of every hidden layer")
    p.add_argument("--activation", default="relu", choices=activation_names())
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--batch-size", type=int, default=500)
    p.add_argument(
        "--methods",
        default=",".join(METHODS),
        help=f"a comma list of {', '.join(METHODS)}; default all",
    )
    p.add_argument(
        "--peer-iterations",
        default=None,
        help="METHOD=N pairs: the lifted peers' full-batch iterations (default "
        + ",".join(f"{m}={FULL_ITERATIONS[m]}" for m in PEERS)
        + ", as benchmarks/mnist_lifted.py)",
    )
    p.add_argument(
        "--adam-lrs",
        type=flags.learning_rates("--adam-lrs"),
        default=ADAM_LRS,
        help=f"Adam's learning-rate grid (default {','.join(map(str, ADAM_LRS))})",
    )
    p.add_argument(
        "--sgd-lrs",
        type=flags.learning_rates("--sgd-lrs"),
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
    flags.add_compile_flag(p)
    p.add_argument("--jobs", type=int, default=1, help="runs at once, each in its own process")
    p.add_argument("--seed", type=int, default=0, help="the first seed of the final runs")
    p.add_argument("--seeds", type=int, default=1, help="final runs with seeds seed..seed+N-1")
    p.add_argument(
        "--peer-seeds",
        type=int,
        default=1,
        help="the lifted peers' final runs: seeds seed..seed+N-1 (default 1)",
    )
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
    p.add_argument("--out", default=str(common.ROOT / "runs" / "mnist_deep"))
    p.add_argument(
        "--resume",
        action="store_true",
        help="read the runs kept in --out/runs with the same settings instead of running them",
    )
    p.add_argument(
        "--kept-only",
        action="store_true",
        help="start no run: the report of the runs kept in --out/runs (as --resume reads them), "
        "those not kept yet listed as not run",
    )
    args = p.parse_args(argv)
    args.resume = args.resume or args.kept_only
    flags.check_counts(p, args, COUNTS)
    unknown = set(args.methods.split(",")) - set(METHODS)
    if unknown:
        p.error(f"--methods must name {', '.join(METHODS)}; got {sorted(unknown)}")
    if args.activation != "relu" and set(args.methods.split(",")) & set(PEERS):
        p.error(
            f"--methods: the lifted peers ({', '.join(PEERS)}) train ReLU networks only; "
            f"got --activation {args.activation}"
        )
    args.peer_iterations = _peer_iterations(p, args)
    if args.quick:
        args.depths = (1, 2) if args.depths == DEPTHS else args.depths
        args.width, args.epochs, args.tune_epochs = min(args.width, 32), min(args.epochs, 2), 1
        args.adam_lrs, args.sgd_lrs = args.adam_lrs[1:3], args.sgd_lrs[-2:]
    return args


def _peer_iterations(p, args):
    """``{peer: iterations}`` from ``--peer-iterations`` over the defaults (``--quick``'s fewer)."""
    base = QUICK_ITERATIONS if args.quick else FULL_ITERATIONS
    its = {m: base[m] for m in PEERS}
    for item in filter(None, (args.peer_iterations or "").split(",")):
        m, sep, n = item.partition("=")
        if not sep or m not in PEERS or not n.isdigit() or int(n) < 1:
            p.error(
                f"--peer-iterations takes METHOD=N with METHOD one of {', '.join(PEERS)} and "
                f"N >= 1, got {item!r}"
            )
        its[m] = int(n)
    return its


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
    args.x_sweep = plan.x_sweep
    dtype = np.dtype(args.dtype)
    X, Xte = ds.X_train.astype(dtype, copy=False), ds.X_test.astype(dtype, copy=False)
    net = initialise(network(args, X.shape[0], s), plan.init, args.seed)

    def test_accuracy():
        return float(np.mean(np.argmax(net.forward(Xte)[1], axis=0) == ds.y_test))

    def next_epoch(epoch):
        net.lam = [float(v) for v in plan.lam_schedule(epoch, s.lam)]

    backend = fln.fln_backend(args)
    if plan.carried_x:
        backend = CarriedX(backend, batches, X.shape[1])
    out = fln.train_fln(
        args,
        net,
        X,
        one_hot(ds.y_train, 10).astype(dtype),
        test_accuracy,
        batches,
        backend,
        relaxation=True,
        epoch_end=next_epoch if plan.lam_schedule else None,
    )
    if plan.carried_x:
        out["carried_x"] = dict(tried=backend.tried, kept=backend.kept)
    return out


def run_backprop(args, ds, batches, optimizer):
    model = network(args, ds.X_train.shape[0])
    return runner.run_backprop(
        args, ds, batches, optimizer, model, lr=args.lr, activation=args.activation
    )


def run_baseline(args, ds, batches, method):
    """Adam or SGD on the batches, or a lifted peer on the whole training set."""
    return (
        run_peer(args, ds, method) if method in PEERS else run_backprop(args, ds, batches, method)
    )


#: the settings that make two runs the same run: ``--resume`` reads a kept run where all agree
RUN_KEY = (
    "depth",
    "width",
    "activation",
    "epochs",
    "batch_size",
    "seed",
    "lr",
    "validation",
    "split",
    "dtype",
    "check_every",
    "eval_every",
    "threads",
    "compile",
    "quick",
    "peer_iterations",
)


def run_key(method, args):
    """The text that names a run (``RUN_KEY``; FLN's also its setting, ``dense_plan``, so that
    a changed default is a new run), the same in every process."""
    fields = {k: getattr(args, k, None) for k in RUN_KEY}
    if fields["split"] is None:  # a run on the test set: no validation rule
        fields.pop("split")
    if method not in PEERS:
        fields.pop("peer_iterations")
    if method == "fln":
        fields["setting"] = asdict(dense_plan(args.depth).setting)
    return json.dumps(dict(method=method, **fields), sort_keys=True, default=str)


def kept_runs(args, tasks):
    """``common.kept.kept_runs`` over ``tasks``, kept in ``--out``/runs/."""
    return kept.kept_runs(
        tasks,
        [run_key(m, a) for m, a in tasks],
        [f"{m}-d{a.depth}-s{a.seed}" for m, a in tasks],
        Path(args.out) / "runs",
        args.jobs,
        args.resume,
        args.kept_only,
        **HOOKS,
    )


def task(args, method, depth, **changes):
    """``(method, args)`` of one run at ``depth`` (``changes``: its other settings); ``split``
    names the validation rule (``common.data``: the last N training images), so that a kept run
    of another rule is run again."""
    fields = {"depth": depth, "validation": 0, "lr": None, **changes}
    fields["split"] = data.SPLIT if fields["validation"] else None
    return method, argparse.Namespace(**{**vars(args), **fields})


def tune(args):
    """``{depth: {optimizer: {"grid": {lr: validation accuracy}, "lr": the best}}}``: every grid
    point trained ``--tune-epochs`` epochs with seed 0, validated on the held-out images."""
    grids = {m: getattr(args, f"{m}_lrs") for m in ("adam", "sgd") if m in args.methods.split(",")}
    if args.no_tune:
        return {d: {m: dict(grid={}, lr=TUNED_LR[m]) for m in grids} for d in args.depths}
    validation = min(VALIDATION, 1000) if args.quick else VALIDATION
    tasks = [
        task(args, m, d, lr=lr, seed=0, epochs=args.tune_epochs, validation=validation)
        for d in args.depths
        for m, grid in grids.items()
        for lr in grid
    ]
    print(
        f"tuning: {len(tasks)} runs of {args.tune_epochs} epoch(s) on the validation split",
        flush=True,
    )
    chosen = {d: {m: dict(grid={}) for m in grids} for d in args.depths}
    for (m, a), r in zip(tasks, kept_runs(args, tasks)):
        if "not_run" not in r:
            chosen[a.depth][m]["grid"][a.lr] = r["test_accuracy"][-1]  # the held-out images
    for d, by in chosen.items():
        for m, c in by.items():
            c["lr"] = max(c["grid"], key=c["grid"].get, default=None)
            if c["lr"] is None:  # --kept-only, before the grid's runs
                print(f"  depth {d}, {m}: no grid run kept", flush=True)
                continue
            print(
                f"  depth {d}, {m}: lr {c['lr']:g} (validation {c['grid'][c['lr']]:.4f})",
                flush=True,
            )
    return chosen


def final_runs(args, chosen):
    """``{depth: {method: [one result per seed]}}`` on the test set: ``--seeds`` seeds, the
    lifted peers ``--peer-seeds``."""
    tasks = [
        task(args, m, d, seed=s, lr=chosen[d][m]["lr"] if m in chosen[d] else None)
        for d in args.depths
        for m in args.methods.split(",")
        for s in range(args.seed, args.seed + (args.peer_seeds if m in PEERS else args.seeds))
    ]
    results = {d: {m: [] for m in args.methods.split(",")} for d in args.depths}
    for (m, a), r in zip(tasks, kept_runs(args, tasks)):
        results[a.depth][m].append(r)
    return results


HOOKS = dict(load=data.load, run_fln=run_fln, run_backprop=run_baseline)


def main(argv=None):
    args = parse_args(argv)
    ds, data_desc = data.load(argparse.Namespace(**{**vars(args), "validation": 0}))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    chosen = tune(args)
    summary = summarise(args, chosen, final_runs(args, chosen), data_desc)
    reports.write_report(
        out,
        summary,
        markdown(summary),
        lambda path: plot(summary, path),
        figure="accuracy_vs_depth.png",
    )


if __name__ == "__main__":
    main()
