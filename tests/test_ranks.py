"""Training on ranks (``fit_bcd(comm=)``, ``parallel.fit_on_ranks``): each rank takes its share
of every batch, and the run is the one-process run.

The pinned recipes (three batches of Algorithm 2 as the MNIST benchmarks train the MLP and
LeNet-5, float64, the certificate's checks on the last) run whole, driver included, on P
simulated ranks (``reduce.SimulatedComm``: a thread each) and on 2 gloo ranks (processes):
the same weights and X's as in one process, the same certificate, and the same objectives.
A reduction dropped from the driver's figures is caught; what ranks cannot do is refused by
name before any work.
"""

import collections
import copy
import os
import re
import signal
from pathlib import Path

import numpy as np
import pytest

from fenchel_cvx import LiftedNetwork, blocks
from fenchel_cvx.bcd import fit_bcd
from fenchel_cvx.reduce import SimulatedComm, share

#: the records' figures that are the whole batch's on every rank
FIGURES = ("lifted_x", "network_x", "lifted_w", "network_w", "prox", "m")


def _same_run(one, many, scale_tol=1e-12, figure_tol=1e-9):
    """``many`` (a run on ranks) is ``one`` (in one process): every snapshot of W and the last
    X to ``scale_tol`` of each array's largest entry; each round's figures to ``figure_tol``
    relative; the certificate's checks, verdicts and violations alike."""
    assert [n for n, _ in one.snapshots] == [n for n, _ in many.snapshots]
    for (name, A), (_, B) in zip(one.snapshots, many.snapshots):
        for a, b in zip(A, B):
            assert a.shape == b.shape, name
            assert np.max(np.abs(a - b)) <= scale_tol * np.max(np.abs(a)), name
    assert len(one.records) == len(many.records)
    for rec, rec_p in zip(one.records, many.records):
        for key in FIGURES:
            if rec[key] is None:
                assert rec_p[key] is None, key
            else:
                assert rec_p[key] == pytest.approx(rec[key], rel=figure_tol), key
        cert, cert_p = rec["certificate"], rec_p["certificate"]
        assert (cert["checked"], cert["held"]) == (cert_p["checked"], cert_p["held"])
        found = [(v["check"], v["layer"], v["detail"]) for v in cert_p["violations"]]
        assert found == [(v["check"], v["layer"], v["detail"]) for v in cert["violations"]]
        for block, block_p in zip(rec["blocks"], rec_p["blocks"]):
            assert (block["block"], block["status"]) == (block_p["block"], block_p["status"])
            if block["residual"] is not None:  # recomputed by the certificate, over every rank
                assert block_p["residual"] == pytest.approx(block["residual"], rel=1e-6, abs=1e-12)


@pytest.fixture(scope="module")
def mnist_runs():
    """The MNIST data of the pinned recipes and each recipe's one-process run."""
    from pinned import record

    data = record.mnist()
    return data, {r: record.run_batches(r, compile=False, data=data) for r in ("mlp", "lenet5")}


@pytest.mark.parametrize("P", [2, 3])
@pytest.mark.parametrize("recipe", ["mlp", "lenet5"])
def test_the_driver_on_simulated_ranks_is_the_one_process_run(recipe, P, mnist_runs, monkeypatch):
    """Every rank runs ``fit_bcd`` on its share of each batch; rank 0's callback stops the run
    after the third batch on every rank; every rank ends with the one-process weights and X.
    LeNet-5's W_2, W_3 and W_4 are solved by layer in its unchecked rounds (``layer_split``):
    each whole, once, on the rank ``owners`` gives it; the MLP has one such block, split by
    data points like the rest. The bounds of LeNet-5's four X-blocks' map norms are each
    computed by one rank in every round (``layer_split.shared_norms``: every P-th of the
    sweep); the MLP's one X-block computes its own on every rank."""
    import threading

    from fenchel_cvx import layer_split
    from fenchel_cvx.layers import LinearMap
    from pinned import record

    data, runs = mnist_runs
    solved, solve = [], layer_split.LayerSplit.solve
    bounds, bound = collections.Counter(), LinearMap.norm2_bound

    def counted(split, r, l):
        solved.append((split.comm.rank, l, split.plan[l] == split.comm.rank))
        return solve(split, r, l)

    def computed(A, W, max_dim):
        bounds[threading.get_ident()] += 1  # (each shard runs in its own thread)
        return bound(A, W, max_dim)

    monkeypatch.setattr(layer_split.LayerSplit, "solve", counted)
    monkeypatch.setattr(LinearMap, "norm2_bound", computed)

    def rank(comm):
        return record.run_batches(recipe, compile=False, data=data, comm=comm)

    out = SimulatedComm(P, timeout=300).run(rank)
    assert out[0].records[-1]["certificate"]["checked"]  # the last round checked
    _same_run(runs[recipe], out[0])
    unchecked = sum(not rec["checked"] for rec in out[0].records)
    plan = {2: P - 1, 3: 1 if P == 3 else 0, 4: 0} if recipe == "lenet5" else {}
    assert unchecked == 2 and sorted(solved) == sorted(
        (r, l, owner == r) for l, owner in plan.items() for r in range(P) for _ in range(unchecked)
    )
    L, rounds = (4, 3) if recipe == "lenet5" else (1, 3)
    assert len(out[0].records) == rounds
    shares = [len(range(r, L, P)) for r in range(P)] if L > 1 else [1] * P
    assert sorted(bounds.values()) == sorted(rounds * n for n in shares)
    for other in out[1:]:  # (the callback, and so the snapshots, are rank 0's)
        for a, b in zip(out[0].snapshots[-1][1], other.snapshots[-1][1]):
            np.testing.assert_array_equal(a, b)  # every rank holds the same X (gathered)


def test_shared_norm_bounds_give_the_run_of_ranks_that_compute_their_own(mnist_runs, monkeypatch):
    """LeNet-5 on 2 simulated ranks, the X-blocks' norm bounds shared (each computed by one rank:
    ``layer_split.shared_norms``) and not (``FastBackend.map_norm2`` removed: every rank
    computes every bound in its blocks, as before the sharing): the same weights and X, and
    every block's value, residual and iterations, bit for bit."""
    from fenchel_cvx.fast import FastBackend
    from pinned import record

    data, _ = mnist_runs

    def on_ranks():
        def rank(comm):
            return record.run_batches("lenet5", compile=False, data=data, comm=comm)

        return SimulatedComm(2, timeout=300).run(rank)[0]

    shared = on_ranks()
    monkeypatch.setattr(FastBackend, "map_norm2", None)
    own = on_ranks()
    for (name, A), (name_own, B) in zip(shared.snapshots, own.snapshots, strict=True):
        assert name == name_own
        for a, b in zip(A, B, strict=True):
            np.testing.assert_array_equal(a, b)
    figures = ("block", "value_after", "residual", "iterations")
    for rec, rec_own in zip(shared.records, own.records, strict=True):
        np.testing.assert_equal(  # (NaN where a capped solve reports no value: equal to NaN)
            [[b[k] for k in figures] for b in rec["blocks"]],
            [[b[k] for k in figures] for b in rec_own["blocks"]],
        )


def test_two_gloo_ranks_are_the_one_process_run(mnist_runs):
    """``fit_on_ranks(nproc=2)``: this process and a spawned one on gloo (127.0.0.1)."""
    pytest.importorskip("torch")
    from fenchel_cvx.parallel import fit_on_ranks
    from pinned import record

    data, runs = mnist_runs
    many = record.run_batches("mlp", compile=False, data=data, fit=fit_on_ranks, nproc=2)
    _same_run(runs["mlp"], many)


def _small_run(**kw):
    rng = np.random.default_rng(0)
    X0, Y = rng.standard_normal((12, 60)), np.eye(3)[:, rng.integers(0, 3, 60)]
    net = LiftedNetwork([12, 10, 8, 3], seed=1)
    args = dict(batch_size=20, epochs=1, alternations=2, backend="fast", strict=False)
    return net, X0, Y, {**args, **kw}


def test_a_dropped_reduction_in_the_driver_is_caught(monkeypatch):
    """A planted fault: the W-blocks' values taken on each rank's points alone (the reduction
    dropped). The descent check's figures then differ from one process's on every W-block."""
    net, X0, Y, kw = _small_run()
    one = fit_bcd(copy.deepcopy(net), X0, Y, **kw)

    def on_ranks(fault):
        if fault:
            monkeypatch.setattr(
                blocks.WBlock, "value_over", lambda self, W, U, comm: self.value_with_forward(W, U)
            )
        return SimulatedComm(2).run(lambda c: fit_bcd(copy.deepcopy(net), X0, Y, comm=c, **kw))[0]

    def w_values(res):
        return [b["value_after"] for r in res.history for b in r["blocks"] if b["kind"][0] == "w"]

    assert w_values(on_ranks(False)) == pytest.approx(w_values(one), rel=1e-9)
    faulty = w_values(on_ranks(True))
    assert all(v != pytest.approx(w, rel=1e-3) for v, w in zip(faulty, w_values(one)))


@pytest.mark.parametrize("differs", ["data", "weights", "settings"])
def test_ranks_that_disagree_on_the_data_the_weights_or_the_settings_are_refused_before_any_work(
    monkeypatch, differs
):
    """Rank 1 of 2 holds other data (one entry of X0), other starting weights (one entry of
    W_0) or other settings (one alternation a batch, where rank 0 takes two): every rank
    raises naming rank 1 and what differs, before any round begins."""
    from fenchel_cvx import rounds

    net, X0, Y, kw = _small_run()
    began, begin = [], rounds.Round.begin
    monkeypatch.setattr(rounds.Round, "begin", lambda self: (began.append(self), begin(self))[1])

    def run(comm):
        mine, X, settings = copy.deepcopy(net), X0.copy(), dict(kw)
        if comm.rank == 1 and differs == "data":
            X[0, 0] += 1e-9
        if comm.rank == 1 and differs == "weights":
            mine.W[0][0, 0] += 1e-9
        if comm.rank == 1 and differs == "settings":
            settings["alternations"] = 1
        return fit_bcd(mine, X, Y, comm=comm, **settings)

    named = {"data": "data differ", "weights": "weights differ"}
    named["settings"] = "alternations is 1, rank 0's 2 "
    with pytest.raises(
        ValueError, match=rf"the ranks disagree with rank 0: rank 1's {named[differs]}"
    ):
        SimulatedComm(2).run(run)
    assert not began


def test_ranks_holding_the_same_data_in_other_memory_orders_agree_and_train_alike():
    """Rank 1 holds the data in Fortran order, rank 0 in C order (each digests them in its own
    order first): the ranks agree on the data in C order and train the one-process iterates;
    with one entry of rank 1's Fortran-ordered data changed they are refused by name."""
    net, X0, Y, kw = _small_run()
    one = fit_bcd(copy.deepcopy(net), X0, Y, **kw)

    def run(comm, change=0.0):
        X = np.asfortranarray(X0) if comm.rank == 1 else X0.copy()
        X[3, 4] += change if comm.rank == 1 else 0.0
        return fit_bcd(copy.deepcopy(net), X, Y, comm=comm, **kw)

    two = SimulatedComm(2).run(run)[0]
    for W1, W2 in zip(one.net.W, two.net.W):
        np.testing.assert_allclose(W2, W1, rtol=1e-9, atol=1e-12)
    with pytest.raises(ValueError, match="the ranks disagree with rank 0: rank 1's data differ"):
        SimulatedComm(2).run(lambda c: run(c, 1e-9))


def test_ranks_on_copies_of_rank_0s_arguments_digest_no_data_and_still_compare_the_settings(
    monkeypatch,
):
    """Ranks whose communicator runs on copies of rank 0's arguments (``copies``, as
    ``Ranks.fit``'s: ``TorchComm.on_copies``) read no data for a digest (one would raise here)
    and train; a setting that differs is still refused by name."""
    from fenchel_cvx import run_settings

    def digest(*arrays):
        raise AssertionError("the data were digested")

    monkeypatch.setattr(run_settings, "memory_digest", digest)
    net, X0, Y, kw = _small_run()

    def run(comm, alternations=2):
        comm.copies = True
        mine = {**kw, "alternations": alternations if comm.rank == 1 else 2}
        return fit_bcd(copy.deepcopy(net), X0, Y, comm=comm, **mine)

    assert all(result.history.certificate_held for result in SimulatedComm(2).run(run))
    with pytest.raises(ValueError, match="rank 1's alternations is 1, rank 0's 2"):
        SimulatedComm(2).run(lambda c: run(c, 1))


def test_ranks_fit_runs_fit_bcd_on_each_rank_with_a_communicator_of_copies(monkeypatch):
    """``Ranks.fit`` sends each rank ``_fit_on_copies``, which runs ``fit_bcd`` with its
    communicator's ``on_copies()``: the same ranks, split and path, ``copies`` set (a real
    ``TorchComm`` of a one-rank gloo group; the rank's own communicator is left as it was)."""
    pytest.importorskip("torch")
    from fenchel_cvx import bcd, parallel

    sent, seen = [], []
    monkeypatch.setattr(parallel.Ranks, "run", lambda self, fn, *a, **k: sent.append(fn))
    monkeypatch.setattr(bcd, "fit_bcd", lambda *a, comm, **k: seen.append(comm))
    parallel.Ranks.fit(object.__new__(parallel.Ranks), None, None, None, backend="fast")
    with parallel.one_rank_group("gloo") as comm:
        sent[0]("net", "X0", "Y", comm=comm, batch_size=5)
        (theirs,) = seen
        assert theirs.copies and not comm.copies
        assert (theirs.P, theirs.rank, theirs.split, theirs.host) == (1, 0, "columns", comm.host)


def test_each_rank_takes_a_share_and_together_every_point():
    shares = [share(10, 3, r) for r in range(3)]
    assert [s.stop - s.start for s in shares] == [4, 3, 3]
    assert np.array_equal(np.concatenate([np.arange(10)[s] for s in shares]), np.arange(10))


def test_what_ranks_cannot_do_is_refused_by_name():
    net, X0, Y, kw = _small_run()
    two = SimulatedComm(2)

    def refused(**changes):
        args = {**kw, **changes}
        with pytest.raises(ValueError) as err:
            two.run(lambda c: fit_bcd(copy.deepcopy(net), X0, Y, comm=c, **args))
        return str(err.value)

    assert "backend 'cvxpy'" in refused(backend="cvxpy", batch_size=None, iterations=1)
    # 60 points in batches of 59: the last batch has 1 point, fewer than the 2 ranks
    assert "smallest batch (1)" in refused(batch_size=59)
    with pytest.raises(ValueError, match="comm must be None or a communicator"):
        fit_bcd(copy.deepcopy(net), X0, Y, comm=object(), **kw)


def test_fit_on_ranks_refuses_before_starting_a_process():
    from fenchel_cvx.parallel import fit_on_ranks

    net, X0, Y, kw = _small_run()
    with pytest.raises(ValueError, match="nproc"):
        fit_on_ranks(net, X0, Y, nproc=0, **kw)
    with pytest.raises(ValueError, match="backend='cvxpy'"):
        fit_on_ranks(net, X0, Y, nproc=2, **{**kw, "backend": "cvxpy"})


def test_a_checkpoint_written_on_ranks_resumes_at_any_number_of_ranks(tmp_path):
    """Rank 0 writes the whole state (every rank's columns of X gathered): a run on 2 ranks
    stopped after its third round resumes in one process and on 3 ranks, and both end as the
    uninterrupted one-process run, to round-off."""
    net, X0, Y, kw = _small_run(checkpoint_every=1)
    whole = fit_bcd(copy.deepcopy(net), X0, Y, **kw)

    def stop_at_3(net_, rec):
        return rec["iteration"] >= 3

    folder = tmp_path / "run"
    SimulatedComm(2).run(
        lambda c: fit_bcd(
            copy.deepcopy(net), X0, Y, comm=c, checkpoint=folder, callback=stop_at_3, **kw
        )
    )
    for P in (1, 3):
        here = tmp_path / f"resumed-{P}"
        here.mkdir()
        (here / "checkpoint.npz").write_bytes((folder / "checkpoint.npz").read_bytes())

        def resumed(c, here=here):
            return fit_bcd(copy.deepcopy(net), X0, Y, comm=c, checkpoint=here, resume=here, **kw)

        res = resumed(None) if P == 1 else SimulatedComm(P).run(resumed)[0]
        assert len(res.history) == len(whole.history)
        for a, b in zip(whole.net.W, res.net.W):
            assert np.max(np.abs(a - b)) <= 1e-12 * np.max(np.abs(a))
        for a, b in zip(whole.Xs, res.Xs):
            assert np.max(np.abs(a - b)) <= 1e-12 * np.max(np.abs(a))


# --- the command: --nproc, and what it refuses --------------------------------------------------
from test_cli import _cli  # noqa: E402  (the command in a subprocess, this checkout's package)

#: the run that the launches of 2 ranks below make (``--nproc``'s at its default threads, the
#: others at one a rank), each held to its one-process model
TRAIN = ["train", "--backend", "fast", "--batch-size", "100", "--train-size", "400", "--quiet"]
TRAIN += ["--no-baseline"]
ONE_THREAD = ["--threads", "1"]


@pytest.fixture(scope="module")
def one_process_model(tmp_path_factory):
    """``TRAIN`` in one process, on one thread: its ``model.npz``, made once for every launch's
    test."""
    pytest.importorskip("torch")
    folder = tmp_path_factory.mktemp("one_process")
    one = _cli(*TRAIN, *ONE_THREAD, "--out", folder / "one", cwd=folder)
    assert one.returncode == 0, one.stderr[-2000:]
    return dict(np.load(folder / "one" / "model.npz"))


def _is_the_one_process_model(path, one):
    """The model at ``path`` has the one-process run's weights, to 1e-12 relative."""
    b = np.load(path)
    for key in ("W_0", "W_1"):
        assert np.max(np.abs(one[key] - b[key])) <= 1e-12 * np.max(np.abs(one[key]))


def test_train_with_nproc_2_writes_the_one_process_model(tmp_path, one_process_model):
    """``fenchel-cvx train --nproc 2``: rank 0 prints and writes the run's files, and its model
    is the one-process run's."""
    two = _cli(*TRAIN, "--out", tmp_path / "two", "--nproc", "2", cwd=tmp_path)
    assert two.returncode == 0, two.stderr[-2000:]
    assert "2 ranks x 1 thread(s)" in two.stdout and two.stdout.count("fenchel-cvx train:") == 1
    _is_the_one_process_model(tmp_path / "two" / "model.npz", one_process_model)


#: torchrun's launches of 2 ranks on this machine: one node of 2, and 2 nodes of one through the
#: c10d rendezvous (``PORT``: a free port of 127.0.0.1), as on 2 machines (docs page "Training in
#: parallel")
TORCHRUN = {
    "one node": [["--nproc-per-node", "2"]],
    "two nodes": [
        ["--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d",
         "--rdzv-endpoint", "127.0.0.1:PORT"]
    ] * 2,
}  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("launch", list(TORCHRUN))
def test_train_under_torchrun_writes_the_one_process_model(tmp_path, launch, one_process_model):
    """``torchrun ... -m fenchel_cvx train``, unchanged: the ranks join through torchrun's
    environment, rank 0 alone prints and writes the run's files, and the model is the
    one-process run's."""
    import subprocess
    import sys

    from fenchel_cvx.parallel import _free_port
    from test_cli import ENV

    port = str(_free_port())
    torchrun = [sys.executable, "-m", "torch.distributed.run"]
    train = ["-m", "fenchel_cvx", *TRAIN, *ONE_THREAD, "--out", str(tmp_path / "two")]
    pipes = dict(stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    nodes = [
        subprocess.Popen(
            [*torchrun, *[f.replace("PORT", port) for f in node], *train],
            cwd=tmp_path,
            env=ENV,
            start_new_session=True,
            **pipes,
        )
        for node in TORCHRUN[launch]
    ]
    try:
        outs = [node.communicate(timeout=600) for node in nodes]  # (a hang guard only)
    finally:
        _kill_process_groups(nodes)
    for node, (_, err) in zip(nodes, outs):
        assert node.returncode == 0, err[-3000:]
    printed = "".join(out for out, _ in outs)
    assert "2 ranks x 1 thread(s)" in printed and printed.count("fenchel-cvx train:") == 1
    _is_the_one_process_model(tmp_path / "two" / "model.npz", one_process_model)


#: rank 1's rendezvous that it cannot reach: (MASTER_ADDR, MASTER_PORT, FENCHEL_RENDEZVOUS,
#: what it is told); "BOUND": a port of this test's, bound, on which no one listens
UNREACHED = [
    ("127.0.0.1", "BOUND", "1", r"MASTER_PORT='\d+' within 1 s \(.*refused.*FENCHEL_RENDEZVOUS"),
    ("no-such-host.invalid", "29500", "0.5", "reached at MASTER_ADDR='no-such-host.invalid'"),
    ("127.0.0.1", "", "1", "needs MASTER_ADDR and a port, got .*, MASTER_PORT=''"),
    ("127.0.0.1", "BOUND", "soon", "FENCHEL_RENDEZVOUS must be a number of seconds > 0, got 'soon"),
]  # fmt: skip


@pytest.mark.parametrize("addr, port, seconds, named", UNREACHED)
def test_a_rank_that_cannot_reach_the_rendezvous_is_told_where_before_any_work(
    monkeypatch, addr, port, seconds, named
):
    """Rank 1 of a launch whose store (rank 0's, at ``MASTER_ADDR:MASTER_PORT``) does not
    answer, whose host has no address, or whose port is unset: ``comm_from_environment``
    raises naming the address within ``FENCHEL_RENDEZVOUS`` seconds (1 here; a value that is
    no number of seconds is named), before the process group, where the group's start would
    wait ``parallel.TIMEOUT`` (10 minutes)."""
    pytest.importorskip("torch")
    import socket

    import torch.distributed as dist

    from fenchel_cvx import parallel

    with socket.socket() as bound:  # (held for the test: no other test's store takes it)
        bound.bind(("127.0.0.1", 0))
        port = str(bound.getsockname()[1]) if port == "BOUND" else port
        env = dict(WORLD_SIZE="2", RANK="1", MASTER_ADDR=addr, MASTER_PORT=port)
        for key, value in {**env, parallel.RENDEZVOUS_VARIABLE: seconds}.items():
            monkeypatch.setenv(key, value)
        with pytest.raises(ValueError, match=named):
            parallel.comm_from_environment()
    assert not dist.is_initialized()


def test_train_as_a_rank_whose_rendezvous_has_no_host_is_refused_before_any_work(tmp_path):
    """``fenchel-cvx train`` as rank 1 of a launch whose ``MASTER_ADDR`` names no host: the
    command stops (status 2) naming the address, and writes nothing."""
    pytest.importorskip("torch")
    import subprocess
    import sys

    from test_cli import ENV

    env = dict(ENV, WORLD_SIZE="2", RANK="1", MASTER_ADDR="no-such-host.invalid", MASTER_PORT="1")
    env["FENCHEL_RENDEZVOUS"] = "1"
    flags = ["train", "--backend", "fast", "--quiet", "--out", str(tmp_path / "run")]
    out = subprocess.run(
        [sys.executable, "-m", "fenchel_cvx", *flags], cwd=tmp_path, capture_output=True,
        text=True, timeout=600, env=env,
    )  # fmt: skip
    assert out.returncode == 2, out.stderr[-2000:]
    assert "rendezvous cannot be reached at MASTER_ADDR='no-such-host.invalid'" in out.stderr
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    "flags, named",
    [
        (["--nproc", "2"], "--nproc: needs --backend fast"),  # (the oracle, the default)
        (["--nproc", "2", "--backend", "fast", "--record-blocks"], "--record-blocks"),
        (["--nproc", "0", "--backend", "fast"], "--nproc"),
    ],
)
def test_train_refuses_ranks_it_cannot_use_by_flag(tmp_path, flags, named):
    out = _cli("train", "--out", tmp_path / "run", *flags, cwd=tmp_path)
    assert out.returncode == 2 and named in out.stderr
    assert not (tmp_path / "run").exists()  # refused before any work


@pytest.mark.parametrize("check_every", [1, 5])  # a checked round; unchecked rounds (deferred)
def test_an_argmin_unusable_on_one_rank_halts_every_rank_at_that_block(check_every):
    """A planted fault: rank 1's columns of X_1 come back NaN. Every rank records the block's
    violation and halts after the round, at the same block."""
    from dataclasses import replace

    from fenchel_cvx.blocks import XBlock
    from fenchel_cvx.fast import FastBackend

    class NanOnRank1(FastBackend):
        def solve(self, block, start=None, **images):
            res = super().solve(block, start, **images)
            if self.comm.rank == 1 and isinstance(block, XBlock) and block.layer == 1:
                res = replace(res, argmin=res.argmin * np.nan)
            return res

    net, X0, Y, kw = _small_run(check_every=check_every)

    def rank(comm):
        return fit_bcd(copy.deepcopy(net), X0, Y, comm=comm, **{**kw, "backend": NanOnRank1()})

    for res in SimulatedComm(2).run(rank):
        (record,) = res.history.records  # halted after its first round
        assert record["halted"] == "X_1"
        found = [(v["check"], v["layer"]) for v in record["certificate"]["violations"]]
        assert ("block_optimality", "X_1") in found


def test_a_rank_killed_mid_run_stops_rank_0_with_an_error_naming_it():
    """SIGKILL of rank 1 after the second round (rank 0's callback kills it): rank 0's next
    collective fails, and ``fit_on_ranks`` raises naming the rank and its exit code (not after
    a collective's timeout: the run fails, it does not hang)."""
    pytest.importorskip("torch")
    import multiprocessing
    import os
    import signal

    from fenchel_cvx.parallel import fit_on_ranks

    net, X0, Y, kw = _small_run()
    killed = []

    def kill_rank_1(net_, rec):
        if rec["iteration"] == 2:
            (child,) = multiprocessing.active_children()
            os.kill(child.pid, signal.SIGKILL)
            killed.append(child.pid)

    with pytest.raises(RuntimeError, match="rank 1 exited with code -9"):
        fit_on_ranks(net, X0, Y, nproc=2, callback=kill_rank_1, **kw)
    assert len(killed) == 1


@pytest.mark.parametrize("shared_memory", [True, False])
def test_a_rank_stopped_mid_run_stops_rank_0_with_an_error_naming_it_as_hung(
    monkeypatch, shared_memory
):
    """SIGSTOP of rank 1 after the second round: its process lives but its heartbeat stops, so
    rank 0's next collective names it as hung after ``FENCHEL_HANG`` seconds (5 here, every
    rank's), not after a collective's timeout; the stopped rank is ended with the run. Through
    shared memory and through gloo alone (the beats then in the group's store)."""
    pytest.importorskip("torch")
    import multiprocessing
    import os
    import signal

    from fenchel_cvx.fast import heartbeat
    from fenchel_cvx.parallel import fit_on_ranks

    monkeypatch.setenv(heartbeat.HANG_VARIABLE, "5")
    net, X0, Y, kw = _small_run()
    stopped = []

    def stop_rank_1(net_, rec):
        if rec["iteration"] == 2:
            (child,) = multiprocessing.active_children()
            os.kill(child.pid, signal.SIGSTOP)
            stopped.append(child)

    with pytest.raises(heartbeat.RankHangs, match=r"rank 0: rank 1('s process \(\d+\))? hangs"):
        fit_on_ranks(net, X0, Y, nproc=2, callback=stop_rank_1, shared_memory=shared_memory, **kw)
    assert len(stopped) == 1
    stopped[0].join(10)
    assert stopped[0].exitcode == -signal.SIGKILL  # (ended, not left stopped)


@pytest.mark.parametrize("P", [2, 3])
def test_algorithm_1_on_simulated_ranks_is_the_one_process_run(P):
    """Algorithm 1 (all the data every round, each rank its share of the columns), every round
    checked: the same weights, X and objectives as in one process."""
    net, X0, Y, kw = _small_run(batch_size=None, iterations=3, alternations=1)
    one = fit_bcd(copy.deepcopy(net), X0, Y, **kw)
    out = SimulatedComm(P).run(lambda c: fit_bcd(copy.deepcopy(net), X0, Y, comm=c, **kw))
    for res in out:
        assert res.history.certificate_held == one.history.certificate_held
        for a, b in zip([*one.net.W, *one.Xs], [*res.net.W, *res.Xs]):
            assert a.shape == b.shape and np.max(np.abs(a - b)) <= 1e-12 * np.max(np.abs(a))
        for rec, rec_p in zip(one.history, res.history):
            for key in ("lifted_x", "network_x", "lifted_w", "network_w"):
                assert rec_p[key] == pytest.approx(rec[key], rel=1e-9)


def test_ranks_kept_for_several_runs_give_each_run_the_one_process_result():
    """``parallel.Ranks``: the processes started once (``join=False``: spawned, joined in the
    first run), two runs on them (a warm-up, then another network), each the one-process run
    to round-off; ended ranks refuse more work by name."""
    pytest.importorskip("torch")
    from fenchel_cvx.parallel import Ranks

    net, X0, Y, kw = _small_run()
    other = LiftedNetwork([12, 10, 8, 3], seed=2)
    with Ranks(2, threads=1, join=False) as ranks:
        assert ranks.comm is None and all(p.is_alive() for p in ranks.procs)  # (not joined yet)
        runs = [ranks.fit(copy.deepcopy(n), X0, Y, **kw) for n in (net, other)]
    for n, run in zip((net, other), runs):
        one = fit_bcd(copy.deepcopy(n), X0, Y, **kw)
        for a, b in zip(one.net.W, run.net.W):
            assert np.max(np.abs(a - b)) <= 1e-12 * np.max(np.abs(a))
        assert np.max(np.abs(one.Xs[-1] - run.Xs[-1])) <= 1e-12 * np.max(np.abs(one.Xs[-1]))
    assert not np.allclose(runs[0].net.W[0], runs[1].net.W[0])  # (two runs, not one twice)
    with pytest.raises(ValueError, match="these ranks have ended"):
        ranks.fit(copy.deepcopy(net), X0, Y, **kw)


@pytest.mark.parametrize("end", ["close", "an error"])
def test_ranks_that_never_joined_are_ended_by_close_or_an_error(end):
    """``Ranks(join=False)`` ended before any run (closed, or left by an error, as a command
    whose data fails to load after its ranks are spawned): every spawned process ends, instead
    of waiting in the group's rendezvous for rank 0, and the ranks refuse work by name."""
    pytest.importorskip("torch")
    from fenchel_cvx.parallel import Ranks

    ranks = Ranks(2, threads=1, join=False)
    procs = list(ranks.procs)
    if end == "close":
        ranks.close()
    else:
        with pytest.raises(RuntimeError, match="the data failed to load"), ranks:
            raise RuntimeError("the data failed to load")
    for proc in procs:
        proc.join(timeout=10)
    assert procs and not any(proc.is_alive() for proc in procs)
    net, X0, Y, kw = _small_run()
    with pytest.raises(ValueError, match="these ranks have ended"):
        ranks.fit(net, X0, Y, **kw)


def _sigint_ignored(pid):
    """Whether process ``pid`` ignores SIGINT (``SigIgn`` of its ``/proc`` status)."""
    status = Path(f"/proc/{pid}/status").read_text().splitlines()
    (line,) = (s for s in status if s.startswith("SigIgn:"))
    return bool(int(line.split()[1], 16) >> (signal.SIGINT - 1) & 1)


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="no /proc to read in")
def test_a_spawned_rank_leaves_ctrl_c_to_rank_0():
    """A terminal's Ctrl-C reaches every process of the command. A spawned rank ignores it once
    it runs (``parallel._child``): rank 0 alone answers it, and no rank prints a
    ``KeyboardInterrupt`` of its own. Rank 0 keeps its own handler."""
    pytest.importorskip("torch")
    from fenchel_cvx.parallel import Ranks

    outer = signal.signal(signal.SIGINT, signal.default_int_handler)  # (as in a terminal)
    try:
        with Ranks(2, threads=1) as ranks:
            assert _sigint_ignored(ranks.procs[0].pid) and not _sigint_ignored(os.getpid())
            assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGINT, outer)


#: rank 0 spawning its ranks (``join=False``), printing rank 1's process id, then killed
#: (SIGKILL: nothing of it runs after) once rank 1 is about to join (its imports done, it waits
#: in the group's rendezvous), as rank 0 would be while it loads its data
KILLED_BEFORE_JOINING = """
import os, signal
from fenchel_cvx import parallel

if __name__ == "__main__":
    ranks = parallel.Ranks(2, threads=1, join=False)
    print(ranks.procs[0].pid, flush=True)
    assert ranks.conns[0].poll(120) and ranks.conns[0].recv() == "joining"
    os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_spawned_rank_ends_when_rank_0_is_killed_before_the_ranks_join(tmp_path):
    """Rank 0's process killed while its spawned ranks start (``Ranks(join=False)``, before
    any run): rank 1 sees its rank 0 gone and ends within seconds, instead of waiting for it in
    the group's rendezvous until ``parallel.TIMEOUT`` (10 minutes)."""
    pytest.importorskip("torch")
    import subprocess
    import sys
    import time

    from fenchel_cvx.fast.host_memory import _alive

    script, printed = tmp_path / "killed.py", tmp_path / "printed.txt"
    script.write_text(KILLED_BEFORE_JOINING)
    with printed.open("w") as out:  # (a file: rank 1 holds no pipe of this test's)
        rank_0 = subprocess.run([sys.executable, str(script)], stdout=out, timeout=120)
    assert rank_0.returncode == -9
    rank_1 = int(printed.read_text().split()[0])
    deadline = time.monotonic() + 60  # (its imports, then a look every 50 ms)
    while _alive(rank_1) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(rank_1)


def _exit_3(slots, conn):
    import os

    os._exit(3)


def test_a_rank_that_ends_before_joining_is_named_at_once():
    """A spawned rank whose process ends before it joins the group (its imports failed, or it
    was killed) is named with its exit code, instead of the group's rendezvous waiting for it
    until ``parallel.TIMEOUT``."""

    ranks = _spawned(_exit_3)  # (its process ends at once, with code 3)
    with pytest.raises(RuntimeError, match="rank 1 exited with code 3 before joining the others"):
        ranks._started()


@pytest.mark.parametrize("beats", [True, False])
def test_a_rank_that_hangs_before_joining_is_named(monkeypatch, beats):
    """A spawned rank stopped (SIGSTOP) before it joins the group, after its first heartbeat
    or before it (its process starting): rank 0 names it as hung once its heartbeat, or its
    process's stop, is ``FENCHEL_HANG`` seconds old (3 here), instead of waiting for it until
    ``parallel.TIMEOUT``."""
    import os
    import signal

    from fenchel_cvx.fast import heartbeat

    monkeypatch.setenv(heartbeat.HANG_VARIABLE, "3")
    ranks = _spawned(_beat_then_stop if beats else _stop)
    try:
        how = "no heartbeat for" if beats else "stopped for"
        with pytest.raises(heartbeat.RankHangs, match=rf"rank 1's process \(\d+\) hangs: {how}"):
            ranks._started()
    finally:
        os.kill(ranks.procs[0].pid, signal.SIGKILL)


def test_a_rank_that_hangs_before_the_ranks_join_ends_every_rank_and_its_error_stands(
    monkeypatch,
):
    """``Ranks(2)`` whose start fails on rank 0 (a ``RankHangs`` from its look at the starting
    ranks, planted): the spawned rank is ended (a stopped one would otherwise keep rank 0's
    interpreter from exiting) and the error raised is the hang's, naming the rank."""
    pytest.importorskip("torch", reason="ranks need PyTorch (fenchel_cvx[bench])")
    from fenchel_cvx import parallel
    from fenchel_cvx.fast.heartbeat import RankHangs

    procs = []

    def hangs(ranks):
        procs.extend(ranks.procs)
        raise RankHangs("rank 0: rank 1 hangs before joining the others")

    monkeypatch.setattr(parallel.Ranks, "_started", hangs)
    with pytest.raises(RankHangs, match="rank 1 hangs before joining"):
        parallel.Ranks(2, threads=1)
    assert procs, "no rank was spawned"
    for proc in procs:
        proc.join(timeout=10)
    assert not any(proc.is_alive() for proc in procs)


#: ``Ranks(2)`` training a small network, its rank 1 sent the signal ``argv[2]`` (SIGSTOP or
#: SIGKILL, from rank 0) in the phase of its life named by ``argv[1]``; rank 1's process id is
#: printed as it is signalled. Through
#: ``Ranks``' own steps: its start (``_started``) before or after the spawned rank's imports,
#: its work's pickle (a 768 KB array, sent through the pipe: more than the pipe holds), rank 0's
#: callback mid-run, and ``close``.
RANK_PHASE = """
import os, signal, sys, time
import numpy as np
from fenchel_cvx import LiftedNetwork, parallel

def stop(ranks):
    print(ranks.procs[0].pid, flush=True)
    os.kill(ranks.procs[0].pid, getattr(signal, sys.argv[2]))

if __name__ == "__main__":
    phase, started = sys.argv[1], parallel.Ranks._started
    if phase == "before joining":
        parallel.Ranks._started = lambda self: (stop(self), started(self))[1]
    if phase == "while joining":
        parallel.Ranks._started = lambda self: (started(self), stop(self))[0]
    rng = np.random.default_rng(0)
    X0 = rng.standard_normal((12, 8000 if phase == "as it took its work" else 60))
    Y = np.eye(3)[:, rng.integers(0, 3, X0.shape[1])]
    kw = dict(batch_size=20, epochs=1, alternations=2, backend="fast", strict=False)
    ranks = parallel.Ranks(2, threads=1)
    if phase == "as it took its work":
        stop(ranks)
    if phase == "mid-run":
        kw["callback"] = lambda net, rec: rec["iteration"] == 2 and stop(ranks)
    ranks.fit(LiftedNetwork([12, 10, 8, 3], seed=1), X0, Y, **kw)
    if phase == "as it ended":
        stop(ranks)
        time.sleep(0.2)  # (a killed rank's pipe then closed before close() writes to it)
    ranks.close()
    print("ended without an error", flush=True)
"""

#: each phase of a rank's life, and where rank 0's error says rank 1 hung or ended
PHASES = {
    "before joining": "before joining the others",
    "while joining": "while joining the others",
    "as it took its work": "as it took its work",
    "mid-run": "during a collective",
    "as it ended": "as it ended",
}


#: what rank 0 raises for rank 1 stopped (it hangs) and killed (its process ended)
NAMED = {
    "SIGSTOP": r"RankHangs: rank 0: rank 1('s process \(\d+\))? hangs: .*",
    "SIGKILL": r"RuntimeError: training on ranks.*: rank 1 exited with code -9 .*",
}


@pytest.mark.parametrize("signal_name", list(NAMED))
@pytest.mark.parametrize("phase", list(PHASES))
def test_a_rank_stopped_or_killed_in_each_phase_of_its_life_is_named_and_every_process_ends(
    tmp_path, phase, signal_name
):
    """Rank 1 stopped (SIGSTOP) or killed (SIGKILL) before it joins the group, while it joins,
    as it takes its work, mid-run and as the ranks end: rank 0 raises an error naming rank 1
    and the phase (a stopped rank once its heartbeat is ``FENCHEL_HANG`` seconds old, 3 here;
    a killed one by its exit code), its process then exits (a stopped child must not hold its
    interpreter's exit), and rank 1 is ended with it."""
    pytest.importorskip("torch", reason="ranks need PyTorch (fenchel_cvx[bench])")
    import os
    import subprocess
    import sys

    from fenchel_cvx.fast.heartbeat import HANG_VARIABLE

    script = tmp_path / "rank_phase.py"
    script.write_text(RANK_PHASE)
    env = {**os.environ, HANG_VARIABLE: "3"}
    proc = subprocess.Popen(
        [sys.executable, str(script), phase, signal_name], stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True, env=env, start_new_session=True,
    )  # fmt: skip
    try:
        out, err = proc.communicate(timeout=120)
        ended = True
    except subprocess.TimeoutExpired:  # (rank 0 runs, or a rank left behind holds its pipes)
        _kill_process_groups([proc])
        out, err = proc.communicate()
        ended = False
    stopped = [int(line) for line in out.split() if line.isdigit()]
    try:
        assert ended, f"rank 0 and rank 1 did not both end within 120 s: {out}{err[-3000:]}"
        assert proc.returncode == 1, f"rank 0 ended with {proc.returncode}: {out}{err[-3000:]}"
        assert len(stopped) == 1, out
        assert not _alive(stopped[0], within=10), f"rank 1 (process {stopped[0]}) outlived rank 0"
    finally:
        _kill_process_groups([proc])
    assert re.search(NAMED[signal_name] + PHASES[phase], err), err[-3000:]


def _kill_process_groups(procs):
    """SIGKILL to every process left in the process group that each of ``procs`` leads
    (started with ``start_new_session=True``), its children included."""
    import os
    import signal

    for proc in procs:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:  # (none left)
            pass


def _alive(pid, within):
    """Whether process ``pid`` still runs (and is not a zombie) ``within`` seconds from now."""
    import time

    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    return False
        except FileNotFoundError:
            return False
        time.sleep(0.1)
    return True


def _spawned(target):
    """``Ranks`` of 2 whose rank 1 is ``target(slots, conn)`` in a spawned process (its
    heartbeat's slots, its end of the pipe), not yet joined: for its start's checks."""
    import multiprocessing

    from fenchel_cvx.parallel import Ranks, _beats

    ctx = multiprocessing.get_context("spawn")
    ranks = Ranks.__new__(Ranks)
    slots = ctx.RawArray("q", 4)
    ranks.nproc, ranks.beats, ranks._stopped_since = 2, _beats(slots, 0), {}
    mine, theirs = ctx.Pipe()
    ranks.conns = [mine]
    ranks.procs = [ctx.Process(target=target, args=(slots, theirs), daemon=True)]
    ranks.procs[0].start()
    theirs.close()
    return ranks


def _beat_then_stop(slots, conn):
    from fenchel_cvx.parallel import _beats

    beats = _beats(slots, 1)  # noqa: F841 - beats while referenced
    _stop(slots, conn)


def _stop(slots, conn):
    import os
    import signal

    os.kill(os.getpid(), signal.SIGSTOP)


def _backprop_data(m=300, batch=64):
    """A small classification problem and its batches (the last one partial: 300 = 4 x 64 +
    44, which 3 ranks split 15, 15, 14)."""
    from fenchel_cvx.datasets import batch_order

    rng = np.random.default_rng(0)
    X, y = rng.standard_normal((12, m)), rng.integers(0, 3, m)
    return X, y, batch_order(m, batch, 2, seed=0)


def test_adam_under_ddp_on_ranks_is_the_one_process_run():
    """``Ranks.run(train_backprop, ...)``: Adam under PyTorch DDP on 2 and 3 ranks, each rank on
    its share of every batch, takes the one-process steps (float32 round-off), the uneven
    shares of the last batch included: each rank's loss is weighted by its share."""
    pytest.importorskip("torch", reason="ranks need PyTorch (fenchel_cvx[bench])")
    from fenchel_cvx.baselines import train_backprop
    from fenchel_cvx.parallel import Ranks

    X, y, batches = _backprop_data()
    settings = dict(batches=batches, optimizer="adam", lr=1e-2, seed=0, eval_every=2)
    one = train_backprop((12, 16, 3), X, y, X[:, :60], y[:60], **settings)
    for P in (2, 3):
        with Ranks(P, threads=1) as ranks:
            many = ranks.run(train_backprop, (12, 16, 3), X, y, X[:, :60], y[:60], **settings)
        for a, b in zip(one.weights, many.weights):
            assert np.max(np.abs(a - b)) <= 1e-5 * np.max(np.abs(a)), P
        assert many.test_accuracy == one.test_accuracy
        assert [c[0] for c in many.checkpoints] == [c[0] for c in one.checkpoints]


def test_unweighted_shares_are_not_the_whole_batchs_step(monkeypatch):
    """The planted fault: shares not weighted (each rank's plain mean loss, which DDP then
    averages) weigh the 14-point share of the last batch like the 15-point ones, and the run
    leaves the one-process steps; the weighting is what the test above checks. Simulated in
    one process: the mean of the shares' gradients against the batch's."""
    torch = pytest.importorskip("torch")
    from fenchel_cvx.baselines.backprop import _share

    g = torch.arange(44.0)  # a per-point "gradient" of a 44-point batch
    idx = np.arange(44)
    weighted = sum(w * g[part].mean() for part, w in (_share(3, r, idx) for r in range(3))) / 3
    plain = sum(g[part].mean() for part, _ in (_share(3, r, idx) for r in range(3))) / 3
    assert float(weighted) == pytest.approx(float(g.mean()), rel=1e-6)
    assert abs(float(plain) - float(g.mean())) > 1e-3


def test_ddp_refuses_more_ranks_than_points_in_a_batch():
    """A communicator of more ranks than the smallest batch's points, or an object that is
    no communicator, is refused by name before any step."""
    pytest.importorskip("torch")
    from types import SimpleNamespace

    from fenchel_cvx.baselines import train_backprop

    X, y, batches = _backprop_data(m=130)  # the last batch: 2 points
    comm = SimpleNamespace(P=3, rank=0, group=None)
    with pytest.raises(ValueError, match="comm has 3 ranks, more than the 2 points"):
        train_backprop((12, 16, 3), X, y, X, y, batches=batches, comm=comm)
    with pytest.raises(ValueError, match="comm must be the ranks' communicator"):
        train_backprop((12, 16, 3), X, y, X, y, batches=batches, comm=object())


@pytest.mark.parametrize("restart", [True, False])  # Algorithm 2 of one batch; Algorithm 1
def test_figure_1s_fln_on_two_ranks_is_the_one_process_run(restart, monkeypatch):
    """``fit_lifted("fln", nproc=2)`` (Figure 1's method, ``--set fln.nproc=2`` in
    ``benchmarks/mnist_lifted.py``): the data's columns split over two ranks (the rounds ran on
    two), the same objectives, test accuracies and weights as in one process, float64."""
    pytest.importorskip("torch", reason="ranks need PyTorch (fenchel_cvx[bench])")
    from fenchel_cvx.baselines.lifted import fit_lifted
    from fenchel_cvx.baselines.lifted import fln as method
    from fenchel_cvx.parallel import Ranks

    fits, fit = [], Ranks.fit

    def counted(self, *args, **kwargs):
        fits.append(self.nproc)
        return fit(self, *args, **kwargs)

    monkeypatch.setattr(Ranks, "fit", counted)

    rng = np.random.default_rng(1)
    X, labels = rng.random((20, 301)), rng.integers(0, 4, 301)
    Y = np.eye(4)[labels].T
    settings = dict(
        hidden=(12,), iterations=3, seed=0, w_steps=2, x_steps=10, max_iter=10, restart=restart
    )
    one = fit_lifted("fln", X, Y, X[:, :50], Y[:, :50], **settings)
    two = fit_lifted("fln", X, Y, X[:, :50], Y[:, :50], nproc=2, **settings)
    assert [r["test_accuracy"] for r in two.records] == [r["test_accuracy"] for r in one.records]
    for key in ("objective",):
        assert two.series(key) == pytest.approx(one.series(key), rel=1e-9)
    for a, b in zip(one.net.W, two.net.W):
        assert np.max(np.abs(a - b)) <= 1e-10 * np.max(np.abs(a))
    assert fits == [2] and method.FLN.defaults["nproc"] == 1
