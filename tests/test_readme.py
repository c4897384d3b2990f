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
    checked, accuracy = out[-1].split()
    assert int(checked) >= 1 and float(accuracy) > 0.8
