"""Each block solve compiled whole (``FastBackend(compile="blocks")``, ``fast.whole``) on
PyTorch tensors, against the eager solve of the same tensors:

- each block kind of a dense ReLU / cross-entropy network (the MLP benchmark's kind, smaller),
  solved from identical inputs with capped steps, compiles whole (no eager fallback) and agrees
  to 1e-5 relative in float32 (the X-block to 1e-10 in float64);
- a batched run compiles its blocks in its first batch only (dynamo's counters), holds its
  certificate and ends at the eager run's weights;
- a W-block's line-search iterations call one subgraph of its graph (a nested compile region);
- NumPy arrays are refused, with what to use for them, and settings whose solves read back to
  the host and a PyTorch older than ``whole.MIN_TORCH`` when the backend is built; a solve that
  fails to compile runs eagerly with a warning.

On the CPU the graphs are inductor's C++ kernels; on a GPU the same graphs run as CUDA graphs
(tests/test_gpu.py, where a device is present).
"""

import re
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="compile='blocks' needs PyTorch (the bench extra)")

from fenchel_cvx import LiftedNetwork, blocks, fit_bcd  # noqa: E402
from fenchel_cvx.fast import FastBackend, fused, whole  # noqa: E402
from test_compiled import _mlp_state  # noqa: E402

if fused.compiler_problem() is not None:
    pytest.skip(
        f"torch.compile cannot run here: {fused.compiler_problem()}", allow_module_level=True
    )
#: the tests that compile: skipped on a PyTorch older than ``whole.MIN_TORCH`` (its refusal is
#: tested on any)
compiles = pytest.mark.skipif(
    whole.too_old(torch) is not None, reason=f"compile='blocks' needs {whole.too_old(torch)}"
)

STEPS = dict(w_steps=2, x_steps=2, capped_residual=False, capped_value=False)


def _state(dtype):
    """``test_compiled``'s dense network and perturbed lifted point, on tensors."""
    net, X0, Y, Xs = _mlp_state(dtype)
    net.W = [torch.asarray(W) for W in net.W]
    return net, torch.asarray(X0), torch.asarray(Y), [torch.asarray(X) for X in Xs]


def _rel(a, b):
    return float((a - b).abs().max() / b.abs().max())


@pytest.mark.parametrize(
    "kind,dtype,rel",
    [
        ("x", np.float32, 1e-5),
        ("x", np.float64, 1e-10),
        ("w_hidden", np.float32, 1e-5),
        ("w_last", np.float32, 1e-5),
    ],
)
@pytest.mark.slow
@compiles
def test_a_block_solved_whole_equals_its_eager_solve(kind, dtype, rel):
    net, X0, Y, Xs = _state(dtype)
    if kind == "x":
        block, start = blocks.x_block(net, X0, Y, Xs, 1), Xs[0]
    else:
        l = 0 if kind == "w_hidden" else 1
        block = blocks.w_block(net, X0, Y, Xs, l, gamma=0.5, W0=net.W[l])
        start = net.W[l]
    backend, before = FastBackend(compile="blocks", **STEPS), fused.compiled_graphs()
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # an eager fallback would warn
        whole = backend.solve(block, start)
    assert not backend.kernels._failed and fused.compiled_graphs() > before  # compiled, whole
    eager = FastBackend(compile=False, **STEPS).solve(block, start)
    assert isinstance(whole.argmin, torch.Tensor) and whole.argmin.dtype == eager.argmin.dtype
    assert _rel(whole.argmin, eager.argmin) <= rel
    assert _rel(whole.argmin, start) > 1e3 * rel  # the solve moved: the agreement is not a start's
    assert whole.iterations == eager.iterations and whole.status == eager.status


@pytest.mark.slow
@compiles
def test_a_run_compiles_its_blocks_in_its_first_batch_only_and_ends_where_the_eager_one_does():
    net0, _, _, _ = _state(np.float32)
    rng = np.random.default_rng(1)
    X = torch.asarray(rng.random((40, 48)).astype(np.float32))
    Y = torch.asarray(np.eye(10, dtype=np.float32)[:, rng.integers(0, 10, 48)])
    graphs, runs, before = [], {}, fused.compiled_graphs()
    for compile_ in ("blocks", False):
        net = LiftedNetwork(
            [40, 16, 10], "relu", "cross_entropy", lam=0.2, rho=0.0, seed=0, dtype=np.float32
        )
        net.W = [torch.asarray(W) for W in net.W]
        runs[compile_] = fit_bcd(
            net,
            X,
            Y,
            batch_size=24,
            epochs=2,
            gamma=0.5,
            backend=(backend := FastBackend(compile=compile_, **STEPS)),
            strict=False,
            eval_every=None,
            check_every=1,
            callback=(lambda n, r: graphs.append(fused.compiled_graphs())) if compile_ else None,
        )
        if compile_:
            whole_kernels = backend.kernels
    assert len(graphs) == 4 and len(set(graphs[1:])) == 1, graphs  # no compile after batch 1
    assert graphs[0] > before and not whole_kernels._failed  # its blocks compiled, none fell back
    whole, eager = runs["blocks"], runs[False]
    for Ww, We in zip(whole.net.W, eager.net.W):
        assert isinstance(Ww, torch.Tensor) and _rel(Ww, We) <= 1e-4
    broken = [
        v
        for r in whole.history
        if r["checked"]
        for v in r["certificate"]["violations"]
        if v["check"] != "block_optimality"  # capped solves: inexact by design
    ]
    assert all(r["checked"] for r in whole.history) and not broken


@compiles
@pytest.mark.parametrize("layer", [0, 1], ids=["w_hidden", "w_last"])
def test_a_w_blocks_line_search_iterations_call_one_compiled_region(layer):
    """``Blocks.region``: every Newton iteration of a W-block's line searches (``newton_step``,
    10 a search, one search a step; the hidden rows' and the cross-entropy layer's) calls a
    subgraph of the block's graph, which inductor compiles once, in place of ten inlined copies
    a step (dynamo's graph, inspected without inductor)."""
    from array_api_compat import array_namespace

    from fenchel_cvx.fast import _solve_block

    net, X0, Y, Xs = _state(np.float32)
    block = blocks.w_block(net, X0, Y, Xs, layer, gamma=0.5, W0=net.W[layer])
    backend, regions = FastBackend(compile="blocks", **STEPS), []

    def inspect(gm, example_inputs):
        regions.extend(
            node.args[0].target
            for node in gm.graph.nodes
            if node.target is torch.ops.higher_order.invoke_subgraph
        )
        return gm

    def solve(Z):
        return _solve_block(block, backend, array_namespace(Z), Z, 1e-6, cache={})[0]

    torch.compile(solve, backend=inspect, fullgraph=True)(net.W[layer])
    # a subgraph serves at least a search's 10 iterations (all of them, as a rule; the last
    # layer's second search, after another block's graph, may install one of its own)
    assert len(regions) == 10 * STEPS["w_steps"] and len(set(regions)) <= STEPS["w_steps"]


@compiles
def test_numpy_arrays_are_refused_naming_what_to_use():
    net, X0, Y, Xs = _state(np.float32)
    net.W = [W.numpy() for W in net.W]
    block = blocks.x_block(net, X0.numpy(), Y.numpy(), [X.numpy() for X in Xs], 1)
    with pytest.raises(ValueError, match="compile='blocks' compiles whole block solves on Py"):
        FastBackend(compile="blocks", **STEPS).solve(block, Xs[0].numpy())


@compiles
def test_a_solve_that_fails_to_compile_runs_eagerly_with_a_warning(monkeypatch):
    from fenchel_cvx.fast.whole import Blocks

    def broken(self, solver, names, cuda):
        def run(*args):
            raise RuntimeError("capture failed: operation not permitted when stream is capturing")

        return run

    monkeypatch.setattr(Blocks, "_compile", broken)
    net, X0, Y, Xs = _state(np.float32)
    block = blocks.x_block(net, X0, Y, Xs, 1)
    backend = FastBackend(compile="blocks", **STEPS)
    with pytest.warns(RuntimeWarning, match="compile='blocks' failed on the x_last block of lay"):
        res = backend.solve(block, Xs[0])
    eager = FastBackend(compile=False, **STEPS).solve(block, Xs[0])
    assert torch.equal(res.argmin, eager.argmin)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # warned once: the next solve runs eagerly, silently
        assert torch.equal(backend.solve(block, Xs[0]).argmin, eager.argmin)


@compiles
def test_settings_that_read_back_are_refused_when_the_backend_is_built():
    with pytest.raises(ValueError, match="compile='blocks' needs solves that read nothing back"):
        FastBackend(compile="blocks")  # solves to tol, reporting the residual and the value
    with pytest.raises(ValueError, match="w_steps at most 10 and x_steps set.*w_steps=11"):
        FastBackend(compile="blocks", **{**STEPS, "w_steps": 11})  # Newton rows would start
    FastBackend(compile="blocks", **{**STEPS, "w_steps": (10, 1), "x_steps": (3,)})


@pytest.mark.parametrize("version", ["2.11.0+cu130", "2.9.1", "2.13.0a0+git1234"])
def test_a_pytorch_older_than_the_floor_is_refused_by_name(monkeypatch, version):
    monkeypatch.setattr(torch, "__version__", version)  # "2.9.1": older, though "2.9" > "2.1"
    match = rf"needs PyTorch 2\.13 or newer.*got PyTorch {re.escape(version)}: install"
    with pytest.raises(ValueError, match=match):
        FastBackend(compile="blocks", **STEPS)
    monkeypatch.setattr(torch, "__version__", "2.14.1")
    FastBackend(compile="blocks", **STEPS)
