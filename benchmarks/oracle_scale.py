"""The oracle at the fast path's scale, block by block: Figure 1's blocks on all of MNIST.

Figure 1's network (the paper's Sec. 5.1: 784-300-10, ReLU, MSE; lam 0.1 in the paper's units,
0.2 in this package's, ``paper_hyperparameters.from_reference``; rho (1, 10) as
``benchmarks/mnist_lifted.py``), float64, on the first ``--m`` training images (all 60,000 by
default). The inputs of Algorithm 1's first iteration: the Xavier start (``LiftedNetwork``'s
seed 0), one feed-forward pass, then the X-sweep, whose only block is X_1 = X_L (MSE after a
ReLU: ``oracle.output_dual``, the dual in the output dimension), then the W-sweep. This script
measures

* the X_L block by its dual (``oracle.output_dual``): time, Newton steps, its KKT residual
  recomputed by ``blocks.kkt_residual``, and its distance to ``scipy.optimize.nnls`` on a few
  columns;
* ``--rows`` rows of the W_0 block (``X~_0`` the images with a row of ones, ``X_1`` from the
  X-sweep) by the active-set Newton method of ``oracle.active_rows``, from the Xavier weights:
  per row the time, the Newton steps, the points that changed sides at each step and the row's
  KKT residual recomputed by ``blocks.kkt_residual`` on the block of that row alone;
* the same rows warm: after ``X_1 + 1e-3 |noise|`` (a next iteration's small move of ``X_1``),
  from the rows just solved;
* the Gram ``X~_0 X~_0^T``, formed once (the data: once per run);
* the oracle's own route on those rows (``exact.attempt`` on the block of those rows: the
  ``active`` route of ``oracle.rows``, each row certified by its recomputed gradient, the block
  by ``blocks.kkt_residual``), cold;

and extrapolates to the block's 300 rows on 2 workers (each forms its own Gram), cold and warm.

With ``--workers N`` it measures instead, after the X-sweep, the whole W_0 block's rows on a Dask
``LocalCluster`` of ``N`` single-threaded workers (``oracle.dask_rows``: ``X~_0`` sent once, by
a file in shared memory, each worker one contiguous share of the rows, T formed on each):
``exact.attempt`` on the block from the Xavier weights (cold), then on the moved block from the
rows just solved (warm: the workers keep each row's Gram), each certified in this process by
``blocks.kkt_residual``; wall seconds, split into the rows on the workers and the rest (digest,
sending X~_0 on the first call, the driver's certificate). This process and the workers keep
their freed memory (``heap.keep_freed_memory``), as ``oracle_iteration.py``'s do.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE \\
        python benchmarks/oracle_scale.py [--data-dir DIR] [--rows 32] [--m 60000] [--workers N]
"""

import argparse
import sys
import time
from pathlib import Path

import numpy as np
from threadpoolctl import threadpool_limits

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common import data  # noqa: E402
from fenchel_cvx import LiftedNetwork  # noqa: E402
from fenchel_cvx.blocks import kkt_residual, w_block, x_block  # noqa: E402
from fenchel_cvx.datasets import one_hot  # noqa: E402
from fenchel_cvx.heap import keep_freed_memory  # noqa: E402
from fenchel_cvx.oracle import active_rows, dask_rows, exact, nnls, output_dual  # noqa: E402
from fenchel_cvx.oracle.cluster import local_cluster  # noqa: E402

SIZES = (784, 300, 10)
RHO = (1.0, 10.0)
TOL = 1e-6  # the certificate: every block's KKT residual <= 1e-6
WORKERS = 2


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    data.add_data_flags(p, validation=False)
    p.add_argument("--rows", type=int, default=32, help="W_0 rows to solve, one batch (default 32)")
    p.add_argument("--m", type=int, default=60000, help="training images (default 60,000)")
    p.add_argument("--threads", type=int, default=1, help="BLAS threads (default 1)")
    p.add_argument("--lam", type=float, default=0.2, help="lam, this package's units (0.2)")
    p.add_argument(
        "--workers", type=int, default=0, help="the whole W_0 block on N Dask workers (0: off)"
    )
    args = p.parse_args(argv)
    for name in ("rows", "m", "threads"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    if args.workers < 0:
        p.error(f"--workers must be >= 0, got {args.workers}")
    return args


def inputs(args):
    """The network at its Xavier start, ``X0`` (784 x m), one-hot ``Y``, the feed-forward X_1."""
    ds, desc = data.load(argparse.Namespace(data_dir=args.data_dir, dtype="float64"))
    if args.m > ds.X_train.shape[1]:
        raise SystemExit(f"--m must be <= the {ds.X_train.shape[1]} training images, got {args.m}")
    X0 = np.ascontiguousarray(ds.X_train[:, : args.m])
    Y = one_hot(ds.y_train[: args.m], SIZES[-1])
    net = LiftedNetwork(SIZES, loss="mse", lam=args.lam, rho=RHO, seed=0)
    Xs, _ = net.forward(X0)
    return net, X0, Y, Xs, desc


def x_sweep(net, X0, Y, Xs):
    """Algorithm 1's X-sweep (the X_L block alone): the dual method, timed and checked."""
    block = x_block(net, X0, Y, Xs, 1)
    t0 = time.perf_counter()
    Z, R, steps, unsolved = output_dual.solve_x_last(block)
    seconds = time.perf_counter() - t0
    res = kkt_residual(block, Z)
    cols = np.linspace(0, Z.shape[1] - 1, 50).astype(int)
    ref = nnls.solve_columns(
        block.dense_W(), Y[:, cols], block.U_prev[:, cols], block.lam_in, False
    )
    print(
        f"X_1 (X_L, MSE + ReLU) by its dual: {seconds:.2f} s, {steps} Newton steps, "
        f"{unsolved} columns unsolved, KKT residual {res:.2e}, "
        f"max |Z - scipy nnls| on 50 columns {np.max(np.abs(Z[:, cols] - ref)):.1e}"
    )
    return Z


def solve_rows(label, block, rows, idx, starts):
    """The rows ``idx`` of ``block`` by ``active_rows`` (one batch) from ``starts``, timed (wall
    and CPU: the machine is shared) and checked; returns the rows and the seconds a row."""
    Q = block.lam * (block.V[idx] @ block.Xt.T)
    t0, c0 = time.perf_counter(), time.process_time()
    W, reports = active_rows.solve_rows(rows, Q, starts, 0.01 * TOL, batch=idx.size)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    res = [kkt_residual(block.restrict(np.array([i])), W[k][None, :]) for k, i in enumerate(idx)]
    steps = [rep.steps for rep in reports]
    print(
        f"  {label}: {idx.size} rows in one batch, {wall:.2f} s wall, {cpu:.2f} s CPU "
        f"({cpu / idx.size:.2f} s CPU a row); Newton steps {min(steps)}-{max(steps)}, "
        f"finite termination {sum(rep.exact for rep in reports)}/{idx.size}, "
        f"max row KKT residual {max(res):.2e} (certified <= {TOL:g}: {max(res) <= TOL})"
    )
    for k in (0, idx.size // 2, idx.size - 1)[: idx.size]:
        print(f"    row {idx[k]:3d}: changes per step {reports[k].changes}")
    return W, cpu / idx.size


def w_rows(net, X0, Y, Z, n_rows):
    """``n_rows`` rows of the W_0 block by ``active_rows``, from the Xavier weights (cold), then
    again after a small move of ``X_1`` (warm); then the oracle's route on those rows."""
    block = w_block(net, X0, Y, [Z], 0)
    rows = active_rows.Rows.of(block.Xt, block.lam, block.rho + block.gamma)
    t0, c0 = time.perf_counter(), time.process_time()
    rows.T  # noqa: B018  # the Gram X~ X~^T, formed once
    wall, t_gram = time.perf_counter() - t0, time.process_time() - c0
    print(f"W_0 block: {block.shape[0]} rows of {block.shape[1]} on {block.Xt.shape[1]:,} points")
    print(
        f"  X~_0 X~_0^T on the {rows.S.size} nonzero inputs (once per block): "
        f"{wall:.2f} s wall, {t_gram:.2f} s CPU"
    )
    idx = np.linspace(0, block.shape[0] - 1, n_rows).astype(int)
    W, cold = solve_rows("cold", block, rows, idx, net.W[0][idx])
    noise = np.random.default_rng(1).standard_normal(Z.shape)
    moved = w_block(net, X0, Y, [np.maximum(Z + 1e-3 * np.abs(noise), 0.0)], 0)
    _, warm = solve_rows("warm", moved, rows, idx, W)
    sub = block.restrict(idx)
    found = exact.attempt(sub, net.W[0][idx], TOL)
    print(
        f"  oracle (exact.attempt on these {idx.size} rows, cold, T formed again): "
        f"{found.seconds:.2f} s wall, {found.info['solver']}, certified {found.certified}, "
        f"KKT residual {found.residual:.2e}, uncertified rows {found.info['uncertified_rows']}, "
        f"fallback steps {found.info['fallback_steps']}"
    )
    return block.shape[0], t_gram, cold, warm


def _peak_rss():
    """This process's peak resident memory in bytes (Linux: ``ru_maxrss`` in KiB)."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def on_workers(net, X0, Y, Z, n_workers):
    """The whole W_0 block on ``n_workers`` Dask workers, cold then warm (see the docstring)."""
    block = w_block(net, X0, Y, [Z], 0)
    noise = np.random.default_rng(1).standard_normal(Z.shape)
    moved = w_block(net, X0, Y, [np.maximum(Z + 1e-3 * np.abs(noise), 0.0)], 0)
    client, cluster = local_cluster(n_workers)  # the backend's own kind of cluster
    try:
        workers = dask_rows.WorkerRows(lambda: client)
        solve, seconds = workers.solve, []

        def timed(*args):
            t0 = time.perf_counter()
            out = solve(*args)
            seconds.append(time.perf_counter() - t0)
            return out

        workers.solve = timed  # type: ignore[method-assign]
        print(
            f"W_0 block on {n_workers} Dask workers: {block.shape[0]} rows of {block.shape[1]} "
            f"on {block.Xt.shape[1]:,} points"
        )
        start = net.W[0]
        for label, b in (("cold", block), ("warm", moved)):
            t0 = time.perf_counter()
            found = exact.attempt(b, start, TOL, workers)
            wall = time.perf_counter() - t0
            info = found.info
            print(
                f"  {label}: {wall:.1f} s wall (rows on the workers {seconds[-1]:.1f} s, "
                f"the rest {wall - seconds[-1]:.1f} s), {info['solver']}, certified "
                f"{found.certified}, KKT residual {found.residual:.2e}, Newton steps "
                f"{info['newton_steps']}, uncertified rows {info['uncertified_rows']}, "
                f"rows from a kept Gram {info['kept_grams']}, data sets sent so far {workers.sends}"
            )
            start = found.argmin
        held = client.run(_peak_rss)
        print(
            "  peak memory (max RSS): workers "
            + ", ".join(f"{v / 2**30:.2f} GiB" for v in held.values())
            + f"; this process {_peak_rss() / 2**30:.2f} GiB"
        )
    finally:
        client.close()
        cluster.close()


def main(argv=None):
    args = parse_args(argv)
    keep_freed_memory()  # the temporaries reuse the heap (fenchel_cvx/heap.py)
    with threadpool_limits(args.threads):
        t0 = time.perf_counter()
        net, X0, Y, Xs, desc = inputs(args)
        print(f"{desc}; m = {args.m:,}, lam {args.lam:g}, rho {RHO}, {args.threads} BLAS thread(s)")
        print(f"load + feed-forward: {time.perf_counter() - t0:.2f} s")
        Z = x_sweep(net, X0, Y, Xs)
        if args.workers:
            on_workers(net, X0, Y, Z, args.workers)
            return
        n_rows, t_gram, cold, warm = w_rows(net, X0, Y, Z, args.rows)
    for label, per_row in (("cold", cold), ("warm", warm)):
        total = t_gram + n_rows * per_row / WORKERS
        print(
            f"extrapolation ({label}, CPU): {n_rows} rows x {per_row:.2f} s / {WORKERS} workers "
            f"+ the Gram {t_gram:.2f} s (each worker's own) = {total:.1f} s for the W_0 block"
        )


if __name__ == "__main__":
    main()
