"""The feed-forward evaluation of a BCD run: loss and accuracy of the network of eqs. (1)-(2).

A BCD round (Algorithms 1 and 2 of the paper, Sec. 4.5) records, beside its objectives, the
network's own figures on the training and test data: the loss of the feed-forward prediction
``L(Y, W_L X~_L^ff)`` per data point (the data term of eq. (3)) and, for one-hot targets, the
accuracy of its arg-max. ``fit_bcd(eval_every=k)`` sets how often (:func:`evaluator`).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .arrays import Array, namespace
from .backends import check_threads
from .column_threads import over_columns

if TYPE_CHECKING:
    from .network import LiftedNetwork
    from .reduce import Comm
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
    net: LiftedNetwork,
    X0: Array,
    Y: Array,
    classification: bool | None = None,
    threads: int = 1,
) -> tuple[float, float | None]:
    """Feed-forward ``(loss per data point, accuracy or None)`` of ``net`` on ``(X0, Y)``, on
    ``threads`` shares of the data points, a thread each (``column_threads.over_columns``)."""
    return _evaluated(net, X0, Y, classification, threads)[1:]


def _evaluated(
    net: LiftedNetwork, X0: Array, Y: Array, classification: bool | None, threads: int
) -> tuple[float, float, float | None]:
    """``evaluate``'s figures after the summed loss they come from (one feed-forward pass)."""
    if classification is None:
        classification = is_one_hot(Y)
    loss, correct = over_columns(functools.partial(_totals, net), X0, Y, threads=threads)
    m = Y.shape[1]
    return float(loss), float(loss) / m, float(correct) / m if classification else None


def _totals(net: LiftedNetwork, X0: Array, Y: Array, comm: Comm) -> list:
    """The feed-forward loss and the count of arg-max hits, summed over the data points."""
    Yhat = net.forward(X0)[1]
    xp = namespace(Yhat)
    hits = xp.sum(xp.astype(xp.argmax(Yhat, axis=0) == xp.argmax(Y, axis=0), Yhat.dtype))
    return comm.reduce([net.loss.value(Y, Yhat), hits], "sum")


def evaluator(
    X0: Array,
    Y: Array,
    X_test: Array | None,
    Y_test: Array | None,
    classification: bool,
    eval_every: int | None,
    threads: int = 1,
) -> Callable[[LiftedNetwork, Step], dict[str, Any]]:
    """The train and test evaluation of a round (every ``eval_every`` rounds and at the end of
    every epoch; never for ``eval_every=None``), on ``threads`` shares of the data points:
    ``evaluate_round(net, step)``, a dict."""

    def evaluate_round(net: LiftedNetwork, step: Step) -> dict[str, Any]:
        due = eval_every is not None and (step.iteration % eval_every == 0 or step.end_of_epoch)
        tr = evaluate(net, X0, Y, classification, threads) if due else (None, None)
        te = (
            evaluate(net, X_test, Y_test, classification, threads)
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
    threads: int = 1,
) -> dict[str, Any]:
    """The feed-forward figures before the first round (the history's ``config.initial``), on
    ``threads`` shares of the data points: one pass over the training data gives its loss, its
    accuracy and J(W) (the summed loss and the penalty: ``network_objective``'s figure), one
    over the test data its own."""
    total, *tr = _evaluated(net, X0, Y, classification, threads)
    te = (
        evaluate(net, X_test, Y_test, classification, threads)
        if X_test is not None
        else (None, None)
    )
    return dict(
        network_objective=total + net.penalty(),
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
            net,
            settings.data.X0,
            settings.data.Y,
            X_test,
            Y_test,
            classification,
            check_threads(settings.backend),
        )
    return config
