"""Figures from a :class:`~fenchel_cvx.history.History`: drawing only, no computation.

- ``plot_objectives``: per round, the lifted objective F after the X-sweep and the network
  objective J at the same weights (the certificate's lower bound F <= J; the shaded band is the
  relaxation gap), and both again after the W-sweep. Rounds where the X-sweep restarted from the
  feed-forward point are marked.
- ``plot_accuracy``: train and test accuracy per round (classification), or the per-point
  train and test loss (regression).

Both return the matplotlib ``Figure`` and, given ``path``, also write it as a PNG, atomically
(``io.atomic_write``: a temporary file in the same folder, renamed over ``path``). Figures are
built with ``matplotlib.figure.Figure`` on the Agg canvas, so no display and no pyplot state
are involved.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from .io import atomic_write

if TYPE_CHECKING:
    from .history import History


def _figure(figsize=(6.4, 4.0)):
    fig = Figure(figsize=figsize, layout="constrained")
    FigureCanvasAgg(fig)
    return fig, fig.add_subplot()


def _finish(fig, ax, history, path):
    algo = history.config.get("algorithm")
    ax.set_xlabel("round (iteration)" if algo != 2 else "round (batch x alternation)")
    ax.grid(True, alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="best", fontsize="small")
    if path is not None:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, lambda f: fig.savefig(f, format="png", dpi=120))
    return fig


def plot_objectives(history: History, path: str | os.PathLike[str] | None = None) -> Figure:
    """Lifted vs network objective per round (see the module docstring)."""
    fig, ax = _figure()
    if len(history) == 0:
        ax.set_title("objectives (empty history)")
        return _finish(fig, ax, history, path)
    it = history.series("iteration")
    F_x, J_x = history.series("lifted_x"), history.series("network_x")
    F_w, J_w = history.series("lifted_w"), history.series("network_w")
    ax.fill_between(it, F_x, J_x, color="tab:blue", alpha=0.15, label="gap J(W) - F(W, X)")
    ax.plot(it, J_x, "-o", color="tab:red", ms=3, label="network J(W), before W-sweep")
    ax.plot(it, F_x, "-o", color="tab:blue", ms=3, label="lifted F(W, X), after X-sweep")
    ax.plot(it, J_w, "--", color="tab:red", alpha=0.6, label="network J(W'), after W-sweep")
    ax.plot(it, F_w, "--", color="tab:blue", alpha=0.6, label="lifted F(W', X), after W-sweep")
    restarted = np.array([bool(r.get("restarted")) for r in history], dtype=bool)
    if restarted.any():
        ax.plot(it[restarted], F_x[restarted], "x", color="k", label="X restarted at feed-forward")
    vals = np.concatenate([F_x, J_x, F_w, J_w])
    if np.all(vals[np.isfinite(vals)] > 0):
        ax.set_yscale("log")
    held = (
        "held"
        if history.certificate_held
        else "held but for capped blocks"
        if history.held_but_capped
        else "VIOLATED"
    )
    ax.set_title(f"objectives (sums over the data / batch); certificate {held}", fontsize="medium")
    ax.set_ylabel("objective")
    return _finish(fig, ax, history, path)


def plot_accuracy(history: History, path: str | os.PathLike[str] | None = None) -> Figure:
    """Test (and train) accuracy per round; per-point losses for regression."""
    fig, ax = _figure()
    it = history.series("iteration")

    def evaluated(key):  # the rounds where it was evaluated (eval_every, epoch ends)
        values = history.series(key)
        return it[np.isfinite(values)], values[np.isfinite(values)]

    if history.config.get("task") == "regression":
        ax.plot(*evaluated("train_loss"), "-o", ms=3, label="train loss / point")
        if np.isfinite(history.series("test_loss")).any():
            ax.plot(*evaluated("test_loss"), "-o", ms=3, label="test loss / point")
        ax.set_ylabel("loss per data point (feed-forward)")
        ax.set_title("loss per round", fontsize="medium")
        return _finish(fig, ax, history, path)
    test = history.series("test_accuracy")
    if np.isfinite(test).any():
        ax.plot(*evaluated("test_accuracy"), "-o", color="tab:green", ms=3, label="test accuracy")
    ax.plot(*evaluated("train_accuracy"), "--", color="tab:gray", label="train accuracy")
    init = history.config.get("initial") or {}
    if init.get("test_accuracy") is not None:
        ax.axhline(
            init["test_accuracy"],
            color="tab:green",
            ls=":",
            lw=1,
            label="test accuracy at initialisation",
        )
    ax.set_ylabel("accuracy (feed-forward, argmax)")
    ax.set_ylim(0, 1.02)
    last = test[np.isfinite(test)]
    title = f"accuracy per round (final test {last[-1]:.3f})" if last.size else "accuracy per round"
    ax.set_title(title, fontsize="medium")
    return _finish(fig, ax, history, path)
