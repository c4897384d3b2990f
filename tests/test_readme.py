"""The README's Python examples run as written (a README that lies fails here first)."""
import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"


@pytest.mark.slow   # the README trains its examples to the end
def test_readme_python_blocks_run(capsys):
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    assert len(blocks) >= 2
    scope = {}
    for code in blocks:
        exec(compile(code, str(README), "exec"), scope)   # later blocks reuse earlier names
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("True ")                      # the oracle run's certificate held
    lenet = next(i for i, line in enumerate(out) if line.startswith("LiftedNetwork(784-"))
    checked, accuracy = out[lenet - 1].split()             # the fast backend's mini-batches
    assert int(checked) >= 1 and float(accuracy) > 0.8
    assert any("conv2d 6@5x5 pad 2: (1, 28, 28) -> (6, 28, 28)" in line for line in out)
    assert float(out[-1]) > 0.7                            # LeNet-5 after 4 batches of 250
