"""The CVXPY oracle (fenchel_cvx.oracle) against scipy's L-BFGS-B, its own monolithic problems,
the nnls path, and its error contract."""

import itertools
import math

import cvxpy as cp
import numpy as np
import pytest
from scipy.optimize import minimize

import registry_params
from fenchel_cvx import LiftedNetwork
from fenchel_cvx.blocks import XBlock, w_block, x_block
from fenchel_cvx.errors import SolverError, SolverInaccurate
from fenchel_cvx.oracle import OracleBackend, block_problem

# every registered activation and loss that the oracle has CVXPY forms of
ACTS = registry_params.activations(registry_params.has_cvxpy_forms)
LOSSES = registry_params.losses(registry_params.has_cvxpy_forms)
TOL = 1e-7


@pytest.fixture(scope="module")
def backend():
    return OracleBackend(tol=TOL)


def instance(act, loss, seed=0, sizes=(4, 3, 3, 3), m=8, rho=0.05, noise=0.3):
    """A random network with lifted variables perturbed from the feed-forward point."""
    rng = np.random.default_rng(seed)
    net = LiftedNetwork(
        sizes,
        activation=registry_params.built(act),  # leaky ReLU at slope 0.1
        loss=loss,
        lam=[1.0, 0.7][: len(sizes) - 2],
        rho=rho,
        seed=seed,
    )
    X0 = rng.standard_normal((sizes[0], m))
    Y = registry_params.targets(loss, sizes[-1], m, rng)  # one-hot labels or Gaussian
    Xs, _ = net.forward(X0)
    Xs = [a.project(X + noise * rng.standard_normal(X.shape)) for a, X in zip(net.activations, Xs)]
    return net, X0, Y, Xs


def make_block(kind, act, loss, gamma, seed=0):
    net, X0, Y, Xs = instance(act, loss, seed)
    L = net.n_hidden
    if kind == "x_hidden":
        return x_block(net, X0, Y, Xs, 1)
    if kind == "x_last":
        return x_block(net, X0, Y, Xs, L)
    l = 0 if kind == "w_hidden" else L
    W0 = net.W[l] + 0.2 * np.random.default_rng(seed + 1).standard_normal(net.W[l].shape)
    return w_block(net, X0, Y, Xs, l, gamma=gamma, W0=W0 if gamma else None)


def lbfgs_best(block, shape, starts=4, seed=0):
    """The best value L-BFGS-B finds on block.value / block.grad from several random starts."""
    rng = np.random.default_rng(seed)
    lo, hi = -np.inf, np.inf
    if isinstance(block, XBlock):
        lo, hi = block.act_in.v_range
        if block.act_in.open_range:  # F' is infinite on the boundary
            lo, hi = lo + 1e-10, hi - 1e-10
    bounds = [(None if math.isinf(lo) else lo, None if math.isinf(hi) else hi)] * int(
        np.prod(shape)
    )
    best = np.inf
    for _ in range(starts):
        z0 = rng.uniform(max(lo, -1.0), min(hi, 1.0), size=shape).ravel()
        res = minimize(
            lambda z: float(block.value(z.reshape(shape))),
            z0,
            method="L-BFGS-B",
            jac=lambda z: block.grad(z.reshape(shape)).ravel(),
            bounds=bounds,
            options=dict(maxiter=5000, ftol=1e-15, gtol=1e-11),
        )
        best = min(best, float(res.fun))
    return best


CASES = (
    [("x_hidden", a, "mse", 0.0) for a in ACTS]
    + [("x_last", a, l, 0.0) for a in ACTS for l in LOSSES]
    + [("w_hidden", a, "mse", g) for a in ACTS for g in (0.0, 0.5)]
    + [("w_last", a, l, g) for a in ACTS for l in LOSSES for g in (0.0, 0.5)]
)


@pytest.mark.parametrize("kind,act,loss,gamma", CASES)
def test_block_is_optimal(backend, kind, act, loss, gamma):
    block = make_block(kind, act, loss, gamma)
    res = backend.solve(block)
    assert res.status == "optimal" and res.converged
    assert res.residual <= TOL
    assert res.value == pytest.approx(float(block.value(res.argmin)), rel=1e-12, abs=1e-12)
    assert res.argmin.shape == block.shape
    best = lbfgs_best(block, block.shape)
    assert res.value <= best + 1e-7 * (1 + abs(best)), (res.value, best)
    assert {"solver", "duality_gap", "n_subproblems"} <= set(res.info)


def test_nnls_matches_cvxpy():
    for seed in range(3):
        block = make_block("x_last", "relu", "mse", 0.0, seed=seed)
        a = OracleBackend(tol=TOL, nnls=True, exact=False).solve(block)  # (exact: output_dual)
        b = OracleBackend(tol=TOL, nnls=False, exact=False).solve(block)
        assert a.info["solver"] == "nnls" and b.info["solver"] == "CLARABEL"
        np.testing.assert_allclose(a.argmin, b.argmin, atol=1e-6)
        assert a.value == pytest.approx(b.value, rel=1e-8, abs=1e-8)
        assert a.value <= b.value + 1e-12 * (1 + abs(b.value))


SPLIT_KINDS = [
    ("x_hidden", "mse", 0.0),
    ("x_last", "cross_entropy", 0.0),
    ("x_last", "mse", 0.0),
    ("w_hidden", "mse", 0.5),
    ("w_hidden", "mse", 0.0),
    ("w_last", "cross_entropy", 0.5),
    ("w_last", "mse", 0.0),
]


@pytest.mark.parametrize(
    "kind,act,loss,gamma", [(k, a, l, g) for a in ACTS for k, l, g in SPLIT_KINDS]
)
def test_split_equals_monolithic(kind, act, loss, gamma):
    block = make_block(kind, act, loss, gamma)
    split = OracleBackend(tol=TOL, budget=1).solve(block)  # one column / row per piece
    assert split.info["n_subproblems"] == block.shape[1 if kind.startswith("x") else 0]
    prob, var = block_problem(block)
    assert prob.is_dcp()
    prob.solve(solver=cp.CLARABEL)
    assert prob.status == "optimal"
    # the monolithic problem's objective is the block objective, constants included
    assert prob.value == pytest.approx(float(block.value(var.value)), rel=1e-6, abs=1e-6)
    assert split.value == pytest.approx(prob.value, rel=1e-6, abs=1e-6)
    assert split.value <= prob.value + 1e-9 * (1 + abs(prob.value))
    if kind != "w_hidden" or gamma:  # strongly convex: the argmin is unique
        np.testing.assert_allclose(split.argmin, var.value, atol=1e-3)


def test_template_is_reused():
    backend = OracleBackend(tol=TOL, budget=40, exact=False)  # several pieces; CVXPY W-blocks
    first = make_block("x_last", "sigmoid", "cross_entropy", 0.0, seed=0)
    backend.solve(first)
    builds = backend.cache_info()
    assert sum(builds.values()) == 1
    second = make_block("x_last", "sigmoid", "cross_entropy", 0.0, seed=5)  # same shapes, new data
    res = backend.solve(second)
    assert backend.cache_info() == builds  # no recompilation
    assert res.residual <= TOL
    best = lbfgs_best(second, second.shape)
    assert res.value <= best + 1e-7 * (1 + abs(best))
    # W-blocks compile X~ in as a constant: same X~ reuses, a new X~ rebuilds in place
    wb = make_block("w_hidden", "relu", "mse", 0.5, seed=0)
    backend.solve(wb)
    backend.solve(make_block("w_hidden", "relu", "mse", 0.0, seed=0))  # same X~, new gamma
    key = next(k for k in backend.cache_info() if k[0] == "w_hidden")
    assert backend.cache_info()[key] == 1
    backend.solve(make_block("w_hidden", "relu", "mse", 0.5, seed=3))  # new X~
    assert backend.cache_info()[key] == 2 and len(backend.cache_info()) == 2


@pytest.mark.slow
def test_parallel_equals_serial():
    block = make_block("x_last", "tanh", "cross_entropy", 0.0, seed=2)
    net, X0, Y, Xs = instance("relu", "mse", seed=3, m=40)
    nn_block = x_block(net, X0, Y, Xs, 2)  # 40 columns: nnls in two workers
    a = OracleBackend(tol=TOL, budget=1).solve(block)
    a2 = OracleBackend(tol=TOL).solve(nn_block)
    par = OracleBackend(tol=TOL, budget=1, n_jobs=2)
    try:
        b, b2 = par.solve(block), par.solve(nn_block)
    finally:
        par.close()
    np.testing.assert_allclose(a.argmin, b.argmin, atol=1e-9)
    np.testing.assert_allclose(a2.argmin, b2.argmin, atol=1e-12)


def test_scs_and_osqp_work():
    scs = OracleBackend(solver="SCS", tol=TOL, exact=False)
    for kind, act, loss in [("w_hidden", "relu", "mse"), ("x_last", "sigmoid", "cross_entropy")]:
        res = scs.solve(make_block(kind, act, loss, 0.0))
        assert res.status == "optimal" and res.residual <= TOL and res.info["solver"] == "SCS"
    osqp = OracleBackend(solver="osqp", tol=TOL)
    xb = make_block("x_hidden", "relu", "mse", 0.0)
    res = osqp.solve(xb)
    assert res.status == "optimal" and res.residual <= TOL
    again = osqp.solve(xb, start=res.argmin)  # warm start from the argmin
    assert again.residual <= TOL and again.iterations <= res.iterations
    with pytest.raises(ValueError, match="exponential cones"):
        osqp.solve(make_block("x_last", "sigmoid", "cross_entropy", 0.0))


def test_bad_input():
    with pytest.raises(ValueError, match="solver must be one of .*CLARABEL.*got 'nope'"):
        OracleBackend(solver="nope")
    with pytest.raises(ValueError, match="tol must be > 0 and finite, got -1"):
        OracleBackend(tol=-1)
    with pytest.raises(ValueError, match=r"tol must be <= 1 \(a residual relative to the "):
        OracleBackend(tol=2.0)
    with pytest.raises(ValueError, match="n_jobs"):
        OracleBackend(n_jobs=0)
    backend = OracleBackend()
    block = make_block("x_hidden", "relu", "mse", 0.0)
    block.V_next = block.V_next.copy()
    block.V_next[0, 0] = -0.5
    with pytest.raises(ValueError, match=r"V_next must lie in the range .* of relu, got -0.5"):
        backend.solve(block)
    wb = make_block("w_hidden", "sigmoid", "mse", 0.0)
    wb.V = wb.V.copy()
    wb.V[1, 2] = 1.25
    with pytest.raises(
        ValueError, match=r"V must lie in the range \(0.0, 1.0\) of sigmoid, got 1.25"
    ):
        backend.solve(wb)
    ce = make_block("x_last", "relu", "cross_entropy", 0.0)
    ce.Y = ce.Y - 0.5
    with pytest.raises(ValueError, match="Y must be >= 0 for cross_entropy"):
        backend.solve(ce)
    with pytest.raises(ValueError, match="block must be one of"):
        backend.solve("x_last")


def test_non_optimal_status_raises_typed_error():
    block = make_block("w_hidden", "sigmoid", "mse", 0.0)
    with pytest.raises(SolverError, match=r"w_hidden block of layer 0: solver status"):
        OracleBackend(solver="SCS", solver_opts=dict(max_iters=1), polish=False).solve(block)
    # with the polish, the solver's inaccurate point is refined and certified by its residual
    res = OracleBackend(solver="SCS", solver_opts=dict(max_iters=1), tol=TOL).solve(block)
    assert res.status == "optimal" and res.info["solver_status"] != "optimal"
    assert res.residual <= TOL and res.info["polish_steps"] > 0
    xb = make_block("x_last", "tanh", "cross_entropy", 0.0)
    with pytest.raises(SolverError, match=r"x_last block of layer 2") as err:
        OracleBackend(solver_opts=dict(max_iter=1), polish=False).solve(xb)
    assert err.value.block == "x_last" and err.value.layer == 2 and err.value.status != "optimal"


def test_residual_above_tol():
    block = make_block("x_hidden", "sigmoid", "mse", 0.0)
    with pytest.raises(SolverInaccurate, match="KKT residual .* > tol"):
        OracleBackend(tol=1e-30, polish=False).solve(block)
    res = OracleBackend(tol=1e-30, polish=False, strict=False).solve(block)
    assert not res.converged and "KKT residual" in res.info["warning"]
    assert res.status == "optimal"


def test_empty_label_columns_cross_entropy(backend):
    block = make_block("x_last", "relu", "cross_entropy", 0.0)
    block.Y = block.Y.copy()
    block.Y[:, 3] = 0.0  # a column with no label mass
    res = backend.solve(block)
    assert res.residual <= TOL
    np.testing.assert_allclose(res.argmin[:, 3], np.maximum(block.U_prev[:, 3], 0.0))


# the objective is evaluated at the variable's value alone: the activations whose F* the oracle
# writes elementwise (an epigraph form of F*, ELU's, adds a variable that holds no value)
@pytest.mark.parametrize(
    "act,loss",
    list(
        itertools.product(
            registry_params.activations(registry_params.elementwise_cvxpy_Fstar), LOSSES
        )
    ),
)
def test_block_problem_value_is_block_value(act, loss):
    net, X0, Y, Xs = instance(act, loss, seed=4)
    for block in [
        x_block(net, X0, Y, Xs, 1),
        x_block(net, X0, Y, Xs, 2),
        w_block(net, X0, Y, Xs, 0, gamma=0.3, W0=net.W[0] * 0.5),
        w_block(net, X0, Y, Xs, 2),
    ]:
        prob, var = block_problem(block)
        var.value = (
            block.project(Xs[block.layer - 1]) if isinstance(block, XBlock) else net.W[block.layer]
        )
        assert prob.objective.value == pytest.approx(float(block.value(var.value)), rel=1e-9)


@pytest.mark.parametrize("act", ["relu", "sigmoid"])
def test_a_solvers_point_is_clipped_into_the_x_blocks_domain_by_the_distance_it_moves(act):
    """The oracle clips a solver's X-block point into the range of phi (sigmoid: 1e-12 inside
    [0, 1]) and records the largest distance moved; a point inside is the solver's own array,
    no copy of it (Figure 1's X_1 is 144 MB)."""
    from fenchel_cvx.oracle.backend import _into_domain

    rng = np.random.default_rng(5)
    net = LiftedNetwork([4, 3, 2], act, "mse", lam=0.5, rho=0.1, seed=5)
    X0, Y = rng.standard_normal((4, 7)), rng.standard_normal((2, 7))
    block = x_block(net, X0, Y, net.forward(X0)[0], 1)
    lo, hi = (0.0, math.inf) if act == "relu" else (1e-12, 1 - 1e-12)
    inside = np.clip(rng.uniform(0.1, 0.9, (3, 7)), lo, hi)
    same, moved = _into_domain(block, inside)
    assert same is inside and moved == 0.0
    outside = inside.copy()
    outside[0, 0], outside[2, 5] = -0.25, 1.5
    clipped, moved = _into_domain(block, outside)
    np.testing.assert_array_equal(clipped, np.clip(outside, lo, hi))
    assert moved == np.max(np.abs(clipped - outside)) >= 0.25
