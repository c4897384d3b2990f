"""Bad input to the Python API is refused by name before any work (or converted, where that is
the documented rule): sparse matrices, cross-entropy targets, half precision, foreign arrays,
and no RuntimeWarning from the activations at the ends of their ranges."""

import warnings

import numpy as np
import pytest
import scipy.sparse as sp

from fenchel_cvx.activations import activation
from fenchel_cvx.bcd import fit_bcd
from fenchel_cvx.network import LiftedNetwork


class _Counting:
    """A backend that counts its solves: a refused input must reach none."""

    name = "counting"

    def __init__(self):
        from fenchel_cvx.fast import FastBackend

        self.inner, self.calls = FastBackend(), 0

    def solve(self, block, start=None):
        self.calls += 1
        return self.inner.solve(block, start)


@pytest.fixture
def data():
    rng = np.random.default_rng(0)
    return rng.normal(size=(4, 8)), np.eye(3)[:, rng.integers(0, 3, 8)]


@pytest.mark.parametrize(
    "change, match",
    [
        (
            lambda X, Y: (sp.csr_matrix(X), Y),
            "X0 must be a dense array, got a scipy.sparse csr_matrix",
        ),
        (lambda X, Y: (X, sp.coo_matrix(Y)), "Y must be a dense array"),
        (lambda X, Y: (X, -Y), "Y must hold one probability vector per column"),
        (lambda X, Y: (X, 2 * Y), "each column summing to 1"),
        (lambda X, Y: (X, Y + 0.1), "each column summing to 1"),
    ],
)
def test_refused_before_any_solve(data, change, match):
    X, Y = change(*data)
    backend = _Counting()
    with pytest.raises(ValueError, match=match):
        fit_bcd(LiftedNetwork([4, 5, 3], loss="cross_entropy"), X, Y, backend=backend, iterations=1)
    assert backend.calls == 0


def test_soft_labels_are_cross_entropy_targets(data):
    X, Y = data
    soft = 0.8 * Y + 0.2 / 3
    res = fit_bcd(
        LiftedNetwork([4, 5, 3], loss="cross_entropy"), X, soft, backend="fast", iterations=1
    )
    assert len(res.history) == 1


def test_mse_takes_any_real_targets(data):
    X, Y = data
    fit_bcd(LiftedNetwork([4, 5, 3]), X, -3 * Y, backend="fast", iterations=1)


def test_float16_is_upcast_with_a_warning(data):
    X, Y = data
    net = LiftedNetwork([4, 5, 3], loss="cross_entropy")
    with pytest.warns(UserWarning, match="X0 is float16: upcast to the network's float64"):
        fit_bcd(net, X.astype(np.float16), Y, backend="fast", iterations=1)
    assert net.W[0].dtype == np.float64


def test_predict_takes_a_torch_tensor_and_refuses_sparse(data):
    torch = pytest.importorskip("torch")
    X, _ = data
    net = LiftedNetwork([4, 5, 3])
    np.testing.assert_array_equal(net.predict(torch.tensor(X)), net.predict(X))
    with pytest.raises(ValueError, match="X0 must be a dense array"):
        net.predict(sp.csr_matrix(X))


def test_predict_puts_numpy_data_on_the_weights_device(data):
    """Weights on a device (array_api_strict's ``device1`` stands in for a GPU: it refuses to mix
    devices) take NumPy data there, as CUDA tensors do."""
    xps = pytest.importorskip("array_api_strict")
    X, _ = data
    net = LiftedNetwork([4, 5, 3])
    expected = net.predict(X)
    where = xps.Device("device1")
    net.W = [xps.asarray(W, device=where) for W in net.W]
    out = net.predict(X)
    assert out.device == where
    np.testing.assert_allclose(
        np.asarray(xps.asarray(out, device=xps.Device("CPU_DEVICE"))), expected
    )


def test_predict_checks_a_backends_per_layer_settings_first(data, monkeypatch):
    """The optimisation rule refuses per-layer steps that do not fit the network before any
    work (as fit_bcd does), not at the first block without an entry."""
    from fenchel_cvx.fast import FastBackend
    from fenchel_cvx.predict import predict

    X, _ = data
    net = LiftedNetwork([4, 5, 6, 3], loss="cross_entropy")
    monkeypatch.setattr(net, "forward", lambda *a: pytest.fail("work started"))
    with pytest.raises(
        ValueError,
        match=r"x_steps must have one entry per block of the network "
        r"\(2: X_1 to X_2\), got 3",
    ):
        predict(net, X, rule="optimization", backend=FastBackend(x_steps=(1, 2, 3)))


@pytest.mark.parametrize("name", ["sigmoid", "tanh"])
def test_inverse_at_the_ends_of_the_range_warns_nothing(name):
    act = activation(name)
    lo, hi = act.v_range
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        v = act.phi_inv(np.array([lo, hi, 0.5 * (lo + hi), hi + 1.0]))
    assert v[0] == -np.inf and v[1] == np.inf and np.isfinite(v[2]) and np.isnan(v[3])
