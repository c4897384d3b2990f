"""Fault injection: the certificate trusts no backend's report about its own argmin.

A real backend (the CVXPY oracle, the fast array solvers) is wrapped so that, for the blocks of
one kind, it returns its argmin perturbed by noise of size 1e-1 or 1e-3, or full of NaN, together
with the untouched, honest-looking report (status "optimal", converged, the residual and value
of the true solve). Every fault must be caught, by the name of its block, in the iteration it
happened: in strict mode as a ``CertificateError``; in recorded mode as a ``block_optimality``
violation against that block, the run ending cleanly with its history kept when the point
cannot be used (NaN, outside the domain).
"""

import numpy as np
import pytest

from fenchel_cvx.backends import BackendDefaults
from fenchel_cvx.bcd import fit_bcd
from fenchel_cvx.blocks import BlockResult
from fenchel_cvx.errors import CertificateError
from fenchel_cvx.fast import FastBackend
from fenchel_cvx.network import LiftedNetwork
from fenchel_cvx.oracle import OracleBackend

# 4-5-4-3: every kind of block, named as the driver names it; the faulty block is the first of
# its kind in the sweep (X_L, ..., X_1, then W_L, ..., W_0)
FIRST = {"x_last": "X_2", "x_hidden": "X_1", "w_last": "W_2", "w_hidden": "W_1"}
FAULTS = [1e-1, 1e-3, "nan"]
BACKENDS = {
    "oracle": lambda: OracleBackend(tol=1e-6),
    "fast": lambda: FastBackend(tol=1e-6, max_iter=2000),
}


class Faulty(BackendDefaults):
    """A real backend whose argmin for blocks of ``kind`` is corrupted; the report is kept."""

    def __init__(self, inner, kind, fault, seed=0):
        self.inner, self.kind, self.fault = inner, kind, fault
        self.rng = np.random.default_rng(seed)
        self.name = f"faulty-{getattr(inner, 'name', 'backend')}"

    def solve(self, block, start=None):
        res = self.inner.solve(block, start)
        if block.kind != self.kind:
            return res
        Z = np.asarray(res.argmin, dtype=float)
        if self.fault == "nan":
            Z = np.full_like(Z, np.nan)
        else:
            Z = Z + self.fault * self.rng.standard_normal(Z.shape)
        return BlockResult(
            Z,
            res.value,
            res.status,
            res.residual,
            res.seconds,
            res.iterations,
            res.converged,
            dict(res.info),
        )


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(3)
    X = rng.standard_normal((4, 24))
    Y = np.eye(3)[:, rng.integers(0, 3, 24)]
    return X, Y


def net():
    return LiftedNetwork([4, 5, 4, 3], "relu", "mse", lam=1.0, rho=0.1, seed=0)


@pytest.mark.parametrize("backend", sorted(BACKENDS))
@pytest.mark.parametrize("fault", FAULTS, ids=str)
@pytest.mark.parametrize("kind", sorted(FIRST))
def test_fault_is_caught_by_name_in_strict_mode(data, backend, fault, kind):
    X, Y = data
    faulty = Faulty(BACKENDS[backend](), kind, fault)
    with pytest.raises(CertificateError) as err:
        fit_bcd(net(), X, Y, iterations=2, backend=faulty, strict=True)
    e = err.value
    assert (e.check, e.layer, e.iteration) == ("block_optimality", FIRST[kind], 1)
    assert FIRST[kind] in str(e) and "iteration 1" in str(e)


@pytest.mark.parametrize("backend", sorted(BACKENDS))
@pytest.mark.parametrize("fault", FAULTS, ids=str)
@pytest.mark.parametrize("kind", sorted(FIRST))
def test_fault_is_recorded_against_its_block(data, backend, fault, kind):
    X, Y = data
    network = net()
    faulty = Faulty(BACKENDS[backend](), kind, fault)
    res = fit_bcd(network, X, Y, iterations=2, backend=faulty, strict=False)  # no exception
    h = res.history
    first = h.violations[0]
    assert (first["check"], first["layer"], first["iteration"]) == (
        "block_optimality",
        FIRST[kind],
        1,
    )
    assert all(np.all(np.isfinite(W)) for W in network.W)
    assert all(np.all(np.isfinite(A)) for A in res.Xs)
    if fault == "nan":
        # unusable point: the block kept its value and the run stopped after that round
        assert len(h) == 1 and h[0]["halted"] == FIRST[kind]
        assert "NaN" in first["detail"]
        failed = [b for b in h[0]["blocks"] if b["block"] == FIRST[kind]]
        assert failed and failed[0]["residual"] is None
    else:
        # a finite perturbed point either leaves the domain (stop at once) or is recorded and
        # the run goes on; every block of that kind is recorded in every round it ran
        assert h[0]["halted"] in (None, FIRST[kind])
        if h[0]["halted"] is None:
            assert len(h) == 2
            named = {
                (v["layer"], v["iteration"])
                for v in h.violations
                if v["check"] == "block_optimality"
            }
            assert (FIRST[kind], 2) in named


def test_capped_blocks_are_marked_and_excused_only_for_their_cap(data):
    """A block stopped at the step cap it was given fails block optimality by design: the
    driver marks that violation ``capped`` (asking the backend's own ``step_setting``), and
    ``held_but_capped`` holds where nothing else failed. A capped block whose argmin is
    unusable is not excused; a run to tol has no capped violation."""
    X, Y = data
    capped = FastBackend(w_steps=1, x_steps=1)
    h = fit_bcd(
        net(), X, Y, batch_size=12, epochs=2, gamma=1.0, backend=capped, strict=False
    ).history
    assert h.violations and not h.certificate_held and h.held_but_capped
    assert all(v["capped"] and v["check"] == "block_optimality" for v in h.violations)
    assert "capped block solves (inexact by design)" in repr(h)
    exact = fit_bcd(
        net(),
        X,
        Y,
        batch_size=12,
        epochs=2,
        gamma=1.0,
        backend=FastBackend(tol=1e-6, max_iter=2000),
        strict=False,
    ).history
    assert exact.certificate_held and exact.held_but_capped and "capped" not in repr(exact)
    faulty = Faulty(FastBackend(w_steps=1, x_steps=1), "w_hidden", "nan")
    faulty.step_setting = faulty.inner.step_setting  # the caps are known, the point is unusable
    h = fit_bcd(
        net(), X, Y, batch_size=12, epochs=1, gamma=1.0, backend=faulty, strict=False
    ).history
    bad = [v for v in h.violations if "NaN" in v["detail"]]
    assert bad and not bad[0]["capped"] and not h.held_but_capped
    # a block stopped by the loop's own iteration cap, with no step cap given, is not excused
    short = fit_bcd(
        net(),
        X,
        Y,
        batch_size=12,
        epochs=1,
        gamma=1.0,
        strict=False,
        backend=FastBackend(tol=1e-12, max_iter=1),
    ).history
    assert short.violations and not any(v["capped"] for v in short.violations)
    assert not short.held_but_capped


class _OnStrict(BackendDefaults):
    """A fast backend whose block of ``kind`` returns NaN from the round ``at`` on, in the
    blocks' own library (array_api_strict here: its argmin checks are read once per round)."""

    def __init__(self, inner, kind, at, status=None):
        self.inner, self.kind, self.at, self.round, self.status = inner, kind, at, 0, status
        self.step_setting, self.name = self.inner.step_setting, "faulty-fast"

    def solve(self, block, start=None):
        res = self.inner.solve(block, start)
        self.round += block.kind == "x_last"  # X_L opens every round
        if block.kind != self.kind or self.round < self.at:
            return res
        Z = res.argmin * float("nan")
        status, converged = (
            (res.status, res.converged) if self.status is None else (self.status, False)
        )
        return BlockResult(
            Z,
            res.value,
            status,
            res.residual,
            res.seconds,
            res.iterations,
            converged,
            dict(res.info),
        )


@pytest.mark.parametrize("strict,status", [(False, None), (True, None), (True, "max_iter")])
@pytest.mark.parametrize("kind", ["x_hidden", "w_last", "w_hidden"])
def test_argmin_checks_read_at_a_rounds_end_reach_the_same_verdict(data, kind, strict, status):
    """Off NumPy an unchecked round reads its blocks' argmin checks once, at its end: a NaN
    argmin in its middle fails that block by name, and the round goes back to where that block
    began, as the checks read after every block (NumPy) do: the same weights, the same records.
    (Strict: blocks solved to tol, whose statuses pass, or the faulty one reporting a failed
    status as well; recorded: capped ones.)"""
    xps = pytest.importorskip("array_api_strict")
    X, Y = data
    out = {}
    for name, lib in (("numpy", np), ("strict", xps)):
        model = net()
        model.W = [lib.asarray(W) for W in model.W]
        inner = (
            FastBackend(tol=1e-6, max_iter=2000) if strict else FastBackend(w_steps=1, x_steps=2)
        )
        kw = dict(
            batch_size=12,
            epochs=2,
            gamma=1.0,
            backend=_OnStrict(inner, kind, 3, status),
            strict=strict,
            check_every=4,
            eval_every=None,
        )
        if strict:
            with pytest.raises(CertificateError, match=f"iteration 3, layer {FIRST[kind]}"):
                fit_bcd(model, lib.asarray(X), lib.asarray(Y), **kw)
            out[name] = ([np.asarray(W) for W in model.W], None)
        else:
            h = fit_bcd(model, lib.asarray(X), lib.asarray(Y), **kw).history
            out[name] = ([np.asarray(W) for W in model.W], h)
    (W_np, h_np), (W_st, h_st) = out["numpy"], out["strict"]
    assert all(np.allclose(a, b, rtol=1e-12, atol=1e-14) for a, b in zip(W_np, W_st))
    if not strict:
        assert len(h_st) == 3 and h_st[2]["halted"] == FIRST[kind] == h_np[2]["halted"]
        assert [b["block"] for b in h_st[2]["blocks"]] == [b["block"] for b in h_np[2]["blocks"]]
        assert [v["layer"] for v in h_st[2]["certificate"]["violations"]] == [
            v["layer"] for v in h_np[2]["certificate"]["violations"]
        ]
        for a, b in zip(h_st[2]["blocks"], h_np[2]["blocks"]):
            assert a["status"] == b["status"]
            assert (a["value_after"] is None) == (b["value_after"] is None)
            if a["value_after"] is not None:
                assert a["value_after"] == pytest.approx(b["value_after"], rel=1e-12, nan_ok=True)
