"""Output losses L(Y, Yhat) of the lifted objective (the paper's eq. (2) and (5)).

Columns are data points and losses are **sums** over them, as in the paper:

- ``mse``:            L = ||Y - Yhat||_F^2
- ``cross_entropy``:  L = -tr(Y^T log softmax(Yhat)) = sum_j [ (1^T y_j) lse(yhat_j) - y_j^T yhat_j ]
  (softmax over each column; numerically stable through log-sum-exp).

Each loss gives its value and gradient in Yhat for any array-API namespace. Its CVXPY form,
for the oracle, is ``fenchel_cvx.oracle.atoms.loss_cvx(loss, Y, Yhat)``.
"""
from array_api_compat import array_namespace


def _logsumexp(xp, A):
    """Column-wise log-sum-exp of A (rows are classes)."""
    a = xp.max(A, axis=0, keepdims=True)
    return xp.squeeze(a, axis=0) + xp.log(xp.sum(xp.exp(A - a), axis=0))


def softmax(A):
    """Column-wise softmax."""
    xp = array_namespace(A)
    E = xp.exp(A - xp.max(A, axis=0, keepdims=True))
    return E / xp.sum(E, axis=0, keepdims=True)


class Loss:
    name = "loss"

    def __repr__(self):
        return f"loss({self.name!r})"

    def check_targets(self, name, Y, xp):
        """Raise ``ValueError`` (naming ``name``) if ``Y`` are not targets of this loss."""


class MSE(Loss):
    """Squared error ||Y - Yhat||_F^2 (summed, no 1/2)."""

    name = "mse"

    def value(self, Y, Yhat):
        xp = array_namespace(Y, Yhat)
        R = Yhat - Y
        return xp.sum(R * R)

    def grad(self, Y, Yhat):
        return 2 * (Yhat - Y)


class CrossEntropy(Loss):
    """Softmax cross-entropy -tr(Y^T log softmax(Yhat)); Y's columns are (soft) one-hot labels."""

    name = "cross_entropy"

    def value(self, Y, Yhat):
        xp = array_namespace(Y, Yhat)
        return xp.sum(xp.sum(Y, axis=0) * _logsumexp(xp, Yhat)) - xp.sum(Y * Yhat)

    def grad(self, Y, Yhat):
        xp = array_namespace(Y, Yhat)
        return softmax(Yhat) * xp.sum(Y, axis=0, keepdims=True) - Y

    def check_targets(self, name, Y, xp):
        """Each column of Y a probability vector: entries >= 0 summing to 1."""
        tol = 1e3 * xp.finfo(Y.dtype).eps * Y.shape[0]
        if not bool(xp.all(Y >= 0)) or not bool(xp.all(xp.abs(xp.sum(Y, axis=0) - 1) <= tol)):
            raise ValueError(f"{name} must hold one probability vector per column for the "
                             "cross_entropy loss (entries >= 0, each column summing to 1), "
                             f"got entries in [{float(xp.min(Y)):g}, {float(xp.max(Y)):g}]")


LOSSES = {"mse": MSE, "cross_entropy": CrossEntropy}


def loss(name):
    """The loss registered under ``name`` (a ``Loss`` is passed through)."""
    if isinstance(name, Loss):
        return name
    if name not in LOSSES:
        raise ValueError(f"loss must be one of {sorted(LOSSES)}, got {name!r}")
    return LOSSES[name]()
