"""FLN against SGD and Adam on LeNet-5, MNIST or CIFAR-10: the paper's Secs. 5.2-5.3, Figures 3, 4.

LeNet-5 (``fenchel_cvx.lenet5``: conv 6@5x5, avg-pool 2, conv 16@5x5, avg-pool 2, fc 120,
fc 84, fc 10, ReLU), cross-entropy, batch 500, K = 1 alternation; 20 epochs on the full MNIST
(28x28 padded to 32), or 80 on CIFAR-10 with ``--dataset cifar10 --data-dir DIR`` (the python
pickle batches). FLN is the batched model (Algorithm 2) on the fast array backend, from the
paper's appendix hyperparameters in this package's units
(``fenchel_cvx.paper_hyperparameters.from_reference``: the appendix's lam (5, 5, 1, 1) weigh its
code's penalty, which is twice our B): lam = (10, 10, 2, 2), gamma = (1e-4, 1e-2, 1, 1, 1), no
Frobenius penalty; the defaults then take the hidden dense layers' gamma 0.3 instead of 1,
chosen on a validation split (docs page "Tuning", "The dense layers' proximal weight"):
gamma = (1e-4, 1e-2, 0.3, 0.3, 1). Each round takes one W-step per W-block and (1, 1, 10, 10)
FISTA steps for X_1 .. X_4: the conv X-blocks barely move, and one step does what ten did on
validation, in 0.6 of the time (docs page "Tuning", "X-steps per layer"). Each batch
starts from the weights moved on along their last change (``fit_bcd(momentum=...)``, not in the
paper): beta = (0.98, 0.98, 0.3, 0.3, 0), so the conv layers' small, steady W-steps add up
(docs page "Tuning", "Momentum across batches"). The output layer fc 10 alone takes a
Frobenius penalty, rho = (0, 0, 0, 0, 0.3), where the paper's batched model has none: once FLN
fits the training images its output weights grow, and the test accuracy stalls from epoch 4
(docs page "Tuning", "The output layer's Frobenius penalty").
SGD and Adam train the same LeNet-5 in PyTorch from the same initial
weights (copied from the lifted network), on the same batches in the same order
(``datasets.batch_order``), with the same thread count, at the learning rates chosen on the
validation split (``TUNED_LR``: ``benchmarks/tune_baselines.py``, docs/tuning.md; on CIFAR-10,
which was not tuned, and with ``--paper-lr``: the paper's, SGD 1e-2 and Adam 1e-3;
``--sgd-momentum 0.9``: SGD with heavy-ball momentum). Each method runs in its own process, so
its peak memory is its own; one after another, or ``--jobs N`` at once (on a 2-core machine,
``--threads 1 --jobs 2`` trains FLN beside the baselines).
``--device cupy`` runs every method on an NVIDIA GPU: FLN in CuPy, SGD and Adam in PyTorch on
CUDA (``common.devices``; the tables then give the GPU's peak memory beside the host's).

Prints and writes to ``--out``: ``results.json`` (the layout of ``mnist_mlp.py``'s),
``results.md`` (a markdown table) and ``accuracy.png`` (test accuracy against batches and
against training seconds). Figures: test accuracy after batches 1, 5, 20 and 100 and after every
epoch, seconds per epoch (training only, evaluation excluded), every method's seconds to each
accuracy level, peak memory (max RSS), the FLN/Adam ratio of seconds per epoch, FLN's host reads
per unchecked batch and the BLAS kernels with NumPy's and PyTorch's GEMM rates
(``common.fln.host_reads``, ``common.devices.machine``). ``--seeds N`` runs every method with N
seeds (initial weights and batch order) and reports each figure's mean over them (the seconds to
an accuracy: their median), with the spread (max - min) of the final test accuracy. A method of
``--methods`` may carry its own launch (``NAME:tT``, ``NAME:rP``, ``NAME:rPtT``: threads, ranks;
Adam on ranks is PyTorch DDP), and each FLN launch is set against the fastest Adam launch.
``--group gloo`` or ``--group nccl`` trains FLN (of one rank) through a ``torch.distributed``
process group of that one process (``parallel.one_rank_group``: gloo, or NCCL on the GPU of
``--device torch``) instead of the no-op communicator of one process: every reduction a
collective, whose count and seconds per batch are printed, the communicator's own cost.

    python benchmarks/mnist_lenet5.py                     # full MNIST, 20 epochs
    python benchmarks/mnist_lenet5.py --dataset cifar10 --data-dir DIR   # CIFAR-10, 80 epochs
    python benchmarks/mnist_lenet5.py --quick             # embedded 5k MNIST, 2 epochs: a smoke run
    python benchmarks/mnist_lenet5.py --seeds 3 --threads 1 --jobs 2   # mean and spread of 3 seeds
    python benchmarks/mnist_lenet5.py --epochs 2 --seeds 3 \
        --methods fln:r2t1,fln:t1,adam:t1,adam:t2,adam:r2t1   # every launch on 2 cores, one run
    python benchmarks/mnist_lenet5.py --device torch --methods fln --epochs 1 --group nccl
"""

import argparse

import numpy as np

import common  # noqa: F401  (puts the repository on the path)
from common import data, flags, fln, reports, runner
from common.devices import DEVICES, machine
from common.flags import per_layer, steps_text
from fenchel_cvx import defaults
from fenchel_cvx.datasets import one_hot
from fenchel_cvx.paper_hyperparameters import from_reference

EARLY = (1, 5, 20, 100)  # the batches whose test accuracy the paper discusses
EPOCHS = {"mnist": 20, "cifar10": 80}
EVAL_CHUNK = 2000  # images per FLN evaluation pass (bounds the im2col memory)
#: the paper's appendix setting (its lambda_1..4, rho_1..5), in this package's units
PAPER_LAM, PAPER_GAMMA = from_reference(lam=(5, 5, 1, 1), rho=(1e-4, 1e-2, 1, 1, 1))
#: the defaults: the package's LeNet-5 training setting (``defaults.LeNet5``), chosen on the
#: validation split (docs page "Tuning", LeNet-5):
#: - lam and gamma: the paper's, with gamma 0.3 for the dense layers fc 120 and fc 84
#:   (validation: 0.9797 after 10 epochs against 0.9763; 0.1 gave 0.9793, the output layer's
#:   0.3 too 0.9785);
#: - FISTA steps per round of X_1 .. X_4: (1, 1, 10, 10) (0.9797 after 10 epochs, as with 10 each);
#: - W-block solves of W_0 .. W_4 that one Gram factorisation serves: the conv layers' patch
#:   Grams (26 x 392,000 and 151 x 50,000 columns a batch) for 40 batches (0.9797 after 10
#:   epochs with 40 or 8, as with a fresh one every batch; the dense layers' 500 columns: 0.9785
#:   with 8 on every layer);
#: - momentum beta_l of W_0 .. W_4 across batches: the conv layers' small, steady steps
#:   accumulate ("LeNet-5: momentum").
#: - rho of W_0 .. W_4: 0.3 on the output layer alone (validation after 20 epochs: 0.9896
#:   against 0.9863 without; 0.1 and 1 gave 0.9890 and 0.9888).
SETTING = defaults.training("lenet5", 4, batched=True)
#: the baselines' learning rates chosen on the validation split (``--validation 10000
#: --train-size 20000``, 10 epochs, seed 0, the FLN screens' protocol: benchmarks/tune_baselines.py,
#: docs/tuning.md); "sgd_momentum": SGD with
#: momentum 0.9 (flags.TUNED_MOMENTUM); the paper's: flags.PAPER_LR
TUNED_LR = {"sgd": 0.3, "sgd_momentum": 0.03, "adam": 1e-2}
LAM, GAMMA, X_STEPS = SETTING.lam, SETTING.gamma, SETTING.x_steps
GRAM_REUSE, MOMENTUM = SETTING.gram_reuse, SETTING.momentum


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    data.add_data_flags(p, datasets=tuple(EPOCHS))
    flags.add_run_flags(p, out=None, epochs=None, epochs_help="default: 20 (MNIST), 80 (CIFAR-10)")
    flags.add_baseline_flags(p, TUNED_LR)
    p.add_argument("--lam", type=per_layer(4, "--lam"), default=LAM)
    p.add_argument("--gamma", type=per_layer(5, "--gamma"), default=GAMMA)
    p.add_argument(
        "--rho",
        type=per_layer(5, "--rho"),
        default=tuple(SETTING.rho),
        help="FLN Frobenius penalty rho_l of W_0 .. W_4 (one number: all the same; "
        f"the paper's batched model: 0); default {','.join(map(str, SETTING.rho))}",
    )
    p.add_argument(
        "--w-steps",
        type=per_layer(5, "--w-steps", integers=True),
        default=SETTING.w_steps,
        help="FLN W-block steps per round, W_0 to W_4 (one "
        f"number: all the same); default {','.join(map(str, SETTING.w_steps))}",
    )
    p.add_argument(
        "--x-steps",
        type=per_layer(4, "--x-steps", integers=True),
        default=X_STEPS,
        help="FLN FISTA steps per round of each X-block, X_1 to X_4 (one number: all "
        "the same); default 1,1,10,10",
    )
    p.add_argument(
        "--momentum",
        type=per_layer(5, "--momentum"),
        default=MOMENTUM,
        help="FLN momentum beta_l in [0, 1) of W_0 .. W_4 across batches (one number: "
        f"all the same; 0: the paper's Algorithm 2); default {','.join(map(str, MOMENTUM))}",
    )
    p.add_argument(
        "--gram-reuse",
        type=per_layer(5, "--gram-reuse", integers=True),
        default=GRAM_REUSE,
        help="FLN W-block solves (one per batch) that one Gram "
        "factorisation of the preconditioner serves, W_0 to W_4 (one number: all the "
        f"same); default {','.join(map(str, GRAM_REUSE))}",
    )
    p.add_argument(
        "--train-eval",
        type=int,
        default=0,
        help="after every FLN epoch, report the "
        "training accuracy on the first N training images and each layer's relative "
        "weight change |W - W_init| / |W_init| (diagnostics, untimed; 0: off)",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    flags.add_group_flag(p)
    args = p.parse_args(argv)
    flags.check_run_flags(p, args)
    flags.check_group(p, args)
    data.check_data_flags(p, args)
    if args.train_eval < 0:
        p.error(f"--train-eval must be >= 0, got {args.train_eval}")
    if min(args.lam) <= 0:
        p.error(f"--lam must be > 0, got {','.join(map(str, args.lam))}")
    if max(args.momentum) >= 1:
        p.error(f"--momentum must be in [0, 1), got {','.join(map(str, args.momentum))}")
    if args.quick and args.dataset != "mnist":
        p.error(f"--quick runs the embedded 5k MNIST, got --dataset {args.dataset}")
    if args.epochs is None:
        args.epochs = 2 if args.quick else EPOCHS[args.dataset]
    if args.out is None:
        args.out = str(common.ROOT / "runs" / f"lenet5_{'quick' if args.quick else args.dataset}")
    flags.baseline_rates(p, args, TUNED_LR if args.dataset == "mnist" else None)  # tuned on MNIST
    return args


def load(args):
    """The run's data (``common.data.load``), checked to hold ``--train-eval`` images."""
    ds, desc = data.load(args)
    if args.train_eval > ds.X_train.shape[1]:
        raise SystemExit(
            f"--train-eval must be at most the {ds.X_train.shape[1]:,} training images, "
            f"got {args.train_eval}"
        )
    return ds, desc


def network(args, ds):
    from fenchel_cvx import lenet5

    return lenet5(
        input_shape=ds.image_shape,
        n_classes=ds.n_classes,
        activation="relu",
        loss="cross_entropy",
        lam=args.lam,
        rho=args.rho,
        seed=args.seed,
        dtype=args.dtype,
    )


# --- one method in its own process ------------------------------------------------------------
def run_fln(args, ds, batches):
    from fenchel_cvx.arrays import to_numpy

    dtype = np.dtype(args.dtype)
    xp, sync = DEVICES[args.device].lib()
    X, Xte, Y, ytr, yte = (
        xp.asarray(A)
        for A in (
            ds.X_train.astype(dtype, copy=False),
            ds.X_test.astype(dtype, copy=False),
            one_hot(ds.y_train, ds.n_classes).astype(dtype),
            ds.y_train,
            ds.y_test,
        )
    )
    net = network(args, ds)

    def accuracy(Xe, ye):  # in chunks: the im2col patches of 10,000 images would take GiBs
        hits = sum(
            int(
                xp.sum(
                    xp.argmax(net.forward(Xe[:, i : i + EVAL_CHUNK])[1], axis=0)
                    == ye[i : i + EVAL_CHUNK]
                )
            )
            for i in range(0, Xe.shape[1], EVAL_CHUNK)
        )
        return hits / Xe.shape[1]

    W_init = [np.array(W, copy=True) for W in net.W]
    net.W = [xp.asarray(W) for W in net.W]  # the untrained network's test accuracy, on the device

    def report():  # --train-eval: under- or overfitting, and which layers learn
        n = args.train_eval
        change = [
            float(np.linalg.norm(to_numpy(W) - W0) / np.linalg.norm(W0))
            for W, W0 in zip(net.W, W_init)
        ]
        return dict(
            train_accuracy=accuracy(X[:, :n], ytr[:n]),
            weight_change=[float(f"{c:.3g}") for c in change],
        )

    return fln.train_fln(
        args,
        net,
        X,
        Y,
        lambda: accuracy(Xte, yte),
        batches,
        fln.fln_backend(args, dtype=args.dtype),
        sync=sync,
        due=lambda seen: seen in EARLY or seen % args.eval_every == 0,
        announce=EARLY,
        epoch_report=report if args.train_eval else None,
    )


def run_backprop(args, ds, batches, optimizer):
    return runner.run_backprop(
        args,
        ds,
        batches,
        optimizer,
        network(args, ds),
        eval_at=EARLY,
        progress=not args.no_progress,
    )


# --- report -------------------------------------------------------------------------------------
def accuracy_at(ckpt, batch):
    return next((acc for seen, _, acc in ckpt if seen == batch), None)


def row(r):
    """One run's figures."""
    sec = r["seconds"]
    per_epoch = [b - a for a, b in zip([0.0] + sec[:-1], sec)]
    row = dict(
        final_test_accuracy=r["test_accuracy"][-1],
        test_accuracy=r["test_accuracy"],
        accuracy_at_batches={b: accuracy_at(r["checkpoints"], b) for b in EARLY},
        seconds_per_epoch=float(np.mean(per_epoch)),
        wall=r["wall"],
        peak_mib=r["peak_mib"],
        peak_gpu_mib=r.get("peak_gpu_mib"),
    )
    if "epoch_reports" in r:  # --train-eval
        row["epoch_reports"] = r["epoch_reports"]
    return row


def summarise(results, args, data_desc):
    """``results[method]``: one run per seed. Figures are seed means; the final test accuracy
    also per seed and its spread (max - min); peak memory the largest."""
    rows = {}
    for name, runs in results.items():
        per_seed = [row(r) for r in runs]
        at = {b: reports.mean([r["accuracy_at_batches"][b] for r in per_seed]) for b in EARLY}
        rows[name] = dict(
            reports.seed_summary(per_seed),
            wall=reports.mean([r["wall"] for r in per_seed]),
            accuracy_at_batches=at,
            **reports.level_figures(runs),
        )
        if "epoch_reports" in per_seed[0]:
            rows[name]["epoch_reports"] = per_seed[0]["epoch_reports"]  # the first seed's
    ratios = reports.ratios_over_adam(rows)
    # raw: one list of runs per method (one per seed), as in benchmarks/mnist_mlp.py
    return dict(
        data=data_desc,
        settings=vars(args),
        machine=machine(args),
        methods=rows,
        ratios=ratios,
        raw=results,
    )


def markdown(summary):
    fmt = lambda x: "n/a" if x is None else f"{x:.4f}"  # noqa: E731
    s = summary["settings"]
    spread = lambda r: f" +- {r['final_test_accuracy_spread']:.4f}" if s["seeds"] > 1 else ""  # noqa: E731
    lines = [
        f"LeNet-5 on {summary['data']}, batch {s['batch_size']}, {s['epochs']} epochs, "
        f"ranks x threads: {reports.launch_text(summary['methods'])}; "
        f"FLN gamma {s['gamma']}, lam {s['lam']}, "
        f"rho {s['rho']}, momentum {tuple(s['momentum'])}, W-steps {steps_text(s['w_steps'])}, "
        f"X-steps {steps_text(s['x_steps'])}",
        "",
        flags.rates_text(s),
        "",
        *(
            [
                f"seeds {s['seed']}..{s['seed'] + s['seeds'] - 1}: means; +- is the final test "
                "accuracy's spread (max - min)",
                "",
            ]
            if s["seeds"] > 1
            else []
        ),
        "| method | "
        + " | ".join(f"acc after {b} batch{'es' * (b > 1)}" for b in EARLY)
        + " | acc after epoch 2 | final test acc | s / epoch | peak MiB |",
        "|---" * (len(EARLY) + 5) + "|",
    ]
    for name, r in summary["methods"].items():
        e2 = r["test_accuracy"][1] if len(r["test_accuracy"]) > 1 else None
        lines.append(
            f"| {name} | "
            + " | ".join(fmt(r["accuracy_at_batches"][b]) for b in EARLY)
            + f" | {fmt(e2)} | {r['final_test_accuracy']:.4f}{spread(r)} | "
            f"{r['seconds_per_epoch']:.2f} | {reports.peak_text(r)} |"
        )
    names = list(summary["methods"])
    lines += [
        "",
        "Test accuracy after every epoch:",
        "",
        "| epoch | " + " | ".join(names) + " |",
        "|---" * (len(names) + 1) + "|",
    ]
    for e in range(max(len(r["test_accuracy"]) for r in summary["methods"].values())):
        lines.append(
            f"| {e + 1} | "
            + " | ".join(
                fmt(r["test_accuracy"][e] if e < len(r["test_accuracy"]) else None)
                for r in summary["methods"].values()
            )
            + " |"
        )
    lines += reports.level_table(summary)
    for k, v in summary["ratios"].items():
        lines.append(f"\n{k}: {v:.2f}")
    return "\n".join(lines) + "\n"


def main(argv=None):
    args = parse_args(argv)
    ds, data_desc = load(args)  # bad data (a missing or truncated batch file) fails here
    network(args, ds).check_inputs(ds.X_test[:, :1])
    out = reports.output_folder(args)  # after the data's checks: a bad file leaves no folder
    del ds
    tasks = runner.method_tasks(args)
    print(
        f"running {args.methods} ({args.seeds} seed(s) each), {args.jobs} at a time "
        f"({args.threads} threads each)",
        flush=True,
    )
    results = {m: [] for m in args.methods.split(",")}
    hooks = dict(load=load, run_fln=run_fln, run_backprop=run_backprop)
    for (m, _), result in zip(tasks, runner.run_methods(tasks, args.jobs, **hooks)):
        results[m].append(result)
    summary = summarise(results, args, data_desc)
    title = f"LeNet-5, {summary['data']}"
    draw = lambda path: reports.plot(summary, path, ylim=None, logx=True, title=title)  # noqa: E731
    reports.write_report(out, summary, markdown(summary), draw)


if __name__ == "__main__":
    main()
