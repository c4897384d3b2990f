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
