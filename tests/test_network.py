"""Tests of fenchel_cvx.network: weights, forward pass, J(W), F(W, X) and input validation."""

import copy
import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from scipy.special import expit, huber, log_softmax

from conftest import ACTIVATION_NAMES, LOSS_NAMES, make_problem
from fenchel_cvx.activations import ACTIVATIONS, LeakyReLU, ReLU, Sigmoid, Tanh
from fenchel_cvx.extensions.elu import ELU
from fenchel_cvx.extensions.huber import Huber
from fenchel_cvx.losses import LOSSES, MSE, CrossEntropy
from fenchel_cvx.network import LiftedNetwork, augment
from fenchel_cvx.validation import check_matrix

SIZES = (3, 4, 5, 2)


# --- the hand-written references -------------------------------------------------------------
#: phi of each registered activation class, written out here (NumPy / SciPy, none of the
#: class's own functions; its parameters read from the instance): ``HAND_PHI[cls](act)`` is the
#: elementwise function. Keyed by class, so a class registered with ``@register_activation``
#: needs its own formula here: ``test_every_registered_class_has_a_hand_formula`` names it
#: until it has one.
HAND_PHI = {
    ReLU: lambda act: lambda t: np.maximum(t, 0),
    LeakyReLU: lambda act: lambda t: np.where(t > 0, t, act.slope * t),
    Sigmoid: lambda act: expit,
    Tanh: lambda act: np.tanh,
    ELU: lambda act: lambda t: np.where(t > 0, t, np.exp(np.minimum(t, 0)) - 1),
}

#: each registered loss class's L(Y, Yhat), written out here the same way (Huber through
#: SciPy's ``huber(delta, r) = r^2/2 or delta (|r| - delta/2)``, twice it: the loss's
#: convention, squared error near 0 with no 1/2)
HAND_LOSS = {
    MSE: lambda L, Y, Yhat: np.sum((Y - Yhat) ** 2),
    CrossEntropy: lambda L, Y, Yhat: -np.sum(Y * log_softmax(Yhat, axis=0)),
    Huber: lambda L, Y, Yhat: 2 * np.sum(huber(L.delta, Yhat - Y)),
}


def hand_formula(table, obj, table_name):
    """The hand-written formula of ``obj``'s class in ``table``; the test fails, naming the
    class, where the class has none (a registered class is never silently left unchecked)."""
    cls = type(obj)
    if cls not in table:
        pytest.fail(
            f"{cls.__name__} (registered as {obj.name!r}) has no hand-written formula in "
            f"{table_name} of tests/test_network.py: add one, written out independently of "
            f"the class's own functions"
        )
    return table[cls]


def hand_forward(W, X0, acts):
    """The feed-forward pass written out: bias = last column, phi from ``HAND_PHI``."""
    X, Xs = X0, []
    for l, Wl in enumerate(W):
        U = Wl[:, :-1] @ X + Wl[:, -1:]
        if l == len(W) - 1:
            return Xs, U
        X = hand_formula(HAND_PHI, acts[l], "HAND_PHI")(acts[l])(U)
        Xs.append(X)


def hand_loss(L, Y, Yhat):
    """The loss ``L`` (an instance: its parameters are read from it) from ``HAND_LOSS``."""
    return hand_formula(HAND_LOSS, L, "HAND_LOSS")(L, Y, Yhat)


def test_every_registered_class_has_a_hand_formula():
    """Each activation and loss the tests below take from the registries (conftest's
    ``ACTIVATION_NAMES``, ``LOSS_NAMES``) has its hand-written formula: a class registered
    without one fails here, by name, rather than going unchecked."""
    missing = [
        f"activation {n!r} ({ACTIVATIONS[n].__name__}): add it to HAND_PHI"
        for n in ACTIVATION_NAMES
        if ACTIVATIONS[n] not in HAND_PHI
    ] + [
        f"loss {n!r} ({LOSSES[n].__name__}): add it to HAND_LOSS"
        for n in LOSS_NAMES
        if LOSSES[n] not in HAND_LOSS
    ]
    assert not missing, (
        "registered classes without a hand-written formula in tests/test_network.py: "
        + "; ".join(missing)
    )
    assert {"relu", "leaky_relu", "sigmoid", "tanh"} <= set(ACTIVATION_NAMES)
    assert {"mse", "cross_entropy"} <= set(LOSS_NAMES)


# --- weights --------------------------------------------------------------------------------
def test_weight_shapes_bias_column_and_layers():
    net = LiftedNetwork((4, 6, 3, 2))
    assert net.n_hidden == 2 and net.layer_sizes == (4, 6, 3, 2)
    assert [W.shape for W in net.W] == [(6, 5), (3, 7), (2, 4)]
    assert all(W.dtype == np.float64 for W in net.W)
    assert LiftedNetwork((3, 2)).n_hidden == 0


def test_xavier_uniform_bound_and_zero_bias():
    net = LiftedNetwork((60, 40, 30, 10), seed=3)
    for W, (p_in, p_out) in zip(net.W, [(60, 40), (40, 30), (30, 10)]):
        a = math.sqrt(6.0 / (p_in + p_out))
        body = W[:, :-1]
        assert np.all(np.abs(body) <= a)
        assert np.max(np.abs(body)) > 0.95 * a  # fills the interval ...
        assert abs(np.mean(body)) < 0.1 * a  # ... symmetrically
        assert np.std(body) == pytest.approx(a / math.sqrt(3), rel=0.1)  # uniform's std
        np.testing.assert_array_equal(W[:, -1], 0.0)


def test_seed_reproducible_and_dtype():
    a, b, c = (LiftedNetwork(SIZES, seed=s) for s in (7, 7, 8))
    for Wa, Wb, Wc in zip(a.W, b.W, c.W):
        np.testing.assert_array_equal(Wa, Wb)
        assert not np.array_equal(Wa, Wc)
    n32 = LiftedNetwork(SIZES, seed=7, dtype=np.float32)
    for W32, W64 in zip(n32.W, a.W):
        assert W32.dtype == np.float32
        np.testing.assert_allclose(W32, W64, rtol=1e-6)
    X0 = np.ones((3, 2), dtype=np.float32)
    Xs, Yhat = n32.forward(X0)
    assert Yhat.dtype == np.float32 and all(X.dtype == np.float32 for X in Xs)


def test_augment_appends_row_of_ones():
    X = np.arange(6.0).reshape(2, 3)
    np.testing.assert_array_equal(augment(X), np.vstack([X, np.ones((1, 3))]))


# --- forward pass ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    "act", [*ACTIVATION_NAMES, ("tanh", "relu"), (LeakyReLU(0.3), "sigmoid")], ids=str
)
def test_forward_matches_hand_written_loop(act):
    net, X0, _, _ = make_problem(SIZES, act=act, m=7, seed=1)
    Xs, Yhat = net.forward(X0)
    Xs_ref, Yhat_ref = hand_forward(net.W, X0, net.activations)
    assert len(Xs) == net.n_hidden
    for X, Xr in zip(Xs, Xs_ref):
        np.testing.assert_allclose(X, Xr, rtol=1e-14, atol=1e-15)
    np.testing.assert_allclose(Yhat, Yhat_ref, rtol=1e-13, atol=1e-14)
    np.testing.assert_array_equal(net.predict(X0), Yhat)
    for l, X in enumerate([X0, *Xs]):
        np.testing.assert_allclose(
            net.pre_activation(l, X), net.W[l][:, :-1] @ X + net.W[l][:, -1:], rtol=1e-14
        )


def test_feed_forward_keeps_the_pre_activations_the_x_blocks_use():
    """``feed_forward``'s U_{l-1} is, bit for bit, the U_prev an X-block computes itself."""
    from fenchel_cvx.blocks import x_block

    net, X0, Y, _ = make_problem(SIZES, act="tanh", m=7, seed=2)
    Xs, Us = net.feed_forward(X0)
    assert len(Us) == net.n_hidden + 1
    np.testing.assert_array_equal(Us[-1], net.forward(X0)[1])
    for l in range(1, net.n_hidden + 1):
        np.testing.assert_array_equal(Us[l - 1], net.pre_activation(l - 1, [X0, *Xs][l - 1]))
        np.testing.assert_array_equal(
            x_block(net, X0, Y, Xs, l).U_prev, x_block(net, X0, Y, Xs, l, U_prev=Us[l - 1]).U_prev
        )


def test_feed_forward_from_the_datas_patches():
    """``feed_forward(X0, Xt0)`` forms U_0 from the patches the W_0 block uses (the BCD driver
    shares them), the same pass to rounding for a dense and a convolutional first layer."""
    from fenchel_cvx import lenet5

    rng = np.random.default_rng(0)
    dense, X0, _, _ = make_problem(SIZES, act="relu", m=7, seed=2)
    conv = lenet5((1, 28, 28), n_classes=3, seed=0)
    for net, X in ((dense, X0), (conv, rng.random((784, 3)))):
        Xt0 = net.layers[0].patches(X)
        Xs, Us = net.feed_forward(X)
        Xs_p, Us_p = net.feed_forward(X, Xt0)
        for a, b in zip([*Xs, *Us], [*Xs_p, *Us_p]):
            np.testing.assert_allclose(b, a, rtol=1e-12, atol=1e-12)
        assert not np.allclose(net.feed_forward(X, 2 * Xt0)[1][0], Us[0])  # they are used


def test_no_hidden_layer_is_a_linear_model():
    net, X0, Y, Xs = make_problem((3, 2), m=4)
    assert Xs == [] and net.forward(X0)[0] == []
    np.testing.assert_allclose(net.predict(X0), net.W[0][:, :-1] @ X0 + net.W[0][:, -1:])
    assert net.lifted_objective(X0, Y, []) == pytest.approx(net.network_objective(X0, Y))


# --- objectives -----------------------------------------------------------------------------
@pytest.mark.parametrize("loss", LOSS_NAMES)
@pytest.mark.parametrize("act", [*ACTIVATION_NAMES, ("sigmoid", "leaky_relu")], ids=str)
def test_lifted_equals_network_objective_at_feed_forward_point(act, loss):
    """At X = X^ff every B_l = 0, so F(W, X^ff) = J(W) (the paper's relaxation is tight there)."""
    for sizes, lam, rho in [
        (SIZES, 0.7, 0.05),
        ((3, 6, 6, 6, 4), [2.0, 0.5, 1.0], [0, 0.1, 0.2, 0.3]),
        ((2, 3, 2), 1e3, 0.0),
    ]:
        acts = act if isinstance(act, str) else (list(act) * 3)[: len(sizes) - 2]
        net, X0, Y, Xs = make_problem(
            sizes, act=acts, loss=loss, lam=lam, rho=rho, m=6, seed=2, lifted="ff"
        )
        J = net.network_objective(X0, Y)
        F = net.lifted_objective(X0, Y, Xs)
        assert F == pytest.approx(J, rel=1e-10, abs=1e-10)
        assert np.all(np.abs(net.divergences(X0, Xs)) < 1e-9)
        # and J is what its formula says
        Yhat = hand_forward(net.W, X0, net.activations)[1]
        expected = hand_loss(net.loss, Y, Yhat) + sum(
            r * np.sum(W**2) for r, W in zip(net.rho, net.W)
        )
        assert J == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("loss", LOSS_NAMES)
@pytest.mark.parametrize("act", ACTIVATION_NAMES)
@given(seed=st.integers(0, 10_000))
def test_lifted_objective_formula_and_lower_bound_off_ff_point(act, loss, seed):
    """F = L(Y, W_L X~_L) + penalty + sum_l lam_l B_l, with every B_l > 0 off the graph."""
    lam, rho = [0.3, 2.0], [0.1, 0.0, 0.5]
    net, X0, Y, Xs = make_problem(SIZES, act=act, loss=loss, lam=lam, rho=rho, m=4, seed=seed)
    F = net.lifted_objective(X0, Y, Xs)
    out = net.W[-1][:, :-1] @ Xs[-1] + net.W[-1][:, -1:]
    base = hand_loss(net.loss, Y, out) + sum(r * np.sum(W**2) for r, W in zip(rho, net.W))
    X = [X0, *Xs]
    Bs = [
        np.sum(a.divergence(X[l + 1], net.W[l] @ augment(X[l])))
        for l, a in enumerate(net.activations)
    ]
    assert all(B > 0 for B in Bs)
    np.testing.assert_allclose(net.divergences(X0, Xs), Bs, rtol=1e-12)
    assert F == pytest.approx(base + sum(lm * B for lm, B in zip(lam, Bs)), rel=1e-12)
    assert F > base


def test_lifted_objective_infinite_off_range():
    net, X0, Y, Xs = make_problem(SIZES, act="relu")
    Xs[0][0, 0] = -1.0
    assert net.lifted_objective(X0, Y, Xs) == math.inf
    assert net.divergences(X0, Xs)[0] == math.inf


def test_penalty_per_layer_rho():
    net = LiftedNetwork(SIZES, rho=[0.0, 1.0, 2.5])
    assert net.rho == [0.0, 1.0, 2.5]
    assert net.penalty() == pytest.approx(np.sum(net.W[1] ** 2) + 2.5 * np.sum(net.W[2] ** 2))
    assert LiftedNetwork(SIZES, rho=0.0).penalty() == 0.0


def test_per_layer_lam_and_activation_lists_are_stored():
    net = LiftedNetwork(SIZES, activation=["tanh", LeakyReLU(0.2)], lam=(1.0, 3.0), rho=0.2)
    assert net.lam == [1.0, 3.0] and net.rho == [0.2, 0.2, 0.2]
    assert [a.name for a in net.activations] == ["tanh", "leaky_relu"]
    assert net.activations[1].slope == 0.2
    assert "3-4-5-2" in repr(net) and "leaky_relu" in repr(net)


def test_objectives_do_not_modify_inputs():
    net, X0, Y, Xs = make_problem(SIZES, act="sigmoid", loss="cross_entropy")
    copies = copy.deepcopy((net.W, X0, Y, Xs))
    net.network_objective(X0, Y)
    net.lifted_objective(X0, Y, Xs)
    for a, b in zip(copies, (net.W, X0, Y, Xs)):
        for A, B in zip(a if isinstance(a, list) else [a], b if isinstance(b, list) else [b]):
            np.testing.assert_array_equal(A, B)


def test_list_input_accepted():
    net = LiftedNetwork((2, 3, 1), seed=0)
    X0 = [[0.0, 1.0], [2.0, -1.0]]
    np.testing.assert_allclose(net.predict(X0), net.predict(np.array(X0)))
    assert check_matrix("X0", X0).dtype == np.float64


# --- bad input ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "kwargs,match",
    [
        (
            dict(layer_sizes=(3,)),
            r"layer_sizes must be a sequence of at least 2 positive integers, got \(3,\)",
        ),
        (dict(layer_sizes=()), r"layer_sizes must be .* got \(\)"),
        (dict(layer_sizes=(3, 0, 2)), r"layer_sizes must be .* got \(3, 0, 2\)"),
        (dict(layer_sizes=(3, -4, 2)), r"layer_sizes must be .* got \(3, -4, 2\)"),
        (dict(layer_sizes=(3, 2.5, 2)), r"layer_sizes must be .* got \(3, 2.5, 2\)"),
        (dict(activation="swish"), r"activation must be one of .* got 'swish'"),
        (dict(activation=["relu"]), r"activation must be one or a sequence of 2, got \['relu'\]"),
        (dict(activation=["relu", "tanh", "relu"]), r"activation must be one or a sequence of 2"),
        (dict(loss="hinge"), r"loss must be one of .* got 'hinge'"),
        (dict(lam=0), r"lam must be > 0 and finite, got 0"),
        (dict(lam=[1.0, 0.0]), r"lam must be > 0 and finite, got 0.0"),
        (dict(lam=-1), r"lam must be .* got -1"),
        (dict(lam=float("nan")), r"lam must be .* got nan"),
        (dict(lam=math.inf), r"lam must be .* got inf"),
        (
            dict(lam=[1.0, 2.0, 3.0]),
            r"lam must be a number or a sequence of 2 numbers, got \[1.0, 2.0, 3.0\]",
        ),
        (dict(rho=-0.5), r"rho must be >= 0 and finite, got -0.5"),
        (
            dict(rho=[0.1, 0.1]),
            r"rho must be a number or a sequence of 3 numbers, got \[0.1, 0.1\]",
        ),
        (dict(rho=[0.1, -2, 0.1]), r"rho must be >= 0 and finite, got -2"),
    ],
)
def test_constructor_rejects_bad_arguments(kwargs, match):
    args = dict(layer_sizes=SIZES)
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        LiftedNetwork(args.pop("layer_sizes"), **args)


def test_data_errors_name_the_parameter_and_value():
    net, X0, Y, Xs = make_problem(SIZES, m=5)
    cases = [
        (
            lambda: net.network_objective(X0[:2], Y),
            r"X0 must have 3 rows \(the network's input size\), got shape \(2, 5\)",
        ),
        (
            lambda: net.network_objective(X0, Y[:, :4]),
            r"Y must have 5 columns \(data points\), got shape \(2, 4\)",
        ),
        (
            lambda: net.network_objective(X0, Y[:1]),
            r"Y must have 2 rows \(the network's output size\), got shape \(1, 5\)",
        ),
        (lambda: net.network_objective(X0[0], Y), r"X0 must be a 2-D array .* got shape \(5,\)"),
        (
            lambda: net.predict(X0[:, :0]),
            r"X0 must hold at least one data point, got shape \(3, 0\)",
        ),
        (lambda: net.lifted_objective(X0, Y, Xs[:1]), r"Xs must hold 2 matrices X_1..X_L, got 1"),
        (lambda: net.lifted_objective(X0, Y, [*Xs, Xs[0]]), r"Xs must hold 2 matrices .* got 3"),
        (
            lambda: net.lifted_objective(X0, Y, [Xs[0][:3], Xs[1]]),
            r"Xs\[0\] \(X_1\) must have 4 rows \(the size of layer 1\), got shape \(3, 5\)",
        ),
        (
            lambda: net.lifted_objective(X0, Y, [Xs[0], Xs[1][:, :2]]),
            r"Xs\[1\] \(X_2\) must have 5 columns \(data points\), got shape \(5, 2\)",
        ),
    ]
    for call, match in cases:
        with pytest.raises(ValueError, match=match):
            call()


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("where", ["X0", "Y", "Xs"])
def test_non_finite_data_rejected(bad, where):
    net, X0, Y, Xs = make_problem(SIZES, m=5)
    target = {"X0": X0, "Y": Y, "Xs": Xs[1]}[where]
    target[0, 1] = bad
    name = {"X0": "X0", "Y": "Y", "Xs": r"Xs\[1\] \(X_2\)"}[where]
    with pytest.raises(ValueError, match=rf"{name} must be finite, got NaN or inf"):
        net.lifted_objective(X0, Y, Xs)
    if where != "Xs":
        with pytest.raises(ValueError, match=rf"{name} must be finite"):
            net.network_objective(X0, Y)
