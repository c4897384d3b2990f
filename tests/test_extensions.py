"""The ELU activation and the Huber loss (``fenchel_cvx.extensions``, one file each): their facts
against independent computations, their CVXPY forms against NumPy, and both end to end through
the oracle (strict certificate), the fast backend, save / load and the estimators."""

import cvxpy as cp
import numpy as np
import pytest

from fenchel_cvx import LiftedNetwork
from fenchel_cvx.activations import ACTIVATIONS, activation, activation_names, monotone
from fenchel_cvx.bcd import fit_bcd
from fenchel_cvx.blocks import w_block, x_block
from fenchel_cvx.extensions.elu import ELU
from fenchel_cvx.extensions.huber import Huber
from fenchel_cvx.fast import FastBackend
from fenchel_cvx.losses import LOSSES, loss, loss_names
from fenchel_cvx.oracle import OracleBackend
from fenchel_cvx.oracle.atoms import divergence_cvx, loss_cvx
from fenchel_cvx.oracle.certify import certify


def test_both_are_registered_by_their_own_files():
    assert ACTIVATIONS["elu"] is ELU and LOSSES["huber"] is Huber
    assert "elu" in activation_names() and loss_names("regression") == ["huber", "mse"]
    assert isinstance(activation("elu"), ELU) and loss("huber", delta=0.5).delta == 0.5


# --- ELU's facts ------------------------------------------------------------------------------
U = np.linspace(-6.0, 4.0, 41)


def test_elu_phi_and_its_inverse():
    act = activation("elu")
    np.testing.assert_allclose(act.phi(U), np.where(U > 0, U, np.exp(U) - 1), rtol=1e-15)
    V = act.phi(U)
    np.testing.assert_allclose(act.phi_inv(V), U, rtol=1e-12, atol=1e-14)
    assert act.phi_inv(np.array([-1.0]))[0] == -np.inf and np.isnan(
        act.phi_inv(np.array([-2.0]))[0]
    )
    h = 1e-6
    fd = (act.phi(U + h) - act.phi(U - h)) / (2 * h)  # (within h / 4 at the kink u = 0)
    np.testing.assert_allclose(act.dphi(U), fd, atol=1e-6)
    assert act.dphi_max == float(np.max(act.dphi(U))) == 1.0


def test_elu_closed_forms_agree_with_quadrature():
    """F, F* and B in closed form against ``monotone(phi)``'s quadrature of the same phi."""
    act = activation("elu")
    gen = monotone(act.phi, act.v_range)
    u = np.array([-3.0, -0.7, 0.0, 0.4, 2.5])
    v = np.array([-0.9, -0.3, 0.0, 0.5, 3.0])
    np.testing.assert_allclose(act.Fstar(u), gen.Fstar(u), rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(act.F(v), gen.F(v), rtol=1e-8, atol=1e-10)
    VV, UU = np.meshgrid(v, u)
    np.testing.assert_allclose(act.divergence(VV, UU), gen.divergence(VV, UU), rtol=1e-8, atol=1e-9)
    assert np.all(act.divergence(VV, UU) >= -1e-12)
    np.testing.assert_allclose(act.divergence(act.phi(u), u), 0.0, atol=1e-14)
    assert act.divergence(np.array([-1.5]), np.array([0.0]))[0] == np.inf


def test_elu_second_derivatives_and_range():
    act = activation("elu")
    v = np.array([-0.5, 0.0, 2.0])
    np.testing.assert_allclose(act.d2F(v), [2.0, 1.0, 1.0])  # 1 / (1 + v) below 0
    np.testing.assert_allclose(act.d2Fstar(np.array([-1.0, 1.0])), [np.exp(-1.0), 1.0])
    assert act.open_range and act.x_prox is None  # Newton's prox
    with pytest.raises(
        ValueError, match=r"^V must lie in the range \(-1.0, inf\) of elu, got -1.5"
    ):
        act.check_range("V", np.array([0.0, -1.5]))


def test_elu_cvxpy_forms_equal_numpy():
    """F's form (a maximum of two atoms) and F*'s (a partial minimum, epigraph) at fixed points:
    minimised over the epigraph variable they give the NumPy values."""
    act = activation("elu")
    v, u = np.array([-0.9, -0.2, 0.0, 1.5]), np.array([-2.0, -0.1, 0.0, 1.2])
    z = cp.Variable(4)
    B, cons = divergence_cvx(act, z, u)
    prob = cp.Problem(cp.Minimize(B), cons + [z == v])
    prob.solve()
    assert prob.value == pytest.approx(float(np.sum(act.divergence(v, u))), abs=1e-6)
    w = cp.Variable(4)
    B, cons = divergence_cvx(act, v, w)
    prob = cp.Problem(cp.Minimize(B), cons + [w == u])
    prob.solve()
    assert prob.value == pytest.approx(float(np.sum(act.divergence(v, u))), abs=1e-6)


# --- Huber's facts ----------------------------------------------------------------------------
def test_huber_value_gradient_hessian():
    rng = np.random.default_rng(0)
    Y, Yh, D = (rng.normal(scale=2.0, size=(3, 6)) for _ in range(3))
    L = loss("huber", delta=1.5)
    R = Yh - Y
    want = np.where(np.abs(R) <= 1.5, R * R, 3.0 * np.abs(R) - 2.25)
    assert float(L.value(Y, Yh)) == pytest.approx(float(want.sum()), rel=1e-14)
    np.testing.assert_allclose(L.column_values(Y, Yh), want.sum(axis=0), rtol=1e-14)
    h = 1e-6
    fd = (L.value(Y, Yh + h * D) - L.value(Y, Yh - h * D)) / (2 * h)
    assert float(np.sum(L.grad(Y, Yh) * D)) == pytest.approx(float(fd), rel=1e-7)
    d1, d2 = L.line_derivs(Y, Yh, D)
    assert float(d1) == pytest.approx(float(fd), rel=1e-7)
    assert float(d2) == pytest.approx(float(np.sum(2.0 * (np.abs(R) <= 1.5) * D * D)), rel=1e-14)
    assert float(L.value(Y, Yh)) == pytest.approx(float(loss_cvx(L, Y, Yh).value), rel=1e-12)
    with pytest.raises(ValueError, match="delta must be > 0 and finite, got -1"):
        loss("huber", delta=-1)


def test_huber_equals_mse_near_zero_and_is_linear_in_the_tails():
    L, mse = loss("huber", delta=2.0), loss("mse")
    Y, small = np.zeros((2, 3)), np.full((2, 3), 1.5)
    assert float(L.value(Y, small)) == float(mse.value(Y, small))
    assert float(L.value(Y, 10 * small)) == pytest.approx(6 * (4 * 15.0 - 4.0))


# --- end to end -------------------------------------------------------------------------------
def _data(seed=0, m=24):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(4, m))
    return X, np.vstack([np.sin(X[0]) + X[1], X[2] * X[3]]) + 0.1 * rng.normal(size=(2, m))


@pytest.mark.parametrize(
    "act, name", [("elu", "mse"), ("elu", "huber"), ("relu", "huber"), ("elu", "cross_entropy")]
)
@pytest.mark.parametrize("backend", ["cvxpy", "fast"])
def test_trains_end_to_end_with_the_strict_certificate(act, name, backend):
    X, Y = _data()
    if name == "cross_entropy":
        Y = np.eye(2)[:, np.argmax(Y, axis=0)]
    net = LiftedNetwork((4, 5, 3, 2), act, name, lam=1.0, rho=0.1, seed=1)
    before = net.network_objective(X, Y)
    res = fit_bcd(net, X, Y, iterations=3, backend=backend, strict=True, gamma=0.5)
    assert res.history.certificate_held
    assert net.network_objective(X, Y) < before


def test_oracle_and_fast_blocks_agree():
    """Each block of an ELU / Huber network: the fast solve's value within 1e-6 of the oracle's
    certified optimum, and the oracle's point certified (``certify``)."""
    X, Y = _data(1)
    net = LiftedNetwork((4, 5, 3, 2), "elu", "huber", lam=[1.0, 0.7], rho=0.1, seed=2)
    Xs = net.forward(X)[0]
    rng = np.random.default_rng(3)
    Xs = [np.maximum(Z + 0.2 * rng.normal(size=Z.shape), -0.95) for Z in Xs]
    blocks = [
        x_block(net, X, Y, Xs, 1),
        x_block(net, X, Y, Xs, 2),
        w_block(net, X, Y, Xs, 1),
        w_block(net, X, Y, Xs, 2, gamma=0.3, W0=net.W[2]),
    ]
    oracle, fast = OracleBackend(tol=1e-8), FastBackend(tol=1e-9)
    for block in blocks:
        a, b = oracle.solve(block), fast.solve(block)
        assert a.residual <= 1e-8 and b.residual <= 1e-9
        assert b.value == pytest.approx(a.value, rel=1e-6, abs=1e-8)
        cert = certify(block, b.argmin)
        assert cert.gap is not None and cert.relative_gap <= 1e-6


def test_save_and_load_keep_the_classes(tmp_path):
    net = LiftedNetwork((3, 4, 2), "elu", "huber", seed=4)
    path = net.save(tmp_path / "net.npz")
    back = LiftedNetwork.load(path)
    assert isinstance(back.activations[0], ELU) and isinstance(back.loss, Huber)
    X = np.random.default_rng(0).normal(size=(3, 5))
    np.testing.assert_array_equal(back.forward(X)[1], net.forward(X)[1])


def test_save_and_load_keep_a_loss_parameter(tmp_path):
    """A loss's parameters travel with the network: Huber's delta 0.25 reloads as 0.25, not as
    the default 1.0, and a config whose loss is a name alone (files that predate loss
    parameters) still loads."""
    net = LiftedNetwork((3, 4, 2), "relu", loss("huber", delta=0.25), seed=4)
    assert net.get_config()["loss"] == {"name": "huber", "delta": 0.25}
    back = LiftedNetwork.load(net.save(tmp_path / "net.npz"))
    assert back.loss.delta == 0.25
    Y, Yhat = np.zeros((2, 3)), np.full((2, 3), 0.5)
    assert float(back.loss.value(Y, Yhat)) == float(net.loss.value(Y, Yhat))
    by_name = LiftedNetwork.from_config({**net.get_config(), "loss": "huber"})
    assert by_name.loss.delta == 1.0


def test_a_checkpoint_keeps_the_loss_parameter_it_was_trained_with(tmp_path):
    """A Huber run stopped and resumed ends where the whole run does; a network with another
    delta is another run, and resuming it is refused."""
    rng = np.random.default_rng(1)
    X, Y = rng.normal(size=(3, 20)), rng.normal(size=(2, 20))

    def run(delta, **kw):
        net = LiftedNetwork((3, 4, 2), "relu", loss("huber", delta=delta), seed=2)
        fit_bcd(net, X, Y, backend="fast", iterations=4, gamma=0.5, check_every=2, **kw)
        return net

    whole = run(0.25)
    run(0.25, checkpoint=tmp_path, callback=lambda net, rec: rec["iteration"] >= 2)
    resumed = run(0.25, resume=tmp_path)
    for W, W_whole in zip(resumed.W, whole.W):
        np.testing.assert_array_equal(W, W_whole)
    with pytest.raises(ValueError, match="the network differs"):
        run(0.5, resume=tmp_path)


def test_a_network_its_file_cannot_record_is_refused_before_any_work(tmp_path):
    """A ``monotone`` activation holds a Python function, which no file records: saving it and
    training with checkpoints are refused by name, and nothing is written."""
    act = monotone(np.arctan, v_range=(-np.pi / 2, np.pi / 2))
    net = LiftedNetwork((3, 4, 2), act, "mse", seed=0)
    with pytest.raises(ValueError, match="activation.*monotone.*parameter 'phi'"):
        net.save(tmp_path / "net.npz")
    with pytest.raises(ValueError, match="cannot be saved or checkpointed"):
        fit_bcd(net, np.ones((3, 5)), np.ones((2, 5)), checkpoint=tmp_path / "ckpt")
    assert list(tmp_path.iterdir()) == []


def test_a_saved_loss_without_a_name_is_refused_by_name(tmp_path):
    from fenchel_cvx.errors import FileFormatError
    from fenchel_cvx.io import network_from_config

    config = {**LiftedNetwork((3, 4, 2), "relu", "mse", seed=0).get_config(), "loss": {"delta": 1}}
    with pytest.raises(FileFormatError, match="config.loss"):
        network_from_config(config, LiftedNetwork)


@pytest.mark.parametrize("backend", ["fast", "cvxpy"])
def test_estimators_take_elu(backend):
    from fenchel_cvx.estimator import FenchelClassifier, FenchelRegressor

    rng = np.random.default_rng(0)
    X = rng.normal(size=(60, 4))
    y = (X[:, 0] + 0.5 * X[:, 1] > 0).astype(int)
    clf = FenchelClassifier(
        hidden_layer_sizes=(5,), activation="elu", epochs=2, backend=backend, random_state=0
    ).fit(X, y)
    assert clf.score(X, y) > 0.8
    reg = FenchelRegressor(
        hidden_layer_sizes=(5,), activation="elu", epochs=2, backend=backend, random_state=0
    ).fit(X, X[:, 0])
    assert reg.score(X, X[:, 0]) > 0.5


def test_regressor_takes_huber():
    """The regressor trains with the Huber loss by name (from the registry's regression losses)
    and fits a linear target as it does with MSE."""
    from fenchel_cvx.estimator import FenchelRegressor

    assert "huber" in FenchelRegressor._losses
    rng = np.random.default_rng(0)
    X = rng.normal(size=(200, 4))
    reg = FenchelRegressor(hidden_layer_sizes=(8,), loss="huber", epochs=10, random_state=0)
    assert reg.fit(X, X[:, 0]).score(X, X[:, 0]) > 0.9
    assert type(reg.network_.loss).__name__ == "Huber"


def test_pytorch_counterparts():
    torch = pytest.importorskip("torch")
    u = torch.linspace(-3, 3, 13, dtype=torch.float64)
    assert torch.allclose(
        activation("elu").torch_module()(u), torch.from_numpy(activation("elu").phi(u.numpy()))
    )
    out, target = torch.randn(5, 3, dtype=torch.float64), torch.randn(5, 3, dtype=torch.float64)
    L = loss("huber", delta=0.7)
    want = float(L.value(target.numpy().T, out.numpy().T)) / 5  # the mean over the batch
    assert float(L.torch_loss(out, target)) == pytest.approx(want, rel=1e-12)


def test_fast_blocks_run_on_the_array_api_standard():
    """The same ELU / Huber blocks on ``array_api_strict`` arrays (the standard API only, as on
    CuPy): the same optimum as on NumPy."""
    xps = pytest.importorskip("array_api_strict")
    X, Y = _data(2)
    net = LiftedNetwork((4, 5, 3, 2), "elu", "huber", lam=1.0, rho=0.1, seed=5)
    Xs = net.forward(X)[0]
    refs = [
        FastBackend().solve(b)
        for b in (
            x_block(net, X, Y, Xs, 1),
            x_block(net, X, Y, Xs, 2),
            w_block(net, X, Y, Xs, 1),
            w_block(net, X, Y, Xs, 2),
        )
    ]
    net.W = [xps.asarray(W) for W in net.W]
    Xa, Ya, Xsa = xps.asarray(X), xps.asarray(Y), [xps.asarray(Z) for Z in Xs]
    for ref, block in zip(
        refs,
        (
            x_block(net, Xa, Ya, Xsa, 1),
            x_block(net, Xa, Ya, Xsa, 2),
            w_block(net, Xa, Ya, Xsa, 1),
            w_block(net, Xa, Ya, Xsa, 2),
        ),
    ):
        res = FastBackend().solve(block)
        assert type(res.argmin) is type(xps.asarray(0.0)) and res.converged
        assert res.value == pytest.approx(ref.value, rel=1e-9)
