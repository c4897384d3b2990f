"""Output losses L(Y, Yhat) of the lifted objective (the paper's eqs. (3) and (7)).

Columns are data points and losses are **sums** over them, as in the paper:

- ``mse``:            L = ||Y - Yhat||_F^2
- ``cross_entropy``:  L = -tr(Y^T log softmax(Yhat)) = sum_j [(1^T y_j) lse(yhat_j) - y_j^T yhat_j]
  (softmax over each column; numerically stable through log-sum-exp).

Each loss is one class that carries every fact the solvers ask for, for any array-API
namespace: its value, per-column values and gradient in Yhat (``CORE_FACTS``); its curvature:
``column_curvature`` (a bound on each column's Hessian in Yhat, ``<= c_j I``), ``hvp`` and
``hess_diag`` (the Hessian's products and diagonal: the oracle's Newton polish), ``line_derivs``
and ``line_change`` (the fast last W-block's exact line search along a direction),
``last_w_solver`` (the fast backend's method for the last W-block: ``"ridge"``, MSE's closed
form; ``"pncg"``; ``"newton"``, the general path), ``may_lack_minimiser`` (cross-entropy: the
oracle checks the last W-block for a minimiser) and ``separable_rows`` (a sum over the rows of
Yhat as well: the last W-block separates by rows, with ``elementwise`` terms); its targets:
``check_targets``, ``check_labels``, ``targets_from``, ``tasks`` (classification, regression),
``probabilities`` (a classifier's output, or None); its PyTorch counterpart ``torch_loss`` (the
baselines) and its ``params`` (save / load). Its CVXPY form, for the oracle, is
``fenchel_cvx.oracle.atoms.loss_cvx(loss, Y, Yhat)`` (registered there by type, or the class's
own ``value_cvxpy``). The one table keyed by names is the registry ``LOSSES`` (``register_loss``;
``loss("mse")`` looks one up); ``fenchel_cvx.extensions`` adds the Huber loss.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING, Any

from array_api_compat import array_namespace, device

from .arrays import Array, clip, host_if_cheap
from .facts import Named, Registry, require, stub

if TYPE_CHECKING:
    import torch

#: the facts every solver needs, checked where a network is built (``loss``)
CORE_FACTS = ("value", "grad", "column_curvature", "hvp")


def softmax(A: Array) -> Array:
    """Column-wise softmax."""
    xp = array_namespace(A)
    E = xp.exp(A - xp.max(A, axis=0, keepdims=True))
    return E / xp.sum(E, axis=0, keepdims=True)


#: the fast backend's methods for a loss's last W-block (``Loss.last_w_solver``)
LAST_W_SOLVERS = ("newton", "pncg", "ridge")


class Loss(Named):
    """An output loss ``L(Y, Yhat)``, summed over the columns (data points) of Yhat."""

    name = kind = "loss"
    separable_rows = False  # a sum over the rows of Yhat too: the last W-block splits by rows
    #: whether the last W-block without rho, gamma may have no minimiser (the loss decreases
    #: forever along a direction: cross-entropy on separable data); the oracle then checks it
    #: before a solve (``oracle.wellposed.recession_score``, registered by the loss's type)
    may_lack_minimiser = False
    tasks: tuple[str, ...] = ("regression",)  # what the estimators may use it for
    #: the fast backend's method for the last W-block: "newton" (the general path, Newton-CG
    #: on ``grad`` and ``hvp``), "pncg" (nonlinear CG), "ridge" (a quadratic loss: the block is
    #: a ridge regression, solved in closed form); a class naming another is refused
    #: where it is defined (``LAST_W_SOLVERS``)
    last_w_solver = "newton"
    #: a method: the class probabilities of outputs Yhat, or None
    probabilities: Callable[..., Any] | None = None
    #: a separable loss's terms, a method ``(Y, Yhat) -> array``, or None
    elementwise: Callable[..., Any] | None = None
    #: a method: the PyTorch loss of outputs and targets (rows: samples), or None
    torch_loss: Callable[..., Any] | None = None
    value = stub("value")
    grad = stub("grad")
    column_curvature = stub("column_curvature")
    hvp = stub("hvp")

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        if cls.last_w_solver not in LAST_W_SOLVERS:
            raise ValueError(
                f"{cls.__name__}.last_w_solver must be one of {LAST_W_SOLVERS}, "
                f"got {cls.last_w_solver!r}"
            )

    def hess_diag(self, Y: Array, Yhat: Array) -> Array:
        """The diagonal of the Hessian in Yhat, per entry (from ``hvp``: a separable loss's
        Hessian is diagonal; others give their own)."""
        xp = array_namespace(Y, Yhat)
        return self.hvp(Y, Yhat, xp.ones_like(Yhat))

    def line_derivs(self, Y: Array, U: Array, dU: Array) -> tuple[Array, Array]:
        """The first and second derivatives, as 0-d arrays, of ``t -> L(Y, U + t dU)`` at 0."""
        xp = array_namespace(Y, U)
        return xp.sum(self.grad(Y, U) * dU), xp.sum(dU * self.hvp(Y, U, dU))

    def line_change(self, Y: Array, U: Array, dU: Array) -> tuple[Array, Array]:
        """``(change, size)``, 0-d arrays: ``L(Y, U + dU) - L(Y, U)`` and the size of the terms
        it subtracts (its rounding scale)."""
        xp = array_namespace(Y, U)
        base = self.value(Y, U)
        return self.value(Y, U + dU) - base, xp.abs(base)

    def piece_values(self, Y: Array, Yhat: Array, axis: int | None) -> Array:
        """The loss summed along ``axis`` (kept as a 1 x m or k x 1 array), or all of it
        (``axis`` None): the oracle's Newton polish compares pieces. Rows (``axis`` 1) need a
        loss with ``elementwise`` terms."""
        xp = array_namespace(Y, Yhat)
        if axis is None:
            return self.value(Y, Yhat)
        if axis == 0:
            return xp.reshape(self.column_values(Y, Yhat), (1, -1))
        return xp.sum(
            require(self, ("elementwise",), "a loss split by rows").elementwise(Y, Yhat),
            axis=1,
            keepdims=True,
        )

    def check_labels(self, name: str, Y: Array, w_block: bool = False) -> None:
        """Raise ``ValueError`` (naming ``name``) where Y are not weights this loss's formulas
        take (the oracle's check of a block's labels; ``w_block``: the last W-block's)."""

    def targets_from(self, outputs: Array, noise: Array) -> Array:
        """Targets of this loss from a teacher network's ``outputs``, with ``noise`` added where
        the targets are real numbers (the theorem checks' data)."""
        return outputs + noise

    def column_values(self, Y: Array, Yhat: Array) -> Array:
        """The loss of each column (data point); they sum to ``value``."""
        xp = array_namespace(Y, Yhat)
        return xp.stack(
            [self.value(Y[:, j : j + 1], Yhat[:, j : j + 1]) for j in range(Y.shape[1])]
        )

    def curvature(self, Y: Array, xp: ModuleType) -> float | Array:
        """A bound on the Hessian of the loss in Yhat over all columns: a float, or a 0-d array
        on the device where reads are not cheap (``arrays.host_if_cheap``)."""
        c = self.column_curvature(Y, xp)
        return c if isinstance(c, float) else host_if_cheap(xp, xp.max(c))

    def check_targets(self, name: str, Y: Array, xp: ModuleType) -> None:
        """Raise ``ValueError`` (naming ``name``) if ``Y`` are not targets of this loss."""


class MSE(Loss):
    """Squared error ||Y - Yhat||_F^2 (summed, no 1/2)."""

    name = "mse"
    separable_rows = True
    last_w_solver = "ridge"
    tasks = ("classification", "regression")

    def value(self, Y: Array, Yhat: Array) -> Array:
        xp = array_namespace(Y, Yhat)
        R = Yhat - Y
        return xp.sum(R * R)

    def elementwise(self, Y: Array, Yhat: Array) -> Array:
        R = Yhat - Y
        return R * R

    def hvp(self, Y: Array, Yhat: Array, A: Array) -> Array:
        """The Hessian is 2 I."""
        return 2.0 * A

    def torch_loss(self, out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """Squared error summed over the outputs, the mean over the batch."""
        return ((out - target) ** 2).sum(1).mean()

    def column_values(self, Y: Array, Yhat: Array) -> Array:
        xp = array_namespace(Y, Yhat)
        R = Yhat - Y
        return xp.sum(R * R, axis=0)

    def column_curvature(self, Y: Array, xp: ModuleType) -> float:
        """The Hessian is 2 I."""
        return 2.0

    def grad(self, Y: Array, Yhat: Array) -> Array:
        return 2 * (Yhat - Y)


class CrossEntropy(Loss):
    """Softmax cross-entropy -tr(Y^T log softmax(Yhat)); Y's columns are (soft) one-hot labels."""

    name = "cross_entropy"
    tasks = ("classification",)
    may_lack_minimiser = True  # on linearly separable X_L
    last_w_solver = "pncg"

    def value(self, Y: Array, Yhat: Array) -> Array:
        xp = array_namespace(Y, Yhat)
        return xp.sum(self.column_values(Y, Yhat))

    def column_values(self, Y: Array, Yhat: Array) -> Array:
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

    def column_curvature(self, Y: Array, xp: ModuleType) -> Array:
        """``(1^T y_j) / 2`` per column (1 x m): the softmax Hessian is ``<= I / 2``."""
        return 0.5 * xp.sum(Y, axis=0, keepdims=True)

    def grad(self, Y: Array, Yhat: Array) -> Array:
        xp = array_namespace(Y, Yhat)
        return softmax(Yhat) * xp.sum(Y, axis=0, keepdims=True) - Y

    def probabilities(self, Yhat: Array) -> Array:
        """The softmax of the logits, per column."""
        return softmax(Yhat)

    def hvp(self, Y: Array, Yhat: Array, A: Array) -> Array:
        """``s_j (diag p_j - p_j p_j^T) a_j`` per column, ``p = softmax(Yhat)``, ``s = 1^T Y``."""
        xp = array_namespace(Y, Yhat)
        P = softmax(Yhat)
        PA = P * A
        return xp.sum(Y, axis=0, keepdims=True) * (PA - P * xp.sum(PA, axis=0, keepdims=True))

    def hess_diag(self, Y: Array, Yhat: Array) -> Array:
        xp = array_namespace(Y, Yhat)
        P = softmax(Yhat)
        return xp.sum(Y, axis=0, keepdims=True) * P * (1.0 - P)

    @staticmethod
    def _lse(U: Array) -> Array:
        xp = array_namespace(U)
        a = xp.max(U, axis=0, keepdims=True)
        return a + xp.log(xp.sum(xp.exp(U - a), axis=0, keepdims=True))

    def line_derivs(self, Y: Array, U: Array, dU: Array) -> tuple[Array, Array]:
        xp = array_namespace(Y, U)
        s = xp.sum(Y, axis=0, keepdims=True)
        P = xp.exp(U - self._lse(U))
        d1 = xp.sum((P * s - Y) * dU)
        m1 = xp.sum(P * dU, axis=0, keepdims=True)
        return d1, xp.sum(s * (xp.sum(P * dU * dU, axis=0, keepdims=True) - m1 * m1))

    def line_change(self, Y: Array, U: Array, dU: Array) -> tuple[Array, Array]:
        """``(change, size)``. Per column, ``s_j [lse(u + du) - lse(u)] - y^T du = s_j log1p(
        sum_k p_k expm1(du_k - c))`` with ``p = softmax(u)`` (summing to 1) and ``c = y^T du /
        s_j``: no two sums of the logits' size are subtracted, so the descent safeguard sees a
        rise of 1e-4 on a loss of 0.5 in float32 (the direct form's rounding was 1e-3 there). A
        column whose change is not small (``sum_k p_k expm1(...)`` outside (-1/2, 1), or not
        finite: a large step overflows expm1) takes the direct form, whose rounding is then
        small beside it."""
        xp = array_namespace(Y, U)
        s, base = xp.sum(Y, axis=0, keepdims=True), self._lse(U)
        c = xp.sum(Y * dU, axis=0, keepdims=True) / xp.where(s > 0, s, xp.ones_like(s))
        arg, top = dU - c, math.log(float(xp.finfo(U.dtype).max)) - 1  # expm1(top) is finite
        E = xp.exp(U - base) * xp.expm1(clip(arg, None, top))
        inner = xp.sum(E, axis=0, keepdims=True)
        small = (inner > -0.5) & (inner < 1.0) & ~xp.any(arg > top, axis=0, keepdims=True)
        direct = s * (self._lse(U + dU) - base) - s * c
        col = xp.where(small, s * xp.log1p(xp.where(small, inner, xp.zeros_like(inner))), direct)
        size = xp.where(small, s * xp.sum(xp.abs(E), axis=0, keepdims=True), s * xp.abs(base))
        return xp.sum(col), xp.sum(size)

    def check_labels(self, name: str, Y: Array, w_block: bool = False) -> None:
        """Label weights >= 0 (columns without mass drop out); the W-block needs some mass."""
        xp = array_namespace(Y)
        if bool(xp.any(Y < 0)):
            raise ValueError(
                f"{name} must be >= 0 for cross_entropy (label weights), got "
                f"{float(xp.reshape(Y[Y < 0], (-1,))[0])!r}"
            )
        if w_block and not bool(xp.any(Y != 0)):
            raise ValueError(
                f"{name} must hold some label mass for the cross_entropy W-block, got all zeros"
            )

    def targets_from(self, outputs: Array, noise: Array) -> Array:
        """One-hot labels of the teacher's largest output (noise unused)."""
        xp = array_namespace(outputs)
        k = outputs.shape[0]
        top = xp.argmax(outputs, axis=0)
        return xp.astype(
            xp.arange(k, device=device(outputs))[:, None] == top[None, :], outputs.dtype
        )

    def torch_loss(self, out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """Softmax cross-entropy on the logits against probability targets, the batch mean."""
        import torch

        return torch.nn.functional.cross_entropy(out, target)

    def check_targets(self, name: str, Y: Array, xp: ModuleType) -> None:
        """Each column of Y a probability vector: entries >= 0 summing to 1."""
        tol = 1e3 * xp.finfo(Y.dtype).eps * Y.shape[0]
        if not bool(xp.all(Y >= 0)) or not bool(xp.all(xp.abs(xp.sum(Y, axis=0) - 1) <= tol)):
            raise ValueError(
                f"{name} must hold one probability vector per column for the "
                "cross_entropy loss (entries >= 0, each column summing to 1), "
                f"got entries in [{float(xp.min(Y)):g}, {float(xp.max(Y)):g}]"
            )


#: the registry: name -> loss class (the one table keyed by loss names)
LOSSES = Registry("loss", Loss, CORE_FACTS)
#: class decorator: add a loss class under its ``name`` (``facts.Registry.register``)
register_loss = LOSSES.register


register_loss(MSE)
register_loss(CrossEntropy)


def loss_names(task: str | None = None) -> list[str]:
    """The registered names, sorted; ``task``: only the losses for it ("classification",
    "regression")."""
    return sorted(n for n, c in LOSSES.items() if task is None or task in c.tasks)


def loss(name: str | Loss, **params: object) -> Loss:
    """The loss registered under ``name`` built with ``params``; a ``Loss`` is passed through.
    Either way it carries the ``CORE_FACTS`` (a ``ValueError`` naming the class and the fact it
    lacks)."""
    return LOSSES.build(name, params)


from . import extensions  # noqa: E402,F401  (its modules register their classes)
