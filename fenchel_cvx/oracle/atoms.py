"""The CVXPY forms of the activations' Theorem-1 pairs and of the losses, for the oracle.

Theorem 1 of the paper writes a layer's constraint ``v = phi(u)`` as ``B_phi(v, u) <= 0`` with
the biconvex divergence ``B_phi(v, u) = F(v) + F*(u) - u v`` (eq. (4)); the lifted objective
(eq. (7)) adds ``lam_l B_l`` and the output loss ``L(Y, W_L X~_L)``. This module gives each as a
DCP expression, so that the array-level math of ``activations.py`` and ``losses.py`` needs no
CVXPY (importing ``fenchel_cvx`` or ``fenchel_cvx.fast`` does not load it).

The forms dispatch on the type of the activation or loss (``functools.singledispatch``): the
built-in classes are registered here. A class registered nowhere here gives its own forms as
methods that import CVXPY themselves, so that its file is the only one it needs
(``fenchel_cvx.extensions``): an activation ``F_cvxpy(v)`` (elementwise) and ``Fstar_cvxpy(u)``
(``(sum F*(u), constraints)``: an epigraph where no atom writes F*), a loss
``value_cvxpy(Y, Yhat)``. A type with neither (``monotone(phi)``, defined by quadrature) raises
``NotImplementedError``; ``require_forms`` refuses it before any solve.
"""

import math
from collections.abc import Iterable
from functools import singledispatch
from typing import Any, TypeVar

import cvxpy as cp
import numpy as np

from ..activations import Activation, LeakyReLU, ReLU, Sigmoid, Tanh
from ..facts import has_fact, require
from ..losses import MSE, CrossEntropy, Loss

_T = TypeVar("_T")

__all__ = [
    "F_cvx",
    "Fstar_cvx",
    "Fstar_sum_cvx",
    "divergence_cvx",
    "loss_cvx",
    "has_forms",
    "require_forms",
    "ACTIVATION_FORMS",
    "LOSS_FORMS",
]


def _no_form(obj, fact):
    return NotImplementedError(
        f"{obj!r} has no closed form for CVXPY ({type(obj).__name__} "
        f"lacks the fact {fact!r}); it is NumPy only"
    )


def _lacking(obj: Any, forms: Iterable[tuple[Any, str]]) -> list[str]:
    """The facts standing in for the ``forms`` that ``obj`` (an activation or a loss, or its
    class) has neither registered here nor of its own."""
    cls = obj if isinstance(obj, type) else type(obj)
    return [
        fact
        for generic, fact in forms
        if generic.dispatch(cls) is generic.dispatch(object) and not has_fact(obj, fact)
    ]


def has_forms(cls: type) -> bool:
    """Whether the oracle has the CVXPY forms of the activation or loss class ``cls`` (forms
    registered here, or its own ``F_cvxpy`` / ``Fstar_cvxpy``, ``value_cvxpy``): the oracle can
    solve its blocks.

    >>> from fenchel_cvx.activations import ACTIVATIONS
    >>> has_forms(ACTIVATIONS["relu"]), has_forms(ACTIVATIONS["monotone"])
    (True, False)
    """
    return not _lacking(cls, LOSS_FORMS if issubclass(cls, Loss) else ACTIVATION_FORMS)


def require_forms(obj: _T, forms: Iterable[tuple[Any, str]]) -> _T:
    """``obj``, or a ``ValueError`` naming its class and the fact where it has neither a form
    registered here nor its own: ``forms`` pairs a generic form with the fact that stands in
    for it (``ACTIVATION_FORMS``, ``LOSS_FORMS``)."""
    return require(obj, _lacking(obj, forms), "the CVXPY oracle")


# --- F (the integral of phi^{-1}) and F* (the integral of phi), elementwise ------------------
@singledispatch
def F_cvx(act: Activation, v: cp.Expression) -> cp.Expression:
    """Elementwise ``F(v)`` of ``act`` as a CVXPY expression (convex in ``v``); the class's own
    ``F_cvxpy`` where none is registered here."""
    own = getattr(act, "F_cvxpy", None)  # an optional fact
    if own is not None:
        return own(v)
    raise _no_form(act, "F_cvxpy")


@singledispatch
def Fstar_cvx(act: Activation, u: cp.Expression) -> cp.Expression:
    """Elementwise ``F*(u)`` of ``act`` as a CVXPY expression (convex in ``u``)."""
    raise _no_form(act, "Fstar_cvxpy")


@singledispatch
def Fstar_sum_cvx(act: Activation, u: cp.Expression) -> tuple[cp.Expression, list[Any]]:
    """``(sum F*(u), constraints)``: the elementwise form summed, or the class's own
    ``Fstar_cvxpy`` (an epigraph with its constraints) where no elementwise one is registered."""
    own = getattr(act, "Fstar_cvxpy", None)  # an optional fact
    if Fstar_cvx.dispatch(type(act)) is Fstar_cvx.dispatch(object) and own is not None:
        return own(u)
    return cp.sum(Fstar_cvx(act, u)), []


@F_cvx.register
def _(act: ReLU, v):
    return 0.5 * cp.square(v)


@Fstar_cvx.register
def _(act: ReLU, u):
    return 0.5 * cp.square(cp.pos(u))


@F_cvx.register
def _(act: LeakyReLU, v):
    return 0.5 * cp.square(cp.pos(v)) + cp.square(cp.neg(v)) / (2 * act.slope)


@Fstar_cvx.register
def _(act: LeakyReLU, u):
    return 0.5 * cp.square(cp.pos(u)) + 0.5 * act.slope * cp.square(cp.neg(u))


@F_cvx.register
def _(act: Sigmoid, v):
    return -cp.entr(v) - cp.entr(1 - v)


@Fstar_cvx.register
def _(act: Sigmoid, u):
    return cp.logistic(u)


@F_cvx.register
def _(act: Tanh, v):
    return -0.5 * (cp.entr(1 + v) + cp.entr(1 - v))


@Fstar_cvx.register
def _(act: Tanh, u):
    # log cosh u = log(1 + e^{2u}) - u - log 2
    return cp.logistic(2 * u) - u - math.log(2.0)


#: the oracle's forms of an activation, each with the class's own method that stands in for it
ACTIVATION_FORMS = ((F_cvx, "F_cvxpy"), (Fstar_cvx, "Fstar_cvxpy"))


# --- the divergence B_phi(v, u) of Theorem 1 ------------------------------------------------
def _is_expr(x):
    return isinstance(x, cp.Expression) and not isinstance(x, cp.Parameter) and bool(x.variables())


def _constant_part(act, x, name, f_np, f_cvx, check_range=False):
    """``sum f(x)`` on the side of B with no variable: a number, or symbolic for a parameter."""
    if isinstance(x, cp.Expression):  # a parameter (expression): F or F* stays symbolic
        return cp.sum(f_cvx(act, x))
    x = np.asarray(x, dtype=float)
    if check_range:
        act.check_range(name, x)
    return float(np.sum(f_np(x)))


def divergence_cvx(
    act: Activation, v: Any, u: Any, linear: cp.Expression | None = None
) -> tuple[cp.Expression, list[Any]]:
    """Summed ``B_phi(v, u)`` of ``act`` as a CVXPY expression, with the domain constraints on v.

    Exactly one of ``v``, ``u`` is a CVXPY expression of variables; the other is a NumPy
    array or a ``cp.Parameter``. The result is DCP. It is DPP when the expression side holds
    no parameter; when it does (``u = W [Z; 1]`` with ``W`` a parameter) the bilinear term
    ``<u, v>`` is a product of parameters, and the caller passes it in DPP form as
    ``linear`` (e.g. ``cp.sum(cp.multiply(P, Zt))`` with the parameter ``P = W^T V``).
    Returns ``(expression, constraints)``.
    """
    v_var, u_var = _is_expr(v), _is_expr(u)
    if v_var == u_var:
        raise ValueError(
            "divergence_cvx needs exactly one of v, u to be a CVXPY expression of "
            f"variables, got v={type(v).__name__}, u={type(u).__name__}"
        )
    cons = []
    if v_var:
        lo, hi = act.v_range
        cons += [v >= lo] if not math.isinf(lo) else []
        cons += [v <= hi] if not math.isinf(hi) else []
        Fv = cp.sum(F_cvx(act, v))
    else:
        Fv = _constant_part(act, v, "v", act.F, F_cvx, check_range=True)
    if u_var:
        Fs, more = Fstar_sum_cvx(act, u)
        cons += more
    else:
        Fs = _constant_part(act, u, "u", act.Fstar, Fstar_cvx)
    if linear is None:
        linear = cp.sum(cp.multiply(u, v))
    return Fv + Fs - linear, cons


# --- the output losses L(Y, Yhat), Yhat affine in the variable ------------------------------
@singledispatch
def loss_cvx(loss: Loss, Y: np.ndarray | cp.Expression, Yhat: cp.Expression) -> cp.Expression:
    """``L(Y, Yhat)`` summed over the columns, as a CVXPY expression (convex in ``Yhat``); the
    class's own ``value_cvxpy`` where none is registered here."""
    value_cvxpy = getattr(loss, "value_cvxpy", None)
    if value_cvxpy is not None:
        return value_cvxpy(Y, Yhat)
    raise NotImplementedError(
        f"{loss!r} has no CVXPY form ({type(loss).__name__} lacks the fact 'value_cvxpy')"
    )


@loss_cvx.register
def _(loss: MSE, Y, Yhat):
    return cp.sum_squares(Yhat - Y)


@loss_cvx.register
def _(loss: CrossEntropy, Y, Yhat):
    colsum = cp.sum(Y, axis=0) if isinstance(Y, cp.Expression) else Y.sum(axis=0)
    return cp.sum(cp.multiply(colsum, cp.log_sum_exp(Yhat, axis=0))) - cp.sum(cp.multiply(Y, Yhat))


#: the oracle's form of a loss, with the class's own method that stands in for it
LOSS_FORMS = ((loss_cvx, "value_cvxpy"),)
