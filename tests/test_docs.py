"""The documentation builds with ``mkdocs build --strict`` (every warning is an error).

A real build into a temporary directory (``slow``; the ``built_site`` fixture, which the docs'
headless-browser checks read too): the MkDocs pages, the API reference generated
from the docstrings by mkdocstrings, and the notebooks rendered by mkdocs-jupyter with their
saved outputs (not executed).
"""

from pathlib import Path

import pytest

for _module in (
    "mkdocs",
    "material",
    "mkdocstrings",
    "mkdocstrings_handlers.python",
    "mkdocs_jupyter",
):
    pytest.importorskip(_module)

ROOT = Path(__file__).resolve().parents[1]


def _modules():
    """Every public module of the package, dotted."""
    out = []
    for path in sorted((ROOT / "fenchel_cvx").rglob("*.py")):
        rel = path.relative_to(ROOT).with_suffix("")
        parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
        if not any(p.startswith("_") for p in parts):
            out.append(".".join(parts))
    return out


def test_api_reference_covers_every_module():
    text = "\n".join(p.read_text() for p in (ROOT / "docs" / "api").glob("*.md"))
    documented = {line[4:].strip() for line in text.splitlines() if line.startswith("::: ")}
    missing = [m for m in _modules() if m != "fenchel_cvx" and m not in documented]
    assert not missing, f"modules without an API page (add '::: name' to docs/api/*.md): {missing}"


def test_every_notebook_is_in_the_nav():
    yaml = pytest.importorskip("yaml")
    nav = yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"]
    section = next(
        item["Notebooks"] for item in nav if isinstance(item, dict) and "Notebooks" in item
    )
    listed = {path for entry in section for path in entry.values()}
    on_disk = {
        f"notebooks/{p.name}" for p in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    }
    assert listed == on_disk, (
        f"mkdocs.yml nav, Notebooks: add {sorted(on_disk - listed)}, "
        f"remove {sorted(listed - on_disk)}"
    )


@pytest.mark.slow
def test_docs_build_strict(built_site):
    site, proc = built_site
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log
    assert "WARNING" not in log, log
    for page in (
        "index.html",
        "installation/index.html",
        "mathematics/index.html",
        "certificate/index.html",
        "results/index.html",
        "api/estimator/index.html",
        "notebooks/01_biconvex_activations/index.html",
    ):
        assert (site / page).is_file(), page
    api = (site / "api" / "estimator" / "index.html").read_text()
    assert "FenchelClassifier" in api and "partial_fit" in api
    results = (site / "results" / "index.html").read_text()
    assert "Where the figures come from" in results and "0.9790" in results  # measured figures
    assert (site / "results" / "mlp.png").is_file()  # and the plots
    assert (site / "tuning" / "index.html").is_file()
    for path in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        page = (site / "notebooks" / path.stem / "index.html").read_text()
        assert "What it teaches" in page, path.stem
        # the saved outputs are shown: printed text and the figures, inlined as PNG
        assert "full settings" in page and "data:image/png;base64," in page, path.stem
