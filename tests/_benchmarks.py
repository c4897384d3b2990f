"""The benchmark scripts (``benchmarks/*.py``) as modules, for the tests that call their public
functions; ``benchmarks/`` goes on the path, as it does for a script run from there, so that
their shared harness imports as ``common``."""

import importlib
import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "benchmarks"


def load_benchmark(name):
    """``benchmarks/<name>.py`` imported as the module ``name`` (they are scripts, not a
    package)."""
    if str(BENCHMARKS) not in sys.path:
        sys.path.insert(0, str(BENCHMARKS))
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def import_benchmark(name):
    """``benchmarks/<name>.py`` imported as Python imports a module (one instance, in
    ``sys.modules``): a benchmark whose functions go to forked processes by name, pickled as
    ``name.function``, must be that instance."""
    if str(BENCHMARKS) not in sys.path:
        sys.path.insert(0, str(BENCHMARKS))
    return importlib.import_module(name)
