"""The conformance suite: the facts every registered activation, loss and layer kind must satisfy.

The cases are read from the registries when this module is collected (``activation_cases``,
``loss_cases``): every activation ``activation(name)`` builds without a parameter, the classes
that need one through an example instance (``EXAMPLES``), and every loss, each with every
check that applies to its class (a check of an optional fact runs where the class declares
it). A class registered with ``@register_activation`` or ``@register_loss`` is checked with no
test changed; one registered in a test file (below: ``Asinh``) runs the same checks, and a
fault planted in it is caught.

An activation (Theorem 1 of the paper: ``B(v, u) = F(v) + F*(u) - u v``, eq. (4)):

- phi maps into its declared closed range ``v_range`` and never decreases;
- B >= 0, = 0 on the graph v = phi(u), > 0 off it, and at least ``m/2 (v - phi(u))^2`` with
  ``m = 1 / dphi_max``; ``divergence`` is ``F(v) + F*(u) - u v``; B is +inf beyond a finite end
  of the range and >= 0 at it;
- ``dphi``, ``F' = phi^{-1}``, ``F*' = phi``, ``grad_u``, ``grad_v``, ``d2F`` and ``d2Fstar``
  agree with central differences; ``phi_inv`` inverts phi;
- F, F*, ``B(., u)`` and ``B(v, .)`` are convex on sample pairs;
- what the class declares agrees with its definition: ``dphi_max`` is sup phi', ``open_range``
  says where ``phi^{-1}`` is infinite, ``project`` / ``in_range`` / ``check_range`` agree with the
  range, ``x_prox`` minimises ``(z - r)^2 / 2 + tau F(z)``, ``config`` rebuilds it,
  ``torch_module`` computes phi, its CVXPY forms give F and F*.

A loss ``L(Y, Yhat)`` (the paper's eq. (3)), on targets its own ``targets_from`` makes:

- L >= 0 and the sum of its columns (and of its ``elementwise`` terms, its row pieces);
- ``grad`` agrees with central differences; L lies above its tangent planes and is convex;
- ``hvp`` is the derivative of ``grad`` (symmetric, positive semidefinite), ``hess_diag`` its
  diagonal; ``column_curvature`` bounds each column's Hessian (a gradient step of length 1/c
  lowers each column's value by at least ``|g|^2 / (2 c)``);
- ``line_derivs`` and ``line_change`` are the derivatives and change of L along a direction;
- what the class declares agrees with its definition: ``check_targets`` / ``check_labels``
  accept the targets of ``targets_from``; the ``ridge`` last-W solver means the squared error
  its normal equations assume; ``separable_rows`` means ``elementwise`` terms and a diagonal
  Hessian; ``probabilities`` are distributions; ``torch_loss`` is the batch mean; its CVXPY
  form gives L; ``config`` rebuilds it.

A layer kind (``layers.LAYERS``: a layer as a linear map, the paper's Sec. 4.2), on the spec
and input shape of its ``example`` (a kind without weights folded into a dense layer after it),
at random weights:

- its map's methods agree with each other and with its explicit matrix (``testing.layer_faults``:
  forward affine in X, the adjoint, the product form, ``from_rows``, the norm bound);
- ``to_dict`` / ``layer_from_dict`` rebuild it; ``out_shape`` is the size of what it computes;
- without weights: ``adjoint`` is the adjoint of ``apply`` and ``gain2`` bounds ``||P||_2^2``.

A layer kind registered in this file (``Reverse``) is among the cases, and faults planted in it
are caught; a class that lacks a fact, or has no kind of its own, is refused at registration.

A block class (``blocks.BLOCKS``: the four blocks of the paper's Sec. 4.5), on its ``example``:

- the gradient is the derivative of the value (central differences along random directions);
- the value is convex along segments of the block's domain, and ``project`` is the projection
  onto that domain (idempotent, the variational inequality of a projection);
- the KKT residual is at most 1e-6 at the oracle's argmin and not at a random point;
- its pieces (``restrict`` along ``piece_axis``) add up to the block, and its whole-block figures
  on one process (``value_over``, ``summed``) are its own;
- its figures on shares of its image's columns (``columns``), a thread each
  (``column_threads.figures``), are its own, to round-off.

A faulty block class registered in this file is caught; one that lacks a fact is refused.

A backend (``backends.BACKENDS``), built by name, on every block of a small ReLU network with
the squared error and with cross-entropy (``BACKEND_CHECKS``; ``test_backend_in_test_file.py``
runs them on a backend registered there):

- its ``BlockResult`` says what the block says of its argmin: finite, of the block's shape, in
  the block's domain, ``value`` the block's value there, and, where it converged, ``residual``
  the block's KKT residual there (what the certificate recomputes);
- its argmin is no worse than its start;
- it trains the network under the strict certificate (every block's KKT residual, the descent
  and the lower bound F <= J checked every round).

Two faulty backends registered in this file (one reports its start as optimal with a wrong
value, one climbs) are caught by the checks named for them.
"""

import math

import numpy as np
import pytest
from array_api_compat import array_namespace

import registry_params
from conftest import fd_grad
from fenchel_cvx import LiftedNetwork, column_threads
from fenchel_cvx.activations import (
    ACTIVATIONS,
    Activation,
    Monotone,
    activation,
    activation_from_config,
    monotone,
    register_activation,
)
from fenchel_cvx.backends import BACKENDS, BackendDefaults, get_backend, register_backend
from fenchel_cvx.bcd import fit_bcd
from fenchel_cvx.blocks import (
    BLOCKS,
    Block,
    BlockResult,
    XHidden,
    kkt_residual,
    register_block,
    w_block,
    x_block,
)
from fenchel_cvx.errors import CertificateError
from fenchel_cvx.facts import has_fact
from fenchel_cvx.layers import LAYERS, Dense, Spec, build_maps, layer_from_dict, register_layer
from fenchel_cvx.losses import LOSSES, loss
from fenchel_cvx.testing import layer_faults

#: an instance of each registered class that takes a parameter to build (``activation(name)``
#: builds the others): its cases run on it
EXAMPLES = {Monotone: lambda: monotone(np.arctan, (-math.pi / 2, math.pi / 2))}

H = 1e-6  # the central differences' step


def example(name):
    """The instance of the activation ``name`` that its cases check."""
    cls = ACTIVATIONS[name]
    return EXAMPLES[cls]() if cls in EXAMPLES else activation(name)


def checked_activations():
    """The names of the registered activations the suite checks: those built by name, and
    those with an example."""
    return sorted(
        set(registry_params.activations()) | {n for n, c in ACTIVATIONS.items() if c in EXAMPLES}
    )


# --- samples -----------------------------------------------------------------------------------
def _rng(act, salt):
    return np.random.default_rng([salt, sum(map(ord, type(act).__name__))])


def _interior(act, rng, n, bound=6.0, margin=0.05):
    """``n`` points of phi's range, ``margin`` away from its finite ends, within +-bound."""
    lo, hi = act.v_range
    lo = -bound if math.isinf(lo) else max(lo + margin, -bound)
    hi = bound if math.isinf(hi) else min(hi - margin, bound)
    return rng.uniform(lo, hi, n)


def _tol(act, v, u, rel=1e-9):
    """The allowance of B at (v, u): ``rel`` of the size of its terms (``monotone``'s F* is a
    quadrature, to about 1e-12 of them; a closed form is exact to a few eps)."""
    return rel * (1 + np.abs(act.F(v)) + np.abs(act.Fstar(u)) + np.abs(u * v))


def _central(f, x, h=H):
    return (f(x + h) - f(x - h)) / (2 * h)


def _assert_derivative(got, f, x, what, rtol=1e-5, atol=1e-6):
    np.testing.assert_allclose(got, _central(f, x), rtol=rtol, atol=atol, err_msg=what)


def applies_where(predicate):
    """Run the check only on the classes ``predicate`` holds for (they declare its fact)."""

    def mark(check):
        check.applies = predicate
        return check

    return mark


def applies(check, cls):
    """Whether ``check`` runs on the class ``cls`` (every check without ``applies_where``)."""
    return getattr(check, "applies", lambda c: True)(cls)


# --- the activation checks ---------------------------------------------------------------------
def phi_maps_into_its_range_and_never_decreases(act):
    u = np.sort(np.concatenate([np.linspace(-50.0, 50.0, 401), [-1e3, 1e3]]))
    v = act.phi(u)
    assert np.all(act.in_range(v)), f"phi leaves {act.v_range} at u = {u[~act.in_range(v)]}"
    assert np.all(np.diff(v) >= 0), "phi decreases"


def divergence_is_zero_on_the_graph_and_positive_off_it(act):
    """Theorem 1: B >= 0 on phi's range, with equality iff v = phi(u); F'' >= 1 / sup phi'
    makes B >= m/2 (v - phi(u))^2 with m = 1 / dphi_max."""
    rng = _rng(act, 1)
    u = rng.uniform(-6, 6, 60)
    on = act.phi(u)
    assert np.all(np.abs(act.divergence(on, u)) <= _tol(act, on, u)), "B(phi(u), u) != 0"
    v = _interior(act, rng, 60)
    B = act.divergence(v, u)
    assert np.all(np.isfinite(B)), "B is not finite inside the range"
    m = 1.0 / act.dphi_max if act.dphi_max else 0.0
    gap = v - act.phi(u)
    assert np.all(B >= 0.5 * m * gap**2 - _tol(act, v, u)), "B < m/2 (v - phi(u))^2"
    assert np.all(B[np.abs(gap) > 1e-3] > 0), "B = 0 off the graph"


def divergence_is_F_plus_Fstar_minus_uv(act):
    rng = _rng(act, 2)
    v, u = _interior(act, rng, 60), rng.uniform(-6, 6, 60)
    general = act.F(v) + act.Fstar(u) - u * v
    assert np.all(np.abs(act.divergence(v, u) - general) <= _tol(act, v, u)), (
        "divergence != F(v) + F*(u) - u v"
    )


@applies_where(registry_params.bounded_range)
def divergence_is_infinite_beyond_a_finite_end_of_the_range(act):
    u = np.array([-2.0, 0.0, 1.5])
    for end, outward in zip(act.v_range, (-1.0, 1.0)):
        if math.isinf(end):
            continue
        at = np.full(3, end)
        assert np.all(act.in_range(at)), f"the range's end {end} is not in_range"
        assert np.all(act.divergence(at, u) >= 0), f"B < 0 (or NaN) at the range's end {end}"
        beyond = at + outward * np.array([1e-6, 0.5, 10.0])
        assert not np.any(act.in_range(beyond)), f"in_range beyond the end {end}"
        assert np.all(act.divergence(beyond, u) == np.inf), f"B is finite beyond the end {end}"


def gradients_match_finite_differences(act):
    """phi' = dphi, F' = phi^{-1}, F*' = phi, dB/du = grad_u, dB/dv = grad_v."""
    rng = _rng(act, 3)
    u, v = rng.uniform(-6, 6, 40), _interior(act, rng, 40)
    _assert_derivative(act.dphi(u), act.phi, u, "dphi != phi'")
    _assert_derivative(act.phi_inv(v), act.F, v, "phi_inv != F'")
    _assert_derivative(act.phi(u), act.Fstar, u, "phi != F*'")
    _assert_derivative(act.grad_u(v, u), lambda t: act.divergence(v, t), u, "grad_u != dB/du")
    _assert_derivative(act.grad_v(v, u), lambda t: act.divergence(t, u), v, "grad_v != dB/dv")


def second_derivatives_match_finite_differences(act):
    """d2F = (phi^{-1})' (where phi' > 0 at phi^{-1}(v)) and d2Fstar = phi': the Hessians the
    oracle's Newton polish multiplies by."""
    rng = _rng(act, 4)
    u, v = rng.uniform(-6, 6, 40), _interior(act, rng, 40)
    _assert_derivative(act.d2Fstar(u), act.phi, u, "d2Fstar != phi'")
    v = v[act.dphi(act.phi_inv(v)) > 0]
    _assert_derivative(act.d2F(v), act.phi_inv, v, "d2F != (phi^{-1})'", atol=1e-5)


def phi_inv_inverts_phi(act):
    rng = _rng(act, 5)
    v = _interior(act, rng, 40, margin=1e-3)
    np.testing.assert_allclose(act.phi(act.phi_inv(v)), v, rtol=1e-9, atol=1e-12)
    u = rng.uniform(-6, 6, 40)
    u = u[act.dphi(u) > 1e-6]  # where phi is one-to-one (ReLU: u > 0)
    np.testing.assert_allclose(act.phi_inv(act.phi(u)), u, rtol=1e-7, atol=1e-7)


def convex_in_each_argument(act):
    """F, F*, B(., u) and B(v, .) at a convex combination of two points are at most the same
    combination of their values."""
    rng = _rng(act, 6)
    n = 40
    v1, v2 = _interior(act, rng, n, margin=0.0), _interior(act, rng, n, margin=0.0)
    u1, u2 = rng.uniform(-6, 6, n), rng.uniform(-6, 6, n)
    t = rng.uniform(0, 1, n)
    vt, ut = t * v1 + (1 - t) * v2, t * u1 + (1 - t) * u2
    slack = _tol(act, v1, u1) + _tol(act, v2, u2)

    def below(f, x1, x2, xt, what):
        assert np.all(f(xt) <= t * f(x1) + (1 - t) * f(x2) + slack), what

    below(act.F, v1, v2, vt, "F is not convex")
    below(act.Fstar, u1, u2, ut, "F* is not convex")
    below(lambda x: act.divergence(x, u1), v1, v2, vt, "B(., u) is not convex")
    below(lambda x: act.divergence(v1, x), u1, u2, ut, "B(v, .) is not convex")


@applies_where(lambda cls: cls.dphi_max is not None)
def dphi_max_is_the_supremum_of_dphi(act):
    d = act.dphi(np.linspace(-30, 30, 60001))
    assert np.all(d <= act.dphi_max * (1 + 1e-12)), f"phi' exceeds dphi_max = {act.dphi_max}"
    assert float(np.max(d)) >= act.dphi_max * (1 - 1e-6), f"sup phi' < dphi_max {act.dphi_max}"


def open_range_says_where_F_prime_is_infinite(act):
    ends = [e for e in act.v_range if math.isfinite(e)]
    infinite = any(bool(np.isinf(act.phi_inv(np.array([e])))[0]) for e in ends)
    assert act.open_range == infinite, f"open_range is {act.open_range}; phi^-1 at {ends}"


def project_and_in_range_agree_with_the_range(act):
    rng = _rng(act, 7)
    x = rng.uniform(-50, 50, 200)
    p = act.project(x)
    assert np.all(act.in_range(p)), "project leaves the range"
    np.testing.assert_array_equal(act.project(p), p, err_msg="project is not idempotent")
    inside = act.in_range(x)
    np.testing.assert_array_equal(p[inside], x[inside], err_msg="project moves a point inside")
    act.check_range("V", p)
    # the argmin check's form of the same fact, from two extrema (``contains``): on the range,
    # on its ends, a hair outside them, and at a NaN
    ends = [np.full(3, e) for e in act.v_range if math.isfinite(e)]
    for v in [x, p, p + 1e-9, p - 1e-9, np.full(3, np.nan), *ends]:
        held = bool(np.all(act.project(v) == v))
        assert bool(act.contains(v)) == held, f"contains says {not held} where project says {held}"
    if not np.all(inside):
        with pytest.raises(ValueError, match=r"^V must lie in the range"):
            act.check_range("V", x)


@applies_where(registry_params.closed_form_prox)
def x_prox_minimises_its_objective(act):
    """z = x_prox(r, tau) minimises (z - r)^2 / 2 + tau F(z) over phi's range; inside it,
    z + tau phi^{-1}(z) = r (``fast.xblocks``)."""
    r, tau = np.linspace(-4, 4, 33) + 1e-3, 0.7
    z, state = act.x_prox(np, act, r.copy(), tau, None)
    assert state is None, "a closed-form prox keeps no state"
    assert np.all(act.in_range(z)), "the prox leaves the range"

    def objective(x):
        return 0.5 * (x - r) ** 2 + tau * act.F(x)

    for step in (1e-3, -1e-3, 1e-6, -1e-6):
        other = act.project(z + step)
        assert np.all(objective(z) <= objective(other) + 1e-12 * (1 + np.abs(objective(z))))
    lo, hi = act.v_range
    inside = (z > lo) & (z < hi)
    np.testing.assert_allclose((z + tau * act.phi_inv(z))[inside], r[inside], rtol=1e-12)


def config_rebuilds_it(act):
    again = activation_from_config(act.config())
    assert type(again) is type(act) and repr(again) == repr(act)
    u = np.linspace(-3, 3, 13)
    np.testing.assert_array_equal(again.phi(u), act.phi(u))


@applies_where(registry_params.has_torch_module)
def torch_module_computes_phi(act):
    torch = pytest.importorskip("torch")
    u = np.linspace(-4, 4, 17)
    got = act.torch_module()(torch.from_numpy(u)).numpy()
    np.testing.assert_allclose(got, act.phi(u), rtol=1e-12, atol=1e-15)


@applies_where(registry_params.has_cvxpy_forms)
def cvxpy_forms_give_F_and_Fstar(act):
    """The oracle's F(v) evaluates to F; its sum of F*(u) (an epigraph: minimised over its own
    variables) to the sum of F*."""
    import cvxpy as cp

    from fenchel_cvx.oracle.atoms import F_cvx, Fstar_sum_cvx

    rng = _rng(act, 8)
    v, u = _interior(act, rng, 6, bound=3.0), rng.uniform(-3, 3, 6)
    V = cp.Variable(6)
    V.value = v
    F = F_cvx(act, V)
    assert F.is_convex(), "the CVXPY form of F is not convex"
    np.testing.assert_allclose(F.value, act.F(v), rtol=1e-9, atol=1e-12)
    U = cp.Variable(6)
    Fs, cons = Fstar_sum_cvx(act, U)
    problem = cp.Problem(cp.Minimize(Fs), [*cons, U == u])
    assert problem.is_dcp(), "the CVXPY form of F* is not DCP"
    problem.solve(solver=cp.CLARABEL)
    assert problem.status == cp.OPTIMAL
    assert problem.value == pytest.approx(float(np.sum(act.Fstar(u))), rel=1e-6, abs=1e-7)


ACTIVATION_CHECKS = (
    phi_maps_into_its_range_and_never_decreases,
    divergence_is_zero_on_the_graph_and_positive_off_it,
    divergence_is_F_plus_Fstar_minus_uv,
    divergence_is_infinite_beyond_a_finite_end_of_the_range,
    gradients_match_finite_differences,
    second_derivatives_match_finite_differences,
    phi_inv_inverts_phi,
    convex_in_each_argument,
    dphi_max_is_the_supremum_of_dphi,
    open_range_says_where_F_prime_is_infinite,
    project_and_in_range_agree_with_the_range,
    x_prox_minimises_its_objective,
    config_rebuilds_it,
    torch_module_computes_phi,
    cvxpy_forms_give_F_and_Fstar,
)


# --- the loss checks ---------------------------------------------------------------------------
def _loss_data(L, salt, k=3, m=5):
    """``(rng, Y, Yhat, D)``: targets of L from its own ``targets_from``, outputs and a
    direction, k outputs x m points."""
    rng = np.random.default_rng([salt, sum(map(ord, type(L).__name__))])
    Y = L.targets_from(rng.normal(size=(k, m)), 0.3 * rng.normal(size=(k, m)))
    return rng, Y, rng.normal(scale=2.0, size=(k, m)), rng.normal(size=(k, m))


def _ltol(*values, rel=1e-10):
    return rel * (1 + sum(abs(float(v)) for v in values))


def value_is_nonnegative_and_sums_its_columns(L):
    """L >= 0 (its infimum 0: a sum of per-point losses, eq. (3)), the sum of its columns."""
    rng, Y, Yhat, _ = _loss_data(L, 1)
    for scale in (0.1, 2.0, 20.0):
        A = rng.normal(scale=scale, size=Yhat.shape)
        total, cols = float(L.value(Y, A)), L.column_values(Y, A)
        assert total >= 0, f"L = {total} < 0"
        assert cols.shape == (Y.shape[1],) and np.all(cols >= 0)
        assert float(np.sum(cols)) == pytest.approx(total, rel=1e-12, abs=1e-12)
        assert float(np.sum(L.piece_values(Y, A, 0))) == pytest.approx(total, rel=1e-12, abs=1e-12)


def loss_gradient_matches_finite_differences(L):
    _, Y, Yhat, _ = _loss_data(L, 2)
    fd = fd_grad(lambda A: float(L.value(Y, A)), Yhat, H)
    np.testing.assert_allclose(L.grad(Y, Yhat), fd, rtol=1e-6, atol=1e-6)


def loss_is_convex_above_its_tangent_planes(L):
    rng, Y, A, _ = _loss_data(L, 3)
    for _ in range(10):
        B, t = rng.normal(scale=2.0, size=A.shape), rng.uniform()
        fa, fb = float(L.value(Y, A)), float(L.value(Y, B))
        tangent = fa + float(np.sum(L.grad(Y, A) * (B - A)))
        assert fb >= tangent - _ltol(fa, fb, tangent), "L lies below a tangent plane"
        mid = float(L.value(Y, t * A + (1 - t) * B))
        assert mid <= t * fa + (1 - t) * fb + _ltol(fa, fb), "L is not convex"


def hvp_is_the_derivative_of_grad(L):
    """``hvp`` against central differences of ``grad``, symmetric and positive semidefinite;
    ``hess_diag`` its diagonal."""
    rng, Y, Yhat, D = _loss_data(L, 4)
    fd = (L.grad(Y, Yhat + H * D) - L.grad(Y, Yhat - H * D)) / (2 * H)
    HD = L.hvp(Y, Yhat, D)
    np.testing.assert_allclose(HD, fd, rtol=1e-6, atol=1e-8)
    E = rng.normal(size=D.shape)
    HE = L.hvp(Y, Yhat, E)
    assert float(np.sum(E * HD)) == pytest.approx(float(np.sum(D * HE)), rel=1e-10, abs=1e-12)
    assert float(np.sum(D * HD)) >= -1e-12 * float(np.sum(D * D))
    diag = L.hess_diag(Y, Yhat)
    for idx in np.ndindex(Yhat.shape):
        unit = np.zeros_like(Yhat)
        unit[idx] = 1.0
        assert diag[idx] == pytest.approx(L.hvp(Y, Yhat, unit)[idx], rel=1e-12, abs=1e-15)


def column_curvature_bounds_each_column_s_hessian(L):
    """``a_j^T H_j a_j <= c_j |a_j|^2`` per column; a gradient step of length ``1 / c_j``
    lowers column j's value by at least ``|g_j|^2 / (2 c_j)`` (the descent lemma)."""
    rng, Y, Yhat, _ = _loss_data(L, 5)
    c = np.broadcast_to(np.asarray(L.column_curvature(Y, np), dtype=float), (1, Y.shape[1]))
    assert np.all(c >= 0) and L.curvature(Y, np) == pytest.approx(float(np.max(c)))
    for _ in range(5):
        A = rng.normal(size=Yhat.shape)
        quad = np.sum(A * L.hvp(Y, Yhat, A), axis=0)
        assert np.all(quad <= c[0] * np.sum(A * A, axis=0) * (1 + 1e-9) + 1e-12)
    g, live = L.grad(Y, Yhat), c[0] > 0
    step = np.where(live, 1 / np.where(live, c, 1.0), 0.0)
    before, after = L.column_values(Y, Yhat), L.column_values(Y, Yhat - step * g)
    drop = np.where(live, np.sum(g * g, axis=0) * step[0] / 2, 0.0)
    assert np.all(after <= before - drop + 1e-10 * (1 + np.abs(before))), (before, after, drop)


def line_search_facts_match_the_loss(L):
    """``line_derivs``: the first two derivatives of ``t -> L(Y, Yhat + t D)`` at 0;
    ``line_change``: ``L(Y, Yhat + D) - L(Y, Yhat)`` and a size >= 0."""
    _, Y, Yhat, D = _loss_data(L, 6)
    d1, d2 = L.line_derivs(Y, Yhat, D)
    assert float(d1) == pytest.approx(float(np.sum(L.grad(Y, Yhat) * D)), rel=1e-10, abs=1e-12)
    assert float(d2) == pytest.approx(float(np.sum(D * L.hvp(Y, Yhat, D))), rel=1e-10, abs=1e-12)

    def f(t):
        return float(L.value(Y, Yhat + t * D))

    assert float(d1) == pytest.approx((f(H) - f(-H)) / (2 * H), rel=1e-6, abs=1e-6)
    change, size = L.line_change(Y, Yhat, 0.3 * D)
    assert float(change) == pytest.approx(f(0.3) - f(0.0), rel=1e-10, abs=_ltol(f(0.0)))
    assert float(size) >= 0 and math.isfinite(float(size))


def targets_from_gives_targets_it_accepts(L):
    _, Y, _, _ = _loss_data(L, 7)
    L.check_targets("Y", Y, np)
    L.check_labels("Y", Y, w_block=True)
    assert L.tasks and set(L.tasks) <= {"classification", "regression"}, L.tasks


@applies_where(lambda cls: cls.last_w_solver == "ridge")
def ridge_solver_means_the_squared_error(L):
    """The fast backend's ridge solve of the last W-block takes the normal equations of
    ``||W X~ - Y||^2``: the gradient ``2 (Yhat - Y)`` and the Hessian ``2 I`` everywhere."""
    rng, Y, Yhat, D = _loss_data(L, 8)
    for A in (Yhat, rng.normal(scale=10.0, size=Yhat.shape)):
        np.testing.assert_allclose(L.grad(Y, A), 2 * (A - Y), rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(L.hvp(Y, A, D), 2 * D, rtol=1e-12, atol=1e-12)


@applies_where(lambda cls: cls.separable_rows)
def separable_rows_means_elementwise_terms(L):
    """A loss that is a sum over the rows of Yhat too has ``elementwise`` terms summing to it
    (the rows' pieces) and a diagonal Hessian."""
    assert has_fact(L, "elementwise"), "separable_rows without elementwise terms"
    _, Y, Yhat, D = _loss_data(L, 9)
    terms, total = L.elementwise(Y, Yhat), float(L.value(Y, Yhat))
    assert terms.shape == Yhat.shape
    assert float(np.sum(terms)) == pytest.approx(total, rel=1e-12, abs=1e-12)
    rows = L.piece_values(Y, Yhat, 1)
    assert rows.shape == (Y.shape[0], 1)
    assert float(np.sum(rows)) == pytest.approx(total, rel=1e-12, abs=1e-12)
    np.testing.assert_allclose(L.hvp(Y, Yhat, D), L.hess_diag(Y, Yhat) * D, rtol=1e-12, atol=0)


@applies_where(lambda cls: has_fact(cls, "probabilities"))
def probabilities_are_distributions(L):
    _, _, Yhat, _ = _loss_data(L, 10)
    P = L.probabilities(20 * Yhat)
    assert P.shape == Yhat.shape and np.all(P >= 0)
    np.testing.assert_allclose(np.sum(P, axis=0), 1.0, rtol=1e-12)


@applies_where(lambda cls: has_fact(cls, "torch_loss"))
def torch_loss_is_the_batch_mean(L):
    torch = pytest.importorskip("torch")
    _, Y, Yhat, _ = _loss_data(L, 11)
    got = float(L.torch_loss(torch.from_numpy(Yhat.T), torch.from_numpy(Y.T)))
    assert got == pytest.approx(float(L.value(Y, Yhat)) / Y.shape[1], rel=1e-12)


@applies_where(registry_params.has_cvxpy_forms)
def cvxpy_form_gives_the_value(L):
    import cvxpy as cp

    from fenchel_cvx.oracle.atoms import loss_cvx

    _, Y, Yhat, _ = _loss_data(L, 12)
    V = cp.Variable(Yhat.shape)
    V.value = Yhat
    expr = loss_cvx(L, Y, V)
    assert expr.shape == () and expr.is_convex()
    assert float(expr.value) == pytest.approx(float(L.value(Y, Yhat)), rel=1e-10, abs=1e-10)


def config_rebuilds_the_loss(L):
    config = L.config()
    again = loss(config.pop("name"), **config)
    assert type(again) is type(L) and repr(again) == repr(L)
    _, Y, Yhat, _ = _loss_data(L, 13)
    assert float(again.value(Y, Yhat)) == float(L.value(Y, Yhat))


LOSS_CHECKS = (
    value_is_nonnegative_and_sums_its_columns,
    loss_gradient_matches_finite_differences,
    loss_is_convex_above_its_tangent_planes,
    hvp_is_the_derivative_of_grad,
    column_curvature_bounds_each_column_s_hessian,
    line_search_facts_match_the_loss,
    targets_from_gives_targets_it_accepts,
    ridge_solver_means_the_squared_error,
    separable_rows_means_elementwise_terms,
    probabilities_are_distributions,
    torch_loss_is_the_batch_mean,
    cvxpy_form_gives_the_value,
    config_rebuilds_the_loss,
)


# --- the cases, read from the registries -------------------------------------------------------
def cases(names, checks, registry=None):
    """``(name, check)`` for each of ``names`` and each of ``checks`` that applies to its class
    in ``registry`` (every check where None)."""
    return [
        pytest.param(name, check, id=f"{name}-{check.__name__}")
        for name in names
        for check in checks
        if registry is None or applies(check, registry[name])
    ]


def activation_cases():
    """``(name, check)`` for every activation the suite checks and each check of its class."""
    return cases(checked_activations(), ACTIVATION_CHECKS, ACTIVATIONS)


def loss_cases():
    """``(name, check)`` for every registered loss and each check of its class."""
    return cases(registry_params.losses(), LOSS_CHECKS, LOSSES)


@pytest.mark.parametrize("name,check", activation_cases())
def test_activation_conforms(name, check):
    check(example(name))


@pytest.mark.parametrize("name,check", loss_cases())
def test_loss_conforms(name, check):
    check(loss(name))


def test_every_registered_class_is_checked():
    """Each registered activation is built by name or has an example (a class that needs a
    parameter and has none would be checked nowhere); each loss builds without parameters."""
    assert set(checked_activations()) == set(ACTIVATIONS)
    for name in registry_params.losses():
        assert type(loss(name)) is LOSSES[name]


# --- an activation registered in this file, and faults planted in it ----------------------------
class Asinh(Activation):
    """phi(u) = asinh u onto the whole line, phi' = 1 / sqrt(1 + u^2) <= 1 = phi'(0); F(v) =
    cosh v - 1 (the integral of phi^{-1} = sinh), F*(u) = u asinh u - sqrt(1 + u^2) + 1."""

    name = "asinh"
    dphi_max = 1.0

    def phi(self, u):
        return array_namespace(u).asinh(u)

    def dphi(self, u):
        return 1 / array_namespace(u).sqrt(1 + u * u)

    def phi_inv(self, v):
        return array_namespace(v).sinh(v)

    def F(self, v):
        return array_namespace(v).cosh(v) - 1

    def Fstar(self, u):
        xp = array_namespace(u)
        return u * xp.asinh(u) - xp.sqrt(1 + u * u) + 1


class WrongDphi(Asinh):
    """phi' without its square root."""

    name = "asinh_wrong_dphi"

    def dphi(self, u):
        return 1 / (1 + u * u)


class WrongGradV(Asinh):
    """dB/dv with the sign of u flipped."""

    name = "asinh_wrong_grad_v"

    def grad_v(self, v, u):
        return self.phi_inv(v) + u


class WrongFstar(Asinh):
    """F* without its constant: B(phi(u), u) = -1."""

    name = "asinh_wrong_fstar"

    def Fstar(self, u):
        return super().Fstar(u) - 1


class WrongRange(Asinh):
    """A bounded range declared for an unbounded phi."""

    name = "asinh_wrong_range"
    v_range = (-1.0, 1.0)


class WrongDphiMax(Asinh):
    """sup phi' declared half its value."""

    name = "asinh_wrong_dphi_max"
    dphi_max = 0.5


#: each planted fault and the check that must catch it
PLANTED = [
    (WrongDphi, gradients_match_finite_differences),
    (WrongGradV, gradients_match_finite_differences),
    (WrongFstar, divergence_is_zero_on_the_graph_and_positive_off_it),
    (WrongRange, phi_maps_into_its_range_and_never_decreases),
    (WrongDphiMax, dphi_max_is_the_supremum_of_dphi),
]


@pytest.fixture(scope="module")
def asinh_registered():
    """``Asinh`` registered while the tests that ask for it run (``register_activation``, as
    its module would decorate it), and taken out again: the other tests see the registry as
    the package ships it."""
    register_activation(Asinh)
    yield
    del ACTIVATIONS[Asinh.name]


@pytest.mark.parametrize(
    "check", [c for c in ACTIVATION_CHECKS if applies(c, Asinh)], ids=lambda c: c.__name__
)
def test_an_activation_registered_in_a_test_file_runs_each_check(asinh_registered, check):
    """Registered, it is among the suite's cases with each check of its class (not those of
    facts it does not declare: CVXPY forms, a prox, a PyTorch module), and passes them."""
    cases = {(p.values[0], p.values[1]) for p in activation_cases()}
    assert ("asinh", check) in cases
    assert not {c for n, c in cases if n == "asinh"} & {
        x_prox_minimises_its_objective,
        cvxpy_forms_give_F_and_Fstar,
        torch_module_computes_phi,
    }
    check(example("asinh"))


@pytest.mark.parametrize(
    "fault,caught_by", PLANTED, ids=[f"{f.__name__}-{c.__name__}" for f, c in PLANTED]
)
def test_a_fault_planted_in_it_is_caught(asinh_registered, fault, caught_by):
    """The faulty class, registered under its own name, becomes a case of the check that
    catches its fault; the check fails on it and passes on the sound class."""
    register_activation(fault)
    try:
        cases = {(p.values[0], p.values[1]) for p in activation_cases()}
        assert (fault.name, caught_by) in cases
        with pytest.raises(AssertionError):
            caught_by(example(fault.name))
    finally:
        del ACTIVATIONS[fault.name]
    caught_by(example(Asinh.name))


# --- layer kinds ---------------------------------------------------------------------------------
def layer_map(kind, seed=0):
    """The map of the kind's example (a kind without weights before a dense layer of 2 units),
    random weights, and the example spec and its input shape."""
    spec, shape = LAYERS[kind].example()
    A = build_maps(shape, [spec] if spec.weighted else [spec, Dense(2)])[0]
    return A, np.random.default_rng(seed).standard_normal(A.weight_shape), spec, shape


def map_agrees_with_itself(kind):
    A, W, _, _ = layer_map(kind)
    assert layer_faults(A, W, np.random.default_rng(1)) == []


def config_rebuilds_it(kind):
    _, _, spec, _ = layer_map(kind)
    again = layer_from_dict(spec.to_dict())
    assert type(again) is type(spec) and again == spec


def out_shape_is_the_size_it_computes(kind):
    A, W, spec, shape = layer_map(kind)
    X = np.random.default_rng(2).standard_normal((math.prod(shape), 3))
    if spec.weighted:
        assert A.forward(W, X).shape == (math.prod(spec.out_shape(shape)), 3)
    else:
        assert spec.apply(np, X, shape).shape == (math.prod(spec.out_shape(shape)), 3)


@applies_where(lambda cls: not cls.weighted)
def adjoint_and_gain_of_a_weight_free_map(kind):
    _, _, spec, shape = layer_map(kind)
    n, k = math.prod(shape), math.prod(spec.out_shape(shape))
    P = spec.apply(np, np.eye(n), shape)  # its explicit matrix, column by column
    G = np.random.default_rng(3).standard_normal((k, 4))
    np.testing.assert_allclose(spec.adjoint(np, G, shape), P.T @ G, rtol=1e-12, atol=1e-12)
    assert spec.gain2(shape) >= np.linalg.norm(P, 2) ** 2 * (1 - 1e-12)


LAYER_CHECKS = [
    map_agrees_with_itself,
    config_rebuilds_it,
    out_shape_is_the_size_it_computes,
    adjoint_and_gain_of_a_weight_free_map,
]


def layer_cases():
    """``(kind, check)`` for every registered layer kind and each check of its kind."""
    return cases(sorted(LAYERS), LAYER_CHECKS, LAYERS)


@pytest.mark.parametrize("kind,check", layer_cases())
def test_layer_kind_conforms(kind, check):
    check(kind)


class Reverse(Spec):
    """The features of each data point in reverse order: a permutation, ``||P||_2^2 = 1``."""

    kind = "reverse"

    @classmethod
    def example(cls):
        return cls(), (6,)

    def out_shape(self, shape):
        return (math.prod(shape),)

    def gain2(self, shape):
        return 1.0

    def apply(self, xp, X, shape):
        return xp.flip(X, axis=0)

    def adjoint(self, xp, G, shape):
        return xp.flip(G, axis=0)


class AdjointNotReversed(Reverse):
    kind = "adjoint_not_reversed"

    def adjoint(self, xp, G, shape):
        return G


class GainTooSmall(Reverse):
    kind = "gain_too_small"

    def gain2(self, shape):
        return 0.5


class ShapeTooShort(Reverse):
    kind = "shape_too_short"

    def out_shape(self, shape):
        return (math.prod(shape) - 1,)


@pytest.fixture
def reverse_registered():
    """``Reverse`` registered while a test asks for it (``register_layer``), then taken out."""
    register_layer(Reverse)
    yield
    del LAYERS[Reverse.kind]


@pytest.mark.parametrize("check", LAYER_CHECKS, ids=lambda c: c.__name__)
def test_a_layer_kind_registered_in_a_test_file_runs_each_check(reverse_registered, check):
    assert ("reverse", check) in {(p.values[0], p.values[1]) for p in layer_cases()}
    check("reverse")


LAYER_PLANTED = [
    (AdjointNotReversed, adjoint_and_gain_of_a_weight_free_map),
    (GainTooSmall, adjoint_and_gain_of_a_weight_free_map),
    (ShapeTooShort, out_shape_is_the_size_it_computes),
]


@pytest.mark.parametrize(
    "fault,caught_by", LAYER_PLANTED, ids=[f.__name__ for f, _ in LAYER_PLANTED]
)
def test_a_fault_planted_in_a_layer_kind_is_caught(fault, caught_by):
    register_layer(fault)
    try:
        assert (fault.kind, caught_by) in {(p.values[0], p.values[1]) for p in layer_cases()}
        with pytest.raises((AssertionError, ValueError)):
            caught_by(fault.kind)
    finally:
        del LAYERS[fault.kind]


def test_a_layer_kind_without_a_fact_or_a_kind_of_its_own_is_refused():
    class NoAdjoint(Reverse):
        kind = "no_adjoint"
        adjoint = Spec.adjoint  # the base class's placeholder: the fact is absent

    class NoKind(Reverse):
        kind = Spec.kind

    with pytest.raises(ValueError, match="NoAdjoint lacks the fact 'adjoint'"):
        register_layer(NoAdjoint)
    with pytest.raises(ValueError, match="needs a kind of its own"):
        register_layer(NoKind)
    with pytest.raises(ValueError, match="the layer name 'dense' is taken by Dense"):
        register_layer(type("Dense", (Reverse,), {"kind": "dense"}))
    assert {"no_adjoint", Spec.kind}.isdisjoint(LAYERS)


# --- blocks --------------------------------------------------------------------------------------
def block_point(block, seed):
    """A point inside the block's domain (entries in [0.1, 0.4]: inside every activation's
    range), projected for a block whose domain is smaller."""
    return block.project(0.1 + 0.3 * np.random.default_rng(seed).random(block.shape))


def gradient_is_the_derivative_of_the_value(kind):
    block = BLOCKS[kind].example()
    Z, rng, h = block_point(block, 0), np.random.default_rng(1), 1e-6
    g = block.grad(Z)
    for _ in range(3):
        D = rng.standard_normal(block.shape)
        fd = (float(block.value(Z + h * D)) - float(block.value(Z - h * D))) / (2 * h)
        assert fd == pytest.approx(float(np.sum(g * D)), rel=1e-5, abs=1e-7), kind


def value_is_convex_and_project_is_the_projection(kind):
    block = BLOCKS[kind].example()
    A, B = block_point(block, 2), block_point(block, 3)
    fa, fb = float(block.value(A)), float(block.value(B))
    for t in (0.25, 0.5, 0.75):
        mid = float(block.value((1 - t) * A + t * B))
        assert mid <= (1 - t) * fa + t * fb + 1e-10 * (1 + abs(fa) + abs(fb)), kind
    Z = 3.0 * np.random.default_rng(4).standard_normal(block.shape)
    P = block.project(Z)
    np.testing.assert_array_equal(block.project(P), P)
    assert float(np.sum((Z - P) * (A - P))) <= 1e-12 * (1 + float(np.sum(Z * Z))), kind


def kkt_residual_vanishes_at_the_minimiser_alone(kind):
    from fenchel_cvx.oracle import OracleBackend

    block = BLOCKS[kind].example()
    found = OracleBackend(tol=1e-7).solve(block)
    assert kkt_residual(block, found.argmin) <= 1e-6 < kkt_residual(block, block_point(block, 5))


def pieces_and_shares_add_up_to_the_block(kind):
    block = BLOCKS[kind].example()
    Z = block_point(block, 6)
    U = block.forward(Z)
    assert float(block.value_over(Z, U)) == pytest.approx(float(block.value(Z)), rel=1e-12)
    for part, whole in zip(block.summed(block.grad_parts(Z)), block.grad_parts(Z)):
        np.testing.assert_allclose(part, whole, rtol=1e-12, atol=0)
    if block.piece_axis is None:
        return
    n = block.shape[block.piece_axis]
    halves = [np.arange(n // 2), np.arange(n // 2, n)]
    total = sum(
        float(block.restrict(i).value(np.take(Z, i, axis=block.piece_axis))) for i in halves
    )
    assert total == pytest.approx(float(block.value(Z)), rel=1e-12), kind


def figures_on_column_threads_are_the_blocks(kind):
    """``columns`` shares of the image's columns, on threads (``column_threads.figures``): the
    one-thread image, value and KKT residual, to round-off."""
    block = BLOCKS[kind].example()
    Z = block_point(block, 7)
    one = column_threads.figures(block, Z)
    for threads in (2, 3):
        many = column_threads.figures(block, Z, threads=threads, min_columns=1)
        np.testing.assert_allclose(many.image, one.image, rtol=1e-13, atol=0)
        assert many.value == pytest.approx(one.value, rel=1e-12), kind
        assert many.residual == pytest.approx(one.residual, rel=1e-9, abs=1e-15), kind


BLOCK_CHECKS = [
    gradient_is_the_derivative_of_the_value,
    value_is_convex_and_project_is_the_projection,
    kkt_residual_vanishes_at_the_minimiser_alone,
    pieces_and_shares_add_up_to_the_block,
    figures_on_column_threads_are_the_blocks,
]


def block_cases():
    """``(kind, check)`` for every registered block class and each block check."""
    return cases(sorted(BLOCKS), BLOCK_CHECKS)


@pytest.mark.parametrize("kind,check", block_cases())
def test_block_conforms(kind, check):
    check(kind)


class GradientHalved(XHidden):
    """The hidden X-block with its gradient's second term halved: a planted fault."""

    kind = "x_hidden_gradient_halved"

    def grad_parts_with_forward(self, Z, U):
        first, second = super().grad_parts_with_forward(Z, U)
        return [first, 0.5 * second]


def test_a_fault_planted_in_a_block_class_is_caught_and_a_class_without_a_fact_refused():
    register_block(GradientHalved)
    try:
        assert (GradientHalved.kind, gradient_is_the_derivative_of_the_value) in {
            (p.values[0], p.values[1]) for p in block_cases()
        }
        with pytest.raises(AssertionError):
            gradient_is_the_derivative_of_the_value(GradientHalved.kind)
    finally:
        del BLOCKS[GradientHalved.kind]
    gradient_is_the_derivative_of_the_value("x_hidden")

    class NoForward(XHidden):
        kind = "x_hidden_no_forward"
        forward = Block.forward  # the base class's placeholder: the fact is absent

    with pytest.raises(ValueError, match="NoForward lacks the fact 'forward'"):
        register_block(NoForward)


# --- backends ------------------------------------------------------------------------------------
def backend_problem(loss_name, seed=0, m=12):
    """A 4-5-3-2 ReLU network, its data and a point off its feed-forward pass."""
    rng = np.random.default_rng(seed)
    net = LiftedNetwork((4, 5, 3, 2), "relu", loss_name, lam=1.0, rho=0.1, seed=seed)
    X = rng.standard_normal((4, m))
    Y = np.eye(2)[:, rng.integers(0, 2, m)] if loss_name == "cross_entropy" else X[:2] ** 2
    Xs, _ = net.forward(X)
    Xs = [np.maximum(A + 0.3 * rng.standard_normal(A.shape), 0.0) for A in Xs]
    return net, X, Y, Xs


def backend_solves(name):
    """``(block, start, result)`` of every block of both problems, solved by the backend."""
    for loss_name in ("mse", "cross_entropy"):
        net, X, Y, Xs = backend_problem(loss_name)
        backend = get_backend(name, net=net)
        for l in range(1, len(Xs) + 1):
            block = x_block(net, X, Y, Xs, l)
            start = block.project(np.asarray(Xs[l - 1], dtype=float))
            yield block, start, backend.solve(block, start)
        for l in range(len(net.W)):
            block = w_block(net, X, Y, Xs, l)
            yield block, net.W[l], backend.solve(block, net.W[l])


def result_is_what_the_block_says(name):
    for block, _, res in backend_solves(name):
        Z = np.asarray(res.argmin, dtype=float)
        assert Z.shape == tuple(block.shape) and np.all(np.isfinite(Z)), block.kind
        np.testing.assert_allclose(block.project(Z), Z, rtol=0, atol=1e-12)
        assert res.value == pytest.approx(float(block.value(Z)), rel=1e-9, abs=1e-12), block.kind
        if res.converged:
            kkt = kkt_residual(block, Z)
            assert res.residual == pytest.approx(kkt, rel=1e-6, abs=1e-12), block.kind


def argmin_is_no_worse_than_its_start(name):
    for block, start, res in backend_solves(name):
        before = float(block.value(start))
        assert float(block.value(res.argmin)) <= before + 1e-12 * (1.0 + abs(before)), block.kind


def trains_under_the_strict_certificate(name):
    for loss_name in ("mse", "cross_entropy"):
        net, X, Y, _ = backend_problem(loss_name, seed=1)
        res = fit_bcd(net, X, Y, iterations=2, backend=name, strict=True, gamma=0.5)
        assert res.history.certificate_held, (name, loss_name)


BACKEND_CHECKS = [
    result_is_what_the_block_says,
    argmin_is_no_worse_than_its_start,
    trains_under_the_strict_certificate,
]


def backend_cases():
    """``(name, check)`` for every registered backend and each backend check."""
    return cases(sorted(BACKENDS), BACKEND_CHECKS)


@pytest.mark.parametrize("name,check", backend_cases())
def test_backend_conforms(name, check):
    check(name)


class ReportsTheStart(BackendDefaults):
    """A planted fault: returns its start, claiming it converged, with the value off by 1."""

    name = "reports_the_start"

    def __init__(self, tol=None):
        self.tol = tol

    def solve(self, block, start=None):
        Z = block.project(np.zeros(block.shape) if start is None else np.asarray(start))
        value = float(block.value(Z)) + 1.0
        return BlockResult(argmin=Z, value=value, status="optimal", residual=0.0)


class ClimbsFromTheStart(ReportsTheStart):
    """A planted fault: returns a point worse than its start, reported honestly."""

    name = "climbs_from_the_start"

    def solve(self, block, start=None):
        Z = block.project(np.asarray(start) + 1.0)
        res = kkt_residual(block, Z)
        return BlockResult(argmin=Z, value=float(block.value(Z)), status="capped", residual=res,
                           converged=False)  # fmt: skip


BACKEND_PLANTED = [
    (ReportsTheStart, result_is_what_the_block_says),
    (ReportsTheStart, trains_under_the_strict_certificate),
    (ClimbsFromTheStart, argmin_is_no_worse_than_its_start),
    (ClimbsFromTheStart, trains_under_the_strict_certificate),
]


@pytest.mark.parametrize(
    "fault,caught_by",
    BACKEND_PLANTED,
    ids=[f"{f.__name__}-{c.__name__}" for f, c in BACKEND_PLANTED],
)
def test_a_fault_planted_in_a_backend_is_caught(fault, caught_by):
    """Registered, the faulty backend is a case of the check that catches it, and fails it
    (a strict run stops on the certificate: ``CertificateError``)."""
    register_backend(fault)
    try:
        assert (fault.name, caught_by) in {(p.values[0], p.values[1]) for p in backend_cases()}
        with pytest.raises((AssertionError, CertificateError)):
            caught_by(fault.name)
    finally:
        del BACKENDS[fault.name]
