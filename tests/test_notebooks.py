"""The teaching notebooks (``notebooks/README.md``): jupytext sources, paired and executed.

Every ``notebooks/NN_*.py`` is found automatically. Each must have its paired ``.ipynb`` with the
same cells and saved outputs without errors (the docs render those outputs, from the notebook's
full sizes, ``FENCHEL_NOTEBOOK_FULL=1``), open with what it teaches and how to run it, import
what it uses, and define no algorithm of its own. The ``slow`` test executes each *source* with
nbclient as a reader would open it: with its default small sizes; any error fails it.
"""

import os
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
jupytext = pytest.importorskip("jupytext")

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK_DIR = ROOT / "notebooks"
SOURCES = sorted(NOTEBOOK_DIR.glob("[0-9][0-9]_*.py"))
CELL_TIMEOUT_S = 600  # a guard against a hung kernel, not a speed target


def _cells(nb):
    return [(c.cell_type, c.source) for c in nb.cells]


def _outputs(nb):
    return [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]


def test_the_notebooks_are_found():
    assert len(SOURCES) >= 6, SOURCES
    orphans = {p.stem for p in NOTEBOOK_DIR.glob("*.ipynb")} - {p.stem for p in SOURCES}
    assert not orphans, f"notebooks without a jupytext source NN_name.py: {sorted(orphans)}"


@pytest.mark.parametrize("source", SOURCES, ids=lambda p: p.stem)
def test_source_is_paired_with_its_ipynb(source):
    nb = jupytext.read(source)
    assert nb.metadata.get("jupytext", {}).get("formats") == "ipynb,py:percent", (
        f"pair it: jupytext --set-formats ipynb,py:percent {source.relative_to(ROOT)}"
    )
    paired = source.with_suffix(".ipynb")
    assert paired.is_file(), f"run: jupytext --sync --execute {source.relative_to(ROOT)}"
    saved = nbformat.read(paired, as_version=4)
    nbformat.validate(saved)
    assert _cells(saved) == _cells(nb), (
        f"{paired.name} is out of date: jupytext --sync --execute {source.relative_to(ROOT)}"
    )


@pytest.mark.parametrize("source", SOURCES, ids=lambda p: p.stem)
def test_saved_outputs_are_complete_for_the_docs(source):
    """The docs show the saved outputs: every code cell has run, in order, with no error."""
    saved = nbformat.read(source.with_suffix(".ipynb"), as_version=4)
    counts = [c.execution_count for c in saved.cells if c.cell_type == "code"]
    assert counts == list(range(1, len(counts) + 1)), (
        f"{source.stem}: not executed in order from a fresh kernel (execution counts {counts})"
    )
    outputs = _outputs(saved)
    assert not [o for o in outputs if o.output_type == "error"]
    assert any("image/png" in o.get("data", {}) for o in outputs), "no figure saved"
    setting = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
    assert "full settings" in setting, "the saved outputs come from a full-size run"


@pytest.mark.parametrize("source", SOURCES, ids=lambda p: p.stem)
def test_notebook_opens_with_what_it_teaches(source):
    nb = jupytext.read(source)
    first = nb.cells[0]
    assert first.cell_type == "markdown" and first.source.startswith(f"# {source.stem[:2]} · ")
    assert "What it teaches" in first.source
    # its own text says how to run it: small sizes by default, the full ones by the variable
    assert "By default" in first.source and "FENCHEL_NOTEBOOK_FULL=1" in first.source
    code = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
    assert "fenchel_cvx" in code and 'os.environ.get("FENCHEL_NOTEBOOK_FULL"' in code
    assert "def " not in code, "no algorithm is defined in a notebook: import it from the package"


@pytest.mark.parametrize("source", SOURCES, ids=lambda p: p.stem)
def test_notebook_imports_what_it_calls(source):
    """Every name a code cell calls is defined by the notebook (an import or an assignment) or
    is a builtin: ``display`` is IPython's, and a notebook that calls it imports it."""
    import ast
    import builtins

    code = "\n".join(c.source for c in jupytext.read(source).cells if c.cell_type == "code")
    tree = ast.parse("\n".join(line for line in code.splitlines() if not line.startswith("%")))
    defined = set(dir(builtins))
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            defined |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            defined.add(node.id)
        elif isinstance(node, ast.arg):
            defined.add(node.arg)
    called = {
        n.func.id
        for n in ast.walk(tree)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
    }
    assert not called - defined, (
        f"{source.stem} calls names it never imports: {sorted(called - defined)}"
    )


@pytest.mark.slow
@pytest.mark.parametrize("source", SOURCES, ids=lambda p: p.stem)
def test_notebook_source_runs(source, tmp_path, monkeypatch):
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    monkeypatch.delenv("FENCHEL_NOTEBOOK_FULL", raising=False)  # the default: small sizes
    # the kernel is a separate process: give it the suite's BLAS thread limit (conftest.py) too
    threads = os.environ.get("FENCHEL_TEST_BLAS_THREADS", "1")
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        monkeypatch.setenv(var, threads)
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    )
    nb = jupytext.read(source)
    nbclient.NotebookClient(
        nb,
        timeout=CELL_TIMEOUT_S,
        kernel_name="python3",
        resources={"metadata": {"path": str(tmp_path)}},
    ).execute()
    assert not [o for o in _outputs(nb) if o.output_type == "error"]
    printed = "".join(o.get("text", "") for o in _outputs(nb) if o.output_type == "stream")
    assert "small settings" in printed
