"""The solvers and the driver read in small pieces: no function of ``fast/``, ``oracle/`` or the
driver's modules takes more than 8 parameters (``self`` not counted), except the public entry
points, which keep their keyword options as scikit-learn's estimators do (``fit_bcd`` and the
backends' constructors); no function body in ``fast/`` or ``oracle/`` runs over 50 lines (the
docstring not counted). A planted function of each kind is caught.
"""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "fenchel_cvx"
#: the driver's modules (Algorithms 1 and 2 and what they call)
DRIVER = ("bcd.py", "rounds.py", "pre_activations.py", "schedule.py", "run_settings.py")
#: public entry points with keyword options: (module, function's qualified name)
ENTRY_POINTS = {
    ("bcd.py", "fit_bcd"),
    ("fast/__init__.py", "FastBackend.__init__"),
    ("oracle/backend.py", "OracleBackend.__init__"),
}
MAX_PARAMS, MAX_BODY = 8, 50


def functions(source):
    """``(qualified name, parameters, body lines)`` of every function in ``source``."""
    out = []

    def visit(node, prefix):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                a = child.args
                params = [*a.posonlyargs, *a.args, *a.kwonlyargs]
                n = len(params) + (a.vararg is not None) + (a.kwarg is not None)
                if params and params[0].arg in ("self", "cls"):
                    n -= 1
                body = child.body
                if (
                    body
                    and isinstance(body[0], ast.Expr)
                    and isinstance(body[0].value, ast.Constant)
                ):
                    body = body[1:]  # the docstring
                lines = body[-1].end_lineno - body[0].lineno + 1 if body else 0
                out.append((f"{prefix}{child.name}", n, lines))
                visit(child, f"{prefix}{child.name}.")

    visit(ast.parse(source), "")
    return out


def modules():
    solvers = sorted(PACKAGE.glob("fast/*.py")) + sorted(PACKAGE.glob("oracle/*.py"))
    return [(p, True) for p in solvers] + [(PACKAGE / name, False) for name in DRIVER]


def offenders(path, solver, source=None):
    rel = path.relative_to(PACKAGE).as_posix()
    found = []
    for name, n, lines in functions(path.read_text() if source is None else source):
        if n > MAX_PARAMS and (rel, name) not in ENTRY_POINTS:
            found.append(f"{rel}: {name} takes {n} parameters")
        if solver and lines > MAX_BODY:
            found.append(f"{rel}: {name} has a body of {lines} lines")
    return found


def test_no_solver_or_driver_function_takes_more_than_8_parameters_or_50_lines():
    found = [o for path, solver in modules() for o in offenders(path, solver)]
    assert not found, "\n".join(found)


@pytest.mark.parametrize(
    "planted,expected",
    [
        ("def f(a, b, c, d, e, f, g, h, i):\n    return a\n", "f takes 9 parameters"),
        (
            "class C:\n    def step(self, a):\n" + "        a += 1\n" * 51,
            "C.step has a body of 51 lines",
        ),
    ],
)
def test_a_planted_long_function_is_caught(planted, expected):
    path = PACKAGE / "fast" / "planted.py"
    assert any(expected in o for o in offenders(path, True, planted))
    short = "def f(a, b, c, d, e, f, g, h):\n    '''doc'''\n" + "    a += 1\n" * 50
    assert not offenders(path, True, short)
