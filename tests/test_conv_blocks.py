"""Conv blocks: the X- and W-blocks of a convolutional lifted network (issue: conv layers).

- An X-block whose outgoing map is pooling + convolution has the argmin and value of the same
  block written with the map's explicit (Toeplitz) matrix as a dense layer, and of an independent
  L-BFGS-B solve of its im2col value and gradient.
- A conv W-block (a dense W-block on im2col patches, separable by output channel) has the argmin
  and value of the block written as one explicit CVXPY problem in the filter entries, through the
  matrix that maps the filters to the outputs.
- The fast backend matches the oracle on every block of a conv network in float64 (1e-6
  relative), also on array-api-strict arrays; the driver's certificate holds on conv networks.
"""

import cvxpy as cp
import numpy as np
import pytest
from scipy import optimize

from fenchel_cvx import AvgPool2d, Conv2d, Dense, Flatten, LiftedNetwork, blocks, fit_bcd
from fenchel_cvx.fast import FastBackend
from fenchel_cvx.oracle import OracleBackend
from fenchel_cvx.oracle.atoms import divergence_cvx

REL = 1e-6


def conv_net(act="relu", loss="mse", seed=0):
    """(1, 6, 6) -> conv 2@3x3 pad 1 -> pool + conv 2@2x2 -> pool + flatten + dense 2."""
    return LiftedNetwork.from_layers(
        (1, 6, 6),
        [Conv2d(2, 3, padding=1), AvgPool2d(2), Conv2d(2, 2), AvgPool2d(2), Flatten(), Dense(2)],
        activation=act,
        loss=loss,
        lam=(1.0, 0.7),
        rho=0.1,
        seed=seed,
    )


def conv_state(act="relu", loss="mse", seed=0, m=4):
    rng = np.random.default_rng(seed)
    net = conv_net(act, loss, seed)
    net.W = [W + 0.3 * rng.standard_normal(W.shape) for W in net.W]
    X0 = rng.random((36, m))
    Y = (
        np.eye(2)[:, rng.integers(0, 2, m)]
        if loss == "cross_entropy"
        else rng.standard_normal((2, m))
    )
    Xs, _ = net.forward(X0)
    lo, hi = (0, None) if act == "relu" else (0.05, 0.95)
    Xs = [np.clip(X + 0.2 * rng.standard_normal(X.shape), lo, hi) for X in Xs]
    return net, X0, Y, Xs


def explicit(block):
    """The same X-block with the outgoing map as its explicit matrix: a dense layer."""
    return type(block)(
        **{
            **{f: getattr(block, f) for f in block.__dataclass_fields__},
            "W": block.dense_W(),
            "map": None,
        }
    )


@pytest.mark.parametrize("l", [1, 2])
def test_conv_x_block_equals_its_toeplitz_form(l):
    net, X0, Y, Xs = conv_state()
    block = blocks.x_block(net, X0, Y, Xs, l)
    assert not block.map.is_dense
    dense = explicit(block)
    Z = Xs[l - 1] + 0.1
    np.testing.assert_allclose(block.value(Z), dense.value(Z), rtol=1e-12)
    np.testing.assert_allclose(block.grad(Z), dense.grad(Z), atol=1e-12)
    oracle = OracleBackend()
    a, b = oracle.solve(block), oracle.solve(dense)
    np.testing.assert_allclose(a.argmin, b.argmin, atol=1e-5)
    np.testing.assert_allclose(a.value, b.value, rtol=1e-8)
    # an independent solve of the im2col form: L-BFGS-B on value and gradient, Z >= 0
    shape = Z.shape
    ref = optimize.minimize(
        lambda z: float(block.value(z.reshape(shape))),
        Z.ravel(),
        jac=lambda z: block.grad(z.reshape(shape)).ravel(),
        method="L-BFGS-B",
        bounds=[(0, None)] * Z.size,
        options=dict(ftol=1e-15, gtol=1e-11, maxiter=5000),
    )
    assert a.value <= ref.fun + 1e-7 * (1 + abs(ref.fun))
    np.testing.assert_allclose(a.argmin.ravel(), ref.x, atol=1e-4)


def test_conv_w_block_equals_the_explicit_filter_problem():
    net, X0, Y, Xs = conv_state(seed=1)
    W0 = net.W[1] + 0.1
    block = blocks.w_block(net, X0, Y, Xs, 1, gamma=0.3, W0=W0)
    A = net.layers[1]
    assert block.Xt.shape == (2 * 4 + 1, 4 * 4) and block.V.shape == (2, 4 * 4)
    # M maps the filter entries (and biases) to the outputs: U = reshape(M @ vec(W))
    n = np.prod(A.weight_shape)
    M = np.stack(
        [A.forward(E.reshape(A.weight_shape), X0 := Xs[0]).ravel() for E in np.eye(n)], axis=1
    )
    w = cp.Variable(n)
    V = Xs[1]
    act = net.activations[1]
    B, cons = divergence_cvx(act, V.ravel(), M @ w)
    Wv, W0v = cp.reshape(w, A.weight_shape, order="C"), W0
    obj = net.lam[1] * B + net.rho[1] * cp.sum_squares(Wv) + 0.3 * cp.sum_squares(Wv - W0v)
    prob = cp.Problem(cp.Minimize(obj), cons)
    prob.solve(solver="CLARABEL")
    res = OracleBackend().solve(block)
    np.testing.assert_allclose(res.argmin, w.value.reshape(A.weight_shape), atol=1e-5)
    np.testing.assert_allclose(res.value, prob.value, rtol=1e-7)
    assert X0.shape == (72, 4)


@pytest.mark.parametrize("act", ["relu", "sigmoid"])
@pytest.mark.parametrize("loss", ["mse", "cross_entropy"])
@pytest.mark.parametrize("which", ["X_1", "X_2", "W_0", "W_1", "W_2"])
def test_fast_matches_the_oracle_on_conv_blocks(act, loss, which):
    net, X0, Y, Xs = conv_state(act, loss, seed=2)
    l = int(which[2])
    block = (
        blocks.x_block(net, X0, Y, Xs, l)
        if which[0] == "X"
        else blocks.w_block(net, X0, Y, Xs, l, gamma=0.2, W0=net.W[l] + 0.05)
    )
    start = Xs[l - 1] if which[0] == "X" else net.W[l]
    ref = OracleBackend().solve(block, start=start)
    got = FastBackend(tol=1e-9, max_iter=20000).solve(block, start=start)
    assert got.converged, got
    assert abs(got.value - ref.value) <= REL * (1 + abs(ref.value))
    assert block.kkt_residual(got.argmin) <= 1e-7


@pytest.mark.parametrize("act", ["relu", "sigmoid"])
@pytest.mark.parametrize("loss", ["mse", "cross_entropy"])
@pytest.mark.parametrize("l", [1, 2])
def test_fast_conv_x_blocks_step_from_a_certified_lipschitz_constant(act, loss, l):
    """A pooled conv map (X_1) and a pooled dense one (X_2): FISTA's L is the curvature times
    ``LinearMap.norm2_bound`` (not a power-iteration estimate), at least the curvature times
    ``||A||_2^2`` of the explicit matrix, and no step backtracks."""
    from fenchel_cvx.fast.xblocks import EXACT_EIG_MAX, _curvature

    net, X0, Y, Xs = conv_state(act, loss, seed=2)
    block = blocks.x_block(net, X0, Y, Xs, l)
    res = FastBackend(tol=1e-9, max_iter=20000).solve(block, start=Xs[l - 1])
    curv, known = _curvature(block, np)
    top = np.linalg.norm(block.map.matrix(block.W)[0], 2) ** 2
    assert known and res.converged and res.info["backtracks"] == 0
    assert res.info["lipschitz"] == pytest.approx(
        1.001 * curv * block.map.norm2_bound(block.W, EXACT_EIG_MAX), rel=1e-12
    )
    assert res.info["lipschitz"] >= curv * top


@pytest.mark.parametrize("l", [1, 2])
def test_capped_conv_x_solve_applies_its_map_once_per_step(monkeypatch, l):
    """A capped FISTA solve forms A(W, z) at its start and once per step, and no more: its
    closing values (the descent guard's) come from the products it holds, and equal the
    block's own to rounding."""
    from fenchel_cvx.layers import LinearMap

    net, X0, Y, Xs = conv_state(seed=3)
    block = blocks.x_block(net, X0, Y, Xs, l)
    calls, forward = [], LinearMap.forward
    monkeypatch.setattr(
        LinearMap, "forward", lambda self, W, X: calls.append(1) or forward(self, W, X)
    )
    for k in (1, 3):
        calls.clear()
        res = FastBackend(x_steps=k, capped_residual=False).solve(block, start=Xs[l - 1])
        assert not res.converged and res.iterations == k and np.isnan(res.residual)
        assert len(calls) == 1 + k
        assert res.value == pytest.approx(float(block.value(res.argmin)), rel=1e-12)


def test_fast_conv_x_block_runs_on_the_array_api_standard():
    xps = pytest.importorskip("array_api_strict")
    net, X0, Y, Xs = conv_state(seed=3)
    block = blocks.x_block(net, X0, Y, Xs, 1)
    conv = {
        f: (
            xps.asarray(getattr(block, f))
            if isinstance(getattr(block, f), np.ndarray)
            else getattr(block, f)
        )
        for f in block.__dataclass_fields__
    }
    strict = type(block)(**conv)
    a = FastBackend(tol=1e-9).solve(block, start=Xs[0])
    b = FastBackend(tol=1e-9).solve(strict, start=xps.asarray(Xs[0]))
    np.testing.assert_allclose(np.asarray(b.argmin), a.argmin, atol=1e-10)


@pytest.mark.parametrize("loss", ["mse", "cross_entropy"])
def test_the_certificate_holds_on_conv_networks(loss):
    """The strict oracle run: every check of every round, unchanged code, on a conv network."""
    net, X0, Y, _ = conv_state(loss=loss, seed=4, m=6)
    res = fit_bcd(net, X0, Y, iterations=2, backend="cvxpy")
    assert res.history.certificate_held and len(res.history.records) == 2
    rec = res.history.records[-1]
    assert rec["lifted_x"] <= rec["network_x"] + 1e-6 * (1 + abs(rec["network_x"]))


def test_batched_fast_training_on_a_conv_network_descends():
    net, X0, Y, _ = conv_state(loss="cross_entropy", seed=5, m=40)
    J0 = net.network_objective(X0, Y)
    res = fit_bcd(
        net,
        X0,
        Y,
        batch_size=20,
        epochs=3,
        gamma=(1e-2, 1e-1, 1.0),
        backend=FastBackend(w_steps=2, x_steps=20),
    )
    checked = [r for r in res.history.records if r["checked"]]
    # capped (inexact) W-steps report status max_iter; every objective-based check holds
    failed = {v["check"] for r in checked for v in r["certificate"]["violations"]}
    assert len(checked) == 6 and failed <= {"block_optimality"}
    assert all(
        v["detail"].startswith("status 'max_iter'")
        for r in checked
        for v in r["certificate"]["violations"]
    )
    assert net.network_objective(X0, Y) < J0
