"""Blocks dispatch by type, never by ``kind`` strings (the design rule of ``fenchel_cvx.blocks``).

The package source holds no comparison, membership test, prefix test or table lookup on a
``kind``; a block whose ``kind`` says something else is solved, polished, certified and written
as a CVXPY problem exactly as before; a subclass is served by its base class's registrations;
a class nobody registered is refused by name. (``import fenchel_cvx, fenchel_cvx.fast`` leaving
CVXPY unimported is tested in ``test_backends.py``.)
"""

import ast
import dataclasses
from pathlib import Path

import numpy as np
import pytest

from conftest import make_problem
from fenchel_cvx.blocks import Block, WHidden, WLast, XHidden, XLast, w_block, x_block
from fenchel_cvx.fast import FastBackend

PACKAGE = Path(__file__).resolve().parents[1] / "fenchel_cvx"


# --- the source scan -------------------------------------------------------------------------
def _is_kind(node):
    """``kind`` or ``<expr>.kind`` (a NumPy ``<expr>.dtype.kind`` is not a block kind)."""
    if isinstance(node, ast.Name):
        return node.id == "kind"
    return (
        isinstance(node, ast.Attribute)
        and node.attr == "kind"
        and not (isinstance(node.value, ast.Attribute) and node.value.attr == "dtype")
    )


def kind_branches(source):
    """Line numbers where ``source`` branches on a kind: ``kind ==``, ``!=``, ``in``, ``not in``
    (either side), ``kind.startswith``/``endswith``, ``kind[...]``, ``TABLE[x.kind]`` and
    ``TABLE.get(x.kind)``."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare) and any(
            _is_kind(side) for side in [node.left, *node.comparators]
        ):
            lines.append(node.lineno)
        elif (
            isinstance(node, ast.Attribute)
            and node.attr in ("startswith", "endswith")
            and _is_kind(node.value)
        ):
            lines.append(node.lineno)
        elif isinstance(node, ast.Subscript) and (
            _is_kind(node.value) or (isinstance(node.slice, ast.Attribute) and _is_kind(node.slice))
        ):
            lines.append(node.lineno)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "get"
            and node.args
            and isinstance(node.args[0], ast.Attribute)
            and _is_kind(node.args[0])
        ):
            lines.append(node.lineno)
    return sorted(set(lines))


BRANCHES = [
    'if block.kind == "x_hidden": pass',
    'x = kind in ("x_hidden", "x_last")',
    'y = block.kind.startswith("w")',
    'z = "w_last" != b.kind',
    "f = TABLE[block.kind]",
    'g = b.kind not in ("w_last",)',
    "h = TABLE.get(block.kind, None)",
    'kind = block.kind\nif kind != "w": pass',
    'e = b.kind[0] == "x"',
]
NOT_BRANCHES = [
    'ok = A.dtype.kind in "biu"',
    'raise SolverError(block.kind, block.layer, "s")',
    'd = {"kind": self.kind}',
    'msg = f"the {block.kind} block"',
    'LAYERS[d["kind"]]',
    'kind = "x_hidden"',
]


@pytest.mark.parametrize("source", BRANCHES)
def test_scan_finds_every_form_of_kind_branch(source):
    assert kind_branches(source), source


@pytest.mark.parametrize("source", NOT_BRANCHES)
def test_scan_leaves_kind_as_a_name_alone(source):
    assert kind_branches(source) == [], source


def test_package_never_branches_on_kind():
    found = {
        str(p.relative_to(PACKAGE.parent)): kind_branches(p.read_text())
        for p in sorted(PACKAGE.rglob("*.py"))
    }
    found = {path: lines for path, lines in found.items() if lines}
    assert found == {}, f"branches on kind strings (dispatch on the block's class): {found}"


# --- kind is a name only ---------------------------------------------------------------------
def _blocks(loss):
    """The four blocks of a 2-hidden-layer network (W-blocks with a proximal term)."""
    net, X0, Y, Xs = make_problem(
        (3, 4, 3, 2), act="sigmoid", loss=loss, lam=[0.8, 1.7], rho=[0.1, 0.3, 0.2], m=5, seed=3
    )
    W0 = [W + 0.1 for W in net.W]
    return [
        x_block(net, X0, Y, Xs, 1),
        x_block(net, X0, Y, Xs, 2),
        w_block(net, X0, Y, Xs, 1, gamma=0.5, W0=W0[1]),
        w_block(net, X0, Y, Xs, 2, gamma=0.5, W0=W0[2]),
    ]


def _renamed(block):
    """The same block as an instance of a subclass whose ``kind`` names nothing known."""
    cls = type(f"Renamed{type(block).__name__}", (type(block),), {"kind": "renamed"})
    return cls(**{f.name: getattr(block, f.name) for f in dataclasses.fields(block)})


def _outcome(block):
    from fenchel_cvx.oracle import OracleBackend, block_problem, certify, polish_block

    fast = FastBackend(tol=1e-10, max_iter=2000).solve(block)
    oracle = OracleBackend(tol=1e-8).solve(block)
    start = fast.argmin + 1e-3 * np.cos(np.arange(fast.argmin.size)).reshape(block.shape)
    polished, steps = polish_block(block, block.project(start), 1e-11)
    cert = certify(block, fast.argmin)
    problem, var = block_problem(block)
    problem.solve(solver="CLARABEL")
    return dict(
        fast=(fast.argmin, fast.value, fast.iterations, fast.info.get("method")),
        oracle=(oracle.argmin, oracle.value, oracle.info["solver"], oracle.info["n_subproblems"]),
        polish=(polished, steps),
        certify=(cert.objective, cert.lower_bound, cert.bound),
        problem=(var.shape, problem.value),
    )


@pytest.mark.parametrize("loss", ["mse", "cross_entropy"])
def test_a_block_is_served_by_its_class_whatever_its_kind(loss):
    for block in _blocks(loss):
        renamed = _renamed(block)
        assert renamed.kind == "renamed" and isinstance(renamed, type(block))
        assert renamed.shape == block.shape and renamed.piece_axis == block.piece_axis
        before, after = _outcome(block), _outcome(renamed)
        for what in ("fast", "oracle", "polish", "certify"):
            for a, b in zip(before[what], after[what]):
                np.testing.assert_array_equal(a, b, err_msg=f"{type(block).__name__} {what}")
        assert before["problem"][0] == after["problem"][0]
        np.testing.assert_allclose(before["problem"][1], after["problem"][1], rtol=1e-6)


# --- an unknown class ------------------------------------------------------------------------
@dataclasses.dataclass
class Stray(Block):
    """A block class that no backend registered."""

    layer: int
    U_prev: object
    kind = "stray"


def test_an_unregistered_block_class_is_refused_by_name():
    from fenchel_cvx.oracle import OracleBackend, block_problem

    block = Stray(1, np.zeros((2, 3)))
    with pytest.raises(ValueError, match="block must be one of XHidden, XLast, WHidden, WLast"):
        OracleBackend().solve(block)
    with pytest.raises(ValueError, match="got Stray"):
        FastBackend().solve(block, start=np.zeros((2, 3)))
    with pytest.raises(TypeError, match="Stray"):
        block_problem(block)


def test_the_four_classes_are_two_families():
    from fenchel_cvx.blocks import WBlock, XBlock

    assert issubclass(XHidden, XBlock) and issubclass(XLast, XBlock)
    assert issubclass(WHidden, WBlock) and issubclass(WLast, WBlock)
    assert not issubclass(XHidden, WBlock) and not issubclass(WLast, XBlock)
