"""Rules the test suite itself keeps, checked on its source.

No test compares a measured duration, or a ratio of durations, with a number. Speed is
measured by the benchmarks; a test that asserts "this took under 20 s" (or "over 0 s") fails
on a loaded or a fast machine without anything being wrong. Waiting for something to happen is
another matter: a deadline in a ``while`` loop's condition is a hang guard and is allowed, and
so is a ``timeout=`` argument.

The rule, on the AST of every ``tests/*.py``, has two halves: durations the test measures with a
clock (traced through names), and durations it reads by name (from a report, a result object or
a program's output).

Clock readings:

- A *clock call* is a call of ``time.time``, ``time.perf_counter``, ``time.monotonic``,
  ``time.process_time``, ``time.thread_time``, ``time.clock_gettime`` (each also with ``_ns``),
  ``datetime.datetime.now`` / ``utcnow`` / ``today``, ``datetime.date.today``, ``timeit.timeit`` /
  ``repeat`` / ``default_timer`` / ``Timer``, ``os.times`` or ``resource.getrusage``, whatever the
  module's imports call them (``from time import perf_counter as pc``: ``pc()``).
- An expression is *clock-derived* if it contains a clock call or a clock-derived name. A name
  is clock-derived in a function (or the module, or a class body) if it is bound there, or in a
  scope around it, by an assignment (``=``, ``+=``, annotated, ``:=``, a ``for`` target) from a
  clock-derived expression; a container that gets one appended (``.append``, ``.extend``,
  ``.insert``, ``.add``) is too, and so is a function that returns one. Differences, ratios,
  ``max``/``min``/``sum`` of such values follow: they contain the names.
- An expression is *numeric* if it is a number (not a bool), a sign or arithmetic of numerics,
  ``pytest.approx`` of one, or a name bound in scope only to numerics.
- A comparison is flagged when one of its operands is clock-derived and another is numeric or
  clock-derived: ``elapsed < 20``, ``t1 - t0 < LIMIT``, ``fast < 2 * slow``,
  ``elapsed == pytest.approx(1)``. So is a call of a comparing function (``math.isclose``,
  ``numpy.isclose``/``allclose``, ``numpy.testing``'s ``assert_allclose``, ``assert_array_less``
  and kin, unittest's ``assertLess`` and kin: ``COMPARING``) with such a pair among its arguments.

Durations by name:

- An identifier *denotes a duration* when, split into lower-case words (at ``_``, any other
  non-alphanumeric character and camelCase humps), it has one of the words ``seconds``, ``secs``,
  ``elapsed``, ``duration(s)``, ``wall``, ``walltime``, ``latency``, ``timing(s)``, ``ms``
  (``ms_per_batch``), ``per second`` (a rate: ``images_per_second``), or ``time`` as its first or
  last word (``time_to_97``, ``wall_time``, ``time``). A ratio ``A_over_B`` denotes one when ``A``
  or ``B`` does (``fit_time_over_load``). ``timeout``, ``times`` (a count), ``timestamp``,
  ``runtime_error``, ``datetime`` are other words; ``second`` alone is an ordinal
  (``first, second = run(), run()``).
- An expression is a *duration by name* if it contains, outside the arguments of ``len(...)``
  and the ``.shape`` / ``.size`` / ``.ndim`` of an array (those count entries:
  ``len(r["seconds"]) == 15`` is about epochs, not time), a subscript with a string key that
  denotes a duration (``row["seconds_per_epoch"]``), an attribute that does (``r.seconds``; not a
  module's, such as ``time.time``), a name that does (not an imported module's), a call with a
  string argument that does (``run.series("seconds")``, ``d.get("elapsed")``), or a name bound in
  scope from a duration by name (``t = row["seconds_per_epoch"]``, ``for s in r.seconds``), as
  for clock-derived names.
- A comparison of a duration by name with a numeric operand is flagged when it orders them
  (``<``, ``<=``, ``>``, ``>=``, ``!=``) or compares them within a tolerance (``pytest.approx``):
  ``row["seconds_per_epoch"] > 0``, ``np.diff(r.seconds) > 0``, ``0 < s[0] <= s[-1]``,
  ``r["compile_seconds_over_eager"] < 2``. So is a comparing call (``COMPARING``) with such a pair
  among its arguments, except the exact ones (``assert_equal``, ``assert_array_equal``,
  ``assertEqual``). An exact ``==`` with a plain number is allowed: a measured duration never
  equals a given number, so the test is reading back data it wrote (a fixture's ``3.0``).

Not flagged, for both halves: a comparison inside a ``while`` loop's condition (``while
proc.poll() is None and time.time() < deadline``: it only bounds a wait), a clock value or a
duration compared with something neither numeric nor clock-derived (a timestamp's text with a
folder's name; a stored ratio with the quotient of the two durations it is computed from,
``r["fln_over_adam_seconds"] == pytest.approx(r["fln_seconds"] / r["adam_seconds"])``), and a
count of durations (``len(...)``). The clock half has no exact-``==`` exception.
To record that a duration was measured, assert that it is there and finite
(``isinstance(s, float) and math.isfinite(s)``), or that there is one per epoch (``len``).

An ``if time.time() > deadline: break`` inside the loop is flagged: write the deadline into the
``while`` condition. The analysis is local and syntactic: names from other modules are not
followed, a duration under a name the words above miss is out of its sight, and so are two
durations by name compared with each other (``r["fast_seconds"] < 2 * r["slow_seconds"]``;
their quotient compared with a number, ``r["fast_seconds"] / r["slow_seconds"] < 2``, it sees).
Its over-approximations (a name clock-derived in one branch is clock-derived everywhere in its
scope; ``time_limit`` reads as a duration) fail loudly, naming the line.
"""

import ast
import re
import textwrap
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent

CLOCKS = frozenset(
    {
        f"time.{name}{suffix}"
        for name in (
            "time",
            "perf_counter",
            "monotonic",
            "process_time",
            "thread_time",
            "clock_gettime",
        )
        for suffix in ("", "_ns")
    }
    | {
        "datetime.datetime.now",
        "datetime.datetime.utcnow",
        "datetime.datetime.today",
        "datetime.date.today",
        "timeit.timeit",
        "timeit.repeat",
        "timeit.default_timer",
        "timeit.Timer",
        "os.times",
        "resource.getrusage",
    }
)
#: functions that compare their arguments (the last part of the called name)
COMPARING = frozenset(
    {
        "isclose",
        "allclose",
        "assert_allclose",
        "assert_almost_equal",
        "assert_approx_equal",
        "assert_array_almost_equal",
        "assert_array_less",
        "assert_array_equal",
        "assert_equal",
        "assertLess",
        "assertLessEqual",
        "assertGreater",
        "assertGreaterEqual",
        "assertAlmostEqual",
        "assertEqual",
    }
)
#: comparing functions that test exact equality (a duration by name may meet a number in them)
EXACT = frozenset({"assert_equal", "assert_array_equal", "assertEqual"})
APPENDS = frozenset({"append", "extend", "insert", "add", "appendleft"})
SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
#: words that make an identifier denote a duration (the module doc's list)
DURATION_WORDS = frozenset(
    {
        "seconds",
        "secs",
        "elapsed",
        "duration",
        "durations",
        "wall",
        "walltime",
        "latency",
        "timing",
        "timings",
        "ms",
    }
)
#: attributes that count an array's entries (like ``len``)
COUNTS = frozenset({"shape", "size", "ndim"})
ORDERS = (ast.Lt, ast.LtE, ast.Gt, ast.GtE, ast.NotEq)


def denotes_duration(identifier):
    """Whether a name, attribute or string key denotes a duration (the module doc's words)."""
    humps = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", identifier).lower()
    words = [w for w in re.split(r"[^a-z0-9]+", humps) if w]
    parts = [[]]  # A_over_B: each side on its own
    for word in words:
        if word == "over":
            parts.append([])
        else:
            parts[-1].append(word)
    return any(
        DURATION_WORDS.intersection(part)
        or "time" in (part[0], part[-1])
        or ("per", "second") in zip(part, part[1:])
        for part in parts
        if part
    )


def _imports(tree):
    """Each name the module's imports bind (anywhere in it), to the dotted name it stands for."""
    names = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    names[alias.asname] = alias.name
                else:
                    top = alias.name.split(".")[0]
                    names[top] = top
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:
                names[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    return names


def _dotted(node, imports):
    """The dotted name of ``a.b.c`` with ``a`` resolved through the imports, or None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name) or node.id not in imports:
        return None
    return ".".join([imports[node.id], *reversed(parts)])


def _own_nodes(scope):
    """The nodes of a scope's body, not entering the functions and classes defined in it
    (those are yielded, not walked)."""
    todo = list(scope.body)  # (a def's decorators and defaults are left out)
    while todo:
        node = todo.pop()
        yield node
        if not isinstance(node, SCOPES):
            todo.extend(ast.iter_child_nodes(node))


def _targets(target):
    """The names an assignment target binds (a subscript or attribute binds its base)."""
    if isinstance(target, ast.Name):
        return [target.id]
    if isinstance(target, (ast.Tuple, ast.List)):
        return [n for t in target.elts for n in _targets(t)]
    if isinstance(target, ast.Starred):
        return _targets(target.value)
    if isinstance(target, (ast.Subscript, ast.Attribute)):
        base = target.value
        while isinstance(base, (ast.Subscript, ast.Attribute)):
            base = base.value
        return [base.id] if isinstance(base, ast.Name) else []
    return []


def _bindings(node):
    """``(names, value)`` pairs of what a statement or expression node binds."""
    if isinstance(node, ast.Assign):
        return [(_targets(t), node.value) for t in node.targets]
    if isinstance(node, (ast.AugAssign, ast.AnnAssign)) and node.value is not None:
        return [(_targets(node.target), node.value)]
    if isinstance(node, ast.NamedExpr):
        return [(_targets(node.target), node.value)]
    if isinstance(node, (ast.For, ast.AsyncFor, ast.comprehension)):
        return [(_targets(node.target), node.iter)]
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in APPENDS
    ):
        return [(_targets(node.func), arg) for arg in node.args]
    return []


class _Checker:
    def __init__(self, tree):
        self.imports = _imports(tree)
        self.found = []  # (line, reason)
        self._scope(tree, frozenset(), frozenset(), frozenset())

    def _holds(self, expr, names, seed):
        """Whether ``expr`` holds a node ``seed`` accepts or a name of ``names``, outside
        ``len(...)`` and ``.shape``/``.size``/``.ndim`` (counts of entries)."""
        todo = [expr]
        while todo:
            node = todo.pop()
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "len":
                continue
            if isinstance(node, ast.Attribute) and node.attr in COUNTS:
                continue
            if (isinstance(node, ast.Name) and node.id in names) or seed(node):
                return True
            todo.extend(ast.iter_child_nodes(node))
        return False

    def _clock_call(self, node):
        return isinstance(node, ast.Call) and _dotted(node.func, self.imports) in CLOCKS

    def _named(self, node):
        """A subscript, attribute, name or call argument whose name denotes a duration."""
        if isinstance(node, ast.Name):
            return node.id not in self.imports and denotes_duration(node.id)
        if isinstance(node, ast.Attribute):
            return _dotted(node, self.imports) is None and denotes_duration(node.attr)
        keys = []
        if isinstance(node, ast.Subscript):
            keys = [node.slice]
        elif isinstance(node, ast.Call):
            keys = node.args
        return any(
            isinstance(k, ast.Constant) and isinstance(k.value, str) and denotes_duration(k.value)
            for k in keys
        )

    def clock(self, expr, clocks):
        return self._holds(expr, clocks, self._clock_call)

    def duration(self, expr, durations):
        return self._holds(expr, durations, self._named)

    def numeric(self, expr, numbers):
        if isinstance(expr, ast.Constant):
            return isinstance(expr.value, (int, float)) and not isinstance(expr.value, bool)
        if isinstance(expr, ast.UnaryOp):
            return isinstance(expr.op, (ast.USub, ast.UAdd)) and self.numeric(expr.operand, numbers)
        if isinstance(expr, ast.BinOp):
            return self.numeric(expr.left, numbers) and self.numeric(expr.right, numbers)
        if isinstance(expr, ast.Name):
            return expr.id in numbers
        if self._approx(expr):
            return bool(expr.args) and self.numeric(expr.args[0], numbers)
        return False

    def _approx(self, expr):
        return isinstance(expr, ast.Call) and _dotted(expr.func, self.imports) == "pytest.approx"

    def _names(self, scope, clocks, durations, numbers):
        """The scope's clock-derived, duration and numeric names, given those of the scopes
        around it."""
        own_clocks, own_durations, numeric, other = set(), set(), set(), set()
        changed = True
        while changed:
            changed = False
            env, denv = clocks | own_clocks, durations | own_durations
            for node in _own_nodes(scope):
                pairs = _bindings(node)
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    returns = [
                        n.value
                        for n in _own_nodes(node)
                        if isinstance(n, ast.Return) and n.value is not None
                    ]
                    inner, inner_d, _ = self._names(node, env, denv, numbers)
                    for own, test, names in (
                        (own_clocks, self.clock, inner),
                        (own_durations, self.duration, inner_d),
                    ):
                        if node.name not in own and any(test(r, names) for r in returns):
                            own.add(node.name)
                            changed = True
                    continue
                for names, value in pairs:
                    derived = False
                    for own, test, known in (
                        (own_clocks, self.clock, env),
                        (own_durations, self.duration, denv),
                    ):
                        if test(value, known):
                            derived = True
                            if not set(names) <= own:
                                own.update(names)
                                changed = True
                    if derived:
                        continue
                    if self.numeric(value, numbers | numeric) and len(names) == 1:
                        numeric.update(names)
                    else:
                        other.update(names)
        # a name is numeric where every binding of it in the scope is (or, unbound here, around)
        numbers = (numbers | numeric) - other - own_clocks - own_durations
        return clocks | own_clocks, durations | own_durations, numbers

    def _scope(self, scope, clocks, durations, numbers):
        env = self._names(scope, clocks, durations, numbers)
        waits = set()  # the nodes of while conditions: hang guards
        for node in _own_nodes(scope):
            if isinstance(node, ast.While):
                waits.update(map(id, ast.walk(node.test)))
        for node in _own_nodes(scope):
            if isinstance(node, SCOPES):
                self._scope(node, *env)
            elif isinstance(node, ast.Compare) and id(node) not in waits:
                operands = [node.left, *node.comparators]
                exact = not any(isinstance(op, ORDERS) for op in node.ops) and not any(
                    self._approx(op) for op in operands
                )
                self._pairs(node, operands, env, "comparison", exact)
            elif isinstance(node, ast.Call) and id(node) not in waits:
                func = node.func
                name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
                if name in COMPARING:
                    args = [*node.args, *(k.value for k in node.keywords)]
                    self._pairs(node, args, env, f"{name}()", name in EXACT)

    def _pairs(self, node, operands, env, what, exact):
        clocks, durations, numbers = env
        timed = [op for op in operands if self.clock(op, clocks)]
        others = [op for op in operands if op not in timed and self.numeric(op, numbers)]
        if timed and (len(timed) > 1 or others):
            self.found.append((node.lineno, f"{what} of a clock reading"))
            return
        named = [op for op in operands if self.duration(op, durations)]
        others = [op for op in operands if op not in named and self.numeric(op, numbers)]
        if named and others and not exact:
            self.found.append((node.lineno, f"{what} of a duration by name with a number"))


def clock_comparisons(source):
    """``(line, reason)`` of each comparison of a clock reading with a number or another clock
    reading, or of a duration by name with a number, in ``source`` (the module doc's rule), in
    line order."""
    return sorted(_Checker(ast.parse(source)).found)


def test_no_test_compares_a_duration_with_a_number():
    """Every tests/*.py keeps the module doc's rule; the failure names each offending line."""
    found = []
    for path in sorted(TESTS.glob("*.py")):
        source = path.read_text(encoding="utf-8")
        lines = source.splitlines()
        for line, reason in clock_comparisons(source):
            found.append(f"tests/{path.name}:{line}: {reason}: {lines[line - 1].strip()}")
    assert not found, "timing assertions (use a hang guard or a benchmark):\n" + "\n".join(found)


FLAGGED = {
    "elapsed": """
        import time
        def test():
            t0 = time.perf_counter()
            run()
            elapsed = time.perf_counter() - t0
            assert elapsed < 20
    """,
    "inline difference": """
        import time
        def test():
            t = time.time()
            run()
            assert time.time() - t < 300
    """,
    "aliased import": """
        from time import perf_counter as pc
        def test():
            start = pc()
            run()
            assert 5.0 > pc() - start
    """,
    "ratio of durations": """
        import time
        def test():
            t0 = time.monotonic()
            a()
            t1 = time.monotonic()
            b()
            ratio = (time.monotonic() - t1) / (t1 - t0)
            assert 0 < ratio < 10
    """,
    "two durations": """
        import time
        def test():
            t0 = time.process_time_ns(); a(); fast = time.process_time_ns() - t0
            t0 = time.process_time_ns(); b(); slow = time.process_time_ns() - t0
            assert fast < 2 * slow
    """,
    "module constant": """
        import time
        LIMIT = 2 * 60
        def test():
            t0 = time.time(); run()
            assert time.time() - t0 <= LIMIT
    """,
    "approx": """
        import time, pytest
        def test():
            t0 = time.time(); run()
            assert time.time() - t0 == pytest.approx(1.0, rel=0.5)
    """,
    "isclose": """
        import math, time
        def test():
            t0 = time.time(); run()
            assert math.isclose(time.time() - t0, 1.0, rel_tol=0.5)
    """,
    "collected durations": """
        import time
        def test():
            durations = []
            for _ in range(3):
                t0 = time.perf_counter(); run(); durations.append(time.perf_counter() - t0)
            assert max(durations) < 1
    """,
    "helper that times": """
        import time
        def timed(f):
            t0 = time.perf_counter()
            f()
            return time.perf_counter() - t0
        def test():
            assert timed(run) < 3
    """,
    "enclosing scope": """
        import time
        def test():
            t0 = time.time()
            def check():
                assert time.time() - t0 < 10
            check()
    """,
    "datetime": """
        from datetime import datetime
        def test():
            start = datetime.now(); run()
            assert (datetime.now() - start).total_seconds() < 60
    """,
    "timeit": """
        import timeit
        def test():
            assert timeit.timeit(run, number=10) < 1
    """,
    "deadline in an if": """
        import time
        def test():
            deadline = time.time() + 60
            while True:
                if done() or time.time() > deadline:
                    break
    """,
    "deadline in an assert": """
        import time
        def test():
            deadline = time.time() + 60
            run()
            assert time.time() < deadline
    """,
    # durations by name: from a report, a result object, a program's output
    "a report's seconds per epoch": """
        def test(summary):
            for row in summary["methods"].values():
                assert 0 <= row["final_test_accuracy"] <= 1 and row["seconds_per_epoch"] > 0
    """,
    "a result's cumulative seconds": """
        import numpy as np
        def test(r):
            assert np.all(np.diff(r.seconds) > 0)
    """,
    "a series looked up by key": """
        import numpy as np
        def test(run):
            assert np.all(np.diff(run.series("seconds")) > 0)
    """,
    "a chain of elements": """
        def test(runs):
            assert 0 < runs[1].seconds[0] <= runs[1].seconds[-1]
    """,
    "a name bound from a report": """
        def test(row):
            t = row["wall_time"]
            assert t < 60
    """,
    "a loop over durations": """
        def test(r):
            for s in r["elapsed"]:
                assert s > 0
    """,
    "a ratio named over": """
        def test(summary):
            assert summary["ratios"]["fit_time_over_load"] < 2
    """,
    "a ratio of two durations": """
        def test(r):
            assert r["fln_seconds"] / r["adam_seconds"] < 3
    """,
    "parsed from output": """
        import subprocess
        def test():
            proc = subprocess.run(["prog"], capture_output=True, text=True, timeout=600)
            seconds = float(proc.stdout.split()[-1])
            assert seconds < 0.5
    """,
    "a duration within a tolerance": """
        import pytest
        def test(r):
            assert r["training_seconds"] == pytest.approx(3.0, rel=0.5)
    """,
    "not zero": """
        def test(r):
            assert r.duration != 0
    """,
    "isclose by name": """
        import math
        def test(r):
            assert math.isclose(r["time_to_97"], 1.0, rel_tol=0.5)
    """,
    "a rate": """
        def test(stats):
            assert stats["images_per_second"] > 100
    """,
    "milliseconds": """
        def test(stats):
            assert stats.ms_per_batch < 50
    """,
    "a helper returning a duration": """
        def first(r):
            return r["seconds"][0]
        def test(r):
            assert first(r) < 1
    """,
    "the longest of a report's durations": """
        LIMIT = 10
        def test(r):
            assert max(r.seconds) <= LIMIT
    """,
}

ALLOWED = {
    "while deadline": """
        import time
        def test():
            deadline = time.time() + 120
            while not done() and time.time() < deadline:
                time.sleep(0.1)
            assert done()
    """,
    "sleep and timeouts": """
        import subprocess, time
        def test():
            time.sleep(0.5)
            out = subprocess.run(["true"], timeout=600)
            assert out.returncode == 0 and proc.wait(timeout=600) == 0
    """,
    "timestamp text": """
        from datetime import datetime
        def test(folder):
            stamp = datetime.now().strftime("%Y%m%d")
            assert folder.name[:8] == stamp
    """,
    "iteration counts": """
        def test():
            res = solve(max_iter=2000)
            assert res.iterations <= 250 and res.residual < 1e-6
    """,
    "a name reused in another test": """
        import time
        def test_a():
            t = time.time()
            run(t)
        def test_b():
            t = 3
            assert t == 3
    """,
    "seconds as data": """
        def test(summary):
            assert summary["seconds_per_epoch"] == 3.0
    """,
    "a string of code": """
        def test():
            code = "import time; t = time.perf_counter(); assert time.perf_counter() - t < 1"
            assert len(code) > 10
    """,
    "counts of durations": """
        def test(r):
            assert r["epochs"] > 0 and len(r["seconds"]) == 2 and len(r.seconds) >= 2
            assert r.seconds.shape == (2,) and r.seconds.size > 1
    """,
    "words that are not durations": """
        import subprocess
        def test(r, opts):
            out = subprocess.run(["true"], timeout=600)
            assert out.returncode == 0 and opts.timeout >= 600 and r["times"] > 2
            assert r["timestamp"] > 0 and r["runtime_error"] < 1 and r["datetime_fields"] > 0
    """,
    "an ordinal": """
        def test(plan):
            first, second = plan.schedule(0), plan.schedule(1)
            assert second[0] > 0 and first[0] > 0
    """,
    "recorded and finite": """
        import math
        def test(row):
            s = row["seconds_per_epoch"]
            assert isinstance(s, float) and math.isfinite(s)
    """,
    "a ratio against its quotient": """
        import pytest
        def test(summary):
            assert summary["ratios"]["seconds_per_epoch_fln_over_adam"] == pytest.approx(
                summary["methods"]["fln"]["seconds_per_epoch"]
                / summary["methods"]["adam"]["seconds_per_epoch"]
            )
    """,
    "exact data in a comparing call": """
        import numpy as np
        def test(r):
            np.testing.assert_equal(r["seconds_per_epoch"], 3.0)
    """,
    "a module attribute": """
        import time
        def test():
            assert time.time is not None and time.timezone > -50000
    """,
}


@pytest.mark.parametrize("name", FLAGGED)
def test_the_checker_flags_timing_assertions(name):
    source = textwrap.dedent(FLAGGED[name])
    found = clock_comparisons(source)
    assert len(found) == 1, found
    ((line, _),) = found
    assert any(w in source.splitlines()[line - 1] for w in ("assert", "if ")), found


@pytest.mark.parametrize("name", ALLOWED)
def test_the_checker_allows_hang_guards_counts_and_deterministic_asserts(name):
    assert clock_comparisons(textwrap.dedent(ALLOWED[name])) == []
