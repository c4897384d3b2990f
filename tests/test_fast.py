"""Tests of fenchel_cvx.fast: the batched array-API block solvers against the CVXPY oracle.

Every block kind x activation x loss x gamma is solved by ``FastBackend`` and compared with
``OracleBackend`` (certified optimum) and with an independent ``scipy.optimize`` L-BFGS-B
reference; the same code then runs on ``array_api_strict`` arrays (the standard API only, as on
CuPy), in float32 without upcasts (on CuPy: tests/test_gpu.py).
"""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import optimize

import registry_params
from fenchel_cvx import activation, blocks
from fenchel_cvx.fast import FastBackend, pncg
from fenchel_cvx.fast.fused import EAGER
from fenchel_cvx.fast.pncg import PncgSettings, solve_pncg
from fenchel_cvx.network import LiftedNetwork

ACTS = tuple(registry_params.activations())  # every registered activation, by name
LOSSES = tuple(registry_params.losses())  # every registered loss
X_KINDS = ("x_hidden", "x_last")
W_KINDS = ("w_hidden0", "w_hidden1", "w_last")
CASES = [(a, lo, k, 0.0) for a in ACTS for lo in LOSSES for k in X_KINDS] + [
    (a, lo, k, g) for a in ACTS for lo in LOSSES for k in W_KINDS for g in (0.0, 0.3)
]
REL = 1e-6  # "within 1e-6 relative of the optimum"
#: the method the fast backend reports for a last W-block, by the loss's ``last_w_solver``
LAST_W_METHOD = {"ridge": "cholesky", "pncg": "pncg", "newton": "newton"}


def _act(name):
    return registry_params.built(name)  # leaky ReLU at slope 0.1 (``TEST_PARAMS``)


def make_state(act, loss, seed=0, sizes=(5, 4, 3, 3), m=7):
    """A 2-hidden-layer network at a perturbed (non feed-forward) lifted point."""
    rng = np.random.default_rng(seed)
    net = LiftedNetwork(sizes, _act(act), loss, lam=[1.0, 0.7], rho=[0.1, 0.05, 0.2], seed=seed)
    X0 = rng.standard_normal((sizes[0], m))
    Y = registry_params.targets(loss, sizes[-1], m, rng)  # one-hot labels or Gaussian
    Xs, _ = net.forward(X0)
    lo, hi = registry_params.clip_bounds(act, 0.02)  # 0.02 inside an open end of phi's range
    Xs = [np.clip(X + 0.3 * rng.standard_normal(X.shape), lo, hi) for X in Xs]
    W0s = [W + 0.2 * rng.standard_normal(W.shape) for W in net.W]
    return net, X0, Y, Xs, W0s


def make_block(kind, net, X0, Y, Xs, W0s, gamma=0.0):
    if kind.startswith("x"):
        return blocks.x_block(net, X0, Y, Xs, 1 if kind == "x_hidden" else 2)
    l = {"w_hidden0": 0, "w_hidden1": 1, "w_last": 2}[kind]
    return blocks.w_block(net, X0, Y, Xs, l, gamma=gamma, W0=W0s[l] if gamma else None)


def case_block(act, loss, kind, gamma, seed=0):
    return make_block(kind, *make_state(act, loss, seed), gamma=gamma)


@pytest.fixture(scope="module")
def oracle():
    # imported here so that the CuPy test runs without CVXPY
    from fenchel_cvx.oracle import OracleBackend

    return OracleBackend()


def _assert_optimal(res, opt, tol=1e-6):
    assert res.converged and res.status == "optimal"
    assert res.residual <= tol
    assert abs(res.value - opt) <= REL * abs(opt) + 1e-12, (res.value, opt)


# --- against the certified optimum --------------------------------------------------------------
@pytest.mark.parametrize("act,loss,kind,gamma", CASES)
def test_matches_oracle(oracle, act, loss, kind, gamma):
    block = case_block(act, loss, kind, gamma)
    res = FastBackend().solve(block)
    ref = oracle.solve(block)
    assert ref.status == "optimal"
    _assert_optimal(res, ref.value)
    assert res.value == pytest.approx(float(block.value(res.argmin)), rel=1e-15, abs=0)
    assert res.residual == block.kkt_residual(res.argmin)
    assert res.info["method"] == {"x": "fista", "w": "pncg"}[kind[0]] or (
        kind == "w_last" and res.info["method"] == LAST_W_METHOD[block.loss.last_w_solver]
    )


def _lbfgs(block, Z0, act, starts=3, seed=0):
    """Independent reference: L-BFGS-B from Z0 and random starts, bounded to the domain."""
    shape = Z0.shape
    bnd = (None, None)
    if isinstance(block, blocks.XBlock):  # phi's range, 1e-9 inside an end where F' is infinite
        bnd = registry_params.clip_bounds(act, 1e-9)

    def fun(z):
        Z = z.reshape(shape)
        return float(block.value(Z)), np.asarray(block.grad(Z)).ravel()

    rng = np.random.default_rng(seed)
    best = np.inf
    for k in range(starts):
        z = Z0.ravel() if k == 0 else Z0.ravel() + 0.5 * rng.standard_normal(Z0.size)
        z = np.clip(
            z, *(b if b is not None else -np.inf if i == 0 else np.inf for i, b in enumerate(bnd))
        )
        r = optimize.minimize(
            fun,
            z,
            jac=True,
            method="L-BFGS-B",
            bounds=[bnd] * z.size,
            options=dict(ftol=1e-16, gtol=1e-12, maxiter=20000, maxcor=30),
        )
        best = min(best, r.fun)
    return best


@pytest.mark.parametrize(
    "act,loss,kind,gamma", [c for c in CASES if c[3] == 0.0 or c[2] == "w_hidden1"]
)
def test_matches_lbfgs(act, loss, kind, gamma):
    block = case_block(act, loss, kind, gamma, seed=1)
    res = FastBackend().solve(block)
    best = _lbfgs(block, np.asarray(res.argmin), act)
    assert res.converged
    assert res.value <= best + REL * abs(best) + 1e-12, (res.value, best)


@settings(max_examples=20, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    act=st.sampled_from(ACTS),
    loss=st.sampled_from(LOSSES),
    kind=st.sampled_from(X_KINDS + W_KINDS),
    gamma=st.sampled_from((0.0, 1.0)),
)
def test_random_instances_match_oracle(oracle, seed, act, loss, kind, gamma):
    block = case_block(act, loss, kind, gamma, seed=seed)
    res = FastBackend().solve(block)
    _assert_optimal(res, oracle.solve(block).value)


# --- the array API standard: array_api_strict, float32, CuPy ------------------------------------
def _to(xp, dtype, net, X0, Y, Xs, W0s):
    def conv(A):
        return xp.asarray(np.asarray(A, dtype=dtype))

    net.W = [conv(W) for W in net.W]
    return net, conv(X0), conv(Y), [conv(X) for X in Xs], [conv(W) for W in W0s]


@pytest.mark.parametrize("act,loss,kind,gamma", [c for c in CASES if c[3] or c[2][0] == "x"])
def test_array_api_strict(act, loss, kind, gamma):
    xps = pytest.importorskip("array_api_strict")
    ref = FastBackend().solve(case_block(act, loss, kind, gamma))
    block = make_block(kind, *_to(xps, "float64", *make_state(act, loss)), gamma=gamma)
    res = FastBackend().solve(block)
    assert type(res.argmin) is type(xps.asarray(0.0)) and res.argmin.dtype == xps.float64
    assert res.converged and res.residual <= 1e-6
    assert res.value == pytest.approx(ref.value, rel=1e-9)


@pytest.mark.parametrize("xp_name", ["numpy", "array_api_strict"])
@pytest.mark.parametrize(
    "act,loss,kind,gamma",
    [
        ("relu", "cross_entropy", "x_last", 0.0),
        ("sigmoid", "mse", "x_hidden", 0.0),
        ("tanh", "cross_entropy", "w_hidden1", 0.3),
        ("relu", "mse", "w_hidden0", 0.3),
        ("leaky_relu", "cross_entropy", "w_last", 0.3),
        ("relu", "mse", "w_last", 0.0),
    ],
)
def test_float32_stays_float32(xp_name, act, loss, kind, gamma):
    xp = pytest.importorskip(xp_name)
    ref = FastBackend().solve(case_block(act, loss, kind, gamma))
    block = make_block(kind, *_to(xp, "float32", *make_state(act, loss)), gamma=gamma)
    res = FastBackend().solve(block)
    assert res.argmin.dtype == xp.float32
    assert res.info["dtype"] == "float32" and 1e-6 < res.info["tol"] < 1e-5  # the float32 floor
    assert res.converged and res.residual <= res.info["tol"]
    assert res.value == pytest.approx(ref.value, rel=1e-5)


@pytest.mark.parametrize("xp_name", ["numpy", "array_api_strict"])
@pytest.mark.parametrize("act", ACTS)
def test_newton_rows_and_row_freezing(xp_name, act):
    """The W-hidden paths beyond plain CG (batched Newton rows, frozen rows) in the standard API,
    against the default solve (itself checked against the oracle above)."""

    xp = pytest.importorskip(xp_name)
    state = make_state(act, "mse", seed=3, sizes=(8, 12, 4, 3), m=30)
    ref = FastBackend(tol=1e-10, newton_cap=0).solve(make_block("w_hidden0", *state, gamma=0.3))
    block = make_block("w_hidden0", *_to(xp, "float64", *state), gamma=0.3)
    rows_first = PncgSettings(newton_cap=30, newton_start=0, flip_tol=30, compact_every=1)
    W, it, info = solve_pncg(xp, block, block.W0, 1e-8, 500, settings=rows_first)
    assert info["converged"] and info["newton_rows"] > 0
    assert info["row_iterations"] < 12 * it  # rows were frozen on the way
    assert block.kkt_residual(W) <= 1e-8
    assert float(block.value(W)) == pytest.approx(ref.value, rel=REL)


@pytest.mark.parametrize("xp_name", ["numpy", "array_api_strict"])
def test_newton_rows_on_many_points_read_k_among_their_active_points(xp_name, monkeypatch):
    """Past ``K_POINTS`` points a Newton row forms its entries of K = X~^T X~ from X~'s columns
    (the m x m K of a full-MNIST W_0 block would need 27 GB): the same steps as from K formed,
    in chunks of rows (``GATHER_BYTES`` small here: one row a chunk)."""
    from fenchel_cvx.fast import wblocks

    xp = pytest.importorskip(xp_name)
    state = make_state("relu", "mse", seed=3, sizes=(8, 12, 4, 3), m=30)
    block = make_block("w_hidden0", *_to(xp, "float64", *state), gamma=0.3)
    rows_first = PncgSettings(newton_cap=30, newton_start=0, flip_tol=30, compact_every=1)
    runs = {}
    for points, chunk in ((10**9, 1 << 27), (0, 8)):
        monkeypatch.setattr(wblocks, "K_POINTS", points)
        monkeypatch.setattr(wblocks, "GATHER_BYTES", chunk)
        runs[points] = solve_pncg(xp, block, block.W0, 1e-8, 500, settings=rows_first)
    (W_k, it_k, _), (W_g, it_g, info_g) = runs[10**9], runs[0]
    assert info_g["newton_rows"] > 0 and it_g == it_k and info_g["converged"]
    assert float(xp.max(xp.abs(W_g - W_k))) <= 1e-12


def test_dtype_argument_casts():
    block = case_block("relu", "cross_entropy", "w_hidden1", 0.3)
    res = FastBackend(dtype="float32").solve(block)
    assert res.argmin.dtype == np.float32 and res.info["dtype"] == "float32"
    res64 = FastBackend(dtype=np.float64).solve(block)
    assert res64.argmin.dtype == np.float64


def test_array_library_helpers():
    """``arrays.namespace``: NumPy for NumPy arrays and what NumPy converts, the array's own
    library for array-API arrays; ``arrays.clip``: np.clip's values, in the array's library."""
    xps = pytest.importorskip("array_api_strict")
    from fenchel_cvx.arrays import clip, namespace

    A = np.linspace(-2, 2, 9).reshape(3, 3)
    assert namespace(A) is np and namespace([1.0, 2.0]) is np and namespace(3.0) is np
    assert namespace(xps.asarray(A)) is xps
    assert namespace(np.float32(1.0)) is np
    for lo, hi in ((0, None), (None, 0.5), (-1, 1), (None, None)):
        np.testing.assert_array_equal(clip(A, lo, hi), np.clip(A, lo, hi))
        got = clip(xps.asarray(A), lo, hi)
        assert namespace(got) is xps and got.dtype == xps.float64
        np.testing.assert_array_equal(np.asarray(got), np.clip(A, lo, hi))
        A32 = A.astype(np.float32)  # NumPy's own path keeps the dtype and takes array bounds
        assert clip(A32, lo, hi).dtype == np.float32
    bounds = np.full_like(A, -0.5), np.full_like(A, 0.5)
    np.testing.assert_array_equal(clip(A, *bounds), np.clip(A, -0.5, 0.5))
    np.testing.assert_array_equal(clip(A, None, bounds[1]), np.minimum(A, 0.5))


@pytest.mark.parametrize("axis", [-1, -2])
def test_vecdot_sums_the_products_in_the_arrays_library(axis):
    """``arrays.vecdot``: ``sum(x1 * x2, axis)`` (axis negative, as the array API asks), in the
    arrays' library and dtype; arrays of two libraries are refused."""
    from fenchel_cvx.arrays import namespace, vecdot

    rng = np.random.default_rng(0)
    A, B = rng.standard_normal((2, 4, 7))
    want = np.sum(A * B, axis=axis)
    np.testing.assert_allclose(vecdot(A, B, axis=axis), want, rtol=1e-12)
    got = vecdot(A.astype(np.float32), B.astype(np.float32), axis=axis)
    assert got.dtype == np.float32 and got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5)
    assert vecdot(A[0], B[0]) == pytest.approx(float(A[0] @ B[0]), rel=1e-12)  # 1-D: a number
    xps = pytest.importorskip("array_api_strict")
    got = vecdot(xps.asarray(A), xps.asarray(B), axis=axis)
    assert namespace(got) is xps
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-12)
    with pytest.raises(TypeError):
        vecdot(A, xps.asarray(B), axis=axis)


# --- iteration caps, tolerances, warm starts ----------------------------------------------------
def test_w_steps_exact_count_and_descent():
    block = case_block("relu", "cross_entropy", "w_hidden0", 0.3)
    start = block.W0
    before = float(block.value(start))
    for k in (1, 3):
        res = FastBackend(w_steps=k).solve(block, start=start)
        assert res.iterations == k and not res.converged and res.status == "max_iter"
        assert res.value < before
    full = FastBackend().solve(block, start=start)
    assert full.converged and full.iterations > 3
    # w_steps does not apply to X-blocks; the ridge closed form is exact in one step
    assert FastBackend(w_steps=1).solve(case_block("relu", "mse", "x_last", 0)).converged
    ridge = FastBackend(w_steps=1).solve(case_block("relu", "mse", "w_last", 0.3))
    assert ridge.converged and ridge.iterations == 1 and ridge.info["method"] == "cholesky"


def test_x_steps_caps_and_never_ends_above_the_start():
    for kind in ("x_hidden", "x_last"):
        block = case_block("tanh", "cross_entropy", kind, 0.0)
        start = np.clip(block.U_prev, -0.9, 0.9)
        before = float(block.value(start))
        for k in (1, 2, 5):
            res = FastBackend(x_steps=k).solve(block, start=start)
            assert res.iterations <= k and not res.converged
            assert res.value <= before
        assert FastBackend(x_steps=500).solve(block, start=start).converged
    # x_steps does not apply to W-blocks
    assert FastBackend(x_steps=1).solve(case_block("relu", "mse", "w_hidden0", 0.3)).converged


def test_inexact_x_solve_that_would_rise_returns_its_start(monkeypatch):
    """The guard behind BCD descent: a capped X solve whose last iterate is worse than the start
    (here a prox map made to overshoot) returns the start and says so."""
    block = case_block("relu", "cross_entropy", "x_last", 0.0)
    start = np.maximum(block.U_prev, 0)
    good = FastBackend(x_steps=2).solve(block, start=start)
    assert not good.info["reverted"] and good.value < float(block.value(start))
    monkeypatch.setattr(
        type(block.act_in),
        "x_prox",
        staticmethod(lambda xp, act, r, tau, s: (xp.clip(r, 0, None) + 5.0, s)),
    )
    bad = FastBackend(x_steps=2).solve(block, start=start)
    assert bad.info["reverted"] and np.array_equal(bad.argmin, start)
    assert bad.value == float(block.value(start))


@pytest.mark.parametrize("act", ACTS)
def test_one_certified_x_step_descends_and_forms_one_value(monkeypatch, act):
    """One FISTA step from the start with a certified L and an exact (closed-form) prox is a
    proximal-gradient step, which never rises (Beck & Teboulle 2009, Lemma 2.3): such a solve
    (a class with ``x_prox``: ReLU, leaky ReLU) forms the value of its returned point only, not
    the start's. Where the prox is iterative (sigmoid, tanh, ELU: no ``x_prox``) the guard still
    forms both values, as two steps do (momentum, no such guarantee) for every activation. On
    every loss and X-block kind the value comes out below the start's."""
    values = []
    for cls in (blocks.XHidden, blocks.XLast):
        real = cls.value_with_forward
        monkeypatch.setattr(
            cls,
            "value_with_forward",
            lambda self, Z, U, real=real: values.append(1) or real(self, Z, U),
        )
    rng = np.random.default_rng(3)
    for loss in LOSSES:
        for kind in X_KINDS:
            block = case_block(act, loss, kind, 0.0)
            start = block.act_in.phi(block.U_prev + 0.5 * rng.standard_normal(block.U_prev.shape))
            before = float(block.value(start))
            values.clear()
            one = FastBackend(x_steps=1).solve(block, start=start)
            assert one.iterations == 1 and len(values) == (
                1 if registry_params.closed_form_prox(type(block.act_in)) else 2
            )
            assert one.value < before and not one.info["reverted"]
            assert one.value == pytest.approx(float(block.value(one.argmin)), rel=1e-12)
            values.clear()
            FastBackend(x_steps=2).solve(block, start=start)
            assert len(values) == 2


def test_cross_entropy_w_step_sees_small_changes_in_float32():
    """The last layer's line search guards descent with the loss's change along the step
    (``CrossEntropy.line_change``, through ``LastLoss.data_change``). In
    float32, at logits near 27 on 500 points, the change must come out to a few eps of the
    terms it sums (as the float64 change of the same float32 arrays), not to the rounding of
    two sums near 13,500 (3e-4, above a small step's true change)."""
    import dataclasses

    from scipy.special import logsumexp

    from fenchel_cvx.fast.wblocks import LastLoss

    rng = np.random.default_rng(1)
    m, k = 500, 10
    y = rng.integers(0, k, m)
    U = rng.normal(0, 1, (k, m)) + 18.0
    U[y, np.arange(m)] += 7.0 + rng.exponential(2.0, m)
    dU = 1e-3 * rng.normal(size=(k, m))
    block = case_block("relu", "cross_entropy", "w_last", 0.0)
    block = dataclasses.replace(block, Y=np.eye(k, dtype=np.float32)[:, y])
    U32, dU32 = U.astype(np.float32), dU.astype(np.float32)
    prob = LastLoss(np, block, pre=None)
    change, size = prob.data_change(U32, dU32)
    u, du, Y = U32.astype(np.float64), dU32.astype(np.float64), block.Y.astype(np.float64)
    exact = np.sum(logsumexp(u + du, axis=0) - logsumexp(u, axis=0)) - np.sum(Y * du)
    assert abs(float(change[0, 0]) - exact) <= 1e-6 * abs(exact) + 64 * np.finfo(
        np.float32
    ).eps * float(size[0, 0])
    assert 64 * np.finfo(np.float32).eps * float(size[0, 0]) < 1e-2 * abs(exact)  # a sharp test
    # a large step (expm1 would overflow) takes the direct form: finite, and right
    big = 1e3 * rng.normal(size=(k, m))
    change, _ = prob.data_change(u, big)
    exact = np.sum(logsumexp(u + big, axis=0) - logsumexp(u, axis=0)) - np.sum(Y * big)
    assert np.isfinite(change[0, 0]) and abs(float(change[0, 0]) - exact) <= 1e-9 * abs(exact)


@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize("kind", ["w_hidden0", "w_last"])
def test_a_line_search_reads_its_safeguard_from_its_last_trial(act, kind, monkeypatch, calls):
    """Where each trial of a W-block's line search also sums the data term's change at its
    length (``safeguard_in_trials``: on shards, or where the chain compiles into one pass), the
    descent safeguard takes no collective of its own (and a hidden block's rows no pass of their
    own) where the search returns the length it tried last, and the solve is the one that
    takes them, bit for bit."""
    from fenchel_cvx.fast import wblocks

    block = case_block(act, "cross_entropy", kind, 0.3)
    counts = calls(wblocks._Problem, "search")
    calls(wblocks.HiddenRows, "change_along")

    class Counting(type(wblocks.LOCAL)):
        def reduce(self, values, op):
            counts["reductions"] += 1
            return super().reduce(values, op)

    def solve(in_trials):
        monkeypatch.setattr(wblocks._Problem, "safeguard_in_trials", lambda *a: in_trials)
        counts.clear()
        backend = FastBackend(w_steps=6)
        backend.comm = Counting()
        return backend.solve(block, start=block.W0).argmin, counts.copy()

    fused, seen = solve(True)
    apart, seen_apart = solve(False)
    assert seen["search"] == seen_apart["search"] == 6
    assert seen["reductions"] < seen_apart["reductions"], (seen, seen_apart)
    if kind == "w_hidden0":
        assert seen["change_along"] == 0 and seen_apart["change_along"] == 6, (seen, seen_apart)
    np.testing.assert_array_equal(fused, apart)


def test_one_eager_process_keeps_the_safeguards_own_pass(calls):
    """In one process on chains that run eagerly (no collective to save, and two passes either
    way) each trial sums the derivatives alone, and the safeguard takes its own pass: a search
    of several trials computes the change once."""
    from fenchel_cvx.fast import wblocks

    block = case_block("relu", "cross_entropy", "w_hidden0", 0.3)
    counts = calls(wblocks._Problem, "search")
    calls(wblocks.HiddenRows, "change_along", "derivs_at", "derivs_change_at")
    FastBackend(w_steps=6).solve(block, start=block.W0)
    assert counts["derivs_change_at"] == 0 and counts["change_along"] == counts["search"] == 6
    assert counts["derivs_at"] >= counts["search"]


def test_a_line_search_that_returns_a_length_it_did_not_try_checks_it(monkeypatch):
    """The safeguard's own trial where the search ends on a length it never evaluated (a step
    below rounding, or its cap): here every length is nudged after the search. A block without
    regulariser (rho = gamma = 0) leaves the change alone to decide: at a length far past the
    minimum the objective rises, and the step falls back to the bracket's left end."""
    import dataclasses

    from fenchel_cvx.fast import _util, wblocks

    block = case_block("relu", "cross_entropy", "w_hidden0", 0.3)
    block = dataclasses.replace(block, rho=0.0, gamma=0.0)  # (W0 kept: the start)
    trials, evaluations, factor = [], [], [1.0 + 1e-9]
    both = wblocks.HiddenRows.derivs_change_at

    def evaluated(self, U, dU, t):
        evaluations.append(t)
        return both(self, U, dU, t)

    def nudged(xp, derivs, *args, **kwargs):
        def tried(t):
            trials.append(t)
            return derivs(t)

        t, lo, nls = _util.newton_1d(xp, tried, *args, **kwargs)
        return t * factor[0], lo, nls

    monkeypatch.setattr(wblocks._Problem, "safeguard_in_trials", lambda *a: True)
    monkeypatch.setattr(wblocks.HiddenRows, "derivs_change_at", evaluated)
    monkeypatch.setattr(wblocks, "newton_1d", nudged)
    before = float(block.value(block.W0))
    res = FastBackend(w_steps=2).solve(block, start=block.W0)
    assert len(evaluations) == len(trials) + 2 and res.value < before
    factor[0] = 1e6  # far past the minimum along every direction: the objective rises there
    trials.clear(), evaluations.clear()
    res = FastBackend(w_steps=1).solve(block, start=block.W0)
    assert len(evaluations) == len(trials) + 1 and res.value <= before


def test_w_block_takes_the_callers_product():
    """A W-block's start image (``image=``: W X~ at the start, e.g. the driver's feed-forward
    pass) replaces the solver's own product; one of another shape is ignored."""
    for kind, gamma in (("w_hidden0", 0.3), ("w_last", 0.0)):
        block = case_block("relu", "cross_entropy", kind, gamma)
        start = block.W0 if gamma else np.zeros((block.Y.shape[0], block.Xt.shape[0]))
        solve = FastBackend(w_steps=2).solve
        ref = solve(block, start=start)
        assert np.array_equal(solve(block, start, image=start @ block.Xt).argmin, ref.argmin)
        wrong = np.full((1, 1), np.nan)
        assert np.array_equal(solve(block, start, image=wrong).argmin, ref.argmin)
        poisoned = start @ block.Xt + 1.0  # it is used
        assert not np.array_equal(solve(block, start, image=poisoned).argmin, ref.argmin)


def test_capped_residual_false_skips_only_the_report():
    """capped_residual=False: the same argmin and value, the residual of a capped solve NaN."""
    cases = [
        ("w_hidden0", dict(w_steps=1)),
        ("w_last", dict(w_steps=2)),
        ("x_last", dict(x_steps=2)),
        ("x_hidden", dict(x_steps=1)),
    ]
    for kind, steps in cases:
        block = case_block("relu", "cross_entropy", kind, 0.3)
        start = block.W0 if kind[0] == "w" else np.maximum(block.U_prev, 0) + 0.1
        ref = FastBackend(**steps).solve(block, start=start)
        lean = FastBackend(capped_residual=False, **steps).solve(block, start=start)
        assert np.array_equal(lean.argmin, ref.argmin) and lean.value == ref.value
        assert np.isnan(lean.residual) and not np.isnan(ref.residual)
        assert lean.status == ref.status == "max_iter" and not lean.converged
        assert lean.value == pytest.approx(float(block.value(lean.argmin)), rel=1e-12)
    done = FastBackend(capped_residual=False).solve(
        case_block("relu", "cross_entropy", "w_last", 0.3)
    )
    assert done.converged and done.residual <= 1e-6  # not capped: reported as always


@pytest.mark.parametrize("loss", LOSSES)
# the activations whose prox is a Newton solve (no closed-form ``x_prox``): the guard is theirs
@pytest.mark.parametrize(
    "act", registry_params.activations(lambda c: not registry_params.closed_form_prox(c))
)
def test_one_step_of_an_iterative_prox_never_ends_above_its_start_in_float32(act, loss):
    """A prox without closed form (sigmoid, tanh, ELU) is a Newton solve: in float32 its one
    step from near the optimum can raise the value (by up to 2 % on blocks near 3e-3, beyond
    the evaluation's rounding), so their descent guard stays: the returned point is no higher
    than the start, to a few eps of the value."""
    from fenchel_cvx.blocks import x_block

    rng = np.random.default_rng(1)
    net = LiftedNetwork(
        (30, 40, 20, 10), activation=act, loss=loss, seed=2, dtype=np.float32, lam=3.0
    )
    X0 = rng.standard_normal((30, 500)).astype(np.float32)
    Y = registry_params.targets(loss, 10, 500, rng).astype(np.float32)
    Xs, _ = net.feed_forward(X0)
    lo, hi = registry_params.clip_bounds(act, 1e-6)
    rises = []
    for l in (1, 2):
        block = x_block(net, X0, Y, Xs, l)
        opt = FastBackend(tol=1e-5, max_iter=3000).solve(block, start=Xs[l - 1]).argmin
        for delta in (1e-3, 1e-5, 1e-7):
            start = np.clip(opt + delta * rng.standard_normal(opt.shape), lo, hi).astype(np.float32)
            res = FastBackend(x_steps=1, capped_value=False).solve(block, start=start)
            v0, v1 = float(block.value(start)), float(block.value(res.argmin))
            if v1 - v0 > 4 * np.finfo(np.float32).eps * abs(v0):  # beyond evaluation rounding
                rises.append((l, delta, v1 - v0))
    assert not rises


def test_capped_value_false_skips_only_the_report():
    """capped_value=False: the same argmin; a capped solve's value NaN where only the report
    needed it (W-blocks, one certified X step), the value as before where the X solve's descent
    guard formed it (two steps); a converged solve reports its value as always."""
    cases = [
        ("w_hidden0", dict(w_steps=1), True),
        ("w_last", dict(w_steps=2), True),
        ("x_hidden", dict(x_steps=1), True),
        ("x_last", dict(x_steps=1), True),
        ("x_last", dict(x_steps=2), False),
    ]
    for kind, steps, skipped in cases:
        block = case_block("relu", "cross_entropy", kind, 0.3)
        start = block.W0 if kind[0] == "w" else np.maximum(block.U_prev, 0) + 0.1
        ref = FastBackend(capped_residual=False, **steps).solve(block, start=start)
        lean = FastBackend(capped_residual=False, capped_value=False, **steps).solve(
            block, start=start
        )
        assert np.array_equal(lean.argmin, ref.argmin) and lean.status == ref.status == "max_iter"
        assert np.isnan(lean.value) == skipped and not np.isnan(ref.value)
        assert skipped or lean.value == ref.value
    for kind in ("w_last", "x_hidden"):
        done = FastBackend(capped_value=False).solve(case_block("relu", "cross_entropy", kind, 0.3))
        assert done.converged and done.value == pytest.approx(
            float(case_block("relu", "cross_entropy", kind, 0.3).value(done.argmin)), rel=1e-12
        )


def test_inexact_w_solve_reports_its_residual():
    """w_steps: the solver's residual (from W X~ updated in place) is the block's residual."""
    for kind in ("w_hidden0", "w_last"):
        block = case_block("relu", "cross_entropy", kind, 0.3)
        res = FastBackend(w_steps=2).solve(block, start=block.W0)
        assert not res.converged
        assert res.residual == pytest.approx(block.kkt_residual(res.argmin), rel=1e-9)
    # past the re-sync of W X~ (every 16 steps) and the freezing of converged rows (every 8)
    rng = np.random.default_rng(0)
    net = LiftedNetwork((60, 40, 10), "relu", "cross_entropy", lam=1.0, rho=1e-3, seed=0)
    X0 = np.maximum(rng.standard_normal((60, 200)) + 0.3 * rng.standard_normal((60, 1)), 0)
    V = np.maximum(net.forward(X0)[0][0] + 0.1 * rng.standard_normal((40, 200)), 0)
    block = blocks.w_block(net, X0, None, [V], 0, gamma=0.01, W0=net.W[0])
    res = FastBackend(w_steps=40, tol=1e-9).solve(block, start=net.W[0])
    assert not res.converged and res.iterations == 40 and res.info["row_iterations"] < 40 * 40
    assert res.residual == pytest.approx(block.kkt_residual(res.argmin), rel=1e-6)
    assert res.value == pytest.approx(float(block.value(res.argmin)), rel=1e-9)  # rows frozen


@pytest.mark.parametrize("kind", ["w_hidden0", "w_last"])
@pytest.mark.parametrize("w_steps", [1, 3, None])
def test_w_solve_value_from_the_product_at_hand_is_the_blocks_value(kind, w_steps):
    """The reported value comes from the solver's W X~ (no recomputed product): it is the
    block's."""
    block = case_block("relu", "cross_entropy", kind, 0.3)
    res = FastBackend(w_steps=w_steps).solve(block, start=block.W0)
    assert res.value == pytest.approx(float(block.value(res.argmin)), rel=1e-10, abs=1e-12)


def test_last_x_block_has_a_certified_step_no_backtracking():
    """W_p with few rows (the output layer): ||W_p|| exact, L certified, no line search; this is
    what keeps float32 X-blocks from stalling on rounding in the value test."""
    for dtype in (np.float64, np.float32):
        block = case_block("relu", "cross_entropy", "x_last", 0.0)
        block = blocks.XLast(
            **{
                f: (
                    getattr(block, f).astype(dtype)
                    if isinstance(getattr(block, f), np.ndarray)
                    else getattr(block, f)
                )
                for f in block.__dataclass_fields__
            }
        )
        res = FastBackend().solve(block)
        assert res.converged and res.info["backtracks"] == 0 and res.argmin.dtype == dtype
        Wp = block.W[:, :-1].astype(float)
        assert res.info["lipschitz"] >= 0.5 * np.linalg.norm(Wp, 2) ** 2 * block.Y.sum(0).max()
    # a hidden X-block: L = lam_out sup(phi') ||W_p||^2 (sigmoid: 1/4), also certified
    hidden = case_block("sigmoid", "cross_entropy", "x_hidden", 0.0)
    res = FastBackend().solve(hidden)
    Wp = hidden.W[:, :-1]
    assert res.converged and res.info["backtracks"] == 0
    assert res.info["lipschitz"] >= hidden.lam_out * 0.25 * np.linalg.norm(Wp, 2) ** 2


def test_wide_x_block_uses_power_iteration_and_backtracking():
    """W_p with more than EXACT_EIG_MAX rows and columns: L from power iteration, guarded by the
    backtracking test; the solve still matches the oracle's optimum."""
    from fenchel_cvx.fast.xblocks import EXACT_EIG_MAX

    net = LiftedNetwork((20, 140, 150, 5), "tanh", "mse", lam=1.0, rho=0.1, seed=1)
    rng = np.random.default_rng(1)
    X0, Y = rng.standard_normal((20, 30)), rng.standard_normal((5, 30))
    Xs = [np.clip(X + 0.2 * rng.standard_normal(X.shape), -0.95, 0.95) for X in net.forward(X0)[0]]
    block = blocks.x_block(net, X0, Y, Xs, 1)
    assert min(block.W[:, :-1].shape) > EXACT_EIG_MAX
    res = FastBackend().solve(block)
    ref = _lbfgs(block, Xs[0], "tanh")
    assert res.converged and res.value <= ref + REL * abs(ref)


def test_w_steps_on_cross_entropy_last_layer():
    block = case_block("tanh", "cross_entropy", "w_last", 0.3)
    res = FastBackend(w_steps=2).solve(block, start=block.W0)
    assert res.iterations == 2 and not res.converged
    assert res.value < float(block.value(block.W0))


def test_max_iter_and_tol_respected():
    block = case_block("tanh", "mse", "x_last", 0.0)
    capped = FastBackend(max_iter=2).solve(block)
    assert capped.iterations == 2 and not capped.converged and capped.status == "max_iter"
    assert capped.residual > 1e-6
    loose, tight = FastBackend(tol=1e-3).solve(block), FastBackend(tol=1e-10).solve(block)
    assert loose.converged and loose.residual <= 1e-3
    assert tight.converged and tight.residual <= 1e-10 and tight.iterations > loose.iterations
    wb = case_block("relu", "cross_entropy", "w_hidden1", 0.3)
    capped = FastBackend(max_iter=1).solve(wb)
    assert capped.iterations == 1 and not capped.converged


# (block, where its NaN sits): the data it reads beside the point it solves for
NAN_CASES = [
    ("x_hidden", "X0"), ("x_hidden", 1), ("x_last", 0), ("x_last", "Y"),
    ("w_hidden0", 0), ("w_hidden1", 1),
]  # fmt: skip


@pytest.mark.parametrize("loss", ["mse", "cross_entropy"])
@pytest.mark.parametrize("kind,where", NAN_CASES)
def test_a_block_with_a_nan_in_its_data_stops_at_once(kind, where, loss):
    """A NaN in a block's data (a fault upstream, caught by the round's argmin checks) makes
    its residual NaN or inf at every step: the solver stops after its first step, stalled,
    instead of running all its max_iter steps."""
    net, X0, Y, Xs, W0s = make_state("relu", loss)
    X0, Y, Xs = X0.copy(), Y.copy(), [X.copy() for X in Xs]
    {"X0": X0, "Y": Y}.get(where, Xs[where] if isinstance(where, int) else None)[0, 0] = np.nan
    res = FastBackend(tol=1e-6, max_iter=2000).solve(make_block(kind, net, X0, Y, Xs, W0s, 0.3))
    assert res.iterations == 1 and res.status == "stalled" and not res.converged
    assert not np.isfinite(res.residual)


def test_warm_start_at_optimum_takes_no_step():
    for kind in ("x_hidden", "w_hidden1", "w_last"):
        block = case_block("sigmoid", "cross_entropy", kind, 0.3)
        first = FastBackend().solve(block)
        again = FastBackend().solve(block, start=first.argmin)
        assert again.converged and again.iterations == 0


def test_x_solve_starts_from_the_callers_product_where_its_start_is_inside():
    """``image = A(W, Z) + b`` at the start Z spares the solver that product: an image of the
    right shape is used (a poisoned one changes the step), and ignored where the start is
    projected into the domain first (its product would no longer be A(W, start))."""
    block = case_block("relu", "cross_entropy", "x_hidden", 0.0)
    start = np.maximum(block.U_prev, 0) + 0.1
    ref = FastBackend(x_steps=1).solve(block, start=start)
    hinted = FastBackend(x_steps=1).solve(block, start=start, image=block.forward(start))
    np.testing.assert_allclose(hinted.argmin, ref.argmin, rtol=0, atol=1e-12)
    poisoned = FastBackend(x_steps=1).solve(block, start=start, image=block.forward(start) + 1.0)
    assert not np.allclose(poisoned.argmin, ref.argmin)
    outside = start - 0.2  # some entries < 0: projected first, the image is not used
    assert np.any(outside < 0)
    wrong = block.forward(outside)
    np.testing.assert_allclose(
        FastBackend(x_steps=1).solve(block, start=outside, image=wrong).argmin,
        FastBackend(x_steps=1).solve(block, start=outside).argmin,
        rtol=0,
        atol=1e-12,
    )


def test_fista_start_is_read_not_copied_where_it_is_inside():
    """``_inside`` returns the start itself where it lies in the domain (strictly inside an open
    range), and a clipped copy otherwise (NaN kept), leaving the caller's array unchanged."""
    from fenchel_cvx.fast.xblocks import _inside

    relu, sigmoid = activation("relu"), activation("sigmoid")
    Z = np.array([[0.0, 1.5], [2.0, 0.25]])
    assert _inside(np, relu, Z) is Z
    inner = np.array([[0.2, 0.7]])
    assert _inside(np, sigmoid, inner) is inner
    for act, bad in (
        (relu, np.array([[-1.0, 2.0]])),
        (sigmoid, np.array([[0.0, 0.5]])),
        (relu, np.array([[np.nan, 2.0]])),
    ):
        before = bad.copy()
        out = _inside(np, act, bad)
        assert out is not bad and np.array_equal(bad, before, equal_nan=True)
        assert np.isnan(out[0, 0]) if np.isnan(before[0, 0]) else 0 <= out[0, 0] < before[0, 1]
    assert 0 < _inside(np, sigmoid, np.array([[0.0]]))[0, 0] < 1e-300


def test_capped_x_solve_at_an_optimum_converges_in_one_step():
    """A capped X solve does not test its start: its first step does. From an optimum the step
    stays within rounding of it, and the solve reports convergence after that one step."""
    for act in ACTS:
        for kind in X_KINDS:
            block = case_block(act, "cross_entropy", kind, 0.0)
            first = FastBackend(tol=1e-10).solve(block)
            again = FastBackend(x_steps=3).solve(block, start=first.argmin)
            assert again.converged and again.iterations == 1 and again.residual <= 1e-6
            np.testing.assert_allclose(again.argmin, first.argmin, rtol=0, atol=1e-9)


def test_sigmoid_x_block_from_the_boundary_stays_inside():
    block = case_block("sigmoid", "cross_entropy", "x_last", 0.0)
    for start in (np.zeros(block.U_prev.shape), np.ones(block.U_prev.shape)):
        res = FastBackend().solve(block, start=start)
        assert res.converged and np.all(res.argmin > 0) and np.all(res.argmin < 1)


# --- the data-space (Woodbury) preconditioner: fewer points than rows of X~ --------------------
WIDE = dict(sizes=(12, 10, 9, 3), m=7)  # every W-block's X~ (13, 11, 10 rows) has 7 columns


@pytest.mark.parametrize(
    "act,loss,kind,gamma",
    [
        ("relu", "cross_entropy", "w_hidden0", 0.3),
        ("sigmoid", "mse", "w_hidden1", 0.3),
        ("tanh", "cross_entropy", "w_hidden0", 0.0),
        ("relu", "cross_entropy", "w_last", 0.3),
        ("leaky_relu", "cross_entropy", "w_last", 0.0),
    ],
)
def test_data_space_matches_oracle(oracle, act, loss, kind, gamma):
    block = make_block(kind, *make_state(act, loss, seed=4, **WIDE), gamma=gamma)
    c = block.rho + block.gamma
    res = FastBackend().solve(block)
    assert res.info["data_space"] == (c > 0)  # rho > 0 here: data space in every case
    _assert_optimal(res, oracle.solve(block).value)
    assert res.residual == block.kkt_residual(res.argmin)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_data_space_step_is_the_parameter_space_step(dtype):
    """Woodbury in data space gives g G^{-1} and its image under X~; the same step as G^{-1}."""
    from fenchel_cvx.fast.gram import DataGram, ParamGram, inverse_pays

    rng = np.random.default_rng(0)
    Xt = np.vstack([rng.random((30, 12)), np.ones((1, 12))]).astype(dtype)
    A, W, W0 = (rng.standard_normal(s).astype(dtype) for s in ((5, 12), (5, 31), (5, 31)))
    rho, gamma, w = 0.01, 0.5, 0.7
    R = 2 * rho * W + 2 * gamma * (W - W0)
    g = A @ Xt.T + R
    pg, dg = ParamGram(np, Xt, w, 2 * (rho + gamma)), DataGram(np, Xt, w, 2 * (rho + gamma))
    assert DataGram.applies(Xt, w, 1.0) and not DataGram.applies(Xt.T, w, 1.0)
    assert not DataGram.applies(Xt, None, 1.0) and not DataGram.applies(Xt, w, 0.0)
    s, sU = dg.split(A, R, R @ Xt)
    factor = ParamGram(np, Xt, w, 2 * (rho + gamma), inverse=False)  # Cholesky solves
    assert not hasattr(factor, "Ginv") and inverse_pays(31, 31) and not inverse_pays(31, 30)
    dgi = DataGram(np, Xt, w, 2 * (rho + gamma), inverse=True)  # M^{-1} formed
    si, sUi = dgi.split(A, R, R @ Xt)
    rtol = 1e-10 if dtype == np.float64 else 2e-3
    for got, ref in (
        (s, pg.apply(g)),
        (dg.apply(g), pg.apply(g)),
        (sU, s @ Xt),
        (factor.apply(g), pg.apply(g)),
        (si, s),
        (sUi, sU),
        (dgi.apply(g), pg.apply(g)),
    ):
        assert got.dtype == dtype
        np.testing.assert_allclose(got, ref, rtol=rtol, atol=rtol * np.abs(ref).max())


def test_data_space_inverse_is_formed_where_it_pays():
    """``gram_preconditioner``: M^{-1} is formed where the rows it will precondition (rows of W
    times the step cap) reach its size m, else M is applied by Cholesky solves."""
    from fenchel_cvx.fast.wblocks import gram_preconditioner

    block = make_block("w_hidden0", *make_state("relu", "cross_entropy", seed=5, **WIDE), gamma=1.0)
    m = block.Xt.shape[1]
    few, many = (gram_preconditioner(np, block, rows=r)[0] for r in (m - 1, m))
    assert few.data_space and few.Minv is None and many.Minv is not None
    np.testing.assert_allclose(
        many.Minv @ (few.w * few.K + few.c2 * np.eye(m)), np.eye(m), atol=1e-8
    )


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_data_space_inverse_only_where_well_conditioned(dtype):
    """An explicit M^{-1} loses accuracy with M's condition number (float32: the span solver's
    identity sigma K = (lam / w) A - (c2 / w) B); it is formed only where eps times the bound
    (trace M + c2) / c2 is at most 1e-3, else M is applied by solves. Both apply M^{-1}."""
    from fenchel_cvx.fast.gram import DataGram

    rng = np.random.default_rng(0)
    Xt = np.vstack([rng.random((60, 20)) * 10, np.ones((1, 20))]).astype(dtype)  # trace ~ 2e4
    # a right-hand side in K's dominant eigenspace, as the span solver's (U - U0) = Z K term
    A = (rng.standard_normal((3, 20)) @ (Xt.T @ Xt).astype(np.float64)).astype(dtype)
    for c2, inverse in ((200.0, True), (2e-2, dtype == np.float64)):
        dg = DataGram(np, Xt, 1.0, c2, inverse=True)
        assert (dg.Minv is not None) == inverse
        ref = np.linalg.solve(
            (Xt.T @ Xt).astype(np.float64) + c2 * np.eye(20), A.T.astype(np.float64)
        ).T
        # the identity the span solver relies on: B K = A - c2 B for B = A M^{-1}
        B = dg.solve(A)
        resid = np.abs(B @ dg.K - (A - c2 * B)).max() / np.abs(A).max()
        assert resid < (1e-6 if dtype == np.float32 else 1e-13), (c2, resid)
        np.testing.assert_allclose(B, ref, rtol=0, atol=5e-3 * np.abs(ref).max())


def test_data_space_one_step_equals_parameter_space(monkeypatch):
    """w_steps=1 from W0 (the driver's first round of a batch): the data-space solve takes the
    parameter-space step, within rounding; a stale data-space factor is never reused."""
    from fenchel_cvx.fast import gram

    block = make_block("w_hidden0", *make_state("relu", "cross_entropy", seed=5, **WIDE), gamma=1.0)
    fast = FastBackend(w_steps=1, gram_reuse=3)
    data = fast.solve(block, start=block.W0)
    monkeypatch.setattr(gram.DataGram, "applies", staticmethod(lambda *a: False))
    param = FastBackend(w_steps=1).solve(block, start=block.W0)
    assert data.info["data_space"] and not param.info["data_space"]
    np.testing.assert_allclose(data.argmin, param.argmin, rtol=1e-9, atol=1e-12)
    assert data.value == pytest.approx(param.value, rel=1e-12) and data.value < block.value(
        block.W0
    )
    monkeypatch.undo()
    other = make_block("w_hidden0", *make_state("relu", "cross_entropy", seed=6, **WIDE), gamma=1.0)
    assert not fast.solve(other, start=other.W0).info["cached_factor"]


def test_data_space_start_bound_never_hides_an_optimal_start():
    """In data space the first step's figures bound the start's KKT residual from below: where
    the bound passes tol the start is not optimal; at the optimum no step is taken."""

    for seed, (act, loss, kind) in enumerate(
        [
            ("relu", "cross_entropy", "w_hidden0"),
            ("sigmoid", "mse", "w_hidden1"),
            ("tanh", "cross_entropy", "w_last"),
        ]
    ):
        block = make_block(kind, *make_state(act, loss, seed=seed, **WIDE), gamma=0.3)
        opt = FastBackend(tol=1e-12).solve(block)
        for W, tol in (
            (block.W0, 1e-3),
            (block.W0, 1e2),
            (opt.argmin, 1e-10),
            (0.5 * (block.W0 + opt.argmin), 1e-4),
        ):
            # the first direction, and the bound's figures (a start that passes any test)
            start = pncg.init(pncg.problem(np, block, np.inf, 10), W)
            if pncg._above(pncg.problem(np, block, tol, 10), start):
                assert block.kkt_residual(W) > tol
        again = FastBackend(tol=1e-7).solve(block, start=opt.argmin)
        assert opt.residual <= 1e-7 and again.iterations == 0 and again.converged
        assert again.info["data_space"]


def test_data_space_with_newton_rows_and_row_freezing():

    state = make_state("relu", "mse", seed=3, sizes=(40, 12, 4, 3), m=10)
    block = make_block("w_hidden0", *state, gamma=0.3)
    ref = FastBackend(tol=1e-10, newton_cap=0).solve(block)
    rows_first = PncgSettings(newton_cap=30, newton_start=0, flip_tol=30, compact_every=1)
    W, it, info = solve_pncg(np, block, block.W0, 1e-8, 500, settings=rows_first)
    assert ref.info["data_space"] and info["data_space"]
    assert info["converged"] and info["newton_rows"] > 0 and info["row_iterations"] < 12 * it
    assert block.kkt_residual(W) <= 1e-8
    assert float(block.value(W)) == pytest.approx(ref.value, rel=REL)


@pytest.mark.parametrize("xp_name", ["numpy", "array_api_strict"])
def test_data_space_float32_and_standard_api(xp_name):
    xp = pytest.importorskip(xp_name)
    ref = FastBackend().solve(
        make_block("w_hidden0", *make_state("tanh", "mse", seed=2, **WIDE), gamma=0.3)
    )
    for dtype in ("float64", "float32"):
        state = _to(xp, dtype, *make_state("tanh", "mse", seed=2, **WIDE))
        res = FastBackend().solve(make_block("w_hidden0", *state, gamma=0.3))
        assert res.info["data_space"] and res.argmin.dtype == getattr(xp, dtype)
        assert res.converged and res.residual <= res.info["tol"]
        assert res.value == pytest.approx(ref.value, rel=1e-9 if dtype == "float64" else 1e-5)


def _span_block(act, seed=0, rho=0.0, gamma=0.3):
    """A hidden W-block with fewer points (7) than rows of X~ (13), rho = 0 as the paper's
    batched runs: the case ``fast.span`` serves."""
    import dataclasses

    block = make_block(
        "w_hidden0", *make_state(act, "cross_entropy", seed=seed, **WIDE), gamma=gamma
    )
    return dataclasses.replace(block, rho=rho)


@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize("w_steps", [1, 3, 10])
def test_span_steps_are_the_parameter_space_steps(monkeypatch, act, w_steps):
    """Capped steps from W0 run on the coefficients Z of W = W0 + Z X~^T: the same iterates as
    the parameter-space CG, within rounding, with the same reported value and residual."""
    from fenchel_cvx.fast import span

    block = _span_block(act)
    res = FastBackend(w_steps=w_steps).solve(block, start=block.W0)
    lean = FastBackend(w_steps=w_steps, capped_residual=False).solve(block, start=block.W0)
    leaner = FastBackend(w_steps=w_steps, capped_residual=False, capped_value=False).solve(
        block, start=block.W0
    )
    monkeypatch.setattr(span, "applies", lambda *a: False)
    ref = FastBackend(w_steps=w_steps).solve(block, start=block.W0)
    assert res.info["method"] == "pncg-span" and ref.info["method"] == "pncg"
    assert res.iterations == ref.iterations
    # near the optimum (10 steps) the exact line search's stopping test amplifies rounding
    np.testing.assert_allclose(res.argmin, ref.argmin, rtol=0, atol=1e-6)
    assert res.value == pytest.approx(ref.value, rel=1e-10)
    assert res.value == pytest.approx(float(block.value(res.argmin)), rel=1e-12)
    assert res.residual == pytest.approx(block.kkt_residual(res.argmin), rel=1e-9)
    assert res.value < float(block.value(block.W0))
    assert np.array_equal(lean.argmin, res.argmin) and np.isnan(lean.residual)
    assert np.array_equal(leaner.argmin, res.argmin) and leaner.info["method"] == "pncg-span"
    assert np.isnan(leaner.value) == (leaner.status == "max_iter") and not np.isnan(lean.value)


def test_capped_span_solve_near_its_optimum_never_raises_its_value():
    """A W_0 block near its optimum: 300 MNIST images (fewer than X~'s 785 rows: data space,
    ``fast.span``), float32, V = relu(W0 X~ + 1e-7 noise), so W0 is within rounding of the
    optimum. Ten capped CG steps drive the data-space image ``s X~`` below its rounding; without
    the guard the line search steps 1e4 times too far and the block's value rises from 1.1e-11
    to 3.2e-6 (float64 evaluations of both points), above the certificate's tolerance 1e-6
    (|F| + 1). The guard puts the rows that rose back at W0."""
    from fenchel_cvx.certificate import Certificate
    from fenchel_cvx.datasets import load_mnist5k

    rng = np.random.default_rng(0)
    X = load_mnist5k().X_train[:, :300]
    Xt = np.vstack([X, np.ones((1, 300))]).astype(np.float32)
    W0 = (rng.uniform(-1, 1, (50, 785)) * np.sqrt(6 / 835)).astype(np.float32)
    V = np.maximum(W0 @ Xt + 1e-7 * rng.standard_normal((50, 300)), 0).astype(np.float32)
    block = blocks.WHidden(
        layer=0, Xt=Xt, rho=0.0, gamma=1.0, W0=W0, act=activation("relu"), V=V, lam=0.2
    )
    res = FastBackend(w_steps=10, capped_residual=False, capped_value=False).solve(block, start=W0)
    assert res.info["method"] == "pncg-span" and res.info["reverted_rows"] >= 1
    before, after = float(block.value(W0)), float(block.value(res.argmin))
    Certificate(strict=True).check_descent("W_0", before, after, before)  # raised unguarded
    exact = blocks.WHidden(
        layer=0,
        Xt=Xt.astype(float),
        rho=0.0,
        gamma=1.0,
        W0=W0.astype(float),
        act=activation("relu"),
        V=V.astype(float),
        lam=0.2,
    )
    assert float(exact.value(res.argmin.astype(float))) <= 1.01 * float(exact.value(W0 * 1.0))


@pytest.mark.parametrize("act, w_steps", [("sigmoid", 3)])
def test_span_restarts_where_the_parameter_space_loop_does(monkeypatch, act, w_steps):
    """Seed 1: PR+ turns uphill early in this solve; both loops restart there (steepest). (Near
    the optimum the uphill test compares numbers at rounding level: counts may differ there.)"""
    from fenchel_cvx.fast import span

    block = _span_block(act, seed=1)
    res = FastBackend(w_steps=w_steps).solve(block, start=block.W0)
    monkeypatch.setattr(span, "applies", lambda *a: False)
    ref = FastBackend(w_steps=w_steps).solve(block, start=block.W0)
    assert res.info["restarts"] == ref.info["restarts"] >= 1
    np.testing.assert_allclose(res.argmin, ref.argmin, rtol=0, atol=1e-6)


def test_span_applies_only_where_it_reproduces_the_parameter_space_solve():
    import dataclasses

    from fenchel_cvx.fast import span, wblocks

    block = _span_block("relu")
    pre, _ = wblocks.gram_preconditioner(np, block)
    assert span.applies(np, block, block.W0, pre, 10, 10)
    assert span.applies(np, block, block.W0.copy(), pre, 1, 10)
    assert not span.applies(np, block, block.W0 + 1e-3, pre, 10, 10)  # not at the centre
    assert not span.applies(np, block, block.W0, pre, 11, 10)  # Newton rows may start
    assert span.applies(np, block, block.W0, pre, 40, 10, newton_cap=0)  # they never do
    rho = _span_block("relu", rho=0.1)
    assert not span.applies(np, rho, rho.W0, wblocks.gram_preconditioner(np, rho)[0], 10, 10)
    wide = dataclasses.replace(
        make_block("w_hidden0", *make_state("relu", "cross_entropy"), gamma=0.3), rho=0.0
    )
    pre_wide = wblocks.gram_preconditioner(np, wide)[0]
    assert not pre_wide.data_space  # more points than rows
    assert not span.applies(np, wide, wide.W0, pre_wide, 10, 10)
    for other, start in ((block, block.W0 + 1e-3), (rho, rho.W0)):
        assert FastBackend(w_steps=3).solve(other, start=start).info["method"] == "pncg"
    assert FastBackend().solve(block).info["method"] == "pncg"  # to tol: uncapped


def test_span_stops_at_tol_within_the_cap(monkeypatch):
    """A tol met before the cap stops the solve at the parameter-space loop's step, converged,
    with the block's own residual at the returned point; an optimal start takes no step."""
    from fenchel_cvx.fast import span

    block = _span_block("relu", seed=1)
    capped = FastBackend(w_steps=10).solve(block, start=block.W0)
    runs = {}
    for patched in (False, True):
        if patched:
            monkeypatch.setattr(span, "applies", lambda *a: False)
        runs[patched] = [
            FastBackend(w_steps=10, tol=f * capped.residual).solve(block, start=block.W0)
            for f in (10, 100)
        ]
    for res, ref in zip(runs[False], runs[True]):
        assert res.info["method"] == "pncg-span" and ref.info["method"] == "pncg"
        assert res.converged and res.status == "optimal" and res.iterations < 10
        assert res.iterations == ref.iterations  # no row frozen yet (that starts at step 8)
        assert res.residual == pytest.approx(block.kkt_residual(res.argmin), rel=1e-12)
        assert res.residual <= res.info["tol"]
        np.testing.assert_allclose(res.argmin, ref.argmin, rtol=0, atol=1e-9)
    monkeypatch.undo()
    start = FastBackend(w_steps=10, tol=0.9).solve(block, start=block.W0)
    assert start.info["method"] == "pncg-span" and start.iterations == 0 and start.converged
    assert np.array_equal(start.argmin, block.W0) and start.residual <= 0.9


def test_span_past_its_resync_keeps_descending_in_float32(monkeypatch):
    """More span steps than ``resync`` (16; Newton rows off): W_0 of an MNIST batch in float32.
    Re-forming U moves the gradients of rows converged to rounding, and PR+ scaled that noise
    by up to 4e5 until the loop restarted there: the 20-step value was 7 % above the 16-step one.
    Exact line searches never ascend; the value reported is the block's at the point returned,
    and within float32 reach of the parameter-space loop's."""
    from fenchel_cvx.blocks import w_block, x_block
    from fenchel_cvx.datasets import load_mnist5k, one_hot
    from fenchel_cvx.fast import span

    ds = load_mnist5k()
    X0 = ds.X_train[:, :500].astype(np.float32)
    Y = one_hot(ds.y_train[:500], 10).astype(np.float32)
    net = LiftedNetwork(
        [784, 300, 10], activation="relu", loss="cross_entropy", lam=0.1, rho=0.0, dtype=np.float32
    )
    Xs = net.forward(X0)[0]
    Xs = [FastBackend(x_steps=50).solve(x_block(net, X0, Y, Xs, 1), start=Xs[0]).argmin]
    block = w_block(net, X0, Y, Xs, 0, gamma=1.0, W0=net.W[0].copy())
    runs = {k: FastBackend(w_steps=k, newton_cap=0).solve(block, start=block.W0) for k in (16, 20)}
    assert {r.info["method"] for r in runs.values()} == {"pncg-span"}
    assert runs[20].value <= runs[16].value * (1 + 1e-6)
    assert runs[20].value == pytest.approx(float(block.value(runs[20].argmin)), rel=1e-5)
    monkeypatch.setattr(span, "applies", lambda *a, **k: False)
    ref = FastBackend(w_steps=20, newton_cap=0).solve(block, start=block.W0)
    assert ref.info["method"] == "pncg" and runs[20].value == pytest.approx(ref.value, rel=1e-4)


@pytest.mark.parametrize("xp_name", ["numpy", "array_api_strict"])
def test_span_float32_and_standard_api(xp_name):
    xp = pytest.importorskip(xp_name)
    block = _span_block("tanh", seed=2)
    ref = FastBackend(w_steps=5).solve(block, start=block.W0)
    state = _to(xp, "float32", *make_state("tanh", "cross_entropy", seed=2, **WIDE))
    import dataclasses

    small = dataclasses.replace(make_block("w_hidden0", *state, gamma=0.3), rho=0.0)
    res = FastBackend(w_steps=5).solve(small, start=small.W0)
    assert res.info["method"] == "pncg-span" and res.argmin.dtype == xp.float32
    assert res.value == pytest.approx(ref.value, rel=1e-5)


def test_gram_factor_is_reused_while_data_unchanged():
    block = case_block("relu", "cross_entropy", "w_hidden0", 0.3)
    be = FastBackend()
    assert not be.solve(block).info["cached_factor"]
    assert be.solve(block).info["cached_factor"]


def test_gram_reuse_across_batches_still_descends_and_converges():
    """gram_reuse=k: one factorisation serves k solves, also when X~ changed (a new batch); the
    stale preconditioner still gives descent steps and exact solves still reach tol."""
    for kind in ("w_hidden0", "w_last"):
        b0, b1, b2 = (case_block("tanh", "cross_entropy", kind, 0.3, seed=s) for s in range(3))
        be, infos = FastBackend(gram_reuse=2), []
        for b in (b0, b1, b2, b2):
            res = be.solve(b, start=b.W0)
            assert res.converged
            infos.append((res.info["cached_factor"], res.info["stale_factor"]))
        assert infos == [(False, False), (True, True), (False, False), (True, False)]
        stepper = FastBackend(w_steps=1, gram_reuse=2)
        stepper.solve(b0, start=b0.W0)
        res = stepper.solve(b1, start=b1.W0)
        assert res.info["stale_factor"] and res.value < float(b1.value(b1.W0))
    # the MSE closed form needs its exact factor: never a stale one
    ridge = FastBackend(gram_reuse=5)
    ridge.solve(case_block("relu", "mse", "w_last", 0.3, seed=0))
    again = ridge.solve(case_block("relu", "mse", "w_last", 0.3, seed=1))
    assert again.converged and not again.info["cached_factor"]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_lapack_inverse_matches_the_array_api_inverse(dtype):
    from fenchel_cvx.fast._util import _generic_inverse, spd_inverse

    rng = np.random.default_rng(0)
    X = rng.random((40, 25)).astype(dtype)
    G = X @ X.T  # rank 25 < 40: singular without the shift
    fast, shift = spd_inverse(np, G, 0.5)
    ref = _generic_inverse(np, G + shift * np.eye(40, dtype=dtype), np.eye(40, dtype=dtype))
    assert fast.dtype == dtype and shift == 0.5 and np.array_equal(fast, fast.T)
    rtol = 1e-3 if dtype == np.float32 else 1e-10
    np.testing.assert_allclose(fast, ref, rtol=rtol, atol=rtol * np.abs(ref).max())
    empty, _ = spd_inverse(np, np.zeros((0, 0), dtype=dtype), 1.0)
    assert empty.shape == (0, 0) and empty.dtype == dtype
    Ginv, shift = spd_inverse(np, G, 0.0)  # singular: the shift grows until it factors
    assert (
        shift > 0 and np.all(np.isfinite(Ginv)) and np.linalg.eigvalsh(Ginv.astype(float)).min() > 0
    )


def test_large_w_hidden_converges_in_few_iterations():
    """A 100 x 301 hidden W-block on 500 points (ReLU features, ill-conditioned) reaches tol 1e-6
    with the preconditioned CG in at most 250 iterations (122 with x86-64 OpenBLAS), an eighth
    of the 2,000 allowed; 40 iterations leave it far from the optimum."""
    rng = np.random.default_rng(0)
    net = LiftedNetwork((300, 100, 10), "relu", "cross_entropy", lam=1.0, rho=1e-3, seed=0)
    X0 = np.maximum(rng.standard_normal((300, 500)) + 0.3 * rng.standard_normal((300, 1)), 0)
    Xs, _ = net.forward(X0)
    V = np.maximum(Xs[0] + 0.1 * rng.standard_normal(Xs[0].shape), 0)
    block = blocks.w_block(net, X0, None, [V], 0, gamma=0.01, W0=net.W[0])
    res = FastBackend(max_iter=2000).solve(block, start=net.W[0])
    assert res.converged and res.status == "optimal" and res.residual <= 1e-6
    assert res.info["method"] == "pncg" and res.iterations <= 250, res.iterations
    early = FastBackend(max_iter=40).solve(block, start=net.W[0])
    assert not early.converged and early.residual > 100 * res.residual


# --- validation ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "kwargs,name",
    [
        (dict(tol=0), "tol"),
        (dict(tol=-1e-3), "tol"),
        (dict(max_iter=0), "max_iter"),
        (dict(max_iter=2.5), "max_iter"),
        (dict(w_steps=0), "w_steps"),
        (dict(w_steps=1.5), "w_steps"),
        (dict(x_steps=0), "x_steps"),
        (dict(x_steps=2.0), "x_steps"),
        (dict(gram_reuse=0), "gram_reuse"),
        (dict(gram_reuse=True), "gram_reuse"),
        (dict(gram_reuse=None), "gram_reuse"),
        (dict(gram_reuse=(2, 0)), "gram_reuse"),
        (dict(capped_residual=1), "capped_residual"),
        (dict(capped_value=0), "capped_value"),
        (dict(x_steps=True), "x_steps"),
        (dict(x_steps=(1, 0)), "x_steps"),
        (dict(x_steps=[]), "x_steps"),
        (dict(x_steps="3"), "x_steps"),
        (dict(w_steps=(2, 1.5)), "w_steps"),
        (dict(dtype="int32"), "dtype"),
        (dict(newton_cap=-1), "newton_cap"),
    ],
)
def test_bad_arguments(kwargs, name):
    with pytest.raises(ValueError, match=name):
        FastBackend(**kwargs)


def test_per_layer_steps_cap_each_block_by_its_layer():
    """``x_steps=(k_1, ..., k_L)``: X_l takes at most k_l FISTA steps; ``w_steps`` likewise per
    W_l; a tuple of another length than the network's blocks is refused by ``fit_bcd`` before
    any work, naming the argument."""
    from fenchel_cvx import fit_bcd

    net = LiftedNetwork([6, 5, 4, 3], "relu", "cross_entropy", lam=1.0, rho=0.0, seed=0)
    rng = np.random.default_rng(0)
    X0, Y = rng.normal(size=(6, 30)), np.eye(3)[:, rng.integers(0, 3, 30)]
    Xs, _ = net.forward(X0)
    Xs = [np.maximum(X + 0.3 * rng.normal(size=X.shape), 0) for X in Xs]
    be = FastBackend(x_steps=(1, 4), w_steps=(2, 1, 3), tol=1e-12)
    for l, k in ((1, 1), (2, 4)):
        res = be.solve(blocks.x_block(net, X0, Y, Xs, l), start=Xs[l - 1])
        assert res.iterations == k and res.info["x_steps"] == k
    for l, k in ((0, 2), (1, 1), (2, 3)):
        res = be.solve(blocks.w_block(net, X0, Y, Xs, l, gamma=0.5, W0=net.W[l]), start=net.W[l])
        assert res.iterations == k and res.info["w_steps"] == k
    # gram_reuse=(r_0, ..., r_L): W_l's factor serves r_l solves (W_0's, stale, on a new X~)
    be = FastBackend(w_steps=1, gram_reuse=(2, 1, 1))
    for l, stale in ((0, True), (1, False)):
        be.solve(blocks.w_block(net, X0, Y, Xs, l, gamma=0.5, W0=net.W[l]), start=net.W[l])
        moved = [np.maximum(X + 0.1, 0) for X in Xs]
        res = be.solve(
            blocks.w_block(net, X0 + 0.1, Y, moved, l, gamma=0.5, W0=net.W[l]), start=net.W[l]
        )
        assert res.info["stale_factor"] == stale
    for bad, name in (
        (dict(x_steps=(1, 2, 3)), r"x_steps .* \(2: X_1 to X_2\)"),
        (dict(w_steps=(1, 2)), r"w_steps .* \(3: W_0 to W_2\)"),
        (dict(gram_reuse=(2, 2)), r"gram_reuse .* \(3: W_0 to W_2\)"),
    ):
        W = [W.copy() for W in net.W]
        with pytest.raises(ValueError, match=name):
            fit_bcd(net, X0, Y, batch_size=10, backend=FastBackend(**bad))
        assert all(np.array_equal(a, b) for a, b in zip(W, net.W))


def test_bad_start_shape():
    block = case_block("relu", "mse", "w_hidden0", 0.0)
    with pytest.raises(ValueError, match="start"):
        FastBackend().solve(block, start=np.zeros((2, 2)))


def test_name_and_repr():
    be = FastBackend(w_steps=3, x_steps=7)
    assert be.name == "fast" and "w_steps=3" in repr(be) and "x_steps=7" in repr(be)


def test_options_build_an_equal_backend_and_its_eager_twin():
    """``FastBackend(**b.options())`` rebuilds every argument of ``b``, with an empty Gram
    cache; with ``compile=False`` the same settings run every chain eagerly."""
    be = FastBackend(
        tol=1e-5,
        max_iter=40,
        w_steps=(10, 1),
        x_steps=20,
        dtype="float32",
        newton_cap=0,
        gram_reuse=(4, 1),
        threads=2,
        capped_residual=False,
        capped_value=False,
        compile="auto",
    )
    be._cache["key"] = "a factor"
    same = FastBackend(**be.options())
    assert same.options() == be.options() and repr(same) == repr(be) and same._cache == {}
    twin = FastBackend(**{**be.options(), "compile": False})
    assert twin.settings() == be.settings() and twin.threads == be.threads
    assert twin.kernels is EAGER and twin.compile is False


def test_pr_plus_matches_forming_the_direction():
    """``_util.pr_plus`` decides beta, the restarts and the new slope per row from dots alone,
    as forming ``-s + beta d`` and testing ``<g, d_new> >= 0`` does: rows with gs_old = 0, a
    Newton row (``zero``), uphill rows and ordinary ones."""
    from fenchel_cvx.fast._util import pr_plus

    rng = np.random.default_rng(4)
    g, s_old, d = (rng.standard_normal((40, 7)) for _ in range(3))
    s = g * rng.uniform(0.5, 2.0, g.shape)  # a preconditioned gradient: <g, s> > 0
    s_old[0] = 0.0  # gs_old = 0: beta 0
    s_old[1:8], d[1:8] = -g[1:8], 50 * g[1:8]  # beta > 0 along a d far uphill: restarts
    zero = np.zeros((40, 1), dtype=bool)
    zero[10] = zero[30] = True
    dot = lambda a, b: np.sum(a * b, axis=1, keepdims=True)  # noqa: E731
    gs, gs_old = dot(g, s), np.abs(dot(g, s_old))
    # the old code: form the direction, then test its slope
    beta0 = np.clip(
        np.where(gs_old > 0, dot(g, s - s_old) / np.where(gs_old > 0, gs_old, 1), 0), 0, None
    )
    beta0 = np.where(zero, 0, beta0)
    d_new = -s + beta0 * d
    uphill0 = dot(g, d_new) >= 0
    d_new = np.where(uphill0, -s, d_new)
    beta, uphill, slope = pr_plus(np, gs, dot(g, s_old), gs_old, dot(g, d), zero=zero)
    assert uphill0[1:8].all() and not uphill0.all()
    np.testing.assert_array_equal(uphill, uphill0)
    np.testing.assert_allclose(-s + beta * d, d_new, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(slope, dot(g, d_new), rtol=1e-10, atol=1e-12)
    assert (beta[[0, 10, 30]] == 0).all()


@pytest.mark.parametrize("xp_name", ["numpy", "array_api_strict"])
@pytest.mark.parametrize("kind", ["w_hidden0", "x_hidden"])
def test_a_hint_of_another_dtype_is_cast_to_the_solve(xp_name, kind):
    """A caller's ``A(W, X) + b`` start image (``image=``) in float32 for a float64 block: the solve
    runs in float64 as without the hint. The solvers update their state in place from it (the
    span loop's U, ReLU's dB/du), where a float32 state would stay float32 (NumPy) or refuse
    float32 -= float64 (array-api-strict)."""
    import dataclasses

    xp = pytest.importorskip(xp_name)
    block = make_block(
        kind, *_to(xp, "float64", *make_state("relu", "cross_entropy", seed=0, **WIDE)), gamma=0.3
    )
    if kind == "w_hidden0":
        block = dataclasses.replace(block, rho=0.0)  # the span loop's setting
        start, backend = block.W0, FastBackend(w_steps=5)
        hint = block.W0 @ block.Xt
    else:
        start, backend = block.act_in.phi(block.U_prev), FastBackend(x_steps=3)
        hint = block.forward(start)
    ref = backend.solve(block, start=start)
    res = backend.solve(block, start=start, image=xp.astype(hint, xp.float32))
    assert res.argmin.dtype == xp.float64
    if kind == "w_hidden0":
        assert res.info["method"] == "pncg-span"
    gap = float(xp.max(xp.abs(res.argmin - ref.argmin)))
    assert gap <= 1e-6 * (1 + float(xp.max(xp.abs(ref.argmin))))  # the hint's float32 rounding


@pytest.mark.parametrize("gamma", [0.0, 0.3])
def test_the_general_last_w_path_is_newton_on_the_losss_own_hessian(gamma):
    """A loss that is neither quadratic nor solved by its own method (Huber: ``last_w_solver``
    "newton") takes Newton-CG on its ``hvp``: to 1e-10 in a few steps, at the oracle's optimum;
    one capped step from W0 never rises."""
    from fenchel_cvx.oracle import OracleBackend

    rng = np.random.default_rng(7)
    net = LiftedNetwork((5, 4, 3), "relu", "huber", rho=[0.1, 0.05], seed=7)
    X0 = rng.standard_normal((5, 30))
    Y = 3.0 * rng.standard_normal((3, 30))  # residuals in both of Huber's pieces
    Xs = net.forward(X0)[0]
    block = blocks.w_block(net, X0, Y, Xs, 1, gamma=gamma, W0=net.W[1] if gamma else None)
    res = FastBackend(tol=1e-10).solve(block)
    assert res.info["method"] == "newton" and res.converged and res.iterations <= 20
    assert res.value == pytest.approx(OracleBackend(tol=1e-9).solve(block).value, rel=1e-9)
    one = FastBackend(w_steps=1).solve(block, start=net.W[1])
    assert one.iterations == 1 and one.value <= float(block.value(net.W[1]))


@pytest.mark.parametrize("rho, scale", [(1e-3, 100.0), (1e-4, 10.0), (1e-6, 100.0)])
def test_the_general_last_w_path_reaches_the_optimum_with_residuals_in_hubers_tails(rho, scale):
    """Huber with most residuals in its linear tails (targets of scale 10-100, delta 1) and a
    small ``rho``: from W = 0 the Hessian sees little curvature and the Newton length overshoots
    the minimiser along d by orders of magnitude. ``solve_newton`` still reaches tol 1e-9 within
    200 steps, at the oracle's optimum (to 1e-9 relative), not stalled."""
    from fenchel_cvx.fast.wblocks import solve_newton
    from fenchel_cvx.oracle import OracleBackend

    rng = np.random.default_rng(0)
    net = LiftedNetwork((5, 4, 3), "relu", "huber", rho=[rho, rho], seed=0)
    X0 = rng.standard_normal((5, 40))
    Y = scale * rng.standard_normal((3, 40))
    block = blocks.w_block(net, X0, Y, net.forward(X0)[0], 1)
    W, it, info = solve_newton(np, block, np.zeros_like(net.W[1]), 1e-9, 200)
    assert info["converged"] and not info["stalled"] and info["residual"] <= 1e-9
    opt = OracleBackend(tol=1e-9).solve(block).value
    assert info["value"] == pytest.approx(opt, rel=1e-9)
    assert float(block.value(W)) == pytest.approx(opt, rel=1e-9)


@pytest.mark.parametrize(
    "solver, method", [("ridge", "cholesky"), ("newton", "newton"), ("pncg", "pncg")]
)
def test_the_losss_last_w_solver_alone_picks_the_last_w_method(solver, method):
    """``Loss.last_w_solver`` is the one fact the fast backend's last W-block dispatch reads: MSE
    with its solver set to each method takes that method, and all reach the ridge optimum."""
    from fenchel_cvx.losses import MSE

    class Chosen(MSE):
        last_w_solver = solver

    net, X0, Y, Xs, W0s = make_state("relu", "mse")
    ref = FastBackend(tol=1e-10).solve(make_block("w_last", net, X0, Y, Xs, W0s, gamma=0.3))
    net.loss = Chosen()
    res = FastBackend(tol=1e-10).solve(make_block("w_last", net, X0, Y, Xs, W0s, gamma=0.3))
    assert res.info["method"] == method and res.converged
    assert res.value == pytest.approx(ref.value, rel=1e-9)


def test_newton_1d_takes_a_trial_below_the_root_while_its_bracket_is_open():
    """``newton_1d``'s open bracket (``hi`` infinite): an element whose trial is below the root
    (``f' < 0``) stops there, with ``lo`` at it, and ``f`` is lower there than at 0; one whose
    trial is above it closes its bracket and converges to the root."""
    from fenchel_cvx.fast._util import newton_1d

    a = np.array([[1.0], [2.0], [0.5], [3.0]])  # f(t) = exp(a t) / a - b t: f' = exp(a t) - b
    b = np.array([[5.0], [7.0], [3.0], [20.0]])
    t_opt = np.log(b) / a
    t0 = t_opt * np.array([[0.5], [2.0], [0.9], [1.5]])  # below, above, below, above

    def derivs(t):
        e = np.exp(a * t)
        return e - b, a * e

    bracket = (np.zeros_like(t0), np.full_like(t0, np.inf))
    t, lo, _ = newton_1d(np, derivs, t0, bracket, 1e-12 * b)
    below = (t0 < t_opt).ravel()
    np.testing.assert_array_equal(t[below], t0[below])
    np.testing.assert_array_equal(lo[below], t0[below])
    f = np.exp(a * t) / a - b * t
    assert np.all(f < 1 / a)  # below f(0) = 1 / a
    np.testing.assert_allclose(t[~below], t_opt[~below], rtol=1e-10)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_clip_of_numpy_arrays_is_numpys_maximum_and_minimum(dtype):
    """``arrays.clip`` on NumPy arrays, by a number (``np.clip`` with an infinite other bound) or
    by an array (``np.maximum`` / ``np.minimum``): the values, NaN and infinities of the ufuncs,
    in the array's dtype, a zero clipped by a number keeping its sign; an integer array keeps
    its own dtype."""
    from fenchel_cvx.arrays import clip

    x = np.array([np.nan, -np.inf, -2.5, -0.0, 0.0, 1.5, np.inf], dtype=dtype)
    bound = np.full_like(x, 0.5)
    for got, want in (
        (clip(x, 0.0), np.maximum(x, 0.0)),
        (clip(x, None, 1.0), np.minimum(x, 1.0)),
        (clip(x, bound), np.maximum(x, bound)),
        (clip(x, None, bound), np.minimum(x, bound)),
        (clip(x, -1.0, 1.0), np.minimum(np.maximum(x, -1.0), 1.0)),
    ):
        assert got.dtype == dtype
        np.testing.assert_array_equal(got, want)
    assert np.signbit(clip(x, 0.0)[3]) and not np.signbit(clip(x, None, 1.0)[4])
    ints = clip(np.arange(-3, 3), 0)
    assert ints.dtype == np.arange(1).dtype and ints.tolist() == [0, 0, 0, 0, 1, 2]
