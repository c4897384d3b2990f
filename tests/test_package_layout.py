"""The package's layout: no import circle, a driver module that is only the driver, backends
that implement one protocol, a certificate handed what it checks, the data checked once per
run, and the renamed names' deprecated aliases (each warns and gives what the new name gives).
"""

import ast
import importlib
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

from fenchel_cvx import LiftedNetwork, bcd, fit_bcd
from fenchel_cvx.backends import Backend, BackendDefaults, as_backend, get_backend
from fenchel_cvx.blocks import x_block
from fenchel_cvx.fast import FastBackend
from fenchel_cvx.oracle import OracleBackend

PACKAGE = Path(__file__).resolve().parents[1] / "fenchel_cvx"


def _modules(root):
    """``{dotted name: path}`` of every module of the package at ``root``."""
    out = {}
    for path in root.rglob("*.py"):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def import_graph(root):
    """``{module: modules of the package it imports}``, from every import statement, those
    inside functions included (a lazy import is an edge too)."""
    modules, graph = _modules(root), {}
    for name, path in modules.items():
        package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        deps = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                base = (
                    ".".join(
                        package[: len(package) - node.level + 1]
                        + ([node.module] if node.module else [])
                    )
                    if node.level
                    else node.module or ""
                )
                for alias in node.names:
                    full = f"{base}.{alias.name}"
                    deps.add(full if full in modules else base)
            elif isinstance(node, ast.Import):
                deps.update(alias.name for alias in node.names)
        graph[name] = {d for d in deps if d in modules and d != name}
    return graph


def circles(graph):
    """The import circles of ``graph``: its strongly connected components of two or more."""
    index, low, stack, on, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_the_package_has_no_import_circle():
    graph = import_graph(PACKAGE)
    assert "fenchel_cvx.io" in graph["fenchel_cvx.network"]  # the graph sees the imports
    assert "fenchel_cvx.network" not in graph["fenchel_cvx.io"]  # io is handed the class
    assert circles(graph) == []


def test_the_circle_finder_finds_a_lazy_circle(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from .b import f\n")
    (pkg / "b.py").write_text("def f():\n    from . import a\n")  # inside a function
    (pkg / "c.py").write_text("from pkg import a\n")
    assert circles(import_graph(pkg)) == [["pkg.a", "pkg.b"]]


def test_bcd_is_the_driver_only():
    source = (PACKAGE / "bcd.py").read_text(encoding="utf-8")
    assert len(source.splitlines()) <= 400
    defined = {
        n.name for n in ast.parse(source).body if isinstance(n, (ast.FunctionDef, ast.ClassDef))
    }
    assert {"fit_bcd", "algorithm_1", "algorithm_2"} <= defined
    # a round's blocks and checks live in their own module, importable from bcd
    assert bcd.Round.__module__ == "fenchel_cvx.rounds"
    # argument checks, checkpoints and observers live in their own modules
    assert not defined & {
        "validate_run",
        "restore",
        "save_checkpoint",
        "ProgressBar",
        "CheckpointWriter",
        "check_arguments",
    }


def test_the_driver_neither_writes_the_certificate_nor_calls_its_private_methods():
    for name in ("bcd.py", "rounds.py", "block_checks.py"):
        tree = ast.parse((PACKAGE / name).read_text(encoding="utf-8"))
        written = {
            t.attr
            for n in ast.walk(tree)
            if isinstance(n, ast.Assign)
            for t in n.targets
            if isinstance(t, ast.Attribute)
        }
        called = {
            n.func.attr
            for n in ast.walk(tree)
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
        }
        assert "restarted" not in written and "_fail" not in called, name
    # the certificate is handed what it checks: it imports no network and no block
    graph = import_graph(PACKAGE)
    assert not graph["fenchel_cvx.certificate"] & {"fenchel_cvx.network", "fenchel_cvx.blocks"}


def test_backends_implement_the_protocol():
    for backend in (FastBackend(), OracleBackend()):
        assert isinstance(backend, Backend) and as_backend(backend) is backend
    fast = FastBackend(w_steps=(2, 3))
    net = LiftedNetwork([3, 4, 2], seed=0)
    X, Y = np.ones((3, 5)), np.eye(2)[:, [0, 1, 0, 1, 0]]
    block = x_block(net, X, Y, net.forward(X)[0], 1)
    assert fast.step_setting(block) == ("x_steps", None)
    assert OracleBackend().step_setting(block)[1] is None
    assert OracleBackend().on_compile(print)() is None  # compiles nothing: never calls
    with pytest.raises(ValueError, match="w_steps must have one entry per block"):
        get_backend(FastBackend(w_steps=(1, 2, 3)), net)  # check_network, before any work

    class SolveOnly:
        tol = 1e-3

        def solve(self, block, start=None):
            return "solved"

        settings = {"not": "a method"}

    adapted = get_backend(SolveOnly())
    assert isinstance(adapted, Backend) and adapted.name == "SolveOnly" and adapted.tol == 1e-3
    assert adapted.settings() == {} and adapted.step_setting(block) == ("steps", None)
    assert adapted.solve(block) == "solved" and adapted.threads is None

    class Subclass(BackendDefaults):
        def solve(self, block, start=None):
            return None

    assert as_backend(Subclass()).name == "Subclass"


def test_the_data_is_checked_once_per_run(monkeypatch):
    rng = np.random.default_rng(0)
    X, Y = rng.standard_normal((3, 12)), np.eye(2)[:, rng.integers(0, 2, 12)]
    calls = []
    real = LiftedNetwork.check_inputs
    monkeypatch.setattr(
        LiftedNetwork, "check_inputs", lambda self, *a, **k: calls.append(1) or real(self, *a, **k)
    )
    counts = []
    for iterations in (1, 4):
        calls.clear()
        fit_bcd(
            LiftedNetwork([3, 4, 2], seed=0),
            X,
            Y,
            iterations=iterations,
            backend="fast",
            X_test=X,
            Y_test=Y,
        )
        counts.append(len(calls))
    assert counts[0] == counts[1] == 2  # the training data and the test data, once each


def test_renamed_names_keep_a_deprecated_alias():
    from fenchel_cvx import backends
    from fenchel_cvx.schedule import schedule

    step = schedule(6, 3, 1, 0, 1, seed=0)[0]
    with pytest.warns(DeprecationWarning, match="Step.columns"):
        assert step.idx is step.columns
    with pytest.warns(DeprecationWarning, match="STRICT_AWARE"):
        assert backends.STRICT_AWARE == {"cvxpy"}
    with pytest.warns(DeprecationWarning, match="optional"):
        assert bcd.optional(FastBackend(), "forget") is not None
    net = LiftedNetwork([3, 4, 2], seed=0)
    X, Y = np.ones((3, 5)), np.eye(2)[:, [0, 1, 0, 1, 0]]
    block = x_block(net, X, Y, net.forward(X)[0], 1)
    with pytest.warns(DeprecationWarning, match="step_setting"):
        assert FastBackend().steps_of(block) == FastBackend().step_setting(block)
    Z = net.forward(X)[0][0]
    with pytest.warns(DeprecationWarning, match="value_with_forward"):
        assert block.value_at(Z, block.forward(Z)) == block.value_with_forward(Z, block.forward(Z))
    layer = net.layers[0]
    U = net.pre_activation(0, X)
    with pytest.warns(DeprecationWarning, match="to_rows"):
        assert np.array_equal(layer.rows(U), layer.to_rows(U))
    with pytest.warns(DeprecationWarning, match="from_rows"):
        assert np.array_equal(layer.unrows(U, 5), layer.from_rows(U, 5))


def test_the_old_module_name_units_imports_with_a_warning(monkeypatch):
    from fenchel_cvx.paper_hyperparameters import from_reference

    monkeypatch.delitem(sys.modules, "fenchel_cvx.units", raising=False)
    with pytest.warns(DeprecationWarning, match="paper_hyperparameters"):
        units = importlib.import_module("fenchel_cvx.units")
    assert units.from_reference is from_reference
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        importlib.import_module("fenchel_cvx.paper_hyperparameters")  # the new name: quiet
