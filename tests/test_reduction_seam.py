"""The reduction seam (``fast/reduce.py``): an X-block or a W-block solved on P column shards,
each shard in its own thread of one process (``SimulatedComm``), is the one-process solve.

FISTA's figures that decide for the whole block (the restart test's inner product, the stopping
tests' maxima, the descent guard's values, cross-entropy's curvature bound) go through the
communicator; every other step is local to a shard's columns. So the shards' concatenated
iterates equal the one-process iterates up to the order of the sums: 1e-12 of the largest entry
here, on every X-block of the MNIST MLP and of LeNet-5 (a batch of 500 images of the embedded
sample, float64, X moved off the feed-forward point), for P = 2 and 3, in the benchmarks'
capped solves (20 steps, no tests) and in tested ones (to a KKT residual of 1e-9). A figure
that bypasses the seam shows: a planted fault that keeps a shard's own stopping figures stops
the shards apart, which the simulated communicator names.

The W-blocks' nonlinear CG (``pncg.py``) takes its sums over the columns of X~ (the gradient's
data part, the Gram preconditioner, the line searches' derivatives and changes, the values, the
block's own KKT residual) through the same seam, and W is whole on every shard: every shard
returns the same W, equal to the one-process solve's up to the order of the sums, on every
W-block of both networks that a column split serves (the MLP's W_0 has fewer points than rows
of X~: its data-space solve needs every column, and the split is refused by name), in the
training's capped solves (10 steps) and in tested ones (to 1e-9, no Newton rows: a Newton row
needs its row's every point). A planted fault that keeps each shard's own gradient shows.
"""

import dataclasses

import numpy as np
import pytest

from fenchel_cvx import LiftedNetwork, lenet5
from fenchel_cvx.blocks import WHidden, w_block, x_block
from fenchel_cvx.datasets import load_mnist5k, one_hot
from fenchel_cvx.fast import reduce, wblocks
from fenchel_cvx.fast.pncg import PncgSettings, solve_pncg
from fenchel_cvx.fast.xblocks import FistaSettings, solve_x

M = 500
#: (max_iter, tol, capped_residual): the benchmarks' capped solve, and a tested one
SOLVES = {"capped": (20, 1e-6, False), "tested": (400, 1e-9, True)}


def _network(name):
    if name == "mlp":
        return LiftedNetwork([784, 300, 10], "relu", "cross_entropy", lam=0.2, seed=0)
    return lenet5((1, 28, 28), 10, activation="relu", loss="cross_entropy", lam=1.0, seed=0)


@pytest.fixture(scope="module")
def states():
    """(net, X0, Y, Xs) of each network on the first 500 images, Xs moved off the
    feed-forward point (so that every block has somewhere to go)."""
    ds = load_mnist5k()
    X0, Y = ds.X_train[:, :M], one_hot(ds.y_train[:M], 10)
    rng = np.random.default_rng(52)
    out = {}
    for name in ("mlp", "lenet5"):
        net = _network(name)
        Xs = [np.maximum(X + 0.1 * rng.standard_normal(X.shape), 0) for X in net.forward(X0)[0]]
        out[name] = (net, X0, Y, Xs)
    return out


def _solve(block, Z, setting, comm=reduce.LOCAL):
    max_iter, tol, tested = setting
    return solve_x(np, block, Z, tol, max_iter, FistaSettings(capped_residual=tested), comm)


def sharded(block, Z, setting, comm):
    """The block solved on ``comm.P`` column shards: (the concatenated Z, each shard's steps)."""
    cols = np.array_split(np.arange(Z.shape[1]), comm.P)

    def work(shard):
        z, it, _ = _solve(block.restrict(cols[shard.rank]), Z[:, cols[shard.rank]], setting, shard)
        return z, it

    out = comm.run(work)
    return np.concatenate([z for z, _ in out], axis=1), [it for _, it in out]


CASES = [("mlp", 1)] + [("lenet5", l) for l in (1, 2, 3, 4)]


@pytest.mark.parametrize("P", [2, 3])
@pytest.mark.parametrize("setting", sorted(SOLVES))
@pytest.mark.parametrize("name,l", CASES, ids=[f"{n}-X_{l}" for n, l in CASES])
def test_shards_reproduce_the_one_process_solve(states, name, l, setting, P):
    net, X0, Y, Xs = states[name]
    block, Z = x_block(net, X0, Y, Xs, l), Xs[l - 1]
    whole, steps, info = _solve(block, Z, SOLVES[setting])
    assert np.max(np.abs(whole - Z)) > 1e-3  # the solve moved
    parts, shard_steps = sharded(block, Z, SOLVES[setting], reduce.SimulatedComm(P))
    assert shard_steps == [steps] * P
    assert np.max(np.abs(parts - whole)) <= 1e-12 * np.max(np.abs(whole))
    if setting == "tested":
        assert info["converged"] and 1 < steps < SOLVES[setting][0]


class OwnStops(reduce.SimulatedComm):
    """A planted fault: the step's maxima (max D, min D), which decide when the tested solve
    stops, are each shard's own."""

    def _reduce(self, rank, values, op):
        out = super()._reduce(rank, values, op)
        return [*values[:2], out[2]] if tuple(op) == ("max", "min", "sum") else out


def test_a_figure_that_bypasses_the_seam_is_caught(states):
    """Each shard's own stopping figures stop the shards at different steps, which the
    communicator names: here the first shard's columns start at their minimiser, the
    second's away from it."""
    net, X0, Y, Xs = states["mlp"]
    block, Z = x_block(net, X0, Y, Xs, 1), Xs[0].copy()
    first = np.arange(M // 2)
    Z[:, first] = _solve(block, Z, SOLVES["tested"])[0][:, first]
    assert sharded(block, Z, SOLVES["tested"], reduce.SimulatedComm(2))[0].shape == Z.shape
    with pytest.raises(RuntimeError, match="the shards (reduce different figures|took different)"):
        sharded(block, Z, SOLVES["tested"], OwnStops(2, timeout=20))


def test_shards_that_reduce_different_figures_fail_by_name():
    comm = reduce.SimulatedComm(2, timeout=10)

    def work(shard):
        return shard.reduce([1.0], "sum" if shard.rank == 0 else "max")

    with pytest.raises(RuntimeError, match="the shards reduce different figures"):
        comm.run(work)


def test_a_bad_op_or_shard_count_is_refused_by_name():
    with pytest.raises(ValueError, match="P must be an integer >= 1, got 0"):
        reduce.SimulatedComm(0)
    with pytest.raises(ValueError, match="op must be one of"):
        reduce.SimulatedComm(1).run(lambda shard: shard.reduce([1.0], "mean"))


#: (max_iter, tol, settings): the training's capped W-solve, and a tested one without Newton rows
W_SOLVES = {
    "capped": (10, 1e-6, PncgSettings(capped_residual=False, capped_value=False)),
    "tested": (300, 1e-9, PncgSettings(newton_cap=0)),
}
W_CASES = [("mlp", 1)] + [("lenet5", l) for l in range(5)]


def _w_block(states, name, l):
    net, X0, Y, Xs = states[name]
    return w_block(net, X0, Y, Xs, l, gamma=0.5, W0=net.W[l])


def columns(block, cols):
    """A W-block on the columns ``cols`` of its X~ and targets: one shard's share."""
    target = {"V": block.V[:, cols]} if isinstance(block, WHidden) else {"Y": block.Y[:, cols]}
    return dataclasses.replace(block, Xt=block.Xt[:, cols], **target)


def w_sharded(block, setting, comm):
    """The W-block solved on ``comm.P`` column shards from W0: each shard's (W, steps)."""
    max_iter, tol, settings = setting
    cols = np.array_split(np.arange(block.Xt.shape[1]), comm.P)

    def work(shard):
        part = columns(block, cols[shard.rank])
        W, it, _ = solve_pncg(np, part, block.W0, tol, max_iter, settings=settings, comm=shard)
        return W, it

    return comm.run(work)


@pytest.mark.parametrize("P", [2, 3])
@pytest.mark.parametrize("setting", sorted(W_SOLVES))
@pytest.mark.parametrize("name,l", W_CASES, ids=[f"{n}-W_{l}" for n, l in W_CASES])
def test_w_shards_reproduce_the_one_process_solve(states, name, l, setting, P):
    block = _w_block(states, name, l)
    max_iter, tol, settings = W_SOLVES[setting]
    whole, steps, info = solve_pncg(np, block, block.W0, tol, max_iter, settings=settings)
    assert not info["data_space"] and np.max(np.abs(whole - block.W0)) > 1e-4  # it moved
    if setting == "tested":
        assert info["converged"] and 1 < steps < max_iter
    out = w_sharded(block, W_SOLVES[setting], reduce.SimulatedComm(P))
    assert [it for _, it in out] == [steps] * P
    for W, _ in out:
        assert np.array_equal(W, out[0][0])  # every shard holds the same W
    assert np.max(np.abs(out[0][0] - whole)) <= 1e-12 * np.max(np.abs(whole))


def test_a_data_space_block_is_not_split_by_columns(states):
    """The MLP's W_0 (785 rows of X~, 500 points) solves in data space in one process: on
    column shards it is refused, naming the split it needs."""
    block = _w_block(states, "mlp", 0)
    assert solve_pncg(np, block, block.W0, 1e-6, 10)[2]["data_space"]
    with pytest.raises(ValueError, match=r"fewer points \(500\) than rows of X~ \(785\)"):
        w_sharded(block, W_SOLVES["capped"], reduce.SimulatedComm(2, timeout=20))


def test_newton_rows_on_column_shards_are_refused_by_name(states):
    block = _w_block(states, "lenet5", 3)
    with pytest.raises(ValueError, match="Newton rows need every column.*newton_cap=0, got None"):
        w_sharded(block, (300, 1e-9, PncgSettings()), reduce.SimulatedComm(2, timeout=20))


def test_a_w_gradient_that_bypasses_the_seam_is_caught(states, monkeypatch):
    """Each shard's own gradient (its columns' A X~^T alone): the shards step apart, and their
    line searches reduce different figures, which the communicator names."""
    block = _w_block(states, "lenet5", 3)
    setting = W_SOLVES["capped"]
    whole = solve_pncg(np, block, block.W0, setting[1], setting[0], settings=setting[2])[0]

    def own_gradient(self, A, R):
        G = wblocks.matmul_nt(A, self.Xt)
        return [G if self.coef == 1 else self.coef * G, R]

    assert np.max(np.abs(w_sharded(block, setting, reduce.SimulatedComm(2))[0][0] - whole)) < 1e-9
    monkeypatch.setattr(wblocks._Problem, "parts", own_gradient)
    with pytest.raises(RuntimeError, match="the shards (reduce different figures|took different)"):
        w_sharded(block, setting, reduce.SimulatedComm(2, timeout=20))


@pytest.mark.parametrize("P", [2, 3])
@pytest.mark.parametrize("loss", ["mse", "huber"])
def test_the_other_last_w_solves_on_shards_reproduce_one_process(states, loss, P):
    """MSE's closed form (``solve_ridge``: the normal equations, then refinement) and Huber's
    Newton-CG (``solve_newton``: Hessian products, the majorised bracket) on column shards."""
    net, X0, Y, Xs = states["mlp"]
    other = LiftedNetwork([784, 300, 10], "relu", loss, lam=0.2, seed=0)
    other.W = [W.copy() for W in net.W]
    block = w_block(other, X0, Y, Xs, 1, gamma=0.5, W0=net.W[1])
    if loss == "mse":

        def solve(part, comm=reduce.LOCAL):
            return wblocks.solve_ridge(np, part, block.W0, 1e-10, 20, comm=comm)[0]
    else:

        def solve(part, comm=reduce.LOCAL):
            return solve_pncg(np, part, block.W0, 1e-9, 100, comm=comm)[0]

    whole = solve(block)
    assert block.kkt_residual(whole) <= 1e-9
    cols = np.array_split(np.arange(block.Xt.shape[1]), P)
    out = reduce.SimulatedComm(P).run(lambda shard: solve(columns(block, cols[shard.rank]), shard))
    assert all(np.array_equal(W, out[0]) for W in out)
    assert np.max(np.abs(out[0] - whole)) <= 1e-12 * np.max(np.abs(whole))
