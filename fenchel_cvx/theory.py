"""Executable, small-scale checks of the paper's theory. Each function returns its numbers.

- :func:`one_layer_recovery` (Appendix B): data ``Y = phi(W* X~)`` from a one-layer network;
  the convex problem ``min_W sum B_phi(Y, W X~)`` recovers W*, while the non-convex least squares
  ``min_W ||Y - phi(W X~)||^2`` from random starts may not.
- :func:`variable_scaling` (Appendix A): with (leaky) ReLU, per-layer ``lam_l`` reduce to a
  single ``lam`` by rescaling the variables; checked at random points.
- :func:`weak_duality` (Sec. 4.2, eq. (8)): along a BCD run, the lifted objective after each
  X-sweep lies below the network objective at the same weights, and ``min F <= min J``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
from scipy import optimize

from .activations import activation as _activation
from .backends import get_backend
from .blocks import WHidden
from .network import LiftedNetwork, augment


# --- Appendix B: one-layer global recovery ---------------------------------------------------
@dataclass
class RecoveryResult:
    """Numbers of :func:`one_layer_recovery` (relative Frobenius errors ``||W - W*|| / ||W*||``)."""

    activation: str
    n: int
    p: int
    m: int
    bias: bool
    convex_error: float  # the convex problem, solved by the backend's W-block
    convex_status: str
    convex_seconds: float
    nonconvex_errors: list = field(default_factory=list)  # one per random start
    nonconvex_failures: int = 0  # starts whose error exceeds fail_tol
    fail_tol: float = 1e-3
    tol: float = 1e-5
    active_points: list = field(default_factory=list)  # per unit of W*: points with (W* X~)_ij > 0

    @property
    def recovered(self) -> bool:
        return self.convex_error <= self.tol

    def to_dict(self) -> dict[str, Any]:
        return dict(asdict(self), recovered=self.recovered)


def _nonconvex_ls(act, Xt, Y, W_init):
    """L-BFGS on ||Y - phi(W X~)||^2 (a gradient method: dead ReLU units get no gradient)."""
    shape = W_init.shape

    def value_and_grad(w):
        W = w.reshape(shape)
        U = W @ Xt
        R = act.phi(U) - Y
        return float(np.sum(R * R)), ((2 * R * act.dphi(U)) @ Xt.T).ravel()

    r = optimize.minimize(
        value_and_grad,
        W_init.ravel(),
        jac=True,
        method="L-BFGS-B",
        options=dict(maxiter=5000, ftol=1e-16, gtol=1e-12),
    )
    return r.x.reshape(shape)


def one_layer_recovery(
    activation: str = "relu",
    n: int = 4,
    p: int = 3,
    m: int = 40,
    bias: bool = True,
    restarts: int = 10,
    seed: int = 0,
    backend: str | object = "cvxpy",
    tol: float = 1e-5,
    fail_tol: float = 1e-3,
) -> RecoveryResult:
    """Appendix B: recover the weights of a one-layer network from ``Y = phi(W* X~)``.

    Data: ``m`` standard-normal points ``X`` in ``R^n`` (generic, ``m >> n``); with ``bias=True``
    the network acts on ``X~ = [X; 1^T]`` and W* (``p x (n + 1)``, entries N(0, 1/n)) has a bias
    column, as every layer of this package does. The convex problem

        min_W  sum_ij B_phi(Y_ij, (W X~)_ij)          (the W-hidden block with lam=1, rho=gamma=0)

    is solved by ``backend`` (the CVXPY oracle by default); its minimisers are exactly the W with
    ``phi(W X~) = Y`` (Theorem 1), which for generic data is W* alone (for ReLU: each unit is
    active on at least n + 1 generic points; ``active_points`` counts them). Beside it,
    ``restarts`` runs of L-BFGS on the
    non-convex least squares from random N(0, 1/n) starts; a start *fails* if its relative error
    exceeds ``fail_tol``. With ReLU such failures happen (units that start, or become, dead on
    the data receive no gradient); with strictly monotone phi they are rarer.
    """
    act = _activation(activation)
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, m))
    Xt = augment(X) if bias else X
    W_star = rng.standard_normal((p, Xt.shape[0])) / math.sqrt(n)
    Y = act.phi(W_star @ Xt)
    block = WHidden(layer=0, Xt=Xt, rho=0.0, gamma=0.0, W0=None, act=act, V=Y, lam=1.0)
    t0 = time.perf_counter()
    res = get_backend(backend).solve(block, start=np.zeros_like(W_star))
    secs = time.perf_counter() - t0
    err = float(np.linalg.norm(res.argmin - W_star) / np.linalg.norm(W_star))
    errs = []
    for _ in range(restarts):
        W = _nonconvex_ls(act, Xt, Y, rng.standard_normal(W_star.shape) / math.sqrt(n))
        errs.append(float(np.linalg.norm(W - W_star) / np.linalg.norm(W_star)))
    return RecoveryResult(
        act.name,
        n,
        p,
        m,
        bias,
        err,
        res.status,
        secs,
        errs,
        sum(e > fail_tol for e in errs),
        fail_tol,
        tol,
        [int(k) for k in np.sum(W_star @ Xt > 0, axis=1)],
    )


# --- Appendix A: variable scaling -------------------------------------------------------------
def scale_variables(
    W: Sequence[np.ndarray], Xs: Sequence[np.ndarray], lam: Sequence[float], lam_bar: float = 1.0
) -> tuple[list[np.ndarray], list[np.ndarray], list[float]]:
    """The change of variables of Appendix A; returns ``(W_bar, Xs_bar, c)``.

    With ``c_0 = 1``, ``c_{l+1} = sqrt(lam_l / lam_bar)`` (l < L) and ``c_{L+1} = 1``:

        X_bar_l = c_l X_l                                  (l = 1..L; the data X_0 is not scaled)
        W_bar_l = [ (c_{l+1} / c_l) A_l ,  c_{l+1} b_l ]   (W_l = [A_l, b_l], b_l the bias column)

    The bias column scales by ``c_{l+1}`` only, because the row of ones of ``X~_l`` is not
    scaled. Then ``W_bar_l X~_bar_l = c_{l+1} W_l X~_l`` and, B being positively 2-homogeneous for
    (leaky) ReLU, ``lam_bar B(X_bar_{l+1}, W_bar_l X~_bar_l) = lam_l B(X_{l+1}, W_l X~_l)``; the
    output ``W_bar_L X~_bar_L = W_L X~_L`` is unchanged. With ``lam_bar = 1`` this is
    ``X_bar_l = sqrt(lam_{l-1}) X_l``, ``A_bar_l = sqrt(lam_l / lam_{l-1}) A_l``
    (lam_{-1} = lam_L = 1).
    """
    L = len(Xs)
    c = [1.0] + [math.sqrt(lam[l] / lam_bar) for l in range(L)] + [1.0]
    W_bar = []
    for l, Wl in enumerate(W):
        Wb = np.array(Wl, dtype=float, copy=True)
        Wb[:, :-1] *= c[l + 1] / c[l]
        Wb[:, -1] *= c[l + 1]
        W_bar.append(Wb)
    return W_bar, [c[l + 1] * np.asarray(Xl) for l, Xl in enumerate(Xs)], c


def scaled_penalty_weights(
    rho: Sequence[float], c: Sequence[float]
) -> tuple[list[float], list[float]]:
    """The penalty of the scaled problem:
    ``rho_l ||W_l||^2 = rA_l ||A_bar_l||^2 + rb_l ||b_bar_l||^2``.

    ``rA_l = rho_l (c_l / c_{l+1})^2`` and ``rb_l = rho_l / c_{l+1}^2``: a Frobenius penalty on the
    whole ``W_l`` (bias included) becomes a weighted one, the bias weighted apart, unless every
    ``lam_l = lam_bar``. Returns ``(rA, rb)``.
    """
    rA = [r * (c[l] / c[l + 1]) ** 2 for l, r in enumerate(rho)]
    rb = [r / c[l + 1] ** 2 for l, r in enumerate(rho)]
    return rA, rb


def variable_scaling(
    layer_sizes: Sequence[int] = (5, 4, 3, 2),
    lam: float | Sequence[float] = (0.3, 2.5),
    rho: float | Sequence[float] = (0.7, 0.2, 1.3),
    activation: str = "relu",
    loss: str = "mse",
    m: int = 7,
    n_points: int = 5,
    lam_bar: float = 1.0,
    seed: int = 0,
) -> dict[str, Any]:
    """Appendix A, checked numerically: F with per-layer lam equals F_bar with a single lam_bar.

    At the feed-forward point and at ``n_points`` random points (random W, random X in the
    activation's range, random Y), computes

        F   = F(W, X; lam_l, rho_l)                                   (``LiftedNetwork``)
        F_b = F(W_bar, X_bar; lam_bar, rho = 0) + sum_l rA_l ||A_bar_l||^2 + rb_l ||b_bar_l||^2

    (``scale_variables``, ``scaled_penalty_weights``) and ``J(W)`` against ``J_bar(W_bar)``.
    Returns a dict with both lists, the largest relative difference and the scaling factors.
    """
    rng = np.random.default_rng(seed)
    net = LiftedNetwork(layer_sizes, activation, loss, lam=lam, rho=rho, seed=seed)
    L = net.n_hidden
    bar = LiftedNetwork(layer_sizes, activation, loss, lam=lam_bar, rho=0.0, seed=seed)
    F, F_bar, J, J_bar = [], [], [], []
    for k in range(n_points + 1):
        X0 = rng.standard_normal((layer_sizes[0], m))
        Y = net.loss.targets_from(rng.standard_normal((layer_sizes[-1], m)), 0.0)
        if k == 0:
            Xs = net.forward(X0)[0]
        else:
            net.W = [rng.standard_normal(Wl.shape) for Wl in net.W]
            Xs = [np.abs(rng.standard_normal((p, m))) for p in layer_sizes[1:-1]]
        W_bar, Xs_bar, c = scale_variables(net.W, Xs, net.lam, lam_bar)
        rA, rb = scaled_penalty_weights(net.rho, c)
        bar.W = W_bar
        pen = sum(
            a * np.sum(Wb[:, :-1] ** 2) + b * np.sum(Wb[:, -1] ** 2)
            for a, b, Wb in zip(rA, rb, W_bar)
        )
        F.append(net.lifted_objective(X0, Y, Xs))
        F_bar.append(bar.lifted_objective(X0, Y, Xs_bar) + float(pen))
        J.append(net.network_objective(X0, Y))
        J_bar.append(bar.network_objective(X0, Y) + float(pen))
    rel = lambda a, b: abs(a - b) / (1.0 + abs(a))  # noqa: E731
    max_rel = max(
        max(rel(a, b) for a, b in zip(F, F_bar)), max(rel(a, b) for a, b in zip(J, J_bar))
    )
    rA, rb = scaled_penalty_weights(net.rho, c)
    return dict(
        F=F,
        F_bar=F_bar,
        J=J,
        J_bar=J_bar,
        max_rel_diff=max_rel,
        c=c[1 : L + 1],
        rho_bar_weights=rA,
        rho_bar_bias=rb,
        lam=net.lam,
        lam_bar=lam_bar,
        activation=net.activations[0].name,
    )


# --- weak duality along a run ----------------------------------------------------------------
def weak_duality(
    layer_sizes: Sequence[int] = (4, 6, 5, 3),
    m: int = 30,
    iterations: int = 4,
    activation: str = "relu",
    loss: str = "mse",
    lam: float | Sequence[float] = 1.0,
    rho: float | Sequence[float] = 0.1,
    backend: str | object = "cvxpy",
    seed: int = 0,
    tol: float = 1e-6,
) -> dict[str, Any]:
    """Run ``fit_bcd`` (Algorithm 1, non-strict) on a tiny teacher-student problem and check

    - at every iteration, ``F(W, X)`` after the X-sweep ``<= J(W) + tol (|J| + 1)`` at the same W;
    - ``min F <= min J`` over the run (both taken at the weights of the X-sweeps).

    Data: standard-normal X, targets from a random teacher network of the same shape (plus
    noise) for MSE, its argmax one-hot for cross-entropy (the loss's ``targets_from``). Returns
    a dict of the series and flags.
    """
    from .bcd import fit_bcd

    rng = np.random.default_rng(seed)
    X0 = rng.standard_normal((layer_sizes[0], m))
    teacher = LiftedNetwork(layer_sizes, activation, loss, seed=seed + 1)
    out = teacher.forward(X0)[1]
    Y = teacher.loss.targets_from(out, 0.1 * rng.standard_normal(out.shape))
    net = LiftedNetwork(layer_sizes, activation, loss, lam=lam, rho=rho, seed=seed)
    res = fit_bcd(net, X0, Y, iterations=iterations, backend=backend, strict=False, tol=tol)
    h = res.history
    F, J = h.series("lifted_x"), h.series("network_x")
    slack = tol * (np.abs(J) + 1.0)
    return dict(
        lifted=F.tolist(),
        network=J.tolist(),
        gap=(J - F).tolist(),
        holds_every_iteration=bool(np.all(F <= J + slack)),
        min_lifted=float(F.min()),
        min_network=float(J.min()),
        min_holds=bool(F.min() <= J.min() + slack.max()),
        certificate_held=h.certificate_held,
        restarts=int(np.sum(h.series("restarted"))),
    )
