"""Executable theorem checks (fenchel_cvx.theory) at sizes that run in seconds."""

import math

import numpy as np
import pytest

import registry_params
from fenchel_cvx import theory
from fenchel_cvx.network import LiftedNetwork


# every registered activation the CVXPY oracle (the convex problem's solver) has forms of
@pytest.mark.parametrize("act", registry_params.activations(registry_params.has_cvxpy_forms))
def test_one_layer_recovery_convex_problem_recovers_W_star(act):
    r = theory.one_layer_recovery(act, n=4, p=3, m=40, restarts=4, seed=0)
    assert r.convex_status == "optimal"
    assert r.convex_error <= 1e-5 and r.recovered
    assert len(r.nonconvex_errors) == 4 and all(math.isfinite(e) for e in r.nonconvex_errors)
    assert r.to_dict()["recovered"] is True


def test_one_layer_recovery_without_bias():
    r = theory.one_layer_recovery("relu", bias=False, restarts=0, seed=3)
    assert r.recovered and r.nonconvex_errors == []


def test_relu_recovery_needs_every_unit_active_on_n_plus_1_points():
    """A unit of W* inactive on every data point (seed 1, m = 40) is not determined by the data:
    any row nonpositive on all the points fits it, so the convex error is large; with every unit
    active on more than n + 1 points (seed 1, m = 80) W* is recovered."""
    dead = theory.one_layer_recovery("relu", n=4, p=3, m=40, restarts=0, seed=1)
    assert len(dead.active_points) == 3 and min(dead.active_points) == 0
    assert dead.convex_status == "optimal" and not dead.recovered
    alive = theory.one_layer_recovery("relu", n=4, p=3, m=80, restarts=0, seed=1)
    assert min(alive.active_points) > 4 + 1 and alive.recovered
    assert sum(alive.active_points) <= 3 * 80


def test_relu_least_squares_can_fail_where_the_convex_problem_does_not():
    # seed 0: 2 of 10 L-BFGS starts end at a wrong point (a unit dies); the convex problem is exact
    r = theory.one_layer_recovery("relu", restarts=10, seed=0)
    assert r.recovered
    assert r.nonconvex_failures >= 1
    assert max(r.nonconvex_errors) > r.fail_tol


@pytest.mark.parametrize(
    "act,loss,lam",
    [
        ("relu", "mse", (0.3, 2.5)),
        ("leaky_relu", "cross_entropy", (5.0, 0.01)),
        ("relu", "mse", (4.0, 4.0)),
    ],
)
def test_variable_scaling_reduces_per_layer_lambda_to_one(act, loss, lam):
    r = theory.variable_scaling(activation=act, loss=loss, lam=lam, n_points=4)
    assert r["max_rel_diff"] < 1e-12
    assert len(r["F"]) == 5  # feed-forward point + 4 random points
    assert not np.allclose(r["F"], r["J"])  # random points are off the feed-forward point
    np.testing.assert_allclose(r["c"], np.sqrt(np.asarray(lam) / 1.0))


def test_variable_scaling_formula_and_bias():
    W = [np.ones((3, 3)), np.ones((2, 4))]  # sizes 2-3-2, L = 1
    Xs = [np.ones((3, 5))]
    W_bar, Xs_bar, c = theory.scale_variables(W, Xs, lam=[4.0], lam_bar=1.0)
    assert c == [1.0, 2.0, 1.0]
    np.testing.assert_allclose(Xs_bar[0], 2.0)
    np.testing.assert_allclose(W_bar[0], 2.0)  # (c1/c0) A_0 and c1 b_0
    np.testing.assert_allclose(W_bar[1][:, :-1], 0.5)  # (c2/c1) A_1
    np.testing.assert_allclose(W_bar[1][:, -1], 1.0)  # c2 b_1: the bias is not rescaled by c1
    rA, rb = theory.scaled_penalty_weights([1.0, 1.0], c)
    assert rA == [0.25, 4.0] and rb == [0.25, 1.0]


def test_variable_scaling_is_the_same_network_function():
    net = LiftedNetwork([3, 4, 5, 2], lam=[0.5, 3.0], seed=1)
    X0 = np.random.default_rng(0).standard_normal((3, 6))
    Xs, out = net.forward(X0)
    W_bar, _, _ = theory.scale_variables(net.W, Xs, net.lam)
    bar = LiftedNetwork([3, 4, 5, 2], seed=1)
    bar.W = W_bar
    np.testing.assert_allclose(bar.forward(X0)[1], out, rtol=1e-12, atol=1e-12)


def test_weak_duality_along_a_run():
    r = theory.weak_duality(iterations=3)
    assert r["holds_every_iteration"] and r["min_holds"] and r["certificate_held"]
    assert all(g >= -1e-6 * (abs(j) + 1) for g, j in zip(r["gap"], r["network"]))
    assert r["min_lifted"] <= r["min_network"]


def test_weak_duality_sigmoid_cross_entropy_with_restarts():
    r = theory.weak_duality(activation="sigmoid", loss="cross_entropy", iterations=3)
    assert r["holds_every_iteration"] and r["min_holds"] and r["certificate_held"]
