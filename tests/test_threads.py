"""Per-library thread pools (fenchel_cvx.threads) and the fast backend's ``threads`` option."""

import numpy as np
import pytest
import scipy.linalg  # noqa: F401  (loads SciPy's own BLAS pool)

from fenchel_cvx import LiftedNetwork
from fenchel_cvx.blocks import w_block
from fenchel_cvx.fast import FastBackend
from fenchel_cvx.threads import limit_threads, owner, per_library, plan, pools


def _sizes(library):
    return {n for lib, _, n, _ in pools() if lib == library}


def test_owner_names_the_package_that_ships_the_library():
    assert owner("/venv/site-packages/numpy.libs/libscipy_openblas64_-3.so") == "numpy"
    assert owner("/venv/site-packages/scipy.libs/libscipy_openblas-6c.so") == "scipy"
    assert owner("/venv/site-packages/torch/lib/libgomp.so.1") == "torch"
    assert owner("/usr/lib/libopenblas.so") == "other"


def test_limit_threads_sets_each_library_separately_and_restores():
    if not _sizes("numpy") or not _sizes("scipy"):
        pytest.skip("NumPy and SciPy do not ship separate BLAS libraries in this install")
    before = pools()
    with limit_threads({"numpy": 2, "scipy": 1}) as per:
        assert per == {"numpy": 2, "scipy": 1}
        assert _sizes("numpy") == {2} and _sizes("scipy") == {1}
    assert pools() == before
    with limit_threads(1):
        assert _sizes("numpy") == {1} and _sizes("scipy") == {1}
    assert pools() == before


def test_plan_gives_scipy_one_thread():
    assert plan(2) == {"numpy": 2, "scipy": 1, "torch": 2, "other": 2}


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, {"numpy": 0}, {"blas": 2}])
def test_bad_thread_counts_are_rejected(bad):
    with pytest.raises(ValueError, match="threads"):
        per_library(bad)
    with pytest.raises(ValueError, match="threads"):
        FastBackend(threads=bad)


def test_fast_backend_solves_inside_the_limit_and_restores_the_pools():
    rng = np.random.default_rng(0)
    net = LiftedNetwork([6, 5, 3], "relu", "cross_entropy", lam=1.0, rho=1e-3, seed=0)
    X0 = rng.uniform(0, 1, (6, 20))
    Y = np.eye(3)[rng.integers(0, 3, 20)].T
    Xs, _ = net.forward(X0)
    block = w_block(net, X0, Y, Xs, 0)
    before = pools()
    limited = FastBackend(threads={"numpy": 1, "scipy": 1}).solve(block)
    plain = FastBackend().solve(block)
    assert pools() == before
    assert limited.converged and plain.converged
    np.testing.assert_allclose(limited.argmin, plain.argmin, atol=1e-8)
