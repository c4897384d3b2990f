"""The oracle on Dask distributed: a real 2-worker ``LocalCluster``, results as with one process
(to round-off: the same certified solves).

The independent pieces of a block (X-block columns, W-block rows) run on the workers; every
worker keeps its compiled templates between solves; a scheduler that cannot be reached fails
the block with a ``SolverError`` (never a partial block).
"""

import os
import re

import numpy as np
import pytest

distributed = pytest.importorskip("distributed")

from fenchel_cvx import rank_arrays  # noqa: E402
from fenchel_cvx.activations import ReLU  # noqa: E402
from fenchel_cvx.bcd import fit_bcd  # noqa: E402
from fenchel_cvx.blocks import WHidden, w_block, x_block  # noqa: E402
from fenchel_cvx.errors import SolverError  # noqa: E402
from fenchel_cvx.network import LiftedNetwork  # noqa: E402
from fenchel_cvx.oracle import OracleBackend, active_rows, dask_rows, exact  # noqa: E402
from fenchel_cvx.oracle import rows as rows_mod  # noqa: E402
from fenchel_cvx.oracle.backend import worker_cache_info  # noqa: E402
from fenchel_cvx.oracle.cluster import local_cluster  # noqa: E402

BUDGET = 60  # small pieces: many of them per block, so both workers get work


@pytest.fixture(scope="module")
def client():
    c, cluster = local_cluster(2)  # the cluster OracleBackend(n_jobs=2) starts
    yield c
    c.close()
    cluster.close()


def instance(act="relu", loss="cross_entropy", m=30):
    rng = np.random.default_rng(0)
    net = LiftedNetwork([4, 5, 4, 3], act, loss, rho=0.1, seed=0)
    X = rng.standard_normal((4, m))
    Y = np.eye(3)[:, rng.integers(0, 3, m)]
    return net, X, Y, net.forward(X)[0]


@pytest.mark.parametrize("act", ["relu", "sigmoid"])
def test_blocks_on_two_workers_equal_one_process(client, act):
    net, X, Y, Xs = instance(act)
    local = OracleBackend(tol=1e-7, budget=BUDGET)
    dask = OracleBackend(tol=1e-7, budget=BUDGET, client=client)
    assert dask.n_jobs == 2
    for block in (x_block(net, X, Y, Xs, 1), x_block(net, X, Y, Xs, 2), w_block(net, X, Y, Xs, 0)):
        a, b = local.solve(block), dask.solve(block)
        assert b.info["n_subproblems"] > 2 and b.residual <= 1e-7
        # the same solves, to round-off: a worker's cached Clarabel solver starts a chunk from
        # another state than the single process's (measured: differences <= 1e-12)
        np.testing.assert_allclose(a.argmin, b.argmin, rtol=1e-9, atol=1e-10)


def test_workers_keep_their_templates(client):
    net, X, Y, Xs = instance("tanh", "mse")
    block = x_block(net, X, Y, Xs, 1)
    dask = OracleBackend(tol=1e-7, budget=BUDGET, client=client)
    dask.solve(block)
    first = client.run(worker_cache_info)
    block.U_prev = block.U_prev + 0.01  # new parameter values, same template
    dask.solve(block)
    again = client.run(worker_cache_info)
    assert first == again and len(first) == 2
    keys = [k for k in next(iter(again.values())) if k[0] == "x_hidden"]
    assert keys and all(again[w][k] == 1 for w in again for k in keys)


def test_fit_on_two_workers_equals_one_process(client):
    runs = {}
    for name, backend in (
        ("local", OracleBackend(tol=1e-6, budget=BUDGET)),
        ("dask", OracleBackend(tol=1e-6, budget=BUDGET, client=client)),
    ):
        net, X, Y, _ = instance()
        runs[name] = fit_bcd(net, X, Y, iterations=2, backend=backend, eval_every=None)
    # both runs certified at tol 1e-6: their blocks agree to the accuracy the certificate
    # guarantees (measured: W within 2e-8 after 2 rounds), their objectives to ~1e-9
    for Wa, Wb in zip(runs["local"].net.W, runs["dask"].net.W):
        np.testing.assert_allclose(Wa, Wb, atol=1e-6)
    assert runs["dask"].history.certificate_held and runs["local"].history.certificate_held
    np.testing.assert_allclose(
        runs["dask"].history.series("lifted_w"), runs["local"].history.series("lifted_w"), rtol=1e-8
    )


def _background_work(dask_worker):
    """On a worker: the names of its periodic callbacks, and its loop's tick in ms."""
    callbacks = dask_worker.periodic_callbacks
    return sorted(callbacks), callbacks["tick"].callback_time


def _scheduler_background_work(dask_scheduler):
    """On the scheduler: whether it steals work, and its loop's tick in ms."""
    tick = dask_scheduler.periodic_callbacks["tick"].callback_time
    return "stealing" in dask_scheduler.extensions, tick


def test_the_oracles_own_cluster_turns_off_the_work_that_takes_a_busy_workers_core():
    """``OracleBackend(n_jobs=2)`` starts its workers without the statistical profiler, its
    workers and scheduler with a tick of a second, and its scheduler without work stealing
    (``cluster.QUIET``); the process's own settings are left as they were."""
    import dask

    before = dask.config.get("distributed.worker.profile.enabled")
    backend = OracleBackend(n_jobs=2)
    try:
        client = backend._dask()
        seen = client.run(_background_work)
        stealing, tick = client.run_on_scheduler(_scheduler_background_work)
    finally:
        backend.close()
    assert len(seen) == 2 and stealing is False and tick == 1000
    for callbacks, tick in seen.values():
        assert "heartbeat" in callbacks and not any("profile" in c for c in callbacks), callbacks
        assert tick == 1000
    assert dask.config.get("distributed.worker.profile.enabled") == before


@pytest.mark.parametrize("workers", [0, -1, 1.5, True])
def test_a_worker_count_that_is_not_a_positive_integer_is_refused_by_name(workers):
    with pytest.raises(
        ValueError, match=re.escape(f"workers must be a positive integer, got {workers!r}")
    ):
        local_cluster(workers)


def test_unreachable_scheduler_fails_the_block_cleanly():
    cluster = distributed.LocalCluster(
        n_workers=1, threads_per_worker=1, processes=False, dashboard_address=None
    )
    c = distributed.Client(cluster)
    backend = OracleBackend(budget=BUDGET, client=c)
    c.close()
    cluster.close()
    net, X, Y, Xs = instance()
    backend.n_jobs = 2
    with pytest.raises(SolverError, match="distributed_error") as err:
        backend.solve(x_block(net, X, Y, Xs, 1))
    assert "no partial block" in str(err.value)


def test_bad_client_is_refused():
    with pytest.raises(ValueError, match="client must be a distributed.Client"):
        OracleBackend(client="tcp://nowhere:8786")


# --- the active route's W-rows on the workers (oracle.dask_rows) ----------------------------
def relu_rows_block(seed=0, r=9, n=6, m=40, gamma=0.5, shift=0.0):
    """A ReLU hidden W-block of ``r`` rows, ``n`` inputs + bias, ``m`` points."""
    rng = np.random.default_rng(seed)
    Xt = np.vstack([rng.standard_normal((n, m)), np.ones((1, m))])
    V = np.maximum(rng.standard_normal((r, m)) + shift, 0.0)
    W0 = rng.standard_normal((r, n + 1))
    return WHidden(layer=0, Xt=Xt, rho=0.3, gamma=gamma, W0=W0, act=ReLU(), V=V, lam=0.7)


@pytest.fixture
def active_route(monkeypatch):
    """Small blocks take the active route (in the driver, where the route is chosen)."""
    monkeypatch.setattr(rows_mod, "use_dual", lambda n, m, slope: False)
    monkeypatch.setattr(rows_mod, "ACTIVE_MIN", 10)


class Counting:
    """A client whose ``scatter`` calls are counted."""

    def __init__(self, client):
        self.client, self.scatters = client, 0

    def scatter(self, *args, **kwargs):
        self.scatters += 1
        return self.client.scatter(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.client, name)


@pytest.mark.parametrize("gamma", [0.0, 0.5])
def test_active_rows_on_two_workers_equal_one_process(client, active_route, gamma):
    block = relu_rows_block(gamma=gamma)
    backend = OracleBackend(tol=1e-9, client=client)
    for start in (None, np.random.default_rng(3).standard_normal(block.shape)):
        local = exact.attempt(block, start, 1e-9)
        on = exact.attempt(block, start, 1e-9, dask_rows.WorkerRows(lambda: client))
        res = backend.solve(block, start)
        for found in (on, res):
            assert found.info["solver"] == "exact: ReLU rows (active)"
            assert found.info["worker_shares"] == 2 and found.info["uncertified_rows"] == 0
            np.testing.assert_allclose(found.argmin, local.argmin, rtol=0, atol=1e-12)
        assert on.certified and res.residual <= 1e-9 and "worker_shares" not in local.info
    key = dask_rows.digest(block.Xt)
    assert all(key in kept for kept in client.run(dask_rows.worker_rows_info).values())


def test_active_rows_data_is_scattered_once(client, active_route):
    """Two calls on the same X~ scatter it once, build each worker's Rows once, and the second
    call's rows start from the Grams the first call's rows ended with."""
    block = relu_rows_block(seed=1)
    counting = Counting(client)
    workers = dask_rows.WorkerRows(lambda: counting)
    first = exact.attempt(block, None, 1e-9, workers)
    block.V = relu_rows_block(seed=1, shift=0.3).V  # new targets, the same X~
    again = exact.attempt(block, first.argmin, 1e-9, workers)
    assert first.certified and again.certified and counting.scatters == 1
    assert workers.sends == 1 and workers.files == []  # a small X~: scattered, not by file
    key = dask_rows.digest(block.Xt)
    kept = client.run(dask_rows.worker_rows_info)
    assert all(k[key][0] == 1 for k in kept.values())  # Rows (P, T) built once a worker
    assert sum(k[key][1] for k in kept.values()) == block.shape[0]  # every row's final Gram
    assert again.info["kept_grams"] > 0 and first.info["kept_grams"] == 0
    other = relu_rows_block(seed=2)  # another X~: scattered too
    assert exact.attempt(other, None, 1e-9, workers).certified and counting.scatters == 2
    kept = client.run(dask_rows.worker_rows_info)
    assert all(dask_rows.digest(b.Xt) in k for b in (block, other) for k in kept.values())


@pytest.mark.skipif(not os.path.isdir(rank_arrays.FOLDER), reason="no shared-memory folder")
def test_large_data_goes_to_the_workers_by_a_file_removed_after_use(
    client, active_route, monkeypatch
):
    """An X~ of FILE_MIN bytes or more reaches the workers through one file in shared memory
    (no scatter), the rows equal the in-process ones, and the file is removed when its data set
    leaves the driver's KEEP and when the workers' rows close."""
    monkeypatch.setattr(dask_rows, "FILE_MIN", 0)
    counting = Counting(client)
    workers = dask_rows.WorkerRows(lambda: counting)
    blocks = [relu_rows_block(seed=s) for s in (5, 6, 7)]
    found = exact.attempt(blocks[0], None, 1e-9, workers)
    np.testing.assert_allclose(
        found.argmin, exact.attempt(blocks[0], None, 1e-9).argmin, rtol=0, atol=1e-12
    )
    assert found.certified and found.info["worker_shares"] == 2
    assert counting.scatters == 0 and workers.sends == 1 and len(workers.files) == 1
    first = workers.files[0]
    assert os.path.exists(first) and os.path.dirname(first) == rank_arrays.FOLDER
    for block in blocks[1:]:  # the third data set pushes the first out of KEEP = 2
        assert exact.attempt(block, None, 1e-9, workers).certified
    assert workers.sends == 3 and len(workers.files) == dask_rows.KEEP
    assert not os.path.exists(first) and all(os.path.exists(f) for f in workers.files)
    kept = list(workers.files)
    workers.close()
    assert workers.files == [] and not any(os.path.exists(f) for f in kept)


def _forget_rows():
    """On a worker: drops the data sets' Rows and Grams kept there."""
    dask_rows._WORKER_ROWS.clear()
    dask_rows._WORKER_GRAMS.clear()


def _mapped_points():
    """On a worker: for each data set's Rows, whether its points and their single-precision
    copy are mapped from files (not copies of the worker's own), and the copy's dtype."""
    return [
        (isinstance(r.P.base, np.memmap), isinstance(r.G_src.base, np.memmap), str(r.G_src.dtype))
        for r in dask_rows._WORKER_ROWS.values()
    ]


@pytest.mark.skipif(not os.path.isdir(rank_arrays.FOLDER), reason="no shared-memory folder")
def test_the_workers_map_the_points_in_both_precisions_from_the_drivers_files(
    client, active_route, monkeypatch
):
    """Where the Grams run in single precision (``SINGLE_MIN`` points or more), the driver lays
    out the points in float64 and float32, one file each; every worker maps both (no copy of
    its own) and the rows equal those solved in this process on the same layout."""
    monkeypatch.setattr(dask_rows, "FILE_MIN", 0)
    monkeypatch.setattr(active_rows, "SINGLE_MIN", 10)
    client.run(_forget_rows)
    workers = dask_rows.WorkerRows(lambda: client)
    block = relu_rows_block(seed=9)
    found = exact.attempt(block, None, 1e-9, workers)
    assert found.certified and found.info["worker_shares"] == 2 and len(workers.files) == 2
    assert all(v == [(True, True, "float32")] for v in client.run(_mapped_points).values())
    alone = exact.attempt(block, None, 1e-9)
    np.testing.assert_allclose(found.argmin, alone.argmin, rtol=0, atol=1e-10)
    workers.close()
    assert workers.files == []


@pytest.mark.skipif(not os.path.isdir(rank_arrays.FOLDER), reason="no shared-memory folder")
def test_data_is_scattered_where_a_worker_cannot_open_the_file(client, active_route, monkeypatch):
    """A worker that does not see the file (on another machine) gets X~ scattered instead, and
    the file is removed at once."""

    def elsewhere(path, size):  # pickled by value: what every worker answers
        return False

    monkeypatch.setattr(dask_rows, "FILE_MIN", 0)
    monkeypatch.setattr(dask_rows, "can_open", elsewhere)
    written, write_rows = [], rank_arrays.write_rows

    def recorded(*args):  # the files this test writes (other tests may write their own)
        written.append(handle := write_rows(*args))
        return handle

    monkeypatch.setattr(rank_arrays, "write_rows", recorded)
    counting = Counting(client)
    workers = dask_rows.WorkerRows(lambda: counting)
    assert exact.attempt(relu_rows_block(seed=8), None, 1e-9, workers).certified
    assert counting.scatters == 1 and workers.sends == 1 and workers.files == []
    assert len(written) == 1 and written[0] is not None and not os.path.exists(written[0].path)


def test_a_client_of_one_worker_takes_the_rows_and_keeps_their_grams(active_route):
    """A user's client of one worker is used as any other: the rows go to its worker, which
    keeps their Grams for the next call (in the driver's process they would be formed again)."""
    with (
        distributed.LocalCluster(
            n_workers=1, threads_per_worker=1, processes=True, dashboard_address=None
        ) as cluster,
        distributed.Client(cluster) as one,
    ):
        backend = OracleBackend(tol=1e-9, client=one)
        block = relu_rows_block(seed=9)
        first = backend.solve(block)
        block.V = relu_rows_block(seed=9, shift=0.3).V
        again = backend.solve(block, first.argmin)
    assert backend.n_jobs == 1 and first.info["worker_shares"] == again.info["worker_shares"] == 1
    assert again.info["kept_grams"] > 0 and again.residual <= 1e-9


def test_a_wrong_row_from_a_worker_is_caught_by_the_driver(client, active_route, monkeypatch):
    """Each worker returns its first row off by 1: the driver's recomputed gradients catch both
    rows, its primal Newton fallback solves them, and the block is certified."""
    block = relu_rows_block(seed=4)
    local = exact.attempt(block, None, 1e-9)

    def wrong(*args):  # pickled by value: on the worker, dask_rows.solve_share is the true one
        W, reports = dask_rows.solve_share(*args)
        W = W.copy()
        W[0] += 1.0
        return W, reports

    monkeypatch.setattr(dask_rows, "solve_share", wrong)
    found = exact.attempt(block, None, 1e-9, dask_rows.WorkerRows(lambda: client))
    assert found.info["uncertified_rows"] == 2 and found.info["fallback_steps"] > 0
    assert found.certified
    np.testing.assert_allclose(found.argmin, local.argmin, rtol=0, atol=1e-8)


def test_a_frozen_data_set_is_digested_once_and_any_other_at_every_call(monkeypatch):
    """A run's X~_0 (``arrays.freeze``: read-only, registered; ``schedule.Batches``) is hashed
    once while it lives; any other array, read-only or not, at every call, and a frozen one
    made writeable again too."""
    from fenchel_cvx.arrays import freeze

    hashed = []
    sha256 = dask_rows.hashlib.sha256

    def counted():
        hashed.append(1)
        return sha256()

    monkeypatch.setattr(dask_rows.hashlib, "sha256", counted)
    A = np.arange(12.0).reshape(3, 4)
    read_only = A.copy()
    read_only.flags.writeable = False
    for X in (A, read_only):
        hashed.clear()
        assert dask_rows.digest(X) == dask_rows.digest(X) and len(hashed) == 2
    frozen = freeze(A.copy())
    hashed.clear()
    assert dask_rows.digest(frozen) == dask_rows.digest(frozen) == dask_rows.digest(A)
    assert len(hashed) == 2  # frozen once, A once
    with pytest.raises(ValueError, match="read-only"):
        frozen[0, 0] = 1.0
    frozen.flags.writeable = True
    frozen[0, 0] = 1.0
    assert dask_rows.digest(frozen) != dask_rows.digest(A)
