"""Output losses L(Y, Yhat) of the lifted objective (the paper's eq. (2) and (5)).

Columns are data points and losses are **sums** over them, as in the paper:

- ``mse``:            L = ||Y - Yhat||_F^2
- ``cross_entropy``:  L = -tr(Y^T log softmax(Yhat)) = sum_j [ (1^T y_j) lse(yhat_j) - y_j^T yhat_j ]
  (softmax over each column; numerically stable through log-sum-exp).

Each loss gives its value, its per-column values and its gradient in Yhat for any array-API
namespace, and what the solvers need to know of its curvature: ``column_curvature`` (a bound on
each column's Hessian in Yhat, ``<= c_j I``), ``quadratic`` (MSE: the last W-block is a ridge
regression) and ``separable_rows`` (the loss is a sum over rows of Yhat as well, so the last
W-block separates by rows). A new loss is one class here with these members. Its CVXPY form,
for the oracle, is ``fenchel_cvx.oracle.atoms.loss_cvx(loss, Y, Yhat)``.
"""
from array_api_compat import array_namespace

from .arrays import host_if_cheap


def softmax(A):
    """Column-wise softmax."""
    xp = array_namespace(A)
    E = xp.exp(A - xp.max(A, axis=0, keepdims=True))
    return E / xp.sum(E, axis=0, keepdims=True)


class Loss:
    name = "loss"
    quadratic = False        # a quadratic loss: the last W-block is a ridge regression
    separable_rows = False   # a sum over the rows of Yhat too: the last W-block splits by rows

    def __repr__(self):
        return f"loss({self.name!r})"

    def column_values(self, Y, Yhat):
        """The loss of each column (data point); they sum to ``value``."""
        xp = array_namespace(Y, Yhat)
        return xp.stack([self.value(Y[:, j:j + 1], Yhat[:, j:j + 1]) for j in range(Y.shape[1])])

    def curvature(self, Y, xp):
        """A bound on the Hessian of the loss in Yhat over all columns: a float, or a 0-d array
        on the device where reads are not cheap (``arrays.host_if_cheap``)."""
        c = self.column_curvature(Y, xp)
        return c if isinstance(c, float) else host_if_cheap(xp, xp.max(c))

    def check_targets(self, name, Y, xp):
        """Raise ``ValueError`` (naming ``name``) if ``Y`` are not targets of this loss."""


class MSE(Loss):
    """Squared error ||Y - Yhat||_F^2 (summed, no 1/2)."""

    name = "mse"
    quadratic = separable_rows = True

    def value(self, Y, Yhat):
        xp = array_namespace(Y, Yhat)
        R = Yhat - Y
        return xp.sum(R * R)

    def column_values(self, Y, Yhat):
        xp = array_namespace(Y, Yhat)
        R = Yhat - Y
        return xp.sum(R * R, axis=0)

    def column_curvature(self, Y, xp):
        """The Hessian is 2 I."""
        return 2.0

    def grad(self, Y, Yhat):
        return 2 * (Yhat - Y)


class CrossEntropy(Loss):
    """Softmax cross-entropy -tr(Y^T log softmax(Yhat)); Y's columns are (soft) one-hot labels."""

    name = "cross_entropy"

    def value(self, Y, Yhat):
        xp = array_namespace(Y, Yhat)
        return xp.sum(self.column_values(Y, Yhat))

    def column_values(self, Y, Yhat):
        """``-y_j^T log softmax(u_j)`` per column, as ``y_j^T (a_j - u_j) + (1^T y_j) log1p(r_j)``
        with ``a_j = max_k u_kj`` and ``r_j = sum_k exp(u_kj - a_j) - 1`` summed without its
        leading 1 (the other maxima count 1 each): two terms >= 0, each to a few eps of itself.
        (The textbook ``(1^T y) lse(u) - y^T u``, summed over a batch, subtracts two sums of the
        logits' size: in float32, with logits near 25 on 500 points, its rounding was 1e-3 on a
        loss of 0.5, far above the certificate's tolerance.)"""
        xp = array_namespace(Y, Yhat)
        a = xp.max(Yhat, axis=0, keepdims=True)
        top = Yhat == a
        rest = xp.sum(xp.where(top, xp.zeros_like(Yhat), xp.exp(Yhat - a)), axis=0)
        ties = xp.astype(xp.sum(xp.astype(top, xp.int32), axis=0) - 1, Yhat.dtype)
        return xp.sum(Y * (a - Yhat), axis=0) + xp.sum(Y, axis=0) * xp.log1p(rest + ties)

    def column_curvature(self, Y, xp):
        """``(1^T y_j) / 2`` per column (1 x m): the softmax Hessian is ``<= I / 2``."""
        return 0.5 * xp.sum(Y, axis=0, keepdims=True)

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
