"""The Huber loss for regression as one registered class: an output loss ``L(Y, Yhat)`` of the
lifted objective (the paper's eqs. (3) and (7)), summed over the entries of ``R = Yhat - Y``:

    h(r) = r^2                      (|r| <= delta),
           2 delta |r| - delta^2    (|r| > delta),

CVXPY's ``huber(r, delta)``: squared error (``mse``, no 1/2) near 0, linear in the tails, so a
few large residuals pull the fit less. Its gradient is ``2 clip(r, -delta, delta)``, its
Hessian diagonal ``2 [|r| <= delta]`` (bounded by 2: ``column_curvature``). It is a sum over
the rows of Yhat too (``separable_rows``) but not quadratic, so the fast backend's last W-block
takes the general path (``last_w_solver`` "newton": Newton-CG on ``grad`` and ``hvp`` with the
exact line search of ``line_derivs``).
"""

import numbers

from array_api_compat import array_namespace

from ..arrays import clip
from ..losses import Loss, register_loss


@register_loss
class Huber(Loss):
    """The Huber loss ``sum_ij h(Yhat_ij - Y_ij)`` with threshold ``delta > 0`` (module doc)."""

    name = "huber"
    separable_rows = True
    tasks = ("regression",)

    def __init__(self, delta=1.0):
        if not (
            isinstance(delta, numbers.Real)
            and not isinstance(delta, bool)
            and delta > 0
            and delta < float("inf")
        ):
            raise ValueError(f"delta must be > 0 and finite, got {delta!r}")
        self.delta = float(delta)

    def params(self):
        return {"delta": self.delta}

    def elementwise(self, Y, Yhat):
        xp = array_namespace(Y, Yhat)
        a, d = xp.abs(Yhat - Y), self.delta
        return xp.where(a <= d, a * a, (2 * d) * a - d * d)

    def value(self, Y, Yhat):
        return array_namespace(Y, Yhat).sum(self.elementwise(Y, Yhat))

    def column_values(self, Y, Yhat):
        return array_namespace(Y, Yhat).sum(self.elementwise(Y, Yhat), axis=0)

    def grad(self, Y, Yhat):
        return 2 * clip(Yhat - Y, -self.delta, self.delta)

    def column_curvature(self, Y, xp):
        """The Hessian is diagonal, with entries 2 or 0."""
        return 2.0

    def hvp(self, Y, Yhat, A):
        xp = array_namespace(Y, Yhat)
        return xp.where(xp.abs(Yhat - Y) <= self.delta, 2 * A, xp.zeros_like(A))

    def torch_loss(self, out, target):
        """The same sum over the outputs (twice PyTorch's ``huber_loss``), the batch mean."""
        import torch

        h = torch.nn.functional.huber_loss(out, target, reduction="none", delta=self.delta)
        return 2 * h.sum(1).mean()

    def value_cvxpy(self, Y, Yhat):
        """``sum huber(Yhat - Y, delta)`` (CVXPY imported only here)."""
        import cvxpy as cp

        return cp.sum(cp.huber(Yhat - Y, self.delta))
