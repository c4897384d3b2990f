"""Tests of fenchel_cvx.paper_hyperparameters: the first author's code's blocks are this package's
blocks.

Each block of the reference code is written here from its TensorFlow objectives (the layer
class its scripts build, ``use_neo=True``): the ReLU penalty ``sum(v^2 - 2uv + u_+^2)``, the
X-blocks' ``lbd_coef`` on the next layer's term, losses summed over the batch, the proximal
term on W and b. With the hyperparameters ``from_reference`` returns,
each must equal a positive multiple of this package's block plus a constant, at every point of
the block's domain: then both have the same minimisers, and the code's BCD is Algorithm 2 on the
package's lifted objective.
"""

import re

import numpy as np
import pytest
from scipy.special import logsumexp

from conftest import make_problem
from fenchel_cvx.blocks import w_block, x_block
from fenchel_cvx.paper_hyperparameters import from_reference

SIZES = (4, 5, 4, 3, 3)  # L = 3 hidden layers, cross-entropy on 3 classes
M = 6


def neo(V, U):
    """The code's ReLU penalty."""
    return np.sum(V**2 - 2 * U * V + np.maximum(U, 0) ** 2)


def cross_entropy(Y, Yhat):
    """Softmax cross-entropy summed over the columns (the code's blocks)."""
    return float(np.sum(logsumexp(Yhat, axis=0)) - np.sum(Y * Yhat))


def pre(W, X):
    return W @ np.vstack([X, np.ones((1, X.shape[1]))])


class Reference:
    """The code's block objectives at the iterate (W, X0, Xs), with its lam, rho, lbd_coef."""

    def __init__(self, W, X0, Y, Xs, lam, rho, c):
        self.W, self.X, self.Y = W, [X0, *Xs], Y
        self.lam, self.rho, self.c = lam, rho, c
        self.L = len(lam)

    def x_value(self, l, Z):
        X, W, lam, c = list(self.X), self.W, self.lam, self.c
        X[l] = Z
        prev = lam[l - 1] * neo(Z, pre(W[l - 1], X[l - 1]))
        if l == self.L:
            return c[l - 1] * cross_entropy(self.Y, pre(W[l], Z)) + prev
        return c[l - 1] * lam[l] * neo(X[l + 1], pre(W[l], Z)) + prev

    def w_value(self, l, W, W0):
        prox = self.rho[l] * np.sum((W - W0) ** 2)
        if l == self.L:
            return cross_entropy(self.Y, pre(W, self.X[l])) + prox
        return self.lam[l] * neo(self.X[l + 1], pre(W, self.X[l])) + prox


def assert_affine(ref, ours, points):
    """ref(Z) = s ours(Z) + k at every point, for one s > 0 and one k."""
    r = np.array([ref(Z) for Z in points])
    o = np.array([ours(Z) for Z in points])
    s = (r[1] - r[0]) / (o[1] - o[0])
    assert s > 0
    np.testing.assert_allclose(r - r[0], s * (o - o[0]), rtol=1e-9, atol=1e-9 * np.abs(r).max())


SETTINGS = [
    ([0.1, 1.0, 2.0], [1.0, 0.5, 3.0, 100.0], [1.0, 1.0, 1.0]),  # no lbd_coef
    ([1.0, 1.0, 1.0], [1e-2, 1.0, 1.0, 10.0], [1.0, 5.0, 5.0]),  # the code's LeNet kind
    ([0.3, 2.0, 0.7], [2.0, 1e-3, 0.4, 1.0], [2.5, 0.2, 10.0]),
]  # every term different


def converted(lam, rho, c, seed, scale=1.0):
    """``(gamma', net, X0, Y, Xs, reference)``: a network with the lam' of ``from_reference``
    (its hidden layers' but the last times ``scale``) and the code's blocks at its iterate."""
    lam_p, gamma = from_reference(lam, rho, c)
    lam_p = [v * scale for v in lam_p[:-1]] + [lam_p[-1]]
    net, X0, Y, Xs = make_problem(
        SIZES, act="relu", loss="cross_entropy", m=M, lam=lam_p, rho=0.0, seed=seed
    )
    return gamma, net, X0, Y, Xs, Reference(net.W, X0, Y, Xs, lam, rho, c)


@pytest.mark.parametrize("lam, rho, c", SETTINGS)
def test_x_blocks_are_the_code_x_blocks(lam, rho, c):
    _, net, X0, Y, Xs, ref = converted(lam, rho, c, seed=3)
    rng = np.random.default_rng(7)
    for l in range(1, len(lam) + 1):
        block = x_block(net, X0, Y, Xs, l)
        points = [np.abs(rng.normal(size=Xs[l - 1].shape)) for _ in range(6)]  # X_l >= 0
        assert_affine(lambda Z, l=l: ref.x_value(l, Z), block.value, points)


@pytest.mark.parametrize("lam, rho, c", SETTINGS)
def test_w_blocks_are_the_code_w_blocks(lam, rho, c):
    gamma, net, X0, Y, Xs, ref = converted(lam, rho, c, seed=4)
    rng = np.random.default_rng(8)
    for l in range(len(lam) + 1):
        W0 = net.W[l] + rng.normal(size=net.W[l].shape)
        block = w_block(net, X0, Y, Xs, l, gamma=gamma[l], W0=W0)
        points = [W0 + rng.normal(size=W0.shape) for _ in range(6)]
        assert_affine(lambda W, l=l, W0=W0: ref.w_value(l, W, W0), block.value, points)


def test_a_wrong_factor_is_caught():
    """The check has teeth: lam' off by the code's factor 2 breaks the X-blocks' identity."""
    _, net, X0, Y, Xs, ref = converted(*SETTINGS[2], seed=3, scale=0.5)
    l = net.n_hidden - 1
    block = x_block(net, X0, Y, Xs, l)
    rng = np.random.default_rng(7)
    points = [np.abs(rng.normal(size=Xs[l - 1].shape)) for _ in range(6)]
    with pytest.raises(AssertionError):
        assert_affine(lambda Z: ref.x_value(l, Z), block.value, points)


def test_a_wrong_output_gamma_is_caught():
    """... and gamma'_L taken per data point (times the batch size) breaks W_L's identity."""
    gamma, net, X0, Y, Xs, ref = converted(*SETTINGS[1], seed=4)
    L = net.n_hidden
    rng = np.random.default_rng(8)
    W0 = net.W[L] + rng.normal(size=net.W[L].shape)
    block = w_block(net, X0, Y, Xs, L, gamma=gamma[L] * M, W0=W0)
    with pytest.raises(AssertionError):
        assert_affine(
            lambda W: ref.w_value(L, W, W0),
            block.value,
            [W0 + rng.normal(size=W0.shape) for _ in range(6)],
        )


def test_the_paper_settings():
    """The appendix's batched settings: 784-300-10 and LeNet-5."""
    assert from_reference([0.1], [1, 100]) == ((0.2,), (1.0, 100.0))
    assert from_reference([5, 5, 1, 1], [1e-4, 1e-2, 1, 1, 1]) == (
        (10.0, 10.0, 2.0, 2.0),
        (1e-4, 1e-2, 1.0, 1.0, 1.0),
    )
    # the first author's scripts: 784-300-10 (lam 1, lbd_coef 10 on the output layer, rhod
    # (10, 100)) is the paper's setting; LeNet-5 (lam 1, lbd_coef (1, 5, 1, 5), rhod (1e-4,
    # 1e-2, 1, 1, 10)) is not
    assert from_reference([1], [10, 100], [10]) == ((0.2,), (1.0, 100.0))
    assert from_reference([1, 1, 1, 1], [1e-4, 1e-2, 1, 1, 10], [1, 5, 1, 5]) == (
        (0.08, 0.08, 0.4, 0.4),
        (4e-6, 4e-4, 0.2, 0.2, 10.0),
    )


@pytest.mark.parametrize(
    "kwargs, name, value",
    [
        (dict(lam=[0.1, -1.0], rho=[1, 1, 1]), "lam", "-1.0"),
        (dict(lam=[0.1], rho=[1, 1, 1]), "rho", "[1, 1, 1]"),
        (dict(lam=[0.1], rho=[1, -2]), "rho", "-2"),
        (dict(lam=[0.1], rho=[1, 2], lbd_coef=0), "lbd_coef", "0"),
    ],
)
def test_bad_input_names_the_parameter(kwargs, name, value):
    with pytest.raises(ValueError, match=rf"^{name} must .*got {re.escape(value)}$"):
        from_reference(**kwargs)
