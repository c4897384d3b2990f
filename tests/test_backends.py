"""The backend registry (``fenchel_cvx.backends``) and the import boundary of CVXPY.

CVXPY is the oracle's dependency only: importing the package and its fast backend must not load
it (the CVXPY forms live in ``fenchel_cvx.oracle.atoms``).
"""

import subprocess
import sys
from pathlib import Path

import pytest

from fenchel_cvx import backends, bcd
from fenchel_cvx.backends import BACKENDS, check_backend, get_backend

ROOT = Path(__file__).resolve().parents[1]


def test_package_and_fast_backend_load_no_cvxpy():
    code = (
        "import sys, fenchel_cvx, fenchel_cvx.fast; "
        "print(sorted(m for m in sys.modules if m == 'cvxpy' or m.startswith('cvxpy.')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.strip()
    assert out == "[]", f"importing fenchel_cvx loaded {out}"


def test_oracle_still_loads_cvxpy_forms():
    from fenchel_cvx.oracle import atoms

    assert "cvxpy" in sys.modules and callable(atoms.divergence_cvx)


def test_registry_builds_each_backend_by_name():
    from fenchel_cvx.fast import FastBackend
    from fenchel_cvx.oracle import OracleBackend

    assert sorted(BACKENDS) == ["cvxpy", "fast"]
    assert isinstance(get_backend("cvxpy", tol=1e-5), OracleBackend)
    fast = get_backend("fast", tol=1e-5)
    assert isinstance(fast, FastBackend)
    assert get_backend(fast) is fast  # an object with .solve passes through


@pytest.mark.parametrize("bad", ["scs", "", None, 3, object()])
def test_check_backend_refuses_by_name(bad):
    with pytest.raises(ValueError, match=r"^backend must be one of \['cvxpy', 'fast'\]"):
        check_backend(bad)
    with pytest.raises(ValueError, match="backend must be one of"):
        get_backend(bad)


def test_bcd_keeps_the_old_names_as_aliases():
    assert bcd.BACKENDS is backends.BACKENDS and bcd.get_backend is backends.get_backend


def test_the_blocks_carry_their_data_and_no_solver_hints():
    """A block is its problem's data; where a solve starts (the start's image) and what the
    caller takes back travel through ``Backend.solve``'s keywords, not the block."""
    import dataclasses

    from fenchel_cvx import blocks

    for cls in (blocks.XHidden, blocks.XLast, blocks.WHidden, blocks.WLast):
        names = {f.name for f in dataclasses.fields(cls)}
        assert not names & {"U", "return_U"}, cls.__name__


def _run_with(backend_class):
    """Three rounds of Algorithm 1 on a 4-6-3 network with a ``backend_class()`` backend; ->
    (the keywords each solve got, the run)."""
    import numpy as np

    from fenchel_cvx import LiftedNetwork
    from fenchel_cvx.bcd import fit_bcd

    rng = np.random.default_rng(0)
    X, Y = rng.normal(size=(4, 30)), np.eye(3)[:, rng.integers(0, 3, 30)]
    seen = []
    backend = backend_class(seen)
    net = LiftedNetwork([4, 6, 3], "relu", "mse", lam=0.5, rho=0.1, seed=0)
    return seen, fit_bcd(net, X, Y, iterations=3, backend=backend, check_every=2)


def test_the_driver_hands_start_images_only_to_a_backend_that_takes_them():
    from fenchel_cvx.fast import FastBackend

    class Taking(FastBackend):
        def __init__(self, seen):
            super().__init__(w_steps=2, x_steps=3)
            self.seen = seen

        def solve(self, block, start=None, image=None, return_image=False):
            self.seen.append(image is not None)
            return super().solve(block, start, image, return_image)

    class Old(FastBackend):  # a subclass written for ``solve(block, start)``: adapted
        def __init__(self, seen):
            super().__init__(w_steps=2, x_steps=3)
            self.seen = seen

        def solve(self, block, start=None):
            self.seen.append(False)
            return super().solve(block, start)

    taken, run = _run_with(Taking)
    assert len(taken) == 3 * 3 and any(taken) and run.history.held_but_capped
    old, again = _run_with(Old)
    assert old == [False] * 9 and again.history.held_but_capped
    assert not backends.as_backend(Old([])).images and backends.as_backend(Taking([])).images


def test_a_backends_check_threads_is_a_positive_integer_or_refused_by_name():
    from fenchel_cvx.backends import BackendDefaults, check_threads

    class Threaded(BackendDefaults):
        def solve(self, block, start=None): ...

    backend = Threaded()
    assert check_threads(backend) == 1 and check_threads(object()) == 1
    backend.check_threads = 3
    assert check_threads(backend) == 3
    for bad in (0, 2.5, "2"):
        backend.check_threads = bad
        with pytest.raises(ValueError, match="check_threads"):
            check_threads(backend)
