"""The neural network of the paper's Figure 1: the same ReLU network and MSE loss (on one-hot
targets, summed over the classes, mean over the batch) trained by backprop with SGD, lr 1e-2
(the paper's Appendix), from the same Xavier weights. One record per epoch.

It runs ``fenchel_cvx.baselines.backprop.train_backprop`` (PyTorch, CPU, float32) on the batches
of ``datasets.batch_order(m, batch_size, epochs, seed)``; the paper does not give the batch size.
"""

import numpy as np

from ...arrays import Array
from ...datasets import batch_order
from ...network import LiftedNetwork
from ...validation import COUNT, WEIGHT
from .common import LiftedMethod, Record, register


def _numpy(A: Array) -> np.ndarray:
    return A.get() if hasattr(A, "get") else np.asarray(A)  # CuPy -> NumPy


@register
class SGD(LiftedMethod):
    name = "sgd"
    defaults = dict(lr=1e-2, batch_size=100, threads=None)
    constraints = dict(lr=WEIGHT, batch_size=COUNT, threads=[COUNT, None])
    # the hyperparameters (set from ``defaults`` and the arguments by ``LiftedMethod``)
    lr: float
    batch_size: int
    threads: int | None

    def run(
        self,
        net: LiftedNetwork,
        X: Array,
        Y: Array,
        iterations: int,
        record: Record,
        test: tuple[Array, Array] | None = None,
    ) -> None:
        """As :meth:`LiftedMethod.run`; ``test`` is required (backprop scores the test set)."""
        from ..backprop import train_backprop

        if test is None:
            raise ValueError("sgd scores the test set itself: pass test=(X_test, Y_test)")

        X, Y = _numpy(X), _numpy(Y)
        X_test, y_test = _numpy(test[0]), np.argmax(_numpy(test[1]), axis=0)
        y = np.argmax(Y, axis=0)
        batches = batch_order(X.shape[1], self.batch_size, iterations, seed=net.seed)
        last = [0.0]

        def callback(epoch, res):
            dt = res.seconds[-1] - last[0]
            last[0] = res.seconds[-1]
            # train_backprop scores the feed-forward network on the test set itself
            record(epoch, dt, res.train_loss[-1] * X.shape[1], accuracy=res.test_accuracy[-1])

        res = train_backprop(
            net.layer_sizes,
            X,
            y,
            X_test,
            y_test,
            batches=batches,
            optimizer="sgd",
            lr=self.lr,
            seed=net.seed,
            threads=self.threads,
            callback=callback,
            loss="mse",
            init_weights=[_numpy(W) for W in net.W],
        )
        assert res.weights is not None  # train_backprop sets them before it returns
        net.W = [W.astype(net.W[0].dtype) for W in res.weights]
