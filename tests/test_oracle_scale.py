"""Issue 54's exact methods for the oracle at scale, against their references on small cases:
the MSE + ReLU X_L block by its dual in the output dimension (``oracle.output_dual``) against
``scipy.optimize.nnls`` column by column, the shared-Gram ``nnls.solve_x_last`` and the CVXPY
template; the ReLU W-rows by active-set Newton (``oracle.active_rows``) against the dual route of
``oracle.rows`` and the CVXPY template. Degenerate cases included: every unit inactive, every
unit active, duplicate data points, zero columns."""

import numpy as np
import pytest

from fenchel_cvx.activations import ReLU
from fenchel_cvx.blocks import WHidden, XLast, kkt_residual
from fenchel_cvx.losses import MSE
from fenchel_cvx.oracle import OracleBackend, active_rows, exact, nnls, output_dual
from fenchel_cvx.oracle import rows as rows_mod

TOL = 1e-9


def x_last(case, seed=0, K=4, p=7, m=12, lam=0.6):
    """An MSE + ReLU X_L block; ``case`` plants a degenerate structure."""
    rng = np.random.default_rng(seed)
    W = rng.standard_normal((K, p + 1)) / np.sqrt(p)
    U = rng.standard_normal((p, m))
    Y = rng.standard_normal((K, m))
    if case == "inactive":  # u << 0: every unit off at the optimum
        U = -10.0 - rng.random((p, m))
    elif case == "active":  # u >> 0 and y near its image: every unit on
        U = 10.0 + rng.random((p, m))
        Y = W[:, :p] @ U + W[:, p:] + 0.1 * Y
    elif case == "duplicates":
        U[:, m // 2 :], Y[:, m // 2 :] = U[:, : m - m // 2], Y[:, : m - m // 2]
    elif case == "zero_columns":  # a unit without outgoing weights; a data point of zeros
        W[:, 2] = 0.0
        U[:, 3], Y[:, 3] = 0.0, 0.0
    elif case == "wide":  # more outputs than units
        W = rng.standard_normal((12, 4)) / 2.0
        U, Y = rng.standard_normal((3, m)), rng.standard_normal((12, m))
    return XLast(layer=1, act_in=ReLU(), U_prev=U, lam_in=lam, loss=MSE(), W=W, Y=Y)


CASES = ["random", "inactive", "active", "duplicates", "zero_columns", "wide"]


@pytest.mark.parametrize("case", CASES)
def test_x_last_dual_equals_nnls_and_the_template(case):
    block = x_last(case)
    res = OracleBackend(tol=TOL).solve(block)
    assert res.info["solver"] == exact.mse_relu_dual.label and res.info["unsolved_columns"] == 0
    W, p = block.dense_W(), block.U_prev.shape[0]
    lawson_hanson = nnls.solve_columns(W, block.Y, block.U_prev, block.lam_in, shared=False)
    refs = [lawson_hanson, nnls.solve_x_last(block)]
    refs.append(OracleBackend(tol=TOL, exact=False, nnls=False).solve(block).argmin)  # CVXPY
    for ref in refs:  # strongly convex (lam > 0): one minimiser
        np.testing.assert_allclose(res.argmin, ref, rtol=0, atol=1e-8)
        v, vr = float(block.value(res.argmin)), float(block.value(ref))
        assert abs(v - vr) <= 1e-8 * max(1.0, abs(vr))
        assert kkt_residual(block, ref) <= 1e-8
    assert res.residual <= 1e-12 and abs(res.info["duality_gap"]) <= 1e-10
    Z = res.argmin
    if case == "inactive":
        assert np.all(Z == 0.0)
    if case == "active":
        assert np.all(Z > 0.0)
    if case == "duplicates":
        np.testing.assert_array_equal(Z[:, 6:], Z[:, :6])
    if case == "zero_columns":  # the unit feeds nothing: z = u_+ there
        np.testing.assert_allclose(Z[2], np.maximum(block.U_prev[2], 0.0), atol=1e-14)
        assert np.all(Z[:, 3] == 0.0)
    Wx, b = W[:, :p], W[:, p]
    Z2, R, steps, unsolved = output_dual.solve(Wx, b, block.Y, block.U_prev, block.lam_in, Z)
    assert steps == 1 and unsolved == 0  # from its own minimiser: done at once


def test_x_last_duality_gap_is_a_gap():
    """The primal value at z(r) minus the dual value at r: >= 0 at any r, 0 at the solution."""
    block = x_last("random", seed=3)
    W, p = block.dense_W(), block.U_prev.shape[0]
    args = (W[:, :p], W[:, p], block.Y, block.U_prev, block.lam_in)
    Z, R, _, _ = output_dual.solve(*args)
    assert abs(output_dual.duality_gap(*args, R)) <= 1e-12
    rng = np.random.default_rng(0)
    for _ in range(5):
        assert output_dual.duality_gap(*args, R + 0.1 * rng.standard_normal(R.shape)) > 1e-6


def test_x_last_dual_stopped_early_falls_back_to_nnls(monkeypatch):
    """A Newton stopped before the end is refused by the recomputed certificate; the backend
    then solves the block by the nonnegative least squares."""
    block = x_last("random", seed=1, m=40, lam=0.05)
    monkeypatch.setattr(output_dual, "NEWTON_STEPS", 1)
    Z, _, steps, unsolved = output_dual.solve_x_last(block)
    assert steps == 1 and unsolved > 0 and kkt_residual(block, Z) > TOL
    res = OracleBackend(tol=TOL).solve(block)
    assert res.info["solver"] == "nnls" and "KKT residual" in res.info["exact_fallback"]
    assert res.residual <= TOL


@pytest.mark.parametrize("chunk", [1, 5])
def test_x_last_dual_in_chunks_of_columns_equals_all_at_once(monkeypatch, chunk):
    """The columns go in chunks (``output_dual.CHUNK``; the last one partial): every column is
    the one solved with the others at once, the steps their maximum, none unsolved."""
    block = x_last("random", m=12)
    start = np.abs(np.random.default_rng(3).standard_normal(block.U_prev.shape))
    whole = output_dual.solve_x_last(block, start)
    early = output_dual.solve_x_last(block, start, max_steps=1)  # some columns not done
    assert 0 < early[3] < 12
    monkeypatch.setattr(output_dual, "CHUNK", chunk)
    Z, R, steps, unsolved = output_dual.solve_x_last(block, start)
    np.testing.assert_allclose(Z, whole[0], rtol=0, atol=1e-13)
    np.testing.assert_allclose(R, whole[1], rtol=0, atol=1e-13)
    assert (steps, unsolved) == whole[2:] and unsolved == 0
    assert output_dual.solve_x_last(block, start, max_steps=1)[3] == early[3]


def test_x_last_dual_is_the_method_of_mse_relu_only():
    assert exact.method_for(x_last("random")) is exact.mse_relu_dual
    from fenchel_cvx.activations import LeakyReLU

    leaky = XLast(1, LeakyReLU(0.1), np.ones((3, 2)), 1.0, MSE(), np.ones((2, 4)), np.ones((2, 2)))
    assert exact.method_for(leaky) is None


# --- the W-rows by active-set Newton --------------------------------------------------------
def w_hidden(case, seed=0, r=5, n=6, m=30, lam=0.7, rho=0.3, gamma=0.0):
    """A ReLU hidden W-block (``r`` rows, ``n`` inputs + bias, ``m`` points)."""
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, m))
    V = np.maximum(rng.standard_normal((r, m)), 0.0)
    if case == "inactive":  # no label mass: w* = 0, every point off
        V[:] = 0.0
    elif case == "active":  # positive inputs and outputs: every point on at w*
        X, V = 1.0 + rng.random((n, m)), 5.0 + rng.random((r, m))
    elif case == "duplicates":
        X[:, m // 2 :], V[:, m // 2 :] = X[:, : m - m // 2], V[:, : m - m // 2]
    elif case == "zero_columns":  # zero data points and an input that is always 0
        X[:, :4], X[2] = 0.0, 0.0
    Xt = np.vstack([X, np.ones((1, m))])
    W0 = rng.standard_normal((r, n + 1)) if gamma else None
    return WHidden(layer=0, Xt=Xt, rho=rho, gamma=gamma, W0=W0, act=ReLU(), V=V, lam=lam)


@pytest.mark.parametrize("case", ["random", "inactive", "active", "duplicates", "zero_columns"])
@pytest.mark.parametrize("gamma", [0.0, 0.5])
def test_w_rows_active_set_equals_the_dual_route_and_the_template(case, gamma):
    block = w_hidden(case, gamma=gamma)
    start = np.random.default_rng(7).standard_normal(block.shape)
    W, reports = active_rows.solve(block, start, 1e-14)
    dual = OracleBackend(tol=TOL).solve(block)
    template = OracleBackend(tol=TOL, exact=False).solve(block)
    assert dual.info["solver"].startswith("exact: ReLU rows (dual")
    for ref in (dual.argmin, template.argmin):
        np.testing.assert_allclose(W, ref, rtol=0, atol=1e-8)
        v, vr = float(block.value(W)), float(block.value(ref))
        assert abs(v - vr) <= 1e-8 * max(1.0, abs(vr))
    assert kkt_residual(block, W) <= 1e-12
    assert all(rep.residual <= 1e-12 and rep.steps <= 20 for rep in reports)
    U = W @ block.Xt
    if case == "inactive" and not gamma:
        assert np.abs(W).max() <= 1e-14
    if case == "active":
        assert np.all(U > 0.0)
    if case == "duplicates":
        np.testing.assert_allclose(U[:, 15:], U[:, :15], atol=1e-13)


def test_w_rows_finite_termination_and_warm_start():
    """From a start on the optimum's piece a full step lands on it; from the minimiser, none."""
    block = w_hidden("random", seed=2, m=60)
    W, reports = active_rows.solve(block, None, 0.0)  # target 0: ended by finite termination
    assert all(rep.exact and rep.changes[-1] == 0 for rep in reports)
    W2, reports2 = active_rows.solve(block, W, 1e-12)
    assert all(rep.steps == 0 for rep in reports2)
    np.testing.assert_array_equal(W2, W)


def test_w_rows_in_batches_equal_one_by_one():
    block = w_hidden("random", seed=6, r=7, m=50)
    start = np.random.default_rng(8).standard_normal(block.shape)
    ones, reports1 = active_rows.solve(block, start, 1e-13, batch=1)
    for batch in (3, 16):
        W, reports = active_rows.solve(block, start, 1e-13, batch=batch)
        np.testing.assert_allclose(W, ones, rtol=0, atol=1e-12)
        assert [r.changes for r in reports] == [r.changes for r in reports1]


def test_w_rows_stopped_early_is_not_certified():
    block = w_hidden("random", seed=4, m=60)
    W, reports = active_rows.solve(block, None, 1e-12, max_steps=1)
    assert max(rep.residual for rep in reports) > 1e-6
    assert kkt_residual(block, W) > 1e-6


# --- the active route of oracle.rows: ReLU rows above rows.ACTIVE_MIN points -----------------
def _active_route(monkeypatch, at=10):
    """Send the rows of more than ``at`` points to the active route (a small threshold)."""
    monkeypatch.setattr(rows_mod, "use_dual", lambda n, m, slope: False)
    monkeypatch.setattr(rows_mod, "ACTIVE_MIN", at)


@pytest.mark.parametrize("case", ["random", "inactive", "active", "duplicates", "zero_columns"])
@pytest.mark.parametrize("gamma", [0.0, 0.5])
def test_active_route_is_taken_above_the_threshold_and_agrees(case, gamma, monkeypatch):
    block = w_hidden(case, gamma=gamma)
    dual = OracleBackend(tol=TOL).solve(block)
    template = OracleBackend(tol=TOL, exact=False).solve(block)
    assert dual.info["solver"].endswith("(dual)")
    _active_route(monkeypatch)
    for start in (None, np.random.default_rng(3).standard_normal(block.shape)):
        found = exact.attempt(block, start, TOL)
        assert found.certified and found.residual <= 0.01 * TOL
        assert found.info["solver"] == "exact: ReLU rows (active)"
        assert found.info["uncertified_rows"] == 0 and found.info["fallback_steps"] == 0
        for ref in (dual.argmin, template.argmin):
            np.testing.assert_allclose(found.argmin, ref, rtol=0, atol=1e-8)
    _active_route(monkeypatch, at=block.Xt.shape[1])  # at the threshold: the primal route
    assert exact.attempt(block, None, TOL).info["solver"] == "exact: ReLU rows (primal)"


def test_active_route_not_for_a_leaky_relu(monkeypatch):
    from dataclasses import replace

    from fenchel_cvx.activations import LeakyReLU

    leaky = replace(w_hidden("random"), act=LeakyReLU(0.1))
    _active_route(monkeypatch)
    assert exact.attempt(leaky, None, TOL).info["solver"].endswith("(primal)")


def test_active_route_planted_fault_is_not_certified(monkeypatch):
    """``active_rows`` told a wrong residual (0: every row stops at its start) is caught by the
    recomputed gradient: every row takes the primal Newton fallback; without that fallback the
    block's certificate fails and the backend solves it by the CVXPY template."""
    block = w_hidden("random", seed=5, m=40)
    ref = OracleBackend(tol=TOL, exact=False).solve(block)
    _active_route(monkeypatch)
    true_residual = active_rows.row_residual
    monkeypatch.setattr(
        active_rows, "row_residual", lambda *a: (0.0 * true_residual(*a)[0], true_residual(*a)[1])
    )
    start = np.random.default_rng(4).standard_normal(block.shape)
    found = exact.attempt(block, start, TOL)
    assert found.info["newton_steps"] == 0  # the planted fault: no step taken
    assert found.info["uncertified_rows"] == block.shape[0] and found.info["fallback_steps"] > 0
    assert found.certified
    np.testing.assert_allclose(found.argmin, ref.argmin, rtol=0, atol=1e-8)
    monkeypatch.setattr(rows_mod, "NEWTON_STEPS", 0)  # no fallback steps either
    found = exact.attempt(block, start, TOL)
    assert not found.certified and "KKT residual" in found.reason
    res = OracleBackend(tol=TOL).solve(block, start=start)
    assert "KKT residual" in res.info["exact_fallback"] and not res.info["solver"].startswith(
        "exact:"
    )
    np.testing.assert_allclose(res.argmin, ref.argmin, rtol=0, atol=1e-6)


def test_active_rows_skip_inputs_that_are_always_zero():
    block = w_hidden("zero_columns")
    rows = active_rows.Rows.of(block.Xt, block.lam, 1.0)
    assert 2 not in rows.S and rows.S.size == block.Xt.shape[0] - 1
    A = np.zeros(block.Xt.shape[1], dtype=bool)
    A[::3] = True
    for mask in (A, ~A):  # by the set and by its complement (T - ...)
        Xs = block.Xt[rows.S][:, mask]
        np.testing.assert_allclose(rows.gram(mask), Xs @ Xs.T, rtol=0, atol=1e-12)


def test_w_rows_from_kept_grams_equal_formed_ones():
    """A second solve whose rows start from the Grams the first one ended with (updated by the
    points that changed sides): the same rows, and every final Gram that of its active set."""
    block = w_hidden("random", seed=9, r=6, m=80)
    rows = active_rows.Rows.of(block.Xt, block.lam, block.rho)
    Q = 3.0 * np.random.default_rng(2).standard_normal(block.shape)  # mixed active sets
    kept = [None] * Q.shape[0]
    W, _ = active_rows.solve_rows(rows, Q, rows.ridge(Q), 1e-13, kept=kept)
    rng = np.random.default_rng(1)
    Q2 = Q + 0.05 * rng.standard_normal(Q.shape)
    start = W + 0.05 * rng.standard_normal(W.shape)  # a few points on the other side
    moved = ((start @ block.Xt > 0) != (W @ block.Xt > 0)).sum(axis=1)
    assert moved.max() > 1
    fresh, _ = active_rows.solve_rows(rows, Q2, start, 1e-13)
    warm, reports = active_rows.solve_rows(rows, Q2, start, 1e-13, batch=4, kept=kept)
    assert all(rep.kept_gram for rep in reports)
    np.testing.assert_allclose(warm, fresh, rtol=0, atol=1e-12)
    for k, (A, G) in enumerate(kept):
        np.testing.assert_array_equal(A, warm[k] @ block.Xt > 0)
        np.testing.assert_allclose(G, rows.gram(A), rtol=0, atol=1e-10)


@pytest.mark.parametrize("gamma", [0.0, 0.5])
def test_w_rows_with_single_precision_grams_reach_the_same_rows(monkeypatch, gamma):
    """On many points the rows' Grams are float32 products (``active_rows.SINGLE_MIN``): each
    Newton step is then inexact, and the rows stop by their residual alone, at the float64
    rows' minimiser."""
    block = w_hidden("random", seed=3, m=300, gamma=gamma)
    start = np.random.default_rng(5).standard_normal(block.shape)
    exact, _ = active_rows.solve(block, start, 1e-13)
    monkeypatch.setattr(active_rows, "SINGLE_MIN", 100)
    W, reports = active_rows.solve(block, start, 1e-13)
    assert not any(rep.exact for rep in reports)  # no finite termination on a float32 Gram
    assert all(rep.residual <= 1e-13 for rep in reports)
    np.testing.assert_allclose(W, exact, rtol=0, atol=1e-10)
    assert kkt_residual(block, W) <= 1e-12


def test_a_row_factors_its_newton_matrix_once_a_gram(monkeypatch):
    """A step that changed no point's side leaves the Gram as it was, and the next step solves
    with the factor at hand (single-precision Grams: such steps are not the last)."""
    block = w_hidden("random", seed=11, m=300)  # (two rows take such a step)
    start = np.random.default_rng(5).standard_normal(block.shape)
    monkeypatch.setattr(active_rows, "SINGLE_MIN", 100)
    factor, calls = active_rows.Rows.factor, []
    monkeypatch.setattr(
        active_rows.Rows, "factor", lambda self, G: calls.append(1) or factor(self, G)
    )
    rows = active_rows.Rows.of(block.Xt, block.lam, block.rho)
    rows.G_src = (1.002 * rows.P).astype(np.float32)  # each step contracts about 1e3-fold
    Q = block.lam * (block.V @ block.Xt.T)
    W, reports = active_rows.solve_rows(rows, Q, start, 1e-13, batch=1)
    assert all(rep.residual <= 1e-13 and not rep.refined for rep in reports)
    reused = sum(c == 0 for rep in reports for c in rep.changes[:-1])
    assert reused > 0  # the case has steps that reuse a factor
    assert len(calls) == sum(rep.steps for rep in reports) - reused


def test_single_precision_updates_keep_each_gram_that_of_its_active_set(monkeypatch):
    """Updated in float32 products by the points that change sides, a row's Gram stays the
    float64 Gram of its active set to float32's rounding (a wrong update is off by O(1))."""
    monkeypatch.setattr(active_rows, "SINGLE_MIN", 100)
    block = w_hidden("random", seed=9, r=6, m=300)
    rows = active_rows.Rows.of(block.Xt, block.lam, block.rho)
    Q = 3.0 * np.random.default_rng(2).standard_normal(block.shape)
    kept = [None] * Q.shape[0]
    W, reports = active_rows.solve_rows(rows, Q, rows.ridge(Q), 1e-13, kept=kept)
    assert sum(c for rep in reports for c in rep.changes) > 0
    for k, (A, G) in enumerate(kept):
        np.testing.assert_array_equal(A, W[k] @ block.Xt > 0)
        exact_G = rows.gram(A, exact=True)
        assert np.max(np.abs(G - exact_G)) <= 1e-5 * (1.0 + np.max(np.abs(exact_G)))


def test_a_single_precision_gram_that_stops_contracting_is_formed_in_float64(monkeypatch):
    """A planted fault: the float32 copy of the data off by 50 % (a Gram far from the row's
    Hessian); the rows whose steps stop contracting form their Grams again in float64 and still
    reach the minimiser."""
    block = w_hidden("random", seed=3, m=300)
    start = np.random.default_rng(5).standard_normal(block.shape)
    exact, _ = active_rows.solve(block, start, 1e-13)
    monkeypatch.setattr(active_rows, "SINGLE_MIN", 100)
    rows = active_rows.Rows.of(block.Xt, block.lam, block.rho)
    rows.G_src = (1.5 * rows.P).astype(np.float32)
    Q = block.lam * (block.V @ block.Xt.T)
    # (1e-12: a row refined in float64 stops within a few hundred eps of 0, by the machine's
    # rounding; 1e-13 is at that floor)
    W, reports = active_rows.solve_rows(rows, Q, start, 1e-12)
    assert any(rep.refined for rep in reports)
    assert all(rep.residual <= 1e-12 for rep in reports)
    np.testing.assert_allclose(W, exact, rtol=0, atol=1e-10)


def test_scaled_step_solves_with_the_scaled_gram_of_all_points():
    """``Rows.scaled`` is ``-(lam alpha T + 2c I)^{-1} g`` row by row on the inputs that are
    nonzero somewhere, ``-g / 2c`` on the others."""
    block = w_hidden("zero_columns", seed=4, m=50)
    rows = active_rows.Rows.of(block.Xt, block.lam, block.rho)
    g = np.random.default_rng(0).standard_normal((3, block.Xt.shape[0]))
    alpha = np.array([0.0, 0.3, 1.0])
    d = rows.scaled(g, alpha)
    S, off = rows.S, np.setdiff1d(np.arange(block.Xt.shape[0]), rows.S)
    assert off.size  # the case has an input that is always 0
    for k in range(3):
        H = block.lam * alpha[k] * rows.T + 2.0 * rows.c * np.eye(S.size)
        np.testing.assert_allclose(d[k, S], -np.linalg.solve(H, g[k, S]), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(d[:, off], -g[:, off] / (2.0 * rows.c), rtol=1e-15)


def test_only_rows_without_a_kept_gram_take_scaled_steps(monkeypatch):
    """A row with no kept Gram (cold) takes ``SCALED_STEPS`` scaled steps before forming its
    Gram; a row that starts from a kept Gram takes none; both reach the same rows."""
    block = w_hidden("random", seed=9, r=6, m=80)
    rows = active_rows.Rows.of(block.Xt, block.lam, block.rho)
    scaled, calls = active_rows.Rows.scaled, []
    monkeypatch.setattr(
        active_rows.Rows, "scaled", lambda self, g, a: calls.append(len(g)) or scaled(self, g, a)
    )
    Q = 3.0 * np.random.default_rng(2).standard_normal(block.shape)
    start = np.random.default_rng(3).standard_normal(block.shape)
    kept = [None] * Q.shape[0]
    W, _ = active_rows.solve_rows(rows, Q, start, 1e-13, kept=kept)
    assert calls == [Q.shape[0]] * active_rows.SCALED_STEPS
    calls.clear()
    near = W + 0.05 * np.random.default_rng(1).standard_normal(W.shape)
    again, reports = active_rows.solve_rows(rows, Q + 0.01, near, 1e-13, kept=kept)
    assert calls == [] and all(rep.kept_gram for rep in reports)
    fresh, _ = active_rows.solve_rows(rows, Q + 0.01, near, 1e-13)
    np.testing.assert_allclose(again, fresh, rtol=0, atol=1e-12)
