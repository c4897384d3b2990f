"""The paper's MNIST MLP comparison (its Figure 2): FLN against backprop with SGD and Adam.

784-300-10, ReLU, cross-entropy, batch 500, K = 1 alternation, 10 epochs on the full MNIST.
FLN is the batched model (Algorithm 2) on the fast array backend, in the package's dense
training setting (``defaults.training("dense", 1, batched=True)``, which the estimators and the
command line train with): the paper's appendix setting in this package's units (lam 0.2,
gamma 1 for W_0, no Frobenius penalty: ``fenchel_cvx.paper_hyperparameters``) with the output
layer's gamma 30 and a single W_1-step per batch (W_0 takes 10 steps, X_1 20 FISTA steps), and
each batch starting from W_0 moved on along its last change (``fit_bcd(momentum=...)``, not in
the paper, beta = (0.7, 0)), chosen on the validation split (docs page "Tuning").
SGD and Adam train the same architecture in PyTorch on the same batches in the same order
(``datasets.batch_order``) with the same thread count, at the learning rates chosen on the same
validation split (``TUNED_LR``: ``benchmarks/tune_baselines.py``); ``--paper-lr`` takes the
paper's (SGD 1e-2, Adam 1e-3), ``--sgd-momentum 0.9`` SGD with heavy-ball momentum (its own
tuned rate). Each method runs in its own process (``common.runner``), so its peak memory is
its own; one after another, or ``--jobs N`` at once.

Prints and writes to ``--out``: ``results.json``, ``results.md`` (a markdown table) and
``accuracy.png`` (test accuracy against batches and against training seconds). Figures: test
accuracy after every epoch, seconds per epoch (training only, evaluation excluded), time to 97%
test accuracy (checked every ``--eval-every`` batches) and to each of ``reports.LEVELS``, the
FLN/Adam ratios, peak memory (max RSS), the FLOPs of a batch against the GEMM rate, FLN's host
reads per unchecked batch, the BLAS kernels and NumPy's and PyTorch's GEMM rates, and, with
``--profile``, the share of FLN's time spent in matrix products (py-spy native samples).

    python benchmarks/mnist_mlp.py --data-dir DIR   # the full run (default: $FENCHEL_DATA/mnist)
    python benchmarks/mnist_mlp.py --quick          # the embedded 5k MNIST, 2 epochs: a smoke run

``--device cupy`` runs every method on a GPU (FLN in CuPy, SGD and Adam in PyTorch on CUDA; the
clocks read after the device finishes), ``--device torch`` every method in PyTorch on CUDA.
"""

import argparse

import numpy as np

import common  # noqa: F401  (puts the repository on the path)
from common import data, flags, fln, reports, runner
from common.devices import DEVICES, gemm_rate, machine
from common.flags import floats, per_layer
from fenchel_cvx import defaults
from fenchel_cvx.datasets import one_hot
from fenchel_cvx.fast.gram import inverse_pays
from fenchel_cvx.fast.wblocks import NEWTON_START, RESYNC
from fenchel_cvx.paper_hyperparameters import from_reference
from fenchel_cvx.threads import limit_threads

#: the paper's appendix setting (784-300-10, batched: its lambda and rho_1, rho_2), in this
#: package's units
PAPER_LAM, PAPER_GAMMA = from_reference(lam=[0.1], rho=[1, 100])
#: the defaults: the package's dense training setting (``defaults.Dense``), chosen on the
#: validation split (docs page "Tuning", the MNIST MLP's screens)
SETTING = defaults.training("dense", 1, batched=True)
LAM, GAMMA, W_STEPS, MOMENTUM = SETTING.lam, SETTING.gamma, SETTING.w_steps, SETTING.momentum
X_STEPS = SETTING.x_steps[0]
#: the baselines' learning rates chosen on the validation split (``--validation 10000``, 10
#: epochs, seed 0: benchmarks/tune_baselines.py, docs page "Tuning"); "sgd_momentum": SGD with
#: momentum ``flags.TUNED_MOMENTUM``
TUNED_LR = {"sgd": 1.0, "sgd_momentum": 0.3, "adam": 3e-3}
#: the accuracy whose first reaching the report times (``time_to_97``)
TARGET = 0.97


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    data.add_data_flags(p)
    flags.add_run_flags(p, out=common.ROOT / "runs" / "mnist_mlp")
    flags.add_baseline_flags(p, TUNED_LR)
    p.add_argument("--lam", type=floats, default=list(LAM), help="lambda_1 of the hidden layer")
    p.add_argument(
        "--lam-growth",
        type=float,
        default=1.0,
        help="the lam schedule: epoch e trains with lam * growth^(e-1) (1: constant)",
    )
    p.add_argument("--rho", type=float, default=SETTING.rho[0])
    p.add_argument(
        "--gamma",
        type=floats,
        default=list(GAMMA),
        help="proximal gamma_l, one number or a comma list (one per layer, e.g. 1,100)",
    )
    p.add_argument(
        "--momentum",
        type=floats,
        default=list(MOMENTUM),
        help="FLN momentum beta_l in [0, 1) across batches (fit_bcd(momentum=...)): one "
        "number or one per layer; 0: the paper's Algorithm 2; default "
        f"{','.join(map(str, MOMENTUM))}",
    )
    p.add_argument(
        "--w-steps",
        type=per_layer(2, "--w-steps", integers=True),
        default=W_STEPS,
        help="FLN W-block steps per round, of W_0 and W_1 (one number: both); default "
        f"{','.join(map(str, W_STEPS))}",
    )
    p.add_argument(
        "--x-steps", type=int, default=X_STEPS, help=f"FLN X-block FISTA steps; default {X_STEPS}"
    )
    p.add_argument(
        "--gram-reuse",
        type=int,
        default=1,
        help="FLN W-block solves (one per round) one Gram factorisation serves",
    )
    p.add_argument(
        "--newton-cap",
        type=int,
        default=None,
        help="FLN W_0 rows with at most this many active points take Newton steps after the "
        "10th step; 0: never, which keeps more than 10 W-steps in the batch's span",
    )
    p.add_argument(
        "--predict",
        default="feedforward",
        choices=["feedforward", "lifted"],
        help="FLN's prediction rule for the accuracy after every epoch: the feed-forward pass, "
        "or the lifted rule of the paper's Sec. 4.3 (fenchel_cvx.predict)",
    )
    p.add_argument("--profile", action="store_true", help="profile FLN with py-spy (native frames)")
    args = p.parse_args(argv)
    flags.check_run_flags(p, args, counts=(*flags.COUNTS, "x_steps", "gram_reuse"))
    data.check_data_flags(p, args)
    if args.rho < 0:
        p.error(f"--rho must be >= 0, got {args.rho}")
    if args.newton_cap is not None and args.newton_cap < 0:
        p.error(f"--newton-cap must be >= 0, got {args.newton_cap}")
    if min(args.lam) <= 0 or len(args.lam) != 1:
        p.error(f"--lam must be one number > 0 (784-300-10 has one hidden layer), got {args.lam}")
    if min(args.gamma) < 0 or len(args.gamma) not in (1, 2):
        p.error(f"--gamma must be one number or 2 (one per layer), all >= 0, got {args.gamma}")
    if not all(0 <= b < 1 for b in args.momentum) or len(args.momentum) not in (1, 2):
        p.error(f"--momentum must be one number or 2, each in [0, 1), got {args.momentum}")
    if not args.lam_growth > 0:
        p.error(f"--lam-growth must be > 0, got {args.lam_growth}")
    flags.baseline_rates(p, args, TUNED_LR)
    return args


def load(args):
    """The run's data (``common.data.load``: ``--quick``, ``--data-dir``, ``--validation``)."""
    return data.load(args)


# --- one method in its own process ------------------------------------------------------------
def run_fln(args, ds, batches):
    from fenchel_cvx import LiftedNetwork
    from fenchel_cvx.fast import FastBackend

    dtype = np.dtype(args.dtype)
    X, Xte = ds.X_train.astype(dtype, copy=False), ds.X_test.astype(dtype, copy=False)
    Y = one_hot(ds.y_train, 10).astype(dtype)
    xp, sync = DEVICES[args.device].lib()
    X, Xte, Y, yte = (xp.asarray(A) for A in (X, Xte, Y, ds.y_test))
    net = LiftedNetwork(
        [X.shape[0], 300, 10],
        "relu",
        "cross_entropy",
        lam=args.lam[0],
        rho=args.rho,
        seed=args.seed,
        dtype=dtype,
    )
    net.W = [xp.asarray(W) for W in net.W]  # the untrained network's test accuracy, on the device

    def test_accuracy():
        return float(xp.sum(xp.argmax(net.forward(Xte)[1], axis=0) == yte)) / Xte.shape[1]

    def lifted_accuracy():  # the rule of the paper's Sec. 4.3, eq. (12) (fenchel_cvx.predict)
        from fenchel_cvx.predict import predict_classes

        hits = predict_classes(
            net, Xte, rule="optimization", sweeps=1, backend=FastBackend(threads=args.threads)
        )
        return float(xp.sum(hits == yte)) / Xte.shape[1]

    def next_epoch(epoch):  # the lam schedule: epoch e + 1 trains with lam * growth^e
        net.lam = [lam * args.lam_growth**epoch for lam in args.lam]

    return fln.train_fln(
        args,
        net,
        X,
        Y,
        test_accuracy,
        batches,
        fln.fln_backend(args, newton_cap=args.newton_cap),
        sync=sync,
        epoch_accuracy=lifted_accuracy if args.predict == "lifted" else None,
        epoch_end=next_epoch if args.lam_growth != 1 else None,
    )


def run_backprop(args, ds, batches, optimizer):
    return runner.run_backprop(args, ds, batches, optimizer, (ds.X_train.shape[0], 300, 10))


# --- FLOPs and the GEMM floor -------------------------------------------------------------------
def flops_per_batch(method, args, sizes=(784, 300, 10)):
    """Floating-point operations of one batch, counted from the code (2 p n m per p x n x m
    product).

    Backprop: the forward pass, the weight gradients and the hidden layers' input gradients.
    FLN (fast backend, ``args.alternations`` rounds): the feed-forward pass of the new batch;
    per round the X-blocks and the W-blocks (``w_flops``); in the batch's first round the
    X-blocks' ``U_{l-1}`` and W_0's ``W_0 X~`` come from the feed-forward pass. An X-block's
    FISTA takes ``2 x_steps + 3`` products with ``W_l``: the start's forward and adjoint (its
    optimality test, and the first step's gradient), per step a forward and (after the first)
    an adjoint, and the closing values of the start and of the end (its residual is not
    evaluated: capped).
    """
    m = args.batch_size
    dense = [(p, n + 1) for n, p in zip(sizes[:-1], sizes[1:])]  # W_l: p x (n + 1)
    forward = sum(2 * p * n * m for p, n in dense)
    if method != "fln":
        return forward * 2 + sum(2 * p * n * m for p, n in dense[1:])
    rounds = args.alternations
    x_block = sum(2 * p * n * m for p, n in dense[1:]) * (2 * args.x_steps + 3)
    u_prev = sum(2 * p * n * m for p, n in dense[:-1]) * (rounds - 1)
    gammas = args.gamma if len(args.gamma) == len(dense) else args.gamma * len(dense)
    # the batch's first round starts its hidden W-blocks at W0: in the span of X~ (``fast.span``)
    span = [
        l < len(dense) - 1
        and args.rho == 0
        and gammas[l] > 0
        and (args.w_steps[l] <= NEWTON_START or args.newton_cap == 0)
        for l in range(len(dense))
    ]
    shifted = [args.rho + g > 0 for g in gammas]  # a data-space Gram needs a positive shift
    w_first = sum(
        w_flops(p, n, m, k, s, c) for (p, n), k, s, c in zip(dense, args.w_steps, span, shifted)
    )
    w_later = sum(
        w_flops(p, n, m, k, False, c) for (p, n), k, c in zip(dense, args.w_steps, shifted)
    )
    return (
        forward
        + u_prev
        + rounds * x_block
        + w_first
        + (rounds - 1) * w_later
        - 2 * dense[0][0] * dense[0][1] * m
    )


def w_flops(p, n, m, steps, span=False, shifted=True):
    """One W-block of p x n weights on m points with ``steps`` steps (``fast.gram``): in data
    space (m < n) W X~, the syrk X~^T X~ (n m^2), Cholesky (m^3 / 3), its inverse where the
    p steps rows pay for it (``gram.inverse_pays``: 2 m^3 / 3) and per step one product with it
    or two triangular solves (2 p m^2) and one product back (2 p n m); else W X~, X~ S X~^T
    (2 n^2 m), Cholesky (n^3 / 3), the start's gradient and per step the preconditioning
    (2 p n^2) and d X~; a gradient after every step but the last (``capped_residual=False``:
    the benchmark's backend). ``span`` (``fast.span``: data space, from W0): no product back and
    no gradient per step, one product
    ``W0 + Z X~^T`` at the end, and every ``RESYNC`` (16) steps U formed again as ``U0 + Z K``
    (2 p m^2). ``shifted``: rho + gamma > 0 (data space needs it)."""
    prod = 2 * p * n * m
    gradients = (steps - 1) * prod
    factor = m**3 / 3 + (2 * m**3 / 3 if inverse_pays(m, p * steps) else 0)
    if m < n and span:
        return prod + n * m * m + factor + (steps + steps // RESYNC) * 2 * p * m * m + prod
    if m < n and shifted:
        return prod + n * m * m + factor + steps * (2 * p * m * m + prod) + gradients
    return prod + 2 * n * n * m + n**3 / 3 + prod + steps * (2 * p * n * n + prod) + gradients


# --- report -------------------------------------------------------------------------------------
def row(r):
    sec = r["seconds"]
    per_epoch = [b - a for a, b in zip([0.0] + sec[:-1], sec)]
    t97, b97 = reports.time_to(r["checkpoints"], TARGET)
    return dict(
        final_test_accuracy=r["test_accuracy"][-1],
        test_accuracy=r["test_accuracy"],
        seconds_per_epoch=float(np.mean(per_epoch)),
        time_to_97=t97,
        batches_to_97=b97,
        peak_mib=r["peak_mib"],
        peak_gpu_mib=r.get("peak_gpu_mib"),
    )


def summarise(results, args, data_desc):
    """``results[method]``: one run per seed. Figures are seed means; ``*_spread`` is max - min."""
    rows = {}
    for name, runs in results.items():
        per_seed = [row(r) for r in runs]
        rows[name] = dict(
            reports.seed_summary(per_seed),
            **reports.level_figures(runs),
            **{
                k: reports.median([r[k] for r in per_seed]) for k in ("time_to_97", "batches_to_97")
            },
        )
        if "certificate" in runs[0]:
            rows[name]["certificate"] = [r["certificate"] for r in runs]
    n_batches = -(-args.train_points // args.batch_size)
    for name, r in rows.items():
        r["gflop_per_batch"] = flops_per_batch(reports.method_of(name, r), args) / 1e9
        r["ms_per_batch"] = 1e3 * r["seconds_per_epoch"] / n_batches
        r["fraction_of_gemm_floor"] = (r["gflop_per_batch"] / args.gemm_gflops) / (
            r["ms_per_batch"] / 1e3
        )
    ratios = {**reports.ratios_over_adam(rows), **reports.ratios_over_adam(rows, "time_to_97")}
    return dict(
        data=data_desc,
        settings=vars(args),
        machine=machine(args),
        methods=rows,
        ratios=ratios,
        raw=results,
    )


def markdown(summary):
    fmt = lambda x, f="{:.1f}": "n/a" if x is None else f.format(x)  # noqa: E731
    settings = summary["settings"]
    last_seed = settings["seed"] + settings["seeds"] - 1
    lines = [
        f"MNIST MLP 784-300-10 ({summary['data']}), batch {summary['settings']['batch_size']}, "
        f"{summary['settings']['epochs']} epochs, ranks x threads: "
        f"{reports.launch_text(summary['methods'])}, device {summary['machine']['device']}",
        "",
        flags.rates_text(summary["settings"]),
        "",
        f"seeds {settings['seed']}..{last_seed} (means, the times to an accuracy medians; +- "
        "is the spread max - min)",
        "",
        f"GEMM calibration ({summary['settings']['dtype']}, 300x785x500, "
        f"{summary['machine']['threads']} threads): {settings['gemm_gflops']:.0f} GFLOP/s; "
        "floor fraction = (GFLOP per batch / that rate) / time per batch",
        "",
        "| method | final test acc | s / epoch | time to 97% (s) | batches to 97% | peak MiB "
        "| GFLOP / batch | ms / batch | of GEMM floor |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, r in summary["methods"].items():
        lines.append(
            f"| {name} | {r['final_test_accuracy']:.4f} +- {r['final_test_accuracy_spread']:.4f} | "
            f"{r['seconds_per_epoch']:.2f} | {fmt(r['time_to_97'])} | "
            f"{fmt(r['batches_to_97'], '{:.0f}')} | {reports.peak_text(r)} | "
            f"{r['gflop_per_batch']:.2f} | {r['ms_per_batch']:.0f} | "
            f"{r['fraction_of_gemm_floor']:.0%} |"
        )
    lines += reports.level_table(summary)
    for k, v in summary["ratios"].items():
        lines.append(f"\n{k}: {v:.2f}")
    if summary.get("matmul_share") is not None:
        lines.append(
            f"\nFLN share of time in matrix products: {summary['matmul_share']:.1%} "
            f"({summary['profile_note']})"
        )
    return "\n".join(lines) + "\n"


def main(argv=None):
    args = parse_args(argv)
    ds, data_desc = load(args)
    out = reports.output_folder(args)  # after the data's checks: a bad file leaves no folder
    args.train_points = ds.X_train.shape[1]
    with limit_threads(args.threads):
        args.gemm_gflops = gemm_rate(np.dtype(args.dtype), device=args.device) / 1e9
    print(
        f"GEMM calibration: {args.gemm_gflops:.0f} GFLOP/s ({args.dtype}, {args.threads} threads)"
    )
    tasks = runner.method_tasks(args)
    print(f"running {len(tasks)} method runs, {args.jobs} at a time ({args.threads} threads each)")
    results = {method: [] for method in args.methods.split(",")}
    hooks = dict(load=load, run_fln=run_fln, run_backprop=run_backprop)
    for (method, _), result in zip(tasks, runner.run_methods(tasks, args.jobs, **hooks)):
        results[method].append(result)
    summary = summarise(results, args, data_desc)
    if args.profile and "fln" in results:
        summary["matmul_share"], summary["profile_note"] = fln.matmul_share(__file__)
    draw = lambda path: reports.plot(summary, path, target=TARGET)  # noqa: E731
    reports.write_report(out, summary, markdown(summary), draw)


if __name__ == "__main__":
    main()
