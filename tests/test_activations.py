"""Tests of fenchel_cvx.activations: Theorem 1's biconvex divergences, NumPy, array-API and CVXPY.

Every closed form is checked against the defining properties of B_phi(v, u) = F(v) + F*(u) - uv
(nonnegative, zero exactly on the graph v = phi(u), convex in each argument, +inf off phi's
range), against its own gradients, against the generic quadrature ``monotone(phi)``, and its
CVXPY form (``fenchel_cvx.oracle.atoms``) against its NumPy form.
"""

import math

import array_api_strict as xps
import cvxpy as cp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import registry_params
from fenchel_cvx.activations import (
    ACTIVATIONS,
    Activation,
    LeakyReLU,
    Monotone,
    ReLU,
    activation,
    monotone,
)
from fenchel_cvx.oracle.atoms import divergence_cvx

EPS = np.finfo(np.float64).eps
R = 30.0  # |u|, |v| bound of the hypothesis draws
CLOSED = tuple(registry_params.activations())  # every registered activation, by name
#: those the CVXPY oracle has forms of (``oracle.atoms``)
CVXPY = tuple(registry_params.activations(registry_params.has_cvxpy_forms))
#: those whose F* it writes elementwise, which ``divergence_cvx`` takes at a parameter u (an
#: epigraph form of F*, ELU's, needs u to be an expression of variables)
ELEMENTWISE_FSTAR = tuple(registry_params.activations(registry_params.elementwise_cvxpy_Fstar))


def modulus(act):
    """The strong-convexity modulus m of F on its domain, ``B(v, u) >= m/2 (v - phi(u))^2``:
    F'' = 1 / phi'(phi^{-1}(v)) >= 1 / sup phi' (0 where sup phi' is not declared)."""
    return 1.0 / act.dphi_max if act.dphi_max else 0.0


def instances(names):
    """The activations ``names`` with the tests' parameters (leaky ReLU at slope 0.1)."""
    return [registry_params.built(n) for n in names]


# --- strategies -------------------------------------------------------------------------------
slopes = st.floats(1e-3, 0.999)
# every registered activation, and leaky ReLU at any slope
acts = st.one_of(st.sampled_from([activation(n) for n in CLOSED]), slopes.map(LeakyReLU))
# those whose CVXPY form of F* the oracle writes elementwise (no epigraph variable of its own)
elementwise_cvxpy_acts = st.one_of(
    st.sampled_from([activation(n) for n in ELEMENTWISE_FSTAR]), slopes.map(LeakyReLU)
)


def _dom(act, bound=R, margin=0.0):
    lo, hi = act.v_range
    return max(lo + margin, -bound), min(hi - margin, bound)


def vs_in_range(act, n, bound=R, margin=0.0):
    lo, hi = _dom(act, bound, margin)
    return st.lists(st.floats(lo, hi), min_size=n, max_size=n).map(np.array)


def us(n, bound=R):
    return st.lists(st.floats(-bound, bound), min_size=n, max_size=n).map(np.array)


@st.composite
def act_v_u(draw, bound=R, margin=0.0, n=None):
    act = draw(acts)
    n = draw(st.integers(1, 6)) if n is None else n
    return act, draw(vs_in_range(act, n, bound, margin)), draw(us(n, bound))


def tol(act, v, u, k=64):
    """Rounding tolerance of B at (v, u): a few ulps of the largest term."""
    return k * EPS * (1 + np.abs(act.F(v)) + np.abs(act.Fstar(u)) + np.abs(u * v))


# --- Theorem 1: the defining properties ---------------------------------------------------------
@given(act_v_u())
def test_divergence_is_nonnegative_and_bounded_below_by_distance_to_graph(avu):
    act, v, u = avu
    B = act.divergence(v, u)
    assert B.shape == v.shape and np.all(np.isfinite(B))
    assert np.all(B >= -tol(act, v, u))
    # Bregman divergence of an m-strongly convex F: B >= m/2 |v - phi(u)|^2
    m = modulus(act)
    assert np.all(B >= 0.5 * m * (v - act.phi(u)) ** 2 - tol(act, v, u))


@given(acts, us(6))
def test_divergence_vanishes_on_the_graph(act, u):
    v = act.phi(u)
    assert np.all(act.in_range(v))
    assert np.all(np.abs(act.divergence(v, u)) <= tol(act, v, u))


@given(act_v_u())
def test_divergence_positive_off_the_graph(avu):
    act, v, u = avu
    off = np.abs(v - act.phi(u)) > 1e-3
    assert np.all(act.divergence(v, u)[off] > 0)


def test_divergence_positive_off_the_graph_examples():
    """Fixed points close to the graph, where only exactness can tell B from 0."""
    u = np.array([-2.0, -0.5, 0.3, 1.7])
    for act in instances(CLOSED):
        v = act.project(act.phi(u) + 1e-2)
        assert np.all(act.divergence(v, u) > 1e-6), act


@given(st.data())
def test_divergence_convex_in_v(data):
    act, v1, u = data.draw(act_v_u(n=4))
    v2 = data.draw(vs_in_range(act, 4))
    t = data.draw(st.floats(0, 1))
    vt = t * v1 + (1 - t) * v2
    lhs = act.divergence(vt, u)
    rhs = t * act.divergence(v1, u) + (1 - t) * act.divergence(v2, u)
    assert np.all(lhs <= rhs + tol(act, v1, u) + tol(act, v2, u))


@given(st.data())
def test_divergence_convex_in_u(data):
    act, v, u1 = data.draw(act_v_u(n=4))
    u2 = data.draw(us(4))
    t = data.draw(st.floats(0, 1))
    ut = t * u1 + (1 - t) * u2
    lhs = act.divergence(v, ut)
    rhs = t * act.divergence(v, u1) + (1 - t) * act.divergence(v, u2)
    assert np.all(lhs <= rhs + tol(act, v, u1) + tol(act, v, u2))


@given(st.data())
def test_divergence_second_differences_nonnegative(data):
    """Along a random direction, in v (staying in the domain) and in u."""
    act, v, u = data.draw(act_v_u(bound=5.0, margin=0.1, n=4))
    d = data.draw(us(4, bound=1.0))
    h = data.draw(st.floats(1e-3, 0.05))
    B = act.divergence
    second_u = B(v, u + h * d) + B(v, u - h * d) - 2 * B(v, u)
    assert np.all(second_u >= -8 * tol(act, v, u))
    second_v = B(v + h * d, u) + B(v - h * d, u) - 2 * B(v, u)
    assert np.all(second_v >= -8 * tol(act, v, u))


# the activations whose range has a finite end, beyond which B is +inf
@pytest.mark.parametrize(
    "act", instances(registry_params.activations(registry_params.bounded_range)), ids=repr
)
@given(data=st.data())
def test_divergence_infinite_outside_range(act, data):
    lo, hi = act.v_range
    below = st.floats(lo - R, lo, exclude_max=True)
    above = st.floats(hi, hi + R, exclude_min=True) if math.isfinite(hi) else below
    v = np.array(data.draw(st.lists(st.one_of(below, above), min_size=1, max_size=5)))
    u = data.draw(us(len(v)))
    assert not np.any(act.in_range(v))
    assert np.all(act.divergence(v, u) == np.inf)


@pytest.mark.parametrize("act", instances(CLOSED), ids=repr)
def test_divergence_finite_on_closed_range_ends(act):
    lo, hi = act.v_range
    ends = np.array([t if math.isfinite(t) else 0.0 for t in (lo, hi)])
    u = np.array([-3.0, 2.0])
    B = act.divergence(ends, u)
    assert np.all(np.isfinite(B)) and np.all(B >= 0)
    assert np.all(act.in_range(ends))


@given(slopes, us(5))
def test_leaky_relu_divergence_finite_everywhere(a, u):
    v = np.linspace(-R, R, 5)
    assert np.all(np.isfinite(LeakyReLU(a).divergence(v, u)))


@given(slopes, us(5), us(5))
def test_leaky_relu_closed_form(a, v, u):
    """B = (v - u)^2/2 on the upper branch, (v - a u)^2/(2a) on the lower one."""
    act = LeakyReLU(a)
    B = act.divergence(v, u)
    both_pos, both_neg = (v > 0) & (u > 0), (v <= 0) & (u <= 0)
    np.testing.assert_allclose(B[both_pos], 0.5 * (v - u)[both_pos] ** 2, atol=1e-9 * (1 + R * R))
    np.testing.assert_allclose(
        B[both_neg], (v - a * u)[both_neg] ** 2 / (2 * a), atol=1e-9 * (1 + R * R / a)
    )


# --- derivatives and inverses -------------------------------------------------------------------
def _central(f, x, h):
    return (f(x + h) - f(x - h)) / (2 * h)


@given(act_v_u(bound=5.0, margin=0.02))
def test_partial_gradients_match_finite_differences(avu):
    act, v, u = avu
    h = 1e-6
    np.testing.assert_allclose(
        act.grad_u(v, u), _central(lambda t: act.divergence(v, t), u, h), rtol=1e-5, atol=2e-6
    )
    # F'' jumps at v = 0 for leaky ReLU (by 1/a - 1): keep the v-differences off the kink
    s = np.abs(v) > 1e-3
    np.testing.assert_allclose(
        act.grad_v(v, u)[s],
        _central(lambda t: act.divergence(t, u[s]), v[s], h),
        rtol=1e-5,
        atol=2e-6,
    )


@given(acts, us(6, bound=8.0))
def test_dphi_matches_finite_differences(act, u):
    u = u[np.abs(u) > 1e-4]  # ReLU / leaky ReLU have a kink at 0
    np.testing.assert_allclose(act.dphi(u), _central(act.phi, u, 1e-7), rtol=1e-5, atol=1e-7)


@given(st.data())
def test_phi_inv_inverts_phi(data):
    act = data.draw(acts)
    v = data.draw(vs_in_range(act, 5, bound=10.0, margin=1e-6))
    if act.name == "relu":
        v = np.maximum(v, 1e-6)  # phi_inv is the inverse on (0, inf)
    np.testing.assert_allclose(act.phi(act.phi_inv(v)), v, rtol=1e-12, atol=1e-14)
    u = data.draw(us(5, bound=5.0))
    if act.name == "relu":
        u = np.abs(u)
    np.testing.assert_allclose(act.phi_inv(act.phi(u)), u, rtol=1e-9, atol=1e-9)


@given(acts, us(6, bound=8.0))
def test_derivatives_of_F_and_Fstar_are_phi_inv_and_phi(act, u):
    """F*' = phi and F' = phi^{-1}: the integrals of Theorem 1."""
    np.testing.assert_allclose(_central(act.Fstar, u, 1e-6), act.phi(u), rtol=1e-6, atol=1e-6)
    v = act.project(np.clip(act.phi(u), *_dom(act, margin=0.02)))
    v = v[np.abs(v) > 1e-3]  # leaky ReLU: F'' jumps at 0
    np.testing.assert_allclose(_central(act.F, v, 1e-7), act.phi_inv(v), rtol=1e-5, atol=1e-6)


@given(acts, us(8))
def test_project_lands_in_range_and_is_idempotent(act, x):
    p = act.project(x)
    assert np.all(act.in_range(p))
    np.testing.assert_array_equal(act.project(p), p)
    np.testing.assert_array_equal(p[act.in_range(x)], x[act.in_range(x)])


# --- the generic monotone(phi) ------------------------------------------------------------------
@given(act_v_u(bound=4.0, margin=0.02, n=3))
def test_monotone_agrees_with_closed_forms(avu):
    act, v, u = avu
    gen = monotone(lambda t: act.phi(t), act.v_range)
    np.testing.assert_allclose(gen.divergence(v, u), act.divergence(v, u), rtol=1e-7, atol=1e-8)
    np.testing.assert_allclose(gen.phi_inv(v), act.phi_inv(v), rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize(
    "name,v", [("relu", [-0.5, -1e-3]), ("sigmoid", [-0.1, 1.2, 7.0]), ("tanh", [-1.5, 1.0 + 1e-9])]
)
def test_monotone_infinite_outside_range(name, v):
    act = activation(name)
    v = np.array(v)
    u = np.linspace(-1, 1, v.size)
    for gen in (monotone(act.phi, act.v_range), monotone(act.phi)):  # range found or given
        assert np.all(gen.divergence(v, u) == np.inf)
        assert not np.any(gen.in_range(v))


def test_monotone_non_closed_form_activation():
    """arctan (range (-pi/2, pi/2)): B >= 0, = 0 on the graph, inf off the range."""
    gen = monotone(np.arctan)
    u = np.array([-2.0, 0.0, 0.7, 3.0])
    np.testing.assert_allclose(gen.divergence(np.arctan(u), u), 0.0, atol=1e-9)
    v = np.array([-1.2, 0.3, 0.5, 1.5])
    B = gen.divergence(v, u)
    assert np.all(B > 0)
    assert np.all(gen.divergence(np.array([-2.0, 1.6]), np.zeros(2)) == np.inf)


@pytest.mark.parametrize(
    "args,match",
    [
        (("not callable",), "phi must be callable"),
        ((np.tanh, (1.0, -1.0)), "v_range must be an increasing pair"),
        ((lambda u: -u,), "phi must be strictly increasing"),
    ],
)
def test_monotone_rejects_bad_arguments(args, match):
    with pytest.raises(ValueError, match=match):
        monotone(*args)


def test_monotone_has_no_cvxpy_form():
    with pytest.raises(NotImplementedError):
        divergence_cvx(monotone(np.tanh), cp.Variable(2), np.zeros(2))


# --- CVXPY forms --------------------------------------------------------------------------------
def _param(value):
    p = cp.Parameter(np.shape(value))
    p.value = value
    return p


def _var(value):
    x = cp.Variable(np.shape(value))
    x.value = value
    return x


@st.composite
def act_v_u_2d(draw, acts=acts):
    act = draw(acts)
    p, n = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    v = draw(vs_in_range(act, p * n)).reshape(p, n)
    u = draw(us(p * n)).reshape(p, n)
    return act, v, u


@given(act_v_u_2d(elementwise_cvxpy_acts), st.sampled_from(["v_var", "u_var"]), st.booleans())
def test_cvxpy_value_equals_numpy(avu, which, use_param):
    act, v, u = avu
    expected = float(np.sum(act.divergence(v, u)))
    const = _param if use_param else (lambda x: x)
    if which == "v_var":
        expr, cons = divergence_cvx(act, _var(v), const(u))
        assert all(bool(np.all(c.value())) for c in cons)  # v is in the range
    else:
        expr, cons = divergence_cvx(act, const(v), _var(u))
        assert cons == []
    assert expr.shape == ()
    assert abs(expr.value - expected) <= 1e-9 * (1 + np.sum(tol(act, v, u, k=1)) / EPS)


# v_var: u is a parameter (an elementwise F* form); u_var: any activation with CVXPY forms
@pytest.mark.parametrize(
    "which,name", [("v_var", n) for n in ELEMENTWISE_FSTAR] + [("u_var", n) for n in CVXPY]
)
def test_cvxpy_forms_are_dcp_and_dpp(name, which):
    act = activation(name)
    shape = (3, 4)
    if which == "v_var":
        expr, cons = divergence_cvx(act, cp.Variable(shape), cp.Parameter(shape))
    else:
        W, Xt = cp.Variable((3, 5)), np.ones((5, 4))  # the W-block's u = W X~
        expr, cons = divergence_cvx(act, cp.Parameter(shape), W @ Xt)
    assert expr.is_dcp() and expr.is_convex()
    prob = cp.Problem(cp.Minimize(expr), cons)
    assert prob.is_dcp(dpp=True) and prob.is_dpp()
    # with NumPy constants in place of the parameters: DCP, no parameters
    expr2, cons2 = (
        divergence_cvx(act, cp.Variable(shape), np.full(shape, 0.5))
        if which == "v_var"
        else divergence_cvx(act, np.full(shape, 0.5), cp.Variable(shape))
    )
    assert cp.Problem(cp.Minimize(expr2), cons2).is_dcp()


@pytest.mark.parametrize("name", CVXPY)
def test_cvxpy_dpp_when_the_expression_side_carries_parameters(name):
    """The X-hidden block: B_l(X_{l+1}, W_l [Z; 1]) with Z the variable and W_l, X_{l+1}
    parameters. <u, v> is then a product of parameters (DCP, not DPP); passed precomputed as
    ``linear = <W^T V, [Z; 1]>`` with one parameter P = W^T V, the expression is DPP."""
    act = activation(name)
    Z, W, V = cp.Variable((3, 4)), cp.Parameter((2, 4)), cp.Parameter((2, 4))
    Zt = cp.vstack([Z, np.ones((1, 4))])
    expr, cons = divergence_cvx(act, V, W @ Zt)
    assert cp.Problem(cp.Minimize(expr), cons).is_dcp()
    assert not cp.Problem(cp.Minimize(expr), cons).is_dpp()
    P = cp.Parameter((4, 4))
    expr, cons = divergence_cvx(act, V, W @ Zt, linear=cp.sum(cp.multiply(P, Zt)))
    assert cp.Problem(cp.Minimize(expr), cons).is_dpp()


@pytest.mark.parametrize("name", ELEMENTWISE_FSTAR)  # min over v at a parameter u
def test_cvxpy_minimisers_are_the_graph(name):
    """min_u B(v, u) is at u = phi^{-1}(v) and min_v B(v, u) at v = phi(u); re-solve with new
    parameter values (the DPP workflow of the oracle)."""
    act = activation(name)
    v_par, u = cp.Parameter(3), cp.Variable(3)
    prob_u = cp.Problem(cp.Minimize(divergence_cvx(act, v_par, u)[0]))
    u_par, v = cp.Parameter(3), cp.Variable(3)
    expr, cons = divergence_cvx(act, v, u_par)
    prob_v = cp.Problem(cp.Minimize(expr), cons)
    lo, hi = _dom(act, bound=2.0, margin=0.2)
    for vals in (np.linspace(lo, hi, 3), np.array([lo + 0.1, hi - 0.2, 0.5 * (lo + hi)])):
        v_par.value = vals
        prob_u.solve(solver=cp.CLARABEL)
        assert prob_u.status == cp.OPTIMAL
        np.testing.assert_allclose(act.phi(u.value), vals, atol=1e-3)  # u* = phi^{-1}(v)
        assert abs(prob_u.value) < 1e-5
        u_par.value = np.array([-1.5, 0.3, 1.2]) * (1 + vals[0] ** 2)
        prob_v.solve(solver=cp.CLARABEL)
        assert prob_v.status == cp.OPTIMAL
        np.testing.assert_allclose(v.value, act.phi(u_par.value), atol=2e-3)
        assert abs(prob_v.value) < 1e-5


# the activations with CVXPY forms and a finite lower end of phi's range (v below it is refused)
@pytest.mark.parametrize(
    "name",
    registry_params.activations(
        lambda c: registry_params.has_cvxpy_forms(c) and math.isfinite(c.v_range[0])
    ),
)
def test_cvxpy_rejects_v_outside_range(name):
    act = activation(name)
    lo, _ = act.v_range
    v = np.array([0.5 * (lo + act.v_range[1]) if math.isfinite(act.v_range[1]) else 1.0, lo - 0.25])
    with pytest.raises(ValueError, match=r"^v must lie in the range .* got -?[0-9.]+"):
        divergence_cvx(act, v, cp.Variable(2))


@pytest.mark.parametrize("name", CVXPY)
def test_cvxpy_rejects_two_variables_or_two_constants(name):
    act = activation(name)
    v_ok = np.full(2, 0.5)
    cases = [
        (cp.Variable(2), cp.Variable(2)),
        (v_ok, np.zeros(2)),
        (_param(v_ok), np.zeros(2)),
        (v_ok, _param(np.zeros(2))),
        (_param(v_ok), _param(np.zeros(2))),
    ]
    for v, u in cases:
        with pytest.raises(ValueError, match="exactly one of v, u"):
            divergence_cvx(act, v, u)


# --- array API and dtypes -----------------------------------------------------------------------
METHODS_VU = ("divergence", "grad_u", "grad_v")
METHODS_U = ("phi", "dphi", "Fstar", "project")
METHODS_V = ("F", "phi_inv", "in_range")


@pytest.mark.parametrize("act", instances(CLOSED), ids=repr)
def test_array_api_strict_gives_the_numpy_numbers(act, rng):
    u = rng.uniform(-4, 4, size=(3, 5))
    v = act.project(act.phi(rng.uniform(-4, 4, size=(3, 5))))
    v[0, 0] = act.v_range[1] + 1.0 if math.isfinite(act.v_range[1]) else v[0, 0]  # outside
    su, sv = xps.asarray(u), xps.asarray(v)
    for name in METHODS_U + METHODS_V + METHODS_VU:
        f = getattr(act, name)
        args_np = (u,) if name in METHODS_U else (v,) if name in METHODS_V else (v, u)
        args_xp = (su,) if name in METHODS_U else (sv,) if name in METHODS_V else (sv, su)
        with np.errstate(all="ignore"):
            expected = f(*args_np)
            got = f(*args_xp)
        assert type(got).__module__.startswith("array_api_strict"), name
        np.testing.assert_allclose(
            np.asarray(got), expected, rtol=1e-13, atol=1e-15, err_msg=f"{act!r}.{name}"
        )
    assert act.in_range(sv).dtype == xps.bool


@pytest.mark.parametrize("act", instances(CLOSED), ids=repr)
@pytest.mark.parametrize("lib", ["numpy", "array_api_strict"])
def test_float32_in_float32_out(act, lib, rng):
    u32 = rng.uniform(-3, 3, size=(4, 3)).astype(np.float32)
    v32 = act.project(act.phi(rng.uniform(-3, 3, size=(4, 3)))).astype(np.float32)
    v32 = np.clip(v32, *(np.float32(t) for t in _dom(act, margin=1e-3)))  # phi_inv finite
    if lib == "numpy":
        u, v, f32 = u32, v32, np.float32
    else:
        u, v, f32 = xps.asarray(u32), xps.asarray(v32), xps.float32
    for name in METHODS_U + METHODS_V + METHODS_VU:
        if name == "in_range":
            continue
        f = getattr(act, name)
        out = f(u) if name in METHODS_U else f(v) if name in METHODS_V else f(v, u)
        assert out.dtype == f32, f"{act!r}.{name}: {out.dtype}"
    B32 = np.asarray(act.divergence(v, u))
    B64 = act.divergence(v32.astype(np.float64), u32.astype(np.float64))
    np.testing.assert_allclose(B32, B64, atol=1e-5 * (1 + np.max(np.abs(B64))))


# --- the registry -------------------------------------------------------------------------------
def test_registry_lookup_and_passthrough():
    # the package's closed forms are registered and built by name
    assert {"relu", "leaky_relu", "sigmoid", "tanh"} <= set(CLOSED) <= set(ACTIVATIONS)
    for name in CLOSED:
        a = activation(name)
        assert isinstance(a, Activation) and a.name == name and name in repr(a)
        assert activation(a) is a
    assert activation("leaky_relu", slope=0.3).slope == 0.3
    assert isinstance(activation("monotone", phi=np.tanh), Monotone)


def test_registry_unknown_name():
    with pytest.raises(ValueError, match=r"activation must be one of .* got 'softplus'"):
        activation("softplus")


@pytest.mark.parametrize("slope", [0, 1, -0.5, 1.5, "0.1", float("nan")])
def test_leaky_relu_rejects_bad_slope(slope):
    with pytest.raises(ValueError, match=r"slope must be in \(0, 1\), got"):
        LeakyReLU(slope)


def test_relu_divergence_is_cancellation_free_in_float32():
    """B(v, u) = 1/2 (v - u_+)^2 + v u_-: equal to F + F* - uv, and >= 0 in float32 near the
    graph."""
    relu = ReLU()
    rng = np.random.default_rng(0)
    u = rng.normal(0, 30, 100_000)
    v = np.maximum(u, 0) + np.abs(rng.normal(0, 1e-3, u.shape))  # close to the graph, large
    general = Activation.divergence(relu, v, u)  # F(v) + F*(u) - u v
    np.testing.assert_allclose(relu.divergence(v, u), general, rtol=1e-6, atol=1e-9)
    v32, u32 = v.astype(np.float32), u.astype(np.float32)
    B32 = relu.divergence(v32, u32)
    assert B32.dtype == np.float32 and np.all(B32 >= 0)
    exact = relu.divergence(v32.astype(np.float64), u32.astype(np.float64))
    np.testing.assert_allclose(B32, exact, rtol=1e-5, atol=1e-12)
    assert np.isinf(relu.divergence(np.array([-1.0]), np.array([0.5]))[0])


@pytest.mark.parametrize("xp", [np, xps], ids=["numpy", "array_api_strict"])
def test_relu_in_place_forms_promote_and_broadcast_as_the_general_ones(xp):
    """ReLU's F* and dB/du work in phi's fresh array in place, only where that is exact: a v of
    a wider dtype or of a larger shape, and an integer u, give what ``phi(u) - v`` and
    ``0.5 phi(u)^2`` give (promoted, broadcast)."""
    relu = ReLU()
    u32 = xp.asarray(np.linspace(-2, 2, 6, dtype=np.float32).reshape(2, 3))
    v64 = xp.asarray(np.linspace(0, 1, 6).reshape(2, 3))
    g = relu.grad_u(v64, u32)
    assert g.dtype == xp.float64
    assert np.allclose(np.asarray(g), np.maximum(np.asarray(u32), 0) - np.asarray(v64), atol=0)
    row = u32[:1, :]
    wide = relu.grad_u(xp.zeros((2, 3), dtype=xp.float32), row)
    assert tuple(wide.shape) == (2, 3)
    assert np.array_equal(np.asarray(relu.Fstar(u32)), 0.5 * np.maximum(np.asarray(u32), 0) ** 2)
    if xp is np:  # integer u: array-api-strict has no float * int
        assert np.array_equal(
            relu.Fstar(np.arange(-2, 3)), 0.5 * np.maximum(np.arange(-2, 3), 0) ** 2
        )
    same = relu.grad_u(v64, xp.asarray(np.asarray(u32), dtype=xp.float64))  # in place: exact
    assert np.array_equal(
        np.asarray(same), np.maximum(np.asarray(u32, dtype=np.float64), 0) - np.asarray(v64)
    )


# --- the facts each class carries (``fenchel_cvx.facts``) -----------------------------------------
# the activations that declare sup phi' (``dphi_max``)
@pytest.mark.parametrize("name", registry_params.activations(lambda c: c.dphi_max is not None))
def test_dphi_max_is_the_supremum_of_dphi(name):
    act = activation(name)
    u = np.linspace(-30, 30, 60001)
    assert float(np.max(act.dphi(u))) == pytest.approx(act.dphi_max, rel=1e-6)
    assert np.all(act.dphi(u) <= act.dphi_max)


@pytest.mark.parametrize("name", CLOSED)
def test_d2F_is_the_derivative_of_phi_inverse(name):
    act = activation(name)
    lo, hi = act.v_range
    v = np.linspace(max(lo, -5) + 0.05, min(hi, 5) - 0.05, 101)
    v = v[np.abs(v) > 1e-3]  # ReLU's and leaky ReLU's kink at 0
    h = 1e-6
    fd = (act.phi_inv(v + h) - act.phi_inv(v - h)) / (2 * h)
    np.testing.assert_allclose(act.d2F(v), fd, rtol=1e-6)
    np.testing.assert_allclose(act.d2Fstar(v), act.dphi(v), rtol=0)


@pytest.mark.parametrize("name", CLOSED)
def test_open_range_says_where_F_prime_is_infinite(name):
    act = activation(name)
    ends = [e for e in act.v_range if math.isfinite(e)]
    infinite = any(np.isinf(act.phi_inv(np.array([e])))[0] for e in ends)
    assert act.open_range == infinite


# the activations that give ``x_prox`` (the others' prox is the fast backend's Newton solve)
@pytest.mark.parametrize("name", registry_params.activations(registry_params.closed_form_prox))
def test_closed_form_prox_solves_its_equation(name):
    """Where a class gives ``x_prox``: z minimises L/2 (z - r)^2 + lam (F(z) - u z), i.e.
    z + tau phi^{-1}(z) = r + tau u (``fast.xblocks``), here with u = 0."""
    act = activation(name)
    r, tau = np.linspace(-4, 4, 33), 0.7
    z, state = act.x_prox(np, act, r.copy(), tau, None)
    assert state is None
    inside = z > 0 if act.v_range[0] == 0 else np.ones_like(z, bool)
    np.testing.assert_allclose(
        (z + tau * act.phi_inv(z))[inside], r[inside], rtol=1e-14, atol=1e-14
    )
    assert np.all(r[~inside] <= 0)  # at ReLU's bound: r pushes outward


@pytest.mark.parametrize("name", CLOSED)
def test_config_rebuilds_the_activation(name):
    from fenchel_cvx.activations import activation_from_config

    act = registry_params.built(name)  # leaky ReLU at slope 0.1, not its default
    again = activation_from_config(act.config())
    assert type(again) is type(act) and repr(again) == repr(act)


@pytest.mark.parametrize("name", registry_params.activations(registry_params.has_torch_module))
def test_torch_counterpart_computes_phi(name):
    torch = pytest.importorskip("torch")
    act = activation(name)
    u = np.linspace(-4, 4, 17)
    got = act.torch_module()(torch.from_numpy(u)).numpy()
    np.testing.assert_allclose(got, act.phi(u), rtol=1e-12, atol=1e-15)


def test_check_range_names_the_parameter_and_the_value():
    with pytest.raises(
        ValueError, match=r"^Z must lie in the range \(0.0, 1.0\) of sigmoid, got 1.5$"
    ):
        activation("sigmoid").check_range("Z", np.array([[0.5, 1.5]]))
    activation("tanh").check_range("Z", np.array([-1.0, 0.0, 1.0]))  # the closed range
    with pytest.raises(ValueError, match=r"got -0.5"):
        activation("relu").check_range("V", xps.asarray([1.0, -0.5]))


def test_monotone_carries_the_core_facts_only():
    act = monotone(np.arctan, (-math.pi / 2, math.pi / 2))
    assert activation(act) is act and act.dphi_max is None and act.x_prox is None
    assert act.torch_module is None
