"""The per-iteration certificate: it holds on exact runs and catches bad updates.

The "bad" backends here are real backends: subclasses of the CVXPY oracle that solve the block
and then hand back a worse point (or fail), not mocks of a solver.
"""

import math

import numpy as np
import pytest

from fenchel_cvx import bcd
from fenchel_cvx.backends import as_backend
from fenchel_cvx.bcd import fit_bcd
from fenchel_cvx.blocks import BlockResult, x_block
from fenchel_cvx.certificate import CHECKS, Certificate, Violation
from fenchel_cvx.errors import CertificateError, SolverError
from fenchel_cvx.network import LiftedNetwork
from fenchel_cvx.oracle import OracleBackend
from fenchel_cvx.run_settings import RunSettings
from fenchel_cvx.schedule import Batches, BCDState, Step


class WorseningOracle(OracleBackend):
    """The oracle, except that for blocks of one kind it returns a point *worse* than the start.

    From the start Z0 and the exact minimiser Z*, it returns Z0 + 2 (Z0 - Z*) (projected on the
    block's domain): by convexity its value is >= value(Z0), strictly if Z0 was not optimal.
    """

    def __init__(self, kind, **kw):
        super().__init__(**kw)
        self.kind = kind

    def solve(self, block, start=None):
        res = super().solve(block, start)
        if block.kind != self.kind:
            return res
        Z = block.project(start + 2.0 * (start - res.argmin))
        return BlockResult(Z, float(block.value(Z)), "optimal", block.kkt_residual(Z), res.seconds)


class FailingOracle(OracleBackend):
    """The oracle, except that W-hidden solves fail with a SolverError."""

    def solve(self, block, start=None):
        if block.kind == "w_hidden":
            raise SolverError(block.kind, block.layer, "solver_error", "deliberate failure")
        return super().solve(block, start)


@pytest.fixture(scope="module")
def data(random_data):
    return random_data(m=24, seed=0)


def small_net(loss="mse", act="relu", sizes=(4, 5, 3)):
    return LiftedNetwork(list(sizes), act, loss, lam=1.0, rho=0.1, seed=0)


@pytest.mark.parametrize(
    "loss,act,sizes",
    [
        ("mse", "relu", (4, 5, 3)),
        ("cross_entropy", "relu", (4, 5, 3)),
        ("mse", "tanh", (4, 5, 4, 3)),
        ("cross_entropy", "sigmoid", (4, 5, 4, 3)),
    ],
)
def test_certificate_holds_on_exact_runs(data, loss, act, sizes):
    X, Y = data
    res = fit_bcd(small_net(loss, act, sizes), X, Y, iterations=3)  # oracle: strict by default
    h = res.history
    assert h.config["strict"] is True and h.certificate_held and h.violations == []
    for r in h:
        c = r["certificate"]
        assert c["held"] and c["bound_gap"] >= -1e-6 * (abs(r["network_x"]) + 1)
        assert c["max_increase"] <= 1e-6 * (abs(r["lifted_x"]) + 1)
        assert all(b >= -1e-6 for b in c["min_divergence"])
        assert 0 <= c["max_residual"] <= 1e-6
        assert all(b["status"] == "optimal" for b in r["blocks"])


@pytest.mark.parametrize("kind,name", [("w_last", "W_1"), ("w_hidden", "W_0"), ("x_last", "X_1")])
def test_worse_update_fails_its_block_in_strict_mode(data, kind, name):
    # the worse point is not a minimiser: its recomputed KKT residual fails it first, by name
    X, Y = data
    with pytest.raises(CertificateError) as err:
        fit_bcd(small_net(), X, Y, iterations=2, backend=WorseningOracle(kind))
    e = err.value
    assert e.check == "block_optimality" and e.layer == name and e.iteration == 1
    assert e.value > e.bound and "iteration 1" in str(e)


def _one_round(backend, net, cert, X, Y, Xs, *, new_x, iteration):
    """Round ``iteration`` of Algorithm 1 (checked, no proximal term) from the lifted variables
    ``Xs`` under the certificate ``cert``; ``new_x``: Xs is the feed-forward point. -> its
    record."""
    layers = len(net.W)
    run = RunSettings(
        as_backend(backend),
        cert,
        [0.0] * layers,
        check_every=1,
        evaluate=lambda net, step: {},
        data=Batches(X, Y, np, batched=False),
        momentum=[0.0] * layers,
    )
    run.steps = [Step(iteration, None, None, None, None, new_x, True, True, True)]
    state = BCDState(list(net.W), history=[], Xs=list(Xs), W0=[None] * layers)
    bcd.algorithm_1(net, run, state, observers=[])
    return state.history[-1]


@pytest.mark.parametrize("kind,name", [("w_last", "W_1"), ("w_hidden", "W_0"), ("x_last", "X_1")])
def test_worse_update_raises_descent(data, kind, name):
    # a certificate without the residual check: the descent check alone catches the update
    X, Y = data
    net = small_net()
    cert = Certificate(strict=True)
    Xs = list(net.forward(X)[0])
    with pytest.raises(CertificateError) as err:
        _one_round(WorseningOracle(kind), net, cert, X, Y, Xs, new_x=True, iteration=1)
    e = err.value
    assert e.check == "descent" and e.layer == name and e.iteration == 1
    assert e.value > e.bound + e.tol and "descent" in str(e) and "iteration 1" in str(e)


def test_worse_update_is_recorded_in_non_strict_mode(data):
    X, Y = data
    res = fit_bcd(small_net(), X, Y, iterations=2, backend=WorseningOracle("x_last"), strict=False)
    h = res.history
    assert not h.certificate_held and len(h) == 2
    checks = {v["check"] for v in h.violations}
    # the X-sweep went up, so F after it can exceed J at the same weights as well
    assert {"descent", "lower_bound", "block_optimality"} <= checks
    assert all(
        v["layer"] == "X_1" for v in h.violations if v["check"] in ("descent", "block_optimality")
    )
    assert [v["iteration"] for v in h.violations][0] == 1
    assert h[0]["lifted_x"] > h[0]["network_x"]


def test_inaccurate_block_fails_block_optimality(data):
    X, Y = data
    sloppy = OracleBackend(tol=1e-300, strict=False)  # every residual > tol: converged=False
    with pytest.raises(CertificateError) as err:
        fit_bcd(small_net(), X, Y, iterations=1, backend=sloppy, strict=True)
    assert err.value.check == "block_optimality"
    res = fit_bcd(small_net(), X, Y, iterations=1, backend=sloppy, strict=False)
    assert {v["check"] for v in res.history.violations} == {"block_optimality"}


def test_solver_error_propagates_in_strict_mode_and_is_recorded_otherwise(data):
    X, Y = data
    net = small_net()
    W0 = net.W[0].copy()
    with pytest.raises(SolverError):
        fit_bcd(net, X, Y, iterations=1, backend=FailingOracle())
    net = small_net()
    res = fit_bcd(net, X, Y, iterations=1, backend=FailingOracle(), strict=False)
    v = res.history.violations
    assert [x["check"] for x in v] == ["block_optimality"] and v[0]["layer"] == "W_0"
    np.testing.assert_array_equal(net.W[0], W0)  # the failed block kept its value
    assert res.history[0]["blocks"][-1]["status"].startswith("error")


def test_restart_from_feed_forward_keeps_the_lower_bound(data):
    X, Y = data
    net = small_net(sizes=(4, 5, 4, 3))
    Xff, _ = net.forward(X)
    worse = [A + 3.0 for A in Xff]  # carried-over X far from feed-forward
    assert net.lifted_objective(X, Y, worse) > net.network_objective(X, Y)
    cert = Certificate(strict=True)
    rec = _one_round(OracleBackend(), net, cert, X, Y, worse, new_x=False, iteration=7)
    assert rec["restarted"] and cert.outcome()["restarted"]
    assert rec["lifted_x"] <= rec["network_x"]


def test_no_restart_when_carried_x_are_better(data):
    X, Y = data
    net = small_net()
    res = fit_bcd(net, X, Y, iterations=3)
    restarted = [r["restarted"] for r in res.history]
    assert restarted[0] is False  # the first round starts at feed-forward
    for r in res.history:  # restarts, if any, never break the bound
        assert r["lifted_x"] <= r["network_x"] + 1e-6 * (abs(r["network_x"]) + 1)


# --- the Certificate object itself ---------------------------------------------------------
def test_certificate_checks_directly(data):
    X, Y = data
    net = small_net()
    Xs = net.forward(X)[0]
    cert = Certificate(strict=True, tol=1e-6)
    cert.begin(3)
    Us = [net.pre_activation(l, V) for l, V in enumerate([X, *Xs][:-1])]
    cert.check_fenchel_young(net.activations, Xs, Us)  # feed-forward: B = 0
    assert cert.outcome()["min_divergence"] == [0.0]
    cert.check_lower_bound(1.0, 1.0 + 1e-7)
    cert.check_descent("W_0", 5.0, 5.0 + 1e-6, 1.0)  # within tol * (|F| + 1)
    with pytest.raises(CertificateError) as err:
        cert.check_lower_bound(2.0, 1.0)
    assert (err.value.check, err.value.iteration, err.value.value, err.value.bound) == (
        "lower_bound",
        3,
        2.0,
        1.0,
    )
    with pytest.raises(CertificateError) as err:
        cert.check_fenchel_young(net.activations, [Xs[0] - 1.0], Us)  # ReLU output below 0
    assert err.value.check == "fenchel_young" and err.value.layer == 0
    with pytest.raises(CertificateError) as err:
        cert.check_descent("X_1", 1.0, math.nan, 1.0)
    assert err.value.check == "descent"
    bad = BlockResult(Xs[0], 0.0, "optimal_inaccurate", 1e-3, converged=False)
    with pytest.raises(CertificateError) as err:
        cert.check_block("X_1", bad, 1e-3)
    assert err.value.check == "block_optimality"


def test_certificate_non_strict_collects_and_residual_tol(data):
    cert = Certificate(strict=False, tol=1e-8, residual_tol=1e-9)
    cert.begin(1)
    cert.check_lower_bound(2.0, 1.0)
    cert.check_descent("W_1", 0.0, 1.0, 0.0)
    cert.check_block("W_1", BlockResult(None, 0.0, "optimal", 0.0), residual=1e-5)
    out = cert.outcome()
    assert not out["held"] and [v["check"] for v in out["violations"]] == [
        "lower_bound",
        "descent",
        "block_optimality",
    ]
    assert out["max_residual"] == 1e-5 and set(CHECKS) >= {v["check"] for v in out["violations"]}
    cert.begin(2)
    assert cert.outcome()["held"]
    v = Violation("descent", "W_1", 2.0, 1.0, 1e-6, 4)
    assert isinstance(v.error(), CertificateError) and "iteration 4" in str(v.error())
    for bad in (0.0, -1.0, math.inf, "1e-6"):
        with pytest.raises(ValueError, match="tol"):
            Certificate(tol=bad)


def test_x_block_value_change_is_the_change_of_F(data):
    # the descent check relies on it: value(new) - value(old) = F(new) - F(old)
    X, Y = data
    net = small_net(sizes=(4, 5, 4, 3))
    Xs = net.forward(X)[0]
    blk = x_block(net, X, Y, Xs, 1)
    new = [Xs[0] + 0.1, Xs[1]]
    dF = net.lifted_objective(X, Y, new) - net.lifted_objective(X, Y, Xs)
    assert dF == pytest.approx(float(blk.value(new[0]) - blk.value(Xs[0])), rel=1e-10)


def test_argmin_problem_names_non_finite_entries():
    """One NaN or one inf entry makes an argmin unusable, however large its finite entries."""
    from fenchel_cvx import activation
    from fenchel_cvx.blocks import WHidden
    from fenchel_cvx.certificate import argmin_problem

    block = WHidden(
        layer=0,
        Xt=np.ones((3, 2), np.float32),
        rho=0.0,
        act=activation("relu"),
        V=np.ones((2, 2), np.float32),
        lam=1.0,
    )
    Z = np.zeros((2, 3), np.float32)
    assert argmin_problem(block, Z, (2, 3)) is None
    big = np.full((2, 3), 3e38, np.float32)
    assert argmin_problem(block, big, (2, 3)) is None
    for bad in (np.nan, np.inf, -np.inf):
        one = big.copy()
        one[1, 2] = bad
        assert argmin_problem(block, one, (2, 3)) == "argmin has 1 NaN or inf entries"


def test_the_argmin_check_of_a_large_x_block_forms_no_array_of_its_size(data):
    """The certificate's argmin check (every round) reads an X-block's point through its
    extrema: it allocates nothing near the point's size (Figure 1's X_1 is 144 MB)."""
    import tracemalloc

    from fenchel_cvx.certificate import argmin_usable

    X0, Y = data
    net = LiftedNetwork([X0.shape[0], 6, Y.shape[0]], seed=0)
    Xs, _ = net.forward(X0)
    block = x_block(net, X0, Y, Xs, 1)
    Z = np.repeat(Xs[0], 2000, axis=1)  # 6 x 2000 m: 12,000 m doubles
    tracemalloc.start()
    try:
        ok = argmin_usable(block, Z, Z.shape)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert bool(ok)
    assert peak < Z.nbytes // 100, (peak, Z.nbytes)
    Z[0, -1] = -1.0  # outside the ReLU's range
    assert not bool(argmin_usable(block, Z, Z.shape))
