"""The oracle's check for a minimiser before a last W-block solve (``oracle.wellposed``): it asks
the loss whether its block may lack one (``Loss.may_lack_minimiser``) and scores only those;
regression losses (MSE, Huber) with targets of any sign and scale are solved, never refused.
"""

import numpy as np
import pytest

from fenchel_cvx import LiftedNetwork
from fenchel_cvx.blocks import w_block
from fenchel_cvx.fast import FastBackend
from fenchel_cvx.oracle import OracleBackend, wellposed


def _last_block(loss, Y, seed=0):
    """The last W-block without ``rho`` (``rho=[0.1, 0.0]``), with targets ``Y``."""
    rng = np.random.default_rng(seed)
    net = LiftedNetwork((5, 4, Y.shape[0]), "relu", loss, rho=[0.1, 0.0], seed=seed)
    X0 = rng.standard_normal((5, Y.shape[1]))
    return w_block(net, X0, Y, net.forward(X0)[0], 1)


def _targets(sign, scale, seed=0, shape=(3, 40)):
    return sign * scale * np.abs(np.random.default_rng(seed + 1).standard_normal(shape))


@pytest.mark.parametrize(
    "loss, sign, scale",
    [("mse", -1.0, 1.0), ("mse", -1.0, 100.0), ("huber", 1.0, 100.0), ("huber", -1.0, 100.0)],
)
def test_a_regression_last_w_block_without_rho_is_solved_for_targets_of_any_sign(loss, sign, scale):
    """MSE with negative targets (sum Y < 0) and Huber with targets of scale 100, rho = 0 on the
    last layer: the oracle solves the block (no ``NoMinimiser``) to the fast backend's optimum."""
    block = _last_block(loss, _targets(sign, scale))
    assert sign > 0 or float(block.Y.sum()) < 0
    res = OracleBackend(tol=1e-8).solve(block)
    assert res.converged
    ref = FastBackend(tol=1e-10).solve(block)
    assert res.value == pytest.approx(ref.value, rel=1e-7)


def test_only_a_loss_that_may_lack_a_minimiser_is_scored(monkeypatch):
    """The check asks the loss class: MSE and Huber (``may_lack_minimiser`` False) are never
    scored, cross-entropy is (its refusal of separable data: tests/test_robustness.py)."""
    scored = []
    real = wellposed.recession_score

    def spy(loss, Xt, Y):
        scored.append(type(loss).__name__)
        return real(loss, Xt, Y)

    monkeypatch.setattr(wellposed, "recession_score", spy)
    for loss in ("mse", "huber"):
        wellposed.check_minimiser(_last_block(loss, _targets(-1.0, 100.0)))
    assert scored == []
    # 40 points of 3 classes that X_L does not separate: scored, and not refused
    wellposed.check_minimiser(_last_block("cross_entropy", np.eye(3)[:, np.arange(40) % 3]))
    assert scored == ["CrossEntropy"]


def test_a_loss_that_declares_it_may_lack_a_minimiser_needs_a_registered_score():
    """A loss class whose ``may_lack_minimiser`` holds but with no ``recession_score`` registered
    for its type is refused by name, not checked as if it always had a minimiser."""
    from fenchel_cvx.losses import MSE

    class Receding(MSE):
        may_lack_minimiser = True

    block = _last_block(Receding(), _targets(1.0, 1.0))
    with pytest.raises(
        TypeError, match="Receding.may_lack_minimiser holds, but no recession score is registered"
    ):
        wellposed.check_minimiser(block)
