"""Layers as linear maps: dense, 2-D convolution, 2x2 average pooling, flatten.

In the lifted model every layer is ``U_l = A_l(W_l, X_l) + b_l``, linear in ``W_l`` for fixed
``X_l`` and in ``X_l`` for fixed ``W_l`` (the paper's Sec. 4.2, eqs. (10)-(11), runs LeNet-5 this
way; docs page "Convolutional layers"). The lifted variables stay 2-D, ``X_l`` of shape
(features x m) with the features of an image in PyTorch's (C, H, W) flatten order, so the blocks
of ``blocks.py`` never see a shape.

A *spec* is what a user writes: ``Dense(120)``, ``Conv2d(6, 5, padding=2)``, ``AvgPool2d(2)``,
``Flatten()``; ``LAYERS`` maps each spec's ``kind`` to its class, and takes one more layer kind
as one more class (``@register_layer``, once the class carries its kind's facts: docs page "Add
a layer kind"). ``build_maps`` folds the weight-free specs (pooling, flatten) into the next weighted
one and returns one :class:`LinearMap` per weight matrix ``W_l``, which gives

- ``forward(W, X)``: ``U = A(W, X) + b``, from the weights with the bias as last column;
- ``adjoint_x(W, G)``: ``A(W, .)^T G``, the gradient through the map for the X-blocks;
- ``patches(X)`` and ``to_rows(U)``: the map as a product ``to_rows(U) = W patches(X)``; for a
  dense layer ``patches(X) = [X; 1^T]`` and ``to_rows`` is the identity (``from_rows``: the
  inverse); for a convolution the im2col
  patches ``(C_in k k + 1) x (m H_out W_out)`` and the output channels as rows. So a conv
  W-block is a dense W-block on patches: it separates by output channel (row) and its Gram
  matrix ``patches patches^T`` is 26 x 26 for LeNet-5's first layer, 151 x 151 for its second;
- ``adjoint_w(G, X)``: ``to_rows(G) patches(X)^T``, the gradient in W;
- ``matrix(W)``: the explicit (Toeplitz) matrix and bias of ``A(W, .)``, for the oracle's small
  X-block templates and for tests.

Everything is written on the array API (NumPy, CuPy, array-api-strict). A convolution's im2col
is one ``take`` of input rows (a data point's pixel is a row of X, so whole rows move) at gather
indices computed once per input shape; padding pixels read a zero row appended to X. On NumPy,
``forward`` and ``adjoint_x`` run a few output rows at a time (``CHUNK_BYTES``), so that each
chunk's patches stay in the CPU cache between the gather and the GEMM; other namespaces (CuPy)
gather the whole map at once. ``adjoint_x`` adds each chunk's columns back into the input
pixels they came from (col2im, k^2 shifted slices), every pixel's terms in the same order
whatever the chunks.
"""

import math
import numbers
import warnings
from collections.abc import Iterable, Sequence
from types import ModuleType
from typing import Any

import numpy as np
from array_api_compat import array_namespace, device, is_numpy_namespace, is_torch_namespace
from numpy.typing import DTypeLike

from .arrays import Array, cheap_reads, clip, exact_in_place
from .facts import Registry, placeholder
from .validation import Interval, check

# NumPy: the bytes of im2col patches gathered and multiplied at a time (whole output rows, at
# least one). Patches that stay in the CPU cache between the gather and the GEMM took 8-14% off
# LeNet-5's training time per batch of 500 against one 30 MB patch matrix (two runs side by side
# in one process, one thread, load 3-6; docs page "Results"). Other namespaces (CuPy): one chunk.
CHUNK_BYTES = 1 << 20
# Conv2d.norm2_bound: the most entries of a filter bank's spectrum (channels x C_in x grid; 64 MiB
# of complex128), past which the X-blocks estimate the map's norm by power iteration instead,
# and of a small map's explicit matrix (inputs x outputs), up to which its norm is exact
SPECTRUM_MAX = 1 << 22

__all__ = [
    "Dense",
    "Conv2d",
    "AvgPool2d",
    "Flatten",
    "LAYERS",
    "LinearMap",
    "build_maps",
    "layer_from_dict",
    "register_layer",
]


def _positive_int(kind, name, value, minimum=1):
    return check(f"{kind} {name}", value, Interval(numbers.Integral, minimum, None))


def _image(kind, shape):
    if len(shape) != 3:
        raise ValueError(f"{kind} needs a (channels, height, width) input, got shape {shape}")
    return shape


class Spec:
    """A layer as the user writes it; ``to_dict`` / ``layer_from_dict`` round-trip it as JSON.

    Every spec gives ``out_shape``; a weight-free one (``weighted`` False: pooling, flatten)
    ``gain2``, ``apply`` and ``adjoint``, which ``LinearMap`` folds into the next weighted one;
    a weighted one (dense, conv2d) the map of its ``W``: ``weight_shape``, ``fans``,
    ``patches``, ``forward``, ``adjoint_x``, ``norm2_bound``, ``to_rows`` and ``from_rows``.
    The methods below are what a subclass must give (here they raise ``NotImplementedError``,
    and ``facts.has_fact`` reads them as absent); ``example`` gives one instance and an input
    shape it takes, on which the conformance suite checks the kind; ``short`` names it in
    ``LinearMap.describe``.
    """

    kind = "spec"
    weighted = False

    @classmethod
    @placeholder
    def example(cls) -> tuple["Spec", tuple[int, ...]]:
        """One spec of this kind and an input shape it takes (the conformance suite's case)."""
        raise NotImplementedError(f"{cls.__name__} has no example")

    def short(self) -> str:
        """Its name in ``LinearMap.describe``."""
        return self.kind

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, **self.params()}

    def params(self) -> dict[str, Any]:
        return {}

    def __repr__(self):
        args = ", ".join(f"{k}={v!r}" for k, v in self.params().items())
        return f"{type(self).__name__}({args})"

    def __eq__(self, other):
        return type(self) is type(other) and self.params() == other.params()

    def _missing(self, what: str) -> NotImplementedError:
        return NotImplementedError(f"{type(self).__name__} has no {what}")

    # every spec
    @placeholder
    def out_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        """The shape of the output on an input of ``shape``."""
        raise self._missing("out_shape")

    # a weight-free spec
    @placeholder
    def gain2(self, shape: tuple[int, ...]) -> float:
        """``||P||_2^2`` of the map on an input of ``shape``."""
        raise self._missing("gain2")

    @placeholder
    def apply(self, xp: ModuleType, X: Array, shape: tuple[int, ...]) -> Array:
        """The map on the columns of ``X`` (inputs of ``shape``)."""
        raise self._missing("apply")

    @placeholder
    def adjoint(self, xp: ModuleType, G: Array, shape: tuple[int, ...]) -> Array:
        """The adjoint of ``apply``."""
        raise self._missing("adjoint")

    # a weighted spec
    @placeholder
    def weight_shape(self, shape: tuple[int, ...]) -> tuple[int, int]:
        """The shape of ``W`` (bias last column) on an input of ``shape``."""
        raise self._missing("weight_shape")

    @placeholder
    def fans(self, shape: tuple[int, ...]) -> tuple[int, int]:
        """``(fan_in, fan_out)`` of Xavier's initialisation."""
        raise self._missing("fans")

    @placeholder
    def patches(self, xp: ModuleType, X: Array, shape: tuple[int, ...]) -> Array:
        """``X~``: the input of ``W`` as a matrix product, bias row last; a data point's
        patches are its own columns, the data points the last axis of the columns (so the
        patches of some points are their columns of all the points' patches)."""
        raise self._missing("patches")

    @placeholder
    def forward(self, xp: ModuleType, W: Array, X: Array, shape: tuple[int, ...]) -> Array:
        """``A(W, X) + b``."""
        raise self._missing("forward")

    @placeholder
    def adjoint_x(self, xp: ModuleType, W: Array, G: Array, shape: tuple[int, ...]) -> Array:
        """``A(W, .)^T G``."""
        raise self._missing("adjoint_x")

    @placeholder
    def norm2_bound(self, W: Array, shape: tuple[int, ...], max_dim: int) -> float | Array | None:
        """An upper bound of ``||A(W, .)||_2^2``, or None beyond ``max_dim``."""
        raise self._missing("norm2_bound")

    @placeholder
    def to_rows(self, xp: ModuleType, U: Array, shape: tuple[int, ...]) -> Array:
        """An output as the rows of ``W @ patches(X)``."""
        raise self._missing("to_rows")

    @placeholder
    def from_rows(self, xp: ModuleType, R: Array, shape: tuple[int, ...], m: int) -> Array:
        """The inverse of ``to_rows`` for ``m`` data points."""
        raise self._missing("from_rows")


#: the facts every layer kind gives, and those of a kind with weights (``weighted``) or without
LAYER_FACTS = ("out_shape", "example")
WEIGHTED_FACTS = (
    "weight_shape",
    "fans",
    "patches",
    "forward",
    "adjoint_x",
    "norm2_bound",
    "to_rows",
    "from_rows",
)
WEIGHT_FREE_FACTS = ("gain2", "apply", "adjoint")


def _facts(cls: type[Spec]) -> tuple[str, ...]:
    return LAYER_FACTS + (WEIGHTED_FACTS if cls.weighted else WEIGHT_FREE_FACTS)


#: ``kind -> class`` of every layer kind: what ``layer_from_dict`` builds, and what every file
#: that holds a network's config (``LiftedNetwork.load``, checkpoints) may name
LAYERS: Registry[Spec] = Registry("layer", Spec, _facts, key="kind")
#: registers a layer kind (a class decorator), once it carries its kind's facts
register_layer = LAYERS.register


# --- weight-free specs: folded into the next weighted map ------------------------------------
@register_layer
class AvgPool2d(Spec):
    """``size x size`` average pooling (stride = size), a linear map folded into the next layer.

    >>> pool = AvgPool2d(2)
    >>> pool.out_shape((6, 28, 28)), pool.gain2((6, 28, 28))
    ((6, 14, 14), 0.25)
    >>> X = np.arange(16.0).reshape(16, 1)  # one 1 x 4 x 4 image, a data point per column
    >>> pool.apply(np, X, (1, 4, 4)).ravel()
    array([ 2.5,  4.5, 10.5, 12.5])
    """

    kind = "avgpool2d"

    def __init__(self, size: int = 2) -> None:
        self.size = _positive_int("avgpool2d", "size", size, 2)

    @classmethod
    def example(cls) -> tuple[Spec, tuple[int, ...]]:
        return cls(2), (2, 4, 6)

    def short(self) -> str:
        return f"avgpool {self.size}x{self.size}"

    def params(self) -> dict[str, Any]:
        return {"size": self.size}

    def out_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        C, H, W = _image("avgpool2d", shape)
        s = self.size
        if H % s or W % s:
            raise ValueError(
                f"avgpool2d size {s} needs a map size divisible by {s}, got "
                f"{H}x{W} (input shape {shape})"
            )
        return (C, H // s, W // s)

    def gain2(self, shape: tuple[int, ...]) -> float:
        """``||P||_2^2 = 1 / s^2`` (exact): every output averages ``s^2`` inputs that feed no
        other output, so ``P P^T = I / s^2``."""
        return 1.0 / self.size**2

    def apply(self, xp: ModuleType, X: Array, shape: tuple[int, ...]) -> Array:
        C, H, W = shape
        s = self.size
        m = X.shape[1]
        X6 = xp.reshape(X, (C, H // s, s, W // s, s, m))
        # sum / s^2 in X's dtype (NumPy's mean divides float32 sums in float64, a second pass)
        S = xp.sum(X6, axis=(2, 4))
        if exact_in_place(S, s * s):
            S /= s * s
        else:  # integer images: their mean in floating point, as ``/`` gives it
            S = S / (s * s)
        return xp.reshape(S, (C * (H // s) * (W // s), m))

    def adjoint(self, xp: ModuleType, G: Array, shape: tuple[int, ...]) -> Array:
        C, H, W = shape
        s = self.size
        m = G.shape[1]
        G4 = xp.reshape(G, (C, H // s, 1, W // s, 1, m)) / (s * s)
        G6 = xp.broadcast_to(G4, (C, H // s, s, W // s, s, m))
        return xp.reshape(G6, (C * H * W, m))


@register_layer
class Flatten(Spec):
    """(C, H, W) -> (C H W,): nothing moves, the features are already flat in that order."""

    kind = "flatten"

    @classmethod
    def example(cls) -> tuple[Spec, tuple[int, ...]]:
        return cls(), (2, 3, 3)

    def out_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        return (math.prod(shape),)

    def gain2(self, shape: tuple[int, ...]) -> float:
        return 1.0

    def apply(self, xp: ModuleType, X: Array, shape: tuple[int, ...]) -> Array:
        return X

    def adjoint(self, xp: ModuleType, G: Array, shape: tuple[int, ...]) -> Array:
        return G


# --- weighted specs: one weight matrix each --------------------------------------------------
@register_layer
class Dense(Spec):
    """``U = W[:, :-1] X + W[:, -1]`` on the flattened input; ``W`` is ``units x (n_in + 1)``.

    >>> dense = Dense(2)
    >>> dense.weight_shape((3,)), dense.fans((3,))
    ((2, 4), (3, 2))
    >>> W = np.array([[1.0, 0.0, 0.0, 1.0], [0.0, 1.0, 1.0, 0.0]])  # bias last
    >>> dense.forward(np, W, np.array([[1.0], [2.0], [3.0]]), (3,))
    array([[2.],
           [5.]])
    """

    kind = "dense"
    weighted = True

    def __init__(self, units: int) -> None:
        self.units = _positive_int("dense", "units", units)

    @classmethod
    def example(cls) -> tuple[Spec, tuple[int, ...]]:
        return cls(3), (5,)

    def short(self) -> str:
        return f"dense {self.units}"

    def params(self) -> dict[str, Any]:
        return {"units": self.units}

    def out_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        return (self.units,)

    def weight_shape(self, shape: tuple[int, ...]) -> tuple[int, int]:
        return (self.units, math.prod(shape) + 1)

    def fans(self, shape: tuple[int, ...]) -> tuple[int, int]:
        return math.prod(shape), self.units

    def patches(self, xp: ModuleType, X: Array, shape: tuple[int, ...]) -> Array:
        return xp.concat([X, xp.ones((1, X.shape[1]), dtype=X.dtype, device=device(X))], axis=0)

    def forward(self, xp: ModuleType, W: Array, X: Array, shape: tuple[int, ...]) -> Array:
        """``W[:, :-1] X + b``, the bias added in place: no second array of the output's size
        (784-300 on 60,000 points in float64, the first pass of a fresh process: 0.21-0.22 s
        against 2.0-3.1 s with the sum a new array, whose fresh pages cost more than the
        product; two threads of the 2-core Intel Xeon VM, 2026-12-05)."""
        p = X.shape[0]
        U = W[:, :p] @ X
        U += W[:, p:]
        return U

    def adjoint_x(self, xp: ModuleType, W: Array, G: Array, shape: tuple[int, ...]) -> Array:
        return W[:, :-1].T @ G

    def norm2_bound(self, W: Array, shape: tuple[int, ...], max_dim: int) -> float | None:
        """``||W_p||_2^2`` (exact, in float64) from the smaller Gram matrix, or None where its
        side exceeds ``max_dim``."""
        if min(W.shape[0], W.shape[1] - 1) > max_dim:
            return None
        xp = array_namespace(W)
        return _top_sq_singular(xp, xp.astype(W[:, :-1], xp.float64))

    def to_rows(self, xp: ModuleType, U: Array, shape: tuple[int, ...]) -> Array:
        return U

    def from_rows(self, xp: ModuleType, R: Array, shape: tuple[int, ...], m: int) -> Array:
        return R


@register_layer
class Conv2d(Spec):
    """Multi-channel 2-D convolution (PyTorch's cross-correlation), stride 1, zero padding.

    ``W`` is ``channels x (C_in k k + 1)``: ``W[:, :-1].reshape(channels, C_in, k, k)`` is a
    ``torch.nn.Conv2d`` weight and ``W[:, -1]`` its bias. ``in_channels`` (optional) is checked
    against the input.

    >>> conv = Conv2d(6, 5)
    >>> conv.out_shape((1, 28, 28)), conv.weight_shape((1, 28, 28))  # 6 filters of 1 x 5 x 5
    ((6, 24, 24), (6, 26))
    >>> Conv2d(6, 5, padding=2).out_shape((1, 28, 28))
    (6, 28, 28)
    >>> Conv2d(6, 5, in_channels=3).out_shape((1, 28, 28))
    Traceback (most recent call last):
    ...
    ValueError: conv2d in_channels=3 does not match the input's 1 channels (input shape (1, 28, 28))
    """

    kind = "conv2d"
    weighted = True

    def __init__(
        self, channels: int, kernel: int, padding: int = 0, in_channels: int | None = None
    ) -> None:
        self.channels = _positive_int("conv2d", "channels", channels)
        self.kernel = _positive_int("conv2d", "kernel", kernel)
        self.padding = _positive_int("conv2d", "padding", padding, 0)
        self.in_channels = (
            None if in_channels is None else _positive_int("conv2d", "in_channels", in_channels)
        )
        # gather indices per input shape, namespace, device, chunk size
        self._plans: dict[tuple, list] = {}

    def __getstate__(self):  # the index cache is rebuilt where the spec is unpickled
        return {**self.__dict__, "_plans": {}}

    @classmethod
    def example(cls) -> tuple[Spec, tuple[int, ...]]:
        return cls(3, 3, padding=1), (2, 5, 4)

    def short(self) -> str:
        pad = f" pad {self.padding}" if self.padding else ""
        return f"conv2d {self.channels}@{self.kernel}x{self.kernel}{pad}"

    def params(self) -> dict[str, Any]:
        out = {"channels": self.channels, "kernel": self.kernel, "padding": self.padding}
        if self.in_channels is not None:
            out["in_channels"] = self.in_channels
        return out

    def _geometry(self, shape):
        C, H, W = _image("conv2d", shape)
        if self.in_channels is not None and self.in_channels != C:
            raise ValueError(
                f"conv2d in_channels={self.in_channels} does not match the input's "
                f"{C} channels (input shape {shape})"
            )
        k, p = self.kernel, self.padding
        Ho, Wo = H + 2 * p - k + 1, W + 2 * p - k + 1
        if Ho < 1 or Wo < 1:
            raise ValueError(
                f"conv2d kernel {k} exceeds its input {H}x{W} (padding {p}, input shape {shape})"
            )
        return C, H, W, Ho, Wo

    def out_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        _, _, _, Ho, Wo = self._geometry(shape)
        return (self.channels, Ho, Wo)

    def weight_shape(self, shape: tuple[int, ...]) -> tuple[int, int]:
        return (self.channels, shape[0] * self.kernel**2 + 1)

    def fans(self, shape: tuple[int, ...]) -> tuple[int, int]:
        k2 = self.kernel**2
        return shape[0] * k2, self.channels * k2

    # --- im2col as one gather, in chunks of output rows ----------------------------------
    def _plan(self, xp, X, shape, whole=False):
        """The gather indices of im2col for ``shape`` on X's namespace and device, split in
        chunks of output rows, ``[(h0, h1, index), ...]`` (cached per shape, namespace, device
        and chunk size); ``whole``: one chunk."""
        C, H, W, Ho, Wo = self._geometry(shape)
        k2, m = C * self.kernel**2, X.shape[1]
        rows = Ho
        if is_numpy_namespace(xp) and not whole:  # the chunk's patches stay in the CPU cache
            rows = max(1, min(Ho, CHUNK_BYTES // max(1, k2 * Wo * m * X.dtype.itemsize)))
        key = (tuple(shape), xp.__name__, str(device(X)), rows)
        plan = self._plans.get(key)
        if plan is None:
            idx = self._gather_index(shape)  # (C k k, Ho, Wo) numpy
            plan = [
                (
                    h0,
                    min(Ho, h0 + rows),
                    xp.asarray(np.reshape(idx[:, h0 : h0 + rows], (-1,)), device=device(X)),
                )
                for h0 in range(0, Ho, rows)
            ]
            if len(self._plans) >= 16:
                self._plans.clear()
            self._plans[key] = plan
        return plan

    def _gather_index(self, shape):
        """Row ``(c, i, j)``, column ``(h, w)``: the input row ``X[(c, h + i - p, w + j - p)]``,
        or ``C H W`` (a zero row appended to X) where that pixel is padding."""
        C, H, W, Ho, Wo = self._geometry(shape)
        k, p = self.kernel, self.padding
        c = np.arange(C)[:, None, None, None, None]
        y = np.arange(k)[None, :, None, None, None] + np.arange(Ho)[None, None, None, :, None] - p
        x = np.arange(k)[None, None, :, None, None] + np.arange(Wo)[None, None, None, None, :] - p
        inside = (y >= 0) & (y < H) & (x >= 0) & (x < W)
        idx = np.where(inside, (c * H + y) * W + x, C * H * W)
        return np.reshape(idx, (C * k * k, Ho, Wo)).astype(np.int64)

    def _extended(self, xp, X, ones=False):
        """X with a zero row appended where the map pads (the target of padding pixels), and a
        row of ones after it for ``patches``'s bias row."""
        m = X.shape[1]
        dev = device(X)
        extra = [xp.zeros((1, m), dtype=X.dtype, device=dev)] if self.padding or ones else []
        extra += [xp.ones((1, m), dtype=X.dtype, device=dev)] if ones else []
        return xp.concat([X, *extra], axis=0) if extra else X

    def patches(self, xp: ModuleType, X: Array, shape: tuple[int, ...]) -> Array:
        """im2col and the bias row in one gather: ``(C_in k k + 1) x (H_out W_out m)``, rows
        (c, i, j) then the ones, columns (h, w, data point)."""
        C, H, W, Ho, Wo = self._geometry(shape)
        k2, m = C * self.kernel**2, X.shape[1]
        Xe = self._extended(xp, X, ones=True)
        ones = xp.full((Ho * Wo,), C * H * W + 1, dtype=xp.int64, device=device(X))
        ((_, _, idx),) = self._plan(xp, X, shape, whole=True)
        idx = xp.concat([idx, ones])
        return xp.reshape(xp.take(Xe, idx, axis=0), (k2 + 1, Ho * Wo * m))

    def forward(self, xp: ModuleType, W: Array, X: Array, shape: tuple[int, ...]) -> Array:
        """``W[:, :-1] @ patches + bias``, the patches gathered a chunk of output rows at a time
        (NumPy: a cache-sized chunk; other namespaces: the whole map at once)."""
        _, _, _, Ho, Wo = self._geometry(shape)
        k2, m = shape[0] * self.kernel**2, X.shape[1]
        Xe, K, b = self._extended(xp, X), W[:, :-1], W[:, -1:]
        out = None
        for h0, h1, idx in self._plan(xp, X, shape):
            U = K @ xp.reshape(xp.take(Xe, idx, axis=0), (k2, (h1 - h0) * Wo * m))
            U += b
            if h1 - h0 == Ho:
                return self.from_rows(xp, U, shape, m)
            if out is None:
                out = xp.empty((self.channels, Ho * Wo * m), dtype=U.dtype, device=device(X))
            out[:, h0 * Wo * m : h1 * Wo * m] = U
        return self.from_rows(xp, out, shape, m)

    def adjoint_x(self, xp: ModuleType, W: Array, G: Array, shape: tuple[int, ...]) -> Array:
        """``col2im(W[:, :-1]^T to_rows(G))``, a chunk of output rows at a time: each chunk's
        columns are added into the input pixels they came from, k^2 shifted slices (traced by
        ``torch.compile``: ``torch.nn.functional.fold``, ``_fold``; eagerly on the CPU the slices
        are the faster)."""
        C, H, Wd, Ho, Wo = self._geometry(shape)
        k, p, m = self.kernel, self.padding, G.shape[1]
        R, KT = self.to_rows(xp, G, shape), W[:, :-1].T
        if _traced(xp):  # one operation in a compiled graph, where the slice additions below
            # chain k^2 scatters into one buffer, whose generated code inductor takes minutes over
            return _fold(xp, KT @ R, (C, H, Wd), k, p, Ho * Wo)
        out = xp.zeros((C, H + 2 * p, Wd + 2 * p, m), dtype=xp.result_type(W, G), device=device(G))
        # chunks from the last: every pixel sums its terms in (i, j) order, as one chunk would
        for h0, h1, _ in reversed(self._plan(xp, G, shape)):
            cols = xp.reshape(KT @ R[:, h0 * Wo * m : h1 * Wo * m], (C, k * k, h1 - h0, Wo, m))
            for i in range(k):
                for j in range(k):
                    out[:, h0 + i : h1 + i, j : j + Wo, :] += cols[:, i * k + j, ...]
        out = out[:, p : p + H, p : p + Wd, :] if p else out
        return xp.reshape(out, (C * H * Wd, m))

    def norm2_bound(self, W: Array, shape: tuple[int, ...], max_dim: int) -> float | Array | None:
        """An upper bound of ``||A(W, .)||_2^2`` (in float64): exact from the map's explicit
        matrix where the map is small (``min(inputs, outputs) <= max_dim``, at most
        ``SPECTRUM_MAX`` entries), else from the filters' spectrum; None where
        ``min(channels, C_in)`` exceeds ``max_dim`` or the spectrum ``SPECTRUM_MAX`` entries.

        The zero-padded input fits an ``N1 x N2 = (H + 2p) x (W + 2p)`` grid on which the map's
        outputs read no wrapped-around pixel, so ``A`` is a block of the circular convolution on
        that grid, whose norm is the largest singular value over the grid's frequencies of the
        ``channels x C_in`` matrix of the filters' 2-D DFT. That bound is loosest on small maps
        (the grid's edges weigh most there), which is where the explicit matrix is cheap."""
        C, H, Wd, Ho, Wo = self._geometry(shape)
        k, p = self.kernel, self.padding
        n_in, n_out = C * H * Wd, self.channels * Ho * Wo
        xp = array_namespace(W)
        if min(n_in, n_out) <= max_dim and n_in * n_out <= SPECTRUM_MAX:
            f64, dev = xp.float64, device(W)
            Wl = xp.astype(W[:, :-1], f64)  # the linear part: no bias
            Wl = xp.concat([Wl, xp.zeros((Wl.shape[0], 1), dtype=f64, device=dev)], axis=1)
            A = self.forward(xp, Wl, xp.eye(n_in, dtype=f64, device=dev), shape)
            return _top_sq_singular(xp, A)
        if (
            min(self.channels, C) > max_dim
            or self.channels * C * (H + 2 * p) * (Wd + 2 * p) > SPECTRUM_MAX
        ):
            return None
        F = xp.reshape(xp.astype(W[:, :-1], xp.float64), (self.channels, C, k, k))
        # a real filter's DFT at (-f1, -f2) is the conjugate of its DFT at (f1, f2), with the
        # same singular values: ``rfftn``'s half of the grid (0 <= f2 <= N2 / 2) holds them all
        M = xp.fft.rfftn(F, s=(H + 2 * p, Wd + 2 * p), axes=(-2, -1))
        M = xp.permute_dims(M, (2, 3, 0, 1))  # channels x C_in per frequency
        Mh = xp.conj(xp.matrix_transpose(M))
        G = Mh @ M if C <= self.channels else M @ Mh  # the smaller side, per frequency
        return _top_eigenvalue(xp, G)

    def to_rows(self, xp: ModuleType, U: Array, shape: tuple[int, ...]) -> Array:
        """``(channels H_out W_out) x m`` -> ``channels x (H_out W_out m)``: a reshape."""
        return xp.reshape(U, (self.channels, U.shape[0] // self.channels * U.shape[1]))

    def from_rows(self, xp: ModuleType, R: Array, shape: tuple[int, ...], m: int) -> Array:
        return xp.reshape(R, (R.shape[0] * R.shape[1] // m, m))


def layer_from_dict(d: dict[str, Any]) -> Spec:
    """The spec of ``{"kind": ..., **params}`` (the inverse of ``Spec.to_dict``).

    >>> spec = layer_from_dict({"kind": "conv2d", "channels": 6, "kernel": 5, "padding": 2})
    >>> spec, spec.to_dict() == {"kind": "conv2d", "channels": 6, "kernel": 5, "padding": 2}
    (Conv2d(channels=6, kernel=5, padding=2), True)
    >>> layer_from_dict({"kind": "dense", "width": 10})
    Traceback (most recent call last):
    ...
    ValueError: bad parameters for layer {'kind': 'dense', 'width': 10}: Dense.__init__() got an
    unexpected keyword argument 'width'
    """
    if not isinstance(d, dict) or d.get("kind") not in LAYERS:
        raise ValueError(f"a layer must be a dict with 'kind' one of {sorted(LAYERS)}, got {d!r}")
    params = {k: v for k, v in d.items() if k != "kind"}
    try:
        return LAYERS[d["kind"]](**params)
    except TypeError as err:
        raise ValueError(f"bad parameters for layer {d!r}: {err}") from None


# --- one weight matrix: the pre-ops folded into its weighted op -------------------------------
class LinearMap:
    """The map of one ``W_l``: weight-free specs ``pre`` (pooling, flatten), then ``op``.

    A small convolution and its explicit matrix (``matrix``), the adjoint in X, the patches:

    >>> (A,) = build_maps((1, 4, 4), [Conv2d(2, 3, padding=1)])
    >>> A
    LinearMap(conv2d 2@3x3 pad 1: (1, 4, 4) -> (2, 4, 4), W (2, 10))
    >>> rng = np.random.default_rng(0)
    >>> W, X, G = A.init(rng, np.float64), rng.random((16, 5)), rng.random((32, 5))
    >>> M, b = A.matrix(W)
    >>> M.shape, bool(np.allclose(A.forward(W, X), M @ X + b))
    ((32, 16), True)
    >>> bool(np.allclose(A.adjoint_x(W, G), M.T @ G))
    True
    >>> A.patches(X).shape, bool(np.allclose(A.to_rows(A.forward(W, X)), W @ A.patches(X)))
    ((10, 80), True)
    >>> exact = np.linalg.norm(M, 2) ** 2
    >>> bool(np.isclose(A.norm2_bound(W, max_dim=64), exact)), bool(A.norm2(W) <= exact)
    (True, True)
    """

    def __init__(self, pre: Sequence[Spec], op: Spec, in_shape: Sequence[int]) -> None:
        self.pre, self.op, self.in_shape = tuple(pre), op, tuple(in_shape)
        shapes = [self.in_shape]
        for spec in self.pre:
            shapes.append(tuple(spec.out_shape(shapes[-1])))
        self._shapes = shapes  # the input shape of every pre-op, then of op
        self.op_shape = shapes[-1]
        self.out_shape = tuple(op.out_shape(self.op_shape))
        self.weight_shape = op.weight_shape(self.op_shape)
        self.n_in, self.n_out = math.prod(self.in_shape), math.prod(self.out_shape)

    @property
    def specs(self) -> tuple[Spec, ...]:
        return (*self.pre, self.op)

    @property
    def is_dense(self) -> bool:
        """A plain dense layer on an input only flattened before it: ``W @ [X; 1]`` (a
        subclass of ``Dense``, or another weight-free map in front, takes the general path)."""
        return type(self.op) is Dense and all(isinstance(s, Flatten) for s in self.pre)

    def describe(self) -> str:
        names = " + ".join(s.short() for s in self.specs)
        return f"{names}: {self.in_shape} -> {self.out_shape}, W {self.weight_shape}"

    def __repr__(self):
        return f"LinearMap({self.describe()})"

    def _pre(self, xp, X):
        for spec, shape in zip(self.pre, self._shapes):
            X = spec.apply(xp, X, shape)
        return X

    def _pre_adjoint(self, xp, G):
        for spec, shape in zip(reversed(self.pre), reversed(self._shapes[:-1])):
            G = spec.adjoint(xp, G, shape)
        return G

    def forward(self, W: Array, X: Array) -> Array:
        """``U = A(W, X) + b`` (the pre-activation of this layer), ``(n_out, m)``."""
        xp = array_namespace(W, X)
        return self.op.forward(xp, W, self._pre(xp, X), self.op_shape)

    def adjoint_x(self, W: Array, G: Array) -> Array:
        """``A(W, .)^T G``: ``(n_out, m)`` -> ``(n_in, m)``."""
        xp = array_namespace(W, G)
        return self._pre_adjoint(xp, self.op.adjoint_x(xp, W, G, self.op_shape))

    def patches(self, X: Array) -> Array:
        """``X~`` of the W-block: the input of ``W`` as a matrix product, bias row last."""
        xp = array_namespace(X)
        return self.op.patches(xp, self._pre(xp, X), self.op_shape)

    def to_rows(self, U: Array) -> Array:
        """An output ``(n_out, m)`` as the rows of ``W @ patches(X)`` (one row per output
        channel)."""
        return self.op.to_rows(array_namespace(U), U, self.op_shape)

    def from_rows(self, R: Array, m: int) -> Array:
        """The inverse of ``to_rows`` for ``m`` data points: an output ``(n_out, m)``."""
        return self.op.from_rows(array_namespace(R), R, self.op_shape, m)

    def rows(self, U: Array) -> Array:
        """Deprecated name of :meth:`to_rows`."""
        warnings.warn("rows is deprecated; use to_rows", DeprecationWarning, stacklevel=2)
        return self.to_rows(U)

    def unrows(self, R: Array, m: int) -> Array:
        """Deprecated name of :meth:`from_rows`."""
        warnings.warn("unrows is deprecated; use from_rows", DeprecationWarning, stacklevel=2)
        return self.from_rows(R, m)

    def adjoint_w(self, G: Array, X: Array) -> Array:
        """The gradient in W of ``<G, A(W, X) + b>``: ``to_rows(G) patches(X)^T``."""
        return self.to_rows(G) @ self.patches(X).T

    def matrix(self, W: Array) -> tuple[np.ndarray, np.ndarray]:
        """``(A, b)`` with ``A(W, X) + b = A @ X + b`` (dense NumPy; for small maps only)."""
        W = np.asarray(W)
        if self.is_dense:
            return W[:, :-1], W[:, -1:]
        b = self.forward(W, np.zeros((self.n_in, 1), dtype=W.dtype))
        return self.forward(W, np.eye(self.n_in, dtype=W.dtype)) - b, b

    def norm2_bound(self, W: Array, max_dim: int) -> float | Array | None:
        """An upper bound of ``||A(W, .)||_2^2``, or None where the weighted layer's
        eigenproblems would exceed ``max_dim`` (then see ``norm2``): the weighted layer's bound
        (dense and small convolutions: exact; larger ones: from the spectrum) times the
        pre-ops' exact gains (pooling ``1 / s^2``). Computed in float64 in W's library: a
        Python float from NumPy arrays, a 0-d array on the device from others, not read back
        (``_top_eigenvalue``)."""
        bound = self.op.norm2_bound(W, self.op_shape, max_dim)
        if bound is None:
            return None
        return bound * math.prod([s.gain2(shape) for s, shape in zip(self.pre, self._shapes)])

    def norm2(self, W: Array, iters: int = 30) -> float:
        """An estimate of ``||A(W, .)||_2^2`` by power iteration on ``A^T A`` (from below)."""
        xp = array_namespace(W)
        start = np.random.default_rng(0).standard_normal((self.n_in, 1))
        x = xp.asarray(start, dtype=W.dtype, device=device(W))
        zero = xp.zeros((W.shape[0], 1), dtype=W.dtype, device=device(W))
        Wa = xp.concat([W[:, :-1], zero], axis=1)  # the linear part: no bias
        lam = 0.0
        for _ in range(iters):
            y = self.adjoint_x(Wa, self.forward(Wa, x))
            lam = float(xp.sqrt(xp.sum(y * y)))
            if not lam > 0:
                return 0.0
            x = y / lam
        return lam

    def init(self, rng: np.random.Generator, dtype: DTypeLike) -> np.ndarray:
        """Xavier-uniform weights (PyTorch's fans for a convolution), zero bias."""
        fan_in, fan_out = self.op.fans(self.op_shape)
        a = math.sqrt(6.0 / (fan_in + fan_out))
        W = np.zeros(self.weight_shape, dtype=dtype)
        W[:, :-1] = rng.uniform(-a, a, size=(self.weight_shape[0], self.weight_shape[1] - 1))
        return W


def _traced(xp):
    """Whether ``torch.compile`` is tracing these arrays' operations into a graph."""
    if not is_torch_namespace(xp):
        return False
    import torch

    return torch.compiler.is_compiling()


def _fold(xp, cols, image, k, p, L):
    """col2im of PyTorch tensors by ``torch.nn.functional.fold``: ``cols``, ``(C k k) x (L m)``
    (rows (c, i, j), columns (h, w, data point), L = H_out W_out), summed into the ``image``
    ``(C, H, W)`` they were gathered from with padding p -> ``(C H W) x m``."""
    from torch.nn.functional import fold

    C, H, W = image
    m = cols.shape[1] // L
    batched = xp.permute_dims(xp.reshape(cols, (C * k * k, L, m)), (2, 0, 1))  # m x C k k x L
    out = fold(batched, (H, W), k, padding=p)  # m x C x H x W
    return xp.reshape(xp.permute_dims(out, (1, 2, 3, 0)), (C * H * W, m))


def _top_sq_singular(xp, A):
    """``||A||_2^2``: the top eigenvalue of A's smaller Gram matrix (``_top_eigenvalue``)."""
    G = A @ A.T if A.shape[0] <= A.shape[1] else A.T @ A
    return _top_eigenvalue(xp, G) if math.prod(G.shape) else 0.0


def _top_eigenvalue(xp, G):
    """``max(0, the largest eigenvalue)`` of the Hermitian positive semidefinite matrices G (a
    matrix or a stack): a Python float by ``eigvalsh`` where reads are cheap, else a 0-d array
    on the device, the bound of ``_trace_bound``, which waits for nothing (``eigvalsh`` checks
    its result on the host: a GPU waits for it, and a CUDA graph cannot hold it)."""
    if cheap_reads(xp):
        return float(clip(xp.max(xp.linalg.eigvalsh(G)), 0.0, None))
    return _trace_bound(xp, G)


#: squarings of ``_trace_bound``: an upper bound within a factor ``k^(2^-20)`` of the top
#: eigenvalue (1 + 4.6e-6 at k = 128, the top repeated k times; rounding's where it stands apart)
SQUARINGS = 20


def _trace_bound(xp, G, squarings=SQUARINGS):
    """An upper bound of the largest eigenvalue of the Hermitian positive semidefinite
    matrices G (the largest over a stack), as a 0-d array, by matrix products alone:

        lam_max(G) <= tr(G^(2^j))^(2^-j) <= k^(2^-j) lam_max(G)        (G k x k, j squarings)

    the trace summing ``lam_i^(2^j) >= 0``. Each square is of ``N_i = B_i / c_i``, ``c_i =
    tr(B_i)`` (``B_0 = G``, ``B_(i+1) = N_i^2``), so ``G^(2^j) = B_j prod_i c_i^(2^(j-i))``
    and the bound is ``exp(sum_(i <= j) 2^-i log c_i)``: no overflow, and ``c_i >= 1 / k``
    past the first. Rounding moves it by a few ``k eps`` relatively (each step's error enters
    the root at ``2^-i`` of its weight). A zero matrix (trace 0) is squared as the identity
    and given 0."""
    trace = lambda A: xp.real(xp.sum(xp.linalg.diagonal(A), axis=-1))  # noqa: E731
    zero = trace(G) <= 0  # its eigenvalues' sum: all 0
    k = G.shape[-1]
    eye = xp.eye(k, dtype=G.dtype, device=device(G))
    A = xp.where(zero[..., None, None], eye, G)
    c = trace(A)
    log_bound = xp.log(c)
    for i in range(1, squarings + 1):
        N = A / xp.astype(c[..., None, None], A.dtype)
        A = N @ N
        c = trace(A)
        log_bound = log_bound + xp.log(c) / 2.0**i
    bound = xp.where(zero, xp.zeros_like(log_bound), xp.exp(log_bound))
    return xp.max(bound) if bound.ndim else bound


def build_maps(
    input_shape: int | Sequence[int], specs: Sequence[Spec | dict[str, Any]]
) -> list[LinearMap]:
    """Fold ``specs`` into one :class:`LinearMap` per weighted layer (bad shapes: ValueError).

    LeNet-5: each pooling is folded into the weighted layer after it.

    >>> specs = [Conv2d(6, 5, padding=2), AvgPool2d(2), Conv2d(16, 5), AvgPool2d(2), Flatten()]
    >>> for A in build_maps((1, 28, 28), specs + [Dense(120), Dense(84), Dense(10)]):
    ...     print(A.describe())
    conv2d 6@5x5 pad 2: (1, 28, 28) -> (6, 28, 28), W (6, 26)
    avgpool 2x2 + conv2d 16@5x5: (6, 28, 28) -> (16, 10, 10), W (16, 151)
    avgpool 2x2 + flatten + dense 120: (16, 10, 10) -> (120,), W (120, 401)
    dense 84: (120,) -> (84,), W (84, 121)
    dense 10: (84,) -> (10,), W (10, 85)
    >>> build_maps(784, [Dense(300), AvgPool2d(2)])
    Traceback (most recent call last):
    ...
    ValueError: layers must end with a weighted layer (dense or conv2d), got [Dense(units=300),
    AvgPool2d(size=2)]
    """
    # a number is the shape of one axis (anything else but a sequence is refused below)
    shape = tuple(input_shape) if isinstance(input_shape, Iterable) else (input_shape,)
    if (
        not shape
        or len(shape) not in (1, 3)
        or not all(
            isinstance(d, numbers.Integral) and not isinstance(d, bool) and int(d) >= 1
            for d in shape
        )
    ):
        raise ValueError(
            f"input_shape must be (features,) or (channels, height, width) of "
            f"positive integers, got {input_shape!r}"
        )
    given = [layer_from_dict(s) if isinstance(s, dict) else s for s in specs]
    checked: list[Spec] = []
    for s in given:
        if not isinstance(s, Spec):
            raise ValueError(
                f"layers must be layer specs ({', '.join(sorted(LAYERS))}) or their "
                f"dicts, got {s!r}"
            )
        checked.append(s)
    if not checked or not checked[-1].weighted:
        raise ValueError(
            f"layers must end with a weighted layer (dense or conv2d), got {checked!r}"
        )
    maps: list[LinearMap] = []
    pre: list[Spec] = []
    in_shape = tuple(int(d) for d in shape)
    for s in checked:
        if s.weighted:
            maps.append(LinearMap(pre, s, in_shape))
            in_shape, pre = maps[-1].out_shape, []
        else:
            pre.append(s)
    return maps
