"""No module branches on an activation's or a loss's name, nor keeps a table keyed by names,
outside the registries (``activations.ACTIVATIONS``, ``losses.LOSSES``): solvers ask the class
for the fact (``fenchel_cvx.facts``).

The test reads every module of the package as a syntax tree and flags, for each registered
name (the extensions' included): a comparison with it (``x.name == "relu"``, ``name in ("mse",
"huber")``), a dict keyed by names (all its keys, or two or more), and a tuple, list or set of
two or more of them; and any comparison or lookup by an activation's or a loss's ``name``
attribute (``act.name in PROX``, ``TABLE[block.loss.name]``, ``TABLE.get(act.name)``). Names in
docstrings, defaults (``activation="relu"``) and the classes' own ``name`` are not branches.
"""

import ast
import re
from pathlib import Path

from fenchel_cvx.activations import ACTIVATIONS
from fenchel_cvx.losses import LOSSES

PACKAGE = Path(__file__).resolve().parent.parent / "fenchel_cvx"
NAMES = frozenset(ACTIVATIONS) | frozenset(LOSSES)


def _names_in(node):
    """The registered names among a tuple / list / set of string constants (else none)."""
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return [
            e.value
            for e in node.elts
            if isinstance(e, ast.Constant) and isinstance(e.value, str) and e.value in NAMES
        ]
    return []


def _is_name(node):
    return isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in NAMES


#: an expression that holds an activation or a loss: its ``.name`` is a registered name
OWNER = re.compile(r"(^|\.)(act\w*|activation\w*|loss\w*)$")


def _is_name_attr(node):
    """``act.name``, ``block.act_in.name``, ``net.loss.name``, ..."""
    return (
        isinstance(node, ast.Attribute)
        and node.attr == "name"
        and bool(OWNER.search(ast.unparse(node.value)))
    )


def name_uses(source):
    """``(line, what)`` for every branch on, or table of, registered names in ``source``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(_is_name(s) or _names_in(s) or _is_name_attr(s) for s in sides):
                found.append((node.lineno, "comparison with a name"))
        elif isinstance(node, ast.Subscript) and _is_name_attr(node.slice):
            found.append((node.lineno, "lookup by a name"))
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "get"
            and node.args
            and _is_name_attr(node.args[0])
        ):
            found.append((node.lineno, "lookup by a name"))
        elif isinstance(node, ast.Dict):
            keyed = sum(k is not None and _is_name(k) for k in node.keys)
            if keyed >= 2 or (keyed and keyed == len(node.keys)):
                found.append((node.lineno, "dict keyed by names"))
        elif isinstance(node, (ast.Tuple, ast.List, ast.Set)) and len(_names_in(node)) >= 2:
            found.append((node.lineno, "table of names"))
    return found


def _modules():
    return sorted(p for p in PACKAGE.rglob("*.py"))


def test_the_scanner_finds_each_kind_of_name_use():
    src = (
        'if act.name == "relu": pass\n'
        'x = {"mse": 1}\n'
        'y = ("sigmoid", "tanh")\n'
        'z = loss.name in ("cross_entropy",)\n'
        "w = PROX.get(block.act_in.name, 1.0)\n"
        "v = TABLE[net.loss.name]\n"
        "u = block.act_out.name in PROX\n"
        'def f(activation="relu"):\n    """relu and mse"""\n'
        'ok = {"monotone": "activations", "fit": "bcd"}, path.name, DTYPES[dtype.name]\n'
    )
    assert sorted(line for line, _ in name_uses(src)) == [1, 2, 3, 4, 5, 6, 7]
    assert "elu" in NAMES and "huber" in NAMES  # the extensions are registered


def test_no_module_branches_on_activation_or_loss_names():
    report = {}
    for path in _modules():
        rel = path.relative_to(PACKAGE).as_posix()
        uses = name_uses(path.read_text())
        if uses:
            report[rel] = uses
    assert not report, f"branches on activation / loss names: {report}"
