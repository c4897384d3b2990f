"""docs/results.md's generated tables are ``benchmarks/results_tables.py``'s output.

The script reads the benchmarks' ``results.json`` files copied to ``docs/results/`` and fills
every ``<!-- generated: NAME -->`` block of the page; these tests check that the committed page
is what the script writes, that every JSON file and plot is used, and that the page stays a
results page (one section per experiment, at most 600 lines).
"""

import importlib.util
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "results.md"


def _script():
    spec = importlib.util.spec_from_file_location(
        "results_tables", ROOT / "benchmarks" / "results_tables.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_committed_tables_are_the_scripts_output():
    text = PAGE.read_text(encoding="utf-8")
    assert _script().render(text) == text, "run: python benchmarks/results_tables.py"


def test_check_mode_reports_a_stale_table(tmp_path, monkeypatch, capsys):
    rt = _script()
    stale = PAGE.read_text(encoding="utf-8").replace("| FLN | 0.976 |", "| FLN | 0.999 |", 1)
    assert stale != PAGE.read_text(encoding="utf-8")
    page = tmp_path / "results.md"
    page.write_text(stale, encoding="utf-8")
    monkeypatch.setattr(rt, "PAGE", page)
    assert rt.main(["--check"]) == 1 and "differs" in capsys.readouterr().out
    assert rt.main([]) == 0 and rt.main(["--check"]) == 0  # rewritten, then current
    assert page.read_text(encoding="utf-8") == PAGE.read_text(encoding="utf-8")


def test_every_block_is_known_and_filled_and_every_run_is_used():
    rt = _script()
    text = PAGE.read_text(encoding="utf-8")
    blocks = rt.BLOCK.findall(text)
    assert {name for _, name, _, _ in blocks} == set(rt.TABLES)
    for _, name, body, _ in blocks:
        assert body.count("\n") >= 3 and body.startswith("| "), name
    used = {n for _, _, n in rt.COMPILED_RUNS} | set(rt.ADAM_RUNS.values())
    used |= {n for runs, _ in rt.PLOTS.values() for n in runs} | {"mlp_seeds3", "lifted_rounds"}
    used |= set(re.findall(r"`docs/results/(\w+)\.json`", (ROOT / "docs" / "deep.md").read_text()))
    on_disk = {p.stem for p in (ROOT / "docs" / "results").glob("*.json")}
    assert on_disk == used, (
        f"unused JSON: {sorted(on_disk - used)}; missing: {sorted(used - on_disk)}"
    )
    for image in re.findall(r"\]\((results/[^)]+\.png)\)", text):
        assert (ROOT / "docs" / image).is_file(), image
    assert {f"results/{name}.png" for name in rt.PLOTS} <= set(
        re.findall(r"\]\((results/[^)]+\.png)\)", text)
    )


def test_the_tables_quote_the_json():
    """A figure of the page is the JSON's, rounded: FLN's MLP mean and spread over its seeds."""
    rt = _script()
    fln = json.loads((ROOT / "docs" / "results" / "mlp_seeds3.json").read_text())["methods"]["fln"]
    seeds = fln["final_test_accuracy_per_seed"]
    assert fln["final_test_accuracy"] == pytest.approx(sum(seeds) / len(seeds))
    cell = f"{fln['final_test_accuracy']:.4f} ± {max(seeds) - min(seeds):.4f} ({len(seeds)} seeds)"
    assert cell in rt.table_mlp() and cell in PAGE.read_text(encoding="utf-8")


def test_unknown_table_and_foreign_json_are_refused(tmp_path, monkeypatch):
    rt = _script()
    with pytest.raises(KeyError, match="'nonesuch'"):
        rt.render("<!-- generated: nonesuch -->\n<!-- end generated -->")
    (tmp_path / "mlp_seeds3.json").write_text(json.dumps({"x": 1}))
    monkeypatch.setattr(rt, "DATA", tmp_path)
    with pytest.raises(ValueError, match="mlp_seeds3.json is not a benchmark's results.json"):
        rt.table_mlp()


def test_plot_is_a_small_png(tmp_path, monkeypatch):
    rt = _script()
    for path in (ROOT / "docs" / "results").glob("*.json"):
        (tmp_path / path.name).write_bytes(path.read_bytes())
    monkeypatch.setattr(rt, "DATA", tmp_path)
    out = rt.plot("mlp")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size < 100_000


def test_results_page_is_one_section_per_experiment():
    text = PAGE.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 600
    sections = re.findall(r"^## (.+)$", text, flags=re.M)
    for figure in ("Figure 1", "Figure 2", "Figure 3", "Figure 4"):
        assert sum(s.startswith(figure) for s in sections) == 1, figure
    assert any("compiled path" in s for s in sections) and any("GPU" in s for s in sections)
    for section in re.split(r"^## ", text, flags=re.M)[2:]:
        if section.startswith("Figure") and not section.startswith("Figure 4"):
            assert "```bash" in section and "Machine:" in section and "Date: 2026-" in section
            assert "| method | paper" in section and ".png)" in section, section[:40]
