"""The PyTorch LeNet-5 baseline is the lifted network's LeNet-5: same maps, same weights, same
batches."""

import numpy as np
import pytest

from fenchel_cvx import lenet5
from fenchel_cvx.datasets import batch_order, load_mnist5k

torch = pytest.importorskip(
    "torch", reason="the backprop baselines need PyTorch (fenchel_cvx[bench])"
)
from fenchel_cvx.baselines import torch_model, train_backprop  # noqa: E402

THREADS = 1


@pytest.fixture(scope="module")
def small():
    """600 training and 300 test digits of the embedded 5k MNIST."""
    d = load_mnist5k()
    return d.X_train[:, :600], d.y_train[:600], d.X_test[:, :300], d.y_test[:300]


def _net(shape=(1, 28, 28), seed=0):
    return lenet5(
        input_shape=shape, activation="relu", loss="cross_entropy", seed=seed, dtype="float32"
    )


@pytest.mark.parametrize("shape", [(1, 28, 28), (3, 32, 32)])
def test_torch_lenet5_computes_the_lifted_networks_map(shape):
    net = _net(shape)
    X = np.random.default_rng(1).uniform(0, 1, (int(np.prod(shape)), 7)).astype(np.float32)
    model, input_shape, sizes = torch_model(net)
    assert input_shape == shape and sizes == net.layer_sizes
    assert [tuple(m.weight.shape) for m in model.weighted][:2] == [
        (6, shape[0], 5, 5),
        (16, 6, 5, 5),
    ]
    with torch.no_grad():
        logits = model(torch.from_numpy(X.T.copy()).reshape(-1, *shape)).numpy()
    out = net.forward(X)[1]
    assert np.allclose(logits.T, out, rtol=1e-4, atol=1e-5 * np.abs(out).max())


def test_adam_trains_lenet5_from_the_lifted_networks_weights(small):
    Xtr, ytr, Xte, yte = small
    net = _net()
    batches = batch_order(Xtr.shape[1], 50, 2, seed=0)
    r = train_backprop(
        net,
        Xtr,
        ytr,
        Xte,
        yte,
        batches=batches,
        optimizer="adam",
        threads=THREADS,
        eval_at=(1, 5),
        eval_every=12,
    )
    acc0 = np.mean(net.forward(Xte.astype(np.float32))[1].argmax(axis=0) == yte)
    assert r.initial_test_accuracy == pytest.approx(acc0, abs=1 / 300)  # it started from net.W
    assert r.layer_sizes == net.layer_sizes and r.lr == 1e-3
    assert [c[0] for c in r.checkpoints] == [1, 5, 12, 24]
    assert (
        r.test_accuracy[-1] > r.initial_test_accuracy + 0.25
        and r.train_loss[-1] < r.initial_train_loss
    )
    assert [W.shape for W in r.weights] == [W.shape for W in net.W]
    assert not np.allclose(r.weights[0], net.W[0])  # the copy trained, net did not
    trained = _net()
    trained.W = [W.astype(np.float32) for W in r.weights]
    acc = np.mean(trained.forward(Xte.astype(np.float32))[1].argmax(axis=0) == yte)
    assert acc == pytest.approx(r.test_accuracy[-1], abs=2 / 300)


def test_same_schedule_same_run_and_sgd_from_its_config(small):
    Xtr, ytr, Xte, yte = small
    batches = batch_order(Xtr.shape[1], 100, 1, seed=3)
    a, b = (
        train_backprop(
            _net(), Xtr, ytr, Xte, yte, batches=batches, optimizer="sgd", threads=THREADS
        )
        for _ in range(2)
    )
    assert a.train_loss == b.train_loss and np.array_equal(a.weights[0], b.weights[0])
    # from the config alone: Xavier-uniform from the seed, a different start
    c = train_backprop(
        _net().get_config(), Xtr, ytr, Xte, yte, batches=batches, optimizer="sgd", threads=THREADS
    )
    assert c.layer_sizes == a.layer_sizes and not np.array_equal(c.weights[0], a.weights[0])


def test_bad_input_is_named_before_training(small):
    Xtr, ytr, Xte, yte = small
    batches = batch_order(Xtr.shape[1], 100, 1)
    with pytest.raises(
        ValueError,
        match=r"X_train must have 3072 rows \(3072 = 3x32x32, the network's "
        r"input shape, flattened\), got shape \(784, 600\)",
    ):
        train_backprop(_net((3, 32, 32)), Xtr, ytr, Xte, yte, batches=batches)
    net = _net()
    with pytest.raises(
        ValueError, match=r"init_weights\[1\] must have shape \(16, 151\), got \(16, 150\)"
    ):
        train_backprop(
            net,
            Xtr,
            ytr,
            Xte,
            yte,
            batches=batches,
            init_weights=[net.W[0], net.W[1][:, 1:], *net.W[2:]],
        )
    with pytest.raises(ValueError, match="init_weights must hold 5 matrices, got 2"):
        torch_model(net, init_weights=net.W[:2])
    cfg = net.get_config()
    cfg["layers"][0] = {"kind": "conv2d", "channels": 6, "kernel": 40}
    with pytest.raises(
        ValueError,
        match="network layer .*'kernel': 40.* does not fit its input of "
        r"shape \(1, 28, 28\)",
    ):
        torch_model(cfg)
    with pytest.raises(ValueError, match="network layer must be a dict with 'kind' one of"):
        torch_model({"input_shape": [1, 28, 28], "layers": [{"kind": "maxpool2d"}]})
    with pytest.raises(ValueError, match="eval_at must hold positive batch counts"):
        train_backprop(net, Xtr, ytr, Xte, yte, batches=batches, eval_at=(0,))
