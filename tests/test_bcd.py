"""The BCD driver (Algorithms 1 and 2) on scikit-learn digits, its validation, history and plots.

The digits runs use the first 600 points of the training split (the same points for the lifted
network and for logistic regression) and the whole test split, so they finish in seconds.
"""

import json
import math

import numpy as np
import pytest
from sklearn.linear_model import LogisticRegression

from fenchel_cvx import bcd, evaluation
from fenchel_cvx.bcd import BACKENDS, BCDResult, fit_bcd, get_backend
from fenchel_cvx.blocks import w_block
from fenchel_cvx.datasets import batch_order, load_digits, one_hot
from fenchel_cvx.history import History
from fenchel_cvx.network import LiftedNetwork
from fenchel_cvx.oracle import OracleBackend
from fenchel_cvx.plotting import plot_accuracy, plot_objectives
from fenchel_cvx.predict import predict, predict_classes
from fenchel_cvx.run_settings import check_data

M_SUB = 600
M_CE = 200
PNG = b"\x89PNG\r\n\x1a\n"


class CountingOracle(OracleBackend):
    """The oracle, counting its solves."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.calls = 0

    def solve(self, block, start=None):
        self.calls += 1
        return super().solve(block, start)


@pytest.fixture(scope="module")
def digits():
    d = load_digits()
    X, y = d.X_train[:, :M_SUB], d.y_train[:M_SUB]
    lr = LogisticRegression(max_iter=5000).fit(X.T, y)
    return dict(
        X=X,
        y=y,
        Y=one_hot(y, 10),
        X_test=d.X_test,
        y_test=d.y_test,
        Y_test=one_hot(d.y_test, 10),
        lr_acc=lr.score(d.X_test.T, d.y_test),
    )


@pytest.fixture(scope="module")
def mse_run(digits):
    net = LiftedNetwork([64, 32, 10], "relu", "mse", lam=3.0, rho=1.0, seed=0)
    return fit_bcd(
        net,
        digits["X"],
        digits["Y"],
        iterations=3,
        X_test=digits["X_test"],
        Y_test=digits["Y_test"],
    )


# --- digits vs logistic regression -----------------------------------------------------------
def test_algorithm1_mse_digits_certified_and_beats_logistic_regression(digits, mse_run):
    h = mse_run.history
    assert isinstance(mse_run, BCDResult) and len(h) == 3
    assert h.config["strict"] is True and h.config["backend"] == "cvxpy"
    assert h.certificate_held  # strict: it would have raised otherwise
    assert h.last["test_accuracy"] >= digits["lr_acc"]
    assert h.last["test_accuracy"] > h.config["initial"]["test_accuracy"]
    F_x, J_x = h.series("lifted_x"), h.series("network_x")
    assert np.all(F_x <= J_x + 1e-6 * (np.abs(J_x) + 1))
    assert np.all(
        np.diff(h.series("network_x")) < 0
    )  # J went down here (not guaranteed in general)
    assert [b["block"] for b in h[0]["blocks"]] == ["X_1", "W_1", "W_0"]


@pytest.mark.slow
def test_algorithm1_cross_entropy_digits_certified_and_beats_logistic_regression(digits):
    # cross-entropy blocks are exponential-cone programs (slower): the first 200 points, both models
    X, y = digits["X"][:, :M_CE], digits["y"][:M_CE]
    lr_acc = (
        LogisticRegression(max_iter=5000).fit(X.T, y).score(digits["X_test"].T, digits["y_test"])
    )
    net = LiftedNetwork([64, 32, 10], "relu", "cross_entropy", lam=0.3, rho=0.3, seed=0)
    res = fit_bcd(
        net, X, one_hot(y, 10), iterations=5, X_test=digits["X_test"], Y_test=digits["Y_test"]
    )
    h = res.history
    assert h.certificate_held and h.config["loss"] == "cross_entropy" and len(h) == 5
    assert h.last["test_accuracy"] >= lr_acc


def test_algorithm2_mse_digits_certified_and_beats_logistic_regression(digits):
    net = LiftedNetwork([64, 32, 10], "relu", "mse", lam=3.0, rho=1.0, seed=0)
    res = fit_bcd(
        net,
        digits["X"],
        digits["Y"],
        batch_size=300,
        epochs=2,
        gamma=1.0,
        X_test=digits["X_test"],
        Y_test=digits["Y_test"],
    )
    h = res.history
    assert h.config["algorithm"] == 2 and len(h) == 4 and h.certificate_held
    assert [(r["epoch"], r["batch"], r["alternation"]) for r in h] == [
        (1, 1, 1),
        (1, 2, 1),
        (2, 1, 1),
        (2, 2, 1),
    ]
    assert all(r["m"] == 300 for r in h) and all(r["prox"] >= 0 for r in h)
    assert h.last["test_accuracy"] >= digits["lr_acc"]
    # Xs are the last batch's lifted variables, its columns in res.batch
    order = batch_order(M_SUB, 300, 2, seed=net.seed)
    np.testing.assert_array_equal(res.batch, order[-1][-1])
    assert res.Xs[0].shape == (32, 300)


def test_returned_iterate_can_be_rechecked(digits, mse_run):
    # W-blocks depend on X only, so after the last W-sweep all of them are optimal at (W, Xs)
    net, Xs = mse_run.net, mse_run.Xs
    for l in range(net.n_hidden + 1):
        blk = w_block(net, digits["X"], digits["Y"], Xs, l)
        assert blk.kkt_residual(net.W[l]) <= 1e-6
    assert net.lifted_objective(digits["X"], digits["Y"], Xs) == pytest.approx(
        mse_run.history.last["lifted_w"], rel=1e-12
    )


# --- Algorithm 2 details, backends ------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny(random_data):
    return random_data(m=30, seed=1)


def test_algorithm2_alternations_and_large_batch(tiny):
    X, Y = tiny
    net = LiftedNetwork([4, 6, 5, 3], "relu", "mse", lam=1.0, rho=0.1, seed=2)
    res = fit_bcd(net, X, Y, batch_size=12, epochs=2, alternations=3, gamma=[0.5, 0.5, 0.0])
    h = res.history
    assert len(h) == 2 * 3 * 3 and h.certificate_held
    assert [r["alternation"] for r in h[:3]] == [1, 2, 3]
    assert [r["m"] for r in h[:9]] == [12] * 6 + [6] * 3
    # batch_size > m is allowed: one batch of all the data per epoch
    res = fit_bcd(LiftedNetwork([4, 6, 5, 3], seed=2), X, Y, batch_size=1000, epochs=2)
    assert len(res.history) == 2 and res.history[0]["m"] == 30
    assert sorted(res.batch) == list(range(30))


@pytest.mark.parametrize("batch_size", [30, 1000])
def test_one_batch_of_all_the_data_is_the_data_in_order(tiny, batch_size):
    """batch_size >= m: every epoch trains on the data themselves, in their own order (the
    blocks get the caller's Y, not a permuted copy), so W_0's Gram factorisation, of an X~_0
    that never changes, is formed in the first epoch and reused by every later one."""
    from fenchel_cvx.fast import FastBackend

    factors, targets = [], []

    class Recording(FastBackend):
        def solve(self, block, start=None):
            res = super().solve(block, start)
            if block.kind == "w_hidden" and block.layer == 0:
                factors.append(res.info["cached_factor"])
            if block.kind in ("x_last", "w_last"):
                targets.append(block.Y is Y)
            return res

    X, Y = tiny
    sizes = dict(layer_sizes=[4, 6, 5, 3], activation="relu", loss="mse", lam=1.0, rho=0.1, seed=2)
    res = fit_bcd(
        LiftedNetwork(**sizes),
        X,
        Y,
        batch_size=batch_size,
        epochs=3,
        gamma=0.0,
        backend=Recording(w_steps=2, x_steps=3),
        strict=False,
    )
    assert len(res.history) == 3 and all(r["m"] == 30 for r in res.history)
    assert factors == [False, True, True]
    assert targets == [True] * 6
    np.testing.assert_array_equal(res.batch, np.arange(30))
    assert [s.columns.tolist() for s in bcd.schedule(30, batch_size, 2, None, 1, 0)] == [
        list(range(30))
    ] * 2
    # the same rounds as Algorithm 1 with every round restarted from the feed-forward point
    net = LiftedNetwork(**sizes)
    for _ in range(3):
        fit_bcd(net, X, Y, iterations=1, backend=FastBackend(w_steps=2, x_steps=3), strict=False)
    for W, Wr in zip(res.net.W, net.W):
        np.testing.assert_allclose(W, Wr, rtol=1e-12, atol=1e-14)


def test_algorithm2_cross_entropy_certified(tiny):
    X, Y = tiny
    net = LiftedNetwork([4, 6, 5, 3], "tanh", "cross_entropy", lam=1.0, rho=0.1, seed=0)
    res = fit_bcd(net, X, Y, batch_size=10, epochs=2, alternations=2, gamma=0.3)
    h = res.history
    assert len(h) == 12 and h.certificate_held and h.config["task"] == "classification"
    assert all(r["lifted_x"] <= r["network_x"] + 1e-6 * (abs(r["network_x"]) + 1) for r in h)


def test_fast_backend_same_driver_non_strict_by_default(tiny):
    X, Y = tiny
    net = LiftedNetwork([4, 6, 3], "relu", "cross_entropy", lam=1.0, rho=0.1, seed=0)
    res = fit_bcd(net, X, Y, iterations=2, backend="fast")
    h = res.history
    assert h.config["backend"] == "fast" and h.config["strict"] is False and len(h) == 2
    exact = fit_bcd(
        LiftedNetwork([4, 6, 3], "relu", "cross_entropy", lam=1.0, rho=0.1, seed=0),
        X,
        Y,
        iterations=2,
    )
    np.testing.assert_allclose(h.series("lifted_w"), exact.history.series("lifted_w"), rtol=1e-3)


def test_fresh_rounds_hand_the_feed_forward_products_to_the_blocks(tiny):
    """A batch's first round: X_l's U_{l-1} and W_0's W_0 X0~ come from the feed-forward pass
    (no product repeated), and so does X_l's A(W_l, X_l) at its start; later rounds' X-blocks
    compute their own, and their W_0 takes the W_0 X0~ the driver formed for J. W_l X~_l
    (l >= 1) comes from the X-sweep's solve of X_l in every round: the product its FISTA loop
    held at its point."""
    from fenchel_cvx.fast import FastBackend

    seen = []

    seen_x = []

    class Recording(FastBackend):
        def solve(self, block, start=None, image=None, return_image=False):
            hint = image
            if block.kind.startswith("w"):
                seen.append((block.layer, hint is not None))
                if hint is not None:  # the product the block would form itself, up to rounding
                    np.testing.assert_allclose(hint, start @ block.Xt, rtol=1e-12, atol=1e-12)
            else:
                seen_x.append((block.layer, hint is not None))
                if hint is not None:  # A(W, start) + b, as the block's own map gives it
                    np.testing.assert_allclose(hint, block.forward(start), rtol=1e-12, atol=1e-12)
            return super().solve(block, start, image, return_image)

    X, Y = tiny
    net = LiftedNetwork([4, 6, 5, 3], "relu", "mse", lam=1.0, rho=0.1, seed=2)
    ref = fit_bcd(
        LiftedNetwork([4, 6, 5, 3], "relu", "mse", lam=1.0, rho=0.1, seed=2),
        X,
        Y,
        batch_size=12,
        epochs=1,
        alternations=2,
        gamma=0.5,
        backend="fast",
    )
    res = fit_bcd(
        net, X, Y, batch_size=12, epochs=1, alternations=2, gamma=0.5, backend=Recording()
    )
    per_round = [seen[i : i + 3] for i in range(0, len(seen), 3)]
    assert len(per_round) == 3 * 2
    for k, blocks in enumerate(per_round):
        fresh = k % 2 == 0 or res.history[k]["restarted"]
        assert blocks == [(2, True), (1, True), (0, True)]
        assert seen_x[2 * k : 2 * k + 2] == [(2, fresh), (1, fresh)]
    for W, Wr in zip(res.net.W, ref.net.W):  # a hint changes no result (here: no rounding)
        np.testing.assert_array_equal(W, Wr)


def _round_figures(history):
    """Each round's checked figures and its blocks' values and residuals, as one list."""
    keys = ("network_x", "lifted_x", "lifted_w", "network_w", "divergence_x", "divergence_w")
    out = []
    for rec in history:
        for k in keys:
            out.extend(rec[k] if isinstance(rec[k], list) else [rec[k]])
        for b in rec["blocks"]:
            out.extend(b[k] for k in ("value_before", "value_after", "residual"))
    return np.array([math.nan if v is None else v for v in out], float)


def test_checked_rounds_reuse_their_products_to_the_same_figures(tiny, monkeypatch):
    """A checked round forms each pre-activation once (the driver's feed-forward pass, then each
    block's check of its argmin) and every figure and check reuses it: J, F before and after
    the W-sweep, the divergences, each block's value before and after and its KKT residual
    equal, to rounding, those of a round that forms each of them afresh; the iterates are
    the same. Two hidden layers, new and carried-over X (``alternations=2``)."""
    from fenchel_cvx.block_checks import CheckedSolves
    from fenchel_cvx.pre_activations import PreActivations

    def run():
        net = LiftedNetwork([4, 6, 5, 3], "relu", "mse", lam=1.0, rho=0.1, seed=2)
        X, Y = tiny
        return fit_bcd(net, X, Y, batch_size=12, epochs=2, alternations=2, gamma=0.5)

    with monkeypatch.context() as m:  # every product formed afresh where it is needed
        solve, feed_forward = CheckedSolves.solve, LiftedNetwork.feed_forward
        m.setattr(CheckedSolves, "solve", lambda self, *a: solve(self, *a[:5]))
        m.setattr(PreActivations, "form", lambda self, l, Xl: self.net.pre_activation(l, Xl))
        m.setattr(PreActivations, "on_pass", lambda self: [])
        m.setattr(
            LiftedNetwork,
            "feed_forward",
            lambda self, X0, Xt0=None, known=(), threads=1: feed_forward(self, X0, Xt0),
        )
        afresh = run()
    reused = run()
    assert all(rec["checked"] for rec in reused.history) and len(reused.history) == 12
    assert any(rec["network_x"] is not None for rec in reused.history)
    figures, expected = _round_figures(reused.history), _round_figures(afresh.history)
    assert figures.size == expected.size > 12 * 6
    np.testing.assert_allclose(figures, expected, rtol=1e-10, atol=1e-12)
    for W, Wr in zip(reused.net.W, afresh.net.W):
        np.testing.assert_array_equal(W, Wr)


def test_a_checked_round_forms_three_products_of_w0s_size(random_data):
    """Figure 1's setting (one batch of all the data, capped blocks, no proximal term): a
    checked round costs an unchecked one's products plus, at W_0's size (p x n x m), the
    check's image of W_0's argmin and its gradient's product with X~_0, the feed-forward
    product W_0 X~_0 that the unchecked round after a checked one takes from that round's check
    (``carry``), and a few of the output layer's size; the network objective, the divergences
    and every value before a block reuse the driver's feed-forward pass or an earlier check's
    image."""
    import array_api_strict as xps

    from fenchel_cvx.fast import FastBackend
    from fenchel_cvx.fast.reads import flops_by_round

    n, p, q, m = 40, 30, 10, 600
    X, Y = random_data(n=n, k=q, m=m, seed=3)
    net = LiftedNetwork([n, p, q], "relu", "mse", lam=0.1, rho=1.0, seed=0)
    backend = FastBackend(w_steps=2, x_steps=3, capped_residual=False, capped_value=False)
    rounds = flops_by_round(
        net,
        xps.asarray(X),
        xps.asarray(Y),
        batch_size=m,
        epochs=4,
        gamma=0.0,
        check_every=2,
        backend=backend,
    )
    per_round = [(rec["checked"], sum(counts.values())) for rec, counts in rounds[1:]]
    (checked, c2), (unchecked, c3) = per_round[0], per_round[1]
    assert checked and not unchecked
    w0_size, out_size = 2 * p * (n + 1) * m, 2 * q * (p + 1) * m
    assert c2 - c3 <= 3 * w0_size + 8 * out_size, (c2 - c3) / w0_size


@pytest.mark.parametrize(
    "schedule, batches",
    [(dict(iterations=4), 1), (dict(batch_size=15, epochs=1, alternations=2), 2)],
)
def test_the_first_layers_patches_are_formed_once_per_batch(tiny, schedule, batches):
    """X~_0 = [X0; 1] serves the feed-forward pass and W_0's block of every round on its batch:
    formed once per batch (Algorithm 1: once per run), not once per round."""
    X, Y = tiny
    net = LiftedNetwork([4, 6, 3], "relu", "mse", lam=1.0, rho=0.1, seed=2)
    layer, seen = net.layers[0], []
    patches = layer.patches
    layer.patches = lambda X0: seen.append(X0) or patches(X0)
    res = fit_bcd(net, X, Y, backend="fast", **schedule)
    assert len(res.history) == 4
    assert len(seen) == batches


def test_backend_registry():
    assert set(BACKENDS) == {"cvxpy", "fast"}
    assert get_backend("cvxpy").name == "cvxpy" and get_backend("fast").name == "fast"
    b = OracleBackend()
    assert get_backend(b) is b
    for bad in ("scipy", 3, None):
        with pytest.raises(ValueError, match="backend must be one of"):
            get_backend(bad)


def test_callback_can_stop_and_regression_history(tiny):
    X, _ = tiny
    Y = np.random.default_rng(0).standard_normal((2, 30))
    seen = []
    res = fit_bcd(
        LiftedNetwork([4, 5, 2], seed=0),
        X,
        Y,
        iterations=5,
        X_test=X[:, :7],
        Y_test=Y[:, :7],
        callback=lambda net, rec: seen.append(rec["iteration"]) or rec["iteration"] == 2,
    )
    h = res.history
    assert seen == [1, 2] and len(h) == 2 and h.config["task"] == "regression"
    assert h.last["train_accuracy"] is None and h.last["test_loss"] > 0


# --- validation before any solve ---------------------------------------------------------------
@pytest.mark.parametrize(
    "change,match",
    [
        (dict(X0=np.zeros((4, 0)), Y=np.zeros((3, 0))), r"X0 must hold at least one data point"),
        (dict(Y=np.zeros((2, 30))), r"Y must have 3 rows \(the network's output size\)"),
        (dict(Y=np.zeros((3, 29))), r"Y must have 30 columns \(data points\)"),
        (dict(X0=np.full((4, 30), np.nan)), r"X0 must be finite"),
        (dict(X0=np.zeros((5, 30))), r"X0 must have 4 rows"),
        (dict(batch_size=-5), r"batch_size must be an integer >= 1 or None, got -5"),
        (dict(batch_size=0), r"batch_size must be an integer >= 1 or None, got 0"),
        (dict(batch_size=2.5), r"batch_size must be an integer >= 1 or None, got 2.5"),
        (dict(gamma=-1.0), r"gamma must be >= 0 and finite, got -1.0"),
        (dict(gamma=[1.0, 2.0]), r"gamma must be a number or a sequence of 3 numbers"),
        (dict(iterations=0), r"iterations must be an integer >= 1, got 0"),
        (dict(epochs=0), r"epochs must be an integer >= 1, got 0"),
        (dict(alternations=0), r"alternations must be an integer >= 1, got 0"),
        (dict(backend="gurobi"), r"backend must be one of \['cvxpy', 'fast'\].*got 'gurobi'"),
        (dict(tol=-1.0), r"tol must be > 0 and finite, got -1.0"),
        (dict(strict="yes"), r"strict must be True, False or None"),
        (dict(callback=3), r"callback must be callable"),
        (dict(X_test=np.zeros((4, 3))), r"X_test and Y_test must be given together"),
        (dict(X_test=np.zeros((4, 3)), Y_test=np.zeros((3, 3)) + np.nan), r"Y_test must be finite"),
        (dict(net="not a net"), r"net must be a LiftedNetwork"),
    ],
)
def test_bad_input_errors_before_any_solve(tiny, change, match):
    X, Y = tiny
    backend = CountingOracle()
    args = dict(net=LiftedNetwork([4, 6, 5, 3], seed=0), X0=X, Y=Y)
    kwargs = dict(backend=backend)
    for k, v in change.items():
        (args if k in args else kwargs)[k] = v
    with pytest.raises(ValueError, match=match):
        fit_bcd(args["net"], args["X0"], args["Y"], **kwargs)
    assert backend.calls == 0


# --- history and plots -------------------------------------------------------------------------
def test_history_json_round_trip(tmp_path, mse_run):
    h = mse_run.history
    path = h.save(tmp_path / "sub" / "history.json")
    back = History.load(path)
    assert back.to_dict() == h.to_dict()
    assert len(back) == len(h) and back.certificate_held == h.certificate_held
    np.testing.assert_array_equal(back.series("test_accuracy"), h.series("test_accuracy"))
    raw = json.loads(path.read_text())
    assert raw["format"].startswith("fenchel_cvx.History") and len(raw["records"]) == 3
    rec = raw["records"][0]
    for key in (
        "lifted_x",
        "network_x",
        "lifted_w",
        "network_w",
        "divergence_x",
        "divergence_w",
        "train_accuracy",
        "test_accuracy",
        "blocks",
        "certificate",
        "restarted",
    ):
        assert key in rec
    assert {"seconds", "status", "residual", "iterations"} <= set(rec["blocks"][0])
    with pytest.raises(ValueError, match="not a History"):
        History.from_dict({"x": 1})


def test_plots_written_from_history_only(tmp_path, mse_run):
    h = History.load(mse_run.history.save(tmp_path / "h.json"))
    for fn, name in ((plot_objectives, "objectives.png"), (plot_accuracy, "accuracy.png")):
        fig = fn(h, tmp_path / name)
        data = (tmp_path / name).read_bytes()
        assert data[:8] == PNG and len(data) > 5000 and fig.axes
    fig = plot_objectives(History({"algorithm": 1}))  # empty history: still a figure
    assert fig.axes


# --- prediction ------------------------------------------------------------------------------
def test_predict_rules(digits, mse_run):
    net = mse_run.net
    Xt, yt = digits["X_test"][:, :60], digits["y_test"][:60]
    np.testing.assert_array_equal(predict(net, Xt), net.forward(Xt)[1])
    ff = predict_classes(net, Xt)
    S = predict(net, Xt, rule="optimization", sweeps=2)
    assert S.shape == (10, 60) and np.all(np.isfinite(S))
    opt = np.argmax(S, axis=0)
    np.testing.assert_array_equal(opt, predict_classes(net, Xt, rule="optimization"))
    assert np.mean(opt == yt) >= 0.85 and np.mean(opt == ff) >= 0.85
    with pytest.raises(ValueError, match="rule must be one of"):
        predict(net, Xt, rule="vote")
    with pytest.raises(ValueError, match="sweeps must be an integer >= 1"):
        predict(net, Xt, rule="optimization", sweeps=0)


def test_is_one_hot_and_evaluate():
    assert bcd.is_one_hot(np.eye(3)) and not bcd.is_one_hot(np.ones((3, 2)))
    net = LiftedNetwork([2, 3], seed=0)
    loss, acc = bcd.evaluate(net, np.ones((2, 4)), np.eye(3)[:, [0, 1, 2, 0]])
    assert loss > 0 and 0 <= acc <= 1


def test_the_initial_figures_take_one_pass_over_the_training_data(monkeypatch):
    """The history's ``config.initial``: the training loss, the accuracy and J(W) from one
    feed-forward pass over the training data (and one over the test data), J equal to
    ``network_objective``'s."""
    ds = load_digits()
    X, Y = ds.X_train[:, :120], one_hot(ds.y_train[:120], 10)
    Xt, Yt = ds.X_test[:, :50], one_hot(ds.y_test[:50], 10)
    net = LiftedNetwork([64, 8, 10], "relu", "cross_entropy", lam=1.0, rho=1e-3, seed=0)
    J = net.network_objective(X, Y)
    widths, feed_forward = [], net.feed_forward

    def counted(X0, *args, **kwargs):
        widths.append(X0.shape[1])
        return feed_forward(X0, *args, **kwargs)

    monkeypatch.setattr(net, "feed_forward", counted)
    found = evaluation.initial_figures(net, X, Y, Xt, Yt, classification=True)
    assert sorted(widths) == [50, 120]
    assert found["network_objective"] == pytest.approx(J, rel=1e-12)
    assert found["train_loss"] * 120 == pytest.approx(J - net.penalty(), rel=1e-12)
    assert (found["train_loss"], found["train_accuracy"]) == bcd.evaluate(net, X, Y)
    assert (found["test_loss"], found["test_accuracy"]) == bcd.evaluate(net, Xt, Yt)


def test_eval_every_evaluates_on_schedule():
    """eval_every=None leaves accuracy to the caller; an integer evaluates every that many
    rounds and after each epoch's last round."""
    ds = load_digits()
    X, Y = ds.X_train[:, :120], one_hot(ds.y_train[:120], 10)
    net = LiftedNetwork([64, 8, 10], "relu", "cross_entropy", lam=1.0, rho=1e-3, seed=0)
    res = fit_bcd(net, X, Y, batch_size=50, epochs=1, gamma=1.0, backend="fast", eval_every=2)
    acc = [r["train_accuracy"] for r in res.history.records]
    assert [a is not None for a in acc] == [False, True, True]  # rounds 2 and 3 (epoch end)
    assert res.history.config["initial"]["train_accuracy"] is not None
    res = fit_bcd(net, X, Y, batch_size=50, epochs=1, gamma=1.0, backend="fast", eval_every=None)
    assert all(r["train_accuracy"] is None for r in res.history.records)
    assert res.history.config["initial"] is None
    with pytest.raises(ValueError, match="eval_every must be an integer >= 1 or None, got 0"):
        fit_bcd(net, X, Y, eval_every=0)


@pytest.mark.parametrize("batch_size,alternations", [(40, 1), (40, 2), (None, 1)])
def test_check_every_skips_only_the_checks(batch_size, alternations):
    """check_every=k: the same iterates as checking every round (Algorithm 1: up to rounding,
    where an unchecked round takes the W_0 X~_0 W_0's solver updated and a checked one the
    check's, ``carry``); the whole certificate on every k-th and on the last round, block
    statuses on the others, objectives None there."""
    ds = load_digits()
    X, Y = ds.X_train[:, :120], one_hot(ds.y_train[:120], 10)
    runs = {}
    for k in (1, 2):
        net = LiftedNetwork([64, 8, 10], "relu", "cross_entropy", lam=1.0, rho=1e-3, seed=0)
        runs[k] = fit_bcd(
            net,
            X,
            Y,
            batch_size=batch_size,
            epochs=1,
            iterations=3,
            alternations=alternations,
            gamma=1.0,
            backend="fast",
            check_every=k,
            eval_every=None,
        )
    every, sparse = runs[1].history.records, runs[2].history.records
    rel = 0 if batch_size else 1e-9  # (batches: no image carried between rounds)

    def same(a, b):
        return a == pytest.approx(b, rel=rel, abs=rel * 1e-3)

    for W1, W2 in zip(runs[1].net.W, runs[2].net.W):
        np.testing.assert_allclose(W1, W2, rtol=rel, atol=rel * 1e-3)
    n = len(every)
    assert [r["checked"] for r in sparse] == [i % 2 == 0 or i == n for i in range(1, n + 1)]
    assert all(r["checked"] for r in every) and runs[2].history.config["check_every"] == 2
    assert [r["certificate"]["checked"] for r in sparse] == [r["checked"] for r in sparse]
    assert runs[1].history.checked_rounds == n and runs[2].history.checked_rounds == n // 2 + n % 2
    for a, b in zip(every, sparse):
        assert same(
            [x["reported_residual"] for x in a["blocks"]],
            [x["reported_residual"] for x in b["blocks"]],
        )
        if b["checked"]:
            assert same([x["residual"] for x in a["blocks"]], [x["residual"] for x in b["blocks"]])
            assert same(
                (b["lifted_x"], b["network_x"], b["lifted_w"]),
                (a["lifted_x"], a["network_x"], a["lifted_w"]),
            )
            assert same(b["certificate"]["bound_gap"], a["certificate"]["bound_gap"])
        else:
            assert b["lifted_x"] is None and b["network_w"] is None and b["divergence_x"] is None
            # the residuals are recomputed on checked rounds only
            assert all(x["residual"] is None for x in b["blocks"])
            assert b["certificate"]["bound_gap"] is None and b["certificate"]["max_residual"] == 0


@pytest.mark.parametrize("batch_size", [40, None])
def test_driver_runs_in_the_data_array_library(batch_size):
    """X0 from array_api_strict (the standard API only, as CuPy on a GPU): the whole run, the
    certificate included, stays in that library and gives the NumPy run's iterates."""
    xps = pytest.importorskip("array_api_strict")
    ds = load_digits()
    X, Y = ds.X_train[:, :120], one_hot(ds.y_train[:120], 10)
    Xt, Yt = ds.X_test[:, :50], one_hot(ds.y_test[:50], 10)
    runs = {}
    for lib in ("numpy", "strict"):
        net = LiftedNetwork([64, 8, 10], "relu", "cross_entropy", lam=1.0, rho=1e-3, seed=0)
        cast = (lambda A: A) if lib == "numpy" else xps.asarray
        runs[lib] = fit_bcd(
            net,
            cast(X),
            Y,
            batch_size=batch_size,
            epochs=1,
            iterations=2,
            gamma=1.0,
            backend="fast",
            X_test=cast(Xt),
            Y_test=Yt,
        )
    strict, ref = runs["strict"], runs["numpy"]
    assert all(type(W).__module__.startswith("array_api_strict") for W in strict.net.W)
    assert all(type(X_).__module__.startswith("array_api_strict") for X_ in strict.Xs)
    for W, W_ref in zip(strict.net.W, ref.net.W):
        np.testing.assert_allclose(np.asarray(W), W_ref, rtol=1e-9, atol=1e-12)
    for a, b in zip(strict.history.records, ref.history.records):
        assert a["test_accuracy"] == b["test_accuracy"]
        assert a["lifted_x"] == pytest.approx(b["lifted_x"], rel=1e-9)
        assert a["certificate"]["held"] == b["certificate"]["held"]


def test_foreign_arrays_get_a_clear_error():
    xps = pytest.importorskip("array_api_strict")
    net = LiftedNetwork([64, 8, 10], seed=0)
    X, Y = np.zeros((64, 5)), one_hot(np.arange(5), 10)
    with pytest.raises(ValueError, match="oracle.* takes NumPy data, got X0 from array_api_strict"):
        fit_bcd(net, xps.asarray(X), Y)
    with pytest.raises(
        ValueError,
        match=r"X_test must be a 2-D array of numbers that numpy takes, got builtins.str",
    ):
        fit_bcd(net, X, Y, X_test="pixels", Y_test=Y, backend="fast")
    assert isinstance(net.W[0], np.ndarray)  # nothing moved before validation failed


def test_check_every_is_validated():
    net = LiftedNetwork([64, 8, 10], seed=0)
    X, Y = np.zeros((64, 5)), one_hot(np.arange(5), 10)
    for bad in (0, 1.5, None, True):
        with pytest.raises(ValueError, match=f"check_every must be an integer >= 1, got {bad!r}"):
            fit_bcd(net, X, Y, check_every=bad)


def test_data_take_the_network_dtype():
    """A float32 network gets float32 data (no silent upcast); a float64 one float64."""
    ds = load_digits()
    X, Y = ds.X_train[:, :20].astype(np.float32), one_hot(ds.y_train[:20], 10)
    for dtype in (np.float32, np.float64):
        net = LiftedNetwork([64, 8, 10], dtype=dtype)
        X0, Y0 = check_data(net, X, Y)
        assert X0.dtype == dtype and Y0.dtype == dtype
