"""The docs render their mathematics offline, on every page of the built site.

MathJax is vendored (docs/javascripts/mathjax/) and no page loads a script from the network.
The ``slow`` tests build the site with ``mkdocs build`` and open every page with math or TeX in
its prose in one headless Chromium with the network cut off (``_browser.py``; a page with
neither is read as served: MathJax has nothing to do there): after MathJax has run, no page
shows raw TeX outside its code (the Markdown pages' ``\\(...\\)``, the notebook pages' ``$...$``,
the table of contents), every page with math shows typeset math, the notebook pages wrap their
code and outputs instead of cutting them, and a screenshot of the Mathematics page is not blank
(kept in the test's temporary folder, and copied to ``$FENCHEL_SCREENSHOT_DIR`` when that is
set).

Without Chromium these tests skip, unless ``FENCHEL_REQUIRE_BROWSER=1`` (set by ``.ci/run``):
then they fail, so that CI cannot pass without having looked at the pages.
"""

import os
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from _browser import Browser

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = next(
    (shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome") if shutil.which(n)),
    None,
)
#: TeX left for a reader: a command, \( or \[, $$, or a $...$ span (text outside code only)
RAW_TEX = re.compile(r"\\[a-zA-Z]+|\\[(\[]|\$\$|\$[^$\s][^$]*?\$")
#: the elements whose text is not prose: code, scripts, MathJax's own output, and the hidden
#: copy of each notebook code cell that mkdocs-jupyter keeps for its copy button
NOT_PROSE = ("script", "style", "pre", "code", "textarea", "mjx-container", "svg")
HIDDEN_CODE = ".clipboard-copy-txt"
#: the code and output blocks of a notebook page cut at the right edge, as the tab lays them out
CUT_BLOCKS = """[...document.querySelectorAll(".jupyter-wrapper pre")]
  .filter(e => e.offsetWidth > 0 && e.scrollWidth > e.clientWidth + 1).length"""


def _require_browser():
    if CHROMIUM is None:
        message = "headless check needs chromium (apt-get install chromium)"
        if os.environ.get("FENCHEL_REQUIRE_BROWSER", "0") not in ("", "0"):
            pytest.fail(message + "; FENCHEL_REQUIRE_BROWSER is set")
        pytest.skip(message)


def test_mkdocs_loads_no_script_from_the_network():
    config = (ROOT / "mkdocs.yml").read_text()
    scripts = re.search(r"extra_javascript:.*?\n((?:\s+- .*\n)+)", config).group(1)
    assert "http" not in scripts
    for line in scripts.split("\n"):
        path = line.split("- ", 1)[-1].split("#")[0].strip()
        if path:
            assert (ROOT / "docs" / path).is_file(), path


def test_raw_tex_pattern_finds_each_kind_of_leftover():
    for raw in ("one \\(\\lambda\\) is enough", "the $B_\\phi$ plane", "$x$", "$$a$$", "\\alpha"):
        assert RAW_TEX.search(raw), raw
    for prose in ("costs 5 $ each", "a path C:/data", "plain text (with brackets) [1]"):
        assert not RAW_TEX.search(prose), prose


@pytest.fixture(scope="module")
def site(request):
    """The documentation built with ``mkdocs build --strict`` into a temporary folder (the
    worker's ``built_site``)."""
    _require_browser()
    for module in ("mkdocs", "material", "mkdocstrings", "mkdocs_jupyter", "bs4"):
        pytest.importorskip(module)
    out, proc = request.getfixturevalue("built_site")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out


@pytest.fixture(scope="module")
def browser(site):
    """One headless Chromium, its tab 1000 x 1400 pixels, for the module's pages."""
    with Browser(CHROMIUM, width=1000, height=1400) as chromium:
        yield chromium


def _prose(dom):
    """The page's visible text outside code, scripts and typeset math."""
    from bs4 import BeautifulSoup

    soup = BeautifulSoup(dom, "html.parser")
    for tag in soup.find_all(NOT_PROSE) + soup.select(HIDDEN_CODE):
        tag.decompose()
    return soup.get_text(" ")


def _pages(site):
    return sorted(p for p in site.rglob("index.html") if p.parent.name != "404")


@pytest.mark.slow
def test_every_page_shows_typeset_math_and_no_raw_tex(site, browser):
    pages = _pages(site)
    assert len(pages) >= 30, [str(p.relative_to(site)) for p in pages]  # guides, notebooks, API
    failures, opened = [], 0
    for page in pages:
        source = page.read_text()
        has_math = 'class="arithmatex"' in source or bool(
            re.search(r"jp-RenderedMarkdown[^>]*>.*?\$[^$\s]", source, flags=re.S)
        )
        if not has_math and not RAW_TEX.search(_prose(source)):
            continue  # no math and no TeX in its prose as served: MathJax has nothing to do
        opened += 1
        browser.open(page.as_uri())
        dom, name = browser.dom(), str(page.relative_to(site))
        raw = [m.group(0) for m in RAW_TEX.finditer(_prose(dom))]
        if raw:
            failures.append(f"{name}: raw TeX after MathJax: {raw[:5]}")
        if has_math and "<mjx-container" not in dom:
            failures.append(f"{name}: has math but MathJax typeset none")
    assert not failures, "\n".join(failures)
    assert opened >= 10  # the guides with math and the notebooks


@pytest.mark.slow
def test_the_table_of_contents_is_typeset(site, browser):
    browser.open((site / "mathematics" / "index.html").as_uri())
    dom = browser.dom()
    from bs4 import BeautifulSoup

    toc = BeautifulSoup(dom, "html.parser").select("nav.md-nav--secondary")
    assert toc and any(nav.find("mjx-container") for nav in toc)  # "one \(\lambda\) is enough"


@pytest.mark.slow
def test_notebook_pages_wrap_code_and_outputs(site, browser):
    pages = sorted((site / "notebooks").glob("*/index.html"))
    assert len(pages) >= 6
    for page in pages:
        browser.open(page.as_uri())
        assert browser.evaluate('document.querySelectorAll(".jupyter-wrapper pre").length')
        cut = browser.evaluate(CUT_BLOCKS)
        assert cut == 0, f"{page.parent.name}: {cut} blocks cut at the edge"


@pytest.mark.slow
def test_math_page_screenshot_is_not_blank(site, browser, tmp_path):
    shot = tmp_path / "mathematics.png"
    browser.open((site / "mathematics" / "index.html").as_uri())
    shot.write_bytes(browser.screenshot())
    from matplotlib.image import imread

    pixels = imread(shot)
    assert pixels.shape[:2] == (1400, 1000) and float(np.std(pixels[..., :3])) > 0.05  # not blank
    if os.environ.get("FENCHEL_SCREENSHOT_DIR"):
        shutil.copy(shot, Path(os.environ["FENCHEL_SCREENSHOT_DIR"]) / shot.name)
