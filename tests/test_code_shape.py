"""The solvers and the driver read in small pieces: no function of ``fast/``, ``oracle/`` or the
driver's modules takes more than 8 parameters (``self`` not counted), except the public entry
points, which keep their keyword options as scikit-learn's estimators do (``fit_bcd`` and the
backends' constructors); no function body in ``fast/`` or ``oracle/`` runs over 50 lines (the
docstring not counted). A planted function of each kind is caught.

At least 82 % of the public functions are typed: every parameter (``self`` and ``cls`` aside,
``*args`` and ``**kwargs`` included) and the return annotated, none with a bare ``Any`` (alone
or in a union: an ``Any`` inside a container, ``dict[str, Any]``, counts as typed). Public: a
module-level function or a method of a public class (nested classes too) whose name does not
start with ``_``, in a module whose path has no part starting with ``_`` but ``__init__``. A
planted untyped function and a planted bare-``Any`` parameter are caught.
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
#: the least share of public functions that are typed
MIN_TYPED = 0.82


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


def bare_any(annotation):
    """Whether ``annotation`` is ``Any`` itself: the name, ``typing.Any``, the string ``"Any"``,
    or a union with one of them (``Any | None``, ``Optional[Any]``, ``Union[int, Any]``)."""
    if annotation is None:
        return False
    if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):
        try:
            annotation = ast.parse(annotation.value, mode="eval").body
        except SyntaxError:
            return False
    if isinstance(annotation, ast.Name):
        return annotation.id == "Any"
    if isinstance(annotation, ast.Attribute):
        return annotation.attr == "Any"
    if isinstance(annotation, ast.BinOp) and isinstance(annotation.op, ast.BitOr):
        return bare_any(annotation.left) or bare_any(annotation.right)
    if isinstance(annotation, ast.Subscript):
        head = annotation.value
        name = head.id if isinstance(head, ast.Name) else getattr(head, "attr", None)
        if name in ("Optional", "Union"):
            inner = annotation.slice
            members = inner.elts if isinstance(inner, ast.Tuple) else [inner]
            return any(bare_any(m) for m in members)
    return False


def typed(node, method):
    """Whether the function ``node`` (a method where ``method``) is typed (module doc)."""
    a = node.args
    params = [*a.posonlyargs, *a.args, *a.kwonlyargs]
    if method and params and params[0].arg in ("self", "cls"):
        params = params[1:]
    params += [p for p in (a.vararg, a.kwarg) if p is not None]
    annotations = [p.annotation for p in params] + [node.returns]
    return all(x is not None and not bare_any(x) for x in annotations)


def public_functions(source):
    """``(qualified name, typed)`` of every public function in ``source`` (module doc)."""
    out = []

    def visit(body, prefix, method):
        for node in body:
            if getattr(node, "name", "_").startswith("_"):  # private, or not a definition
                continue
            if isinstance(node, ast.ClassDef):
                visit(node.body, f"{prefix}{node.name}.", True)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                out.append((f"{prefix}{node.name}", typed(node, method)))

    visit(ast.parse(source).body, "", False)
    return out


def public_modules():
    """The package's modules whose path has no private part (``__init__`` is public)."""
    return [
        path
        for path in sorted(PACKAGE.rglob("*.py"))
        if not any(
            part.startswith("_") and part != "__init__"
            for part in path.relative_to(PACKAGE).with_suffix("").parts
        )
    ]


def test_at_least_82_percent_of_public_functions_are_typed():
    found = [
        (f"{path.relative_to(PACKAGE).as_posix()}: {name}", ok)
        for path in public_modules()
        for name, ok in public_functions(path.read_text())
    ]
    untyped = [name for name, ok in found if not ok]
    share = 1 - len(untyped) / len(found)
    assert share >= MIN_TYPED, (
        f"{len(found) - len(untyped)} of {len(found)} public functions typed ({share:.1%}, "
        f"at least {MIN_TYPED:.0%} wanted); untyped, among others:\n" + "\n".join(untyped[:40])
    )


def test_the_typed_count_catches_a_planted_untyped_function_and_a_bare_any():
    planted = """
import typing
from typing import Any, Optional

def untyped(a, b: int) -> int: ...
def no_return(a: int): ...
def bare(a: Any) -> int: ...
def bare_return(a: int) -> "Any": ...
def optional_any(a: Optional[Any] = None) -> None: ...
def union_any(a: int | Any) -> None: ...
def dotted_any(a: typing.Any) -> None: ...
def star(*args, **kwargs: int) -> None: ...
def typed(a: int, *args: str, b: dict[str, Any], **kwargs: float) -> list[Any]: ...
def _private(a): ...

class C:
    def method(self, a: int) -> None: ...
    @classmethod
    def make(cls) -> "C": ...
    def loose(self, a): ...
    class Inner:
        def deep(self, a: Any) -> None: ...

class _Hidden:
    def method(self, a): ...
"""
    assert dict(public_functions(planted)) == {
        "untyped": False,
        "no_return": False,
        "bare": False,
        "bare_return": False,
        "optional_any": False,
        "union_any": False,
        "dotted_any": False,
        "star": False,
        "typed": True,
        "C.method": True,
        "C.make": True,
        "C.loose": False,
        "C.Inner.deep": False,
    }
