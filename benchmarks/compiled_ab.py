"""A/B of the fast backend's CPU paths on whole training batches: eager NumPy, NumPy with
compiled chains, and everything in PyTorch.

Both MNIST benchmarks' FLN settings (the MLP 784-300-10 and LeNet-5, ``defaults.training``,
float32, batch 500, ``fit_bcd`` with the benchmarks' capped, unreported blocks) run the same
batches three ways: ``eager``, NumPy arrays and ``FastBackend(compile=False)``; ``compiled``,
NumPy arrays and ``FastBackend(compile=True)`` (``fast.fused``: the elementwise chains as fused
torch.compile kernels, NumPy's BLAS keeping the products); ``torch``, PyTorch tensors and
``compile=True`` (every operation in PyTorch: its GEMM runs the products, the same chains
compiled). They run in one process, round by round in turn, so that all see the same machine
load. Before the clock each path trains two batches (the compiled ones compile there; their
seconds are reported). Each
round trains ``--batches`` fresh batches from the same initial network and times them; the
table gives the median over ``--rounds`` of the ms per batch, and each block's ms per batch
summed over all rounds. ``--check-every`` runs the certificate as the benchmarks do (20).

The table's last column checks that the paths compute the same thing: each path's largest
relative weight difference from the eager path after the same batches,

    max over rounds r and layers l of  ||W_l(path, r) - W_l(eager, r)||_F / ||W_l(eager, r)||_F

(``W_l(path, r)``: layer l's weights at the end of round r, as float64; 0 for the eager path
itself). Frobenius norms, not the largest entry: float32 rounding alone (the eager path against
the same run in float64) moves single entries of the MLP's W_0 by ~1.7e-4 of its largest
after two batches, and the whole matrix by ~2e-5.

    python benchmarks/compiled_ab.py                      # both networks, one thread
    python benchmarks/compiled_ab.py --threads 2 --network lenet5
    python benchmarks/compiled_ab.py --quick              # the embedded 5k sample: a smoke run

It prints the BLAS libraries loaded and the kernels they run (threadpoolctl), NumPy's and
PyTorch's float32 GEMM rates at the MLP's W_0 shape (``common.devices.machine_text``), and each
network's host reads per unchecked batch (``common.fln.host_reads``, on array_api_strict arrays:
what a GPU would wait for). MNIST from ``--data-dir`` (default: ``$FENCHEL_DATA/mnist``).
"""

import argparse
import collections
import copy
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import mnist_mlp  # noqa: E402  (benchmarks/, on the path above)
from common import data, flags, fln  # noqa: E402
from common.devices import blas_record, machine_text  # noqa: E402
from fenchel_cvx import LiftedNetwork  # noqa: E402
from fenchel_cvx.bcd import fit_bcd  # noqa: E402
from fenchel_cvx.datasets import one_hot  # noqa: E402


def add_batch_flags(p, rounds):
    """The flags of a benchmark that times rounds of whole batches of both MNIST networks:
    ``--data-dir``, ``--network``, ``--batches``, ``--rounds`` (default ``rounds``), ``--quick``."""
    data.add_data_flags(p, validation=False, train_size=False)
    p.add_argument("--network", choices=["mlp", "lenet5", "both"], default="both")
    p.add_argument("--batches", type=int, default=10, help="batches a round times")
    p.add_argument("--rounds", type=int, default=rounds, help="rounds per path, taken in turn")
    p.add_argument(
        "--quick",
        action="store_true",
        help="the embedded 5k MNIST sample, 2 rounds of 2 batches: a smoke run",
    )


def batch_data(args):
    """The MNIST of ``add_batch_flags``'s flags (``--quick``: the embedded 5k sample), checked
    to hold the rounds' batches after the first 1,000 images (the warm-up's)."""
    ds, _ = data.load(args, dtype=np.float32)
    if 1000 + args.rounds * args.batches * 500 > ds.X_train.shape[1]:
        raise SystemExit(
            f"--rounds x --batches x 500 images must fit the {ds.X_train.shape[1]:,} "
            f"training images after the first 1,000, got {args.rounds} x {args.batches}"
        )
    return ds


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_batch_flags(p, rounds=4)
    p.add_argument(
        "--threads",
        type=int,
        default=1,
        help="cores of each path (NumPy's BLAS, PyTorch's kernels)",
    )
    p.add_argument("--check-every", type=int, default=20, help="fit_bcd's certificate schedule")
    args = p.parse_args(argv)
    if args.quick:
        args.batches, args.rounds = 2, 2
    flags.check_counts(p, args, ("threads", "batches", "rounds", "check_every"))
    return args


def setting(network, args, ds):
    """``(net, gamma, momentum, make_backend(compile))`` of a network's FLN setting: the MNIST
    benchmark's own (its defaults, network and ``fln_backend``)."""
    if network == "mlp":
        margs = mnist_mlp.parse_args(["--threads", str(args.threads)])
        net = LiftedNetwork(
            [784, 300, 10],
            "relu",
            "cross_entropy",
            lam=margs.lam[0],
            rho=margs.rho,
            seed=margs.seed,
            dtype=np.float32,
        )
        return (
            net,
            margs.gamma,
            margs.momentum,
            lambda compile: fln.fln_backend(margs, newton_cap=margs.newton_cap, compile=compile),
        )
    import mnist_lenet5

    largs = mnist_lenet5.parse_args(["--threads", str(args.threads)])
    net = mnist_lenet5.network(largs, ds)
    return (
        net,
        largs.gamma,
        largs.momentum,
        lambda compile: fln.fln_backend(largs, dtype="float32", compile=compile),
    )


def host_reads(network, args, ds):
    """``(reads, flops)``: the host reads and the products' FLOPs of one unchecked batch of the
    network's setting (``common.fln.host_reads``), by source; None where array_api_strict is
    not installed (the ``test`` extra)."""
    from fenchel_cvx.fast.reads import ProductFlops

    net, gamma, momentum, make = setting(network, args, ds)
    X = ds.X_train[:, :1500].astype(np.float32)
    Y = one_hot(ds.y_train[:1500], 10).astype(np.float32)
    flops = ProductFlops()
    reads = fln.host_reads(
        net, X, Y, make(False), 500, flops=flops, gamma=list(gamma), momentum=list(momentum)
    )
    return None if reads is None else (reads, flops)


def run(network, args, ds):
    net0, gamma, momentum, make = setting(network, args, ds)
    X = ds.X_train.astype(np.float32, copy=False)
    Y = one_hot(ds.y_train, 10).astype(np.float32)
    import torch

    paths = {"eager": make(False), "compiled": make(True), "torch": make(True)}
    # the torch path's data are tensors (views of the same memory): the driver, the blocks and
    # the weights work in PyTorch, its GEMM runs the products
    library = dict(eager=np.asarray, compiled=np.asarray, torch=torch.from_numpy)
    per_batch = collections.defaultdict(list)
    blocks = {name: collections.defaultdict(float) for name in paths}
    warm = {}
    weights = {}  # the round's weights of each path, as float64 NumPy arrays
    w_diff = dict.fromkeys(paths, 0.0)  # see the module docstring

    def fit(name, cols):
        asarray = library[name]
        return fit_bcd(
            copy.deepcopy(net0),
            asarray(np.ascontiguousarray(X[:, cols])),
            asarray(np.ascontiguousarray(Y[:, cols])),
            batch_size=500,
            gamma=list(gamma),
            momentum=list(momentum),
            backend=paths[name],
            strict=False,
            eval_every=None,
            check_every=args.check_every,
        ).net

    for name, backend in paths.items():
        solve = backend.solve

        def timed(block, start=None, solve=solve, name=name):
            t0 = time.perf_counter()
            res = solve(block, start)
            blocks[name][f"{type(block).__name__}{block.layer}"] += time.perf_counter() - t0
            return res

        backend.solve = timed
        t0 = time.perf_counter()
        fit(name, slice(0, 1000))
        warm[name] = time.perf_counter() - t0
        blocks[name].clear()
    n = args.batches * 500
    for r in range(args.rounds):
        for name in paths:
            t0 = time.perf_counter()
            net = fit(name, slice(1000 + r * n, 1000 + (r + 1) * n))
            per_batch[name].append(1e3 * (time.perf_counter() - t0) / args.batches)
            weights[name] = [np.asarray(W, dtype=np.float64) for W in net.W]
        for name in paths:
            w_diff[name] = max(
                w_diff[name],
                *(
                    float(np.linalg.norm(W - E) / np.linalg.norm(E))
                    for W, E in zip(weights[name], weights["eager"], strict=True)
                ),
            )
    total = args.rounds * args.batches
    print(
        f"\n{network}, {args.threads} thread(s), {args.rounds} rounds x {args.batches} batches "
        f"(check_every {args.check_every})"
    )
    print(
        "| path | ms / batch (median) | per round | first two batches (s) | blocks: ms / batch "
        "| W vs eager (max rel. Frobenius diff) |"
    )
    print("|---|---|---|---|---|---|")
    for name in paths:
        parts = ", ".join(f"{k} {v / total * 1e3:.1f}" for k, v in sorted(blocks[name].items()))
        print(
            f"| {name} | {np.median(per_batch[name]):.1f} | "
            f"{', '.join(f'{v:.1f}' for v in per_batch[name])} | {warm[name]:.1f} | {parts} "
            f"| {w_diff[name]:.2e} |"
        )
    return {name: float(np.median(v)) for name, v in per_batch.items()}


def main(argv=None):
    args = parse_args(argv)
    import torch

    ds = batch_data(args)
    record = blas_record(args.threads)  # (not ``machine``: it keeps the freed heap)
    rates = record["cpu_gemm_gflops"]
    print(f"{machine_text(record)} (torch {torch.__version__})")
    for network in ("mlp", "lenet5") if args.network == "both" else (args.network,):
        medians = run(network, args, ds)
        print(
            f"compiled / eager: {medians['compiled'] / medians['eager']:.3f}; "
            f"torch / eager: {medians['torch'] / medians['eager']:.3f}"
        )
        counted = host_reads(network, args, ds)
        if counted is not None:
            reads, flops = counted
            print(f"{network}: {fln.reads_text(reads.total, reads.by_function())}")
            print(
                f"products of an unchecked batch: {flops.total / 1e9:.2f} GFLOP, "
                f"{flops.total / rates['numpy'] / 1e6:.1f} ms at NumPy's GEMM rate above; "
                f"by source (MFLOP): "
                + ", ".join(
                    f"{k.removeprefix('fenchel_cvx.')} {v / 1e6:.0f}"
                    for k, v in list(flops.by_function().items())[:6]
                )
            )
    print(
        f"kernels compiled in this process (dynamo graphs): "
        f"{torch._dynamo.utils.counters['stats']['unique_graphs']}"
    )


if __name__ == "__main__":
    main()
