"""The lifted baselines of Figure 1: every closed-form step is the exact minimiser of its
subproblem (checked against scipy.optimize on small random data), each method's objective
behaves as its paper says, and bad input is refused by name before any work."""

import numpy as np
import pytest
from scipy.optimize import minimize, nnls

from fenchel_cvx.baselines.lifted import METHODS, LiftedRun, fit_lifted
from fenchel_cvx.baselines.lifted.common import relu_prox, ridge
from fenchel_cvx.network import LiftedNetwork, augment

SIZES = (6, 5, 3)
M = 9


@pytest.fixture
def data():
    rng = np.random.default_rng(1)
    X = rng.uniform(0, 1, (SIZES[0], M))
    Y = np.eye(SIZES[-1])[:, rng.integers(0, SIZES[-1], M)]
    return X, Y


def started(name, data, **hyper):
    X, Y = data
    algo = METHODS[name](**hyper)
    algo.start(LiftedNetwork(SIZES, "relu", "mse", seed=3), X, Y)
    return algo


def argmin(f, x0, bounds=None):
    """scipy's minimiser of f over arrays shaped like x0 (L-BFGS-B, tight tolerances)."""
    res = minimize(
        lambda v: f(v.reshape(x0.shape)),
        x0.ravel() + 0.3,
        method="L-BFGS-B",
        bounds=bounds,
        options=dict(ftol=1e-15, gtol=1e-11, maxiter=20000),
    )
    return res.x.reshape(x0.shape)


def sq(A):
    return float(np.sum(A * A))


# --- the shared closed forms --------------------------------------------------------------------
def test_ridge_is_the_minimiser():
    rng = np.random.default_rng(0)
    T, A, W0 = rng.normal(size=(3, 8)), rng.normal(size=(4, 8)), rng.normal(size=(3, 4))
    W = ridge(T, A, 0.7, W0=W0)
    f = lambda V: sq(T - V @ A) + 0.7 * sq(V - W0)  # noqa: E731
    np.testing.assert_allclose(W, argmin(f, W), atol=1e-6)
    # reg = 0: the least-squares solution T A^+, also when A A^T is singular (rank 2 of 4)
    A2 = rng.normal(size=(4, 2)) @ rng.normal(size=(2, 8))
    np.testing.assert_allclose(ridge(T, A2), T @ np.linalg.pinv(A2), atol=1e-8)


def test_relu_prox_is_the_minimiser_on_both_pieces():
    v = np.array([-2.0, -0.5, 0.0, 0.3, 1.5, 2.0, 0.7, -1.0])
    m = np.array([1.0, -0.3, 0.2, -2.0, -0.1, 0.5, -0.6, 0.4])
    for c in (0.1, 1.0, 5.0):
        u = relu_prox(v, m, c)
        grid = np.linspace(-4, 4, 160001)
        for i in range(v.size):
            f = (v[i] - np.maximum(grid, 0)) ** 2 + c * (grid - m[i]) ** 2
            fu = (v[i] - max(u[i], 0)) ** 2 + c * (u[i] - m[i]) ** 2
            assert fu <= f.min() + 1e-9


# --- Taylor et al. 2016 --------------------------------------------------------------------------
def test_taylor_steps_are_exact(data):
    t = started("taylor", data, beta=2.0, gamma=3.0)
    t.step()  # move off the feed-forward point
    b, g = t.beta, t.gamma
    relu = lambda A: np.maximum(A, 0)  # noqa: E731
    W = t.w_step(0)
    np.testing.assert_allclose(W, argmin(lambda V: sq(t.z[0] - V @ t.a[0]), W), atol=1e-6)
    a = t.a_step(1)
    f = lambda A: b * sq(t.z[1] - t.W[1] @ A) + g * sq(A - relu(t.z[0]))  # noqa: E731
    np.testing.assert_allclose(a, argmin(f, a), atol=1e-6)
    z = t.z_step(0)
    m = t.W[0] @ t.a[0]
    fz = g * (t.a[1] - relu(z)) ** 2 + b * (z - m) ** 2
    for cand in (np.clip((g * t.a[1] + b * m) / (g + b), 0, None), np.minimum(m, 0)):
        assert np.all(fz <= g * (t.a[1] - relu(cand)) ** 2 + b * (cand - m) ** 2 + 1e-12)
    t.lam_mult = np.random.default_rng(2).normal(size=t.z[1].shape)
    zl = t.z_last_step()
    f = lambda Z: 0.5 * sq(Z - t.Y) + np.sum(t.lam_mult * Z) + b / 2 * sq(Z - t.W[1] @ t.a[1])  # noqa: E731
    np.testing.assert_allclose(zl, argmin(f, zl), atol=1e-6)


def test_taylor_warm_start_descends_then_multiplier_runs(data):
    t = started("taylor", data, warm=4)
    vals = [t.objective()]
    for _ in range(4):
        t.step()
        vals.append(t.objective())
    # warm start (multiplier held at 0): exact block minimisation of the augmented Lagrangian
    assert all(b <= a + 1e-9 for a, b in zip(vals, vals[1:]))
    assert vals[-1] < vals[0]
    assert not np.any(t.lam_mult)
    t.step()  # after warm-up the multiplier moves
    np.testing.assert_allclose(t.lam_mult, t.beta * (t.z[1] - t.W[1] @ t.a[1]))
    assert np.any(t.lam_mult)


# --- Lau et al. 2018 / Zeng et al. 2019 -----------------------------------------------------------
def test_lau_steps_are_exact(data):
    s = started("lau", data, gamma=1.5, rho=0.8, alpha=0.3)
    s.step()
    g, r, a = s.gamma, s.rho, s.alpha
    V2 = s.v_last_step()
    f = lambda V: 0.5 * sq(V - s.Y) + g / 2 * sq(V - s.U[2]) + a / 2 * sq(V - s.V[2])  # noqa: E731
    np.testing.assert_allclose(V2, argmin(f, V2), atol=1e-6)
    U2 = s.u_last_step()
    f = lambda U: g / 2 * sq(s.V[2] - U) + r / 2 * sq(U - s.affine(2))  # noqa: E731
    np.testing.assert_allclose(U2, argmin(f, U2), atol=1e-6)
    W, b = s.wb_step(1)
    T, V = s.U[2], s.V[1]
    fW = lambda Z: r / 2 * sq(T - Z @ V - s.b[1]) + a / 2 * sq(Z - s.W[1])  # noqa: E731
    fb = lambda c: r / 2 * sq(T - s.W[1] @ V - c) + a / 2 * sq(c - s.b[1])  # noqa: E731
    np.testing.assert_allclose(W, argmin(fW, W), atol=1e-6)
    np.testing.assert_allclose(b, argmin(fb, b), atol=1e-6)
    V1 = s.v_step(1)
    f = lambda Z: g / 2 * sq(Z - np.maximum(s.U[1], 0)) + r / 2 * sq(s.U[2] - s.W[1] @ Z - s.b[1])  # noqa: E731
    np.testing.assert_allclose(V1, argmin(f, V1), atol=1e-6)
    U1 = s.u_step(1)
    m = s.affine(1)

    def fu(U):
        return (
            g / 2 * (s.V[1] - np.maximum(U, 0)) ** 2
            + r / 2 * (U - m) ** 2
            + a / 2 * (U - s.U[1]) ** 2
        )

    grid = np.linspace(-6, 6, 24001)[:, None, None]
    assert np.all(fu(U1) <= fu(grid).min(axis=0) + 1e-6)


def test_lau_objective_falls_every_iteration(data):
    s = started("lau", data)
    vals = [s.objective()]
    for _ in range(6):
        s.step()
        vals.append(s.objective())
    # every block is an exact (proximal) minimiser: the objective never rises (Zeng et al., Lemma 1)
    assert all(b <= a + 1e-9 for a, b in zip(vals, vals[1:]))
    assert vals[-1] < 0.9 * vals[0]


# --- Askari et al. 2018 --------------------------------------------------------------------------
def test_askari_x_step_is_the_nnls_solution(data):
    s = started("askari", data, lam=0.5)
    X1 = s.x_step(1, steps=5000)
    M_ = s.W[0] @ augment(s.X[0])
    A, a = s.W[1][:, :-1], s.W[1][:, -1:]
    # column j: min_{x >= 0} lam ||x - M_j||^2 + ||Y_j - a - A x||^2 as one NNLS problem
    K = np.vstack([np.sqrt(s.lam) * np.eye(A.shape[1]), A])
    for j in range(M):
        x, _ = nnls(K, np.concatenate([np.sqrt(s.lam) * M_[:, j], s.Y[:, j] - a[:, 0]]))
        np.testing.assert_allclose(X1[:, j], x, atol=1e-6)


def test_askari_w_step_and_descent(data):
    s = started("askari", data)
    s.step()
    for l in (0, 1):
        T, c = s.target(l)
        W = s.w_step(l)
        f = lambda V, c=c, T=T, l=l: c * sq(T - V @ augment(s.X[l])) + s.rho_l[l] * sq(V)  # noqa: E731
        np.testing.assert_allclose(W, argmin(f, W), atol=1e-5)
    vals = [s.objective()]
    for _ in range(5):
        s.step()
        vals.append(s.objective())
    assert all(b <= a + 1e-9 for a, b in zip(vals, vals[1:]))


def test_askari_default_rho_penalises_hidden_and_output_layers_at_any_depth(data):
    X, Y = data
    s = METHODS["askari"]()
    s.start(LiftedNetwork((X.shape[0], 6, 5, 4, Y.shape[0]), "relu", "mse", seed=3), X, Y)
    assert s.rho_l == [1e-2, 1e-2, 1e-2, 10.0]
    assert started("askari", data).rho_l == [1e-2, 10.0]  # the paper's pair at depth 1


# --- the common entry point -----------------------------------------------------------------------
def _needs_torch(method):
    """The SGD baseline trains by backprop in PyTorch (the bench extra); the lifted methods not."""
    if method != "sgd":
        return method
    try:
        import torch  # noqa: F401
    except ImportError:
        return pytest.param(
            method,
            marks=pytest.mark.skip(reason="the SGD baseline needs PyTorch (fenchel_cvx[bench])"),
        )
    return method


@pytest.mark.parametrize("method", [_needs_torch(m) for m in sorted(METHODS)])
def test_fit_lifted_records_the_same_history_for_every_method(method, data):
    X, Y = data
    run = fit_lifted(
        method,
        X,
        Y,
        X,
        Y,
        hidden=(5,),
        iterations=3,
        seed=3,
        **({"batch_size": 3} if method == "sgd" else {}),
    )
    assert [r["iteration"] for r in run.records] == [1, 2, 3]
    # the training time is recorded at every iteration, cumulative: the sum of the steps' times
    seconds = run.series("seconds")  # (a record without one reads NaN)
    assert len(seconds) == 3 and np.all(np.isfinite(seconds))
    np.testing.assert_allclose(seconds, np.cumsum(run.series("step_seconds")))
    assert all(0 <= r["test_accuracy"] <= 1 for r in run.records)
    assert run.net.W[0].shape == (5, SIZES[0] + 1)
    back = LiftedRun.from_dict(run.to_dict())
    assert back.records == run.records and back.method == method
    # the same start for all: the Xavier network of the seed
    assert run.initial_test_accuracy == pytest.approx(
        np.mean(np.argmax(LiftedNetwork(SIZES, seed=3).forward(X)[1], 0) == np.argmax(Y, 0))
    )


def test_fln_restart_is_algorithm_2_on_one_batch_of_all_the_data(data):
    """restart=True: every round starts its X-sweep from the feed-forward point of the current
    weights, which is fit_bcd(batch_size=m, epochs=n, gamma=0); restart=False keeps the lifted X."""
    from fenchel_cvx import fit_bcd
    from fenchel_cvx.fast import FastBackend

    X, Y = data
    hyper = dict(lam=0.1, rho=(1e-2, 10.0), w_steps=2, x_steps=10)
    run = fit_lifted("fln", X, Y, X, Y, hidden=(5,), iterations=3, seed=3, restart=True, **hyper)
    kept = fit_lifted("fln", X, Y, X, Y, hidden=(5,), iterations=3, seed=3, **hyper)
    net = LiftedNetwork(SIZES, "relu", "mse", lam=0.1, rho=(1e-2, 10.0), seed=3)
    fit_bcd(
        net,
        X,
        Y,
        batch_size=M,
        epochs=3,
        gamma=0.0,
        strict=False,
        eval_every=None,
        backend=FastBackend(tol=1e-6, max_iter=500, w_steps=2, x_steps=10),
    )
    for a, b in zip(run.net.W, net.W):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-9)
    assert [r["iteration"] for r in run.records] == [1, 2, 3]
    assert not all(np.allclose(a, b) for a, b in zip(run.net.W, kept.net.W))


@pytest.mark.parametrize("capped_reports", [None, True])
def test_fln_restart_factorises_w0_once_and_reports_capped_blocks_as_asked(
    capped_reports, data, monkeypatch
):
    """restart=True: W_0's X~_0 is the data's in every round, so its Gram factorisation is
    formed in the first round and reused after. capped_reports (default False): whether a block
    stopped at its step cap reports its residual and value; the weights are the same."""
    from fenchel_cvx.baselines.lifted import fln
    from fenchel_cvx.fast import FastBackend

    backends, factors, reports = [], [], []

    class Recording(FastBackend):
        def __init__(self, **kw):
            super().__init__(**kw)
            backends.append(self)

        def solve(self, block, start=None):
            res = super().solve(block, start)
            if block.kind == "w_hidden" and block.layer == 0:
                factors.append(res.info["cached_factor"])
            if res.status == "max_iter":
                reports.append(
                    (block.kind, bool(np.isfinite(res.residual)), bool(np.isfinite(res.value)))
                )
            return res

    monkeypatch.setattr(fln, "FastBackend", Recording)
    X, Y = data
    hyper = dict(lam=0.1, rho=(1e-2, 10.0), w_steps=2, x_steps=10, check_every=2, restart=True)
    if capped_reports is not None:
        hyper["capped_reports"] = capped_reports
    run = fit_lifted("fln", X, Y, X, Y, hidden=(5,), iterations=4, seed=3, **hyper)
    lean = not capped_reports
    assert [(b.capped_residual, b.capped_value) for b in backends] == [(not lean, not lean)]
    assert factors == [False, True, True, True]
    # a capped W-block reports no residual nor value (an X-block's descent guard may form its
    # value: FastBackend's capped_value)
    assert {kind for kind, _, _ in reports} == {"w_hidden", "x_last"}
    assert all(
        res is not lean and (value is not lean or kind.startswith("x"))
        for kind, res, value in reports
    )
    monkeypatch.undo()
    ref = fit_lifted(
        "fln", X, Y, X, Y, hidden=(5,), iterations=4, seed=3, **dict(hyper, capped_reports=not lean)
    )
    for W, Wr in zip(run.net.W, ref.net.W):
        np.testing.assert_array_equal(W, Wr)
    assert run.series("test_accuracy").tolist() == ref.series("test_accuracy").tolist()


@pytest.mark.parametrize(
    "method, hyper, word",
    [
        ("taylor", dict(beta=0.0), "beta"),
        ("taylor", dict(gamma=-1.0), "gamma"),
        ("lau", dict(rho=0), "rho"),
        ("lau", dict(gamma=-2), "gamma"),
        ("lau", dict(alpha=0.0), "alpha"),
        ("askari", dict(rho=(1.0, -1.0)), "rho"),
        ("askari", dict(lam=0), "lam"),
        ("askari", dict(x_steps=0), "x_steps"),
        ("taylor", dict(loss="cross_entropy"), "loss"),
        ("lau", dict(loss="hinge"), "loss"),
        ("sgd", dict(lr=0.0), "lr"),
        ("fln", dict(lam=0), "lam"),
        ("fln", dict(restart=1), "restart"),
        ("fln", dict(capped_reports="no"), "capped_reports"),
        ("lau", dict(eta=1.0), "eta"),
    ],
)
def test_bad_hyperparameters_are_refused_by_name(method, hyper, word, data):
    X, Y = data
    with pytest.raises(ValueError, match=word):
        fit_lifted(method, X, Y, X, Y, **hyper)


def test_bad_method_and_data_are_refused(data):
    X, Y = data
    with pytest.raises(ValueError, match="method"):
        fit_lifted("admm", X, Y, X, Y)
    with pytest.raises(ValueError, match="iterations"):
        fit_lifted("lau", X, Y, X, Y, iterations=0)
    with pytest.raises(ValueError, match="Y"):
        fit_lifted("lau", X, Y[:, :4], X, Y)
