"""The oracle's exact W-block methods (fenchel_cvx.oracle.exact) and the shared-Gram nonnegative
least squares (fenchel_cvx.oracle.nnls) against the CVXPY templates, and their fallback."""

import itertools

import numpy as np
import pytest
from scipy.optimize import nnls as scipy_nnls

from fenchel_cvx.activations import LeakyReLU, ReLU
from fenchel_cvx.blocks import WHidden, WLast, XLast, w_block, x_block
from fenchel_cvx.losses import MSE, CrossEntropy, softmax
from fenchel_cvx.oracle import OracleBackend, ce_columns, exact, nnls, rows
from test_oracle import instance, make_block

TOL = 1e-7
EXACT = [
    ("w_hidden", "relu", "mse", 0.0),
    ("w_hidden", "relu", "cross_entropy", 0.5),
    ("w_hidden", "leaky_relu", "mse", 0.0),
    ("w_hidden", "leaky_relu", "mse", 0.5),
    ("w_last", "relu", "mse", 0.0),
    ("w_last", "tanh", "mse", 0.5),
    ("w_last", "relu", "cross_entropy", 0.0),
    ("w_last", "sigmoid", "cross_entropy", 0.5),
    ("x_last", "relu", "cross_entropy", 0.0),
]


@pytest.mark.parametrize("kind,act,loss,gamma", EXACT)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_exact_method_equals_cvxpy_template(kind, act, loss, gamma, seed):
    block = make_block(kind, act, loss, gamma, seed=seed)
    fast = OracleBackend(tol=TOL).solve(block)
    ref = OracleBackend(tol=TOL, exact=False).solve(block)
    assert fast.info["solver"].startswith("exact:") and not ref.info["solver"].startswith("exact")
    assert fast.status == "optimal" and fast.converged and fast.residual <= 1e-9
    pieces = fast.argmin.shape[1 if kind.startswith("x") else 0]
    assert fast.info["n_subproblems"] == ref.info["n_subproblems"] == pieces
    # strongly convex (rho > 0): one minimiser, reached by both
    np.testing.assert_allclose(fast.argmin, ref.argmin, atol=1e-6)
    assert fast.value == pytest.approx(ref.value, rel=1e-9, abs=1e-9)
    assert fast.value <= ref.value + 1e-12 * (1 + abs(ref.value))


@pytest.mark.parametrize("chunk", [1, 3])
def test_ce_columns_in_chunks_reach_the_same_minimiser(monkeypatch, chunk):
    """The cross-entropy X_L columns in chunks (``ce_columns.CHUNK``; the last one partial),
    each stopped on its own scale: the block certified at the same minimiser."""
    block = make_block("x_last", "relu", "cross_entropy", 0.0, seed=1)
    whole = OracleBackend(tol=TOL).solve(block)
    monkeypatch.setattr(ce_columns, "CHUNK", chunk)
    assert block.U_prev.shape[1] % chunk or chunk == 1  # a partial last chunk, or one a column
    res = OracleBackend(tol=TOL).solve(block)
    assert res.info["solver"] == exact.ce_relu_columns.label and res.residual <= TOL
    np.testing.assert_allclose(res.argmin, whole.argmin, rtol=0, atol=1e-8)


def test_exact_methods_on_larger_blocks():
    """More data points than unknowns and the other way round: both routes of SharedGram."""
    for act, (m, sizes) in itertools.product(
        ["relu", "leaky_relu"], [(60, (12, 20, 4)), (15, (30, 25, 4))]
    ):
        net, X0, Y, Xs = instance(act, "cross_entropy", seed=3, sizes=sizes, m=m)
        for l in (0, 1):
            block = w_block(net, X0, Y, Xs, l, gamma=0.3, W0=net.W[l])
            fast = OracleBackend(tol=TOL).solve(block, start=net.W[l])
            ref = OracleBackend(tol=TOL, exact=False).solve(block)
            assert fast.info["solver"].startswith("exact:") and fast.residual <= 1e-9
            np.testing.assert_allclose(fast.argmin, ref.argmin, atol=1e-6)


def test_which_blocks_have_an_exact_method():
    relu = make_block("w_hidden", "relu", "mse", 0.0)
    assert exact.method_for(relu) is exact.relu_rows
    assert exact.method_for(make_block("w_hidden", "leaky_relu", "mse", 0.0)) is exact.leaky_rows
    assert exact.method_for(make_block("w_last", "relu", "mse", 0.0)) is exact.ridge
    assert (
        exact.method_for(make_block("w_last", "relu", "cross_entropy", 0.0)) is exact.softmax_newton
    )
    assert (
        exact.method_for(make_block("x_last", "relu", "cross_entropy", 0.0))
        is exact.ce_relu_columns
    )
    assert exact.method_for(make_block("x_last", "relu", "mse", 0.0)) is exact.mse_relu_dual
    assert set(exact.METHODS) == {
        (WHidden, ReLU),
        (WHidden, LeakyReLU),
        (WLast, MSE),
        (WLast, CrossEntropy),
        (XLast, CrossEntropy, ReLU),
        (XLast, MSE, ReLU),
    }
    for kind, act, loss in [
        ("w_hidden", "sigmoid", "mse"),
        ("w_hidden", "tanh", "mse"),
        ("x_last", "leaky_relu", "mse"),
        ("x_last", "sigmoid", "cross_entropy"),
        ("x_hidden", "relu", "mse"),
    ]:
        assert exact.attempt(make_block(kind, act, loss, 0.0)) is None
    relu.rho = 0.0  # not strictly convex: the proximal-point path
    assert exact.attempt(relu) is None


@pytest.mark.parametrize("act", ["relu", "leaky_relu"])
def test_warm_start_pivots_once_per_row(act):
    block = make_block("w_hidden", act, "mse", 0.5, seed=1)
    cold = exact.attempt(block, None, TOL)
    warm = exact.attempt(block, cold.argmin, TOL)
    assert cold.certified and warm.certified
    assert warm.info["pivots"] == block.V.shape[0] <= cold.info["pivots"]
    np.testing.assert_allclose(warm.argmin, cold.argmin, atol=1e-10)
    for bad in (cold.argmin[:-1], np.full_like(cold.argmin, np.nan)):  # ignored: a cold start
        again = exact.attempt(block, bad, TOL)
        assert again.certified and again.info["pivots"] == cold.info["pivots"]


def test_fallback_when_the_certificate_fails(monkeypatch):
    block = make_block("w_hidden", "relu", "mse", 0.5, seed=2)
    ref = OracleBackend(tol=TOL, exact=False).solve(block)
    monkeypatch.setattr(rows, "PIVOT_ROUNDS", 1)  # stop the pivoting after one round
    monkeypatch.setattr(rows, "REFINE_STEPS", 0)
    found = exact.attempt(block, None, TOL)
    assert not found.certified and found.residual > TOL and "KKT residual" in found.reason
    res = OracleBackend(tol=TOL).solve(block)
    assert res.info["solver"] == "CLARABEL" and res.residual <= TOL
    assert res.info["exact_fallback"] == found.reason
    np.testing.assert_allclose(res.argmin, ref.argmin, atol=1e-9)

    ce = make_block("w_last", "relu", "cross_entropy", 0.0, seed=2)
    monkeypatch.setattr(exact, "NEWTON_STEPS", 1)
    res = OracleBackend(tol=TOL).solve(ce)
    assert res.info["solver"] == "CLARABEL" and "exact: cross-entropy" in res.info["exact_fallback"]
    assert res.residual <= TOL

    xce = make_block("x_last", "relu", "cross_entropy", 0.0, seed=2)
    monkeypatch.setattr(ce_columns, "NEWTON_STEPS", 0)
    res = OracleBackend(tol=TOL).solve(xce)
    assert "exact: cross-entropy X_L" in res.info["exact_fallback"] and res.residual <= TOL

    def broken(block, W, g):
        raise np.linalg.LinAlgError("not positive definite")

    monkeypatch.setattr(exact, "ce_direction", broken)
    res = OracleBackend(tol=TOL).solve(ce)
    assert "LinAlgError: not positive definite" in res.info["exact_fallback"]
    assert res.info["solver"] == "CLARABEL" and res.residual <= TOL


def _kkt(H, b, x):
    y = H @ x - b
    return x.min(), y.min(), np.abs(x * y).max()


@pytest.mark.parametrize("m,r", [(30, 6), (7, 40)])
def test_solve_gram_is_the_nonnegative_least_squares(m, r):
    rng = np.random.default_rng(m)
    A = rng.standard_normal((m + 5, m))
    H, B = A.T @ A + 1e-2 * np.eye(m), A.T @ rng.standard_normal((m + 5, r))
    X, rounds, unsolved = nnls.solve_gram(nnls.SharedGram(H), B)
    assert not unsolved and rounds >= r
    R = np.linalg.cholesky(H).T  # 1/2 x'Hx - b'x = 1/2 ||R x - R^-T b||^2 + c
    for j in range(r):
        ref, _ = scipy_nnls(R, np.linalg.solve(R.T, B[:, j]), maxiter=50 * m)
        np.testing.assert_allclose(X[:, j], ref, atol=1e-9)
        xmin, ymin, comp = _kkt(H, B[:, j], X[:, j])
        assert xmin >= 0 and ymin >= -1e-9 and comp <= 1e-9


def test_shared_gram_routes_agree():
    rng = np.random.default_rng(5)
    A = rng.standard_normal((20, 12))
    gram = nnls.SharedGram(A.T @ A + 0.1 * np.eye(12))
    b = rng.standard_normal(12)
    for k in (3, 9):  # the factor of H_FF, and of P_GG
        F = np.zeros(12, dtype=bool)
        F[rng.choice(12, k, replace=False)] = True
        x, y = gram.solve(b, F)
        ref = np.linalg.solve(gram.H[np.ix_(F, F)], b[F])
        np.testing.assert_allclose(x[F], ref, rtol=1e-12, atol=1e-12)
        assert np.all(x[~F] == 0) and np.all(y[F] == 0)
        np.testing.assert_allclose(y[~F], (gram.H @ x - b)[~F], atol=1e-12)


def test_nnls_x_last_falls_back_to_scipy(monkeypatch):
    net, X0, Y, Xs = instance("relu", "mse", seed=4, m=30)
    block = x_block(net, X0, Y, Xs, net.n_hidden)
    calls = []
    solve_gram = nnls.solve_gram
    monkeypatch.setattr(nnls, "solve_gram", lambda *a: calls.append(1) or solve_gram(*a))
    nnls.solve_x_last(block)
    assert not calls  # 3 unknowns: scipy's nnls is faster
    monkeypatch.setattr(nnls, "SHARED_MIN", 1)
    shared = nnls.solve_x_last(block)
    assert calls
    by_column = nnls.solve_x_last(block, shared=False)
    np.testing.assert_allclose(shared, by_column, atol=1e-10)
    monkeypatch.setattr(
        nnls, "solve_gram", lambda gram, B: solve_gram(gram, B, np.zeros(B.shape, bool), max_iter=1)
    )
    np.testing.assert_allclose(nnls.solve_x_last(block), by_column, atol=1e-10)
    ref = OracleBackend(tol=TOL, nnls=False, exact=False).solve(block)
    np.testing.assert_allclose(shared, ref.argmin, atol=1e-6)


@pytest.mark.parametrize("act", ["relu", "leaky_relu"])
def test_dual_and_primal_routes_equal_the_template(act, monkeypatch):
    """The rows by the dual nnls and by primal semismooth Newton: one argmin, the template's."""
    for m, sizes in [(80, (5, 6, 3)), (12, (9, 7, 3))]:
        net, X0, Y, Xs = instance(act, "mse", seed=m, sizes=sizes, m=m)
        block = w_block(net, X0, Y, Xs, 0, gamma=0.2, W0=net.W[0])
        ref = OracleBackend(tol=TOL, exact=False).solve(block)
        for dual in (True, False):
            way = "dual" if dual else "primal"
            monkeypatch.setattr(rows, "route", lambda n, m, slope, way=way: way)
            for start in (None, net.W[0]):
                found = exact.attempt(block, start, TOL)
                assert found.certified and found.residual <= 1e-9
                assert found.info["solver"].endswith("(dual)" if dual else "(primal)")
                np.testing.assert_allclose(found.argmin, ref.argmin, atol=1e-6)


def test_route_choice():
    assert rows.use_dual(785, 500, 0.0) and rows.use_dual(785, 500, 0.01)  # MNIST W_0
    assert not rows.use_dual(65, 1000, 0.0)  # digits W_0
    assert not rows.use_dual(26, 3000, 0.0)  # conv patches
    assert not rows.use_dual(5000, 4001, 0.0)  # beyond DUAL_MAX
    # ReLU rows beyond DUAL_SIDE points an input (and DUAL_POINTS) leave the dual for the active
    # route; a leaky ReLU (no active route) keeps the dual up to DUAL_MAX variables
    big = rows.DUAL_SIDE * 785 + 1
    assert rows.use_dual(785, big, 0.0) and rows.route(785, big, 0.0) == "active"
    assert rows.route(785, big - 1, 0.0) == "dual"
    assert rows.use_dual(2000, 1600, 0.0) and rows.route(2000, 1600, 0.0) == "dual"  # wide
    assert rows.route(300, rows.DUAL_POINTS, 0.0) == "dual"  # beyond 2 n, yet a small block
    assert rows.use_dual(300, 1001, 0.0) and rows.route(300, 1001, 0.0) == "active"
    assert rows.route(785, 1000, 0.01) == "dual" and rows.route(785, 3000, 0.01) == "primal"
    assert rows.route(26, 3000, 0.0) == "primal"  # below ACTIVE_MIN the primal route stays


def test_the_dual_pivots_on_one_blas_thread(monkeypatch):
    """The dual's many small factors run on one BLAS thread whatever the caller's pools (a
    second OpenBLAS thread made them 12 times slower: ``rows`` module doc)."""
    from threadpoolctl import threadpool_info, threadpool_limits

    from fenchel_cvx.threads import owner

    def blas_threads():  # NumPy's and SciPy's BLAS, the pools the dual's factors run on
        return {
            p["num_threads"]
            for p in threadpool_info()
            if p["user_api"] == "blas" and owner(p["filepath"]) in ("numpy", "scipy")
        }

    seen = []
    pivot = nnls.solve_gram
    monkeypatch.setattr(nnls, "solve_gram", lambda *a: seen.append(blas_threads()) or pivot(*a))
    net, X0, Y, Xs = instance("relu", "mse", seed=12, sizes=(9, 7, 3), m=12)
    block = w_block(net, X0, Y, Xs, 0, gamma=0.2, W0=net.W[0])
    assert rows.route(*block.Xt.shape, 0.0) == "dual"
    with threadpool_limits(2, user_api="blas"):
        callers = blas_threads()
        if callers == {1}:
            pytest.skip("the BLAS pools here hold one thread at most")
        assert exact.attempt(block, None, TOL).certified
        assert blas_threads() == callers  # the caller's pools, restored
    assert seen == [{1}]


def test_cross_entropy_newton_directions_agree():
    for m, sizes in [(60, (12, 20, 4)), (15, (30, 25, 4))]:
        net, X0, Y, Xs = instance("relu", "cross_entropy", seed=1, sizes=sizes, m=m)
        block = w_block(net, X0, Y, Xs, 1, gamma=0.3, W0=net.W[1])
        g = block.grad(net.W[1])
        dense, woodbury = (exact.ce_direction(block, net.W[1], g, w) for w in (False, True))
        np.testing.assert_allclose(woodbury, dense, rtol=1e-8, atol=1e-10)
        assert float(np.sum(g * dense)) < 0  # a descent direction


@pytest.mark.parametrize("gamma", [0.0, 0.3])
def test_cross_entropy_newton_cg_on_many_points_equals_the_template(monkeypatch, gamma):
    """Past ``CG_MIN_POINTS`` the CE W_L block's Newton directions come from preconditioned CG
    (``softmax_cg``): the certified argmin equals the CVXPY template's and the formed Hessian's,
    and every direction descends. Planted fault: the Hessian-vector product without its
    ``P diag(P^T U)`` term (the softmax's coupling) fails the agreement."""
    from fenchel_cvx.oracle import softmax_cg

    net, X0, Y, Xs = instance("relu", "cross_entropy", seed=2, sizes=(6, 9, 4), m=80)
    block = w_block(net, X0, Y, Xs, 1, gamma=gamma, W0=net.W[1])
    ref = OracleBackend(tol=TOL, exact=False).solve(block)
    formed = exact.softmax_newton(block, None, 1e-11)[0]
    monkeypatch.setattr(softmax_cg, "CG_MIN_POINTS", 10)
    W, steps, info = exact.softmax_newton(block, None, 1e-11)
    assert info["cg_steps"] > 0 and block.kkt_residual(W) <= 1e-11
    np.testing.assert_allclose(W, formed, atol=1e-9)
    np.testing.assert_allclose(W, ref.argmin, atol=1e-6)
    cg = softmax_cg.SoftmaxCG(block, block.rho + block.gamma)
    g = block.grad(net.W[1])
    D, _ = cg.direction(net.W[1], g)
    assert float(np.sum(g * D)) < 0
    dense = exact.ce_direction(block, net.W[1], g, False)  # H^{-1} g by the formed Hessian
    HD = cg.hessian_times(softmax(net.W[1] @ block.Xt), D)
    Hd = cg.hessian_times(softmax(net.W[1] @ block.Xt), dense)
    np.testing.assert_allclose(Hd, -g, atol=1e-9)  # the product is the formed Hessian's
    assert np.linalg.norm(HD + g) <= min(0.1, np.linalg.norm(g)) * np.linalg.norm(g)


def test_cross_entropy_cg_products_on_shares_of_the_points_equal_one_threads(monkeypatch):
    """With ``threads`` the CG's Hessian products run on shares of the points, a thread each,
    their parts added through the reduction seam: the products, the directions and the solve
    equal the one-thread ones to round-off, and the shares ran. Planted fault: a reduction that
    drops the second share's part makes the products differ."""
    from fenchel_cvx import reduce
    from fenchel_cvx.oracle import softmax_cg

    net, X0, Y, Xs = instance("relu", "cross_entropy", seed=2, sizes=(6, 9, 4), m=4200)
    block = w_block(net, X0, Y, Xs, 1, gamma=0.0)
    assert softmax_cg.applies(block)
    one, two = (softmax_cg.SoftmaxCG(block, block.rho, threads=t) for t in (1, 2))
    P, V = softmax(net.W[1] @ block.Xt), np.random.default_rng(0).standard_normal(net.W[1].shape)
    runs, run = [], reduce.SimulatedComm.run
    monkeypatch.setattr(
        reduce.SimulatedComm, "run", lambda c, w: runs.append(c.running) or run(c, w)
    )
    np.testing.assert_allclose(two.hessian_times(P, V), one.hessian_times(P, V), rtol=1e-12)
    assert runs == [2]
    g = block.grad(net.W[1])
    np.testing.assert_allclose(
        two.direction(net.W[1], g)[0], one.direction(net.W[1], g)[0], rtol=1e-9, atol=1e-12
    )
    W1 = exact.softmax_newton(block, None, 1e-10)[0]
    W2, _, info2 = exact.softmax_newton(block, None, 1e-10, threads=2)
    assert info2["cg_steps"] > 0 and block.kkt_residual(W2) <= 1e-10
    # the figures handed to the certificate are the block's own at the returned point
    assert info2["figures"].residual == pytest.approx(block.kkt_residual(W2), rel=1e-6, abs=1e-12)
    assert info2["figures"].value == pytest.approx(block.value(W2), rel=1e-12)
    np.testing.assert_allclose(W2, W1, atol=1e-9)
    # from its solution: no step, and the figures handed over are those of the start
    W3, steps, info3 = exact.softmax_newton(block, W2, 1e-10, threads=2)
    assert steps == 0 and np.array_equal(W3, W2)
    assert info3["figures"].value == pytest.approx(block.value(W2), rel=1e-12)
    # the certified solve takes the threads (the method is ``threaded``): every figure and
    # product on two threads
    runs.clear()
    found = exact.attempt(block, None, 1e-9, threads=2)
    assert found.certified and found.residual <= 1e-9 and runs and set(runs) == {2}
    monkeypatch.setitem(reduce.OPS, "sum", lambda total, part: total)
    assert not np.allclose(two.hessian_times(P, V), one.hessian_times(P, V), rtol=1e-6)


def test_cross_entropy_cg_steps_run_on_one_blas_thread(monkeypatch):
    """Each CG product runs with NumPy's and SciPy's BLAS pools at one thread (two, set around
    the call, are restored after it)."""
    from threadpoolctl import threadpool_info

    from fenchel_cvx.oracle import softmax_cg
    from fenchel_cvx.threads import limit_threads, owner

    net, X0, Y, Xs = instance("relu", "cross_entropy", seed=2, sizes=(6, 9, 4), m=80)
    block = w_block(net, X0, Y, Xs, 1, gamma=0.0)
    cg = softmax_cg.SoftmaxCG(block, block.rho)

    def blas_threads():
        return {
            p["num_threads"]
            for p in threadpool_info()
            if p["user_api"] == "blas" and owner(p["filepath"]) in ("numpy", "scipy")
        }

    seen, product = [], cg.hessian_times
    monkeypatch.setattr(
        cg, "hessian_times", lambda P, V: seen.append(blas_threads()) or product(P, V)
    )
    with limit_threads({"numpy": 2, "scipy": 2}):
        assert blas_threads() == {2}
        D, steps = cg.direction(net.W[1], block.grad(net.W[1]))
        assert blas_threads() == {2}
    assert steps == len(seen) > 0 and all(threads == {1} for threads in seen)


def test_conv_w_blocks_equal_the_template():
    """A convolution's W-block is a dense W-block on its patches (many more than inputs)."""
    from test_conv_blocks import conv_state

    net, X0, Y, Xs = conv_state(m=20)
    for l in range(len(net.W)):
        block = w_block(net, X0, Y, Xs, l, gamma=0.3, W0=net.W[l])
        fast = OracleBackend(tol=TOL).solve(block, start=net.W[l])
        ref = OracleBackend(tol=TOL, exact=False).solve(block)
        assert fast.info["solver"].startswith("exact:") and fast.residual <= 1e-9
        np.testing.assert_allclose(fast.argmin, ref.argmin, atol=1e-6)
    assert "primal" in OracleBackend(tol=TOL).solve(w_block(net, X0, Y, Xs, 0)).info["solver"]
