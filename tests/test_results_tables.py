"""The generated figures and tables of the docs pages and the README are the benchmarks' JSON.

``benchmarks/results_tables.py`` reads the benchmarks' ``results.json`` files copied to
``docs/results/``, ``tune_baselines.py``'s reports in ``benchmarks/results/`` and the figures
transcribed from the printed tables of runs whose JSON is not committed, and fills every
``<!-- generated: NAME -->`` ... ``<!-- /generated -->`` block of docs/*.md and README.md (its own
tables of the results page, and the figures of ``benchmarks/results_figures.py``). These tests
regenerate every block of every page and compare it with the committed text, so a hand-edited
figure fails; they check that every JSON file and plot is used, that a quoted figure appears
outside its blocks nowhere, that a transcribed run says where it comes from and agrees with
itself, and that the results page stays a results page (one section per experiment, at most 600
lines).
"""

import importlib.util
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "results.md"
README = ROOT / "README.md"


def _script(name="results_tables"):
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _blocks(text):
    return _script().BLOCK.findall(text)


def test_the_pages_are_every_doc_page_and_the_readme():
    pages = set(_script().PAGES)
    assert pages == set((ROOT / "docs").glob("*.md")) | {README}


@pytest.mark.parametrize(
    "page",
    sorted((ROOT / "docs").glob("*.md")) + [README],
    ids=lambda p: p.relative_to(ROOT).as_posix(),
)
def test_every_generated_block_is_the_scripts_output(page):
    text = page.read_text(encoding="utf-8")
    assert _script().render(text, page.name) == text, "run: python benchmarks/results_tables.py"


def test_a_hand_edited_figure_is_found_and_rewritten():
    """A figure edited by hand inside its block, in the README and in a page's sentence."""
    rt = _script()
    for page, name in ((README, "fig2_fln"), (ROOT / "docs" / "deep.md", "deep_8_fln")):
        text = page.read_text(encoding="utf-8")
        figure = rt.block(name)
        marked = f"<!-- generated: {name} -->{figure}<!-- /generated -->"
        assert marked in text, (page.name, name)
        edited = text.replace(marked, marked.replace(figure, figure.replace("0.9", "0.8", 1)), 1)
        assert edited != text and rt.render(edited) == text


def test_check_mode_names_a_stale_page_and_rewrites_it(tmp_path, monkeypatch, capsys):
    rt = _script()
    pages = []
    for page, old, new in (
        (PAGE, "| FLN | 0.976 |", "| FLN | 0.999 |"),  # a generated table's cell
        (README, "0.9615<!-- /generated -->", "0.9616<!-- /generated -->"),  # an inline figure
    ):
        stale = page.read_text(encoding="utf-8").replace(old, new, 1)
        assert stale != page.read_text(encoding="utf-8")
        (tmp_path / page.name).write_text(stale, encoding="utf-8")
        pages.append(tmp_path / page.name)
    monkeypatch.setattr(rt, "PAGES", tuple(pages))
    assert rt.main(["--check"]) == 1
    out = capsys.readouterr().out
    assert "results.md: a generated block differs" in out and "README.md: a generated" in out
    assert rt.main([]) == 0 and rt.main(["--check"]) == 0  # rewritten, then current
    for page in (PAGE, README):
        assert (tmp_path / page.name).read_text(encoding="utf-8") == page.read_text("utf-8")
    assert not list(tmp_path.glob(".*.tmp"))  # written to a temporary name, then renamed


def test_every_block_is_known_and_filled_and_every_run_is_used():
    rt = _script()
    names = set()
    for page in rt.PAGES:
        for name, body in _blocks(page.read_text(encoding="utf-8")):
            assert rt.known(name), (page.name, name)
            assert body.strip(), (page.name, name)
            if body.startswith("\n"):  # a table, on lines of its own
                assert body.count("\n") >= 4 and body.startswith("\n| "), (page.name, name)
            else:  # a figure, on one line
                assert "\n" not in body, (page.name, name)
            names.add(name)
    assert set(rt.TABLES) | set(rt.figures.FIGURES) <= names, "a table or figure no page shows"
    used = {n for _, _, n in rt.COMPILED_RUNS} | set(rt.ADAM_RUNS.values())
    used |= {n for runs, _ in rt.PLOTS.values() for n in runs} | {"mlp_seeds3", "lifted_rounds"}
    used |= set(rt.figures.TRANSCRIBED) | set(_script("scaling_plot").RUNS)
    for page in (ROOT / "docs").glob("*.md"):  # a run a page names as its figures' record
        used |= set(re.findall(r"`docs/results/([a-z0-9_]+)\.json`", page.read_text("utf-8")))
    on_disk = {p.stem for p in (ROOT / "docs" / "results").glob("*.json")}
    assert on_disk == used, (
        f"unused JSON: {sorted(on_disk - used)}; missing: {sorted(used - on_disk)}"
    )
    text = PAGE.read_text(encoding="utf-8")
    for image in re.findall(r"\]\((results/[^)]+\.png)\)", text):
        assert (ROOT / "docs" / image).is_file(), image
    assert {f"results/{name}.png" for name in rt.PLOTS} <= set(
        re.findall(r"\]\((results/[^)]+\.png)\)", text)
    )


def test_a_quoted_figure_appears_only_in_its_blocks():
    """Outside the generated blocks no page repeats a figure they quote (the longer ones:
    ``0.9790 ± 0.0013``, the chosen learning rates, each seed's accuracies), and no page repeats
    by hand a figure of its own blocks (``0.9454``: as a number, not inside a longer one)."""
    rt = _script()
    texts = {p.name: p.read_text(encoding="utf-8") for p in rt.PAGES}
    names = {name for text in texts.values() for name, _ in _blocks(text)}
    figures = {rt.block(n) for n in names if not rt.block(n).endswith("\n")}
    for page, text in texts.items():
        outside = " ".join(rt.BLOCK.sub(" ", text).split())
        for figure in figures:
            if len(figure) >= 9:
                assert figure not in outside, (page, figure)
        for name, _ in _blocks(text):
            figure = rt.block(name)
            if len(figure) >= 6 and not figure.endswith("\n"):
                pattern = rf"(?<![\d.]){re.escape(figure)}(?![\d])"
                assert not re.search(pattern, outside), (page, name, figure)


@pytest.mark.parametrize(
    "page",
    [p for p in _script().PAGES if "<!-- generated:" in p.read_text("utf-8")],
    ids=lambda p: p.name,
)
def test_every_block_edited_by_hand_is_found_and_rewritten(page):
    """A digit changed inside every block of a page at once (each figure and table, the
    transcribed runs' included): rendering the page gives back the committed text."""
    rt = _script()
    text = page.read_text(encoding="utf-8")

    def plant(match):
        body = re.sub(r"\d", lambda d: "7" if d.group(0) != "7" else "3", match.group(2), count=1)
        assert body != match.group(2), (page.name, match.group(1))
        return f"<!-- generated: {match.group(1)} -->{body}<!-- /generated -->"

    edited = rt.BLOCK.sub(plant, text)
    assert edited != text and rt.render(edited, page.name) == text


def test_the_transcribed_runs_say_where_they_come_from():
    """Each transcribed run names its source, command, machine and date, is named on a page,
    and its means and spreads are those of its seeds (rounded to the four digits quoted)."""
    rt = _script()
    pages = " ".join(p.read_text(encoding="utf-8") for p in rt.PAGES)
    for name in rt.figures.TRANSCRIBED:
        run = rt.figures.transcribed(name)
        assert run["source"].startswith("transcribed from the run"), name
        assert all(run[k] for k in ("command", "machine", "date")), name
        assert f"`docs/results/{name}.json`" in pages, name
        for key, m in run.get("methods", {}).items():
            seeds = m.get("final_test_accuracy_per_seed", [])
            if len(seeds) > 1:
                mean, spread = sum(seeds) / len(seeds), max(seeds) - min(seeds)
                assert abs(mean - m["final_test_accuracy"]) <= 5e-5 + 1e-9, (name, key)
                assert round(spread, 4) == m["final_test_accuracy_spread"], (name, key)


def test_the_figures_quote_the_json():
    """A figure of the pages is the JSON's, rounded: FLN's MLP mean and spread over its seeds,
    and the learning rates chosen on the validation split."""
    rt = _script()
    fln = json.loads((ROOT / "docs" / "results" / "mlp_seeds3.json").read_text())["methods"]["fln"]
    seeds = fln["final_test_accuracy_per_seed"]
    assert fln["final_test_accuracy"] == pytest.approx(sum(seeds) / len(seeds))
    figure = f"{fln['final_test_accuracy']:.4f} ± {max(seeds) - min(seeds):.4f}"
    assert f"{figure} ({len(seeds)} seeds)" in rt.table_mlp()
    for page in (PAGE, README, ROOT / "docs" / "index.md"):
        assert f"<!-- generated: fig2_fln -->{figure}<!-- /generated -->" in page.read_text("utf-8")
    screen = json.loads((ROOT / "benchmarks" / "results" / "tune_baselines_mlp.json").read_text())
    assert f"Adam {screen['chosen']['adam']:g}," in rt.figures.figure("lr_mlp")
    assert f"**{screen['chosen']['adam']:g}** (chosen)" in rt.figures.figure("tune_mlp_adam")


def test_unknown_names_unclosed_blocks_and_foreign_json_are_refused(tmp_path, monkeypatch):
    rt = _script()
    with pytest.raises(KeyError, match="p.md names a generated block 'nonesuch'"):
        rt.render("<!-- generated: nonesuch -->\n<!-- /generated -->", "p.md")
    with pytest.raises(ValueError, match="p.md: a '<!-- generated: NAME -->' without"):
        rt.render("<!-- generated: fig2_fln -->0.9790 ± 0.0013", "p.md")
    (tmp_path / "mlp_seeds3.json").write_text(json.dumps({"x": 1}))
    (tmp_path / "tune_baselines_mlp.json").write_text(json.dumps({"x": 1}))
    monkeypatch.setattr(rt.figures, "DATA", tmp_path)
    monkeypatch.setattr(rt.figures, "SCREENS", tmp_path)
    with pytest.raises(ValueError, match="mlp_seeds3.json is not a benchmark's results.json"):
        rt.table_mlp()
    with pytest.raises(ValueError, match="tune_baselines_mlp.json is not a tune_baselines"):
        rt.figures.figure("lr_mlp")
    copied = {k: "x" for k in ("command", "machine", "date", "settings")}
    (tmp_path / "mlp_tuned_lr.json").write_text(json.dumps({**copied, "source": "copied"}))
    with pytest.raises(ValueError, match="mlp_tuned_lr.json: its source is no transcription"):
        rt.figures.figure("mlp_tuned_lr-adam")


def test_plot_is_a_small_png(tmp_path, monkeypatch):
    rt = _script()
    for path in (ROOT / "docs" / "results").glob("*.json"):
        (tmp_path / path.name).write_bytes(path.read_bytes())
    monkeypatch.setattr(rt.figures, "DATA", tmp_path)
    out = rt.plot("mlp")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size < 100_000
    assert not list(tmp_path.glob(".*.tmp"))


def test_the_scaling_plot_is_a_small_png_of_each_workloads_speed_up(tmp_path, monkeypatch):
    """``benchmarks/scaling_plot.py``: one rank's seconds over two ranks', per workload, from
    the copied JSON (FLN and Adam's DDP on LeNet-5, Figure 1's round, LeNet-5's and the MLP's
    batch with their ceilings), and the plot the page "Training in parallel" shows."""
    sp = _script("scaling_plot")
    pairs, ceilings = sp.speed_ups()
    results = ROOT / "docs" / "results"
    lenet = json.loads((results / "lenet5_eval5_amd_1206f.json").read_text())
    one, two = pairs["FLN, LeNet-5 (s/epoch)"]
    assert (one, two) == tuple(
        lenet["methods"][k]["seconds_per_epoch"] for k in ("fln:t1", "fln:r2t1")
    )
    assert len(pairs) == 5 and all(a > 0 and b > 0 for a, b in pairs.values())
    for name, run, key in (
        ("LeNet-5", "parallel_model_lenet5_percolumn_r9", "lenet5"),
        ("MLP", "parallel_model_mlp_percolumn", "mlp"),
    ):
        model = json.loads((results / f"{run}.json").read_text())[key]
        one, two = pairs[f"FLN, {name} (s/batch)"]
        assert one / two == pytest.approx(model["measured"]["speedup"])  # the median repeat's
        assert ceilings[name] == model["ceiling"]["speedup"]  # the plot draws the JSON's
    assert "(results/parallel_scaling.png)" in (ROOT / "docs" / "parallel.md").read_text()
    for name in sp.RUNS:
        (tmp_path / f"{name}.json").write_bytes((sp.DATA / f"{name}.json").read_bytes())
    monkeypatch.setattr(sp, "DATA", tmp_path)
    out = sp.plot()
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size < 100_000
    assert not list(tmp_path.glob(".*.tmp"))


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


def test_results_tables_module_stays_small():
    for name in ("results_tables.py", "results_figures.py"):
        assert len((ROOT / "benchmarks" / name).read_text().splitlines()) <= 400, name


@pytest.mark.parametrize("page", [PAGE, README, ROOT / "docs" / "deep.md"], ids=lambda p: p.name)
def test_the_markers_render_as_comments_and_the_figures_as_text(page):
    """Markdown keeps each marker an HTML comment, in a sentence, a table cell or bold text:
    the reader sees the figure and never the marker."""
    markdown = pytest.importorskip("markdown")
    bs4 = pytest.importorskip("bs4")
    extensions = ["tables", "admonition", "pymdownx.arithmatex", "pymdownx.superfences"]
    html = markdown.markdown(page.read_text(encoding="utf-8"), extensions=extensions)
    text = bs4.BeautifulSoup(html, "html.parser").get_text(" ")
    assert "generated:" not in text and "/generated" not in text
    assert "0.9790 ± 0.0013" in text
    assert html.count("<!-- generated:") == len(_blocks(page.read_text(encoding="utf-8")))
