"""Proof by extension: a layer kind defined in this file alone (the docs page "Add a layer kind")
trains under the strict certificate with the fast backend, the CVXPY oracle solves its blocks,
and the fast backend's block optima are the oracle's; faults planted in it are caught.

``Conv1d`` is a 1-D convolution (cross-correlation, stride 1, no padding) of signals of shape
``(C, 1, L)``, a signal being an image one pixel high. It subclasses ``layers.Spec`` and gives
the methods that ``layers.LinearMap`` calls (``out_shape``, ``weight_shape``, ``fans``,
``patches``, ``forward``, ``adjoint_x``, ``norm2_bound``, ``to_rows``, ``from_rows``) and an
``example``; nothing of the package changes. It is registered (``layers.register_layer``) while
this file runs, so that its dict form (``layer_from_dict``) and a network's config read back.

``testing.layer_faults`` is the check a new layer kind needs: forward against the explicit
matrix, the adjoint identity ``<A x, y> = <x, A^T y>``, the product form ``to_rows(A(W, X) + b) = W
patches(X)``, ``from_rows`` against ``to_rows`` and the norm bound against the exact norm. The
X-blocks' KKT residual, which the certificate recomputes, reaches the map through ``adjoint_x``
itself, so a wrong adjoint is consistent with it: the last test shows the fast solve "converged"
by that residual while the oracle, which writes the block from ``forward`` alone, and the
certificate's objective checks see the fault.
"""

import math

import numpy as np
import pytest
from array_api_compat import array_namespace, device

from fenchel_cvx import Dense, Flatten, LiftedNetwork, fit_bcd
from fenchel_cvx.blocks import w_block, x_block
from fenchel_cvx.errors import CertificateError, SolverInaccurate
from fenchel_cvx.fast import FastBackend
from fenchel_cvx.layers import LAYERS, Spec, layer_from_dict, register_layer
from fenchel_cvx.oracle import OracleBackend
from fenchel_cvx.testing import layer_faults


class Conv1d(Spec):
    """``channels`` filters of ``kernel`` taps on signals of shape ``(C, 1, L)``.

    ``W`` is ``channels x (C kernel + 1)``: ``W[:, :-1].reshape(channels, C, kernel)`` is a
    ``torch.nn.Conv1d`` weight, ``W[:, -1]`` its bias. The patches of X hold, for every output
    position t and data point j, the ``C kernel`` input values under the filter, and a row of
    ones: ``to_rows(A(W, X) + b) = W patches(X)``, one row per output channel.
    """

    kind = "conv1d"
    weighted = True

    def __init__(self, channels, kernel):
        self.channels, self.kernel = int(channels), int(kernel)

    @classmethod
    def example(cls):
        return cls(2, 3), (2, 1, 9)

    def params(self):
        return {"channels": self.channels, "kernel": self.kernel}

    def _geometry(self, shape):
        if len(shape) != 3 or shape[1] != 1:
            raise ValueError(f"conv1d needs a (channels, 1, length) input, got shape {shape}")
        C, _, L = shape
        if L < self.kernel:
            raise ValueError(f"conv1d kernel {self.kernel} exceeds its input length {L}")
        return C, L, L - self.kernel + 1

    def out_shape(self, shape):
        return (self.channels, 1, self._geometry(shape)[2])

    def weight_shape(self, shape):
        return (self.channels, shape[0] * self.kernel + 1)

    def fans(self, shape):
        return shape[0] * self.kernel, self.channels * self.kernel

    def _taps(self, xp, X, shape):
        """im2col: ``(C kernel) x (L_out m)``, rows (c, i), columns (t, data point): row
        ``c L + t + i`` of X (a sample's row holds every data point)."""
        C, L, Lo = self._geometry(shape)
        c, i, t = np.ogrid[:C, : self.kernel, :Lo]
        index = xp.asarray(np.reshape(c * L + t + i, (-1,)), device=device(X))
        return xp.reshape(xp.take(X, index, axis=0), (C * self.kernel, Lo * X.shape[1]))

    def patches(self, xp, X, shape):
        T = self._taps(xp, X, shape)
        ones = xp.ones((1, T.shape[1]), dtype=X.dtype, device=device(X))
        return xp.concat([T, ones], axis=0)

    def forward(self, xp, W, X, shape):
        R = W[:, :-1] @ self._taps(xp, X, shape) + W[:, -1:]
        return self.from_rows(xp, R, shape, X.shape[1])

    def adjoint_x(self, xp, W, G, shape):
        """col2im: each patch column's ``K^T`` image added back into the inputs it read."""
        C, L, Lo = self._geometry(shape)
        m, k = G.shape[1], self.kernel
        cols = xp.reshape(W[:, :-1].T @ self.to_rows(xp, G, shape), (C, k, Lo, m))
        out = xp.zeros((C, L, m), dtype=xp.result_type(W, G), device=device(G))
        for i in range(k):
            out[:, i : i + Lo, :] += cols[:, i, :, :]
        return xp.reshape(out, (C * L, m))

    def norm2_bound(self, W, shape, max_dim):
        """``kernel ||K||_2^2``, ``K = W[:, :-1]``: ``||A x||^2 = sum_t ||K x_t||^2`` over the
        patches ``x_t``, and an input value lies in at most ``kernel`` of them. None where K's
        smaller side exceeds ``max_dim``."""
        K = W[:, :-1]
        if min(K.shape) > max_dim:
            return None
        xp = array_namespace(W)
        K = xp.astype(K, xp.float64)
        G = K @ K.T if K.shape[0] <= K.shape[1] else K.T @ K
        return self.kernel * float(xp.max(xp.linalg.eigvalsh(G)))

    def to_rows(self, xp, U, shape):
        return xp.reshape(U, (self.channels, U.shape[0] // self.channels * U.shape[1]))

    def from_rows(self, xp, R, shape, m):
        return xp.reshape(R, (R.shape[0] * R.shape[1] // m, m))


@pytest.fixture(autouse=True, scope="module")
def _registered_while_this_file_runs():
    """``Conv1d`` registered while this file's tests run, and not at its import: the other
    files see the package's registry as it ships."""
    register_layer(Conv1d)
    yield
    LAYERS.pop(Conv1d.kind, None)


SHAPE = (2, 1, 9)  # two channels of 9 samples


def network(seed=0, second=Conv1d):
    """(2, 1, 9) -> conv1d 3@3 -> conv1d 2@3 (of class ``second``) -> flatten + dense 2, ReLU,
    MSE. The second conv1d is the map of X_1's block."""
    return LiftedNetwork.from_layers(
        SHAPE,
        [Conv1d(3, 3), second(2, 3), Flatten(), Dense(2)],
        activation="relu",
        loss="mse",
        lam=(1.0, 0.7),
        rho=0.1,
        seed=seed,
    )


def state(seed=0, m=6, second=Conv1d):
    """A network and a point off its feed-forward pass: ``(net, X0, Y, Xs)``."""
    rng = np.random.default_rng(seed)
    net = network(seed, second)
    X0, Y = rng.standard_normal((math.prod(SHAPE), m)), rng.standard_normal((2, m))
    Xs, _ = net.forward(X0)
    Xs = [np.maximum(X + 0.2 * rng.standard_normal(X.shape), 0.0) for X in Xs]
    return net, X0, Y, Xs


# --- the layer's facts ------------------------------------------------------------------------
def test_its_maps_agree_with_themselves():
    net = network()
    assert [A.describe() for A in net.layers] == [
        "conv1d: (2, 1, 9) -> (3, 1, 7), W (3, 7)",
        "conv1d: (3, 1, 7) -> (2, 1, 5), W (2, 10)",
        "flatten + dense 2: (2, 1, 5) -> (2,), W (2, 11)",
    ]
    rng = np.random.default_rng(1)
    for A, W in zip(net.layers, net.W):
        assert layer_faults(A, W, rng) == []


def test_its_maps_run_on_the_array_api_standard():
    xps = pytest.importorskip("array_api_strict")
    net, rng = network(), np.random.default_rng(2)
    A, W = net.layers[1], net.W[1]
    X, G = rng.standard_normal((A.n_in, 3)), rng.standard_normal((A.n_out, 3))
    for name, args in (("forward", (W, X)), ("adjoint_x", (W, G)), ("patches", (X,))):
        want = getattr(A, name)(*args)
        got = getattr(A, name)(*(xps.asarray(a) for a in args))
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-13, atol=1e-13)


def test_its_config_round_trips():
    net = network(seed=3)
    config = net.get_config()
    assert config["layers"][0] == {"kind": "conv1d", "channels": 3, "kernel": 3}
    assert layer_from_dict(config["layers"][1]) == Conv1d(2, 3)
    again = LiftedNetwork.from_config(config)
    assert all(np.array_equal(a, b) for a, b in zip(again.W, net.W))


# --- training and the oracle --------------------------------------------------------------------
def test_the_fast_backend_trains_it_under_the_strict_certificate():
    net, X0, Y, _ = state(seed=2, m=8)
    before = net.network_objective(X0, Y)
    res = fit_bcd(net, X0, Y, iterations=3, backend="fast", strict=True, gamma=0.5)
    assert res.history.certificate_held and len(res.history.records) == 3
    assert net.network_objective(X0, Y) < before


@pytest.mark.parametrize("which", ["X_1", "X_2", "W_0", "W_1", "W_2"])
def test_the_fast_optima_are_the_oracle_s(which):
    """X_1's block goes through the second conv1d's map (its adjoint and norm bound), W_0's and
    W_1's through the patches of the two conv1d layers."""
    net, X0, Y, Xs = state(seed=4)
    l = int(which[2])
    if which[0] == "X":
        block, start = x_block(net, X0, Y, Xs, l), Xs[l - 1]
    else:
        block, start = w_block(net, X0, Y, Xs, l, gamma=0.2, W0=net.W[l] + 0.05), net.W[l]
    ref = OracleBackend().solve(block, start=start)
    got = FastBackend(tol=1e-9, max_iter=20000).solve(block, start=start)
    assert ref.status == "optimal" and got.converged, (ref, got)
    assert got.value == pytest.approx(ref.value, rel=1e-6, abs=1e-9)


def test_fista_steps_by_its_certified_norm_bound():
    """The X_1 block's Lipschitz constant comes from ``Conv1d.norm2_bound``: no backtracking,
    and at least lam_1 sup relu' ||A||_2^2 of the explicit matrix."""
    net, X0, Y, Xs = state(seed=4)
    block = x_block(net, X0, Y, Xs, 1)
    res = FastBackend(tol=1e-9, max_iter=20000).solve(block, start=Xs[0])
    exact = np.linalg.norm(block.map.matrix(block.W)[0], 2) ** 2
    assert res.converged and res.info["backtracks"] == 0
    assert res.info["lipschitz"] >= net.lam[1] * exact


# --- planted faults -----------------------------------------------------------------------------
class FlippedAdjoint(Conv1d):
    """``adjoint_x`` with each filter's taps reversed; ``forward`` is right."""

    def adjoint_x(self, xp, W, G, shape):
        C, k = shape[0], self.kernel
        taps = np.reshape(np.arange(C * k), (C, k))[:, ::-1].ravel()
        flipped = xp.concat([W[:, :-1][:, taps], W[:, -1:]], axis=1)
        return super().adjoint_x(xp, flipped, G, shape)


class BiasRowFirst(Conv1d):
    """``patches`` with the row of ones first, where ``W``'s bias is last."""

    def patches(self, xp, X, shape):
        P = super().patches(xp, X, shape)
        return xp.concat([P[-1:, :], P[:-1, :]], axis=0)


class PointsFirst(Conv1d):
    """``patches`` with the columns (data point, position): a point's columns are not its own
    along the last axis (the threads that form the data's patches would mix the points)."""

    def patches(self, xp, X, shape):
        P, m = super().patches(xp, X, shape), X.shape[1]
        n = P.shape[1] // m
        return xp.reshape(xp.permute_dims(xp.reshape(P, (P.shape[0], n, m)), (0, 2, 1)), P.shape)


class SmallBound(Conv1d):
    """``norm2_bound`` below the norm (``||K||_2^2 / 2``: the factor ``kernel`` forgotten and
    more)."""

    def norm2_bound(self, W, shape, max_dim):
        return super().norm2_bound(W, shape, max_dim) / (2 * self.kernel)


@pytest.mark.parametrize(
    "faulty, method",
    [
        (FlippedAdjoint, "adjoint_x"),
        (BiasRowFirst, "patches"),
        (SmallBound, "norm2_bound"),
    ],
)
def test_a_planted_fault_is_named_by_the_layer_check(faulty, method):
    net = network(second=faulty)
    faults = layer_faults(net.layers[1], net.W[1], np.random.default_rng(5))
    assert len(faults) == 1 and faults[0].startswith(method + ":"), faults


def test_patches_that_mix_the_points_are_named_by_the_layer_check():
    net = network(second=PointsFirst)
    faults = layer_faults(net.layers[1], net.W[1], np.random.default_rng(5))
    assert "patches: a point's patches are not its own columns, the last axis" in faults, faults


def test_a_wrong_adjoint_escapes_the_block_residual_not_the_oracle_nor_the_certificate():
    net, X0, Y, Xs = state(seed=4, second=FlippedAdjoint)
    block = x_block(net, X0, Y, Xs, 1)
    got = FastBackend(tol=1e-9, max_iter=20000).solve(block, start=Xs[0])
    # the residual goes through the same wrong adjoint: the fast solve "converged" by it
    assert got.converged and block.kkt_residual(got.argmin) <= 1e-8
    # the oracle writes the block from forward (its explicit matrix): its optimum is lower, and
    # fails the residual of the wrong adjoint, so the strict oracle refuses it
    loose = OracleBackend(strict=False).solve(block, start=Xs[0])
    assert loose.value < got.value - 1e-3 * (1 + abs(got.value))
    with pytest.raises(SolverInaccurate, match="KKT residual"):
        OracleBackend().solve(block, start=Xs[0])
    # the certificate's objective checks (from forward alone) stop the strict fast run
    net, X0, Y, _ = state(seed=2, m=8, second=FlippedAdjoint)
    with pytest.raises(CertificateError, match="descent"):
        fit_bcd(net, X0, Y, iterations=3, backend="fast", strict=True, gamma=0.5)
