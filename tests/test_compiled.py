"""The compiled path: ``FastBackend(compile=True)`` against the eager reference (``fast.fused``).

- each fused chain gives what its eager form gives, on every activation in float32, and in
  float64 on one activation of each kind of prox (``CHAIN_CASES``);
- each block kind of both benchmarks (the MLP's dense blocks, LeNet-5's convolution blocks),
  solved from identical inputs by both paths with the benchmarks' capped settings, agrees to
  1e-5 relative in float32 and 1e-10 in float64; solved to tolerance in float64 it matches the
  eager solve to 1e-8 and the CVXPY oracle's optimum as the eager one does;
- a batched run compiles in its first batch only (dynamo's counters), holds its certificate,
  resumes from a checkpoint to the uninterrupted result and gives the same result twice;
- bad input is refused before any work, with what to install; a chain that does not compile
  runs eagerly with a warning that says why;
- a chain tells its listeners (``on_compile``) while dynamo compiles it, and the progress bar
  names the chain compiling in a run's first batch (the default ``"auto"`` too);
- the default, ``compile="auto"``, compiles the chains that reach ``MIN_SIZE`` entries where
  PyTorch and a C++ compiler are present, and runs the rest eagerly without loading PyTorch.

The chains compile on arrays of any size here (``Compiled(min_size=0)``), so that small test
arrays take the compiled kernels that MNIST-sized ones take.
"""

import dataclasses
import sys
import warnings

import numpy as np
import pytest

import registry_params

torch = pytest.importorskip("torch", reason="the compiled path needs PyTorch (the bench extra)")

from fenchel_cvx import AvgPool2d, Conv2d, Dense, Flatten, LiftedNetwork, activation, blocks  # noqa: E402
from fenchel_cvx.bcd import fit_bcd  # noqa: E402
from fenchel_cvx.fast import FastBackend, fused  # noqa: E402

if fused.compiler_problem() is not None:
    pytest.skip(
        f"torch.compile cannot run here: {fused.compiler_problem()}", allow_module_level=True
    )

ACTS = tuple(registry_params.activations())  # every registered activation, by name
RTOL = {np.float32: 1e-5, np.float64: 1e-10}
#: the chains' cases: every activation in float32 (what training runs), and in float64 the first
#: of each kind of prox (closed form; a Newton solve), whose dtype handling the others share
CHAIN_CASES = [(n, np.float32) for n in ACTS] + [
    (names[0], np.float64)
    for names in (
        registry_params.activations(registry_params.closed_form_prox),
        registry_params.activations(lambda cls: not registry_params.closed_form_prox(cls)),
    )
]


@pytest.fixture(scope="module")
def compiled():
    """One compiled runner for the module: its kernels are reused across tests, as a process's
    backends share them."""
    return fused.Compiled(min_size=0)


def _act(name):
    return registry_params.built(name)  # leaky ReLU at slope 0.1 (``TEST_PARAMS``)


def _rel(a, b):
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-300))


def _inside(act, A):
    lo, hi = act.v_range
    return np.clip(
        A, lo + 0.02 if np.isfinite(lo) else None, hi - 0.02 if np.isfinite(hi) else None
    )


# --- the chains -------------------------------------------------------------------------------
@pytest.mark.parametrize("name, dtype", CHAIN_CASES)
def test_each_chain_equals_its_eager_form(compiled, name, dtype):
    act, rng = _act(name), np.random.default_rng(0)
    V, U, dU = (rng.standard_normal((12, 40)).astype(dtype) for _ in range(3))
    V = _inside(act, V)
    t = rng.uniform(0.1, 1.0, (12, 1)).astype(dtype)
    cases = [
        (fused.row_derivs, (act, 0.7, V, U, dU, t)),
        (fused.row_curv, (act, 0.7, U, dU)),
        (fused.row_change, (act, 0.7, V, U, dU, t)),
        (fused.row_derivs_change, (act, 0.7, V, U, dU, t)),
        (fused.scaled_grad_u, (act, 0.7, V, U)),
    ]
    for chain, args in cases:
        got, want = compiled(chain)(*args), chain(*args)
        for g, w in zip(
            got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)
        ):
            assert isinstance(g, np.ndarray) and g.dtype == dtype and g.shape == w.shape
            assert _rel(g, w) <= RTOL[dtype], (chain.__name__, _rel(g, w))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
# the classes with a closed-form prox (``x_prox``): the others' prox is a Newton solve
@pytest.mark.parametrize("name", registry_params.activations(registry_params.closed_form_prox))
def test_fista_step_equals_its_eager_form(compiled, name, dtype):
    act, rng = _act(name), np.random.default_rng(1)
    Gy, z, z_prev, tauU = (rng.standard_normal((20, 30)).astype(dtype) for _ in range(4))
    betas = rng.uniform(0, 1, 30).astype(dtype)  # one per column, as the solver's momentum
    # the first step (y is z), a later one with one beta, and one with a beta per column
    for zp, beta in ((None, 0.0), (z_prev, 0.4), (z_prev, betas)):
        args = (act.x_prox, act, Gy, (z, zp, beta), (0.3, 0.5), tauU, None)
        got, want = compiled(fused.fista_step)(*args), fused.fista_step(*args)
        assert got[1] is None and want[1] is None  # a closed-form prox keeps no state
        assert got[4].shape == want[4].shape == (30,)  # D . dz, one per column
        for g, w in zip(got[:1] + got[2:], want[:1] + want[2:]):
            assert _rel(g, w) <= RTOL[dtype]


def test_the_compiled_chain_neither_copies_nor_writes_its_arguments(compiled):
    """Arguments are viewed, not copied, and never written: read-only arrays are taken."""
    rng = np.random.default_rng(2)
    V, U, dU = (rng.standard_normal((8, 16)) for _ in range(3))
    before = [A.copy() for A in (V, U, dU)]
    for A in (V, U, dU):
        A.flags.writeable = False
    compiled(fused.row_change)(activation("relu"), 1.0, V, U, dU, 0.5)
    assert all(np.array_equal(A, B) for A, B in zip((V, U, dU), before))


# --- whole block solves of both benchmarks --------------------------------------------------------
def _mlp_state(dtype, seed=0, m=24):
    """A dense ReLU / cross-entropy network (the MLP benchmark's kind, smaller), a batch of fewer
    points than inputs (W_0's steps in the span of the batch) at a perturbed lifted point."""
    rng = np.random.default_rng(seed)
    net = LiftedNetwork(
        [40, 16, 10], "relu", "cross_entropy", lam=0.2, rho=0.0, seed=seed, dtype=dtype
    )
    X0 = rng.random((40, m)).astype(dtype)
    Y = np.eye(10, dtype=dtype)[:, rng.integers(0, 10, m)]
    Xs, _ = net.forward(X0)
    Xs = [np.maximum(X + 0.2 * rng.standard_normal(X.shape).astype(dtype), 0) for X in Xs]
    return net, X0, Y, Xs


def _conv_state(dtype, seed=0, m=6):
    """A LeNet-5-like network (convolution, average pooling, dense; ReLU, cross-entropy)."""
    rng = np.random.default_rng(seed)
    net = LiftedNetwork.from_layers(
        (1, 8, 8),
        [Conv2d(3, 3, padding=1), AvgPool2d(2), Conv2d(4, 3), AvgPool2d(2), Flatten(), Dense(3)],
        activation="relu",
        loss="cross_entropy",
        lam=(10.0, 2.0),
        rho=0.0,
        seed=seed,
        dtype=dtype,
    )
    X0 = rng.random((64, m)).astype(dtype)
    Y = np.eye(3, dtype=dtype)[:, rng.integers(0, 3, m)]
    Xs, _ = net.forward(X0)
    Xs = [np.maximum(X + 0.2 * rng.standard_normal(X.shape).astype(dtype), 0) for X in Xs]
    return net, X0, Y, Xs


def _blocks(state):
    net, X0, Y, Xs = state
    L = net.n_hidden
    xs = [blocks.x_block(net, X0, Y, Xs, l) for l in range(1, L + 1)]
    ws = [blocks.w_block(net, X0, Y, Xs, l, gamma=0.3, W0=net.W[l]) for l in range(L + 1)]
    return xs + ws


def _pair(compiled, **settings):
    return (FastBackend(compile=False, **settings), FastBackend(compile=compiled, **settings))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("network", ["mlp", "lenet5"])
def test_capped_block_solves_agree(compiled, network, dtype):
    """The benchmarks' capped steps (3 W-steps, 5 FISTA steps), every block of the network."""
    state = (_mlp_state if network == "mlp" else _conv_state)(dtype)
    eager, comp = _pair(compiled, w_steps=3, x_steps=5, capped_residual=False, capped_value=False)
    methods = set()
    for block in _blocks(state):
        a, b = eager.solve(block), comp.solve(block)
        methods.add(a.info["method"])
        assert a.argmin.dtype == b.argmin.dtype == dtype
        assert _rel(b.argmin, a.argmin) <= RTOL[dtype], (type(block).__name__, block.layer)
    # the chains that the benchmarks fuse all ran: FISTA, the span CG and the parameter-space CG,
    # compiled (none fell back to its eager form)
    assert methods >= ({"fista", "pncg-span", "pncg"} if network == "mlp" else {"fista", "pncg"})
    assert compiled.compiles > 0 and not compiled._failed


def test_a_chain_fuses_where_it_compiles(compiled):
    """``Kernels.fuses``: whether a chain on given arrays runs as one compiled kernel, which
    decides whether a W-block's line-search trials also sum the change (``wblocks``)."""
    small, large = np.zeros((2, 3)), np.zeros((1, fused.MIN_SIZE))
    assert not fused.EAGER.fuses(large)
    assert compiled.fuses(small)  # (min_size=0: every chain compiles)
    default = fused.Compiled()
    assert not default.fuses(small) and default.fuses(small, large)
    auto = fused.Auto()
    assert not auto.fuses(small) and auto.fuses(large) == auto.compiled


def test_a_compiled_w_step_takes_its_safeguard_from_its_trials_chain(compiled, calls):
    """A hidden W-block whose chains compile sums each trial's change in ``row_derivs_change``
    and takes no pass of its own for the safeguard (the eager twin takes one a step)."""
    from fenchel_cvx.fast import wblocks

    counts = calls(wblocks.HiddenRows, "change_along", "derivs_change_at")
    block = _blocks(_mlp_state(np.float64))[-2]  # W_0: hidden, in the span of the batch
    eager, comp = _pair(compiled, w_steps=3)
    b = comp.solve(block)
    assert counts["change_along"] == 0 and counts["derivs_change_at"] >= 3, counts
    counts.clear()
    a = eager.solve(block)
    assert counts["change_along"] == 3 and counts["derivs_change_at"] == 0, counts
    assert _rel(b.argmin, a.argmin) <= RTOL[np.float64]


@pytest.mark.parametrize("network", ["mlp", "lenet5"])
def test_solved_to_tolerance_the_paths_agree_and_reach_the_oracle(compiled, network):
    from fenchel_cvx.oracle import OracleBackend

    state = (_mlp_state if network == "mlp" else _conv_state)(np.float64, m=6)
    eager, comp = _pair(compiled, tol=1e-7)
    oracle = OracleBackend()
    for block in _blocks(state):
        a, b = eager.solve(block), comp.solve(block)
        assert a.converged and b.converged
        assert _rel(b.argmin, a.argmin) <= 1e-8
        ref = oracle.solve(block)
        assert ref.status == "optimal"
        assert abs(b.value - ref.value) <= 1e-6 * abs(ref.value) + 1e-12


# --- whole runs -----------------------------------------------------------------------------------
def _fit_small(backend, X0, Y, **kwargs):
    """``fit_bcd`` of a 40-16-10 ReLU / cross-entropy network in batches of 20 (float32)."""
    net = LiftedNetwork(
        [40, 16, 10], "relu", "cross_entropy", lam=0.2, rho=0.0, seed=1, dtype=np.float32
    )
    return fit_bcd(
        net,
        X0,
        Y,
        batch_size=20,
        gamma=0.3,
        backend=backend,
        strict=False,
        eval_every=None,
        **kwargs,
    )


def test_a_run_compiles_in_its_first_batch_only_and_holds_its_certificate(compiled):
    _, X0, Y, _ = _mlp_state(np.float32, m=60)
    backend = FastBackend(compile=compiled, w_steps=3, x_steps=5)
    calls = []

    def count(net_, rec):
        calls.append(compiled.compiles)

    res = _fit_small(backend, X0, Y, epochs=3, check_every=1, callback=count)
    assert len(calls) == 9 and len(set(calls[1:])) == 1, calls  # no compile after batch 1
    assert not compiled._failed
    # every round checked: every check but the capped blocks' optimality (inexact by design)
    broken = [
        v
        for r in res.history
        if r["checked"]
        for v in r["certificate"]["violations"]
        if v["check"] != "block_optimality"
    ]
    assert len(res.history) == 9 and all(r["checked"] for r in res.history) and not broken


def test_a_chain_tells_its_listeners_when_dynamo_compiles_it():
    def doubled(A):  # a chain of its own: no kernel of it compiled before
        return 2 * A

    heard = []
    runner = fused.Compiled(min_size=0)
    stop = runner.on_compile(heard.append)
    try:
        run = runner(doubled)
        run(np.ones((3, 5)))
        assert heard == ["doubled", None]  # its name while dynamo compiles, None once done
        run(np.zeros((3, 5)))  # the same shapes and dtypes: no compile, no notice
        assert heard == ["doubled", None]
        run(np.ones((3, 5), np.float32))
        assert heard == ["doubled", None] * 2  # a new dtype compiles again
        stop()
        run(np.ones((2, 4, 2)))
        assert heard == ["doubled", None] * 2 and not fused._WATCHERS
    finally:
        stop()
    assert fused.EAGER.on_compile(heard.append)() is None and not fused._WATCHERS


@pytest.mark.parametrize("compile_", [True, "auto", False])
def test_the_progress_bar_names_the_chain_compiling_in_the_first_batch(
    compile_, capsys, monkeypatch
):
    torch._dynamo.reset()  # the chains compile in this run, whatever ran before it
    runner = fused.Compiled(min_size=0)
    if compile_ == "auto":  # the default, with the test's small arrays large enough
        monkeypatch.setattr(fused, "MIN_SIZE", 0)
        monkeypatch.setattr(fused, "_compiled_default", lambda: runner)
    _, X0, Y, _ = _mlp_state(np.float32, m=40)
    backend = FastBackend(compile=runner if compile_ is True else compile_, w_steps=3, x_steps=5)
    _fit_small(backend, X0, Y, epochs=1, progress=True)
    err = capsys.readouterr().err
    chains = ("row_derivs_change", "row_curv", "row_change", "fista_step", "scaled_grad_u")
    named = {c for c in chains if f"BCD (fast): compiling {c}" in err}
    if compile_:
        assert {"row_derivs_change", "fista_step"} <= named, err[-2000:]
    else:
        assert "compiling" not in err
    assert not fused._WATCHERS  # the bar stopped listening when the run ended


def test_the_same_seed_gives_the_same_run_twice_and_resumes_to_it(compiled, tmp_path):
    _, X0, Y, _ = _mlp_state(np.float64, m=60)

    def run(**kw):
        net = LiftedNetwork([40, 16, 10], "relu", "cross_entropy", lam=0.2, rho=0.0, seed=1)
        fit_bcd(
            net,
            X0,
            Y,
            batch_size=20,
            epochs=2,
            gamma=0.3,
            strict=False,
            eval_every=None,
            backend=FastBackend(compile=compiled, w_steps=3, x_steps=5),
            **kw,
        )
        return net.W

    first, second = run(), run()
    assert all(np.array_equal(a, b) for a, b in zip(first, second))
    # interrupted after 4 of the 6 rounds, then resumed from the checkpoint
    stop = dict(n=0)

    def interrupt(net_, rec):
        stop["n"] += 1
        if stop["n"] == 4:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run(checkpoint=tmp_path, callback=interrupt)
    resumed = run(resume=tmp_path / "checkpoint.npz")
    assert all(np.array_equal(a, b) for a, b in zip(first, resumed))


# --- bad input and fallbacks ----------------------------------------------------------------------
def test_compile_is_refused_without_pytorch_or_a_compiler(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch fails
    with pytest.raises(
        ValueError,
        match="compile=True needs torch.compile: PyTorch is not installed: pip install torch",
    ):
        FastBackend(compile=True)
    monkeypatch.undo()
    monkeypatch.setattr(fused.shutil, "which", lambda name: None)
    with pytest.raises(
        ValueError, match="no C\\+\\+ compiler on the PATH.*apt-get install g\\+\\+"
    ):
        FastBackend(compile=True)
    with pytest.raises(ValueError, match="compile must be 'auto', 'blocks', True, False"):
        FastBackend(compile="yes")


def test_arrays_it_cannot_compile_are_refused_by_library(compiled):
    xp = pytest.importorskip("array_api_strict")
    net, X0, Y, Xs = _mlp_state(np.float64)
    block = blocks.x_block(net, X0, Y, Xs, 1)
    strict = dataclasses.replace(
        block, **{f: xp.asarray(getattr(block, f)) for f in ("U_prev", "Y", "W")}
    )
    with pytest.raises(
        ValueError,
        match="compile=True runs on NumPy arrays or PyTorch tensors, "
        "got arrays of array_api_strict",
    ):
        FastBackend(compile=compiled).solve(strict)


def test_a_chain_that_does_not_compile_runs_eagerly_with_a_warning():
    compiled = fused.Compiled(min_size=0)  # its own runner: the module's keeps no failed chain

    def reads_back(A):  # a host list of a traced value: a graph break, refused
        return A * (A.tolist()[0][1] + 1.0)  # by fullgraph=True

    A = np.arange(6.0).reshape(2, 3)
    with pytest.warns(RuntimeWarning, match="torch.compile failed on .*reads_back.*runs eagerly"):
        out = compiled(reads_back)(A)
    np.testing.assert_array_equal(out, reads_back(A))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once only: no second warning
        np.testing.assert_array_equal(compiled(reads_back)(A), reads_back(A))


def test_the_compiled_kernels_get_one_thread_beside_numpys_blas():
    """An integer budget gives NumPy's BLAS every core and the compiled kernels' pool one
    (``threads.plan(compiled=True)``); a dict is kept as given."""
    from fenchel_cvx.threads import plan

    assert plan(2, compiled=True) == {"numpy": 2, "scipy": 1, "torch": 1, "other": 2}
    assert plan(2)["torch"] == 2
    assert FastBackend(compile=True, threads=2).threads == plan(2, compiled=True)
    assert FastBackend(compile=False, threads=2).threads == 2
    own = {"numpy": 1, "torch": 2}
    assert FastBackend(compile=True, threads=own).threads == own


def test_a_failed_chain_runs_eagerly_for_its_arguments_only():
    """A chain that cannot compile for one activation class still compiles for another."""
    compiled = fused.Compiled(min_size=0)  # its own runner: the module's keeps no failed chain

    class HostReLU(type(activation("relu"))):
        def dphi(self, u):  # through a host list: no trace through it
            return (np.asarray(u.tolist()) > 0).astype(u.dtype)

    rng = np.random.default_rng(5)
    U, dU = rng.standard_normal((6, 9)), rng.standard_normal((6, 9))
    odd = HostReLU()
    with pytest.warns(RuntimeWarning, match="row_curv.*for these arguments"):
        got = compiled(fused.row_curv)(odd, 1.0, U, dU)
    np.testing.assert_allclose(got, fused.row_curv(odd, 1.0, U, dU), rtol=1e-12)
    before = compiled.compiles
    relu = compiled(fused.row_curv)(activation("relu"), 1.0, U + 1.0, dU)
    assert not any(
        key[0] is fused.row_curv and key[1] == (type(activation("relu")),)
        for key in compiled._failed
    )
    np.testing.assert_allclose(
        relu, fused.row_curv(activation("relu"), 1.0, U + 1.0, dU), rtol=1e-12
    )
    assert compiled.compiles >= before


def test_the_estimators_and_the_command_line_refuse_compile_before_any_work(monkeypatch, tmp_path):
    from fenchel_cvx import FenchelClassifier
    from fenchel_cvx.cli import main

    X, y = np.random.default_rng(0).random((20, 4)), np.arange(20) % 2
    with pytest.raises(ValueError, match="compile must be .*'auto'.*got 'yes'"):
        FenchelClassifier(compile="yes").fit(X, y)
    with pytest.raises(
        ValueError,
        match="compile=True sets the kernels of the fast backend by name: it needs backend='fast'",
    ):
        FenchelClassifier(compile=True, backend="cvxpy").fit(X, y)
    with pytest.raises(SystemExit):
        main(["train", "--compile", "--out", str(tmp_path / "a")])  # --backend cvxpy
    monkeypatch.setattr(fused.shutil, "which", lambda name: None)
    with pytest.raises(ValueError, match="no C\\+\\+ compiler on the PATH"):
        FenchelClassifier(compile=True).fit(X, y)
    with pytest.raises(SystemExit):
        main(["train", "--backend", "fast", "--compile", "--out", str(tmp_path / "b")])
    assert not (tmp_path / "b").exists() or not any((tmp_path / "b").iterdir())


def test_small_arrays_stay_eager_below_min_size():
    runner = fused.Compiled(min_size=10**6)
    rng = np.random.default_rng(4)
    V, U, dU = (rng.standard_normal((8, 16)) for _ in range(3))
    before = runner.compiles
    out = runner(fused.row_curv)(activation("relu"), 1.0, U, dU)
    assert runner.compiles == before  # nothing compiled for an 8 x 16 chain
    np.testing.assert_array_equal(out, fused.row_curv(activation("relu"), 1.0, U, dU))


# --- compile="auto", the default ----------------------------------------------------------------
def test_auto_is_the_default_and_compiles_only_chains_of_min_size_entries():
    auto = FastBackend().kernels
    assert isinstance(auto, fused.Auto) and auto.compiled
    rng = np.random.default_rng(6)
    act = activation("relu")
    small = [rng.standard_normal((8, 16)) for _ in range(2)]
    before = fused.compiled_graphs()
    np.testing.assert_array_equal(
        auto(fused.row_curv)(act, 0.5, *small), fused.row_curv(act, 0.5, *small)
    )
    assert fused.compiled_graphs() == before  # below MIN_SIZE: the eager chain itself
    rows = fused.MIN_SIZE // 500 + 1
    large = [rng.standard_normal((rows, 500)).astype(np.float32) for _ in range(2)]
    got = auto(fused.row_curv)(act, 0.5, *large)
    shared = fused._compiled_default()  # the process's compiled runner took it
    assert fused.row_curv in shared._compiled
    assert not any(key[0] is fused.row_curv for key in shared._failed)
    assert isinstance(got, np.ndarray) and got.dtype == np.float32
    np.testing.assert_allclose(got, fused.row_curv(act, 0.5, *large), rtol=1e-5)
    from fenchel_cvx.threads import plan

    assert FastBackend(threads=2).threads == plan(2, compiled=True)


def test_auto_runs_eagerly_without_a_compiler_or_on_other_libraries(monkeypatch):
    xp = pytest.importorskip("array_api_strict")
    A = xp.asarray(np.arange(6.0).reshape(2, 3))
    auto = fused.kernels("auto")
    assert auto(fused.row_curv)(activation("relu"), 1.0, A, A).shape == (2, 1)  # no refusal
    monkeypatch.setattr(fused.shutil, "which", lambda name: None)
    bare = FastBackend()
    assert not bare.kernels.compiled and bare.kernels(fused.row_curv) is fused.row_curv
    assert bare.threads == 1  # no kernels' pool to plan for


def test_auto_never_loads_pytorch_for_chains_below_min_size():
    """A default run of the MNIST MLP's size class (every chain below ``MIN_SIZE``) trains
    without importing PyTorch at all (a fresh process)."""
    import subprocess

    code = (
        "import sys, numpy as np\n"
        "from fenchel_cvx import LiftedNetwork\n"
        "from fenchel_cvx.bcd import fit_bcd\n"
        "from fenchel_cvx.fast import FastBackend\n"
        "rng = np.random.default_rng(0)\n"
        "X, Y = rng.random((30, 60)), np.eye(3)[:, rng.integers(0, 3, 60)]\n"
        "net = LiftedNetwork([30, 20, 3], 'relu', 'cross_entropy', lam=0.2, rho=0.0, seed=0)\n"
        "fit_bcd(net, X, Y, batch_size=30, epochs=1, gamma=0.3, strict=False,\n"
        "        backend=FastBackend(w_steps=2, x_steps=3))\n"
        "assert FastBackend().kernels.compiled\n"
        "print('torch' in sys.modules)\n"
    )
    # the timeout is a hang guard only: the run takes a few seconds
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


def test_a_backend_that_has_compiled_pickles_as_new_for_another_process():
    """A rank's copy of a backend (``parallel.Ranks`` pickles it to each rank) after this process
    compiled its chains: the copy's kernels are new (each process compiles its own) and train
    as the original does."""
    import pickle

    rng = np.random.default_rng(0)
    X0, Y = rng.standard_normal((30, 600)), np.eye(3)[:, rng.integers(0, 3, 600)]
    backend = FastBackend(compile=True)
    fit_bcd(LiftedNetwork([30, 40, 3], seed=0), X0, Y, iterations=1, backend=backend)
    assert backend.kernels._compiled  # (chains compiled in this process)
    copy_ = pickle.loads(pickle.dumps(backend))
    assert type(copy_.kernels) is type(backend.kernels) and not copy_.kernels._compiled
    one, two = (
        fit_bcd(LiftedNetwork([30, 40, 3], seed=0), X0, Y, iterations=2, backend=b).net.W
        for b in (backend, copy_)
    )
    assert all(np.array_equal(a, b) for a, b in zip(one, two))
