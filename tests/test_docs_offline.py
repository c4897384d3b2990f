"""The docs render their mathematics offline: MathJax is vendored (docs/javascripts/mathjax/),
no page loads a script from the network, and one page, rendered in headless Chromium with the
network cut off, shows typeset math (SVG) and not raw TeX. The screenshot is kept in the test's
temporary folder (and copied to ``$FENCHEL_SCREENSHOT_DIR`` when that is set)."""
import os
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = next((shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome")
                 if shutil.which(n)), None)


def test_mkdocs_loads_no_script_from_the_network():
    config = (ROOT / "mkdocs.yml").read_text()
    scripts = re.search(r"extra_javascript:.*?\n((?:\s+- .*\n)+)", config).group(1)
    assert "http" not in scripts
    for line in scripts.split("\n"):
        path = line.split("- ", 1)[-1].split("#")[0].strip()
        if path:
            assert (ROOT / "docs" / path).is_file(), path


def _page(tmp_path):
    """docs/mathematics.md as a standalone page with the docs' MathJax set-up."""
    markdown = pytest.importorskip("markdown")
    pytest.importorskip("pymdownx")
    body = markdown.markdown((ROOT / "docs" / "mathematics.md").read_text(),
                             extensions=["tables", "pymdownx.arithmatex"],
                             extension_configs={"pymdownx.arithmatex": {"generic": True}})
    js = ROOT / "docs" / "javascripts"
    html = tmp_path / "page.html"
    html.write_text(f"<!doctype html><html><head><meta charset='utf-8'>"
                    f"<script src='{(js / 'mathjax.js').as_uri()}'></script>"
                    f"<script src='{(js / 'mathjax' / 'tex-svg-full.js').as_uri()}'></script>"
                    f"</head><body style='background:white'>{body}</body></html>")
    return html


def _chromium(*args):
    base = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--allow-file-access-from-files",
            "--proxy-server=127.0.0.1:9", "--proxy-bypass-list=<-loopback>",  # no network
            "--virtual-time-budget=20000"]
    return subprocess.run(base + list(args), capture_output=True, text=True, timeout=180)


@pytest.mark.skipif(CHROMIUM is None, reason="headless check needs chromium (apt-get install chromium)")
@pytest.mark.slow
def test_math_renders_offline_in_headless_chromium(tmp_path):
    html = _page(tmp_path)
    assert html.read_text().count('class="arithmatex"') > 10
    dom = _chromium("--dump-dom", html.as_uri())
    assert dom.returncode == 0, dom.stderr[-2000:]
    typeset = dom.stdout.count("<mjx-container")
    assert typeset > 10 and "<svg" in dom.stdout, "MathJax did not typeset the page"
    assert "\\(" not in re.sub(r"<script.*?</script>", "", dom.stdout, flags=re.S)  # no raw TeX left
    shot = tmp_path / "mathematics.png"
    proc = _chromium(f"--screenshot={shot}", "--window-size=1000,1400", html.as_uri())
    assert proc.returncode == 0 and shot.is_file(), proc.stderr[-2000:]
    from matplotlib.image import imread

    pixels = imread(shot)
    assert pixels.shape[:2] == (1400, 1000) and float(np.std(pixels[..., :3])) > 0.05  # not blank
    if os.environ.get("FENCHEL_SCREENSHOT_DIR"):
        shutil.copy(shot, Path(os.environ["FENCHEL_SCREENSHOT_DIR"]) / shot.name)
