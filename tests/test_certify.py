"""``oracle.certify`` and ``testing.assert_block_optimal``: anyone's solution checked against the
oracle.

The docs page "Check your own solver" runs here as written (PyTorch gradient descent on an
X-block); the candidates come from the oracle itself, from perturbations of it and from PyTorch.
"""

import re
from pathlib import Path

import numpy as np
import pytest

from fenchel_cvx.blocks import w_block, x_block
from fenchel_cvx.network import LiftedNetwork
from fenchel_cvx.oracle import OracleBackend, block_problem, certify
from fenchel_cvx.testing import assert_block_optimal

torch = pytest.importorskip("torch")
ROOT = Path(__file__).resolve().parents[1]


def blocks(act, loss, rho=0.1):
    rng = np.random.default_rng(0)
    net = LiftedNetwork([4, 5, 4, 3], act, loss, rho=rho, seed=0)
    X = rng.standard_normal((4, 20))
    Y = np.eye(3)[:, rng.integers(0, 3, 20)]
    Xs = net.forward(X)[0]
    return [
        x_block(net, X, Y, Xs, 1),
        x_block(net, X, Y, Xs, 2),
        w_block(net, X, Y, Xs, 0),
        w_block(net, X, Y, Xs, 2),
    ]


@pytest.mark.parametrize(
    "act,loss",
    [
        ("relu", "mse"),
        ("sigmoid", "cross_entropy"),
        ("tanh", "mse"),
        ("leaky_relu", "cross_entropy"),
    ],
)
def test_certify_brackets_the_optimum(act, loss):
    for block in blocks(act, loss):
        Zs = OracleBackend(tol=1e-9).solve(block).argmin
        good = certify(block, torch.tensor(Zs, requires_grad=True))  # via DLPack
        assert good.bound == "strong convexity" and good.kkt_residual <= 1e-8
        assert good.lower_bound <= good.optimum <= good.objective + 1e-12
        assert good.relative_gap <= 1e-9
        assert_block_optimal(block, Zs, rtol=1e-8)
        # a perturbed point: a positive gap that bounds its true suboptimality from above
        bad_Z = block.project(Zs + 1e-2)
        bad = certify(block, bad_Z)
        true = bad.objective - float(block_problem(block)[0].solve())
        assert bad.gap >= true - 1e-7 * (1 + abs(bad.objective)) and bad.gap > 1e-6
        with pytest.raises(AssertionError, match="suboptimality gap"):
            assert_block_optimal(block, bad_Z, rtol=1e-6)


def test_certify_w_block_without_strong_convexity():
    block = blocks("relu", "mse", rho=0.0)[3]  # MSE last W-block, rho = gamma = 0
    cert = certify(block, OracleBackend(tol=1e-9).solve(block).argmin)
    assert cert.bound in ("duality gap", "none") and cert.kkt_residual <= 1e-8
    assert_block_optimal(block, cert.argmin, rtol=1e-8)


def test_certify_refuses_bad_candidates_by_name():
    block = blocks("relu", "mse")[0]
    Z = block.U_prev.clip(0)
    with pytest.raises(ValueError, match=r"Z must have the shape \(5, 20\)"):
        certify(block, Z[:, :3])
    Z_nan = Z.copy()
    Z_nan[0, 0] = np.nan
    with pytest.raises(ValueError, match="Z must be finite, got 1 NaN"):
        certify(block, Z_nan)
    with pytest.raises(ValueError, match=r"Z must lie in the range .* of relu, got -"):
        certify(block, Z - 1.0 - Z.max())
    with pytest.raises(ValueError, match="Z must be an array"):
        certify(block, object())
    with pytest.raises(ValueError, match="rtol"):
        assert_block_optimal(block, Z, rtol=-1)


@pytest.mark.slow
def test_check_your_solver_page_runs_as_written(capsys):
    page = (ROOT / "docs" / "check_your_solver.md").read_text()
    code = re.findall(r"```python\n(.*?)```", page, re.S)[-1]
    scope = {}
    exec(compile(code, "check_your_solver.md", "exec"), scope)
    out = capsys.readouterr().out
    assert "5 steps:" in out and "1000 steps:" in out
    assert scope["early"].gap > 1e-3  # 5 steps: visibly not solved
    assert scope["late"].gap <= 1e-8 * (1 + abs(scope["late"].lower_bound))
    assert isinstance(scope["Z"], torch.Tensor)
