"""Layers as linear maps (fenchel_cvx.layers): conv, pooling, flatten, dense.

The convolution is checked against a direct loop over output pixels (PyTorch's cross-correlation
written out), every map's adjoints against the inner-product identity, ``matrix`` against the
map itself, and the shapes and errors of ``build_maps``, ``LiftedNetwork.from_layers`` and
``lenet5``.
"""

import json

import numpy as np
import pytest

from fenchel_cvx import AvgPool2d, Conv2d, Dense, Flatten, LiftedNetwork, layers, lenet5
from fenchel_cvx.fast.reads import count
from fenchel_cvx.layers import LAYERS, _fold, build_maps, layer_from_dict


def conv_reference(W, X, shape, k, pad):
    """Cross-correlation by explicit loops:
    U[o, h, w] = b_o + sum_{c,i,j} W[o,c,i,j] X[c,h+i,w+j]."""
    C, H, Wd = shape
    m = X.shape[1]
    Xi = np.pad(X.reshape(C, H, Wd, m), ((0, 0), (pad, pad), (pad, pad), (0, 0)))
    K, b = W[:, :-1].reshape(W.shape[0], C, k, k), W[:, -1]
    Ho, Wo = H + 2 * pad - k + 1, Wd + 2 * pad - k + 1
    U = np.empty((W.shape[0], Ho, Wo, m))
    for h in range(Ho):
        for w in range(Wo):
            U[:, h, w, :] = (
                np.einsum("ocij,cijm->om", K, Xi[:, h : h + k, w : w + k, :]) + b[:, None]
            )
    return U.reshape(-1, m)


MAPS = [  # (input shape, specs)
    ((2, 6, 5), [Conv2d(3, 3)]),
    ((2, 5, 5), [Conv2d(3, 3, padding=1)]),
    ((1, 8, 8), [AvgPool2d(2), Conv2d(2, 3, padding=2)]),
    ((3, 4, 4), [AvgPool2d(2), Flatten(), Dense(5)]),
    ((7,), [Dense(4)]),
]


@pytest.mark.parametrize("shape,k,pad", [((2, 6, 5), 3, 0), ((1, 5, 5), 5, 2), ((3, 4, 6), 2, 1)])
def test_conv_forward_matches_the_loop_reference(shape, k, pad, rng):
    (A,) = build_maps(shape, [Conv2d(4, k, padding=pad)])
    W = rng.standard_normal(A.weight_shape)
    X = rng.standard_normal((A.n_in, 3))
    np.testing.assert_allclose(A.forward(W, X), conv_reference(W, X, shape, k, pad), atol=1e-12)
    assert A.out_shape == (4, shape[1] + 2 * pad - k + 1, shape[2] + 2 * pad - k + 1)


@pytest.mark.parametrize("shape,specs", MAPS, ids=lambda v: repr(v))
def test_adjoints_and_matrix(shape, specs, rng):
    (A,) = build_maps(shape, specs)
    W = rng.standard_normal(A.weight_shape)
    W0 = W.copy()
    W0[:, -1] = 0.0  # the linear part (no bias)
    X, G = rng.standard_normal((A.n_in, 4)), rng.standard_normal((A.n_out, 4))
    # <A(W) X, G> = <X, A(W)^T G>
    np.testing.assert_allclose(
        np.sum(A.forward(W0, X) * G), np.sum(X * A.adjoint_x(W0, G)), rtol=1e-12
    )
    # <A(W) X + b, G> is linear in W with gradient adjoint_w(G, X) = rows(G) patches(X)^T
    D = rng.standard_normal(W.shape)
    lhs = np.sum(A.forward(W + D, X) * G) - np.sum(A.forward(W, X) * G)
    np.testing.assert_allclose(lhs, np.sum(D * A.adjoint_w(G, X)), rtol=1e-10)
    # the product form the W-blocks use
    np.testing.assert_allclose(A.from_rows(W @ A.patches(X), 4), A.forward(W, X), atol=1e-12)
    M, b = A.matrix(W)
    np.testing.assert_allclose(M @ X + b, A.forward(W, X), atol=1e-12)
    top = np.linalg.norm(M, 2) ** 2  # power iteration approaches it from below
    assert 0.95 * top <= A.norm2(W, iters=100) <= top * (1 + 1e-9)


LENET_X1_MAP = ((6, 28, 28), [AvgPool2d(2), Conv2d(16, 5)])  # LeNet-5: pool, its second conv


@pytest.mark.parametrize(
    "shape,specs",
    MAPS + [LENET_X1_MAP, ((4, 3, 3), [Conv2d(2, 3, padding=2)])],
    ids=lambda v: repr(v),
)
def test_norm2_bound_is_an_upper_bound_close_to_the_norm(shape, specs, rng):
    """``norm2_bound`` (FISTA's certified Lipschitz constant) is never below the map's squared
    spectral norm: exact for dense maps, pooling and small convolutions (their explicit
    matrix); for LeNet-5's second conv, from the filters' spectrum, at most 20 % above; and it
    defers (None) to power iteration where an eigenproblem would exceed ``max_dim``."""
    (A,) = build_maps(shape, specs)
    W = rng.standard_normal(A.weight_shape)
    top = np.linalg.norm(A.matrix(W)[0], 2) ** 2
    bound = A.norm2_bound(W, max_dim=64)
    assert top * (1 - 1e-12) <= bound <= 1.2 * top
    if (shape, specs) != LENET_X1_MAP:  # the others are small: exact
        np.testing.assert_allclose(bound, top, rtol=1e-10)
    assert A.norm2_bound(W, max_dim=min(W.shape[0], shape[0]) - 1) is None


@pytest.mark.parametrize(
    "conv,shape",
    [
        (Conv2d(4, 3, padding=1), (3, 7, 7)),  # an odd grid, fewer input channels than filters
        (Conv2d(2, 3), (5, 6, 6)),  # an even grid, more input channels than filters
        (Conv2d(16, 5), (6, 12, 12)),  # LeNet-5's second conv
    ],
    ids=repr,
)
def test_a_convs_spectrum_bound_is_the_largest_over_every_frequency_of_its_grid(conv, shape, rng):
    """The filters' spectrum bound takes half the grid's frequencies (real filters: the other
    half are conjugates) and is the largest squared singular value over all of them: for
    drawn filters, and for filters whose peak lies on the last column of the half."""
    C, H, Wd = shape
    N1, N2, k = H + 2 * conv.padding, Wd + 2 * conv.padding, conv.kernel
    drawn = rng.standard_normal(conv.weight_shape(shape))
    alternating = drawn.copy()  # signs alternating along the width: the peak at f2 = N2 / 2
    alternating[:, :-1] = np.abs(drawn[:, :-1]) * np.tile((-1.0) ** np.arange(k), C * k)
    for W in (drawn, alternating):
        M = np.fft.fft2(W[:, :-1].reshape(conv.channels, C, k, k), s=(N1, N2))
        top = np.array(
            [[np.linalg.norm(M[:, :, i, j], 2) ** 2 for j in range(N2)] for i in range(N1)]
        )
        small = min(conv.channels, C)  # the spectrum's route, not the explicit matrix's
        np.testing.assert_allclose(conv.norm2_bound(W, shape, small), top.max(), rtol=1e-12)
    assert top.max() > 1.01 * top[:, : N2 // 2].max()  # (its peak: the last column of the half)


@pytest.mark.parametrize(
    "shape,specs",
    [MAPS[0], LENET_X1_MAP, ((4, 3, 3), [Conv2d(2, 3, padding=2)])],
    ids=lambda v: repr(v),
)
def test_norm2_bound_off_numpy_reads_nothing_and_is_numpys_within_1e_8(shape, specs, rng):
    """Off NumPy the bound's top eigenvalue is ``_trace_bound``'s, by matrix products (a GPU
    waits for nothing, a CUDA graph can hold it): on array-api-strict arrays, no read back to
    the host, a 0-d array never below NumPy's ``eigvalsh`` figure and within 1e-8 of it."""
    xps = pytest.importorskip("array_api_strict")
    (A,) = build_maps(shape, specs)
    W = rng.standard_normal(A.weight_shape)
    bound, reads = count(A.norm2_bound, xps.asarray(W), 64)
    assert reads.total == 0, reads.table()
    assert type(bound).__module__.startswith("array_api_strict") and bound.ndim == 0
    exact = A.norm2_bound(W, max_dim=64)
    assert exact * (1 - 1e-13) <= float(bound) <= exact * (1 + 1e-8)


@pytest.mark.parametrize(
    "eigenvalues",
    [[3.0], [1.0] * 128, [2.0, 2.0, 1.0, 0.0], [0.0, 0.0], [1e-300, 1e-301], [5.0, 5.0 - 1e-9]],
)
def test_trace_bound_holds_for_equal_tiny_and_zero_eigenvalues(eigenvalues, rng):
    """``_trace_bound`` is an upper bound of the largest eigenvalue within a factor ``k^(2^-j)``
    of it (j squarings), where the top is repeated (the bound's worst case, k equal), tiny or
    zero, and over a stack of complex Hermitian matrices (a zero one among them)."""
    xps = pytest.importorskip("array_api_strict")
    k = len(eigenvalues)
    Q, _ = np.linalg.qr(rng.standard_normal((k, k)) + 1j * rng.standard_normal((k, k)))
    G = (Q * np.array(eigenvalues)) @ np.conj(Q.T)
    top = max(eigenvalues)
    stack = np.stack([G, np.zeros_like(G), G / 2])
    for M in (G.real if k == 1 else G, stack):
        bound = float(layers._trace_bound(xps, xps.asarray(M)))
        slack = k ** (2.0**-layers.SQUARINGS) - 1 + 1e-12  # the bound's factor, and rounding
        assert top * (1 - 1e-12) <= bound <= top * (1 + slack)


def patches_reference(X, shape, k, pad):
    """im2col by slicing the padded input: rows (c, i, j), columns (h, w, data point)."""
    C, H, Wd = shape
    m = X.shape[1]
    Xi = np.pad(X.reshape(C, H, Wd, m), ((0, 0), (pad, pad), (pad, pad), (0, 0)))
    Ho, Wo = H + 2 * pad - k + 1, Wd + 2 * pad - k + 1
    cols = np.stack([Xi[:, i : i + Ho, j : j + Wo, :] for i in range(k) for j in range(k)], axis=1)
    return np.vstack([cols.reshape(C * k * k, -1), np.ones((1, Ho * Wo * m))])


@pytest.mark.parametrize("chunk_bytes", [1, 3 * 18 * 6 * 5 * 8, 1 << 20])
def test_chunked_conv_equals_the_references(chunk_bytes, rng, monkeypatch):
    """On NumPy the conv runs a few output rows at a time (CHUNK_BYTES): one row, a few rows or
    the whole map give the loop reference, the im2col reference and the adjoint identity."""
    monkeypatch.setattr(layers, "CHUNK_BYTES", chunk_bytes)
    shape, k, pad = (2, 7, 6), 3, 1
    (A,) = build_maps(shape, [Conv2d(3, k, padding=pad)])
    W, X = rng.standard_normal(A.weight_shape), rng.standard_normal((A.n_in, 5))
    G = rng.standard_normal((A.n_out, 5))
    # a row of patches: 18 x 6 columns of 5 points, 8 bytes each; 7 output rows
    assert len(A.op._plan(np, X, shape)) == {1: 7, 3 * 18 * 6 * 5 * 8: 3, 1 << 20: 1}[chunk_bytes]
    np.testing.assert_allclose(A.forward(W, X), conv_reference(W, X, shape, k, pad), atol=1e-12)
    np.testing.assert_array_equal(A.patches(X), patches_reference(X, shape, k, pad))
    # the adjoint is the transpose of the im2col product: to_rows(G)-weighted patches, summed
    np.testing.assert_allclose(
        np.sum(A.adjoint_x(W, G) * X),
        np.sum(A.forward(W, X) * G) - np.sum(W[:, -1] @ A.to_rows(G)),
        rtol=1e-12,
    )
    M, _ = A.matrix(W)
    np.testing.assert_allclose(A.adjoint_x(W, G), M.T @ G, atol=1e-12)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_lenet_maps_keep_the_dtype(dtype, rng):
    """float32 stays float32 through every map (no hidden upcast), float64 stays float64."""
    net = lenet5((1, 28, 28), dtype=np.dtype(dtype).name)
    X = [rng.random((n, 3)).astype(dtype) for n in net.layer_sizes]
    for l, A in enumerate(net.layers):
        U = A.forward(net.W[l], X[l])
        assert U.dtype == dtype and A.adjoint_x(net.W[l], U).dtype == dtype
        assert A.patches(X[l]).dtype == dtype


def test_conv_maps_run_on_the_array_api_standard(rng):
    """Gather indices, chunks and col2im on array-api-strict arrays: the NumPy numbers."""
    xps = pytest.importorskip("array_api_strict")
    (A,) = build_maps((2, 6, 6), [AvgPool2d(2), Conv2d(3, 2, padding=1)])
    W, X = rng.standard_normal(A.weight_shape), rng.standard_normal((A.n_in, 4))
    G = rng.standard_normal((A.n_out, 4))
    for name, args in (("forward", (W, X)), ("adjoint_x", (W, G)), ("patches", (X,))):
        got = getattr(A, name)(*(xps.asarray(a) for a in args))
        assert type(got).__module__.startswith("array_api_strict"), name
        np.testing.assert_allclose(np.asarray(got), getattr(A, name)(*args), atol=1e-12)


@pytest.mark.parametrize(
    "shape,specs",
    [((2, 6, 6), [AvgPool2d(2), Conv2d(3, 2, padding=1)]), ((3, 7, 5), [Conv2d(4, 3)])],
)
def test_conv_maps_on_pytorch_tensors_give_the_numpy_numbers(shape, specs, rng, monkeypatch):
    """On PyTorch tensors, eagerly and traced by ``torch.compile`` (whose graph sums the
    adjoint's columns by ``torch.nn.functional.fold``, ``layers._fold``), with and without
    padding: the forward map, the adjoint and the patches of NumPy's slice sums."""
    torch = pytest.importorskip("torch", reason="PyTorch (the bench extra)")
    (A,) = build_maps(shape, specs)
    W, X = rng.standard_normal(A.weight_shape), rng.standard_normal((A.n_in, 5))
    G = rng.standard_normal((A.n_out, 5))
    folds = []
    monkeypatch.setattr(layers, "_fold", lambda *a: folds.append(1) or _fold(*a))
    for name, args in (("forward", (W, X)), ("adjoint_x", (W, G)), ("patches", (X,))):
        ref, method = getattr(A, name)(*args), getattr(A, name)
        traced = torch.compile(method, backend="eager", fullgraph=True)  # dynamo's graph, run
        for run in (method, traced):
            got = run(*(torch.asarray(a) for a in args))
            assert isinstance(got, torch.Tensor) and got.dtype == torch.float64, name
            np.testing.assert_allclose(got.numpy(), ref, atol=1e-12)
    assert folds == [1]  # the traced adjoint's, once


def test_pooling_folded_into_the_next_map(rng):
    (A,) = build_maps((2, 4, 4), [AvgPool2d(2), Flatten(), Dense(3)])
    W = rng.standard_normal(A.weight_shape)
    X = rng.standard_normal((32, 2))
    pooled = X.reshape(2, 2, 2, 2, 2, 2).mean(axis=(2, 4)).reshape(8, 2)
    np.testing.assert_allclose(A.forward(W, X), W[:, :-1] @ pooled + W[:, -1:], atol=1e-12)
    assert A.weight_shape == (3, 9) and not A.is_dense
    # the pooled sums are divided in place only where that is exact: integer images (a pool
    # as the first layer) average in floating point, float32 ones stay float32
    pix = rng.integers(0, 256, size=(32, 2)).astype(np.uint8)
    want = pix.reshape(2, 2, 2, 2, 2, 2).mean(axis=(2, 4)).reshape(8, 2)
    np.testing.assert_allclose(AvgPool2d(2).apply(np, pix, (2, 4, 4)), want, atol=1e-12)
    got32 = AvgPool2d(2).apply(np, X.astype(np.float32), (2, 4, 4))
    assert got32.dtype == np.float32
    np.testing.assert_allclose(got32, pooled, rtol=1e-6, atol=1e-6)


def test_lenet5_shapes_and_repr():
    net = lenet5((1, 28, 28), loss="cross_entropy", lam=(5, 5, 1, 1))
    assert net.layer_sizes == (784, 6 * 28 * 28, 16 * 10 * 10, 120, 84, 10)
    assert [W.shape for W in net.W] == [(6, 26), (16, 151), (120, 401), (84, 121), (10, 85)]
    text = repr(net)
    assert "conv2d 6@5x5 pad 2: (1, 28, 28) -> (6, 28, 28)" in text
    assert "avgpool 2x2 + conv2d 16@5x5: (6, 28, 28) -> (16, 10, 10)" in text
    cifar = lenet5((3, 32, 32))
    assert cifar.layer_sizes[:3] == (3072, 6 * 28 * 28, 1600) and cifar.W[0].shape == (6, 76)
    assert lenet5(dtype="float32").W[0].dtype == np.float32


def test_xavier_initialisation_uses_the_conv_fans():
    net = lenet5((1, 28, 28), seed=3)
    bound = np.sqrt(6.0 / (25 + 6 * 25))
    assert np.abs(net.W[0][:, :-1]).max() <= bound and np.abs(net.W[0][:, :-1]).max() > 0.8 * bound
    assert not net.W[0][:, -1].any()


def test_dense_network_is_unchanged():
    """The dense API: same weights as the formula it always used, same shapes, one-line repr."""
    net = LiftedNetwork([5, 4, 3], seed=2)
    rng = np.random.default_rng(2)
    a = np.sqrt(6.0 / 9)
    np.testing.assert_array_equal(net.W[0][:, :5], rng.uniform(-a, a, size=(4, 5)))
    assert net.input_shape == (5,) and "\n" not in repr(net)
    assert net.get_config()["layers"] == [
        {"kind": "dense", "units": 4},
        {"kind": "dense", "units": 3},
    ]


def test_config_round_trip():
    net = LiftedNetwork.from_layers(
        (2, 6, 6),
        [Conv2d(3, 3, padding=1), AvgPool2d(2), Flatten(), Dense(4), Dense(2)],
        activation=["leaky_relu", "tanh"],
        loss="cross_entropy",
        lam=(2.0, 3.0),
        rho=0.1,
        seed=5,
        dtype="float32",
    )
    cfg = json.loads(json.dumps(net.get_config()))
    twin = LiftedNetwork.from_config(cfg)
    assert twin.get_config() == cfg and repr(twin) == repr(net)
    for A, B in zip(net.W, twin.W):
        np.testing.assert_array_equal(A, B)
    assert [layer_from_dict(s.to_dict()) for s in net.specs] == net.specs


@pytest.mark.parametrize(
    "shape,specs,match",
    [
        ((1, 4, 4), [Conv2d(2, 5)], "kernel 5 exceeds its input 4x4"),
        ((3, 8, 8), [Conv2d(2, 3, in_channels=1)], "in_channels=1 does not match the input's 3"),
        ((1, 7, 7), [Conv2d(2, 3), AvgPool2d(2), Dense(2)], "divisible by 2, got 5x5"),
        ((1, 5, 5), [AvgPool2d(2), Dense(2)], "divisible by 2, got 5x5"),
        ((4,), [Dense(3), Conv2d(2, 3)], "conv2d needs a \\(channels, height, width\\) input"),
        ((4,), [Dense(3), Flatten()], "must end with a weighted layer"),
        ((0, 4, 4), [Dense(3)], "input_shape must be"),
        ((4, 4), [Dense(3)], "input_shape must be"),
        ((4,), ["dense"], "layers must be layer specs"),
        ((4,), [{"kind": "pool"}], "'kind' one of"),
        ((4,), [{"kind": "dense", "units": 3, "bias": False}], "bad parameters for layer"),
    ],
)
def test_bad_architectures_are_refused_by_name(shape, specs, match):
    with pytest.raises(ValueError, match=match):
        LiftedNetwork.from_layers(shape, specs)


@pytest.mark.parametrize(
    "make,match",
    [
        (lambda: Conv2d(0, 3), "conv2d channels must be an integer >= 1, got 0"),
        (lambda: Conv2d(2, True), "conv2d kernel must be an integer >= 1, got True"),
        (lambda: Conv2d(2, 3, padding=-1), "conv2d padding must be an integer >= 0, got -1"),
        (lambda: AvgPool2d(1), "avgpool2d size must be an integer >= 2, got 1"),
        (lambda: Dense(2.5), "dense units must be an integer >= 1, got 2.5"),
        (lambda: lenet5((1, 30, 30)), "input_shape must be \\(channels, 28, 28\\)"),
        (
            lambda: LiftedNetwork([3, 2], dtype="int32"),
            "dtype must be 'float32' or 'float64', got 'int32'",
        ),
    ],
)
def test_bad_layer_parameters(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_image_data_of_the_wrong_shape_is_refused_by_name():
    net = lenet5((1, 28, 28))
    with pytest.raises(
        ValueError, match=r"X0 must have 784 rows \(an input of shape \(1, 28, 28\)"
    ):
        net.predict(np.zeros((3072, 2)))


def test_registry_holds_every_kind():
    assert set(LAYERS) == {"dense", "conv2d", "avgpool2d", "flatten"}


def test_a_conv_spec_pickles_without_its_index_cache(rng):
    import pickle

    (A,) = build_maps((1, 6, 6), [Conv2d(2, 3, padding=1)])
    W, X = rng.standard_normal(A.weight_shape), rng.standard_normal((36, 2))
    U = A.forward(W, X)
    assert A.op._plans
    twin = pickle.loads(pickle.dumps(A))
    assert twin.op._plans == {} and twin.op == A.op
    np.testing.assert_array_equal(twin.forward(W, X), U)
