"""Tests of fenchel_cvx.blocks: the four convex blocks of the lifted objective.

For every block kind x activation x loss: the gradient is the derivative of the value; the value
changes exactly as the lifted objective F(W, X) does when only the block's variable moves (so the
block holds every term of F that depends on its variable); the KKT residual vanishes at a
minimiser found independently (scipy's L-BFGS-B) and not at a random point.
"""

import copy
import dataclasses

import array_api_strict as xps
import numpy as np
import pytest
from scipy.optimize import minimize

from conftest import ACTIVATION_NAMES, LOSS_NAMES, interior_sample, make_problem
from fenchel_cvx.blocks import (
    BlockResult,
    WHidden,
    WLast,
    XHidden,
    XLast,
    kkt_residual,
    w_block,
    x_block,
)
from registry_params import clip_bounds

SIZES = (3, 4, 3, 2)  # L = 2: X-blocks 1 (hidden), 2 (last); W-blocks 0, 1 (hidden), 2 (last)
M = 5
#: (name, kind, layer, class)
BLOCKS = [
    ("X1", "x", 1, XHidden),
    ("X2", "x", 2, XLast),
    ("W0", "w", 0, WHidden),
    ("W1", "w", 1, WHidden),
    ("W2", "w", 2, WLast),
]
GAMMA = 0.7
#: different activations per layer, so that a block mixing up phi_{l-1} and phi_l is caught
MIXED = [
    (("sigmoid", "relu"), "mse"),
    (("relu", "tanh"), "cross_entropy"),
    (("tanh", "leaky_relu"), "cross_entropy"),
]


class Case:
    """A block at a random iterate, with the lifted objective as a function of its variable."""

    def __init__(self, block_name, act, loss, gamma=0.0, seed=0):
        _, self.kind, self.l, self.cls = next(b for b in BLOCKS if b[0] == block_name)
        self.net, self.X0, self.Y, self.Xs = make_problem(
            SIZES, act=act, loss=loss, lam=[0.8, 1.7], rho=[0.1, 0.3, 0.2], m=M, seed=seed
        )
        self.rng = np.random.default_rng(seed + 1)
        self.gamma = gamma
        if self.kind == "x":
            self.block = x_block(self.net, self.X0, self.Y, self.Xs, self.l)
            self.Z = self.Xs[self.l - 1].copy()
        else:
            W = self.net.W[self.l]
            self.W0 = W + 0.3 * self.rng.normal(size=W.shape) if gamma else None
            self.block = w_block(
                self.net, self.X0, self.Y, self.Xs, self.l, gamma=gamma, W0=self.W0
            )
            self.Z = W.copy()

    def lifted(self, Z):
        """F(W, X) with the block's variable replaced by Z (+ gamma ||W - W0||^2 for W-blocks)."""
        if self.kind == "x":
            Xs = [X.copy() for X in self.Xs]
            Xs[self.l - 1] = Z
            return self.net.lifted_objective(self.X0, self.Y, Xs)
        net = copy.deepcopy(self.net)
        net.W[self.l] = Z
        F = net.lifted_objective(self.X0, self.Y, self.Xs)
        return F + (self.gamma * np.sum((Z - self.W0) ** 2) if self.gamma else 0.0)

    def random_point(self):
        """Another point of the block's domain (strictly inside it for X-blocks)."""
        if self.kind == "x":
            return interior_sample(self.net.activations[self.l - 1], self.Z.shape, self.rng)
        return self.Z + self.rng.normal(size=self.Z.shape)

    def bounds(self):
        """L-BFGS-B's box for the block's variable: none for a W-block; for an X-block, the
        activation's range (``v_range``), each finite end moved 1e-10 inward where F' is
        infinite there (``open_range``: sigmoid, tanh, ELU's -1, where the residual is
        infinite too), kept where it is finite (ReLU's 0: a minimiser may sit on it)."""
        if self.kind == "w":
            return None
        return [clip_bounds(self.net.activations[self.l - 1], 1e-10)] * self.Z.size


def cases(with_gamma=True):
    out = []
    for name, kind, _, _ in BLOCKS:
        for act in ACTIVATION_NAMES:
            for loss in LOSS_NAMES:
                for gamma in (0.0, GAMMA) if kind == "w" and with_gamma else (0.0,):
                    out.append(
                        pytest.param(
                            name,
                            act,
                            loss,
                            gamma,
                            id=f"{name}-{act}-{loss}" + ("-prox" if gamma else ""),
                        )
                    )
        for acts, loss in MIXED:
            out.append(
                pytest.param(name, list(acts), loss, 0.0, id=f"{name}-{'+'.join(acts)}-{loss}")
            )
    return out


# --- the blocks -----------------------------------------------------------------------------
@pytest.mark.parametrize("name,act,loss,gamma", cases())
def test_block_kind_and_fields(name, act, loss, gamma):
    c = Case(name, act, loss, gamma)
    assert type(c.block) is c.cls and c.block.layer == c.l
    assert (
        c.block.kind
        == {XHidden: "x_hidden", XLast: "x_last", WHidden: "w_hidden", WLast: "w_last"}[c.cls]
    )
    v = c.block.value(c.Z)
    assert np.isfinite(v) and np.ndim(v) == 0
    assert c.block.grad(c.Z).shape == c.Z.shape


@pytest.mark.parametrize("name,act,loss,gamma", cases())
def test_gradient_matches_finite_differences(name, act, loss, gamma, fd_grad):
    c = Case(name, act, loss, gamma, seed=4)
    for Z in (c.Z, c.random_point()):
        g = c.block.grad(Z)
        fd = fd_grad(lambda A: float(c.block.value(A)), Z)
        np.testing.assert_allclose(g, fd, rtol=1e-5, atol=1e-6 * (1 + np.max(np.abs(g))))
        parts = c.block.grad_parts(Z)
        np.testing.assert_allclose(sum(parts[1:], parts[0]), g)


@pytest.mark.parametrize("name,act,loss,gamma", cases())
def test_value_changes_exactly_as_the_lifted_objective(name, act, loss, gamma):
    """value(new) - value(old) = F(new) - F(old) when only the block's variable moves."""
    c = Case(name, act, loss, gamma, seed=7)
    old = c.Z
    F_old, v_old = c.lifted(old), float(c.block.value(old))
    for _ in range(3):
        new = c.random_point()
        dF = c.lifted(new) - F_old
        dv = float(c.block.value(new)) - v_old
        assert dv == pytest.approx(dF, rel=1e-9, abs=1e-9 * (1 + abs(F_old)))


@pytest.mark.parametrize("name,act,loss,gamma", cases())
def test_kkt_residual_zero_at_minimiser_positive_elsewhere(name, act, loss, gamma):
    c = Case(name, act, loss, gamma, seed=11)
    shape = c.Z.shape

    def fun(z):
        Z = z.reshape(shape)
        return float(c.block.value(Z)), np.asarray(c.block.grad(Z), dtype=float).ravel()

    res = minimize(
        fun,
        c.block.project(c.Z).ravel(),
        jac=True,
        method="L-BFGS-B",
        bounds=c.bounds(),
        options=dict(maxiter=20000, maxcor=50, ftol=1e-16, gtol=1e-12, maxls=100),
    )
    Zstar = res.x.reshape(shape)
    assert c.block.kkt_residual(Zstar) < 1e-5, res.message  # leaky ReLU (a = 0.01): ~1e-6
    assert kkt_residual(c.block, Zstar) == c.block.kkt_residual(Zstar)
    # the minimiser beats the starting point and a random point
    assert c.block.value(Zstar) <= c.block.value(c.block.project(c.Z)) + 1e-12
    Zr = c.random_point()
    assert c.block.value(Zstar) <= c.block.value(Zr)
    assert c.block.kkt_residual(Zr) > 1e-3
    assert c.block.kkt_residual(c.Z) > 1e-3


@pytest.mark.parametrize("act", ACTIVATION_NAMES)
def test_x_block_projection_is_onto_the_activation_range(act):
    c = Case("X1", act, "mse")
    Z = 5 * c.rng.normal(size=c.Z.shape)
    P = c.block.project(Z)
    assert np.all(c.net.activations[0].in_range(P))
    np.testing.assert_array_equal(P, c.net.activations[0].project(Z))
    c = Case("W1", act, "mse")
    np.testing.assert_array_equal(c.block.project(Z), Z)


def test_kkt_residual_at_boundary_minimiser_relu():
    """min_{Z >= 0} of a block whose unconstrained minimiser is negative: Z* = 0 on those
    entries (projected, not plain, gradient), and the residual sees it."""
    net, X0, Y, Xs = make_problem((2, 3, 1), act="relu", loss="mse", lam=1.0, rho=0.0, m=1)
    net.W[0][:] = 0.0
    net.W[0][:, -1] = -1.0  # U_0 = -1: B_0(Z, U_0) = Z^2/2 + Z, pushes Z below 0
    net.W[1][:] = 0.0  # the loss does not depend on Z
    b = x_block(net, X0, Y, Xs, 1)
    Z0 = np.zeros((3, 1))
    assert b.kkt_residual(Z0) == pytest.approx(0.0, abs=1e-15)
    assert np.any(b.grad(Z0) != 0)  # yet the plain gradient does not vanish
    assert b.kkt_residual(Z0 + 0.5) > 0.1


# --- array API ------------------------------------------------------------------------------
def _to_strict(block):
    conv = {
        f.name: xps.asarray(getattr(block, f.name))
        for f in dataclasses.fields(block)
        if isinstance(getattr(block, f.name), np.ndarray)
    }
    return dataclasses.replace(block, **conv)


@pytest.mark.parametrize(
    "name,act,loss,gamma", [p for p in cases() if str(p.values[1]) in ("sigmoid", "leaky_relu")]
)
def test_blocks_run_on_array_api_strict(name, act, loss, gamma):
    c = Case(name, act, loss, gamma, seed=5)
    sb, sZ = _to_strict(c.block), xps.asarray(c.Z)
    np.testing.assert_allclose(float(sb.value(sZ)), float(c.block.value(c.Z)), rtol=1e-13)
    np.testing.assert_allclose(np.asarray(sb.grad(sZ)), c.block.grad(c.Z), rtol=1e-12, atol=1e-14)
    assert sb.kkt_residual(sZ) == pytest.approx(c.block.kkt_residual(c.Z), rel=1e-12)
    assert type(sb.project(sZ)).__module__.startswith("array_api_strict")


# --- builders -------------------------------------------------------------------------------
def test_builders_reject_bad_arguments():
    net, X0, Y, Xs = make_problem(SIZES)
    W = net.W[1]
    for l in (0, 3, -1):
        with pytest.raises(ValueError, match=rf"l must be in 1..2 for an X-block, got {l}"):
            x_block(net, X0, Y, Xs, l)
    for l in (-1, 3):
        with pytest.raises(ValueError, match=rf"l must be in 0..2 for a W-block, got {l}"):
            w_block(net, X0, Y, Xs, l)
    with pytest.raises(ValueError, match=r"gamma must be >= 0 and finite, got -0.5"):
        w_block(net, X0, Y, Xs, 1, gamma=-0.5, W0=W)
    with pytest.raises(ValueError, match=r"W0 is required when gamma > 0"):
        w_block(net, X0, Y, Xs, 1, gamma=0.5)
    lin, X0l, Yl, _ = make_problem((3, 2))
    with pytest.raises(ValueError, match=r"l must be in 1..0 for an X-block, got 1"):
        x_block(lin, X0l, Yl, [], 1)
    assert isinstance(w_block(lin, X0l, Yl, [], 0), WLast)


@pytest.mark.parametrize("gamma", [float("nan"), float("inf")])
def test_w_block_rejects_non_finite_gamma(gamma):
    """Like lam and rho in LiftedNetwork: a NaN / inf gamma must not slip through (with a
    W0 given, NaN passes ``gamma < 0`` and every block value becomes NaN)."""
    net, X0, Y, Xs = make_problem(SIZES)
    with pytest.raises(ValueError, match=r"gamma must be .* got (nan|inf)"):
        w_block(net, X0, Y, Xs, 1, gamma=gamma, W0=net.W[1])


def test_gamma_zero_ignores_W0_and_prox_term_is_added():
    net, X0, Y, Xs = make_problem(SIZES)
    W = net.W[0]
    b0 = w_block(net, X0, Y, Xs, 0)
    b_ignored = w_block(net, X0, Y, Xs, 0, gamma=0.0, W0=W + 1.0)
    assert b_ignored.W0 is None and b_ignored.value(W) == b0.value(W)
    b = w_block(net, X0, Y, Xs, 0, gamma=2.0, W0=W + 1.0)
    assert b.value(W) == pytest.approx(b0.value(W) + 2.0 * W.size, rel=1e-12)
    np.testing.assert_allclose(b.grad(W), b0.grad(W) - 4.0, rtol=1e-12)


def test_blocks_are_views_of_the_iterate_fields():
    """The block data are the network's current U_{l-1}, W_l, X_{l+1}, X~_l."""
    net, X0, Y, Xs = make_problem(SIZES, act="tanh")
    b = x_block(net, X0, Y, Xs, 1)
    np.testing.assert_allclose(b.U_prev, net.W[0][:, :-1] @ X0 + net.W[0][:, -1:])
    assert b.W is net.W[1] and b.V_next is Xs[1] and b.lam_in == net.lam[0]
    b = w_block(net, X0, Y, Xs, 2)
    np.testing.assert_array_equal(b.Xt, np.vstack([Xs[1], np.ones((1, M))]))
    assert b.Y is Y and b.rho == net.rho[2]


def test_block_result_defaults():
    r = BlockResult(argmin=np.zeros(2), value=1.0, status="optimal", residual=0.0)
    assert r.converged and r.iterations == 0 and r.info == {}
    assert BlockResult(None, 0.0, "optimal", 0.0).info is not r.info


def test_kkt_residual_is_infinite_where_a_gradient_term_is():
    """A sigmoid X-block at the range's end Z = 0 has phi^{-1}(0) = -inf: not optimal."""
    import math

    from fenchel_cvx import LiftedNetwork
    from fenchel_cvx.blocks import x_block

    net = LiftedNetwork([3, 4, 2], "sigmoid", "mse", seed=0)
    X0 = np.linspace(0.1, 0.9, 15).reshape(3, 5)
    Y = np.ones((2, 5))
    Xs, _ = net.forward(X0)
    block = x_block(net, X0, Y, Xs, 1)
    assert block.kkt_residual(np.zeros_like(Xs[0])) == math.inf
    assert math.isfinite(block.kkt_residual(Xs[0]))


# --- what each block class owns: shape, activations, pieces -----------------------------------
@pytest.mark.parametrize("name,act,loss,gamma", cases(with_gamma=False))
def test_block_owns_its_shape_and_activations(name, act, loss, gamma):
    c = Case(name, act, loss, gamma)
    assert c.block.shape == c.Z.shape  # the shape of X_l or W_l
    phi, L = c.net.activations, c.net.n_hidden
    expected = {
        XHidden: lambda: (phi[c.l - 1], phi[c.l]),
        XLast: lambda: (phi[L - 1],),
        WHidden: lambda: (phi[c.l],),
        WLast: tuple,
    }[c.cls]()
    assert len(c.block.activations) == len(expected)
    assert all(a is b for a, b in zip(c.block.activations, expected))


@pytest.mark.parametrize("name,act,loss,gamma", cases())
def test_block_separates_into_its_pieces(name, act, loss, gamma):
    """The value is the sum of the values of the restricted blocks over a partition of the
    pieces (columns of an X-block, rows of a W-block), and each piece's gradient is its slice
    of the block's gradient; the W_L block of a loss that is no sum over the rows of Yhat
    (``separable_rows`` false: cross-entropy) is one piece."""
    c = Case(name, act, loss, gamma, seed=2)
    block, Z = c.block, c.random_point()
    axis = block.piece_axis
    if axis is None:
        assert c.cls is WLast and not c.net.loss.separable_rows
        assert block.restrict(np.arange(1)) is block
        return
    assert axis == (1 if c.kind == "x" else 0)
    n = Z.shape[axis]
    partition = [np.arange(0, n, 2), np.arange(1, n, 2)]  # interleaved, both non-empty
    g = block.grad(Z)
    total = 0.0
    for idx in partition:
        piece, Zp = block.restrict(idx), np.take(Z, idx, axis=axis)
        assert type(piece) is c.cls and piece.shape == Zp.shape
        total += float(piece.value(Zp))
        np.testing.assert_allclose(
            piece.grad(Zp), np.take(g, idx, axis=axis), rtol=1e-12, atol=1e-13
        )
    np.testing.assert_allclose(total, float(block.value(Z)), rtol=1e-12)
