"""Prediction with a trained lifted network: the feed-forward rule and the optimisation rule.

``predict(net, X0)`` returns a score matrix ``S`` of shape ``(p_out, m)``; for classification the
predicted class of data point j is ``argmax_k S[k, j]`` (``predict_classes``).

- ``rule="feedforward"`` (default): ``S = W_L X~_L^ff``, the network output (the usual network;
  logits for cross-entropy). For regression this is the prediction itself.
- ``rule="optimization"`` (classification): the lifted model scores each candidate label by the
  lifted objective it can reach. For each class k, with the target ``e_k`` for every data point,

      S[k, j] = - min_X  [ L(e_k, W_L X~_L) + sum_{l<L} lam_l B_l(X_{l+1}, W_l X~_l) ]_j ,

  the weights fixed (the penalty does not depend on X or k and is dropped). The minimum is
  approximated by ``sweeps`` exact X-block sweeps (X_L, ..., X_1, the same blocks and backend as
  training) from the feed-forward point: the objective is only blockwise convex in X, and the
  feed-forward point, where every B_l = 0, is the natural start. The X-blocks separate by data
  point, so all columns are solved at once and ``[.]_j`` is column j's share. The predicted class
  is the one with the smallest lifted objective. For regression the rule is pointless: the
  output minimises its own loss term (to 0) and X goes back to the feed-forward point, so use
  the feed-forward rule.

(The paper discusses a prediction rule beside the feed-forward pass; this module implements the
per-class minimisation described above, which is what ``rule="optimization"`` means here.)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
from array_api_compat import array_namespace, device

from .arrays import Array
from .backends import get_backend
from .blocks import x_block
from .validation import COUNT, check

if TYPE_CHECKING:
    from .network import LiftedNetwork

RULES = ("feedforward", "optimization")


def column_objective(net: LiftedNetwork, X0: Array, Y: Array, Xs: Sequence[Array]) -> Array:
    """Each data point's share of F(W, X) without the penalty: loss + sum_l lam_l B_l."""
    xp = array_namespace(X0)
    X = [X0, *Xs]
    out = net.pre_activation(net.n_hidden, X[-1])
    val = net.loss.column_values(Y, out)
    for l, act in enumerate(net.activations):
        B = act.divergence(X[l + 1], net.pre_activation(l, X[l]))
        val = val + net.lam[l] * xp.sum(B, axis=0)
    return val


def predict(net, X0, rule="feedforward", backend="cvxpy", sweeps=2, tol=1e-6):
    """Scores ``(p_out, m)`` of ``net`` on ``X0`` (features x m) by the given rule (module doc),
    in the library and on the device of the network's weights.

    ``backend`` (a name or a backend object) and ``sweeps`` are used by the optimisation rule
    only; ``tol`` is the accepted KKT residual of a backend given by name (as in ``fit_bcd``).
    """
    if rule not in RULES:
        raise ValueError(f"rule must be one of {RULES}, got {rule!r}")
    check("sweeps", sweeps, COUNT)
    X0, _ = net.check_inputs(X0, dtype=np.float64)
    if rule != "feedforward":  # a backend's per-layer settings must fit net (FastBackend)
        backend = get_backend(backend, net, tol=tol)
    Xff, out = net.forward(X0)
    if rule == "feedforward":
        return out
    xp, K = array_namespace(X0), net.layer_sizes[-1]
    classes = xp.arange(K, device=device(X0))[:, None]
    scores = []
    for k in range(K):
        Y = xp.astype(xp.broadcast_to(classes == k, (K, X0.shape[1])), X0.dtype)  # e_k
        Xs = list(Xff)  # the solves never write into their start
        for _ in range(sweeps):
            for l in range(net.n_hidden, 0, -1):
                Xs[l - 1] = backend.solve(x_block(net, X0, Y, Xs, l), start=Xs[l - 1]).argmin
        scores.append(-column_objective(net, X0, Y, Xs))
    return xp.stack(scores)


def predict_classes(
    net: LiftedNetwork,
    X0: Array,
    rule: str = "feedforward",
    backend: str | object = "cvxpy",
    sweeps: int = 2,
    tol: float = 1e-6,
) -> Array:
    """The predicted class of each column of ``X0``: ``argmax`` of ``predict``'s scores (in
    their library)."""
    scores = predict(net, X0, rule=rule, backend=backend, sweeps=sweeps, tol=tol)
    return array_namespace(scores).argmax(scores, axis=0)
