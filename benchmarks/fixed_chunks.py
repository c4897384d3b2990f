"""The cost of results bitwise independent of the ranks: every product of a batch on fixed chunks.

On P ranks each rank holds 1/P of a batch's columns (data points), and a sum over the points
adds the ranks' partial sums (``reduce.py``). For a run to be bitwise the same on every P that
divides a fixed number of chunks C, the sums would have to add C fixed chunks of the batch in
one order. That alone is not enough where BLAS rounds a product's column differently by how
many columns the product has: then every product that a rank takes on its columns must be taken
chunk by chunk in the one-process run too. This script measures both facts on this machine:

1. whether a product's columns here depend on the number of columns: the MNIST MLP's
   ``W_0 X~_0`` on a batch of 500 against the same product on its first 250 and 167 columns
   (the shares of 2 and 3 ranks), compared bit for bit, in float32 and float64;
2. what a batch's products cost on C fixed chunks of the batch. Both MNIST benchmarks' FLN
   settings (``compiled_ab.setting``: the MLP and LeNet-5, batch 500, the benchmarks' capped
   blocks, in ``--dtype``) train ``--batches`` batches on ``array_api_strict`` arrays (the fast
   solvers' code, unchanged), which records the shape of every matrix product (``Recorder``, a
   ``fast.reads.ProductFlops``). Each recorded product then runs in NumPy on arrays of its
   shapes, as one product and on C fixed chunks of the axis that spans the batch (a multiple of
   500 long: the columns, concatenated, or the contracted axis, the chunks' partial sums added
   in chunk order; ``--chunks`` C, ``numpy.array_split``'s pieces: of a convolution's patches,
   runs of positions and points), the median of ``--repeats`` times each, on fresh C-ordered
   operands. Beside them, the same batches' time on NumPy arrays (the eager fast path).

The chunked products' extra time over the NumPy batch is the cost of the fixed-chunk order's
products alone, a floor of its cost: the elementwise sums over points (values, inner products)
would also run by chunk, and the ranks' collectives would move C partial sums where they move P.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/fixed_chunks.py --data-dir DIR
    python benchmarks/fixed_chunks.py --quick          # the embedded 5k sample: a smoke run
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

from common import data, flags  # noqa: E402
from common.devices import blas_record, machine_text  # noqa: E402
from common.timing import median_ms  # noqa: E402
from compiled_ab import setting  # noqa: E402
from fenchel_cvx.arrays import to_numpy  # noqa: E402
from fenchel_cvx.bcd import fit_bcd  # noqa: E402
from fenchel_cvx.datasets import one_hot  # noqa: E402
from fenchel_cvx.fast import FastBackend  # noqa: E402
from fenchel_cvx.fast.reads import ProductFlops  # noqa: E402

BATCH = 500


class Recorder(ProductFlops):
    """``fast.reads.ProductFlops`` (the ``array_api_strict`` products counted while active),
    which also records each product's operand shapes and dtype (``counts``: ``(A.shape,
    B.shape, dtype) -> calls``)."""

    def __init__(self) -> None:
        super().__init__("array_api_strict")
        self.counts: collections.Counter = collections.Counter()

    def amount(self, out, A, B):
        self.counts[(tuple(A.shape), tuple(B.shape), str(A._array.dtype))] += 1
        return super().amount(out, A, B)


def _pieces(n, chunks):
    """``numpy.array_split``'s ``chunks`` pieces of ``range(n)``, as slices (the empty ones
    left out)."""
    bounds = np.cumsum([0] + [len(s) for s in np.array_split(np.arange(n), chunks)])
    return [slice(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:]) if b > a]


def by_chunks(a, b, chunks, m=BATCH):
    """``a @ b`` on ``chunks`` fixed chunks of the axis that spans a batch of ``m``: b's
    columns (concatenated) or the contracted axis (partial sums added in chunk order); one
    product where neither does."""
    if b.ndim >= 2 and b.shape[-1] % m == 0:
        return np.concatenate([a @ b[..., s] for s in _pieces(b.shape[-1], chunks)], axis=-1)
    if a.shape[-1] % m == 0:
        total = None
        for s in _pieces(a.shape[-1], chunks):
            part = a[..., s] @ (b[..., s, :] if b.ndim >= 2 else b[s])
            total = part if total is None else total + part
        return total
    return a @ b


def columns_depend_on_width(X):
    """``{P: bool}``: whether the MLP's ``W_0 X`` (300 x 784 weights, the batch's 500 images
    ``X``, in X's dtype) rounds a column differently when the product takes 1/P of the columns
    (each rank's)."""
    rng = np.random.default_rng(0)
    W = rng.standard_normal((300, X.shape[0])).astype(X.dtype)
    whole = W @ X
    return {
        P: not all(
            np.array_equal(whole[:, s], W @ np.ascontiguousarray(X[:, s]))
            for s in _pieces(BATCH, P)
        )
        for P in (2, 3)
    }


def run(network, args, ds):
    import array_api_strict as xps

    net0, gamma, momentum, make = setting(network, args, ds)
    X = ds.X_train[:, : (args.batches + 2) * BATCH].astype(args.dtype)
    Y = one_hot(ds.y_train[: X.shape[1]], 10).astype(args.dtype)
    backend = make(False)
    strict = lambda A: xps.asarray(to_numpy(A))  # noqa: E731

    def fit(asarray, backend, cols):
        net = copy.deepcopy(net0)
        net.W = [asarray(np.asarray(W, dtype=args.dtype)) for W in net.W]
        fit_bcd(
            net,
            *(asarray(np.ascontiguousarray(A[:, cols])) for A in (X, Y)),
            batch_size=BATCH,
            gamma=list(gamma),
            momentum=list(momentum),
            backend=backend,
            strict=False,
            eval_every=None,
            check_every=args.check_every,
        )

    timed = slice(2 * BATCH, X.shape[1])
    fit(np.asarray, backend, slice(0, 2 * BATCH))  # warm-up: two batches
    batch_ms = []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        fit(np.asarray, backend, timed)
        batch_ms.append(1e3 * (time.perf_counter() - t0) / args.batches)
    with Recorder() as recorder:
        fit(strict, FastBackend(**{**backend.options(), "compile": False}), timed)
    rng = np.random.default_rng(0)
    one = chunked = 0.0
    for (sa, sb, dtype), calls in recorder.counts.items():
        a, b = (rng.standard_normal(s).astype(dtype) for s in (sa, sb))
        one += calls * median_ms(lambda a=a, b=b: a @ b, args.repeats, warm=False)
        chunked += calls * median_ms(
            lambda a=a, b=b: by_chunks(a, b, args.chunks), args.repeats, warm=False
        )
    n = args.batches
    ms = float(np.median(batch_ms))
    extra = (chunked - one) / n
    print(
        f"\n{network}, {args.dtype}, one thread, {n} batches of {BATCH}: "
        f"{ms:.1f} ms a batch (NumPy, eager; {', '.join(f'{t:.1f}' for t in batch_ms)}); "
        f"{sum(recorder.counts.values()) / n:.0f} products a batch, "
        f"{one / n:.1f} ms as they are, {chunked / n:.1f} ms in {args.chunks} fixed chunks: "
        f"{extra:+.1f} ms, {100 * extra / ms:+.0f} % of the batch"
    )
    return dict(batch_ms=ms, products_ms=one / n, chunked_ms=chunked / n, share=extra / ms)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    data.add_data_flags(p, validation=False, train_size=False)
    p.add_argument("--network", choices=["mlp", "lenet5", "both"], default="both")
    p.add_argument("--batches", type=int, default=10, help="batches timed and recorded")
    p.add_argument("--quick", action="store_true", help="the embedded 5k sample, 2 batches")
    p.add_argument("--chunks", type=int, default=6, help="the fixed chunks of a batch (C)")
    p.add_argument("--dtype", choices=["float32", "float64"], default="float32")
    p.add_argument("--repeats", type=int, default=5, help="times of each batch and product")
    p.add_argument("--check-every", type=int, default=20, help="fit_bcd's certificate schedule")
    args = p.parse_args(argv)
    if args.quick:
        args.batches, args.repeats = 2, 2
    flags.check_counts(p, args, ("batches", "chunks", "repeats", "check_every"))
    args.threads = 1
    from threadpoolctl import threadpool_limits

    ds, _ = data.load(args, dtype=np.float32)
    if (args.batches + 2) * BATCH > ds.X_train.shape[1]:
        p.error(
            f"--batches must fit the {ds.X_train.shape[1]:,} training images, got {args.batches}"
        )
    print(machine_text(blas_record(1)))
    with threadpool_limits(1):
        for dtype in ("float32", "float64"):
            depends = columns_depend_on_width(ds.X_train[:, :BATCH].astype(dtype))
            print(
                f"the MLP's W_0 X~_0 on 500 images, {dtype}: a column's bits change with the "
                f"product's width "
                + ", ".join(f"at 1/{P}: {'yes' if d else 'no'}" for P, d in depends.items())
            )
        for network in ("mlp", "lenet5") if args.network == "both" else (args.network,):
            run(network, args, ds)


if __name__ == "__main__":
    main()
