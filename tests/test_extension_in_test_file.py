"""Proof by extension: an activation and a loss defined and registered in this file alone pass
the conformance suite and train on both backends with the strict certificate, with no other file
changed; a class that lacks a fact a solver needs is refused where a network is built, naming
the class and the fact.

- ``half_tanh``: phi(u) = tanh(u / 2) = 2 sigmoid(u) - 1 on (-1, 1), sup phi' = 1/2, with
  F(v) = (1 + v) log(1 + v) + (1 - v) log(1 - v) and F*(u) = 2 log(1 + e^u) - u - 2 log 2;
- ``log_cosh``: L(Y, Yhat) = sum log cosh(Yhat - Y), gradient tanh(r), Hessian 1 - tanh(r)^2 <= 1.
"""

import math

import numpy as np
import pytest
from array_api_compat import array_namespace

from fenchel_cvx import LiftedNetwork
from fenchel_cvx.activations import Activation, activation, register_activation
from fenchel_cvx.bcd import fit_bcd
from fenchel_cvx.blocks import w_block, x_block
from fenchel_cvx.fast import FastBackend
from fenchel_cvx.losses import Loss, loss, register_loss
from fenchel_cvx.oracle import OracleBackend


class HalfTanh(Activation):
    name = "half_tanh"
    v_range = (-1.0, 1.0)
    dphi_max = 0.5
    open_range = True

    def phi(self, u):
        return array_namespace(u).tanh(0.5 * u)

    def dphi(self, u):
        t = self.phi(u)
        return 0.5 * (1 - t * t)

    def phi_inv(self, v):
        xp = array_namespace(v)
        inside = xp.abs(v) < 1
        w = xp.where(inside, v, xp.zeros_like(v))
        ends = xp.where(
            v == 1,
            xp.full_like(v, math.inf),
            xp.where(v == -1, xp.full_like(v, -math.inf), xp.full_like(v, math.nan)),
        )
        return xp.where(inside, 2 * xp.atanh(w), ends)

    def F(self, v):
        xp = array_namespace(v)

        def xlogx(x):
            pos = x > 0
            return xp.where(pos, x * xp.log(xp.where(pos, x, xp.ones_like(x))), xp.zeros_like(x))

        return xlogx(1 + v) + xlogx(1 - v)

    def Fstar(self, u):
        xp = array_namespace(u)
        return 2 * xp.logaddexp(xp.zeros_like(u), u) - u - 2 * math.log(2.0)

    def F_cvxpy(self, v):
        import cvxpy as cp

        return -cp.entr(1 + v) - cp.entr(1 - v)

    def Fstar_cvxpy(self, u):
        import cvxpy as cp

        return cp.sum(2 * cp.logistic(u) - u) - 2 * math.log(2.0) * math.prod(u.shape), []


class LogCosh(Loss):
    name = "log_cosh"
    separable_rows = True

    def elementwise(self, Y, Yhat):
        xp = array_namespace(Y, Yhat)
        a = xp.abs(Yhat - Y)
        return a + xp.log1p(xp.exp(-2 * a)) - math.log(2.0)

    def value(self, Y, Yhat):
        return array_namespace(Y, Yhat).sum(self.elementwise(Y, Yhat))

    def column_values(self, Y, Yhat):
        return array_namespace(Y, Yhat).sum(self.elementwise(Y, Yhat), axis=0)

    def grad(self, Y, Yhat):
        return array_namespace(Y, Yhat).tanh(Yhat - Y)

    def column_curvature(self, Y, xp):
        return 1.0

    def hvp(self, Y, Yhat, A):
        t = self.grad(Y, Yhat)
        return (1 - t * t) * A

    def value_cvxpy(self, Y, Yhat):
        import cvxpy as cp

        R = Yhat - Y
        return cp.sum(cp.logistic(2 * R) - R) - math.log(2.0) * math.prod(R.shape)


@pytest.fixture(autouse=True, scope="module")
def registered():
    """Registered for this file's tests (``register_activation``, ``register_loss``: a module
    would decorate its classes with them), and taken out again so that other tests see the
    package's registries as they ship."""
    from fenchel_cvx.activations import ACTIVATIONS
    from fenchel_cvx.losses import LOSSES

    register_activation(HalfTanh)
    register_loss(LogCosh)
    yield
    del ACTIVATIONS["half_tanh"], LOSSES["log_cosh"]


def _data(m=24):
    rng = np.random.default_rng(0)
    X = rng.normal(size=(4, m))
    return X, np.vstack([np.tanh(X[0] - X[1]), X[2]]) + 0.1 * rng.normal(size=(2, m))


def test_the_classes_carry_consistent_facts():
    act, L = activation("half_tanh"), loss("log_cosh")
    u = np.linspace(-5, 5, 21)
    np.testing.assert_allclose(act.divergence(act.phi(u), u), 0.0, atol=1e-13)
    np.testing.assert_allclose(act.phi_inv(act.phi(u)), u, rtol=1e-9)
    rng = np.random.default_rng(1)
    Y, Yh, D = (rng.normal(size=(2, 5)) for _ in range(3))
    h = 1e-6
    fd = (L.value(Y, Yh + h * D) - L.value(Y, Yh - h * D)) / (2 * h)
    assert float(np.sum(L.grad(Y, Yh) * D)) == pytest.approx(float(fd), rel=1e-7)


def test_they_pass_the_conformance_suite():
    """Registered, each is a case of every conformance check of its class
    (``test_conformance.py``), and passes them."""
    from test_conformance import (
        ACTIVATION_CHECKS,
        LOSS_CHECKS,
        activation_cases,
        example,
        loss_cases,
    )

    acts = [p.values[1] for p in activation_cases() if p.values[0] == "half_tanh"]
    losses = [p.values[1] for p in loss_cases() if p.values[0] == "log_cosh"]
    every = lambda checks: {c for c in checks if not hasattr(c, "applies")}  # noqa: E731
    assert every(ACTIVATION_CHECKS) <= set(acts) and every(LOSS_CHECKS) <= set(losses)
    for check in acts:
        check(example("half_tanh"))
    for check in losses:
        check(loss("log_cosh"))


@pytest.mark.parametrize("backend", ["cvxpy", "fast"])
def test_registered_in_this_file_they_train_on_both_backends(backend):
    X, Y = _data()
    net = LiftedNetwork((4, 5, 3, 2), "half_tanh", "log_cosh", lam=1.0, rho=0.1, seed=1)
    before = net.network_objective(X, Y)
    res = fit_bcd(net, X, Y, iterations=3, backend=backend, strict=True, gamma=0.5)
    assert res.history.certificate_held and net.network_objective(X, Y) < before


def test_both_backends_reach_the_same_block_optima(tmp_path):
    X, Y = _data()
    net = LiftedNetwork((4, 5, 3, 2), "half_tanh", "log_cosh", lam=1.0, rho=0.1, seed=2)
    Xs = net.forward(X)[0]
    for block in (
        x_block(net, X, Y, Xs, 1),
        x_block(net, X, Y, Xs, 2),
        w_block(net, X, Y, Xs, 0),
        w_block(net, X, Y, Xs, 2),
    ):
        a, b = OracleBackend(tol=1e-8).solve(block), FastBackend(tol=1e-9).solve(block)
        assert b.value == pytest.approx(a.value, rel=1e-6, abs=1e-8)
    back = LiftedNetwork.load(net.save(tmp_path / "net.npz"))  # by name, from the registry
    assert isinstance(back.activations[0], HalfTanh) and isinstance(back.loss, LogCosh)


def test_a_class_that_lacks_a_fact_is_refused_by_name():
    class NoConjugate(HalfTanh):
        name = "no_conjugate"
        Fstar = Activation.Fstar  # the base class's stub: the fact is missing

    with pytest.raises(
        ValueError,
        match=r"^NoConjugate lacks the fact 'Fstar', which every "
        r"solver needs: define NoConjugate.Fstar",
    ):
        register_activation(NoConjugate)
    with pytest.raises(ValueError, match=r"^NoConjugate lacks the fact 'Fstar'"):
        LiftedNetwork((3, 2, 1), NoConjugate(), "mse")

    class NoCurvature(LogCosh):
        name = "no_curvature"
        hvp = Loss.hvp

    with pytest.raises(ValueError, match=r"^NoCurvature lacks the fact 'hvp'"):
        LiftedNetwork((3, 2, 1), "relu", NoCurvature())


def test_the_oracle_refuses_a_class_without_cvxpy_forms():
    class NumpyOnly(HalfTanh):
        name = "numpy_only"
        F_cvxpy = None

    net = LiftedNetwork((3, 2, 1), NumpyOnly(), "mse", seed=0)
    X, Y = np.ones((3, 4)), np.zeros((1, 4))
    block = w_block(net, X, Y, net.forward(X)[0], 0)
    with pytest.raises(
        ValueError,
        match=r"^NumpyOnly lacks the fact 'F_cvxpy', which the CVXPY "
        r"oracle needs",
    ):
        OracleBackend().solve(block)
    assert FastBackend().solve(block).converged  # the fast backend needs no CVXPY form


def test_a_taken_name_is_refused():
    class Other(HalfTanh):
        pass

    Other.__qualname__ = "Other"
    with pytest.raises(ValueError, match="the activation name 'half_tanh' is taken by HalfTanh"):
        register_activation(Other)


def test_a_foreign_class_under_a_built_in_name_is_refused():
    """A class of another module that takes a built-in's name, even with the built-in's own
    class name (a user's ``class ReLU(ReLU): name = "relu"``), is refused, naming both; the
    name keeps its class, and the built-in itself registers again (a module reloaded)."""
    from fenchel_cvx import activations

    class ReLU(activations.ReLU):
        name = "relu"

        def phi(self, u):
            return 42.0 + 0 * u

    ReLU.__qualname__ = "ReLU"  # the built-in's own qualified name, in this module
    try:
        with pytest.raises(
            ValueError,
            match=r"the activation name 'relu' is taken by ReLU of "
            r"fenchel_cvx\.activations, refused for ReLU of " + __name__.replace(".", r"\."),
        ):
            register_activation(ReLU)
    finally:
        activations.ACTIVATIONS["relu"] = activations.ReLU  # never leave the foreign class
    assert register_activation(activations.ReLU) is activations.ReLU
    assert activation("relu").phi(np.array([1.0]))[0] == 1.0
