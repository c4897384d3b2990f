"""The teaching notebooks: generated from ``notebooks/build.py``, and each runs to the end.

Every notebook is executed with nbclient under ``FENCHEL_NOTEBOOK_SMALL=1`` (their small
settings), with a one-minute limit per notebook; any error fails the test.
"""
import importlib.util
import os
import time
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK_DIR = ROOT / "notebooks"
NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("*.ipynb"))
LIMIT_S = 60


def _build_module():
    spec = importlib.util.spec_from_file_location("notebooks_build", NOTEBOOK_DIR / "build.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_notebooks_match_their_generator():
    build = _build_module()
    assert sorted(p.stem for p in NOTEBOOKS) == sorted(build.NOTEBOOKS)
    assert build.main(["--check"]) == 0, "run: python notebooks/build.py"


@pytest.mark.parametrize("name", sorted(_build_module().NOTEBOOKS))
def test_notebook_opens_with_what_it_teaches(name):
    nb = nbformat.read(NOTEBOOK_DIR / f"{name}.ipynb", as_version=4)
    first = nb.cells[0]
    assert first.cell_type == "markdown" and first.source.startswith("# ")
    assert "What it teaches" in first.source
    code = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
    assert "fenchel_cvx" in code and "FENCHEL_NOTEBOOK_SMALL" in code
    assert "def " not in code, "no algorithm is defined in a notebook: import it from the package"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs(path, tmp_path, monkeypatch):
    monkeypatch.setenv("FENCHEL_NOTEBOOK_SMALL", "1")
    # the kernel is a separate process: give it the suite's BLAS thread limit (conftest.py) too
    threads = os.environ.get("FENCHEL_TEST_BLAS_THREADS", "1")
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        monkeypatch.setenv(var, threads)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=LIMIT_S, kernel_name="python3",
                                     resources={"metadata": {"path": str(tmp_path)}})
    t0 = time.perf_counter()
    client.execute()
    seconds = time.perf_counter() - t0
    assert seconds < LIMIT_S, f"{path.name} took {seconds:.0f} s (limit {LIMIT_S} s)"
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
              if o.get("output_type") == "error"]
    assert not errors
