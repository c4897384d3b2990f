"""Timings of the fast backend's block solvers on an MNIST-sized lifted network.

A 784-300-10 ReLU network (``--sizes`` for others), cross-entropy, 500 MNIST training images
(the full MNIST, read from ``--data-dir``, default ``$FENCHEL_DATA/mnist``), at a realistic BCD
state: the feed-forward point, then one exact sweep of the X-blocks (last to first), so that the
W-blocks see lifted variables that differ from the feed-forward ones. Every block is then solved
from that state (the W-blocks warm-started at the current weights, with the proximal term
gamma ||W - W0||^2), to ``--tol`` and with ``w_steps`` in (1, 3, 10), in float32 and float64.

    python benchmarks/fast_blocks.py                       # NumPy, CPU
    python benchmarks/fast_blocks.py --device cupy         # CuPy, GPU
    python benchmarks/fast_blocks.py --sizes 784,300,100,10   # also an XHidden block
    python benchmarks/fast_blocks.py --lam 0.1 --rho 0 --gamma 1 --dtypes float32 [--no-span]
        # the MLP benchmark's W_0 block: capped steps in the span of the batch, or not (fast.span)
"""

import argparse
import copy
import dataclasses
import functools
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import fenchel_cvx.fast as fast  # noqa: E402
from common import data  # noqa: E402
from fenchel_cvx import blocks  # noqa: E402
from fenchel_cvx.datasets import one_hot  # noqa: E402
from fenchel_cvx.fast import FastBackend  # noqa: E402
from fenchel_cvx.network import LiftedNetwork  # noqa: E402


def load_batch(m, seed, data_dir):
    """``(X0, Y, source)``: m MNIST training images drawn at random (columns, in [0, 1]) and
    their one-hot labels, from ``--data-dir`` (``common.data.load``)."""
    rng = np.random.default_rng(seed)
    ds, _ = data.load(argparse.Namespace(data_dir=data_dir, dtype="float64"))
    idx = rng.choice(ds.y_train.shape[0], m, replace=False)
    X0, y = ds.X_train[:, idx], ds.y_train[idx].astype(int)
    return X0, one_hot(y, 10).astype(float), "MNIST"


def make_state(sizes, m, lam, rho, seed, data_dir):
    X0, Y, source = load_batch(m, seed, data_dir)
    Y = Y[: sizes[-1]] if sizes[-1] <= 10 else np.resize(Y, (sizes[-1], m))
    X0 = X0[: sizes[0]] if sizes[0] <= 784 else np.resize(X0, (sizes[0], m))
    net = LiftedNetwork(sizes, "relu", "cross_entropy", lam=lam, rho=rho, seed=seed)
    Xs, _ = net.forward(X0)
    exact = FastBackend(tol=1e-10, max_iter=5000)
    for l in range(net.n_hidden, 0, -1):  # one X-sweep, last to first
        Xs[l - 1] = exact.solve(blocks.x_block(net, X0, Y, Xs, l), start=Xs[l - 1]).argmin
    return net, X0, Y, Xs, source


def to_device(xp, net, X0, Y, Xs, dtype):
    def conv(A):
        return xp.asarray(A.astype(dtype))

    net.W = [conv(W) for W in net.W]
    return net, conv(X0), conv(Y), [conv(X) for X in Xs]


def block_list(net, X0, Y, Xs, gamma):
    out = [
        (
            f"x_{'last' if l == net.n_hidden else 'hidden'} (X_{l})",
            blocks.x_block(net, X0, Y, Xs, l),
            None,
        )
        for l in range(1, net.n_hidden + 1)
    ]
    for l in range(net.n_hidden + 1):
        b = blocks.w_block(net, X0, Y, Xs, l, gamma=gamma, W0=net.W[l])
        name = f"w_{'last' if l == net.n_hidden else 'hidden'} (W_{l} {tuple(net.W[l].shape)})"
        out.append((name, b, net.W[l]))
    return out


def timed(make_backend, block, start, repeats, sync):
    """Median wall time of ``repeats`` solves, each by a fresh backend (so each pays the Gram
    factorisation, as every new batch does in training)."""
    times, res = [], None
    for _ in range(repeats):
        backend = make_backend()
        sync()
        t0 = time.perf_counter()
        res = backend.solve(block, start=start)
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), res


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", choices=("numpy", "cupy"), default="numpy")
    ap.add_argument("--sizes", default="784,300,10")
    ap.add_argument("--m", type=int, default=500, help="batch size (data points)")
    ap.add_argument("--lam", type=float, default=1.0)
    ap.add_argument("--rho", type=float, default=1e-3)
    ap.add_argument("--gamma", type=float, default=1e-2)
    ap.add_argument("--tol", type=float, default=1e-6)
    ap.add_argument("--max-iter", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--dtypes", default="float32,float64")
    data.add_data_flags(ap, validation=False, train_size=False)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--newton-cap",
        type=int,
        default=None,
        help="FastBackend(newton_cap=...): None = default, 0 = no Newton rows",
    )
    ap.add_argument(
        "--baseline",
        action="store_true",
        help="the first version: shared-Gram PNCG only (no Newton rows, no row freezing)",
    )
    ap.add_argument(
        "--no-span",
        action="store_true",
        help="capped W-steps in parameter space also where fast.span applies (rho = 0, "
        "fewer points than inputs): the before of that change",
    )
    args = ap.parse_args(argv)

    if args.device == "cupy":
        try:
            import cupy as xp

            xp.cuda.runtime.getDeviceCount()
        except Exception as exc:  # ImportError, or no CUDA device / driver
            sys.exit(f"--device cupy needs CuPy and a CUDA GPU: {type(exc).__name__}: {exc}")
        sync = xp.cuda.Device().synchronize
        device = (
            f"CuPy {xp.__version__} on {xp.cuda.runtime.getDeviceProperties(0)['name'].decode()}"
        )
    else:
        xp, sync, device = (
            np,
            (lambda: None),
            f"NumPy {np.__version__} on CPU ({os.cpu_count()} cores)",
        )

    if args.baseline:
        solve = fast.solve_pncg

        def no_freezing(xp, block, W, tol, max_iter, cache, settings):  # rows never frozen
            frozen_never = dataclasses.replace(settings, compact_every=10**9)
            return solve(xp, block, W, tol, max_iter, cache, frozen_never)

        fast.solve_pncg = no_freezing
        args.newton_cap = 0
    if args.no_span:
        fast.wblocks.span.applies = lambda *a: False
    sizes = tuple(int(s) for s in args.sizes.split(","))
    print(
        f"fast backend, {'-'.join(map(str, sizes))} ReLU, cross-entropy, m={args.m}, "
        f"lam={args.lam}, rho={args.rho}, gamma={args.gamma}, tol={args.tol}, "
        f"newton_cap={args.newton_cap}"
        f"{' (baseline)' if args.baseline else ''}{' (no span)' if args.no_span else ''}; {device}"
    )
    base = make_state(sizes, args.m, args.lam, args.rho, args.seed, args.data_dir)
    print(f"data: {base[-1]}; times: median of {args.repeats} cold solves (fresh backend each)\n")
    hdr = (
        f"{'block':28s} {'dtype':7s} {'mode':10s} {'seconds':>8s} {'iters':>6s} {'status':>8s} "
        f"{'residual':>9s} {'value - v*':>11s}"
    )
    print(hdr + "\n" + "-" * len(hdr))
    for dtype in args.dtypes.split(","):
        net, X0, Y, Xs, _ = base
        net, X0d, Yd, Xsd = to_device(xp, copy.copy(net), X0, Y, Xs, np.dtype(dtype))
        for name, block, start in block_list(net, X0d, Yd, Xsd, args.gamma):
            modes = [("tol", None)] + (
                [(f"w_steps={k}", k) for k in (1, 3, 10)] if start is not None else []
            )
            ref = None
            for mode, k in modes:
                make = functools.partial(
                    FastBackend,
                    tol=args.tol,
                    max_iter=args.max_iter,
                    w_steps=k,
                    newton_cap=args.newton_cap,
                )
                sec, r = timed(make, block, start, args.repeats, sync)
                ref = r.value if ref is None else ref
                gap = (r.value - ref) / max(abs(ref), 1e-300)
                print(
                    f"{name:28s} {dtype:7s} {mode:10s} {sec:8.3f} {r.iterations:6d} {r.status:>8s} "
                    f"{r.residual:9.1e} {gap:+11.1e}",
                    flush=True,
                )
        print()
    print(
        "value - v*: relative to the value solved to tol in the same dtype (w_steps rows: how far "
        "k warm-started steps get)."
    )


if __name__ == "__main__":
    main()
