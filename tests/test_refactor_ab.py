"""``benchmarks/refactor_ab.py``: this tree's FLN against a commit's, in one process."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "refactor_ab.py"


def _git_ok():
    out = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True)
    return out.returncode == 0


@pytest.mark.skipif(not _git_ok(), reason="needs the repository's git history")
def test_the_same_commit_against_itself_trains_the_same_weights(tmp_path):
    """The package of HEAD, imported as ``fenchel_cvx_old`` beside this tree's: on a tree
    whose package is HEAD's, both train the MLP's epoch to the same weights, bit for bit."""
    changed = subprocess.run(
        ["git", "-C", str(ROOT), "status", "--porcelain", "fenchel_cvx"],
        capture_output=True,
        text=True,
    ).stdout.strip()
    report = tmp_path / "ab.json"
    flags = ["--old", "HEAD", "--repeats", "1", "--networks", "mlp", "--quick"]
    flags += ["--json", str(report)]
    out = subprocess.run(
        [sys.executable, str(SCRIPT), *flags], capture_output=True, text=True, timeout=600
    )
    assert out.returncode == 0, out.stderr[-2000:]
    figures = json.loads(report.read_text())["mlp"]
    assert figures["batches"] == 6 and figures["old_median_s"] > 0 and figures["ratio"] > 0
    if not changed:
        assert figures["weights_rel_diff"] == 0.0


def test_an_unknown_commit_is_refused_by_name():
    out = subprocess.run(
        [sys.executable, str(SCRIPT), "--old", "no-such-ref-52", "--networks", "mlp", "--quick"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode != 0 and "--old 'no-such-ref-52'" in out.stderr + out.stdout
