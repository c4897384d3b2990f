"""A run on arrays of a device stays on that device: what a GPU's tensors need.

A CUDA tensor cannot be combined with one on the CPU, so every array the driver, the network
and the fast solvers create (a row of ones, an index, a zero start, an identity) must be made
on the device of the arrays it meets. ``array_api_strict`` checks this on the CPU: its arrays on
``Device("device1")`` refuse to combine with arrays on its default device, as a CUDA tensor
refuses a CPU one. Each test trains on ``device1`` and checks that the weights end there, equal
to the same run's on the default device.

Covered: both MNIST benchmarks' training settings (batches, momentum, the certificate's
checked rounds, test evaluation), a dense network of each activation and loss, Algorithm 1
(one batch, the carried W_0 X~_0), the forward X-sweep, blocks solved to tolerance, a run
stopped and resumed from its checkpoint, and the lifted prediction rule (Sec. 4.3).
"""

import numpy as np
import pytest

xps = pytest.importorskip("array_api_strict")

from fenchel_cvx import LiftedNetwork  # noqa: E402
from fenchel_cvx.bcd import fit_bcd  # noqa: E402
from fenchel_cvx.datasets import load_digits, load_mnist5k, one_hot  # noqa: E402
from fenchel_cvx.fast import FastBackend  # noqa: E402
from test_host_reads import training  # noqa: E402

DEVICE = xps.Device("device1")


def put(A, dtype, device=DEVICE):
    return xps.asarray(np.asarray(A, dtype=dtype), device=device)


def host(A):
    """A NumPy copy of an array of any of array_api_strict's devices."""
    return np.asarray(A.to_device(xps.Device("CPU_DEVICE")))


def assert_on(arrays, device=DEVICE):
    assert all(A.device == device for A in arrays), [A.device for A in arrays]


def on_both(make_net, X, Y, dtype="float64", test=None, **fit_args):
    """``fit_bcd`` of the same network and data on the default device and on ``DEVICE`` ->
    both runs' results; the second's weights and lifted X checked to be on ``DEVICE``.
    ``test``: ``(X_test, Y_test)``, evaluated after every round, on the run's device."""
    runs = []
    for device in (xps.Device("CPU_DEVICE"), DEVICE):
        net = make_net()
        net.W = [put(W, dtype, device) for W in net.W]
        if test is not None:
            fit_args.update(X_test=put(test[0], dtype, device), Y_test=put(test[1], dtype, device))
        runs.append(
            fit_bcd(net, put(X, dtype, device), put(Y, dtype, device), strict=False, **fit_args)
        )
    assert_on(runs[1].net.W)
    assert_on(runs[1].Xs)
    for W, W_ref in zip(runs[1].net.W, runs[0].net.W):
        np.testing.assert_array_equal(host(W), host(W_ref))
    return runs


@pytest.fixture(scope="module")
def mnist():
    ds = load_mnist5k()
    return ds.X_train[:, :1000], one_hot(ds.y_train[:1000], 10), ds.X_test[:, :200], ds.y_test


@pytest.mark.parametrize("name", ["mlp", "lenet5"])
def test_the_benchmarks_training_stays_on_the_device(name, mnist):
    X, Y, Xt, yt = mnist
    _, backend, args = training(name, "float32")
    runs = on_both(
        lambda: training(name, "float32")[0],
        X,
        Y,
        dtype="float32",
        batch_size=500,
        backend=backend,
        check_every=1,
        test=(Xt, one_hot(yt[:200], 10)),
        eval_every=1,
        **args,
    )
    assert all(r["checked"] for r in runs[1].history.records)
    assert runs[1].history.records[-1]["test_accuracy"] > 0.5


@pytest.mark.parametrize(
    "activation,loss",
    [("relu", "mse"), ("tanh", "cross_entropy"), ("sigmoid", "huber"), ("leaky_relu", "mse")],
)
def test_each_activation_and_loss_stays_on_the_device(activation, loss):
    ds = load_digits()
    runs = on_both(
        lambda: LiftedNetwork([64, 12, 10], activation, loss, lam=0.5, rho=0.01, seed=0),
        ds.X_train[:, :120],
        one_hot(ds.y_train[:120], 10),
        batch_size=60,
        epochs=2,
        backend=FastBackend(w_steps=3, x_steps=3),
        gamma=1.0,
        check_every=2,
    )
    assert len(runs[1].history.records) == 4


@pytest.mark.parametrize(
    "settings",
    [
        dict(batch_size=None, epochs=3, backend=FastBackend(w_steps=3, x_steps=3)),  # Alg. 1
        dict(batch_size=60, x_sweep="forward", backend=FastBackend(w_steps=2, x_steps=2)),
        dict(batch_size=60, backend=FastBackend(tol=1e-6)),  # blocks solved to tolerance
    ],
    ids=["algorithm-1", "forward-sweep", "to-tolerance"],
)
def test_the_driver_s_settings_stay_on_the_device(settings):
    ds = load_digits()
    on_both(
        lambda: LiftedNetwork([64, 12, 8, 10], "relu", "cross_entropy", lam=0.5, seed=0),
        ds.X_train[:, :120],
        one_hot(ds.y_train[:120], 10),
        check_every=1,
        **settings,
    )


def test_a_resumed_run_stays_on_the_device(tmp_path):
    ds = load_digits()
    X, Y = put(ds.X_train[:, :120], "float64"), put(one_hot(ds.y_train[:120], 10), "float64")

    def make():
        net = LiftedNetwork([64, 12, 10], "relu", "cross_entropy", lam=0.5, seed=0)
        net.W = [put(W, "float64") for W in net.W]
        return net

    args = dict(batch_size=60, backend=FastBackend(w_steps=2, x_steps=2), momentum=0.5)
    whole = fit_bcd(make(), X, Y, epochs=2, **args)
    stop_after_3 = lambda net, record: record["iteration"] == 3  # noqa: E731
    fit_bcd(make(), X, Y, epochs=2, checkpoint=tmp_path / "run", callback=stop_after_3, **args)
    resumed = fit_bcd(make(), X, Y, epochs=2, resume=tmp_path / "run", **args)
    assert_on(resumed.net.W)
    for W, W_ref in zip(resumed.net.W, whole.net.W):
        np.testing.assert_array_equal(host(W), host(W_ref))


def test_numpy_weights_targets_and_test_data_move_to_the_data_s_device():
    """Data on the device, everything else NumPy (the network's weights, the targets, the test
    set, the momentum's W_prev): the run moves them to the data's device and ends where the
    run given all of them there ends."""
    ds = load_digits()
    X, Y = ds.X_train[:, :120], one_hot(ds.y_train[:120], 10)
    Xt, Yt = ds.X_test[:, :50], one_hot(ds.y_test[:50], 10)
    runs = []
    for given in (lambda A: A, lambda A: put(A, "float64")):  # NumPy as given, or all moved
        net = LiftedNetwork([64, 12, 10], "relu", "cross_entropy", lam=0.5, seed=0)
        W_prev = [given(0.9 * W) for W in net.W]
        net.W = [given(W) for W in net.W]
        runs.append(
            fit_bcd(
                net,
                put(X, "float64"),
                given(Y),
                X_test=given(Xt),
                Y_test=given(Yt),
                eval_every=1,
                batch_size=60,
                momentum=0.5,
                W_prev=W_prev,
                backend=FastBackend(w_steps=2, x_steps=2),
                strict=False,
            )
        )
    assert_on(runs[0].net.W)
    assert_on(runs[0].Xs)
    for W, W_ref in zip(runs[0].net.W, runs[1].net.W):
        np.testing.assert_array_equal(host(W), host(W_ref))
    accuracies = [[r["test_accuracy"] for r in run.history.records] for run in runs]
    assert accuracies[0] == accuracies[1] and None not in accuracies[0]


def test_the_lifted_prediction_rule_stays_on_the_device():
    from fenchel_cvx.predict import predict

    ds = load_digits()
    net = LiftedNetwork([64, 12, 10], "relu", "cross_entropy", lam=0.5, seed=0)
    scores_ref = predict(net, ds.X_test[:, :50], rule="optimization", backend="fast", sweeps=1)
    net.W = [put(W, "float64") for W in net.W]
    scores = predict(
        net, put(ds.X_test[:, :50], "float64"), rule="optimization", backend="fast", sweeps=1
    )
    assert_on([scores])
    np.testing.assert_allclose(host(scores), scores_ref, rtol=1e-12, atol=1e-12)
