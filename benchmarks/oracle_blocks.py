"""Benchmark of the CVXPY oracle (fenchel_cvx.oracle) on every block of two ReLU networks.

    (a) 64-32-10 on 1,000 scikit-learn digits (pixels / 16)        goal: all blocks <= 2 s
    (b) 784-300-10 on 500 MNIST training images (pixels / 255)      goal: all blocks <= 30 s

for the mse and the cross_entropy loss. A two-layer network has no hidden X-block, so a
three-layer case of each size (64-32-32-10, 784-300-100-10) adds its X_1 block (only that block
is solved there; it is reported, not counted in the goals). Lifted variables: the feed-forward
point plus Gaussian noise (0.1 x the
layer's standard deviation), projected into the activation's range, so no block is trivial.
For each block: the first solve with a fresh backend (template compilation included) and a
repeated solve of the same-shape block with new values (lifted variables re-drawn), the KKT
residual and the number of pieces. Speed goals are reported, not asserted.

    python benchmarks/oracle_blocks.py [--sizes digits,mnist] [--n-jobs 1] [--solver CLARABEL]
                                       [--dask-workers N] [--scheduler tcp://host:8786]
                                       [--compare]

The oracle solves the W-blocks that have one by their exact methods (``oracle/exact.py``) and
the MSE X_L block by nonnegative least squares on one shared Gram matrix; ``--compare`` also
solves every case with ``OracleBackend(exact=False)`` (the CVXPY templates, and
``scipy.optimize.nnls`` column by column: the oracle before the exact methods), in the same
run, and prints both.

``--n-jobs k > 1`` solves the pieces on a Dask LocalCluster of k workers that the backend starts;
``--dask-workers N`` on a LocalCluster of N workers started here (N = 1 and 2 give the 1 -> 2
worker scaling on equal terms); ``--scheduler`` on a running Dask cluster.
"""

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common import data  # noqa: E402
from fenchel_cvx import LiftedNetwork  # noqa: E402
from fenchel_cvx.blocks import XHidden, w_block, x_block  # noqa: E402
from fenchel_cvx.oracle import OracleBackend  # noqa: E402
from fenchel_cvx.oracle.cluster import local_cluster  # noqa: E402

GOALS = {"digits": 2.0, "mnist": 30.0}


def load_digits(m=1000):
    from sklearn.datasets import load_digits as _ld

    d = _ld()
    return d.data[:m].T / 16.0, d.target[:m]


def mnist_batch(data_dir, m=500):
    """The first ``m`` MNIST training images of ``--data-dir`` (``common.data.load``)."""
    ds, _ = data.load(argparse.Namespace(data_dir=data_dir, dtype="float64"))
    return np.asfortranarray(ds.X_train[:, :m]), ds.y_train[:m]


def lifted_point(net, X0, seed, noise=0.1):
    rng = np.random.default_rng(seed)
    Xs, _ = net.forward(X0)
    return [
        act.project(X + noise * (X.std() + 1e-12) * rng.standard_normal(X.shape))
        for act, X in zip(net.activations, Xs)
    ]


def blocks_of(net, X0, Y, Xs, gamma=0.0):
    L = net.n_hidden
    out = [(f"x_hidden l={l}", x_block(net, X0, Y, Xs, l)) for l in range(1, L)]
    out.append((f"x_last l={L}", x_block(net, X0, Y, Xs, L)))
    out += [(f"w_hidden l={l}", w_block(net, X0, Y, Xs, l)) for l in range(L)]
    out.append((f"w_last l={L}", w_block(net, X0, Y, Xs, L)))
    return out


def run(size, sizes, loss, args, rows, exact=True):
    X0, y = load_digits() if size == "digits" else mnist_batch(args.data_dir)
    net = LiftedNetwork(sizes, activation="relu", loss=loss, lam=1.0, rho=1e-3, seed=0)
    Y = np.eye(sizes[-1])[y].T
    first = blocks_of(net, X0, Y, lifted_point(net, X0, 1))
    again = blocks_of(net, X0, Y, lifted_point(net, X0, 2))
    if net.n_hidden > 1:  # the deep case only adds the hidden X-block
        first, again = (
            [(n, b) for n, b in blocks if isinstance(b, XHidden)] for blocks in (first, again)
        )
    backend = OracleBackend(solver=args.solver, n_jobs=args.n_jobs, client=args.client, exact=exact)
    method = "exact" if exact else "cvxpy"
    for (name, b1), (_, b2) in zip(first, again):
        c0 = time.process_time()
        r1 = backend.solve(b1)
        c1 = time.process_time()
        r2 = backend.solve(b2)
        c2 = time.process_time()
        rows.append(
            dict(
                size=size,
                net="-".join(map(str, sizes)),
                loss=loss,
                block=name,
                method=method,
                first=r1.seconds,
                repeat=r2.seconds,
                cpu_first=c1 - c0,
                cpu_repeat=c2 - c1,
                residual=max(r1.residual, r2.residual),
                pieces=r2.info.get("n_subproblems"),
                solver=r2.info["solver"],
                polish=r2.info.get("polish_steps", 0),
                status=r2.status,
            )
        )
        print(
            f"  {rows[-1]['net']:>15s} {loss:13s} {method:6s} {name:14s} "
            f"first {r1.seconds:7.2f} s   repeat {r2.seconds:7.2f} s (cpu {c2 - c1:6.2f})  "
            f"residual {rows[-1]['residual']:.1e}   "
            f"[{r2.info['solver']}, polish {r2.info.get('polish_steps', 0)}]",
            flush=True,
        )
    backend.close()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="digits,mnist")
    data.add_data_flags(ap, validation=False, train_size=False)
    ap.add_argument("--losses", default="mse,cross_entropy")
    ap.add_argument("--n-jobs", type=int, default=1)
    ap.add_argument("--solver", default=None)
    ap.add_argument("--no-deep", action="store_true", help="skip the three-layer (x_hidden) cases")
    ap.add_argument(
        "--dask-workers",
        type=int,
        default=None,
        help="solve on a Dask LocalCluster of this many single-threaded workers",
    )
    ap.add_argument("--scheduler", default=None, help="address of a running Dask scheduler")
    ap.add_argument(
        "--compare",
        action="store_true",
        help="also solve every case with exact=False (the CVXPY templates only)",
    )
    args = ap.parse_args(argv)
    args.client = cluster = None
    if args.dask_workers is not None or args.scheduler is not None:
        from distributed import Client

        if args.scheduler is not None:
            args.client = Client(args.scheduler)
        else:
            if args.dask_workers < 1:
                raise ValueError(f"--dask-workers must be >= 1, got {args.dask_workers}")
            args.client, cluster = local_cluster(args.dask_workers)  # the backend's own kind
    nets = {
        "digits": [(64, 32, 10), (64, 32, 32, 10)],
        "mnist": [(784, 300, 10), (784, 300, 100, 10)],
    }
    rows = []
    t0 = time.perf_counter()
    load0 = f"{os.getloadavg()[0]:.2f}"
    for size in args.sizes.split(","):
        for loss in args.losses.split(","):
            for sizes in nets[size][: 1 if args.no_deep else 2]:
                for exact in (False, True) if args.compare else (True,):
                    run(size, sizes, loss, args, rows, exact)
    print(
        f"\n{'network':>15s} {'loss':13s} {'method':6s} {'block':14s} {'first s':>8s} "
        f"{'repeat s':>9s} {'cpu s':>7s} {'residual':>9s} {'pieces':>6s}  solver"
    )
    for r in rows:
        print(
            f"{r['net']:>15s} {r['loss']:13s} {r['method']:6s} {r['block']:14s} "
            f"{r['first']:8.2f} {r['repeat']:9.2f} "
            f"{r['cpu_repeat']:7.2f} {r['residual']:9.1e} {r['pieces']:6d}  {r['solver']}"
        )
    print(
        "\nspeed goals (two-layer networks, all four blocks; "
        "the repeated solves / the first solves):"
    )
    for size in args.sizes.split(","):
        net = "-".join(map(str, nets[size][0]))
        for loss in args.losses.split(","):
            for method in ("cvxpy", "exact"):
                sel = [
                    r
                    for r in rows
                    if r["net"] == net and r["loss"] == loss and r["method"] == method
                ]
                if not sel:
                    continue
                rep, fst = sum(r["repeat"] for r in sel), sum(r["first"] for r in sel)
                cpu = sum(r["cpu_repeat"] for r in sel)
                met = "met" if rep <= GOALS[size] else "NOT met"
                print(
                    f"  {net:>15s} {loss:13s} {method:6s} repeat {rep:7.2f} s (main-process cpu "
                    f"{cpu:6.2f} s), first {fst:7.2f} s  (goal {GOALS[size]:.0f} s: {met})"
                )
    where = (
        ""
        if args.client is None
        else f", Dask workers={len(args.client.scheduler_info()['workers'])}"
    )
    print(
        f"total wall time {time.perf_counter() - t0:.1f} s, n_jobs={args.n_jobs}{where}, "
        f"load average {load0} -> {os.getloadavg()[0]:.2f} (other processes share the cores)"
    )
    if cluster is not None:  # (the client of a running cluster is closed by the interpreter)
        args.client.close()
        cluster.close()


if __name__ == "__main__":
    main()
