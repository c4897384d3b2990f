"""The benchmark scripts (``benchmarks/*.py``) as modules, for the tests that call their
functions."""

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def load_benchmark(name):
    """``benchmarks/<name>.py`` imported as the module ``name`` (they are scripts, not a
    package)."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
