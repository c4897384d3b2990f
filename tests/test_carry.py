"""W_0 X~_0 carried from a round's W-sweep to the next round (``pre_activations.py``).

Where every round sees the same data, a round takes the image W_0's block left (the check's exact
one, or its solver's updated one on unchecked rounds) instead of forming the product again: these
tests check when it does and does not, that the run is the same up to rounding, and that a run
resumed from a checkpoint takes the same images as the uninterrupted one.
"""

import json

import numpy as np
import pytest

import _history_cases as cases
from fenchel_cvx import pre_activations, rounds
from fenchel_cvx.bcd import fit_bcd
from fenchel_cvx.blocks import w_block
from fenchel_cvx.checkpoints import load_checkpoint
from fenchel_cvx.errors import FileFormatError
from fenchel_cvx.fast import FastBackend
from fenchel_cvx.io import write_npz
from fenchel_cvx.network import LiftedNetwork


def _data(m=60, p=8, k=3, seed=0):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(p, m)), np.eye(k)[:, rng.integers(0, k, size=m)]


def _net():
    return LiftedNetwork([8, 12, 3], activation="relu", loss="mse", lam=0.5, rho=0.1, seed=0)


def _backend():  # Figure 1's kind of FLN round: capped blocks that report nothing
    return FastBackend(w_steps=2, x_steps=3, capped_residual=False, capped_value=False)


#: one batch of all the data every round (Figure 1's ``restart=True``), checked every third
RESTART = dict(epochs=7, gamma=0.0, check_every=3)


def _fit(net, X, Y, **kw):
    return fit_bcd(net, X, Y, backend=_backend(), **{"batch_size": X.shape[1], **RESTART, **kw})


@pytest.fixture
def taken(monkeypatch):
    """Per round: the steps of the U_0 it took from the round before (None: none taken)."""
    seen = []

    class Spy(pre_activations.PreActivations):
        def __init__(self, net, check, carried=None, threads=1):
            super().__init__(net, check, carried, threads)
            seen.append(None if self.get(0) is None else self.steps(0))

    monkeypatch.setattr(rounds, "PreActivations", Spy)
    return seen


def _take_none(monkeypatch):
    """Every round forms its own U_0: none is taken from the round before."""
    original = pre_activations.PreActivations.__init__
    monkeypatch.setattr(
        pre_activations.PreActivations,
        "__init__",
        lambda self, net, check, carried=None, threads=1: original(self, net, check, None, threads),
    )


def test_a_round_takes_the_image_of_the_round_before_where_its_checks_allow(taken):
    X, Y = _data()
    res = _fit(_net(), X, Y, eval_every=None)
    checked = [r["checked"] for r in res.history]
    assert checked == [False, False, True, False, False, True, True]  # every 3rd and the last
    # round 1 has none; a checked round takes only the exact image a check formed (after a
    # checked round: rounds 4 and 7), an unchecked one the solver's too (2 W-steps a round)
    assert taken == [None, 2, None, 0, 2, None, 0]
    assert res.history.held_but_capped


def test_the_run_is_the_one_without_the_carry_up_to_rounding(monkeypatch, taken):
    X, Y = _data()
    carried = _fit(_net(), X, Y)
    assert taken.count(None) == 3
    _take_none(monkeypatch)
    taken.clear()
    fresh = _fit(_net(), X, Y)
    assert taken == [None] * 7
    for A, B in zip(carried.net.W, fresh.net.W):
        assert np.allclose(A, B, rtol=1e-9, atol=1e-12)
    a, b = ([r["lifted_w"] for r in res.history if r["checked"]] for res in (carried, fresh))
    assert len(a) == 3 and a == pytest.approx(b, rel=1e-9)


@pytest.mark.parametrize(
    "kw",
    [dict(batch_size=20, epochs=2), dict(momentum=0.5)],
    ids=["batches", "momentum"],
)
def test_no_image_is_taken_across_batches_or_after_momentum_moved_W(taken, kw):
    X, Y = _data()
    res = _fit(_net(), X, Y, **kw)
    assert taken == [None] * len(res.history) and res.history.held_but_capped


def test_the_solver_reports_the_image_of_its_argmin_where_asked():
    X, Y = _data()
    net = _net()
    Xs = net.forward(X)[0]
    Xs[0] = Xs[0] + 0.1  # away from the feed-forward point: W_0's block has somewhere to go
    block = w_block(net, X, Y, Xs, 0, gamma=0.0)
    res = _backend().solve(block, start=net.W[0], return_image=True)
    assert res.status == "max_iter" and res.U is not None
    assert np.allclose(res.U, block.forward(res.argmin), rtol=1e-12, atol=1e-12)
    # not asked (a batch's W-blocks): the last step forms no image that nobody takes
    unasked = _backend().solve(w_block(net, X, Y, Xs, 0, gamma=0.0), start=net.W[0])
    assert unasked.U is None and np.array_equal(unasked.argmin, res.argmin)


def _stop_after(n):
    return lambda net, rec: rec["iteration"] >= n


@pytest.mark.parametrize("stop", [1, 2, 3])  # after an unchecked round (solver's image), a checked
def test_a_run_resumed_from_a_checkpoint_is_bit_identical(tmp_path, stop):
    X, Y = _data()
    whole = _fit(_net(), X, Y)
    _fit(_net(), X, Y, checkpoint=tmp_path, callback=_stop_after(stop))
    arrays, meta = load_checkpoint(tmp_path)
    assert ("U_0" in arrays) and meta["carried_steps"] == (0 if stop == 3 else 2 * stop)
    resumed = _fit(_net(), X, Y, resume=tmp_path)
    assert all(np.array_equal(A, B) for A, B in zip(resumed.net.W, whole.net.W))
    history = [json.dumps(cases.strip_timings(r.history.to_dict())) for r in (resumed, whole)]
    assert history[0] == history[1]  # (as text: a NaN equals itself)


@pytest.mark.parametrize(
    "bad, field",
    [
        (dict(carried_steps=pre_activations.RESYNC), "meta.carried_steps"),
        (dict(carried_steps="2"), "meta.carried_steps"),
        (dict(carried_steps=None, keep_U=True), "U_0"),
        (dict(U_0=np.zeros((5, 60))), "U_0"),
    ],
    ids=["too-many-steps", "not-an-integer", "image-without-steps", "wrong-shape"],
)
def test_a_checkpoint_with_a_bad_carried_image_is_refused_by_name(tmp_path, bad, field):
    X, Y = _data()
    _fit(_net(), X, Y, checkpoint=tmp_path, callback=_stop_after(1))
    arrays, meta = load_checkpoint(tmp_path)
    bad = dict(bad)
    bad.pop("keep_U", None)
    if "U_0" in bad:
        arrays["U_0"] = bad.pop("U_0")
    meta.update(bad)
    write_npz(tmp_path / "checkpoint.npz", arrays, meta)
    with pytest.raises(FileFormatError, match=field):
        load_checkpoint(tmp_path)


def _round_flops(monkeypatch, carried):
    """The matrix products (flops, by function) of round 2 of Algorithm 1 on array_api_strict
    arrays: capped fast blocks, the certificate every third round (round 2 unchecked)."""
    import array_api_strict as xps

    from fenchel_cvx.fast.reads import flops_by_round

    if not carried:
        _take_none(monkeypatch)
    X, Y = _data(m=600, p=40, k=10, seed=3)
    net = LiftedNetwork([40, 30, 10], "relu", "mse", lam=0.1, rho=1.0, seed=0)
    rounds = flops_by_round(
        net, xps.asarray(X), xps.asarray(Y), iterations=3, check_every=3, backend=_backend()
    )
    return rounds[1][1]


def test_an_algorithm_1_round_forms_W0_X0_once_and_not_at_all_from_the_round_before(monkeypatch):
    """Algorithm 1 on carried-over X: J, F's divergences, X_1's block and W_0's block take one
    W_0 X~_0, which the driver forms where the round before left none it may take."""
    w0 = 2 * 30 * 40 * 600  # one product W_0 X~_0 (the bias is added, not multiplied)
    taken = _round_flops(monkeypatch, carried=True)
    monkeypatch.undo()
    formed = _round_flops(monkeypatch, carried=False)
    assert sum(formed.values()) - sum(taken.values()) == w0
    # the driver's products (the network's maps): W_0 X~_0 once, then only W_1's, far smaller
    driver = sum(n for f, n in formed.items() if f.startswith("fenchel_cvx.layers"))
    assert w0 <= driver < 2 * w0
