"""The scikit-learn estimators (``fenchel_cvx.estimator``): the estimator contract and behaviour.

``parametrize_with_checks`` runs scikit-learn's own checks on both estimators at their default
settings (no check is skipped or expected to fail; ``slow``), and with 2 epochs in the quick
loop. The other tests train on scikit-learn's digits (pixels / 16) and a few small synthetic
problems.
"""

import numpy as np
import pytest
from sklearn.exceptions import NotFittedError
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import GridSearchCV, cross_val_score
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler
from sklearn.utils.estimator_checks import parametrize_with_checks

from fenchel_cvx.datasets import load_digits
from fenchel_cvx.estimator import FenchelClassifier, FenchelRegressor
from fenchel_cvx.history import History


@pytest.mark.slow
@parametrize_with_checks([FenchelClassifier(), FenchelRegressor()])
def test_sklearn_contract(estimator, check):
    check(estimator)


@parametrize_with_checks([FenchelClassifier(epochs=2), FenchelRegressor(epochs=2)])
def test_sklearn_contract_two_epochs(estimator, check):
    check(estimator)


@pytest.fixture(scope="module")
def digits():
    """scikit-learn's digits, pixels / 16, stratified 75/25 split; rows are samples here."""
    d = load_digits(seed=0)
    return d.X_train.T, d.y_train, d.X_test.T, d.y_test


@pytest.fixture(scope="module")
def small_digits(digits):
    X, y, Xt, yt = digits
    return X[:500], y[:500], Xt[:200], yt[:200]


def test_digits_at_least_logistic_regression(digits):
    X, y, Xt, yt = digits
    clf = FenchelClassifier(hidden_layer_sizes=(32,), random_state=0).fit(X, y)
    ours, theirs = clf.score(Xt, yt), LogisticRegression().fit(X, y).score(Xt, yt)
    assert ours >= theirs, (ours, theirs)
    # the default blocks are inexact (the training setting's step caps): every violation is
    # a capped block's, and every other check held
    assert clf.history_.held_but_capped and not clf.history_.certificate_held
    assert {v["check"] for v in clf.history_.violations} == {"block_optimality"}
    assert clf.n_iter_ == clf.epochs == len(clf.loss_curve_) and len(clf.history_) > clf.n_iter_


def test_learned_attributes(small_digits):
    X, y, Xt, _ = small_digits
    clf = FenchelClassifier(hidden_layer_sizes=(16, 8), epochs=1, random_state=0).fit(X, y)
    assert clf.n_features_in_ == 64
    np.testing.assert_array_equal(clf.classes_, np.arange(10))
    assert [W.shape for W in clf.coefs_] == [(16, 65), (8, 17), (10, 9)]  # bias = last column
    assert clf.coefs_ is clf.network_.W and clf.network_.layer_sizes == (64, 16, 8, 10)
    assert isinstance(clf.history_, History)
    P = clf.predict_proba(Xt)
    assert P.shape == (len(Xt), 10)
    np.testing.assert_allclose(P.sum(axis=1), 1.0)
    np.testing.assert_array_equal(clf.classes_[P.argmax(axis=1)], clf.predict(Xt))
    # the boundary: rows of X are the network's columns
    np.testing.assert_allclose(
        clf.network_.forward(Xt[:5].T)[1].T.argmax(axis=1), clf.predict(Xt[:5])
    )


def test_string_labels_and_random_state(small_digits):
    X, y, Xt, _ = small_digits
    names = np.array(
        ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
    )
    a = FenchelClassifier(hidden_layer_sizes=(8,), epochs=1, random_state=3).fit(X, names[y])
    b = FenchelClassifier(hidden_layer_sizes=(8,), epochs=1, random_state=3).fit(X, names[y])
    assert set(a.predict(Xt)) <= set(names)
    np.testing.assert_array_equal(a.predict_proba(Xt), b.predict_proba(Xt))


def test_grid_search_over_lam(small_digits):
    X, y, Xt, yt = small_digits
    search = GridSearchCV(
        FenchelClassifier(hidden_layer_sizes=(32,), epochs=2, random_state=0),
        {"lam": [0.3, 3.0]},
        cv=3,
    ).fit(X, y)
    assert search.best_params_["lam"] in (0.3, 3.0)
    assert search.best_estimator_.lam == search.best_params_["lam"]
    assert search.score(Xt, yt) > 0.8


def test_pipeline_with_standard_scaler(small_digits):
    X, y, Xt, yt = small_digits
    pipe = make_pipeline(
        StandardScaler(), FenchelClassifier(hidden_layer_sizes=(32,), epochs=3, random_state=0)
    )
    assert pipe.fit(X, y).score(Xt, yt) > 0.85
    rng = np.random.default_rng(0)
    Xr = rng.normal(size=(200, 3)) * [1.0, 10.0, 100.0]
    yr = np.sin(Xr[:, 0]) + 0.05 * Xr[:, 1] + rng.normal(scale=0.05, size=200)
    reg = make_pipeline(
        StandardScaler(), FenchelRegressor(hidden_layer_sizes=(32,), random_state=0)
    )
    assert reg.fit(Xr, yr).score(Xr, yr) > 0.8


def test_cross_val_score(small_digits):
    X, y, _, _ = small_digits
    scores = cross_val_score(
        FenchelClassifier(hidden_layer_sizes=(16,), epochs=2, random_state=0), X, y, cv=3
    )
    assert scores.shape == (3,) and scores.min() > 0.8


def test_partial_fit_improves(digits):
    X, y, Xt, yt = digits
    clf = FenchelClassifier(hidden_layer_sizes=(32,), random_state=0)
    batches = np.array_split(np.random.default_rng(0).permutation(len(X)), 10)
    clf.partial_fit(X[batches[0]], y[batches[0]], classes=np.arange(10))
    first, rounds = clf.score(Xt, yt), clf.n_iter_
    W0 = [W.copy() for W in clf.coefs_]
    for idx in batches[1:]:
        clf.partial_fit(X[idx], y[idx])
    assert clf.score(Xt, yt) > first + 0.02
    assert clf.n_iter_ == 10 * rounds == len(clf.history_)
    np.testing.assert_array_equal(clf.history_.series("iteration"), np.arange(1, clf.n_iter_ + 1))
    assert any(not np.allclose(a, b) for a, b in zip(W0, clf.coefs_))


def test_partial_fit_needs_classes_and_known_labels(small_digits):
    X, y, _, _ = small_digits
    with pytest.raises(ValueError, match="classes must be passed"):
        FenchelClassifier().partial_fit(X, y)
    clf = FenchelClassifier(hidden_layer_sizes=(8,)).partial_fit(
        X[y < 5], y[y < 5], classes=range(5)
    )
    with pytest.raises(ValueError, match="not in classes"):
        clf.partial_fit(X, y)


def test_regressor_partial_fit_and_shapes():
    rng = np.random.default_rng(1)
    X = rng.normal(size=(120, 4))
    Y = np.stack([X[:, 0] - X[:, 1], np.abs(X[:, 2])], axis=1)
    reg = FenchelRegressor(hidden_layer_sizes=(16,), random_state=0).fit(X, Y)
    assert reg.predict(X).shape == (120, 2) and reg.n_outputs_ == 2
    assert reg.fit(X, Y[:, 0]).predict(X).shape == (120,)
    online = FenchelRegressor(hidden_layer_sizes=(16,), random_state=0)
    for idx in np.array_split(np.arange(120), 4):
        online.partial_fit(X[idx], Y[idx, 0])
    assert online.score(X, Y[:, 0]) > 0.5


@pytest.mark.parametrize("Est", [FenchelClassifier, FenchelRegressor])
@pytest.mark.parametrize(
    "param, value, message",
    [
        ("lam", -1, "lam must be > 0 and finite, got -1"),
        ("lam", 0.0, "lam must be > 0 and finite, got 0.0"),
        ("rho", -0.5, "rho must be >= 0 and finite, got -0.5"),
        ("gamma", float("nan"), "gamma must be >= 0 and finite, got nan"),
        ("momentum", 1.0, r"momentum must be a number in \[0, 1\), got 1.0"),
        ("momentum", (0.5,), "momentum must be None or a number or a sequence of 2 numbers"),
        ("w_steps", 0, "w_steps must be None, 'tol' or a number or a sequence of 2 numbers, got 0"),
        ("x_steps", (2, 2), r"x_steps must be None, 'tol' or a number .*, got \(2, 2\)"),
        ("w_steps", "all", "w_steps must be None, 'tol' or .*got 'all'"),
        ("check_every", 0, "check_every must be an integer >= 1, got 0"),
        ("threads", 0, "threads must be None or an integer >= 1, got 0"),
        ("threads", True, "threads must be None or an integer >= 1, got True"),
        ("activation", "swish", "activation must be one of .* got 'swish'"),
        ("backend", "torch", "backend must be one of .* got 'torch'"),
        ("hidden_layer_sizes", (10, 0), r"hidden_layer_sizes must be .* got \(10, 0\)"),
        ("batch_size", 0, "batch_size must be None, 'auto' or an integer >= 1, got 0"),
        ("epochs", 0, "epochs must be an integer >= 1, got 0"),
        ("tol", 0, "tol must be > 0 and finite, got 0"),
        ("dtype", "int32", "dtype must be 'float32' or 'float64', got 'int32'"),
        ("loss", "hinge", "loss must be one of .* got 'hinge'"),
    ],
)
def test_bad_parameters_raise_in_fit(Est, param, value, message):
    X, y = np.random.default_rng(0).normal(size=(20, 3)), np.arange(20) % 2
    est = Est(**{param: value})  # __init__ only stores
    assert est.get_params()[param] is value
    with pytest.raises(ValueError, match=message):
        est.fit(X, y)


@pytest.mark.parametrize("Est", [FenchelClassifier, FenchelRegressor])
def test_predict_before_fit(Est):
    X = np.zeros((3, 2))
    with pytest.raises(NotFittedError):
        Est().predict(X)
    if Est is FenchelClassifier:
        with pytest.raises(NotFittedError):
            Est().predict_proba(X)


def test_one_class_is_an_error():
    with pytest.raises(ValueError, match="at least 2 classes"):
        FenchelClassifier().fit(np.zeros((5, 2)), np.ones(5))


def test_defaults_are_the_training_setting(small_digits):
    """Hyperparameters left None take ``defaults.training``: the dense setting for mini-batches
    (lam, rho, gamma, momentum and the fast backend's step caps per layer), Algorithm 1's on all
    the data (no caps: every block to tol); ``get_params`` keeps the None given."""
    from fenchel_cvx import defaults

    X, y, _, _ = small_digits
    clf = FenchelClassifier(hidden_layer_sizes=(16, 8), epochs=1, random_state=0).fit(X, y)
    s = defaults.training("dense", 2, batched=True)
    assert s.gamma == (1.0, 1.0, 30.0) and s.w_steps == (10, 10, 1) and s.x_steps == (20, 20)
    cfg = clf.history_.config
    assert (cfg["gamma"], cfg["momentum"]) == (list(s.gamma), list(s.momentum))
    assert (cfg["lam"], cfg["rho"]) == (list(s.lam), list(s.rho))
    names = ("lam", "rho", "gamma", "momentum", "w_steps", "x_steps")
    assert all(clf.get_params()[k] is None for k in names)
    iters = {}
    for rec in clf.history_:
        for b in rec["blocks"]:
            iters[b["block"]] = max(iters.get(b["block"], 0), b["iterations"])
    assert iters["W_2"] == 1 and max(iters["W_0"], iters["W_1"]) <= 10
    assert max(iters["X_1"], iters["X_2"]) <= 20 and max(iters.values()) > 1
    full = FenchelClassifier(
        hidden_layer_sizes=(16,), batch_size=None, iterations=1, random_state=0
    ).fit(X, y)
    f = defaults.training("dense", 1, batched=False)
    cfg = full.history_.config
    assert (cfg["lam"], cfg["rho"], cfg["gamma"]) == (list(f.lam), list(f.rho), list(f.gamma))
    assert full.history_.certificate_held  # no caps: every block solved to tol
    with pytest.raises(
        ValueError,
        match=r"w_steps=3 sets the steps of the fast backend by name: "
        r"it needs backend='fast' \(a backend object keeps its "
        r"own\), got backend='cvxpy'",
    ):
        FenchelClassifier(backend="cvxpy", w_steps=3).fit(X, y)


def test_threads_reach_the_fast_backend(small_digits):
    """``threads=N``: the fast backend by name solves every block with NumPy's BLAS pool at N
    (its default: 1), and the pools are as before once the fit ends; refused with another
    backend (a bad count: ``test_bad_parameters_raise_in_fit``)."""
    from fenchel_cvx.threads import limit_threads, pools

    X, y, _, _ = small_digits
    numpy_pool = lambda: {n for name, _, n, _ in pools() if name == "numpy"}  # noqa: E731
    if not numpy_pool():
        pytest.skip("threadpoolctl finds no BLAS pool of NumPy's in this install")
    seen = []

    class Spy(FenchelClassifier):  # a real fit; NumPy's pool is read inside every block solve
        def _make_backend(self, params):
            backend = super()._make_backend(params)
            solve = backend._solve
            backend._solve = lambda *args: (seen.append(numpy_pool()), solve(*args))[1]
            return backend

    with limit_threads(1):
        Spy(hidden_layer_sizes=(8,), epochs=1, random_state=0, threads=2).fit(X, y)
        assert seen and all(n == {2} for n in seen)
        assert numpy_pool() == {1}  # restored after the fit
        seen.clear()
        Spy(hidden_layer_sizes=(8,), epochs=1, random_state=0).fit(X, y)
        assert seen and all(n == {1} for n in seen)
    with limit_threads(2):
        seen.clear()
        Spy(hidden_layer_sizes=(8,), epochs=1, random_state=0).fit(X, y)
        assert seen and all(n == {1} for n in seen)
    with pytest.raises(
        ValueError,
        match=r"threads=2 sets the threads of the fast backend by "
        r"name: it needs backend='fast'",
    ):
        FenchelClassifier(backend="cvxpy", threads=2).fit(X, y)


def test_no_hidden_layer_strict_and_uncapped_blocks(small_digits):
    """An estimator without a hidden layer trains with the setting (no X-block: no X-steps);
    ``strict=True`` and ``"tol"`` drop the step caps, so every block passes the certificate."""
    X, y, _, _ = small_digits
    for kw in (dict(), dict(strict=True), dict(w_steps="tol", x_steps="tol")):
        clf = FenchelClassifier(hidden_layer_sizes=(), epochs=1, random_state=0, **kw).fit(X, y)
        assert clf.score(X, y) > 0.8 and clf.history_.held_but_capped
        assert clf.history_.certificate_held == bool(kw), kw  # caps: inexact by design
    online = FenchelClassifier(hidden_layer_sizes=(), random_state=0)
    online.partial_fit(X[:50], y[:50], classes=np.arange(10))
    assert online.n_iter_ == 1 and online.coefs_[0].shape == (10, 65)
    with pytest.raises(ValueError, match="x_steps must be None or 'tol', got 5"):
        FenchelClassifier(hidden_layer_sizes=(), x_steps=5).fit(X, y)
    strict = FenchelClassifier(hidden_layer_sizes=(4,), epochs=1, strict=np.True_, random_state=0)
    assert strict.fit(X, y).history_.certificate_held  # a NumPy bool drops the caps too
    for kw in (dict(strict=True), dict(w_steps="tol", x_steps="tol")):
        clf = FenchelClassifier(hidden_layer_sizes=(8,), epochs=1, random_state=0, **kw).fit(X, y)
        assert clf.history_.certificate_held, kw
        assert max(b["iterations"] for r in clf.history_ for b in r["blocks"]) > 20


def test_check_every_and_the_epoch_end_evaluation(small_digits):
    """``check_every=k`` certifies every k-th round and the last; the training loss is
    evaluated at the end of every epoch only (what ``loss_curve_`` reads): after the last, the
    feed-forward loss per point at the fitted weights; the accuracy plot draws those points."""
    from fenchel_cvx.plotting import plot_accuracy

    X, y, _, _ = small_digits
    kw = dict(hidden_layer_sizes=(8,), epochs=2, batch_size=100, random_state=0)
    every = FenchelClassifier(**kw).fit(X, y)
    sparse = FenchelClassifier(check_every=5, **kw).fit(X, y)
    rounds = len(every.history_)
    assert every.history_.checked_rounds == rounds
    assert sparse.history_.checked_rounds == len(range(5, rounds + 1, 5)) + (rounds % 5 != 0)
    for a, b in zip(sparse.coefs_, every.coefs_):
        np.testing.assert_array_equal(a, b)
    ends = [r["train_loss"] is not None for r in every.history_]
    assert sum(ends) == 2 and ends[rounds // 2 - 1] and ends[-1]
    assert every.loss_curve_ == sparse.loss_curve_ and len(every.loss_curve_) == 2
    net, Y = every.network_, np.eye(10)[np.searchsorted(every.classes_, y)].T
    loss = float(net.loss.value(Y, net.forward(X.T)[1])) / X.shape[0]
    assert every.loss_curve_[-1] == pytest.approx(loss, rel=1e-12)
    fig = plot_accuracy(every.history_)
    train = [ln for ln in fig.axes[0].lines if ln.get_label() == "train accuracy"][0]
    assert len(train.get_xdata()) == 2 and np.isfinite(train.get_ydata()).all()


def test_warm_start_with_other_hidden_layers_is_refused(small_digits):
    X, y, _, _ = small_digits
    clf = FenchelClassifier(hidden_layer_sizes=(8,), epochs=1, warm_start=True, random_state=0)
    lam = list(clf.fit(X, y).network_.lam)
    clf.set_params(hidden_layer_sizes=(8, 5))
    with pytest.raises(
        ValueError,
        match=r"hidden_layer_sizes=\(8, 5\) differs from the fitted "
        r"network's \(8,\)",
    ):
        clf.fit(X, y)
    assert clf.network_.lam == lam and len(clf.network_.rho) == 2  # left as it was


def test_each_call_trains_with_its_own_setting(small_digits):
    """A ``partial_fit`` after a full-batch ``fit`` trains the network with the batched
    setting's lam and rho, not those it was built with (a W-block with neither rho nor gamma
    would lose strict convexity the other way round)."""
    from fenchel_cvx import defaults

    X, y, _, _ = small_digits
    clf = FenchelClassifier(
        hidden_layer_sizes=(8,), batch_size=None, iterations=1, random_state=0
    ).fit(X, y)
    full = defaults.training("dense", 1, batched=False)
    assert (clf.network_.lam, clf.network_.rho) == (list(full.lam), list(full.rho))
    clf.partial_fit(X[:40], y[:40])
    batched = defaults.training("dense", 1, batched=True)
    assert (clf.network_.lam, clf.network_.rho) == (list(batched.lam), list(batched.rho))
    cfg = clf.history_[-1]
    assert clf.history_.config["gamma"] == list(full.gamma)  # the first run's config is kept
    assert cfg["certificate"]["held"] or all(v["capped"] for v in cfg["certificate"]["violations"])


def test_full_batch_oracle():
    rng = np.random.default_rng(2)
    X = rng.normal(size=(30, 3))
    y = (X[:, 0] + X[:, 1] > 0).astype(int)
    clf = FenchelClassifier(
        hidden_layer_sizes=(4,),
        batch_size=None,
        iterations=3,
        backend="cvxpy",
        lam=1.0,
        rho=1e-3,
        random_state=0,
    ).fit(X, y)
    assert clf.n_iter_ == 3 and clf.history_.config["algorithm"] == 1
    assert clf.history_.config["backend"] == "cvxpy" and clf.history_.certificate_held
    assert clf.score(X, y) > 0.8


def test_float32():
    rng = np.random.default_rng(2)
    X = rng.normal(size=(30, 3))
    y = (X[:, 0] + X[:, 1] > 0).astype(int)
    c32 = FenchelClassifier(hidden_layer_sizes=(4,), dtype="float32", random_state=0).fit(X, y)
    assert c32.coefs_[0].dtype == np.float32 and c32.score(X, y) > 0.8


# --- scikit-learn parity (MLPClassifier's names and meanings) -------------------------------
def test_loss_curve_and_n_iter_count_epochs(small_digits, capsys):
    X, y, _, _ = small_digits
    clf = FenchelClassifier(
        hidden_layer_sizes=(8,), epochs=3, batch_size=100, random_state=0, verbose=1
    ).fit(X, y)
    assert clf.n_iter_ == 3 and len(clf.history_) == 3 * 5
    assert len(clf.loss_curve_) == 3 and clf.loss_curve_[-1] < clf.loss_curve_[0]
    assert clf.best_loss_ == min(clf.loss_curve_) and clf.validation_scores_ is None
    lines = [l for l in capsys.readouterr().out.splitlines() if l.startswith("Iteration")]
    assert lines == [f"Iteration {i + 1}, loss = {v:.8f}" for i, v in enumerate(clf.loss_curve_)]


def test_warm_start_continues(small_digits):
    X, y, _, _ = small_digits
    kw = dict(hidden_layer_sizes=(8,), epochs=2, random_state=0)
    cold = FenchelClassifier(**kw).fit(X, y)
    warm = FenchelClassifier(warm_start=True, **kw).fit(X, y)
    W = [w.copy() for w in warm.coefs_]
    warm.fit(X, y)
    assert (
        warm.n_iter_ == 4
        and len(warm.loss_curve_) == 4
        and len(warm.history_) == 2 * len(cold.history_)
    )
    np.testing.assert_array_equal(
        warm.history_.series("iteration"), np.arange(1, len(warm.history_) + 1)
    )
    assert any(not np.array_equal(a, b) for a, b in zip(W, warm.coefs_))
    np.testing.assert_array_equal(FenchelClassifier(**kw).fit(X, y).coefs_[0], cold.coefs_[0])
    with pytest.raises(ValueError, match="warm_start can only continue on the classes"):
        warm.fit(X, np.where(y == 0, 99, y))


@pytest.mark.parametrize("Est, score", [(FenchelClassifier, "accuracy"), (FenchelRegressor, "r2")])
def test_early_stopping_keeps_the_best_epoch(small_digits, Est, score):
    X, y, _, _ = small_digits
    target = y if Est is FenchelClassifier else y / 9.0
    est = Est(
        hidden_layer_sizes=(8,),
        epochs=40,
        early_stopping=True,
        n_iter_no_change=2,
        validation_fraction=0.2,
        random_state=0,
    ).fit(X, target)
    v = est.validation_scores_
    assert len(v) == est.n_iter_ and est.best_validation_score_ == max(v)
    best = int(np.argmax(v))
    assert est.n_iter_ < 40 and est.n_iter_ - 1 - best >= 2 or est.n_iter_ == 40
    assert est.best_loss_ is None
    if Est is FenchelClassifier:  # the kept weights are the best epoch's: rescore them
        from sklearn.model_selection import train_test_split

        _, Xv, _, yv = train_test_split(
            X, target, test_size=0.2, random_state=est._seed(), stratify=target
        )
        assert est.score(Xv, yv) == pytest.approx(est.best_validation_score_)


def test_predict_log_proba(small_digits):
    X, y, Xt, _ = small_digits
    clf = FenchelClassifier(hidden_layer_sizes=(8,), epochs=1, random_state=0).fit(X, y)
    L = clf.predict_log_proba(Xt)
    np.testing.assert_allclose(np.exp(L), clf.predict_proba(Xt), rtol=1e-12)
    assert np.all(np.isfinite(L)) and np.all(L <= 0)


@pytest.mark.parametrize(
    "param, value, match",
    [
        ("warm_start", 1, "warm_start must be True or False"),
        ("early_stopping", "yes", "early_stopping must be True or False"),
        ("validation_fraction", 1.0, r"validation_fraction must be a number in \(0, 1\), got 1.0"),
        ("validation_fraction", 0, r"validation_fraction must be a number in \(0, 1\), got 0"),
        ("n_iter_no_change", 0, "n_iter_no_change must be an integer >= 1"),
    ],
)
def test_parity_parameters_validated(small_digits, param, value, match):
    X, y, _, _ = small_digits
    with pytest.raises(ValueError, match=match):
        FenchelClassifier(**{param: value}).fit(X, y)
