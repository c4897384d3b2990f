"""Tests of the backprop baselines (PyTorch SGD / Adam) on scikit-learn's digits."""

import sys

import numpy as np
import pytest

import registry_params
from fenchel_cvx.baselines import BASELINES, BackpropResult, train_backprop
from fenchel_cvx.datasets import batch_order, load_digits

pytest.importorskip("torch", reason="the backprop baselines need PyTorch (fenchel_cvx[bench])")

SIZES = (64, 32, 10)
# One thread: this net is tiny, and OpenMP threads on a busy machine can be 100x slower.
THREADS = 1


@pytest.fixture(scope="module")
def digits():
    return load_digits()


def _run(d, epochs=10, batch_size=32, seed=0, **kwargs):
    kwargs.setdefault("threads", THREADS)
    batches = kwargs.pop("batches", None) or batch_order(
        d.X_train.shape[1], batch_size, epochs, seed=seed
    )
    return train_backprop(
        SIZES, d.X_train, d.y_train, d.X_test, d.y_test, batches=batches, seed=seed, **kwargs
    )


def _accuracy(weights, X, y):
    """Forward pass in the package's convention (bias = last column), ReLU between layers."""
    for l, W in enumerate(weights):
        X = W[:, :-1] @ X + W[:, -1:]
        if l < len(weights) - 1:
            X = np.maximum(X, 0)
    return np.mean(X.argmax(axis=0) == y)


def test_adam_learns_digits_quickly(digits):
    r = _run(digits, epochs=15, optimizer="adam")
    assert isinstance(r, BackpropResult) and r.optimizer == "adam" and r.lr == 1e-3
    assert r.test_accuracy[-1] > 0.9
    assert r.train_loss[-1] < r.initial_train_loss
    assert len(r.test_accuracy) == len(r.train_loss) == len(r.seconds) == 15
    # the training time is recorded, once per epoch (its speed lives in the benchmarks)
    assert all(isinstance(s, float) and np.isfinite(s) for s in r.seconds)
    assert [W.shape for W in r.weights] == [(32, 65), (10, 33)]
    assert abs(_accuracy(r.weights, digits.X_test, digits.y_test) - r.test_accuracy[-1]) <= 2 / 450


def test_sgd_improves(digits):
    r = BASELINES["sgd"](
        SIZES,
        digits.X_train,
        digits.y_train,
        digits.X_test,
        digits.y_test,
        batches=batch_order(digits.X_train.shape[1], 32, 10, seed=0),
        threads=THREADS,
    )
    assert r.optimizer == "sgd" and r.lr == 1e-2
    assert r.test_accuracy[-1] > r.initial_test_accuracy + 0.2
    assert r.train_loss[-1] < r.initial_train_loss


def test_sgd_momentum_takes_heavy_ball_steps(digits):
    """Two steps on one batch with momentum mu: w1 = w0 - lr g0, w2 = w1 - lr (mu g0 + g1), the
    gradients of the mean cross-entropy computed here from the same initial weights."""
    import torch

    from fenchel_cvx.baselines import torch_model

    idx, lr, mu = np.arange(40), 0.05, 0.9
    r = _run(digits, optimizer="sgd", lr=lr, momentum=mu, batches=[[idx], [idx]])
    assert r.momentum == mu and r.lr == lr
    model, _, _ = torch_model(SIZES, seed=0)
    X = torch.from_numpy(np.ascontiguousarray(digits.X_train[:, idx].T, dtype=np.float32))
    y = torch.as_tensor(digits.y_train[idx], dtype=torch.long)
    params = list(model.parameters())

    def gradient():
        for q in params:
            q.grad = None
        torch.nn.functional.cross_entropy(model(X), y).backward()
        return [q.grad.clone() for q in params]

    g0 = gradient()
    with torch.no_grad():
        for q, g in zip(params, g0):
            q -= lr * g
    g1 = gradient()
    with torch.no_grad():
        for q, a, b in zip(params, g0, g1):
            q -= lr * (mu * a + b)
    want = [
        np.hstack([m.weight.detach().double().numpy(), m.bias.detach().double().numpy()[:, None]])
        for m in model.weighted
    ]
    assert all(np.allclose(W, V, atol=1e-6) for W, V in zip(r.weights, want))
    plain = _run(digits, optimizer="sgd", lr=lr, batches=[[idx], [idx]])
    assert plain.momentum == 0.0 and not np.allclose(plain.weights[0], r.weights[0], atol=1e-6)


def test_same_seed_same_run_and_threads_restored(digits):
    import torch

    original = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        a, b = _run(digits, epochs=3), _run(digits, epochs=3)  # each with threads=1
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(original)
    assert a.test_accuracy == b.test_accuracy and a.train_loss == b.train_loss
    assert all(np.array_equal(Wa, Wb) for Wa, Wb in zip(a.weights, b.weights))
    c = _run(digits, epochs=3, seed=1)
    assert not np.array_equal(a.weights[0], c.weights[0])


def test_every_batch_evaluation_and_callback(digits):
    seen = []
    r = _run(
        digits,
        epochs=2,
        batch_size=100,
        eval_every=1,
        callback=lambda epoch, res: seen.append((epoch, len(res.test_accuracy))),
    )
    assert seen == [(1, 1), (2, 2)]
    assert len(r.checkpoints) == 2 * 14  # ceil(1347 / 100) batches per epoch
    assert [c[0] for c in r.checkpoints] == list(range(1, 29))
    assert r.checkpoints[-1][2] == r.test_accuracy[-1]
    assert r.checkpoints[-1][1] == r.seconds[-1]
    assert all(a[1] <= b[1] for a, b in zip(r.checkpoints, r.checkpoints[1:]))
    assert _run(digits, epochs=1).checkpoints is None


# every registered activation with a PyTorch module (``torch_module``), which backprop trains
@pytest.mark.parametrize(
    "activation", registry_params.activations(registry_params.has_torch_module)
)
def test_activations_train(digits, activation):
    r = _run(digits, epochs=2, activation=activation, lr=1e-2)
    assert np.isfinite(r.train_loss).all() and r.train_loss[-1] < r.initial_train_loss


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(optimizer="rmsprop"), "optimizer must be one of \\['sgd', 'adam'\\], got 'rmsprop'"),
        (dict(activation="gelu"), "activation must be one of .*got 'gelu'"),
        (dict(lr=-1.0), "lr must be > 0 and finite or None, got -1.0"),
        (dict(activation="leaky_relu", slope=2.0), "slope must be a number in \\(0, 1\\), got 2.0"),
        (dict(threads=0), "threads must be an integer >= 1 or None, got 0"),
        (dict(optimizer="sgd", momentum=1.0), "momentum must be a number in \\[0, 1\\), got 1.0"),
        (dict(optimizer="sgd", momentum=-0.1), "momentum must be a number in \\[0, 1\\), got -0.1"),
        (
            dict(optimizer="adam", momentum=0.9),
            "momentum applies to optimizer in \\('sgd',\\), got momentum=0.9 with optimizer='adam'",
        ),
        (dict(device="tpu"), "device must be one of \\['cpu', 'cuda'\\], got 'tpu'"),
        (dict(layer_sizes=(63, 10)), "X_train must have 63 rows \\(layer_sizes\\[0\\]=63\\)"),
        (dict(layer_sizes=(64, 5)), "y_train must hold labels in 0..4 \\(layer_sizes\\[-1\\]\\)"),
        (dict(layer_sizes=(64,)), "layer_sizes must be a sequence of at least 2 positive integers"),
        (dict(batches=[]), "batches must be a non-empty list of epochs"),
        (
            dict(batches=[[np.array([0, 5000])]]),
            "batches\\[0\\] must hold non-empty integer index arrays",
        ),
    ],
)
def test_bad_arguments_are_named(digits, kwargs, message):
    args = dict(layer_sizes=SIZES, batches=batch_order(digits.X_train.shape[1], 32, 1, 0))
    args.update(kwargs)
    with pytest.raises(ValueError, match=message):
        train_backprop(
            args.pop("layer_sizes"),
            digits.X_train,
            digits.y_train,
            digits.X_test,
            digits.y_test,
            **args,
        )


def test_cuda_without_a_gpu_is_refused_before_any_work(digits):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: tests/test_gpu.py trains there")
    with pytest.raises(ValueError, match="device='cuda' needs a CUDA build of PyTorch and a GPU"):
        train_backprop(
            SIZES,
            digits.X_train,
            digits.y_train,
            digits.X_test,
            digits.y_test,
            batches=[[np.arange(5)]],
            device="cuda",
            callback=pytest.fail,
        )


def test_missing_torch_says_how_to_install(digits, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)
    with pytest.raises(ImportError, match='pip install "fenchel_cvx\\[bench\\]"'):
        _run(digits, epochs=1)
