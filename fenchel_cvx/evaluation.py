"""The feed-forward evaluation of a BCD run: loss and accuracy of the network of eqs. (1)-(2).

A BCD round (Algorithms 1 and 2 of the paper, Sec. 4.5) records, beside its objectives, the
network's own figures on the training and test data: the loss of the feed-forward prediction
``L(Y, W_L X~_L^ff)`` per data point (the data term of eq. (3)) and, for one-hot targets, the
accuracy of its arg-max. ``fit_bcd(eval_every=k)`` sets how often (:func:`evaluator`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .arrays import Array, namespace

if TYPE_CHECKING:
    from .network import LiftedNetwork
    from .schedule import Step


def is_one_hot(Y: Array) -> bool:
    """True iff every column of Y is a standard basis vector (a classification target).

    Examples
    --------
    >>> import numpy as np
    >>> is_one_hot(np.eye(3)), is_one_hot(np.ones((3, 2)))
    (True, False)
    """
    xp = namespace(Y)
    Y = xp.asarray(Y)
    return (
        math.prod(Y.shape) > 0
        and bool(xp.all((Y == 0) | (Y == 1)))
        and bool(xp.all(xp.sum(Y, axis=0) == 1))
    )


def evaluate(
    net: LiftedNetwork, X0: Array, Y: Array, classification: bool | None = None
) -> tuple[float, float | None]:
    """Feed-forward ``(loss per data point, accuracy or None)`` of ``net`` on ``(X0, Y)``."""
    if classification is None:
        classification = is_one_hot(Y)
    Yhat = net.forward(X0)[1]
    loss = float(net.loss.value(Y, Yhat)) / Y.shape[1]
    xp = namespace(Yhat)
    correct = xp.argmax(Yhat, axis=0) == xp.argmax(Y, axis=0)
    acc = float(xp.mean(xp.astype(correct, Yhat.dtype))) if classification else None
    return loss, acc


def evaluator(
    X0: Array,
    Y: Array,
    X_test: Array | None,
    Y_test: Array | None,
    classification: bool,
    eval_every: int | None,
) -> Callable[[LiftedNetwork, Step], dict[str, Any]]:
    """The train and test evaluation of a round (every ``eval_every`` rounds and at the end of
    every epoch; never for ``eval_every=None``): ``evaluate_round(net, step)``, a dict."""

    def evaluate_round(net: LiftedNetwork, step: Step) -> dict[str, Any]:
        due = eval_every is not None and (step.iteration % eval_every == 0 or step.end_of_epoch)
        tr = evaluate(net, X0, Y, classification) if due else (None, None)
        te = (
            evaluate(net, X_test, Y_test, classification)
            if due and X_test is not None
            else (None, None)
        )
        return dict(train_loss=tr[0], train_accuracy=tr[1], test_loss=te[0], test_accuracy=te[1])

    return evaluate_round


def initial_figures(
    net: LiftedNetwork,
    X0: Array,
    Y: Array,
    X_test: Array | None,
    Y_test: Array | None,
    classification: bool,
) -> dict[str, Any]:
    """The feed-forward figures before the first round (the history's ``config.initial``)."""
    tr = evaluate(net, X0, Y, classification)
    te = evaluate(net, X_test, Y_test, classification) if X_test is not None else (None, None)
    return dict(
        network_objective=net.network_objective(X0, Y, checked=False),
        train_loss=tr[0],
        train_accuracy=tr[1],
        test_loss=te[0],
        test_accuracy=te[1],
    )


def history_config(net, settings) -> dict:
    """A run's config for its history (``settings``: its ``run_settings.RunSettings``), with
    the feed-forward figures before the first round as ``initial`` (None with
    ``eval_every=None``: no pass over all the data)."""
    config = dict(settings.config, initial=None)
    if settings.eval_every is not None:
        (X_test, Y_test), classification = settings.test, config["task"] == "classification"
        config["initial"] = initial_figures(
            net, settings.data.X0, settings.data.Y, X_test, Y_test, classification
        )
    return config
