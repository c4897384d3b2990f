"""Bad input is refused by name, before any work: one table of inputs a new user might try.

Every row of ``PYTHON`` calls the Python API (the network, ``fit_bcd``, the estimators, the data
loaders, ``train_backprop``, ``fit_lifted``) with one bad argument and expects a ``ValueError``
whose message starts with the parameter's name and holds a phrase of what is wrong (the bad
value, mostly). The ``worked`` fixture turns every place where work would start (a block solve, a
round of the driver, an epoch of backprop, a lifted method's run, reading a data set) into an
error that is not a ``ValueError``: a row that got through validation fails on it. ``CLI`` does
the same for the ``fenchel-cvx`` command: exit status 2, the flag named, no folder written, no
data read. ``validation.py`` holds the constraints; the bounds it sets (``MAX_WEIGHT``,
``MAX_ROUNDS``, a tolerance at most 1) are checked here too.
"""

import ast
import math
from pathlib import Path

import numpy as np
import pytest

from fenchel_cvx import FenchelClassifier, FenchelRegressor, LiftedNetwork, cli, datasets, fit_bcd
from fenchel_cvx.layers import Dense
from fenchel_cvx.network import lenet5
from fenchel_cvx.validation import (
    COUNT,
    GAMMA,
    LAM,
    MAX_ROUNDS,
    MAX_WEIGHT,
    Options,
    PerLayer,
    check,
    check_matrix,
    scale_problem,
)

ROOT = Path(__file__).resolve().parents[1]
SIZES = [4, 5, 3]
RNG = np.random.default_rng(0)
X = RNG.normal(size=(4, 30))
Y = np.eye(3)[:, RNG.integers(0, 3, 30)]
XS, YS = X.T[:, :4], np.arange(30) % 3  # estimator data: rows are samples


class Worked(Exception):
    """Work began: validation let a bad input through."""


class Counting:
    """A backend that refuses to solve: a refused input must reach no block."""

    name = "counting"

    def solve(self, block, start=None):
        raise Worked(f"a {type(block).__name__} block was solved")


@pytest.fixture
def worked(monkeypatch):
    """Every place where work starts raises ``Worked`` (not a ValueError)."""
    from fenchel_cvx import bcd
    from fenchel_cvx.baselines import backprop
    from fenchel_cvx.baselines.lifted import METHODS

    def refuse(*args, **kwargs):
        raise Worked("work began")

    monkeypatch.setattr(bcd, "_run", refuse)
    monkeypatch.setattr(backprop, "_epochs", refuse)
    for method in METHODS.values():
        monkeypatch.setattr(method, "run", refuse)
    for loader in ("_split", "_read_bytes", "_read_cifar_batch"):
        monkeypatch.setattr(datasets, loader, refuse)
    monkeypatch.setattr(cli.data_flags, "load", refuse)
    return Counting()


def _fit(b, net=None, X0=X, Y0=Y, **kw):
    return fit_bcd(net or LiftedNetwork(SIZES), X0, Y0, backend=b, **kw)


def _clf(b, **kw):
    return FenchelClassifier(**{"hidden_layer_sizes": (5,), "backend": b, **kw}).fit(XS, YS)


def _backprop(b, **kw):
    pytest.importorskip("torch")
    from fenchel_cvx.baselines.backprop import train_backprop

    args = dict(
        network=(4, 5, 3),
        X_train=X,
        y_train=YS,
        X_test=X,
        y_test=YS,
        batches=datasets.batch_order(30, 10, 1),
    )
    args.update(kw)
    return train_backprop(
        args.pop("network"),
        *(args.pop(k) for k in ("X_train", "y_train", "X_test", "y_test")),
        **args,
    )


def _lifted(b, method="lau", **kw):
    from fenchel_cvx.baselines.lifted import fit_lifted

    args = dict(X=X, Y=Y, X_test=X, Y_test=Y, iterations=1, hidden=(5,))
    args.update(kw)
    return fit_lifted(
        method, args.pop("X"), args.pop("Y"), args.pop("X_test"), args.pop("Y_test"), **args
    )


PYTHON = [  # (label, the name the message starts with, a phrase of it, the call)
    # the network
    ("net lam=True", "lam", "got True", lambda b: LiftedNetwork(SIZES, lam=True)),
    ("net rho=True", "rho", "got True", lambda b: LiftedNetwork(SIZES, rho=True)),
    ("net lam=1e308", "lam", "<= 1e+06", lambda b: LiftedNetwork(SIZES, lam=1e308)),
    ("net rho=1e308", "rho", "got 1e+308", lambda b: LiftedNetwork(SIZES, rho=1e308)),
    ("net lam=None", "lam", "got None", lambda b: LiftedNetwork(SIZES, lam=None)),
    ("net lam=1j", "lam", "got 1j", lambda b: LiftedNetwork(SIZES, lam=1j)),
    ("net rho=[1, nan]", "rho", "got nan", lambda b: LiftedNetwork(SIZES, rho=[1, math.nan])),
    ("net seed=-1", "seed", "got -1", lambda b: LiftedNetwork(SIZES, seed=-1)),
    ("net seed=1.5", "seed", "got 1.5", lambda b: LiftedNetwork(SIZES, seed=1.5)),
    ("net seed=True", "seed", "got True", lambda b: LiftedNetwork(SIZES, seed=True)),
    ("net seed='a'", "seed", "got 'a'", lambda b: LiftedNetwork(SIZES, seed="a")),
    ("net dtype=int32", "dtype", "'int32'", lambda b: LiftedNetwork(SIZES, dtype="int32")),
    (
        "net dtype=complex128",
        "dtype",
        "complex128",
        lambda b: LiftedNetwork(SIZES, dtype=np.complex128),
    ),
    ("net dtype=bool", "dtype", "bool", lambda b: LiftedNetwork(SIZES, dtype=bool)),
    ("net sizes [4, True, 3]", "layer_sizes", "True", lambda b: LiftedNetwork([4, True, 3])),
    ("net sizes 5", "layer_sizes", "got 5", lambda b: LiftedNetwork(5)),
    ("net sizes None", "layer_sizes", "got None", lambda b: LiftedNetwork(None)),
    ("net sizes [4, 2.5, 3]", "layer_sizes", "2.5", lambda b: LiftedNetwork([4, 2.5, 3])),
    (
        "from_layers lam=True",
        "lam",
        "got True",
        lambda b: LiftedNetwork.from_layers((4,), [Dense(5), Dense(3)], lam=True),
    ),
    (
        "from_layers seed=-2",
        "seed",
        "got -2",
        lambda b: LiftedNetwork.from_layers((4,), [Dense(5), Dense(3)], seed=-2),
    ),
    ("lenet5 n_classes=True", "n_classes", "got True", lambda b: lenet5(n_classes=True)),
    ("lenet5 n_classes=2.5", "n_classes", "got 2.5", lambda b: lenet5(n_classes=2.5)),
    ("lenet5 seed=-1", "seed", "got -1", lambda b: lenet5(seed=-1)),
    ("lenet5 rho=1e308", "rho", "got 1e+308", lambda b: lenet5(rho=1e308)),
    ("lenet5 dtype=int64", "dtype", "'int64'", lambda b: lenet5(dtype="int64")),
    # the driver
    ("fit iterations=True", "iterations", "got True", lambda b: _fit(b, iterations=True)),
    ("fit iterations=10**12", "iterations", "<= 1000000", lambda b: _fit(b, iterations=10**12)),
    (
        "fit epochs=10**12",
        "epochs",
        "got 1000000000000",
        lambda b: _fit(b, batch_size=5, epochs=10**12),
    ),
    (
        "fit epochs x batches",
        "epochs",
        "at most 1000000 rounds",
        lambda b: _fit(b, batch_size=1, epochs=40000),
    ),
    ("fit batch_size=True", "batch_size", "got True", lambda b: _fit(b, batch_size=True)),
    ("fit batch_size='auto'", "batch_size", "got 'auto'", lambda b: _fit(b, batch_size="auto")),
    ("fit gamma=True", "gamma", "got True", lambda b: _fit(b, gamma=True)),
    ("fit gamma=1e308", "gamma", "got 1e+308", lambda b: _fit(b, gamma=1e308)),
    ("fit gamma=[1, True]", "gamma", "got True", lambda b: _fit(b, gamma=[1, True])),
    ("fit tol=True", "tol", "got True", lambda b: _fit(b, tol=True)),
    ("fit tol=1e300", "tol", "<= 1", lambda b: _fit(b, tol=1e300)),
    ("fit tol='1e-6'", "tol", "got '1e-6'", lambda b: _fit(b, tol="1e-6")),
    ("fit strict=1", "strict", "got 1", lambda b: _fit(b, strict=1)),
    ("fit progress='yes'", "progress", "got 'yes'", lambda b: _fit(b, progress="yes")),
    ("fit check_every=True", "check_every", "got True", lambda b: _fit(b, check_every=True)),
    ("fit checkpoint=3", "checkpoint", "got 3", lambda b: _fit(b, checkpoint=3)),
    ("fit resume=missing", "resume", "/nonexistent", lambda b: _fit(b, resume="/nonexistent/x")),
    ("fit X0 complex", "X0", "complex", lambda b: _fit(b, X0=X + 1j * X)),
    ("fit Y complex", "Y", "complex", lambda b: _fit(b, Y0=Y + 0j)),
    ("fit X0 * 1e200", "X0", "overflows float64", lambda b: _fit(b, X0=X * 1e200)),
    ("fit Y * 1e200", "Y", "overflows float64", lambda b: _fit(b, Y0=Y * 1e200)),
    (
        "fit float32 X0 * 1e20",
        "X0",
        "overflows float32",
        lambda b: _fit(b, LiftedNetwork(SIZES, dtype="float32"), X0=(X * 1e20).astype(np.float32)),
    ),
    ("fit X0 strings", "X0", "<U", lambda b: _fit(b, X0=X.astype(str))),
    ("fit X0 ragged", "X0", "list", lambda b: _fit(b, X0=[[1.0, 2.0], [3.0]])),
    ("fit X_test complex", "X_test", "complex", lambda b: _fit(b, X_test=X + 1j, Y_test=Y)),
    ("fit Y 1-D labels", "Y", "shape (30,)", lambda b: _fit(b, Y0=np.argmax(Y, 0))),
    # the estimators
    ("clf lam=True", "lam", "got True", lambda b: _clf(b, lam=True)),
    ("clf rho=1e308", "rho", "got 1e+308", lambda b: _clf(b, rho=1e308)),
    ("clf tol=1e300", "tol", "got 1e+300", lambda b: _clf(b, tol=1e300)),
    ("clf epochs=True", "epochs", "got True", lambda b: _clf(b, epochs=True)),
    (
        "clf iterations=10**12",
        "iterations",
        "1000000000000",
        lambda b: _clf(b, batch_size=None, iterations=10**12),
    ),
    (
        "clf hidden_layer_sizes=(True,)",
        "hidden_layer_sizes",
        "True",
        lambda b: _clf(b, hidden_layer_sizes=(True,)),
    ),
    (
        "clf hidden_layer_sizes='10'",
        "hidden_layer_sizes",
        "'10'",
        lambda b: _clf(b, hidden_layer_sizes="10"),
    ),
    ("clf random_state=-1", "random_state", "got -1", lambda b: _clf(b, random_state=-1)),
    ("clf random_state=1.5", "random_state", "got 1.5", lambda b: _clf(b, random_state=1.5)),
    ("clf verbose='yes'", "verbose", "got 'yes'", lambda b: _clf(b, verbose="yes")),
    (
        "clf X complex",
        "X",
        "Complex data not supported",
        lambda b: FenchelClassifier(backend=b).fit(XS + 1j, YS),
    ),
    (
        "clf X * 1e200",
        "X",
        "overflows float64",
        lambda b: FenchelClassifier(backend=b).fit(XS * 1e200, YS),
    ),
    ("reg y complex", "y", "complex", lambda b: FenchelRegressor(backend=b).fit(XS, YS + 1j)),
    (
        "reg y * 1e200",
        "y",
        "overflows float64",
        lambda b: FenchelRegressor(backend=b).fit(XS, YS * 1e200),
    ),
    # the data sets
    ("digits seed=-1", "seed", "got -1", lambda b: datasets.load_digits(seed=-1)),
    ("digits seed=True", "seed", "got True", lambda b: datasets.load_digits(seed=True)),
    (
        "digits test_size=True",
        "test_size",
        "got True",
        lambda b: datasets.load_digits(test_size=True),
    ),
    ("mnist5k seed=1.5", "seed", "got 1.5", lambda b: datasets.load_mnist5k(seed=1.5)),
    ("mnist data_dir=3", "data_dir", "got 3", lambda b: datasets.load_mnist(3)),
    (
        "mnist download='yes'",
        "download",
        "got 'yes'",
        lambda b: datasets.load_mnist("/nonexistent", download="yes"),
    ),
    ("mnist dtype=int32", "dtype", "'int32'", lambda b: datasets.load_mnist("/x", dtype="int32")),
    (
        "cifar10 dtype=complex64",
        "dtype",
        "complex64",
        lambda b: datasets.load_cifar10("/x", dtype=np.complex64),
    ),
    ("batch_order seed=-1", "seed", "got -1", lambda b: datasets.batch_order(10, 2, 1, seed=-1)),
    ("one_hot n_classes=True", "n_classes", "got True", lambda b: datasets.one_hot([0, 1], True)),
    # backprop
    ("backprop lr=1e308", "lr", "got 1e+308", lambda b: _backprop(b, lr=1e308)),
    ("backprop lr=inf", "lr", "got inf", lambda b: _backprop(b, lr=math.inf)),
    ("backprop seed=-1", "seed", "got -1", lambda b: _backprop(b, seed=-1)),
    ("backprop progress='x'", "progress", "got 'x'", lambda b: _backprop(b, progress="x")),
    ("backprop callback=3", "callback", "got 3", lambda b: _backprop(b, callback=3)),
    ("backprop X complex", "X_train", "complex", lambda b: _backprop(b, X_train=X + 1j)),
    ("backprop X NaN", "X_test", "finite", lambda b: _backprop(b, X_test=X * np.nan)),
    (
        "backprop sizes (4, True, 3)",
        "layer_sizes",
        "True",
        lambda b: _backprop(b, network=(4, True, 3)),
    ),
    # the lifted peers
    ("lifted lau rho=True", "rho", "got True", lambda b: _lifted(b, "lau", rho=True)),
    ("lifted taylor beta=1e308", "beta", "got 1e+308", lambda b: _lifted(b, "taylor", beta=1e308)),
    ("lifted askari seed=-1", "seed", "got -1", lambda b: _lifted(b, "askari", seed=-1)),
    ("lifted fln lam=1e308", "lam", "got 1e+308", lambda b: _lifted(b, "fln", lam=1e308)),
    ("lifted fln tol=2", "tol", "got 2", lambda b: _lifted(b, "fln", tol=2)),
    ("lifted sgd threads=0", "threads", "got 0", lambda b: _lifted(b, "sgd", threads=0)),
    ("lifted hidden=5", "hidden", "got 5", lambda b: _lifted(b, hidden=5)),
    ("lifted callback=3", "callback", "got 3", lambda b: _lifted(b, callback=3)),
    ("lifted X complex", "X", "complex", lambda b: _lifted(b, X=X + 1j)),
    ("lifted X * 1e200", "X", "overflows", lambda b: _lifted(b, X=X * 1e200)),
]

CLI = [  # (argv, the flag the message names, a phrase of it)
    (["train", "--lam", "1e308"], "--lam", "<= 1e+06"),
    (["train", "--rho", "1e308"], "--rho", "got '1e308'"),
    (["train", "--gamma", "1e308"], "--gamma", "got '1e308'"),
    (["train", "--tol", "1e300"], "--tol", "<= 1"),
    (["train", "--tol", "nan"], "--tol", "> 0 and finite"),
    (["train", "--lam", "true"], "--lam", "got 'true'"),
    (["train", "--lam", "inf"], "--lam", "got 'inf'"),
    (["train", "--seed", "-1"], "--seed", "integer >= 0"),
    (["train", "--seed", "1.5"], "--seed", "got '1.5'"),
    (["train", "--iterations", "1000000000000"], "--iterations", "<= 1000000"),
    (["train", "--epochs", "1e3"], "--epochs", "got '1e3'"),
    (["train", "--batch-size", "1", "--epochs", "1000"], "--epochs", "at most 1000000 rounds"),
    (["train", "--train-size", "100000"], "--train-size", "1347 training points"),
    (["train", "--threads", "0"], "--threads", "integer >= 1"),
    (["train", "--dtype", "int32"], "--dtype", "invalid choice"),
    (["train", "--gamma", "-1"], "--gamma", ">= 0"),
    (["train", "--backend", "fast", "--max-iter", "1e9"], "--max-iter", "got '1e9'"),
    (["train", "--backend", "fast", "--newton-cap", "-2"], "--newton-cap", "integer >= 0"),
    (["evaluate", "model.npz", "--seed", "-3"], "--seed", "integer >= 0"),
    (["predict", "model.npz", "x.csv", "--threads", "true"], "--threads", "got 'true'"),
]


def test_the_table_is_large_enough():
    assert len(PYTHON) + len(CLI) >= 60 and len({row[0] for row in PYTHON}) == len(PYTHON)


@pytest.mark.parametrize("label, name, phrase, call", PYTHON, ids=[row[0] for row in PYTHON])
def test_python_api_refuses_by_name_before_any_work(label, name, phrase, call, worked):
    with pytest.raises(ValueError) as err:
        call(worked)
    message = str(err.value)
    assert message.startswith(name + " ") or message.startswith(name + ":"), message
    assert phrase in message, message


@pytest.mark.parametrize("argv, flag, phrase", CLI, ids=[" ".join(a) for a, _, _ in CLI])
def test_cli_refuses_by_flag_before_any_work(
    argv, flag, phrase, worked, capsys, tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exc:
        cli.main(argv + (["--out", str(tmp_path / "run")] if argv[0] == "train" else []))
    err = capsys.readouterr().err
    assert exc.value.code == 2, err
    assert f"argument {flag}: " in err or f"error: {flag} " in err, err
    assert phrase in err and "Traceback" not in err, err
    assert list(tmp_path.iterdir()) == []  # no run folder written


# --- the constraints themselves ---------------------------------------------------------------
def test_messages_name_the_side_that_fails():
    for value, words in [
        (-1, "> 0 and finite, got -1"),
        (math.nan, "> 0 and finite, got nan"),
        (2 * MAX_WEIGHT, "<= 1e+06"),
        ("1", "a number in (0, 1e+06], got '1'"),
    ]:
        with pytest.raises(ValueError, match=None) as err:
            check("lam", value, LAM)
        assert str(err.value).startswith("lam must be ") and words in str(err.value)
    with pytest.raises(ValueError, match=r"^n must be an integer >= 1 or None, got 0$"):
        check("n", 0, [COUNT, None])
    with pytest.raises(ValueError, match=r"^b must be None, 'auto' or an integer >= 1, got 'x'$"):
        check("b", "x", [None, Options(["auto"]), COUNT])
    with pytest.raises(ValueError, match=r"^gamma must be >= 0 and finite, got -2$"):
        check("gamma", [1, -2, 3], PerLayer(GAMMA, 3))
    with pytest.raises(ValueError, match=r"^gamma must be a number or a sequence of 3 numbers"):
        check("gamma", [1, 2], PerLayer(GAMMA, 3))


def test_values_are_normalised():
    assert check("gamma", 2, PerLayer(GAMMA, 3)) == [2.0, 2.0, 2.0]
    assert check("gamma", np.array([1, 2]), [PerLayer(GAMMA, 2), None]) == [1.0, 2.0]
    assert check("n", np.int64(3), COUNT) == 3 and type(check("n", np.int64(3), COUNT)) is int
    assert check("lam", np.float32(0.5), LAM) == 0.5 and check("n", None, [COUNT, None]) is None
    with pytest.raises(ValueError):
        check("n", np.bool_(True), COUNT)


def test_data_rules():
    assert check_matrix("X0", [[1, 2], [3, 4]]).dtype == np.float64  # integers: float64
    assert check_matrix("X0", X.astype(np.float32)).dtype == np.float32  # float32 stays
    assert check_matrix("X0", X, dtype="float32").dtype == np.float32  # the network's dtype
    assert check_matrix("X0", X > 0).dtype == np.float64  # booleans: 0 and 1
    with pytest.warns(UserWarning, match="X0 is float16: upcast to float64"):
        check_matrix("X0", X.astype(np.float16))
    big = np.sqrt(np.sqrt(np.finfo(np.float32).max) / X.size)  # the overflow bound
    check_matrix("X0", np.full(X.shape, 0.99 * big, dtype=np.float32))
    with pytest.raises(ValueError, match="X0 has a scale that overflows float32"):
        check_matrix("X0", np.full(X.shape, 1.01 * big, dtype=np.float32))
    with pytest.raises(
        ValueError, match="X0 has a scale that overflows float32"
    ):  # cast, then checked
        check_matrix("X0", np.full(X.shape, 1.01 * big), dtype="float32")


@pytest.mark.parametrize("library", ["numpy", "torch", "array_api_strict"])
@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_data_scale_is_the_largest_magnitude_of_either_sign(library, sign):
    """The scale bound takes max|X0| from the largest and the smallest entry, in the data's own
    library: an entry beyond the bound is refused whichever its sign, and one NaN or infinity
    of either sign too."""
    if library == "numpy":
        asarray = np.asarray
    else:
        lib = pytest.importorskip(library, reason=f"{library} is not installed")
        asarray = lib.from_numpy if library == "torch" else lib.asarray
    big = np.sqrt(np.sqrt(np.finfo(np.float32).max) / X.size)
    A = np.zeros(X.shape, dtype=np.float32)
    A[1, 2] = sign * 0.99 * big
    assert scale_problem(asarray(A)) is None
    A[1, 2] = sign * 1.01 * big
    assert "a scale that overflows float32" in scale_problem(asarray(A))
    for bad in (np.nan, sign * np.inf):
        A[1, 2] = bad
        assert scale_problem(asarray(A)) == "NaN or inf entries"
    if library == "numpy":
        with pytest.raises(ValueError, match="X0 must be finite, got NaN or inf entries"):
            check_matrix("X0", A)


def test_data_scale_of_integers_and_without_a_copy_of_the_data():
    """Integer data: the smallest int8 (whose absolute value int8 cannot hold) counts as 128.
    The bound's maximum allocates no array the size of the data (traced by tracemalloc, which
    NumPy reports to)."""
    import tracemalloc

    assert scale_problem(np.array([[-128, 3]], dtype=np.int8), dtype="float16") is not None
    assert scale_problem(np.array([[-128, 3]], dtype=np.int8), dtype="float32") is None
    assert scale_problem(np.array([[0, 255]], dtype=np.uint8), dtype="float32") is None
    A = np.ones((1000, 2000), dtype=np.float32)
    tracemalloc.start()
    try:
        assert scale_problem(A) is None
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < A.nbytes / 100


def test_bounds_are_documented_and_sane():
    assert MAX_WEIGHT >= 100 * 100 and MAX_ROUNDS >= 10 * 1200  # gamma 100; 10 MNIST epochs
    text = (ROOT / "docs" / "api" / "validation.md").read_text()
    assert "fenchel_cvx.validation" in text and "fenchel_cvx.defaults" in text


# --- short functions: a body, its docstring aside, in the formatter's layout ----------------------
def _body_lines(node):
    """Lines from the first statement after the docstring to the end of the last statement."""
    body = node.body
    if ast.get_docstring(node, clean=False) is not None:
        body = body[1:]
    if not body:
        return 0
    first = body[0]
    start = min([first.lineno] + [d.lineno for d in getattr(first, "decorator_list", [])])
    return body[-1].end_lineno - start + 1


def _lengths():
    for path in sorted((ROOT / "fenchel_cvx").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                yield path.relative_to(ROOT), node.name, _body_lines(node)


def test_body_lines_skip_signature_and_docstring():
    source = (
        'def f(\n    a,\n    b,\n):\n    """Doc.\n\n    More.\n    """\n'
        "    x = a\n\n    return x + b\n"
    )
    (node,) = ast.parse(source).body
    assert _body_lines(node) == 3
    (bare,) = ast.parse("def g():\n    return (\n        1\n    )\n").body
    assert _body_lines(bare) == 3


def test_no_function_body_over_80_lines():
    long = {f"{path}:{name}": n for path, name, n in _lengths() if n > 80}
    assert not long, long


def test_fit_bcd_body_is_at_most_60_lines():
    (n,) = [n for path, name, n in _lengths() if name == "fit_bcd" and path.name == "bcd.py"]
    assert n <= 60, n


# --- one set of defaults ------------------------------------------------------------------------
def test_every_consumer_reads_the_defaults():
    """The network and the driver take ``defaults.py``'s constants; the estimators and the
    command line leave every hyperparameter unset and fill it from ``defaults.training``."""
    import inspect

    from fenchel_cvx import defaults

    sig = {
        name: inspect.signature(f).parameters
        for name, f in (
            ("net", LiftedNetwork),
            ("layers", LiftedNetwork.from_layers),
            ("fit", fit_bcd),
            ("clf", FenchelClassifier),
            ("reg", FenchelRegressor),
        )
    }
    for who in ("net", "layers"):
        assert sig[who]["lam"].default == defaults.LAM and sig[who]["rho"].default == defaults.RHO
    for who in ("clf", "reg"):
        for name in ("lam", "rho", "gamma", "momentum", "w_steps", "x_steps"):
            assert sig[who][name].default is None, (who, name)
    for who in ("fit", "clf", "reg"):
        assert sig[who]["iterations"].default == defaults.ITERATIONS
        assert sig[who]["alternations"].default == defaults.ALTERNATIONS
    assert sig["fit"]["tol"].default == defaults.TOL and sig["fit"]["gamma"].default is None
    assert (
        defaults.gamma_for(None) == defaults.GAMMA_FULL_BATCH
        and defaults.gamma_for(8) == defaults.GAMMA
    )
    args = cli.build_parser().parse_args(["train"])
    assert (args.lam, args.rho, args.gamma, args.momentum) == (None,) * 4
    assert args.tol == defaults.TOL
    cli._check_train(args)  # Algorithm 1 (no --batch-size): the full-batch setting
    full = defaults.training("dense", 1, batched=False)
    assert (
        (args.lam, args.rho, args.gamma, args.momentum)
        == ([10.0], [1.0, 1.0], [0.0, 0.0], [0.0, 0.0])
        == tuple(list(getattr(full, k)) for k in ("lam", "rho", "gamma", "momentum"))
    )
    assert (args.iterations, args.alternations) == (defaults.ITERATIONS, defaults.ALTERNATIONS)
    batched = cli.build_parser().parse_args(["train", "--batch-size", "50", "--arch", "64-16-8-10"])
    cli._check_train(batched)
    assert (batched.lam, batched.rho, batched.gamma, batched.momentum) == (
        [0.2, 0.2],
        [0.0] * 3,
        [1.0, 1.0, 30.0],
        [0.7, 0.7, 0.0],
    )
    assert (batched.w_steps, batched.x_steps) == (None, None)  # the oracle takes no steps
    args = cli.build_parser().parse_args(
        ["train", "--backend", "fast", "--batch-size", "9", "--gamma", "2"]
    )
    cli._check_train(args)
    backend = cli._backend(args)
    assert (backend.w_steps, backend.x_steps, args.gamma) == ((10, 1), (20,), 2.0)  # given: kept
    args = cli.build_parser().parse_args(["train", "--backend", "fast"])
    cli._check_train(args)
    assert (cli._backend(args).w_steps, cli._backend(args).x_steps) == (None, None)  # to --tol
    lenet = cli.build_parser().parse_args(
        [
            "train",
            "--dataset",
            "mnist5k",
            "--arch",
            "lenet5",
            "--backend",
            "fast",
            "--batch-size",
            "100",
        ]
    )
    cli._check_train(lenet)
    s = defaults.training("lenet5", 4, batched=True)
    assert (lenet.lam, lenet.rho, lenet.gamma, lenet.momentum, lenet.x_steps, lenet.gram_reuse) == (
        list(s.lam),
        list(s.rho),
        list(s.gamma),
        list(s.momentum),
        list(s.x_steps),
        list(s.gram_reuse),
    )
    with pytest.raises(ValueError, match="the lenet5 setting is for 4 hidden layers, got 2"):
        defaults.training("lenet5", 2, batched=True)
    with pytest.raises(
        ValueError, match=r"network must be one of \['dense', 'lenet5'\], got 'cnn'"
    ):
        defaults.training("cnn", 2, batched=True)
    none = defaults.training("dense", 0, batched=True)  # no hidden layer: no X-block
    assert (none.lam, none.x_steps, none.gamma, none.w_steps) == (0.2, None, (30.0,), (1,))
    args = cli.build_parser().parse_args(
        ["train", "--backend", "fast", "--batch-size", "9", "--arch", "64-10"]
    )
    cli._check_train(args)
    assert (args.lam, args.x_steps, cli._backend(args).w_steps) == (0.2, None, (1,))


def test_a_run_json_from_before_the_settings_resumes_as_it_began():
    """A run.json written before the training settings has no ``settings`` entry and left
    gamma, momentum and the fast steps unset where not given (fit_bcd's gamma 3, no momentum,
    one W-step, 10 X-steps, a fresh Gram then); ``resume`` fills in those, so that the
    checkpoint's run goes on as it began, not with the new setting."""

    def old(*flags):
        args = cli.build_parser().parse_args(["train", "--backend", "fast", *flags])
        args.momentum = None  # a run.json from before momentum has no entry: the parser's
        cli._before_settings(args)
        cli._check_train(args)
        return args

    a = old("--batch-size", "50", "--lam", "1", "--rho", "1e-3")
    assert (a.gamma, a.momentum, a.w_steps, a.x_steps, a.gram_reuse) == (3.0, 0.0, 1, 10, 1)
    a = old("--batch-size", "50", "--gamma", "1")  # gamma given: the steps still old
    assert (a.gamma, a.w_steps, a.x_steps) == (1.0, 1, 10)
    a = old("--dataset", "mnist5k", "--arch", "lenet5", "--batch-size", "100")
    assert (a.gram_reuse, a.x_steps, a.momentum) == (1, 10, 0.0)  # not LeNet-5's (40, ...)
    a = old()  # Algorithm 1: gamma 0, to --tol
    assert (a.gamma, a.w_steps, a.x_steps) == (0.0, None, None)
    new = cli.build_parser().parse_args(["train", "--backend", "fast", "--batch-size", "50"])
    cli._check_train(new)  # a run.json of today records every value: nothing to fill
    assert new.settings == "defaults.training"
    before = dict(vars(new))
    cli._before_settings(new)
    assert vars(new) == before


def test_the_documented_defaults_are_the_code_s():
    from fenchel_cvx import defaults

    rows = {}
    for line in (ROOT / "docs" / "index.md").read_text().splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if line.startswith("| `") and len(cells) == 3:
            rows[cells[0].replace("`", "")] = cells[1]
        elif (
            line.startswith("| ")
            and len(cells) == 8
            and cells[0] in ("dense", "lenet5", "full batch")
        ):
            rows[cells[0]] = cells[1:]
    assert rows["lam"] == str(defaults.LAM) and rows["rho"] == str(defaults.RHO)
    assert rows["gamma"] == (
        f"{defaults.GAMMA} batched (Algorithm 2), "
        f"{defaults.GAMMA_FULL_BATCH} on all the data (Algorithm 1)"
    )
    assert rows["iterations"] == str(defaults.ITERATIONS)
    assert rows["alternations"] == str(defaults.ALTERNATIONS) and rows["tol"] == str(defaults.TOL)

    def text(values):
        return "to `tol`" if values is None else ", ".join(map(str, dict.fromkeys(values)))

    dense = defaults.SETTINGS["dense"]
    pair = lambda v: f"{v[0]} hidden, {v[1]} output"  # noqa: E731
    assert rows["dense"] == [
        str(dense.lam),
        str(dense.rho),
        pair(dense.gamma),
        pair(dense.momentum),
        pair(dense.w_steps),
        str(dense.x_steps),
        "1",
    ]
    le = defaults.training("lenet5", 4, batched=True)
    assert rows["lenet5"] == [
        ", ".join(map(str, le.lam)),
        ", ".join(map(str, le.rho)),
        ", ".join(map(str, le.gamma)),
        ", ".join(map(str, le.momentum)),
        ", ".join(map(str, le.w_steps)),
        ", ".join(map(str, le.x_steps)),
        ", ".join(map(str, le.gram_reuse)),
    ]
    full = defaults.training("dense", 1, batched=False)
    assert rows["full batch"] == [
        text(full.lam),
        text(full.rho),
        text(full.gamma),
        text(full.momentum),
        "to `tol`",
        "to `tol`",
        "1",
    ]
