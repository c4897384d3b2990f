"""No file of the package, the benchmarks, the docs or the notebooks names a folder of one machine.

Data is read from ``--data-dir`` or ``$FENCHEL_DATA`` (docs page "Installation", "Data"), output
goes to ``--out``: a path of the development machine (an absolute one under ``/work``, ``/root``,
``/home``, ``/tmp``, ``/usr``, ``/opt``, ``/mnt``, ``/var`` or ``/srv``, one in a home folder,
``~/``, or the data folder beside a checkout, ``../shared``, ``shared/data``) in a docstring, a
default, a page, a notebook's output or a committed JSON file is one that a reader's machine does
not have: the examples use folders of the checkout (``data/mnist``, ``runs/``). Every text file
(``.py``, ``.md``, ``.ipynb``, ``.cfg``, ``.yml``, ``.json``, ``.txt``) is read; binary files
are skipped.
"""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("fenchel_cvx", "benchmarks", "docs", "notebooks")
SUFFIXES = {".py", ".md", ".ipynb", ".cfg", ".yml", ".json", ".txt"}
#: the development data folder, an absolute path under a machine's own folders, or a path in a
#: home folder (``~/`` then a name); not a part of a longer path, a URL, a relative link or a
#: regex (``https://host/home``, ``../var.md``, ``[~/]``, this pattern's own text)
MACHINE_PATH = re.compile(
    r"\.\./shared\b|\bshared/data\b"
    r"|(?<![\w.~$/-])/(?:work|root|home|tmp|usr|opt|mnt|var|srv)\b"
    r"|(?<![\w.~$/-])~/(?=[\w.])"
)


def _text_files(folder):
    for path in sorted((ROOT / folder).rglob("*")):
        parts = path.relative_to(ROOT).parts
        if path.suffix not in SUFFIXES or not path.is_file():
            continue
        if any(p.startswith(".") or p in ("__pycache__", "site") for p in parts):
            continue
        data = path.read_bytes()
        if b"\0" in data:
            continue  # binary
        try:
            yield path, data.decode("utf-8")
        except UnicodeDecodeError:
            continue


def machine_paths(folder):
    """``file:line: match`` for every machine path in the text files of ``folder``."""
    hits = []
    for path, text in _text_files(folder):
        for number, line in enumerate(text.splitlines(), 1):
            for match in MACHINE_PATH.finditer(line):
                hits.append(f"{path.relative_to(ROOT)}:{number}: {match.group(0)}")
    return hits


@pytest.mark.parametrize("folder", FOLDERS)
def test_no_machine_path(folder):
    hits = machine_paths(folder)
    assert not hits, "paths of one machine (use --data-dir / $FENCHEL_DATA):\n" + "\n".join(hits)


def test_no_machine_path_in_the_readme():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert not MACHINE_PATH.findall(text)


@pytest.mark.parametrize(
    "line",
    [
        "default: ../shared/data/mnist beside the repository",
        "FENCHEL_DATA=/work/shared/data",
        '"out": "/tmp/acc/mlp"',
        "cache in /tmp/torchinductor_root",
        "see /home/user/data",
        "sys.path.insert(0, '/root/x')",
        "a folder shared/data/mnist",
        "--data-dir ~/data/mnist",
        "export FENCHEL_DATA=~/data",
        "a cache in ~/.cache/x",
        "cp /usr/local/share/x .",
        "--out /opt/runs",
        "mounted at /mnt/data",
        "logs in /var/log/x",
        "served from /srv/mnist",
    ],
)
def test_the_pattern_finds_a_machine_path(line):
    assert MACHINE_PATH.search(line), line


@pytest.mark.parametrize(
    "line",
    [
        "https://example.org/home/index.html",
        "https://example.org/usr/opt/var/srv/mnt/~/x",
        "--data-dir data/mnist",
        "[Installation](installation.md#data), [the API](../api/cli.md), [x](../var/x.md)",
        'export FENCHEL_DATA="$PWD/data"',
        "the mean/var of a batch, and/or input/output",
        "re.sub(r'[~/]+', '_', name); Path.home() / 'data'",
        "$FENCHEL_DATA/mnist",
        '"out": "runs/deep_screen_d9"',
        "tmp_path / 'x.json'",
        "the shared memory / the data",
        "runs/x/work",
    ],
)
def test_the_pattern_passes_other_paths(line):
    assert not MACHINE_PATH.search(line), line


def test_the_pattern_passes_its_own_text():
    """The pattern's source (a regex in this test's Python) names no machine path."""
    assert not MACHINE_PATH.search(MACHINE_PATH.pattern)


def test_binary_files_are_skipped(tmp_path, monkeypatch):
    monkeypatch.setattr(__import__(__name__), "ROOT", tmp_path)
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.json").write_bytes(b"\0/tmp/x")
    (tmp_path / "docs" / "b.md").write_text("read /tmp/x\n")
    assert machine_paths("docs") == ["docs/b.md:1: /tmp"]
