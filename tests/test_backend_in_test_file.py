"""Proof by extension: a backend defined and registered in this file alone (the docs page "Add a
backend") trains a network with the strict certificate, reaches the oracle's block optima,
passes the conformance suite's backend checks, and is built by name like the package's own; a
second class under a taken name is refused.

``ProjectedGradient`` solves any block by accelerated projected gradient (FISTA with
backtracking and restart) on the block's own facts alone: ``value``, ``grad``, ``project`` and
``kkt_residual``. It knows nothing of the block's kind: the certificate, which recomputes every
block's KKT residual from the returned point, is what proves it right.
"""

import math
import time

import numpy as np
import pytest

from fenchel_cvx import LiftedNetwork
from fenchel_cvx.backends import BACKENDS, BackendDefaults, get_backend, register_backend
from fenchel_cvx.bcd import fit_bcd
from fenchel_cvx.blocks import BlockResult, w_block, x_block
from fenchel_cvx.oracle import OracleBackend
from test_conformance import BACKEND_CHECKS, backend_cases


class ProjectedGradient(BackendDefaults):
    name = "projected_gradient"  # the name users pass: fit_bcd(..., backend="projected_gradient")

    def __init__(self, tol=1e-8, max_iter=50_000):
        self.tol, self.max_iter = tol, max_iter

    def solve(self, block, start=None):
        t0 = time.perf_counter()
        z = block.project(np.array(np.zeros(block.shape) if start is None else start, float))
        y, theta, L, it = z, 1.0, 1.0, 0
        residual = block.kkt_residual(z)
        while residual > self.tol and it < self.max_iter:
            g, fy = block.grad(y), float(block.value(y))
            while True:  # backtracking: the quadratic model at y bounds the value at the step
                zn = block.project(y - g / L)
                d = zn - y
                if float(block.value(zn)) <= fy + np.sum(g * d) + 0.5 * L * np.sum(d * d):
                    break
                L *= 2.0
            theta_n = 0.5 * (1.0 + math.sqrt(1.0 + 4.0 * theta * theta))
            if np.sum((y - zn) * (zn - z)) > 0:  # the momentum points uphill: restart
                theta_n = 1.0
            y = block.project(zn + ((theta - 1.0) / theta_n) * (zn - z))
            z, theta, L, it = zn, theta_n, 0.9 * L, it + 1
            residual = block.kkt_residual(z)
        converged = residual <= self.tol
        return BlockResult(
            argmin=z,
            value=float(block.value(z)),
            status="optimal" if converged else "max_iter",
            residual=residual,
            seconds=time.perf_counter() - t0,
            iterations=it,
            converged=converged,
        )


@pytest.fixture(autouse=True, scope="module")
def _registered_while_this_file_runs():
    """``register_backend(ProjectedGradient)`` (the page's ``@register_backend``) while this
    file's tests run, and not at its import: the other files see the package's registry as it
    ships, whatever the order in which they are collected and run."""
    register_backend(ProjectedGradient)
    yield
    BACKENDS.pop("projected_gradient", None)


def _data(m=12, seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((4, m)), rng.standard_normal((2, m))


def test_registered_in_this_file_it_trains_with_the_strict_certificate():
    X, Y = _data()
    net = LiftedNetwork((4, 5, 3, 2), "relu", "mse", lam=1.0, rho=0.1, seed=1)
    before = net.network_objective(X, Y)
    res = fit_bcd(net, X, Y, iterations=3, backend="projected_gradient", strict=True, gamma=0.5)
    assert res.history.certificate_held and net.network_objective(X, Y) < before


@pytest.mark.parametrize("act", ["relu", "leaky_relu"])
def test_it_reaches_the_oracle_s_block_optima(act):
    X, Y = _data(seed=3)
    net = LiftedNetwork((4, 5, 2), act, "mse", lam=1.0, rho=0.1, seed=2)
    Xs, _ = net.forward(X)
    Xs = [np.clip(A + 0.05, 0.1, 0.9) for A in Xs]  # off the feed-forward point
    blocks = [x_block(net, X, Y, Xs, 1)] + [w_block(net, X, Y, Xs, l) for l in (0, 1)]
    ours, oracle = get_backend("projected_gradient", tol=1e-7), OracleBackend()
    for block in blocks:
        start = block.project(Xs[0]) if block.kind.startswith("x") else None
        got, want = ours.solve(block, start), oracle.solve(block)
        assert got.converged and want.status == "optimal"
        assert got.value == pytest.approx(want.value, rel=1e-6, abs=1e-9)


@pytest.mark.parametrize("check", BACKEND_CHECKS, ids=lambda c: c.__name__)
def test_registered_in_this_file_it_passes_the_conformance_suite(check):
    """Registered, it is a case of every backend check of ``test_conformance.py``, and passes."""
    assert ("projected_gradient", check) in {(p.values[0], p.values[1]) for p in backend_cases()}
    check("projected_gradient")


def test_a_taken_name_is_refused_by_name():
    assert BACKENDS["projected_gradient"](tol=1e-3).tol == 1e-3

    class Another(ProjectedGradient):
        pass

    with pytest.raises(ValueError, match="backend name 'projected_gradient' is taken"):
        register_backend(Another)
    with pytest.raises(ValueError, match="backend name 'fast' is taken"):
        register_backend("fast", ".fast", "FastBackend")
