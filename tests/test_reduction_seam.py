"""The reduction seam (``fast/reduce.py``): an X-block solved on P column shards, each shard in
its own thread of one process (``SimulatedComm``), is the one-process solve.

FISTA's figures that decide for the whole block (the restart test's inner product, the stopping
tests' maxima, the descent guard's values, cross-entropy's curvature bound) go through the
communicator; every other step is local to a shard's columns. So the shards' concatenated
iterates equal the one-process iterates up to the order of the sums: 1e-12 of the largest entry
here, on every X-block of the MNIST MLP and of LeNet-5 (a batch of 500 images of the embedded
sample, float64, X moved off the feed-forward point), for P = 2 and 3, in the benchmarks'
capped solves (20 steps, no tests) and in tested ones (to a KKT residual of 1e-9). A figure
that bypasses the seam shows: a planted fault that keeps a shard's own stopping figures stops
the shards apart, which the simulated communicator names.
"""

import numpy as np
import pytest

from fenchel_cvx import LiftedNetwork, lenet5
from fenchel_cvx.blocks import x_block
from fenchel_cvx.datasets import load_mnist5k, one_hot
from fenchel_cvx.fast import reduce
from fenchel_cvx.fast.xblocks import solve_x

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
    return solve_x(np, block, Z, tol, max_iter, capped_residual=tested, comm=comm)


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
