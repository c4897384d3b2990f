"""The fast backend and the driver on a GPU (CuPy; PyTorch's CUDA tensors): the NumPy results,
on the device.

Every test skips, naming the reason, where CuPy (or PyTorch) or a CUDA device is absent (CI has
none);
docs/results.md ("On a GPU") records the runs on a GPU machine.

- Each kind of block of a dense network (X hidden, X last, W hidden, W last; the X-blocks of
  every activation): the value of the NumPy solve within 1e-8 in float64, 1e-5 in float32, and
  the status of the NumPy solve in the same dtype; a float32 block stays float32 on the device.
- The X- and W-blocks of a conv network (im2col and its adjoints on the device): the same.
- ``fit_bcd`` (Algorithm 2) on a dense network and on LeNet-5, on CuPy arrays and on PyTorch
  CUDA tensors: the run stays on the device (weights and lifted X are the device's arrays),
  ends at the NumPy run's weights in float64, and its certificate gives the NumPy run's verdict
  on every round: descent, the lower bound and Fenchel-Young hold.
- ``compile="blocks"`` (each block solve a CUDA graph): a run on PyTorch's CUDA tensors ends at
  the eager run's weights (1e-4 relative, float32), compiles in its first batch only and holds
  its certificate.
- The backprop baselines on CUDA (``train_backprop(device="cuda")``): the CPU run's weights
  within 1e-3 relative (float32, on two devices), and its accuracies.
"""

import numpy as np
import pytest

from fenchel_cvx import AvgPool2d, Conv2d, Dense, Flatten, LiftedNetwork, blocks, fit_bcd, lenet5
from fenchel_cvx.datasets import load_digits, load_mnist5k, one_hot
from fenchel_cvx.fast import FastBackend
from test_fast import CASES, _to, case_block, make_block, make_state


@pytest.fixture(scope="module")
def cp():
    cupy = pytest.importorskip("cupy", reason="CuPy is not installed")
    try:
        n_dev = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:  # no driver, no device
        pytest.skip(f"no usable CUDA device for CuPy: {type(exc).__name__}: {exc}")
    if n_dev == 0:
        pytest.skip("no CUDA device for CuPy")
    return cupy


def _on_device(cp, A):
    return isinstance(A, cp.ndarray) and A.device.id == cp.cuda.Device().id


@pytest.mark.parametrize("dtype,rel", [("float64", 1e-8), ("float32", 1e-5)])
@pytest.mark.parametrize("act,loss,kind,gamma", [c for c in CASES if c[3] or c[2][0] == "x"])
def test_dense_blocks_match_numpy(cp, dtype, rel, act, loss, kind, gamma):
    ref = FastBackend().solve(case_block(act, loss, kind, gamma))
    cpu = FastBackend().solve(
        make_block(kind, *_to(np, dtype, *make_state(act, loss)), gamma=gamma)
    )
    block = make_block(kind, *_to(cp, dtype, *make_state(act, loss)), gamma=gamma)
    res = FastBackend().solve(block)
    assert _on_device(cp, res.argmin) and res.argmin.dtype == np.dtype(dtype)
    # the same status as on the CPU in the same dtype: in float32 a block can stall at the
    # rounding floor just above its tolerance, on either device (tanh, cross-entropy, X_1)
    assert res.converged == cpu.converged and (res.converged or dtype == "float32")
    assert res.value == pytest.approx(ref.value, rel=rel)


@pytest.mark.parametrize("dtype,rel", [("float64", 1e-12), ("float32", 1e-5)])
@pytest.mark.parametrize("shape,axis", [((300, 500), -1), ((300, 500), -2), ((6, 392_000), -1)])
def test_vecdot_kernel_matches_numpy(cp, dtype, rel, shape, axis):
    """``arrays.vecdot`` on CuPy arrays (its fused reduction kernel): NumPy's sums, on the device,
    in the arrays' dtype."""
    from fenchel_cvx.arrays import vecdot

    rng = np.random.default_rng(1)
    A, B = (rng.standard_normal(shape).astype(dtype) for _ in range(2))
    got = vecdot(cp.asarray(A), cp.asarray(B), axis=axis)
    assert _on_device(cp, got) and got.dtype == np.dtype(dtype)
    want = np.sum(A.astype(np.float64) * B, axis=axis)
    np.testing.assert_allclose(cp.asnumpy(got), want, rtol=rel, atol=rel * np.sqrt(shape[axis]))
    mixed = vecdot(cp.asarray(A), cp.asarray(B, dtype=np.float64), axis=axis)  # promoted
    assert mixed.dtype == np.float64
    np.testing.assert_allclose(cp.asnumpy(mixed), want, rtol=rel, atol=rel * np.sqrt(shape[axis]))
    with pytest.raises(ValueError, match="one size along axis"):
        vecdot(cp.asarray(A), cp.asarray(B[:1] if axis == -2 else B[:, :1]), axis=axis)


def conv_net(dtype="float64"):
    """(1, 8, 8) -> conv 3@3x3 pad 1 -> pool + conv 4@3x3 -> pool + flatten + dense 10."""
    return LiftedNetwork.from_layers(
        (1, 8, 8),
        [Conv2d(3, 3, padding=1), AvgPool2d(2), Conv2d(4, 3), AvgPool2d(2), Flatten(), Dense(10)],
        activation="relu",
        loss="cross_entropy",
        lam=(1.0, 0.5),
        rho=0.05,
        seed=0,
        dtype=dtype,
    )


@pytest.mark.parametrize("dtype,rel", [("float64", 1e-8), ("float32", 1e-5)])
def test_conv_blocks_match_numpy(cp, dtype, rel):
    ds = load_digits()
    X0, Y = ds.X_train[:, :40], one_hot(ds.y_train[:40], 10)
    rng = np.random.default_rng(0)
    net = conv_net()
    Xs = [np.maximum(X + 0.1 * rng.standard_normal(X.shape), 0) for X in net.forward(X0)[0]]
    W0s = [W + 0.05 * rng.standard_normal(W.shape) for W in net.W]
    state_np = (net, X0, Y, Xs, W0s)
    gpu = conv_net()
    state_cp = _to(cp, dtype, gpu, X0, Y, Xs, W0s)
    for kind, l in [("x", 1), ("x", 2), ("w", 0), ("w", 1), ("w", 2)]:
        make = (
            (lambda s, l=l: blocks.x_block(*s[:4], l))
            if kind == "x"
            else (lambda s, l=l: blocks.w_block(*s[:4], l, gamma=0.3, W0=s[4][l]))
        )
        ref, res = FastBackend().solve(make(state_np)), FastBackend().solve(make(state_cp))
        assert _on_device(cp, res.argmin) and res.argmin.dtype == np.dtype(dtype), (kind, l)
        assert res.converged, (kind, l, res.status)
        assert res.value == pytest.approx(ref.value, rel=rel), (kind, l)


def _fit(make_net, X, Y, Xt, Yt, asarray, **kw):
    net = make_net()
    return fit_bcd(
        net,
        asarray(X),
        asarray(Y),
        X_test=asarray(Xt),
        Y_test=asarray(Yt),
        backend="fast",
        epochs=1,
        check_every=1,
        **kw,
    )


def _device(library, request):
    """``(asarray, on_device, to_numpy)`` of ``library``'s arrays on the GPU: CuPy's, or
    PyTorch's CUDA tensors (the fast backend's same array-API path)."""
    if library == "cupy":
        cp = request.getfixturevalue("cp")
        return cp.asarray, lambda A: _on_device(cp, A), cp.asnumpy
    torch = pytest.importorskip("torch", reason="PyTorch is not installed")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device for PyTorch")
    return (
        lambda A: torch.asarray(A, device="cuda"),
        lambda A: isinstance(A, torch.Tensor) and A.is_cuda,
        lambda A: A.cpu().numpy(),
    )


@pytest.mark.parametrize("library", ["cupy", "torch"])
@pytest.mark.parametrize("network", ["dense", "lenet5"])
def test_fit_bcd_runs_on_the_device(library, network, request):
    asarray, on_device, to_numpy = _device(library, request)
    if network == "dense":
        ds = load_digits()

        def make():
            return LiftedNetwork(
                [64, 16, 10], "relu", "cross_entropy", lam=0.2, seed=0, dtype="float64"
            )

        X, y, Xt, yt, batch = ds.X_train[:, :200], ds.y_train[:200], ds.X_test, ds.y_test, 50
    else:  # the real LeNet-5 on 28 x 28 digits: two batches of 100
        ds = load_mnist5k()

        def make():
            return lenet5(lam=(10, 10, 2, 2), rho=0.0, seed=0, dtype="float64")

        X, y, Xt, yt, batch = (
            ds.X_train[:, :200],
            ds.y_train[:200],
            ds.X_test[:, :100],
            ds.y_test[:100],
            100,
        )
    Y, Yt = one_hot(y, 10), one_hot(yt, 10)
    gamma = (1e-4, 1e-2, 1, 1, 1) if network == "lenet5" else (1.0, 100.0)
    ref = _fit(make, X, Y, Xt, Yt, np.asarray, batch_size=batch, gamma=gamma)
    run = _fit(make, X, Y, Xt, Yt, asarray, batch_size=batch, gamma=gamma)
    assert all(on_device(W) for W in run.net.W)
    assert all(on_device(X_) for X_ in run.Xs)
    for W, W_ref in zip(run.net.W, ref.net.W):
        np.testing.assert_allclose(to_numpy(W), W_ref, rtol=1e-6, atol=1e-9)
    assert len(run.history.records) == len(ref.history.records) == 200 // batch
    for a, b in zip(run.history.records, ref.history.records):
        found = [{(v["check"], v["layer"]) for v in r["certificate"]["violations"]} for r in (a, b)]
        assert found[0] == found[1]  # the same verdict as on the CPU
        # descent, lower bound, Fenchel-Young: never violated (a capped block may not be optimal)
        assert {check for check, _ in found[0]} <= {"block_optimality"}
        assert a["test_accuracy"] == pytest.approx(b["test_accuracy"], abs=0.011)
        assert a["lifted_x"] == pytest.approx(b["lifted_x"], rel=1e-6)


def test_whole_block_solves_on_cuda_end_where_the_eager_run_does(request):
    """``compile="blocks"``: each block solve a CUDA graph (``fast.whole``); its results are
    copied out of the graph's memory, so the weights a batch hands the next stay intact."""
    asarray, on_device, _ = _device("torch", request)
    import torch
    from torch._dynamo.utils import counters

    from fenchel_cvx.fast import fused, whole

    if whole.too_old(torch) is not None:
        pytest.skip(f"compile='blocks' needs {whole.too_old(torch)}")

    ds = load_digits()
    X, Y = ds.X_train[:, :200].astype(np.float32), one_hot(ds.y_train[:200], 10).astype(np.float32)
    steps = dict(w_steps=2, x_steps=2, capped_residual=False, capped_value=False)
    runs, graphs = {}, []
    for compile_ in ("blocks", False):
        net = LiftedNetwork([64, 16, 10], "relu", "cross_entropy", lam=0.2, seed=0, dtype="float32")
        runs[compile_] = fit_bcd(
            net,
            asarray(X),
            asarray(Y),
            backend=(backend := FastBackend(compile=compile_, **steps)),
            batch_size=50,
            epochs=2,
            gamma=(1.0, 100.0),
            strict=False,
            eval_every=None,
            check_every=1,
            callback=(lambda n, r: graphs.append(fused.compiled_graphs())) if compile_ else None,
        )
        if compile_:
            # every solve compiled whole (none fell back: a capture failure, or a result read
            # after the next replay overwrote it, would have), the W-blocks' CUDA graphs kept
            assert not backend.kernels._failed, backend.kernels._failed
            assert counters["inductor"]["cudagraph_skips"] == 0, dict(counters["inductor"])
    assert len(graphs) == 8 and len(set(graphs[1:])) == 1, graphs  # no compile after batch 1
    for W, W_ref in zip(runs["blocks"].net.W, runs[False].net.W):
        assert on_device(W)
        assert float((W - W_ref).abs().max() / W_ref.abs().max()) <= 1e-4
    for r in runs["blocks"].history.records:
        assert {v["check"] for v in r["certificate"]["violations"]} <= {"block_optimality"}


@pytest.mark.parametrize("optimizer", ["adam", "sgd"])
def test_backprop_on_cuda_matches_the_cpu(optimizer):
    torch = pytest.importorskip("torch", reason="PyTorch is not installed")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device for PyTorch")
    from fenchel_cvx.baselines import train_backprop
    from fenchel_cvx.datasets import batch_order

    ds = load_digits()
    batches = batch_order(ds.X_train.shape[1], 100, 2, seed=0)
    runs = [
        train_backprop(
            (64, 16, 10),
            ds.X_train,
            ds.y_train,
            ds.X_test,
            ds.y_test,
            batches=batches,
            optimizer=optimizer,
            seed=0,
            device=device,
        )
        for device in ("cpu", "cuda")
    ]
    for W, W_ref in zip(runs[1].weights, runs[0].weights):
        np.testing.assert_allclose(W, W_ref, rtol=1e-3, atol=1e-4)
    assert runs[1].test_accuracy == pytest.approx(runs[0].test_accuracy, abs=0.01)
    # the CUDA run's training time is recorded, one figure per epoch (speed: the benchmarks)
    assert len(runs[1].seconds) == len(runs[1].test_accuracy) == len(runs[0].seconds)
    assert all(isinstance(s, float) and np.isfinite(s) for s in runs[1].seconds)
