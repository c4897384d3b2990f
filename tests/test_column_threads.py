"""A block's figures on column shares, a thread each (``column_threads.py``), where the oracle and
the driver's checks form them.

- A block class whose ``columns`` does not take its share (a planted fault: every share from
  the first column) is caught by the conformance check of every block class
  (``test_conformance``).
- The MSE + ReLU X_L dual (``output_dual.solve``) on two threads returns the one-thread minimiser
  bit for bit (its chunks of columns are independent problems).
- ``OracleBackend`` checks on as many threads as it has Dask workers, and its results there are
  its one-thread results to round-off; a run's checked rounds (``block_checks``) form their
  figures on the backend's ``check_threads`` and record the one-thread figures to round-off.
"""

import copy
import os

import numpy as np
import pytest

from fenchel_cvx import LiftedNetwork, arrays, column_threads, reduce
from fenchel_cvx.bcd import fit_bcd
from fenchel_cvx.blocks import BLOCKS, WHidden, register_block, w_block, x_block
from fenchel_cvx.fast import FastBackend
from fenchel_cvx.oracle import OracleBackend
from fenchel_cvx.oracle import output_dual as od
from test_conformance import figures_on_column_threads_are_the_blocks

M = 2 * column_threads.MIN_COLUMNS + 100  # columns enough for two shares


class FirstShares(WHidden):
    """The hidden W-block whose every column share starts at its first column (the share's
    offset lost): a planted fault."""

    kind = "w_hidden_first_shares"

    def columns(self, index):
        return super().columns(slice(0, index.stop - index.start))


def test_a_block_class_whose_shares_are_not_its_columns_is_caught():
    register_block(FirstShares)
    try:
        with pytest.raises(AssertionError):
            figures_on_column_threads_are_the_blocks(FirstShares.kind)
    finally:
        del BLOCKS[FirstShares.kind]
    figures_on_column_threads_are_the_blocks("w_hidden")


def _problem(m=M, seed=0):
    rng = np.random.default_rng(seed)
    net = LiftedNetwork([6, 5, 3], "relu", "mse", lam=0.5, rho=0.1, seed=seed)
    X0, Y = rng.standard_normal((6, m)), np.eye(3)[:, rng.integers(0, 3, m)]  # 3 classes
    Xs, _ = net.forward(X0)
    Xs = [np.maximum(A + 0.3 * rng.standard_normal(A.shape), 0.0) for A in Xs]
    return net, X0, Y, Xs


def test_the_output_dual_on_two_threads_is_the_one_thread_minimiser_bit_for_bit():
    net, X0, Y, Xs = _problem()
    block = x_block(net, X0, Y, Xs, 1)
    one = od.solve_x_last(block)
    two = od.solve_x_last(block, threads=2)
    assert M > od.CHUNK  # two chunks at least
    for a, b in zip(one, two):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize(
    "loss,solver",
    [
        ("mse", "exact: MSE X_L dual Newton"),
        ("cross_entropy", "exact: cross-entropy X_L projected Newton"),
    ],
)
def test_the_oracle_checks_on_its_workers_count_and_finds_its_one_thread_figures(loss, solver):
    """The X_L block's chunks of columns on two threads: the one-thread minimiser bit for bit."""
    assert OracleBackend().check_threads == 1
    assert OracleBackend(n_jobs=2).check_threads == min(2, len(os.sched_getaffinity(0)))
    net, X0, Y, Xs = _problem()
    net = LiftedNetwork([6, 5, 3], "relu", loss, lam=0.5, rho=0.1, seed=0)
    block = x_block(net, X0, Y, Xs, 1)
    one = OracleBackend(tol=1e-9).solve(block)
    threaded = OracleBackend(tol=1e-9)
    threaded.check_threads = 2  # (a backend of 2 Dask workers would set it; none started here)
    two = threaded.solve(block)
    assert one.info["solver"] == two.info["solver"] == solver
    np.testing.assert_array_equal(two.argmin, one.argmin)
    assert two.value == pytest.approx(one.value, rel=1e-12)
    assert two.residual == pytest.approx(one.residual, rel=1e-9, abs=1e-13)


def test_the_checked_rounds_form_their_figures_on_the_backends_check_threads(monkeypatch):
    """Every block's figures, the round's objectives, divergences and Fenchel-Young check and
    the accuracies, on the backend's ``check_threads``: the one-thread figures to round-off."""
    shards = []
    run = reduce.SimulatedComm.run

    def counted(self, work):
        shards.append((self.P, self.running))
        return run(self, work)

    monkeypatch.setattr(reduce.SimulatedComm, "run", counted)
    records = {}
    for threads in (1, 2):
        net, X0, Y, _ = _problem(seed=1)
        backend = FastBackend(tol=1e-8)
        backend.check_threads = threads
        shards.clear()
        records[threads] = fit_bcd(net, X0, Y, backend=backend, iterations=2).history.records
        # per round: each of its 3 blocks before and after its solve, J, F, Fenchel-Young, the
        # divergences after each sweep, the training accuracy; on shares of CHUNK columns at
        # most (a W-block's W_ENTRIES: here one, or one a thread), ``threads`` of them at once
        chunks = -(-M // column_threads.CHUNK)
        assert len(shards) > 15 and {running for _, running in shards} == {threads}
        assert (chunks, threads) in shards and set(shards) <= {(chunks, threads), (2, 2)}
    figures = ("lifted_x", "network_x", "lifted_w", "network_w", "train_loss", "train_accuracy")
    for one, two in zip(records[1], records[2]):
        for key in figures:
            assert two[key] == pytest.approx(one[key], rel=1e-12), key
        assert two["divergence_w"] == pytest.approx(one["divergence_w"], rel=1e-9, abs=1e-15)
        assert len(one["blocks"]) == len(two["blocks"]) == 3  # X_1, W_1, W_0
        for a, b in zip(one["blocks"], two["blocks"]):
            assert b["value_after"] == pytest.approx(a["value_after"], rel=1e-12)
            assert b["residual"] == pytest.approx(a["residual"], rel=1e-9, abs=1e-13)
        assert one["certificate"]["held"] and two["certificate"]["held"]
        # recorded once, whatever the threads (check 1 on two shares records one layer's figure)
        assert len(two["certificate"]["min_divergence"]) == len(net.activations)
        assert two["certificate"]["min_divergence"] == pytest.approx(
            one["certificate"]["min_divergence"], rel=1e-12, abs=1e-15
        )


@pytest.mark.parametrize("threads, blas", [(1, 2), (2, 1)])
def test_shares_taken_in_turn_keep_the_processs_blas_threads(monkeypatch, threads, blas):
    """A wide block checked on one thread takes its shares in turn with the process's BLAS
    threads (2 here) for their products; shares computing at once take one BLAS thread each."""
    from threadpoolctl import threadpool_info

    from fenchel_cvx.threads import limit_threads, owner

    seen = []
    at = column_threads._at

    def counted(*args):
        pools = [p for p in threadpool_info() if p["user_api"] == "blas"]
        seen.append({p["num_threads"] for p in pools if owner(p["filepath"]) == "numpy"})
        return at(*args)

    monkeypatch.setattr(column_threads, "_at", counted)
    net, X0, Y, Xs = _problem(m=3 * column_threads.CHUNK, seed=2)
    block = x_block(net, X0, Y, Xs, 1)
    with limit_threads({"numpy": 2, "scipy": 2}):
        column_threads.figures(block, Xs[0], threads=threads, min_columns=1)
    assert len(seen) == 3 and all(s == {blas} for s in seen)


@pytest.mark.parametrize("kind", ["dense", "conv2d", "avgpool2d"])
def test_the_datas_patches_formed_on_threads_are_the_layers_bit_for_bit(monkeypatch, kind):
    """``arrays.by_points(layer.patches)``: chunks of 7 of 30 data points (the last one
    short), their patches written by two threads into one array, are ``layer.patches`` of all
    the points; a run's ``Batches`` forms the data's patches so on the backend's check
    threads."""
    import threading

    from fenchel_cvx import schedule
    from fenchel_cvx.layers import LAYERS, Dense, build_maps

    spec, shape = LAYERS[kind].example()
    A = build_maps(shape, [spec] if spec.weighted else [spec, Dense(2)])[0]
    X = np.random.default_rng(3).standard_normal((A.n_in, 30))
    names = []
    formed = type(A).patches

    def counted(self, X):
        names.append(threading.current_thread().name)
        return formed(self, X)

    monkeypatch.setattr(arrays, "POINTS_CHUNK", 7)
    monkeypatch.setattr(type(A), "patches", counted)
    threaded = arrays.by_points(A.patches, X, threads=2, min_points=1)
    assert threaded.flags.owndata and np.array_equal(threaded, formed(A, X))
    # a point's patches (the array's shape), then 5 chunks', each on a thread of the pool
    assert len(names) == 1 + 5 and "MainThread" not in names[1:]
    asked = []

    def recorded(f, X, threads):
        asked.append(threads)
        return arrays.by_points(f, X, threads, min_points=1)

    monkeypatch.setattr(schedule, "by_points", recorded)
    data = schedule.Batches(X, X[:1], np, batched=False, threads=2)
    assert np.array_equal(data.patches(A, X), threaded) and asked == [2]


@pytest.mark.parametrize("act", ["relu", "sigmoid"])
def test_the_passs_activations_formed_on_threads_are_the_one_threads_bit_for_bit(monkeypatch, act):
    """``LiftedNetwork.feed_forward(threads=2)``: each X_l = phi(U_{l-1}) formed by two threads
    on chunks of 7 of 30 points is the one-thread pass's, bit for bit; a round's pass takes the
    backend's check threads."""
    import threading

    from fenchel_cvx.activations import ACTIVATIONS
    from fenchel_cvx.pre_activations import PreActivations

    net = LiftedNetwork([6, 5, 4, 3], act, "mse", seed=0)
    X0 = np.random.default_rng(6).standard_normal((6, 30))
    Xs, Us = net.feed_forward(X0)
    names = []
    phi = ACTIVATIONS[act].phi

    def counted(self, U):
        names.append(threading.current_thread().name)
        return phi(self, U)

    monkeypatch.setattr(arrays, "POINTS_CHUNK", 7)
    monkeypatch.setattr(ACTIVATIONS[act], "phi", counted)
    Xs2, Us2 = net.feed_forward(X0, threads=2)
    assert all(np.array_equal(a, b) for a, b in zip(Xs + Us, Xs2 + Us2))
    # per hidden layer: a point's (the shape), then 5 chunks on the pool's threads
    assert len(names) == 2 * 6 and "MainThread" not in names[1:6] + names[7:]
    names.clear()
    pre = PreActivations(net, check=True, threads=2)
    assert all(np.array_equal(a, b) for a, b in zip(pre.feed_forward(X0), Xs)) and len(names) == 12


def test_a_rounds_w_blocks_above_the_first_take_x_ls_patches_from_its_threads(monkeypatch):
    """``Round.w_block``: the patches X~_l of every layer above the first are formed on the
    round's check threads (``arrays.by_points``, here in chunks of 7 of 30 points), and the run
    is the one-thread run's, bit for bit."""
    from fenchel_cvx import block_checks, rounds

    net, X0, Y, _ = _problem(m=30)
    deep = LiftedNetwork([6, 5, 4, 3], "relu", "mse", lam=0.5, rho=0.1, seed=0)
    alone = [
        fit_bcd(copy.deepcopy(n), X0, Y, backend="fast", iterations=2).net.W for n in (net, deep)
    ]
    asked = []

    def spied(f, X, threads=1, min_points=None):
        asked.append((threads, X.shape))
        return arrays.by_points(f, X, threads, min_points)

    monkeypatch.setattr(arrays, "POINTS_CHUNK", 7)
    monkeypatch.setattr(rounds, "by_points", spied)
    monkeypatch.setattr(block_checks, "check_threads", lambda backend: 2)
    for n, W in zip((net, deep), alone):
        asked.clear()
        res = fit_bcd(copy.deepcopy(n), X0, Y, backend="fast", iterations=2)
        assert all(np.array_equal(a, b) for a, b in zip(res.net.W, W))
        # per round, X_L, ..., X_1 of the 30 points (the W-sweep's order), two threads
        shapes = [(2, (n.W[l - 1].shape[0], 30)) for l in range(n.n_hidden, 0, -1)]
        assert asked == 2 * shapes


def test_a_block_of_few_columns_or_on_ranks_is_checked_on_fewer_threads(monkeypatch):
    """``min_columns`` columns a thread at least: 50 columns take one thread, whatever is asked;
    on a communicator's ranks (a group of one rank too) its collectives take every figure."""
    net, X0, Y, Xs = _problem(m=50)
    block = x_block(net, X0, Y, Xs, 1)
    shards = []
    run = reduce.SimulatedComm.run
    monkeypatch.setattr(
        reduce.SimulatedComm, "run", lambda self, work: shards.append(self.P) or run(self, work)
    )
    one = column_threads.figures(block, Xs[0])
    many = column_threads.figures(block, Xs[0], threads=8)
    assert (one.value, one.residual) == (many.value, many.residual) and shards == []
    many = column_threads.figures(block, Xs[0], threads=8, min_columns=10)
    assert many.value == pytest.approx(one.value, rel=1e-12) and shards == [5]

    class OneRank(reduce.Local):
        """A communicator of one rank whose collectives are counted."""

        calls = 0

        def reduce(self, values, op):
            OneRank.calls += 1
            return list(values)

    ranked = column_threads.figures(block, Xs[0], threads=8, min_columns=10, comm=OneRank())
    assert OneRank.calls >= 2 and shards == [5]  # the value's and the residual's, no threads
    assert (ranked.value, ranked.residual) == (one.value, one.residual)


def test_the_relu_rows_certificate_is_the_blocks_and_is_formed_once(monkeypatch):
    """The active route certifies each row by the block's figures at the returned rows; they
    are the block's certificate (``exact.attempt`` forms no second one) and its KKT residual."""
    from fenchel_cvx.blocks import kkt_residual
    from fenchel_cvx.oracle import exact, rows

    rng = np.random.default_rng(2)
    m = rows.ACTIVE_MIN + 200
    net = LiftedNetwork([6, 5, 3], "relu", "mse", lam=0.5, rho=0.1, seed=2)
    X0 = rng.standard_normal((6, m))
    Xs = [np.maximum(A + 0.3 * rng.standard_normal(A.shape), 0.0) for A in net.forward(X0)[0]]
    block = w_block(net, X0, rng.standard_normal((3, m)), Xs, 0)
    assert rows.route(*block.Xt.shape, 0.0) == "active"
    monkeypatch.setattr(exact, "figures", None)  # a second certificate would fail here
    found = OracleBackend(tol=1e-9).solve(block)
    assert found.info["solver"] == "exact: ReLU rows (active)"
    assert found.info["uncertified_rows"] == 0
    assert found.residual == pytest.approx(kkt_residual(block, found.argmin), rel=1e-12)
    assert found.value == pytest.approx(float(block.value(found.argmin)), rel=1e-12)


@pytest.mark.parametrize("loss", ["mse", "cross_entropy"])
def test_every_block_of_a_network_has_its_one_thread_figures_on_three_threads(loss):
    """X_1, W_1 and W_0 of a network with either loss: image, value, residual and gradient."""
    rng = np.random.default_rng(3)
    net = LiftedNetwork([6, 5, 3], "relu", loss, lam=0.5, rho=0.1, seed=3)
    X0, Y = rng.standard_normal((6, 300)), np.eye(3)[:, rng.integers(0, 3, 300)]
    Xs = [np.maximum(A + 0.3 * rng.standard_normal(A.shape), 0.0) for A in net.forward(X0)[0]]
    points = [(x_block(net, X0, Y, Xs, 1), Xs[0])]
    points += [(w_block(net, X0, Y, Xs, l), net.W[l]) for l in (0, 1)]
    for block, Z in points:
        one = column_threads.figures(block, Z, gradient=True)
        many = column_threads.figures(block, Z, threads=3, min_columns=50, gradient=True)
        np.testing.assert_allclose(many.image, one.image, rtol=1e-13, atol=1e-15)
        np.testing.assert_allclose(many.gradient, one.gradient, rtol=1e-10, atol=1e-12)
        assert many.value == pytest.approx(one.value, rel=1e-12)
        assert many.residual == pytest.approx(one.residual, rel=1e-9, abs=1e-13)
        assert many.scale == pytest.approx(one.scale, rel=1e-12)


def test_the_shares_of_many_columns_widen_beyond_max_shares(monkeypatch):
    """Chunks of 3 columns of 400 would make 134 shares: the figures take MAX_SHARES (64, a
    thread each) of 6-7 columns instead, and are the one-share figures to round-off."""
    shards = []
    run = reduce.SimulatedComm.run

    def counted(self, work):
        shards.append(self.P)
        return run(self, work)

    net, X0, Y, Xs = _problem(m=400, seed=4)
    block, Z = x_block(net, X0, Y, Xs, 1), Xs[0]
    whole = column_threads.figures(block, Z)
    monkeypatch.setattr(column_threads, "CHUNK", 3)
    monkeypatch.setattr(reduce.SimulatedComm, "run", counted)
    wide = column_threads.figures(block, Z)
    assert shards == [column_threads.MAX_SHARES] == [64]
    assert wide.value == pytest.approx(whole.value, rel=1e-12)
    assert wide.residual == pytest.approx(whole.residual, rel=1e-12)


@pytest.mark.parametrize("threads", [1, 2])
def test_a_wide_blocks_figures_hold_no_array_of_its_size_while_they_form(threads):
    """Figure 1's X_1 is 300 x 60,000: its figures form on shares of ``CHUNK`` columns, so
    their temporaries (the gradient's terms, the residual's elements) are a share's, not the
    block's; the figures are the block's own (its value and ``kkt_residual``) to round-off.
    Measured by Python's allocation tracer, which sees NumPy's arrays."""
    import tracemalloc

    from fenchel_cvx.blocks import kkt_residual

    m = 32 * column_threads.CHUNK
    rng = np.random.default_rng(4)
    net = LiftedNetwork([6, 20, 3], "relu", "mse", lam=0.5, rho=0.1, seed=4)
    X0, Y = rng.standard_normal((6, m)), np.eye(3)[:, rng.integers(0, 3, m)]
    Xs = [np.maximum(A + 0.3 * rng.standard_normal(A.shape), 0.0) for A in net.forward(X0)[0]]
    block, Z = x_block(net, X0, Y, Xs, 1), Xs[0]
    tracemalloc.start()
    try:
        found = column_threads.figures(block, Z, threads=threads, gradient=False)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < Z.nbytes / 2, (peak, Z.nbytes)  # unshared: the terms alone are 2 Z's
    assert found.value == pytest.approx(float(block.value(Z)), rel=1e-12)
    assert found.residual == pytest.approx(kkt_residual(block, Z), rel=1e-12)


def test_a_ranks_wide_columns_make_shares_whose_figures_go_through_the_ranks():
    """Two ranks (``SimulatedComm(2)``), each with half of a block's 3 x CHUNK columns, form
    their figures on shares of CHUNK columns: every rank gets the whole block's value and
    residual (those of one process to round-off), and a group of one rank, whose reductions are
    counted, gets the one process's figures bit for bit."""
    m = 3 * column_threads.CHUNK
    net, X0, Y, Xs = _problem(m=m, seed=5)
    block, Z = x_block(net, X0, Y, Xs, 1), Xs[0]
    whole = column_threads.figures(block, Z)

    def rank(comm):
        index = reduce.share(m, comm.P, comm.rank)
        mine = column_threads.figures(block.columns(index), Z[:, index], comm=comm)
        return mine.value, mine.residual

    for value, residual in reduce.SimulatedComm(2, timeout=None).run(rank):
        assert value == pytest.approx(whole.value, rel=1e-12)
        assert residual == pytest.approx(whole.residual, rel=1e-12)

    class OneRank(reduce.Local):
        calls = 0

        def reduce(self, values, op):
            OneRank.calls += 1
            return list(values)

    alone = column_threads.figures(block, Z, comm=OneRank())
    assert OneRank.calls >= 2 and (alone.value, alone.residual) == (whole.value, whole.residual)
