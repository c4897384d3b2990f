"""``bcd.algorithm_1`` and ``bcd.algorithm_2`` read line by line like the paper's pseudo-code.

The paper's Algorithms 1 and 2 are tabulated line by line on docs/mathematics.md ("Algorithms 1
and 2"). Each function names every line of its algorithm in a comment (``# line N: ...`` or
``# lines N-M: ...``), in the paper's order, each comment directly before the statements that
carry it out, and its body (the docstring aside) is at most 40 lines.
"""

import ast
import io
import re
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BCD = ROOT / "fenchel_cvx" / "bcd.py"
NAMED = re.compile(r"#\s*lines?\s+(\d+)(?:\s*-\s*(\d+))?\s*:")
BODY_MAX = 40


def _paper_lines():
    """{1: the number of lines of Algorithm 1, 2: of Algorithm 2} from the docs' table."""
    text = (ROOT / "docs" / "mathematics.md").read_text(encoding="utf-8")
    section = text.split("## Algorithms 1 and 2", 1)[1].split("\n## ", 1)[0]
    rows = [r.split("|")[1:-1] for r in section.splitlines() if re.match(r"\|\s*\d+\s*\|", r)]
    return {k: max(int(r[0]) for r in rows if r[k].strip()) for k in (1, 2)}


def _function(source, name):
    return next(
        n for n in ast.parse(source).body if isinstance(n, ast.FunctionDef) and n.name == name
    )


def named_lines(source, name):
    """The (source line, [paper lines]) of the comments naming the paper's lines in ``name``."""
    fn = _function(source, name)
    out = []
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT and fn.lineno <= tok.start[0] <= fn.end_lineno:
            match = NAMED.match(tok.string)
            if match:
                first, last = int(match.group(1)), int(match.group(2) or match.group(1))
                out.append((tok.start[0], list(range(first, last + 1))))
    return out


def check(source, name, n_lines):
    """The rules of the module doc for the function ``name`` of ``source``; -> what fails."""
    fn, lines = _function(source, name), source.splitlines()
    problems = []
    body = fn.body[1:] if isinstance(fn.body[0], ast.Expr) else fn.body  # the docstring aside
    size = fn.end_lineno - body[0].lineno + 1
    if size > BODY_MAX:
        problems.append(f"body of {size} lines")
    named = named_lines(source, name)
    order = [n for _, ns in named for n in ns]
    if order != list(range(1, n_lines + 1)):
        problems.append(f"lines named {order}, the paper's are 1..{n_lines}")
    for at, _ in named:  # the next line that is not a comment is a statement, right below
        following = next(s for s in lines[at:] if not s.strip().startswith("#"))
        if not following.strip():
            problems.append(f"the comment at line {at} precedes no statement")
    return problems


@pytest.mark.parametrize("k", [1, 2])
def test_each_algorithm_names_every_line_of_the_paper_in_order(k):
    source = BCD.read_text(encoding="utf-8")
    assert check(source, f"algorithm_{k}", _paper_lines()[k]) == []


def test_the_table_has_the_papers_lines():
    assert _paper_lines() == {1: 13, 2: 16}


def test_a_line_left_out_or_out_of_order_or_away_from_its_statements_fails():
    source = BCD.read_text(encoding="utf-8")
    n = _paper_lines()[1]
    dropped = re.sub(r"# line 9:", "# the W_L block:", source, count=1)
    assert any("lines named" in p for p in check(dropped, "algorithm_1", n))
    swapped = source.replace("# line 5:", "# line X:", 1).replace("# line 9:", "# line 5:", 1)
    swapped = swapped.replace("# line X:", "# line 9:", 1)
    assert any("lines named" in p for p in check(swapped, "algorithm_1", n))
    apart = source.replace("            r.w_block(L)\n", "\n            r.w_block(L)\n", 1)
    assert any("precedes no statement" in p for p in check(apart, "algorithm_1", n))
    padded = source.replace("    L, step = net.n_hidden, None\n", "    pass\n" * 41, 1)
    assert any("body of" in p for p in check(padded, "algorithm_1", n))
