"""LeNet-5's convolutions two ways: the package's im2col products against PyTorch's kernels.

The fast backend computes a convolution layer's products through its patches X~ (im2col,
``layers.Conv2d``): the W-block's image ``W X~`` and gradient ``G X~^T`` (eqs. (17)-(18) of
the paper) on a matrix of ``C_in k^2 + 1`` rows and ``H_out W_out m`` columns, and the
X-blocks' map ``A(W, X)`` and adjoint ``A(W, .)^T G`` (eqs. (14)-(15)) gathered a cache-sized
chunk at a time. PyTorch computes the same maps with its convolution kernels (oneDNN on a
CPU), from the layer's input itself. This script times both on each convolution of LeNet-5
(``network.lenet5``: conv 6@5x5 pad 2 on 28 x 28 images; avg-pool 2 then conv 16@5x5), on
random arrays of ``--points`` data points in the package's layout (an image per column,
float32), PyTorch's figures including the layout changes to and from its (m, C, H, W)
(the pools stay the package's):

- ``patches``: forming X~ (the W-block's data, once a round);
- ``W X~``: the W-block's image of a direction, from the formed X~ (PyTorch: from the input);
- ``G X~^T``: the W-block's gradient (PyTorch: the convolution's weight and bias gradient);
- ``A(W, X)``: the map from the layer's input (the feed-forward pass, the X-blocks);
- ``A^T G``: the X-block's adjoint (PyTorch: the convolution's input gradient; the second
  layer's only, as X_0 is the data and has no block).

Each figure is the median of ``--repeats`` timed calls (one warm-up first) on ``--threads``
threads; the largest relative difference between the two results is printed beside it, so
that the two columns are known to compute the same thing. Needs PyTorch.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/conv_kernels.py \\
        --points 250,500 --threads 1 --repeats 9
"""

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common.flags import counts  # noqa: E402
from common.timing import median_ms  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--points", type=counts, default=(250, 500), help="data points, a comma list")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeats", type=int, default=9)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    for flag in ("threads", "repeats"):
        if getattr(args, flag) < 1:
            p.error(f"--{flag} must be >= 1, got {getattr(args, flag)}")
    return args


class TorchConv:
    """A LeNet-5 layer (``layers.LinearMap``: avg-pools, then a ``Conv2d``) with its
    convolution on PyTorch's kernels and its pools the package's, taking and returning the
    package's layout: ``(C H W, m)`` arrays, ``W`` as ``channels x (C_in k k + 1)`` with the
    bias last."""

    def __init__(self, layer):
        import torch

        self.torch, self.layer, conv = torch, layer, layer.op
        self.k, self.pad, self.channels = conv.kernel, conv.padding, conv.channels
        self.op_shape, self.shapes = layer.op_shape, [layer.in_shape]  # (each pool's input)
        for spec in layer.pre[:-1]:
            self.shapes.append(spec.out_shape(self.shapes[-1]))

    def _images(self, X, shape):
        """``(C H W, m)`` -> ``(m, C, H, W)``, contiguous."""
        t = self.torch.from_numpy(X)
        return t.T.reshape(X.shape[1], *shape).contiguous()

    @staticmethod
    def _columns(t):
        """``(m, C, H, W)`` -> ``(C H W, m)``, C-ordered, as NumPy."""
        return t.reshape(t.shape[0], -1).T.contiguous().numpy()

    def _weight(self, W):
        """``(weight, bias)`` as PyTorch's: ``W[:, :-1]`` as ``(channels, C_in, k, k)``."""
        w = np.ascontiguousarray(W[:, :-1]).reshape(self.channels, self.op_shape[0], self.k, self.k)
        return self.torch.from_numpy(w), self.torch.from_numpy(np.ascontiguousarray(W[:, -1]))

    def _input(self, X):
        """The convolution's input: the layer's pools in the package's layout, then
        ``(m, C, H, W)`` (PyTorch's pooling in its layout is the slower)."""
        for spec, shape in zip(self.layer.pre, self.shapes):
            X = spec.apply(np, X, shape)
        return self._images(X, self.op_shape)

    def forward(self, W, X):
        w, b = self._weight(W)
        y = self.torch.nn.functional.conv2d(self._input(X), w, b, padding=self.pad)
        return self._columns(y)

    def _backward(self, W, X, G, mask):
        w, _ = self._weight(W)
        g = self._images(G, self.layer.out_shape)
        x = (
            self._input(X)
            if X is not None
            else self.torch.empty((G.shape[1], *self.op_shape), dtype=w.dtype)
        )
        return self.torch.ops.aten.convolution_backward(
            g, x, w, [self.channels], [1, 1], [self.pad] * 2, [1, 1], False, [0, 0], 1, mask
        )

    def gradient(self, W, X, G):
        _, gw, gb = self._backward(W, X, G, [False, True, True])
        return np.concatenate([gw.reshape(self.channels, -1).numpy(), gb.numpy()[:, None]], 1)

    def adjoint(self, W, G):
        gx, _, _ = self._backward(W, None, G, [True, False, False])
        G = self._columns(gx)
        for spec, shape in zip(reversed(self.layer.pre), reversed(self.shapes)):
            G = spec.adjoint(np, G, shape)
        return G


def layer_rows(layer, m, repeats, rng, adjoint=True):
    """``(op, package ms, PyTorch ms, largest relative difference)`` for ``layer`` on ``m``
    random points; ``adjoint``: the X-block's adjoint too (not the input layer's: X_0 is the
    data)."""
    from fenchel_cvx.arrays import matmul_nt

    X = rng.standard_normal((layer.n_in, m), dtype=np.float32)
    W = rng.standard_normal(layer.weight_shape, dtype=np.float32)
    G = rng.standard_normal((layer.n_out, m), dtype=np.float32)
    tc = TorchConv(layer)
    Xt = layer.patches(X)
    pairs = {
        "patches": (lambda: layer.patches(X), lambda: tc._input(X)),  # PyTorch: its input
        "W X~": (lambda: layer.from_rows(W @ Xt, m), lambda: tc.forward(W, X)),
        "G X~^T": (lambda: matmul_nt(layer.to_rows(G), Xt), lambda: tc.gradient(W, X, G)),
        "A(W, X)": (lambda: layer.forward(W, X), lambda: tc.forward(W, X)),
        "A^T G": (lambda: layer.adjoint_x(W, G), lambda: tc.adjoint(W, G)),
    }
    if not adjoint:
        del pairs["A^T G"]
    rows = []
    for op in pairs:
        ours, theirs = pairs[op]
        if op == "patches":  # PyTorch forms no patches: its input, pooled, is all it reads
            diff = float("nan")
        else:
            a, b = ours(), theirs()
            diff = float(np.max(np.abs(a - b)) / max(np.max(np.abs(a)), 1e-30))
        rows.append((op, median_ms(ours, repeats), median_ms(theirs, repeats), diff))
    return rows


def main(argv=None):
    args = parse_args(argv)
    try:
        import torch
    except ImportError:
        sys.exit("benchmarks/conv_kernels.py needs PyTorch: pip install torch==2.13.0")
    from threadpoolctl import threadpool_limits

    from fenchel_cvx.network import lenet5

    torch.set_num_threads(args.threads)
    layers = [layer for layer in lenet5(dtype="float32").layers if layer.op.kind == "conv2d"]
    rng = np.random.default_rng(args.seed)
    results = {}
    print(
        f"LeNet-5's convolutions, {args.threads} thread(s), medians of {args.repeats} calls "
        "(ratio: im2col ms / PyTorch ms)"
    )
    with threadpool_limits(args.threads):
        for m in args.points:
            for i, layer in enumerate(layers):
                xt_mb = layer.weight_shape[1] * layer.n_out / layer.op.channels * m * 4 / 1e6
                print(f"\nlayer {i} ({layer.describe()}), {m} points, X~ {xt_mb:.1f} MB")
                print(f"{'':10s}{'im2col ms':>11s}{'PyTorch ms':>12s}{'ratio':>8s}  rel. diff")
                for op, ours, theirs, diff in layer_rows(layer, m, args.repeats, rng, i > 0):
                    results[(m, i, op)] = (ours, theirs, diff)
                    print(f"{op:10s}{ours:11.2f}{theirs:12.2f}{ours / theirs:8.2f}  {diff:.1e}")
    return results


if __name__ == "__main__":
    main()
