"""How FLN trains a deep network (``mnist_deep.py``, ``deep_screen.py``): the paper's future
work, its Sec. 6.

A ``Plan`` is FLN's per-layer setting of a depth with its rounds per batch, the initialisation
of the hidden layers' weights (``initialise``), a layer-wise lam schedule, and the X-blocks'
starts (``CarriedX``) and order. ``dense_plan`` is the package's dense setting for a depth
(``defaults.Dense.for_layers``); ``network`` the lifted network the plan trains, whose weights
the baselines start from.
"""

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

import common  # noqa: F401  (puts the repository on the path)
from fenchel_cvx import defaults

#: the initialisations of FLN's hidden-layer weights (``initialise``)
INITS = ("xavier", "he", "orthogonal")


def sizes(args, n_in):
    """The layer sizes of the network of ``args.depth`` hidden layers."""
    return [n_in] + [args.width] * args.depth + [10]


@dataclass(frozen=True)
class Plan:
    """How FLN trains a network of some depth: the per-layer ``setting`` (``defaults.Setting``),
    ``alternations`` (rounds per batch, K), the weights' ``init`` (``INITS``: the network's
    Xavier-uniform, or He / orthogonal scaling of the hidden layers' weights for ReLU) and
    ``lam_schedule``: None, or ``lam_schedule(epoch, lam)`` -> the per-hidden-layer lam of the
    epoch after ``epoch`` (a layer-wise schedule; the setting's lam trains the first epoch).
    ``carried_x``: the X-blocks' solvers start from each column's X of its last batch, where
    that is the better start (:class:`CarriedX`). ``x_sweep``: the X-blocks' order
    (``fit_bcd``'s: ``"backward"``, the paper's, or ``"forward"``)."""

    setting: defaults.Setting
    alternations: int = 1
    init: str = "xavier"
    lam_schedule: Callable | None = None
    carried_x: bool = False
    x_sweep: str = "backward"


def dense_plan(depth):
    """The package's dense setting for ``depth`` hidden layers (``defaults.Dense.for_layers``)."""
    return Plan(defaults.training("dense", depth, batched=True))


def network(args, n_in, setting=None):
    """The lifted network of ``args.depth`` hidden layers, its lam and rho from ``setting``
    (default: the dense setting for that depth); the baselines start from its weights (the
    same ``seed``)."""
    from fenchel_cvx import LiftedNetwork

    s = setting or defaults.training("dense", args.depth, batched=True)
    return LiftedNetwork(
        sizes(args, n_in),
        args.activation,
        "cross_entropy",
        lam=list(s.lam),
        rho=list(s.rho),
        seed=args.seed,
        dtype=np.dtype(args.dtype),
    )


def initialise(net, init, seed):
    """Redraw the hidden layers' weights of ``net`` by ``init`` (``INITS``), biases 0; the output
    layer keeps its Xavier-uniform weights. ``"xavier"``: the network's own, unchanged."""
    if init not in INITS:
        raise ValueError(f"init must be one of {INITS}, got {init!r}")
    if init == "xavier":
        return net
    rng = np.random.default_rng([seed, 1])
    for l in range(net.n_hidden):
        W = np.zeros_like(net.W[l])
        p_out, p_in = W.shape[0], W.shape[1] - 1
        if init == "he":  # Var = 2 / fan_in: the ReLU gain of He et al. (2015)
            W[:, :-1] = rng.normal(0.0, np.sqrt(2.0 / p_in), size=(p_out, p_in))
        else:  # orthogonal rows or columns (Saxe et al., 2014), gain sqrt(2) for ReLU
            Q, R = np.linalg.qr(rng.standard_normal((max(p_out, p_in), min(p_out, p_in))))
            Q = Q * np.sign(np.diag(R))
            W[:, :-1] = np.sqrt(2.0) * (Q if p_out >= p_in else Q.T)
        net.W[l] = W
    return net


class CarriedX:
    """The backend ``backend`` whose X-block solves start from the X their columns had at the
    end of their last batch (an epoch before: the batches are drawn anew each epoch, the
    columns are the examples), where that point has the lower block value; else from the start
    the driver gives (the feed-forward point). Each block stays the same convex problem and its
    solver starts no higher than the driver's start, so descent and the lower bound hold as
    before. ``batches``: the run's schedule, one round a batch (K = 1); each round begins with
    the block X_L (the X-sweep runs back to front). ``forget()`` (``fit_bcd``'s, at the start
    of a run) starts the count again. ``tried`` / ``kept``: the X-blocks with a carried
    point, and those that started from it."""

    def __init__(self, backend, batches, m):
        self.backend, self.m = backend, m
        self.order = [cols for epoch in batches for cols in epoch]
        self.store, self.round, self.tried, self.kept = {}, -1, 0, 0

    def __getattr__(self, name):
        return getattr(self.backend, name)

    def forget(self):
        self.backend.forget()
        self.store, self.round, self.tried, self.kept = {}, -1, 0, 0

    def solve(self, block, start):
        from fenchel_cvx.blocks import XBlock, XLast

        if not isinstance(block, XBlock):
            return self.backend.solve(block, start=start)
        self.round += isinstance(block, XLast)
        cols = self.order[self.round]
        if block.layer not in self.store:
            self.store[block.layer] = np.full((block.shape[0], self.m), np.nan, start.dtype)
        carried = self.store[block.layer][:, cols]
        if np.isfinite(carried).all():
            self.tried += 1
            if float(block.value(carried)) < float(block.value(start)):
                start, self.kept = carried, self.kept + 1
        res = self.backend.solve(block, start=start)
        self.store[block.layer][:, cols] = res.argmin
        return res
