"""The X-sweep's order (``fit_bcd(x_sweep=...)``): backward, X_L, ..., X_1 (Algorithms 1 and 2),
or forward, X_1, ..., X_L, where each block sees the X below it just solved."""

import dataclasses

import numpy as np
import pytest

from fenchel_cvx import rounds
from fenchel_cvx.bcd import fit_bcd
from fenchel_cvx.fast import FastBackend
from fenchel_cvx.network import LiftedNetwork


def _data(m=48, p=6, k=3, seed=0):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(p, m)), np.eye(k)[:, rng.integers(0, k, size=m)]


def _net():
    return LiftedNetwork([6, 7, 5, 3], "relu", "cross_entropy", lam=1.0, rho=0.01, seed=4)


def _fit(order, backend=None, **kw):
    X, Y = _data()
    fit = dict(batch_size=16, epochs=2, gamma=1.0, eval_every=None, x_sweep=order, strict=True)
    backend = backend or FastBackend(max_iter=5000)  # every block to tolerance
    return fit_bcd(_net(), X, Y, backend=backend, **{**fit, **kw})


@pytest.mark.parametrize("backend", ["cvxpy", "fast"])
@pytest.mark.parametrize("order", ["backward", "forward"])
def test_each_order_solves_the_x_blocks_in_turn_under_the_whole_certificate(order, backend):
    res = _fit(order, backend=None if backend == "fast" else backend)
    assert res.history.certificate_held and res.history.config["x_sweep"] == order
    names = [b["block"] for b in res.history[0]["blocks"]]
    x = ["X_2", "X_1"] if order == "backward" else ["X_1", "X_2"]
    assert names == x + ["W_2", "W_1", "W_0"]
    for r in res.history:  # the lower bound, eq. (8), after the X-sweep
        assert r["lifted_x"] <= r["network_x"] + 1e-9


def test_the_orders_are_two_algorithms():
    backward, forward = _fit("backward"), _fit("forward")
    assert not all(np.allclose(a, b) for a, b in zip(backward.net.W, forward.net.W))


class Lying(FastBackend):
    """Reports an X-block's image A(W, Z) + b off by 1 (a solver's report, never checked)."""

    def solve(self, block, start=None):
        res = super().solve(block, start)
        if block.kind.startswith("x") and res.U is not None:
            res = dataclasses.replace(res, U=res.U + 1.0)
        return res


@pytest.mark.parametrize("check_every", [1, 2])
def test_a_checked_round_hands_the_next_x_block_the_checks_image_not_the_solvers(
    monkeypatch, check_every
):
    """Forward, X_l's block takes U_{l-1} at the X_{l-1} just solved: on checked rounds the
    check's image of it (a solver's report, here off by 1, never enters a checked round's
    block), on the others the solver's."""
    seen, original = [], rounds.x_block

    def spy(net, X0, Y, Xs, l, U_prev=None):
        if l > 1:
            seen.append(np.max(np.abs(U_prev - net.pre_activation(l - 1, Xs[l - 2]))))
        return original(net, X0, Y, Xs, l, U_prev=U_prev)

    monkeypatch.setattr(rounds, "x_block", spy)
    _fit("forward", backend=Lying(w_steps=3, x_steps=5), strict=False, check_every=check_every)
    assert len(seen) == 6  # X_2 in each of the 6 rounds
    # rounds 1, 3, 5 are unchecked with check_every=2 (round 6, the last, is checked)
    lied = [False] * 6 if check_every == 1 else [True, False, True, False, True, False]
    assert [bool(d > 0.5) for d in seen] == lied


def test_an_unknown_order_is_refused_by_name():
    with pytest.raises(ValueError, match="x_sweep"):
        _fit("sideways")


def test_resume_refuses_another_order(tmp_path):
    _fit("backward", checkpoint=tmp_path, callback=lambda net, rec: rec["iteration"] >= 2)
    with pytest.raises(ValueError, match="x_sweep"):
        _fit("forward", resume=tmp_path)
