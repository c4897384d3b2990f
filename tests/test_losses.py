"""Tests of fenchel_cvx.losses: values, gradients, stability, CVXPY forms (columns = data
points)."""

import array_api_strict as xps
import cvxpy as cp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from scipy.special import log_softmax

from fenchel_cvx.losses import LOSSES, MSE, CrossEntropy, Loss, loss, softmax
from fenchel_cvx.oracle.atoms import loss_cvx

NAMES = ("mse", "cross_entropy")


@st.composite
def problems(draw, soft=True, scale=20.0):
    """(Y, Yhat): k classes x m points; Y one-hot or (for soft) nonnegative weights."""
    k, m = draw(st.integers(1, 4)), draw(st.integers(1, 4))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    Yhat = rng.uniform(-scale, scale, size=(k, m))
    if soft and draw(st.booleans()):
        Y = rng.uniform(0, 2, size=(k, m))
    else:
        Y = np.eye(k)[:, rng.integers(0, k, size=m)]
    return Y, Yhat


def direct(name, Y, Yhat):
    if name == "mse":
        return float(np.sum((Y - Yhat) ** 2))
    return float(-np.sum(Y * log_softmax(Yhat, axis=0)))


@pytest.mark.parametrize("name", NAMES)
@given(problems())
def test_value_matches_direct_formula(name, YYh):
    Y, Yhat = YYh
    np.testing.assert_allclose(
        float(loss(name).value(Y, Yhat)), direct(name, Y, Yhat), rtol=1e-12, atol=1e-10
    )


def test_cross_entropy_small_example_by_hand():
    Yhat = np.array([[0.0, 2.0], [np.log(3.0), 0.0]])
    Y = np.array([[1.0, 0.0], [0.0, 1.0]])
    # column 1: -log(1/4); column 2: -log(1/(e^2 + 1))
    expected = np.log(4.0) + np.log(np.exp(2.0) + 1.0)
    assert abs(CrossEntropy().value(Y, Yhat) - expected) < 1e-14
    assert MSE().value(Y, Yhat) == pytest.approx(1 + np.log(3.0) ** 2 + 4 + 1)


@pytest.mark.parametrize("name", NAMES)
@given(problems())
def test_column_values_and_curvature(name, YYh):
    """Per-column values sum to the loss (the generic loop agrees); each column's Hessian in Yhat
    is at most the column's curvature bound (checked on a random direction); the flags say which
    loss is quadratic and separable by rows."""
    Y, Yhat = YYh
    lo = loss(name)
    cols = lo.column_values(Y, Yhat)
    assert cols.shape == (Y.shape[1],)
    np.testing.assert_allclose(cols, Loss.column_values(lo, Y, Yhat), rtol=1e-12, atol=1e-10)
    np.testing.assert_allclose(float(np.sum(cols)), float(lo.value(Y, Yhat)), rtol=1e-12, atol=1e-9)
    c = np.broadcast_to(np.asarray(lo.column_curvature(Y, np), dtype=float), (1, Y.shape[1]))
    assert lo.curvature(Y, np) == pytest.approx(float(np.max(c)))
    D = np.random.default_rng(Y.shape[1]).standard_normal(Yhat.shape)
    h = 1e-4  # second difference of the loss along D, column by column
    second = (
        lo.column_values(Y, Yhat + h * D) - 2 * cols + lo.column_values(Y, Yhat - h * D)
    ) / h**2
    # the second difference's own rounding: a few ulps of each column's value, over h^2
    rounding = 16 * np.finfo(float).eps * (np.abs(cols) + 1) / h**2
    assert np.all(second <= c[0] * np.sum(D * D, axis=0) * (1 + 1e-4) + 1e-5 + rounding)
    assert (lo.last_w_solver == "ridge", lo.separable_rows) == ((name == "mse",) * 2)


def test_losses_are_sums_over_data_points():
    rng = np.random.default_rng(0)
    Y, Yhat = np.eye(3)[:, [0, 1, 2, 1]], rng.normal(size=(3, 4))
    for name in NAMES:
        total = loss(name).value(Y, Yhat)
        parts = sum(loss(name).value(Y[:, [j]], Yhat[:, [j]]) for j in range(4))
        assert total == pytest.approx(parts, rel=1e-13)


@pytest.mark.parametrize("big", [1e4, -1e4, 1e300])
def test_cross_entropy_stable_for_huge_logits(big):
    Yhat = np.array([[big, 0.0, big], [0.0, big, big - 1.0], [-big, 1.0, 0.0]])
    Y = np.eye(3)[:, [1, 0, 1]]
    ce = CrossEntropy()
    with np.errstate(over="raise", invalid="raise", divide="raise", under="ignore"):
        val, grad, p = ce.value(Y, Yhat), ce.grad(Y, Yhat), softmax(Yhat)
    assert np.isfinite(val) and np.all(np.isfinite(grad)) and np.all(np.isfinite(p))
    np.testing.assert_allclose(p.sum(axis=0), 1.0)
    if abs(big) == 1e4:
        np.testing.assert_allclose(val, direct("cross_entropy", Y, Yhat), rtol=1e-12)
    # the correct class has the largest logit: loss ~ 0; the wrong one: loss ~ the margin
    good = np.eye(3)[:, [0]]
    assert CrossEntropy().value(good, np.array([[1e4], [0.0], [0.0]])) == pytest.approx(
        0, abs=1e-12
    )
    assert CrossEntropy().value(
        np.eye(3)[:, [1]], np.array([[1e4], [0.0], [0.0]])
    ) == pytest.approx(1e4, rel=1e-12)


@pytest.mark.parametrize("name", NAMES)
@given(problems(scale=5.0))
def test_gradient_matches_finite_differences(name, fd_grad, YYh):
    Y, Yhat = YYh
    L = loss(name)
    fd = fd_grad(lambda A: L.value(Y, A), Yhat, 1e-6)
    np.testing.assert_allclose(L.grad(Y, Yhat), fd, rtol=1e-6, atol=1e-6)


def test_cross_entropy_in_float32_keeps_its_digits_at_large_logits():
    """A trained network's logits are large (here about 27) and its loss small (3.7 on 500
    points): the textbook ``sum (1^T y) lse(u) - sum y^T u`` subtracts two sums near 13,500 and
    loses 3e-4 in float32; the column-wise form, two terms >= 0, is the float64 value to 1e-6."""
    rng = np.random.default_rng(0)
    m, k = 500, 10
    y = rng.integers(0, k, m)
    Y = np.eye(k)[:, y]
    U = rng.normal(0, 1, (k, m)) + 18.0
    U[y, np.arange(m)] += 7.0 + rng.exponential(2.0, m)  # the label's logit near 27
    U32, Y32 = U.astype(np.float32), Y.astype(np.float32)
    exact = float(-np.sum(Y * log_softmax(U32.astype(np.float64), axis=0)))
    assert 1 < exact < 10
    ours = float(CrossEntropy().value(Y32, U32))
    assert abs(ours - exact) <= 1e-6 * exact
    a = U32.max(axis=0)
    textbook = float(np.sum(a + np.log(np.exp(U32 - a).sum(axis=0))) - np.sum(Y32 * U32))
    assert abs(textbook - exact) > 1e-5 * exact  # what the old form did


@given(problems(scale=5.0))
def test_cross_entropy_shift_invariance(YYh):
    """softmax - y sums to 0 per column when y is a probability vector: shift invariance."""
    Y, Yhat = YYh
    Y = Y / Y.sum(axis=0, keepdims=True)
    G = CrossEntropy().grad(Y, Yhat)
    np.testing.assert_allclose(G.sum(axis=0), 0, atol=1e-12)
    shift = CrossEntropy().value(Y, Yhat + 7.0) - CrossEntropy().value(Y, Yhat)
    assert abs(shift) < 1e-9


@pytest.mark.parametrize("name", NAMES)
@given(problems())
def test_cvxpy_value_equals_numpy(name, YYh):
    Y, Yhat = YYh
    L = loss(name)
    V = cp.Variable(Yhat.shape)
    V.value = Yhat
    expr = loss_cvx(L, Y, V)
    assert expr.shape == () and expr.is_convex()
    np.testing.assert_allclose(expr.value, L.value(Y, Yhat), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("name", NAMES)
def test_cvxpy_form_affine_yhat_dcp_dpp_and_solves(name):
    """The W-last block min_W L(Y, W X~) + ||W||^2 with X~ a parameter (Y the fixed data):
    DPP; re-solved for a new X~, its solution has zero gradient."""
    rng = np.random.default_rng(3)
    Y = (
        np.eye(2)[:, rng.integers(0, 2, size=6)]
        if name == "cross_entropy"
        else rng.normal(size=(2, 6))
    )
    W, X = cp.Variable((2, 4)), cp.Parameter((4, 6))
    L = loss(name)
    prob = cp.Problem(cp.Minimize(loss_cvx(L, Y, W @ X) + cp.sum_squares(W)))
    assert prob.is_dcp(dpp=True) and prob.is_dpp()
    for _ in range(2):
        Xt = np.vstack([rng.normal(size=(3, 6)), np.ones((1, 6))])
        X.value = Xt
        prob.solve(solver=cp.CLARABEL)
        assert prob.status == cp.OPTIMAL
        G = L.grad(Y, W.value @ Xt) @ Xt.T + 2 * W.value
        assert np.max(np.abs(G)) < 1e-4  # interior-point accuracy (exponential cone)
        assert prob.value == pytest.approx(L.value(Y, W.value @ Xt) + np.sum(W.value**2), rel=1e-7)


@pytest.mark.parametrize("name", NAMES)
def test_cvxpy_form_with_label_parameter_is_dpp_when_yhat_is_parameter_free(name):
    """Y a (nonnegative) parameter and Yhat = W X~ with X~ NumPy data: DPP."""
    Y, W = cp.Parameter((2, 5), nonneg=True), cp.Variable((2, 3))
    expr = loss_cvx(loss(name), Y, W @ np.ones((3, 5)))
    assert cp.Problem(cp.Minimize(expr)).is_dpp()


@pytest.mark.parametrize("name", NAMES)
def test_array_api_strict_and_float32(name, rng):
    Y, Yhat = np.eye(3)[:, [0, 2, 1, 1]], rng.normal(size=(3, 4))
    L = loss(name)
    sY, sYh = xps.asarray(Y), xps.asarray(Yhat)
    np.testing.assert_allclose(float(L.value(sY, sYh)), L.value(Y, Yhat), rtol=1e-14)
    np.testing.assert_allclose(np.asarray(L.grad(sY, sYh)), L.grad(Y, Yhat), rtol=1e-13)
    np.testing.assert_allclose(np.asarray(softmax(sYh)), softmax(Yhat), rtol=1e-13)
    for Ya, Yha, f32 in (
        (Y.astype(np.float32), Yhat.astype(np.float32), np.float32),
        (xps.asarray(Y, dtype=xps.float32), xps.asarray(Yhat, dtype=xps.float32), xps.float32),
    ):
        assert L.value(Ya, Yha).dtype == f32
        assert L.grad(Ya, Yha).dtype == f32


def test_registry():
    assert set(LOSSES) == set(NAMES) | {"huber"}  # huber: fenchel_cvx.extensions
    for name in NAMES:
        L = loss(name)
        assert isinstance(L, Loss) and L.name == name and name in repr(L)
        assert loss(L) is L


@pytest.mark.parametrize("bad", ["hinge", "MSE", None])
def test_unknown_loss_names_parameter_and_value(bad):
    with pytest.raises(
        ValueError,
        match=r"loss must be one of \['cross_entropy', 'huber', 'mse'\], got "
        + repr(bad).replace("(", r"\("),
    ):
        loss(bad)


# --- the facts each class carries (``fenchel_cvx.facts``) -----------------------------------------
FACT_NAMES = NAMES + ("huber",)


def _problem(name, seed=0, k=3, m=5):
    rng = np.random.default_rng(seed)
    Yhat, D = rng.normal(scale=2.0, size=(k, m)), rng.normal(size=(k, m))
    Y = np.eye(k)[:, rng.integers(0, k, m)] if name == "cross_entropy" else rng.normal(size=(k, m))
    return Y, Yhat, D


@pytest.mark.parametrize("name", FACT_NAMES)
def test_hvp_and_diagonal_are_the_hessians(name):
    L, (Y, Yhat, D) = loss(name), _problem(name)
    h = 1e-6
    fd = (L.grad(Y, Yhat + h * D) - L.grad(Y, Yhat - h * D)) / (2 * h)
    np.testing.assert_allclose(L.hvp(Y, Yhat, D), fd, rtol=1e-6, atol=1e-8)
    E = np.zeros_like(Yhat)
    E[1, 2] = 1.0
    assert L.hess_diag(Y, Yhat)[1, 2] == pytest.approx(L.hvp(Y, Yhat, E)[1, 2], rel=1e-12)
    bound = L.curvature(Y, np)  # column_curvature: a bound on every column's Hessian
    eig = max(
        np.max(
            np.linalg.eigvalsh(
                np.stack(
                    [L.hvp(Y, Yhat, np.eye(3)[:, [i]] @ np.eye(5)[[j]])[:, j] for i in range(3)],
                    axis=1,
                )
            )
        )
        for j in range(5)
    )
    assert eig <= bound + 1e-12


@pytest.mark.parametrize("name", FACT_NAMES)
def test_line_search_derivatives_and_change(name):
    L, (Y, Yhat, D) = loss(name), _problem(name, 1)
    f = lambda t: float(L.value(Y, Yhat + t * D))  # noqa: E731
    h = 1e-5
    d1, d2 = L.line_derivs(Y, Yhat, D)
    assert float(d1) == pytest.approx((f(h) - f(-h)) / (2 * h), rel=1e-7)
    assert float(d2) == pytest.approx((f(h) - 2 * f(0) + f(-h)) / h**2, rel=1e-3)
    change, size = L.line_change(Y, Yhat, 0.3 * D)
    assert float(change) == pytest.approx(f(0.3) - f(0), rel=1e-12)
    assert float(size) > 0


@pytest.mark.parametrize("name", FACT_NAMES)
def test_piece_values_sum_to_the_value(name):
    L, (Y, Yhat, _) = loss(name), _problem(name, 2)
    total = float(L.value(Y, Yhat))
    assert float(np.sum(L.piece_values(Y, Yhat, 0))) == pytest.approx(total, rel=1e-13)
    assert L.piece_values(Y, Yhat, 0).shape == (1, 5)
    if L.separable_rows:
        assert L.piece_values(Y, Yhat, 1).shape == (3, 1)
        assert float(np.sum(L.piece_values(Y, Yhat, 1))) == pytest.approx(total, rel=1e-13)
    else:
        with pytest.raises(ValueError, match="lacks the fact 'elementwise'"):
            L.piece_values(Y, Yhat, 1)


@pytest.mark.parametrize("name", FACT_NAMES)
def test_torch_loss_is_the_batch_mean(name):
    torch = pytest.importorskip("torch")
    L, (Y, Yhat, _) = loss(name), _problem(name, 3)
    got = float(L.torch_loss(torch.from_numpy(Yhat.T), torch.from_numpy(Y.T)))
    assert got == pytest.approx(float(L.value(Y, Yhat)) / Y.shape[1], rel=1e-12)


def test_targets_labels_and_probabilities():
    out = np.array([[1.0, -2.0], [3.0, 0.5]])
    np.testing.assert_array_equal(loss("cross_entropy").targets_from(out, 9.0), [[0, 0], [1, 1]])
    np.testing.assert_array_equal(loss("mse").targets_from(out, 1.0), out + 1.0)
    np.testing.assert_allclose(loss("cross_entropy").probabilities(out), softmax(out))
    assert loss("mse").probabilities is None and loss("huber").probabilities is None
    with pytest.raises(ValueError, match=r"^Y must be >= 0 for cross_entropy .*got -1.0"):
        loss("cross_entropy").check_labels("Y", np.array([[1.0, -1.0]]))
    with pytest.raises(ValueError, match=r"some label mass"):
        loss("cross_entropy").check_labels("Y", np.zeros((2, 3)), w_block=True)
    loss("mse").check_labels("Y", np.array([[-5.0]]))
    assert loss("cross_entropy").tasks == ("classification",)
    assert loss("mse").config() == {"name": "mse"}
    assert loss("huber", delta=0.5).config() == {"name": "huber", "delta": 0.5}


def test_a_loss_naming_an_unknown_last_w_solver_is_refused_where_it_is_defined():
    """``last_w_solver`` picks the fast backend's method for the last W-block; a name it does
    not know is refused when the class is defined, not read as nonlinear CG at training time."""
    from fenchel_cvx.losses import LAST_W_SOLVERS, Loss

    with pytest.raises(ValueError, match=r"Typo\.last_w_solver must be one of .*'lbfgs'"):

        class Typo(Loss):
            last_w_solver = "lbfgs"

    for solver in LAST_W_SOLVERS:  # each known method is taken
        assert type(f"Uses_{solver}", (Loss,), {"last_w_solver": solver}).last_w_solver == solver
