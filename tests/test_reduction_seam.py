"""The reduction seam (``reduce.py``): an X-block or a W-block solved on P column shards,
each shard in its own thread of one process (``SimulatedComm``), is the one-process solve.

FISTA's figures that decide for the whole block (the stopping tests' maxima, the descent
guard's values, cross-entropy's curvature bound) go through the communicator; every other step
is local to a shard's columns, each column's momentum and its restart included (a capped solve
with no tests reduces only its guard's values). So the shards' concatenated iterates equal the
one-process iterates up to the order of the sums: 1e-12 of the largest entry here, on every
X-block of the MNIST MLP and of LeNet-5 (a batch of 500 images of the embedded
sample, float64, X moved off the feed-forward point), for P = 2 and 3, in the benchmarks'
capped solves (20 steps, no tests) and in tested ones (to a KKT residual of 1e-9). A figure
that bypasses the seam shows: a planted fault that keeps a shard's own stopping figures stops
the shards apart, which the simulated communicator names.

The W-blocks' nonlinear CG (``pncg.py``) takes its sums over the columns of X~ (the gradient's
data part, the Gram preconditioner, the line searches' derivatives and changes, the values, the
block's own KKT residual) through the same seam, and W is whole on every shard: every shard
returns the same W, equal to the one-process solve's up to the order of the sums, on every
W-block of both networks, in the training's capped solves (10 steps) and in tested ones (to
1e-9). A block whose solve needs every column of its rows (data space: the MLP's W_0 has fewer
points than rows of X~; Newton rows) moves from column shards to row shards first, where the
figures over the rows are reduced. A planted fault that keeps each shard's own gradient shows.
"""

import dataclasses
import threading
import time

import numpy as np
import pytest

from fenchel_cvx import LiftedNetwork, lenet5, reduce
from fenchel_cvx.blocks import WHidden, w_block, x_block
from fenchel_cvx.datasets import load_mnist5k, one_hot
from fenchel_cvx.fast import wblocks
from fenchel_cvx.fast.pncg import PncgSettings, _needs_every_column, solve_pncg
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
    return make_states()


def make_states():
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
    """A planted fault: the stopping proxy's maxima (the step's max D and min D, the gradient's
    max and min), which decide when the tested solve stops, are each shard's own."""

    def _reduce(self, rank, values, op):
        out = super()._reduce(rank, values, op)
        return list(values) if tuple(op) == ("max", "min") else out


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


class Counting(reduce.SimulatedComm):
    """Counts shard 0's reductions (each one a collective on ranks)."""

    calls = 0

    def _reduce(self, rank, values, op):
        if rank == 0:  # (shard 0's thread alone writes the count)
            self.calls += 1
        return super()._reduce(rank, values, op)


@pytest.mark.parametrize("name,l", CASES, ids=[f"{n}-X_{l}" for n, l in CASES])
def test_a_capped_x_solve_meets_the_other_shards_only_at_its_descent_guard(states, name, l):
    """Each column restarts its own momentum (``xblocks._momentum``), so a capped solve with
    no tests (the training's X-blocks on an unchecked round) reduces no figure in its 20 steps:
    only the descent guard's values and, for the last layer's cross-entropy, its curvature
    bound (a maximum over the columns). The one-process step reduced its restart test's inner
    product at every step (20 and 21 reductions)."""
    net, X0, Y, Xs = states[name]
    block, Z = x_block(net, X0, Y, Xs, l), Xs[l - 1]
    comm = Counting(2)
    _, steps = sharded(block, Z, SOLVES["capped"], comm)
    assert steps == [SOLVES["capped"][0]] * 2
    assert comm.calls == (2 if l == net.n_hidden else 1)


@pytest.mark.parametrize("name,l", CASES, ids=[f"{n}-X_{l}" for n, l in CASES])
def test_a_capped_x_solve_of_one_column_is_that_column_of_the_whole_solve(states, name, l):
    """The block is a sum of one problem per column, and each column's momentum is its own:
    the capped solve of one column alone returns that column of the whole block's solve, to
    the rounding of the products (1e-12 of the largest entry: BLAS may round a column of a
    narrower product differently), for every 25th column. Where columns restart at different
    steps (the MLP's X_1 here), a restart decided by the whole block's inner product moves
    some of them by 5e-4. The descent guard, the one figure over every column left, reverts
    none of the solves."""
    net, X0, Y, Xs = states[name]
    block, Z = x_block(net, X0, Y, Xs, l), Xs[l - 1]
    whole, _, info = _solve(block, Z, SOLVES["capped"])
    assert 0 < info["restarts"] and not info["reverted"]
    for j in range(0, M, 25):
        one, _, one_info = _solve(block.restrict([j]), Z[:, [j]], SOLVES["capped"])
        assert not one_info["reverted"]
        assert np.max(np.abs(one - whole[:, [j]])) <= 1e-12 * np.max(np.abs(whole)), j


def test_shards_that_reduce_different_figures_fail_by_name():
    comm = reduce.SimulatedComm(2, timeout=10)

    def work(shard):
        return shard.reduce([1.0], "sum" if shard.rank == 0 else "max")

    with pytest.raises(RuntimeError, match="the shards reduce different figures"):
        comm.run(work)


def test_a_shard_that_finishes_while_another_enters_a_reduction_stops_it():
    """Shard 1 finishes after shard 0 has entered a reduction but before it waits there (its
    barrier slowed to open that window): shard 0 is stopped at once, not left waiting for a
    shard that will never come (``timeout=None``: it would wait for ever)."""
    comm = reduce.SimulatedComm(2, timeout=None)

    class SlowBarrier(threading.Barrier):
        def wait(self, timeout=None):
            time.sleep(0.3)  # shard 1 finishes meanwhile
            return super().wait(timeout)

    comm._barrier = SlowBarrier(2)

    def work(shard):
        if shard.rank == 1:
            time.sleep(0.1)  # after shard 0 has entered its reduction
            return None
        return shard.reduce([1.0], "sum")

    outcome: list = []

    def run():
        try:
            comm.run(work)
        except RuntimeError as err:
            outcome.append(err)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(10)
    assert not t.is_alive(), "shard 0 still waits for a shard that has finished"
    assert len(outcome) == 1 and "the shards took different paths" in str(outcome[0])


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


def w_sharded(block, setting, comm, cols=None):
    """The W-block solved on ``comm.P`` column shards from W0 (``cols``: each shard's columns;
    None: ``numpy.array_split``'s): each shard's (W, steps)."""
    max_iter, tol, settings = setting
    cols = np.array_split(np.arange(block.Xt.shape[1]), comm.P) if cols is None else cols

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


@pytest.mark.parametrize("name,l", [("mlp", 1), ("lenet5", 2), ("lenet5", 4)])
def test_w_shards_take_the_safeguard_from_the_last_trials_collective(states, name, l, monkeypatch):
    """On column shards each trial of a W-step's line search also sums the data term's change
    at its length, in the trial's collective: the descent safeguard meets the other shards
    only where the search returns a length it did not try, and every shard's W is the one that
    the safeguard's own collective gives, bit for bit."""
    block = _w_block(states, name, l)
    searches = [0]
    search = wblocks._Problem.search

    def counted(self, *args, **kwargs):
        searches[0] += self.comm.rank == 0
        return search(self, *args, **kwargs)

    monkeypatch.setattr(wblocks._Problem, "search", counted)

    def solve():
        searches[0], comm = 0, Counting(2)
        out = w_sharded(block, W_SOLVES["capped"], comm)
        return out[0][0], comm.calls, searches[0]

    together, meetings, n = solve()
    monkeypatch.setattr(wblocks._Problem, "safeguard_in_trials", lambda *a: False)
    apart, meetings_apart, n_apart = solve()
    assert n == n_apart == W_SOLVES["capped"][0]
    assert meetings_apart - n <= meetings < meetings_apart, (meetings, meetings_apart, n)
    np.testing.assert_array_equal(together, apart)


#: Newton rows from the first step, rows frozen at every step (a row shard may freeze all its own)
NEWTON = PncgSettings(newton_start=0, flip_tol=10**6, compact_every=1)
#: (network, layer, rho 0: the span solve, (max_iter, tol, settings), the method it takes)
ROW_CASES = {
    "mlp-W_0-capped": ("mlp", 0, False, W_SOLVES["capped"], "pncg"),
    "mlp-W_0-span-capped": ("mlp", 0, True, W_SOLVES["capped"], "pncg-span"),
    "mlp-W_0-span-tested": ("mlp", 0, True, W_SOLVES["tested"], "pncg-span"),
    "mlp-W_0-newton-capped": ("mlp", 0, False, (10, 1e-6, NEWTON), "pncg"),
    "lenet5-W_2-newton-tested": ("lenet5", 2, False, (300, 1e-9, NEWTON), "pncg"),
    "lenet5-W_3-newton-tested": ("lenet5", 3, False, (300, 1e-9, NEWTON), "pncg"),
}


@pytest.mark.parametrize("P", [2, 3])
@pytest.mark.parametrize("case", sorted(ROW_CASES))
def test_a_block_that_needs_every_column_moves_to_rows(states, case, P):
    """The MLP's W_0 (785 rows of X~, 500 points) solves in data space (with rho = 0 from the
    proximal centre, in the batch's span: ``span.py``), and Newton rows need every point of
    their row. On column shards such a block moves to row shards (``to_rows``: each shard its
    rows of W and V over every column), where the figures over the rows (the tests' maxima,
    the values, the frozen rows' count) are reduced, and W is gathered whole on every shard."""
    name, l, rho0, solve, method = ROW_CASES[case]
    block = _w_block(states, name, l)
    block = dataclasses.replace(block, rho=0.0) if rho0 else block
    max_iter, tol, settings = solve
    whole, steps, info = solve_pncg(np, block, block.W0, tol, max_iter, settings=settings)
    assert info["method"] == method and info["data_space"] == (name == "mlp")
    assert (info["newton_rows"] > 0) == (settings is NEWTON)
    if tol == 1e-9:
        assert info["converged"] and steps < max_iter
    out = w_sharded(block, solve, reduce.SimulatedComm(P))
    assert [it for _, it in out] == [steps] * P
    assert all(np.array_equal(W, out[0][0]) for W, _ in out)
    assert np.max(np.abs(out[0][0] - whole)) <= 1e-12 * np.max(np.abs(whole))


@pytest.mark.parametrize("case", ["mlp-W_0-span-tested", "lenet5-W_1-newton-capped"])
def test_a_block_moved_to_rows_takes_every_shards_own_column_count(states, case):
    """Shards whose column counts follow no rule (a conv layer's patches split by data point
    give each shard a multiple of its positions; here 45 %, 35 % and 20 % of the columns) move
    a block to rows with the counts they hold: every gather gets the shapes the shards hold
    (``check_shapes``), and the solve is the one-process solve."""
    name, l, settings = {
        "mlp-W_0-span-tested": ("mlp", 0, W_SOLVES["tested"]),
        "lenet5-W_1-newton-capped": ("lenet5", 1, (10, 1e-6, NEWTON)),
    }[case]
    block = _w_block(states, name, l)
    block = dataclasses.replace(block, rho=0.0) if name == "mlp" else block
    max_iter, tol, pncg = settings
    whole, steps, info = solve_pncg(np, block, block.W0, tol, max_iter, settings=pncg)
    m = block.Xt.shape[1]
    assert _needs_every_column(block, m, max_iter, pncg)  # shards move it to rows
    cols = np.split(np.arange(m), [int(0.45 * m), int(0.8 * m)])
    out = w_sharded(block, settings, reduce.SimulatedComm(3), cols)
    assert [it for _, it in out] == [steps] * 3
    assert all(np.array_equal(W, out[0][0]) for W, _ in out)
    assert np.max(np.abs(out[0][0] - whole)) <= 1e-12 * np.max(np.abs(whole))


def test_a_block_with_fewer_rows_than_shards_is_refused_by_name_where_it_moves_to_rows(states):
    """Moved to rows, a shard without rows would reduce nothing; every shard refuses such a
    block, by name, before any collective (no shard waits for another)."""
    block = _w_block(states, "mlp", 0)  # data space: 785 rows of X~, 500 points
    block = dataclasses.replace(block, V=block.V[:2], W0=block.W0[:2], rho=0.0)
    with pytest.raises(ValueError, match="W_0 moves to rows on 3 shards but has 2 rows"):
        w_sharded(block, W_SOLVES["tested"], reduce.SimulatedComm(3))


def test_a_coupled_last_block_is_refused_on_row_shards(states):
    block = _w_block(states, "mlp", 1)  # cross-entropy couples the rows
    comm = reduce.SimulatedComm(2, timeout=20, split="rows")
    with pytest.raises(ValueError, match="CrossEntropy couples its rows: split it by columns"):
        comm.run(lambda shard: solve_pncg(np, block, block.W0, 1e-6, 10, comm=shard))


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


class Sharded:
    """The fast backend's block solvers with every solve on ``P`` column shards of a
    ``SimulatedComm`` (a thread each): an X-block's columns split (``restrict``), a W-block's
    columns of X~ and of its targets (``columns``); the argmin and the image reassembled. Each
    shard keeps its own Gram factors (a cache per rank), as a process of its own would."""

    def __init__(self, P, solve_x, solve_pncg):
        self.P, self.solve_x, self.solve_pncg = P, solve_x, solve_pncg
        self.caches = [{} for _ in range(P)]
        self.solves = 0

    def split(self, m):
        return np.array_split(np.arange(m), self.P)

    def x(self, xp, block, Z, tol, max_iter, settings, comm=None):  # (comm: one process's)
        cols = self.split(Z.shape[1])

        def work(shard):
            part = block.restrict(cols[shard.rank])
            return self.solve_x(xp, part, Z[:, cols[shard.rank]], tol, max_iter, settings, shard)

        return self.joined(reduce.SimulatedComm(self.P).run(work), axis=1)

    def w(self, xp, block, W, tol, max_iter, cache, settings, comm=None):
        cols = self.split(block.Xt.shape[1])

        def work(shard):
            part, mine = columns(block, cols[shard.rank]), self.caches[shard.rank]
            return self.solve_pncg(xp, part, W, tol, max_iter, mine, settings, shard)

        return self.joined(reduce.SimulatedComm(self.P).run(work), axis=None)

    def joined(self, out, axis):
        """One solve's result from its shards': the same steps on each, the argmin joined by
        columns (``axis=1``) or whole on each (None), the images joined by columns."""
        self.solves += 1
        (Z, it, info), steps = out[0], [o[1] for o in out]
        assert steps == [it] * self.P
        if axis is not None:
            Z = np.concatenate([o[0] for o in out], axis=axis)
        images = [o[2].get("U") for o in out]
        U = None if any(u is None for u in images) else np.concatenate(images, axis=1)
        return Z, it, {**info, "U": U}


@pytest.mark.parametrize("P", [2, 3])
@pytest.mark.parametrize("recipe", ["mlp", "lenet5"])
def test_whole_networks_on_shards_reproduce_one_process_training(recipe, P, monkeypatch):
    """The pinned recipes (three batches of Algorithm 2 as the MNIST benchmarks train the MLP
    and LeNet-5, float64, with the certificate's checks on the last) with every block solved
    on P column shards: the same weights and X's as in one process, to 1e-12 of each array's
    largest entry, and the same certificate (its checks, verdicts and violations: the capped
    blocks above the tolerance, whose residuals agree to 1e-9)."""
    from fenchel_cvx import fast
    from pinned import record

    data = record.mnist()
    one = record.run_batches(recipe, compile=False, data=data)
    sharded = Sharded(P, fast.solve_x, fast.solve_pncg)
    monkeypatch.setattr(fast, "solve_x", sharded.x)
    monkeypatch.setattr(fast, "solve_pncg", sharded.w)
    many = record.run_batches(recipe, compile=False, data=data)
    rounds, n_W = len(one.records), len(one.snapshots[0][1])
    assert sharded.solves == rounds * (2 * n_W - 1)  # every X_l and W_l of every round
    for (name, A), (name_s, B) in zip(one.snapshots, many.snapshots):
        assert name == name_s
        for a, b in zip(A, B):
            assert np.max(np.abs(a - b)) <= 1e-12 * np.max(np.abs(a)), name
    assert [r["certificate"]["checked"] for r in one.records][-1]  # the last round checked
    for rec, rec_s in zip(one.records, many.records):
        cert, cert_s = rec["certificate"], rec_s["certificate"]
        assert (cert.get("checked"), cert["held"]) == (cert_s.get("checked"), cert_s["held"])
        found = [(v["check"], v["layer"], v["detail"]) for v in cert_s["violations"]]
        assert found == [(v["check"], v["layer"], v["detail"]) for v in cert["violations"]]
        for v, v_s in zip(cert["violations"], cert_s["violations"]):
            assert v_s["value"] == pytest.approx(v["value"], rel=1e-9, nan_ok=True)


def test_at_most_running_shards_compute_at_once_and_every_shard_sees_the_whole_sum():
    """``SimulatedComm(P, running=k)``: P shards, k of them computing at any time (a shard
    gives its turn up inside a collective): the sums are every shard's, in shard order."""
    import threading
    import time

    lock, now, most = threading.Lock(), [0], [0]

    def work(shard):
        for _ in range(2):
            with lock:
                now[0] += 1
                most[0] = max(most[0], now[0])
            time.sleep(0.002)
            with lock:
                now[0] -= 1
            total = shard.reduce([float(shard.rank)], "sum")[0]
        return total

    out = reduce.SimulatedComm(8, timeout=None, running=2).run(work)
    assert out == [28.0] * 8 and most[0] == 2
    with pytest.raises(ValueError, match="running must be an integer >= 1 or None, got 0"):
        reduce.SimulatedComm(2, running=0)
    with pytest.raises(ValueError, match=r"timeout must be None .*running=2 of P=8.*got timeout=5"):
        reduce.SimulatedComm(8, timeout=5, running=2)


def test_shards_waiting_for_a_turn_when_one_fails_stop_without_computing():
    """``SimulatedComm(P, running=1)``: once a shard has raised, the shards still waiting for
    their turn do not start their work; the run raises the first shard's error."""
    import threading

    lock, started = threading.Lock(), [0]

    def work(shard):
        with lock:
            started[0] += 1
        raise KeyError(f"shard {shard.rank} fails")

    with pytest.raises(KeyError, match="fails"):
        reduce.SimulatedComm(6, timeout=None, running=1).run(work)
    assert started[0] == 1


def test_every_round_ends_by_verifying_its_communicator_and_a_disagreement_stops_the_run():
    """``comm.verify()`` (the ranks' agreement on the reductions a ``TorchComm`` took on a
    device) is called at the end of every round, checked or not, and at the end of the run;
    the error it raises stops the run."""
    from fenchel_cvx.bcd import fit_bcd

    class Counted(reduce.Local):
        calls = 0

        def verify(self):
            Counted.calls += 1

    class Disagreeing(reduce.Local):
        def verify(self):
            raise RuntimeError("the ranks reduce different figures at once (planted)")

    ds = load_mnist5k()
    X, Y = ds.X_train[:, :60], one_hot(ds.y_train[:60], 10)
    net = LiftedNetwork([784, 8, 10], "relu", "cross_entropy", lam=0.1, rho=1.0, seed=0)
    result = fit_bcd(net, X, Y, backend="fast", batch_size=20, epochs=1, comm=Counted())
    assert Counted.calls == len(result.history.records) + 1 == 4
    net = LiftedNetwork([784, 8, 10], "relu", "cross_entropy", lam=0.1, rho=1.0, seed=0)
    with pytest.raises(RuntimeError, match="different figures at once"):
        fit_bcd(net, X, Y, backend="fast", batch_size=20, epochs=1, comm=Disagreeing())


@pytest.mark.parametrize("library", ["numpy", "torch", "array_api_strict"])
def test_an_empty_shards_maximum_is_a_zero_array_like_any_other_shards(library):
    """``_util.most``: a row shard with no rows (or all frozen) reduces a 0-d zero of its
    array's dtype and library, as the other shards reduce their maxima (``TorchComm`` picks
    its path by the values' kind: a Python number on one rank would take another path)."""
    from array_api_compat import array_namespace

    from fenchel_cvx.fast._util import most

    lib = pytest.importorskip(library)
    xp = array_namespace(lib.asarray([1.0]))
    empty, full = xp.zeros((0, 3), dtype=xp.float32), xp.asarray([[1.0, -2.0]], dtype=xp.float32)
    for got, want in ((most(xp, empty), 0.0), (most(xp, full), 1.0)):
        assert got.shape == () and got.dtype == xp.float32
        assert library == "numpy" or type(got) is type(full)  # (NumPy's max: a NumPy scalar)
        assert float(got) == want
