"""The README is a front page whose Python examples each run by themselves, as written.

Each ```python block runs in a fresh namespace (a reader copies one block, not the page), and its
printed output is checked against what the text says it shows. The README stays at most 150
lines and its quick-start command line is the one CI runs (.ci/run).
"""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"


def _blocks():
    return re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), flags=re.S)


def _run_alone(code, capsys):
    exec(compile(code, str(README), "exec"), {"__name__": "__readme__"})  # a fresh namespace
    return capsys.readouterr().out.splitlines()


def test_readme_is_a_front_page():
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 150
    for heading in (
        "## Quick start",
        "## Examples",
        "## Command line",
        "## The paper's experiments",
        "## Layout",
        "## License and citation",
    ):
        assert heading in text, heading
    assert len(_blocks()) >= 4
    for block in _blocks():  # every block imports what it uses from the package itself
        assert "from fenchel_cvx" in block
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert (
        'pip install -e ".[test,bench,docs]" && pytest' in text
        and 'pip install -e ".[test,bench,docs]"' in ci
    )


@pytest.mark.slow  # the README trains its examples to the end
def test_oracle_example_runs_alone(capsys):
    out = _run_alone(_blocks()[0], capsys)
    held, accuracy = out[-1].split()
    assert held == "True" and float(accuracy) > 0.8  # the strict certificate held


@pytest.mark.slow
def test_minibatch_example_runs_alone(capsys):
    checked, accuracy = _run_alone(_blocks()[1], capsys)[-1].split()
    assert int(checked) >= 1 and float(accuracy) > 0.8


@pytest.mark.slow
def test_lenet5_example_runs_alone(capsys):
    out = _run_alone(_blocks()[2], capsys)
    assert out[0].startswith("LiftedNetwork(784-")
    assert any("conv2d 6@5x5 pad 2: (1, 28, 28) -> (6, 28, 28)" in line for line in out)
    assert float(out[-1]) > 0.7  # LeNet-5 after 4 batches of 250


@pytest.mark.slow
def test_estimator_example_runs_alone(capsys):
    assert float(_run_alone(_blocks()[3], capsys)[-1]) > 0.9
