"""Momentum across batches: ``fit_bcd(momentum=beta)`` extrapolates W where W0 is set."""

import json

import numpy as np
import pytest

import _history_cases as cases
from fenchel_cvx import lenet5
from fenchel_cvx.bcd import fit_bcd
from fenchel_cvx.checkpoints import load_checkpoint
from fenchel_cvx.network import LiftedNetwork


def _net(seed=1):
    return LiftedNetwork([6, 5, 4, 3], "relu", "cross_entropy", lam=1.0, rho=0.01, seed=seed)


def test_each_batch_starts_from_the_extrapolated_weights(tmp_path):
    """W0 of batch b + 1 (the proximal centre, the blocks' start and the feed-forward weights)
    is W_b + beta_l (W_b - W_{b-1}), W_b the weights batch b ended with and W_0 the initial
    ones; a layer with beta_l = 0 starts where it ended."""
    X, Y = cases.case_data()
    beta = [0.5, 0.0, 0.9]
    net = _net()
    ended, centres = [[np.array(W) for W in net.W]], []

    def spy(net_, rec):
        arrays, _ = load_checkpoint(tmp_path)
        if rec["alternation"] == 1:
            centres.append([arrays[f"W0_{l}"] for l in range(3)])
        if rec["alternation"] == 2:
            ended.append([np.array(W) for W in net_.W])

    fit_bcd(
        net,
        X,
        Y,
        batch_size=10,
        epochs=2,
        alternations=2,
        gamma=0.5,
        momentum=beta,
        backend="fast",
        checkpoint=tmp_path,
        checkpoint_every=1,
        callback=spy,
    )
    assert len(centres) == len(ended) - 1 == 8
    np.testing.assert_array_equal(centres[0][0], ended[0][0])  # the first batch: no history
    for b in range(1, 8):
        for l in range(3):
            want = ended[b][l] + beta[l] * (ended[b][l] - ended[b - 1][l])
            np.testing.assert_allclose(centres[b][l], want, rtol=1e-13, atol=1e-15)
    assert not np.array_equal(centres[3][0], ended[3][0])  # it did move
    np.testing.assert_array_equal(net.W[0], ended[-1][0])  # the result: the last solve


def test_zero_momentum_is_the_papers_algorithm(tmp_path):
    """beta = 0 extrapolates nothing and keeps no W_prev (the pinned histories of
    tests/test_resume.py are the paper's algorithms, run with the default 0)."""
    X, Y = cases.case_data()
    a, b = _net(), _net()
    fit_bcd(a, X, Y, batch_size=10, epochs=1, gamma=0.5, backend="fast")
    fit_bcd(
        b,
        X,
        Y,
        batch_size=10,
        epochs=1,
        gamma=0.5,
        momentum=[0.0, 0.0, 0.0],
        backend="fast",
        checkpoint=tmp_path,
    )
    for Wa, Wb in zip(a.W, b.W):
        np.testing.assert_array_equal(Wa, Wb)
    arrays, meta = load_checkpoint(tmp_path)
    assert not [k for k in arrays if k.startswith("W_prev")]
    assert meta["history"]["config"]["momentum"] == [0.0, 0.0, 0.0]


def test_a_checkpoint_from_before_momentum_resumes(tmp_path):
    """A checkpoint whose config has no momentum (written before it existed) is a run with 0."""
    from fenchel_cvx.checkpoints import CHECKPOINT_FORMAT, checkpoint_path
    from fenchel_cvx.io import read_npz, write_npz

    whole = cases.record(cases.run_case("alg2_ce_alternations"))
    cases.run_case(
        "alg2_ce_alternations", checkpoint=tmp_path, callback=lambda net, rec: rec["iteration"] >= 3
    )
    arrays, meta = read_npz(checkpoint_path(tmp_path), CHECKPOINT_FORMAT)
    del meta["history"]["config"]["momentum"]
    write_npz(checkpoint_path(tmp_path), arrays, meta)
    resumed = cases.record(cases.run_case("alg2_ce_alternations", resume=tmp_path))
    assert resumed["weights"] == whole["weights"]
    with pytest.raises(ValueError, match=r"momentum=\[0.5, 0.5\] \(checkpoint: \[0.0, 0.0\]\)"):
        cases.run_case("alg2_ce_alternations", momentum=0.5, resume=tmp_path)


@pytest.mark.parametrize("stop", [3, 4])  # inside a batch; at a batch's end, before extrapolating
def test_stop_then_resume_is_bit_identical(tmp_path, stop):
    whole = cases.record(cases.run_case("alg2_ce_alternations", momentum=0.7))
    cases.run_case(
        "alg2_ce_alternations",
        momentum=0.7,
        checkpoint=tmp_path,
        checkpoint_every=1,
        callback=lambda net, rec: rec["iteration"] >= stop,
    )
    arrays, _ = load_checkpoint(tmp_path)
    assert "W_prev_0" in arrays
    resumed = cases.run_case("alg2_ce_alternations", momentum=0.7, resume=tmp_path)
    assert cases.record(resumed) == whole
    assert whole["history"]["config"]["momentum"] == [0.7, 0.7]


class _Interrupting:
    """The fast backend, but Ctrl-C arrives inside solve number ``at``."""

    def __init__(self, at):
        from fenchel_cvx import defaults
        from fenchel_cvx.backends import get_backend

        self.inner, self.at, self.calls = get_backend("fast", tol=defaults.TOL), at, 0

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def solve(self, block, start):
        self.calls += 1
        if self.calls == self.at:
            raise KeyboardInterrupt
        return self.inner.solve(block, start)


# 3 solves a round (X_1, W_1, W_0), 2 rounds a batch: solve 5 is inside batch 1's second round,
# 7 opens batch 2 (just extrapolated), 11 is inside batch 2's second round
@pytest.mark.parametrize("at", [5, 7, 11])
def test_ctrl_c_inside_a_round_then_resume_is_bit_identical(tmp_path, at):
    """Ctrl-C inside a round saves the last finished round: the extrapolation of an unfinished
    batch is done again on resume, from the same W_prev."""
    whole = cases.record(cases.run_case("alg2_ce_alternations", momentum=0.7))
    with pytest.raises(KeyboardInterrupt):
        cases.run_case(
            "alg2_ce_alternations", momentum=0.7, checkpoint=tmp_path, backend=_Interrupting(at)
        )
    assert load_checkpoint(tmp_path)[1]["iteration"] == (at - 1) // 3  # the rounds finished
    resumed = cases.run_case("alg2_ce_alternations", momentum=0.7, resume=tmp_path)
    assert cases.record(resumed) == whole


def test_resume_refuses_another_momentum(tmp_path):
    cases.run_case(
        "alg2_ce_alternations",
        momentum=0.7,
        checkpoint=tmp_path,
        callback=lambda net, rec: rec["iteration"] >= 2,
    )
    with pytest.raises(ValueError, match=r"momentum=\[0.5, 0.5\] \(checkpoint: \[0.7, 0.7\]\)"):
        cases.run_case("alg2_ce_alternations", momentum=0.5, resume=tmp_path)


@pytest.mark.parametrize(
    "momentum, message",
    [
        (1.0, r"momentum must be a number in \[0, 1\), got 1.0"),
        (-0.1, r"momentum must be a number in \[0, 1\), got -0.1"),
        ([0.5, 0.5], r"momentum must be a number or a sequence of 3 numbers"),
        ("0.5", r"momentum must be a number or a sequence of 3 numbers"),
        (float("nan"), r"momentum must be a number in \[0, 1\), got nan"),
    ],
)
def test_bad_momentum_is_named_before_any_work(momentum, message):
    X, Y = cases.case_data()
    net = _net()
    W = [np.array(Wl) for Wl in net.W]
    with pytest.raises(ValueError, match=message):
        fit_bcd(net, X, Y, batch_size=10, momentum=momentum, backend="fast")
    assert all(np.array_equal(a, b) for a, b in zip(W, net.W))


def test_the_certificate_holds_with_momentum():
    """Every block is the same convex problem from an extrapolated start: the oracle, strict,
    finishes; the fast backend on a small LeNet-5 records no violation on any checked round."""
    X, Y = cases.case_data()
    fit_bcd(
        _net(), X, Y, batch_size=20, epochs=2, gamma=0.5, momentum=0.9, backend="cvxpy", strict=True
    )
    # Algorithm 1: every iteration extrapolates and X carries over; the restart rule sends X
    # back to the feed-forward point where the extrapolated W made the old X worse
    net = LiftedNetwork([6, 5, 4, 3], "relu", "cross_entropy", lam=10.0, rho=0.01, seed=1)
    res = fit_bcd(net, X, Y, iterations=12, gamma=0.5, momentum=0.99, backend="fast", strict=True)
    assert all(rec["certificate"]["held"] for rec in res.history.records)
    assert any(rec["certificate"]["restarted"] for rec in res.history.records)
    rng = np.random.default_rng(0)
    net = lenet5(input_shape=(1, 28, 28), loss="cross_entropy", seed=0)
    X0 = rng.random((784, 60))
    Y0 = np.eye(10)[:, rng.integers(0, 10, 60)]
    res = fit_bcd(
        net,
        X0,
        Y0,
        batch_size=20,
        epochs=2,
        gamma=[1e-4, 1e-2, 0.3, 0.3, 1],
        momentum=[0.98, 0.98, 0.3, 0.3, 0],
        backend="fast",
        strict=True,
    )
    assert all(
        rec["certificate"]["held"] and rec["certificate"]["checked"] for rec in res.history.records
    )


def test_runs_on_successive_batches_are_one_run():
    """Each batch its own ``fit_bcd`` call, given the last one's ``BCDResult.W_prev``: the
    same weights as one run over those batches in the same order (to rounding: one run gathers
    the batch's columns itself; without momentum the two differ by 4e-15 too)."""
    from fenchel_cvx.datasets import batch_order

    X, Y = cases.case_data()
    beta = [0.5, 0.0, 0.9]
    kw = dict(alternations=2, gamma=0.5, momentum=beta, backend="fast")
    whole, parts = _net(), _net()
    res = fit_bcd(whole, X, Y, batch_size=10, epochs=2, **kw)
    W_prev = None
    for batches in batch_order(X.shape[1], 10, 2, seed=parts.seed):
        for idx in batches:
            res_b = fit_bcd(parts, X[:, idx], Y[:, idx], batch_size=10, W_prev=W_prev, **kw)
            W_prev = res_b.W_prev
    for a, b in [*zip(whole.W, parts.W), *zip(res.W_prev, W_prev)]:
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-13)
    # without it every call starts afresh: no extrapolation at all
    fresh = _net()
    for batches in batch_order(X.shape[1], 10, 2, seed=fresh.seed):
        for idx in batches:
            fit_bcd(fresh, X[:, idx], Y[:, idx], batch_size=10, **kw)
    assert np.abs(fresh.W[0] - whole.W[0]).max() > 1e-4
    assert fit_bcd(_net(), X, Y, batch_size=10, gamma=0.5, backend="fast").W_prev is None
    # the history says which runs went on along an earlier run's last change
    assert res_b.history.config["momentum_carried"] and not res.history.config["momentum_carried"]


def test_a_run_given_W_prev_resumes_from_its_checkpoint(tmp_path):
    """A run given ``W_prev`` that writes checkpoints is resumed without it (the checkpoint
    holds its own), to the same weights as the run left alone."""
    X, Y = cases.case_data()
    kw = dict(batch_size=10, epochs=2, gamma=0.5, momentum=[0.5, 0.0, 0.9], backend="fast")
    W_prev = fit_bcd(
        _net(),
        X[:, :10],
        Y[:, :10],
        batch_size=10,
        gamma=0.5,
        momentum=[0.5, 0.0, 0.9],
        backend="fast",
    ).W_prev
    whole = _net()
    fit_bcd(whole, X, Y, W_prev=W_prev, **kw)
    parts = _net()
    fit_bcd(
        parts,
        X,
        Y,
        W_prev=W_prev,
        checkpoint=tmp_path,
        callback=lambda net, rec: rec["iteration"] >= 3,
        **kw,
    )
    res = fit_bcd(parts, X, Y, resume=tmp_path, checkpoint=tmp_path, **kw)
    assert res.history.config["momentum_carried"]  # the history the checkpoint began
    for a, b in zip(whole.W, parts.W):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-13)


@pytest.mark.parametrize(
    "W_prev, message",
    [
        (
            [np.zeros((5, 7))],
            r"W_prev must be a sequence of 3 arrays \(one per layer, as "
            r"BCDResult.W_prev\), got 1 entries",
        ),
        ("W", r"W_prev must be a sequence of 3 arrays .*, got str"),
        (
            [np.zeros((5, 7)), np.full((4, 6), np.inf), np.zeros((3, 4))],
            r"W_prev\[1\] must be finite, got NaN or infinite entries",
        ),
        (
            [np.zeros((5, 7)), np.zeros((4, 5)), np.zeros((3, 4))],
            r"W_prev\[1\] must have W_1's shape \(4, 6\), got \(4, 5\)",
        ),
        (
            [np.zeros((5, 7)), "x", np.zeros((3, 4))],
            r"W_prev\[1\] must be an array the data's library \(numpy\) can take, got builtins.str",
        ),
    ],
)
def test_bad_W_prev_is_named_before_any_work(W_prev, message):
    X, Y = cases.case_data()
    net = _net()
    W = [np.array(Wl) for Wl in net.W]
    with pytest.raises(ValueError, match=message):
        fit_bcd(net, X, Y, batch_size=10, momentum=0.5, W_prev=W_prev, backend="fast")
    assert all(np.array_equal(a, b) for a, b in zip(W, net.W))


def test_W_prev_and_resume_exclude_each_other(tmp_path):
    cases.run_case(
        "alg2_ce_alternations",
        momentum=0.5,
        checkpoint=tmp_path,
        callback=lambda net, rec: rec["iteration"] >= 2,
    )
    arrays, _ = load_checkpoint(tmp_path)
    W_prev = [arrays[f"W_prev_{l}"] for l in range(2)]
    with pytest.raises(ValueError, match="W_prev and resume exclude each other"):
        cases.run_case("alg2_ce_alternations", momentum=0.5, resume=tmp_path, W_prev=W_prev)


def test_partial_fit_carries_momentum_from_call_to_call(monkeypatch):
    """The estimator keeps the last change with its network and hands it to the next
    ``partial_fit`` call, which then extrapolates as one ``fit_bcd`` run would (that equality:
    ``test_runs_on_successive_batches_are_one_run``). Before, each call started afresh and
    momentum did nothing there."""
    from fenchel_cvx import estimator
    from fenchel_cvx.estimator import FenchelClassifier

    real, calls = estimator.fit_bcd, []

    def spy(*args, **kw):
        res = real(*args, **kw)
        calls.append((kw["W_prev"], res.W_prev))
        return res

    monkeypatch.setattr(estimator, "fit_bcd", spy)
    X, y = np.random.default_rng(0).normal(size=(120, 6)), np.arange(120) % 3
    fits = []
    for beta in (0.0, 0.9):
        clf = FenchelClassifier(hidden_layer_sizes=(8,), momentum=beta, random_state=0)
        for i in range(0, 120, 30):
            clf.partial_fit(X[i : i + 30], y[i : i + 30], classes=[0, 1, 2])
        fits.append(clf)
    assert not np.array_equal(fits[0].coefs_[0], fits[1].coefs_[0])
    zero, moving = calls[:4], calls[4:]
    assert all(given is None and back is None for given, back in zero)  # beta 0: none kept
    assert moving[0][0] is None and all(len(back) == 2 for _, back in moving)
    for (_, back), (given, _) in zip(moving, moving[1:]):  # handed on, as is
        assert all(a is b for a, b in zip(back, given))
    assert all(a is b for a, b in zip(moving[-1][1], fits[1]._W_prev))
    refit = fits[1].fit(X, y)  # a fresh fit forgets the last change
    assert calls[-1][0] is None
    new = FenchelClassifier(hidden_layer_sizes=(8,), momentum=0.9, random_state=0).fit(X, y)
    for a, b in zip(refit.coefs_, new.coefs_):
        np.testing.assert_array_equal(a, b)


def test_the_estimator_keeps_no_stale_W_prev(monkeypatch):
    """Ctrl-C inside a partial_fit, or early stopping that rewinds the network to an earlier
    epoch, leaves no W_prev: the next call must not extrapolate along a change the network
    no longer ends with."""
    from fenchel_cvx import estimator
    from fenchel_cvx.estimator import FenchelClassifier

    X, y = np.random.default_rng(0).normal(size=(120, 6)), np.arange(120) % 3
    clf = FenchelClassifier(
        hidden_layer_sizes=(8,),
        momentum=0.9,
        random_state=0,
        batch_size=20,
        epochs=2,
        warm_start=True,
    ).fit(X, y)
    assert clf._W_prev is not None
    real = estimator.fit_bcd

    def interrupt(net, rec):
        if rec["iteration"] == 3:
            raise KeyboardInterrupt

    monkeypatch.setattr(
        estimator, "fit_bcd", lambda *a, **k: real(*a, **{**k, "callback": interrupt})
    )
    with pytest.raises(KeyboardInterrupt):
        clf.fit(X, y)
    assert clf._W_prev is None and clf.coefs_ is clf.network_.W
    monkeypatch.setattr(estimator, "fit_bcd", real)
    stopped = FenchelClassifier(
        hidden_layer_sizes=(8,),
        momentum=0.9,
        random_state=0,
        early_stopping=True,
        batch_size=20,
        epochs=4,
    ).fit(X, y)
    rewound = stopped.best_validation_score_ != stopped.validation_scores_[-1]
    assert (stopped._W_prev is None) == rewound


def test_a_run_without_momentum_returns_no_W_prev():
    """With beta 0 nothing is extrapolated: a W_prev given is not handed back (a later run with
    momentum would extrapolate along a change many batches old)."""
    X, Y = cases.case_data()
    first = fit_bcd(_net(), X, Y, batch_size=10, gamma=0.5, momentum=0.5, backend="fast")
    again = fit_bcd(_net(), X, Y, batch_size=10, gamma=0.5, W_prev=first.W_prev, backend="fast")
    assert first.W_prev is not None and again.W_prev is None


def test_the_estimator_and_the_command_pass_it_on(tmp_path):
    from fenchel_cvx import cli
    from fenchel_cvx.estimator import FenchelClassifier

    X, y = np.random.default_rng(0).normal(size=(120, 6)), np.arange(120) % 3
    fits = [
        FenchelClassifier(
            hidden_layer_sizes=(8,), momentum=b, batch_size=20, epochs=2, random_state=0
        ).fit(X, y)
        for b in (0.0, [0.9, 0.0])
    ]
    assert fits[1].history_.config["momentum"] == [0.9, 0.0]
    assert not np.array_equal(fits[0].coefs_[0], fits[1].coefs_[0])
    code = cli.main(
        [
            "train",
            "--backend",
            "fast",
            "--batch-size",
            "100",
            "--train-size",
            "300",
            "--momentum",
            "0.8",
            "--quiet",
            "--out",
            str(tmp_path / "run"),
        ]
    )
    assert code == 0
    history = json.loads((tmp_path / "run" / "history.json").read_text())
    assert history["config"]["momentum"] == [0.8, 0.8]
