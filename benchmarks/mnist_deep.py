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
import hashlib
import json
import os
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from fenchel_cvx import defaults  # noqa: E402
from fenchel_cvx.activations import activation_names  # noqa: E402
from fenchel_cvx.datasets import one_hot  # noqa: E402
from fenchel_cvx.history import _plain  # noqa: E402
from fenchel_cvx.io import atomic_write, write_text  # noqa: E402
from mnist_lifted import FULL_ITERATIONS, QUICK_ITERATIONS  # noqa: E402
from mnist_lifted import SETTINGS as PEER_SETTINGS  # noqa: E402
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
#: the lifted peers of the paper's Figure 1 (``baselines.lifted``); they define ReLU and MSE only
PEERS = ("lau", "askari", "taylor")
METHODS = ("fln", "adam", "sgd", *PEERS)
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
    p.add_argument("--out", default=str(ROOT / "runs" / "mnist_deep"))
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
    for name in (
        "width",
        "epochs",
        "batch_size",
        "tune_epochs",
        "threads",
        "jobs",
        "seeds",
        "peer_seeds",
        "check_every",
        "eval_every",
    ):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
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
    epoch after ``epoch`` (a layer-wise schedule; the setting's lam trains the first epoch).
    ``carried_x``: the X-blocks' solvers start from each column's X of its last batch, where
    that is the better start (:class:`CarriedX`). ``x_sweep``: the X-blocks' order
    (``fit_bcd``'s: ``"backward"``, the paper's, or ``"forward"``)."""

    setting: defaults.Setting
    alternations: int = 1
    init: str = "xavier"
    lam_schedule: Callable | None = None
    carried_x: bool = False
    x_sweep: str = "backward"


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


class CarriedX:
    """The backend ``backend`` whose X-block solves start from the X their columns had at the
    end of their last batch (an epoch before: the batches are drawn anew each epoch, the
    columns are the examples), where that point has the lower block value; else from the start
    the driver gives (the feed-forward point). Each block stays the same convex problem and its
    solver starts no higher than the driver's start, so descent and the lower bound hold as
    before. ``batches``: the run's schedule, one round a batch (K = 1); each round begins with
    the block X_L (the X-sweep runs back to front). ``forget()`` (``fit_bcd``'s, at the start
    of a run) starts the count again. ``tried`` / ``kept``: the X-blocks with a carried
    point, and those that started from it."""

    def __init__(self, backend, batches, m):
        self.backend, self.m = backend, m
        self.order = [cols for epoch in batches for cols in epoch]
        self.store, self.round, self.tried, self.kept = {}, -1, 0, 0

    def __getattr__(self, name):
        return getattr(self.backend, name)

    def forget(self):
        self.backend.forget()
        self.store, self.round, self.tried, self.kept = {}, -1, 0, 0

    def solve(self, block, start):
        from fenchel_cvx.blocks import XBlock, XLast

        if not isinstance(block, XBlock):
            return self.backend.solve(block, start=start)
        self.round += isinstance(block, XLast)
        cols = self.order[self.round]
        if block.layer not in self.store:
            self.store[block.layer] = np.full((block.shape[0], self.m), np.nan, start.dtype)
        carried = self.store[block.layer][:, cols]
        if np.isfinite(carried).all():
            self.tried += 1
            if float(block.value(carried)) < float(block.value(start)):
                start, self.kept = carried, self.kept + 1
        res = self.backend.solve(block, start=start)
        self.store[block.layer][:, cols] = res.argmin
        return res


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

    backend = fln_backend(args)
    if plan.carried_x:
        backend = CarriedX(backend, batches, X.shape[1])
    out = train_fln(
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


def run_peer(args, ds, method):
    """A lifted peer (``PEERS``) on the whole training set, ``args.peer_iterations[method]``
    full-batch iterations at ``benchmarks/mnist_lifted.py``'s setting, scored on the test set
    after each; where it fails, the reason (``not_run``) in place of its curve."""
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
            **PEER_SETTINGS.get(method, {}),
        )
    except (ArithmeticError, ValueError, np.linalg.LinAlgError, MemoryError) as err:
        return dict(not_run=f"{type(err).__name__}: {err}", test_accuracy=[], seconds=[])
    return dict(
        initial_test_accuracy=run.initial_test_accuracy,
        test_accuracy=run.series("test_accuracy").tolist(),
        seconds=run.series("seconds").tolist(),
        iterations=len(run.records),
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
    if method not in PEERS:
        fields.pop("peer_iterations")
    if method == "fln":
        fields["setting"] = asdict(dense_plan(args.depth).setting)
    return json.dumps(dict(method=method, **fields), sort_keys=True, default=str)


def kept_runs(args, tasks):
    """``run_methods`` over ``tasks``, each result written to ``--out``/runs/ as it finishes;
    with ``--resume``, a task whose kept file has the same settings is read, not run."""
    folder = Path(args.out) / "runs"
    folder.mkdir(parents=True, exist_ok=True)
    keys = [run_key(m, a) for m, a in tasks]
    paths = [
        folder / f"{m}-d{a.depth}-s{a.seed}-{hashlib.sha1(k.encode()).hexdigest()[:12]}.json"
        for (m, a), k in zip(tasks, keys)
    ]
    results = [_read_kept(p, k) if args.resume else None for p, k in zip(paths, keys)]
    todo = [i for i, r in enumerate(results) if r is None]
    if args.resume and tasks:
        print(f"--resume: {len(tasks) - len(todo)} of {len(tasks)} runs read from {folder}")

    def keep(j, result):
        i = todo[j]
        write_text(paths[i], json.dumps(dict(key=keys[i], result=_plain(result))))

    if args.kept_only:
        fresh = [dict(not_run="not kept yet", test_accuracy=[], seconds=[]) for _ in todo]
    else:
        fresh = run_methods([tasks[i] for i in todo], args.jobs, on_result=keep, **HOOKS)
    for i, r in zip(todo, fresh):
        results[i] = r
    return results


def _read_kept(path, key):
    """A kept run's result; None where the file is absent, unreadable or of other settings."""
    try:
        kept = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as err:
        print(f"--resume: {path} is not read ({err}); the run goes again")
        return None
    ok = isinstance(kept, dict) and kept.get("key") == key and isinstance(kept.get("result"), dict)
    if not (ok and isinstance(kept["result"].get("test_accuracy"), list)):
        print(f"--resume: {path} is not a run of these settings; the run goes again")
        return None
    return kept["result"]


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
        _task(args, m, d, seed=s, lr=chosen[d][m]["lr"] if m in chosen[d] else None)
        for d in args.depths
        for m in args.methods.split(",")
        for s in range(args.seed, args.seed + (args.peer_seeds if m in PEERS else args.seeds))
    ]
    results = {d: {m: [] for m in args.methods.split(",")} for d in args.depths}
    for (m, a), r in zip(tasks, kept_runs(args, tasks)):
        results[a.depth][m].append(r)
    return results


def summarise(args, chosen, results, data_desc):
    rows = {}
    for d, by in results.items():
        rows[d] = {}
        for m, planned in by.items():
            runs = [r for r in planned if "not_run" not in r]
            if not runs:
                rows[d][m] = dict(not_run=planned[0]["not_run"], lr=None)
                continue
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
            rows[d][m] = dict(
                seed_summary(per_seed),
                lr=chosen[d].get(m, {}).get("lr"),
                seeds_run=len(runs),
                seeds_planned=len(planned),
            )
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
        f"{s['seed']}..{s['seed'] + s['seeds'] - 1}, the lifted peers "
        f"{s['seed']}..{s['seed'] + s['peer_seeds'] - 1} (means; +- is the spread max - min); "
        f"{summary['data']}",
        "",
        "| depth | method | test acc | s / epoch | peak MiB | lr (validation) | certificate |",
        "|---|---|---|---|---|---|---|",
    ]
    for d, by in summary["methods"].items():
        for m, r in by.items():
            lines.append(_row(d, m, r, s["peer_iterations"]))
    lines.append("")
    lines.append(
        "The lifted peers train full-batch: their seconds are per iteration over the whole "
        "training set, and their accuracy is after the iterations named beside them."
    )
    return "\n".join(lines) + "\n"


def _row(depth, method, r, peer_iterations):
    """One line of the table."""
    if "not_run" in r:
        return f"| {depth} | {method} | not run: {r['not_run']} | | | | |"
    lr = "" if r["lr"] is None else f"{r['lr']:g}"
    if method in PEERS:
        lr = f"({peer_iterations[method]} iterations)"
    cert = ""
    if "certificate" in r:
        cert = "held" if all(c["violations"] == 0 for c in r["certificate"]) else "violated"
    seeds = r.get("seeds_run", 1) < r.get("seeds_planned", 1)
    seeds = f" ({r['seeds_run']} of {r['seeds_planned']} seeds)" if seeds else ""
    return (
        f"| {depth} | {method} | {r['final_test_accuracy']:.4f} +- "
        f"{r['final_test_accuracy_spread']:.4f}{seeds} | {r['seconds_per_epoch']:.2f} | "
        f"{peak_text(r)} | {lr} | {cert} |"
    )


def plot(summary, path):
    """Test accuracy (seed mean) against depth, one line per method."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    depths = list(summary["methods"])
    for m in summary["methods"][depths[0]]:
        ran = [d for d in depths if "not_run" not in summary["methods"][d][m]]
        ax.plot(
            ran,
            [summary["methods"][d][m]["final_test_accuracy"] for d in ran],
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


HOOKS = dict(load=load, run_fln=run_fln, run_backprop=run_baseline)


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
