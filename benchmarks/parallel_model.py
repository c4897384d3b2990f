"""FLN on P ranks: the cost model of each block, the machine's ceiling, and the measured run.

For the MNIST MLP's and LeNet-5's FLN as the benchmarks train them (``defaults.training``'s tuned
setting, the fast backend with ``compile="auto"``, float32, one thread, freed memory kept; one
epoch of the first 4,000 training images, 8 batches of 500, the middle 6 timed), every block
solve runs through a counting communicator (``reduce.py``), which gives, per block and batch:

- ``compute``: its seconds on one rank, and ``rank``: its seconds on one rank's share, as one
  process takes it alone: a block split by columns on m/P points (the same epoch in batches of
  500/P, in a process of its own; a W-block with fewer points than rows of X~ on m/P points but
  not on m, LeNet-5's W_2 and the MLP's W_1, in parameter space as a rank solves it:
  ``common.counting.Shares``), a hidden W-block with fewer points than rows of X~ (the MLP's
  W_0: data space) on its p/P rows over every point, which it moves to (X~ gathered, V moved, W
  gathered: 6 collectives and their bytes), its m x m factorisation formed anew, as every rank
  forms it;
- ``collectives``: the decisions a P-rank solve takes together (one ``reduce`` each: the seam's
  sums and maxima), and their bytes;
- the machine's BLAS kernels and GEMM rates on one thread (``common.devices.blas_record``);
- a collective's latency at those sizes on P ranks of this machine (``TorchComm.reduce`` of
  one array, the mean of 200: a batch pays the sum, tails included), through shared memory
  (what the ranks of one host use) and through gloo alone.

The model of a P-rank batch (``common.rank_model``) is ``sum over blocks (rank + collectives x
latency) + the driver on m/P points`` (the driver: the batch time less its blocks'), the W-blocks
solved by layer at the busiest rank's sum of their one-rank seconds. A share is not 1/P of the
work: a solve's steps, factors and calls cost as much on fewer points, and a row split's data-space
steps cost p/P x m^2, not p x (m/P)^2. Its speed-up, as the measured one, is over one rank's epoch
alone (the ceiling's). The ceiling: one epoch alone on one rank, then P such epochs at once as P
processes: ``P x alone / together`` is the most P ranks gain on this machine before any
communication; the model is also given at that contention (a rank's work x the repeats' median of
together / alone: ``rank_model.contended``). Then the epoch itself on P ranks (``parallel.Ranks``,
one thread each, kept between epochs and warmed by ``WARM`` epochs first, as a run's ranks are
after its first), timed on rank 0, with shared memory and with gloo alone: the measured speed-ups
beside the model and the ceiling, the seconds rank 0 spent inside collectives
(``torch_comm.CLOCK``: the transport and its waits for the other ranks), and rank 0's seconds in
each block (as its history records them: the solve and its waits) beside the model's share of that
block. The P-rank epoch and the ceiling's pair, whose epoch alone is the one-rank figure, run in
turn, ``--repeats`` times (the machine's speed drifts between runs): the speed-up and the ceiling
are the medians of each repeat's ratios. Every process sees one batch size, as a run's do (rank 0
is this process, which runs no epoch of 500 itself: ``run_alone``).

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/parallel_model.py \\
        --data-dir DIR
    python benchmarks/parallel_model.py --quick --networks mlp --ranks 2     # a smoke run
"""

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common.counting import Roles, Shares, parameter_space_on_ranks  # noqa: E402
from common.data import add_data_flags, load  # noqa: E402
from common.devices import blas_record, cpu_model, machine_text  # noqa: E402
from common.latency import latency, latency_tables  # noqa: E402
from common.rank_model import contended, model  # noqa: E402
from fenchel_cvx.heap import keep_freed_memory  # noqa: E402
from refactor_ab import NETWORKS, TIMED, M, check_networks_and_json, recipe  # noqa: E402

#: the epoch's batches (4,000 images, 500 a batch)
BATCHES = 8
#: epochs that warm the ranks before the clock (``warm_ranks``)
WARM = 2
#: the figures of one interleaved repeat, seconds a batch (``interleaved``)
REPEAT_KEYS = ("one_rank_s", "batch_P_s", "collectives_s", "together_s")
#: collectives of a hidden W-block's move to rows: X~ (shapes, data), V (shapes, data), W (2)
MOVE_COLLECTIVES = 6


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--networks", default="mlp,lenet5", help="of: " + ", ".join(NETWORKS))
    p.add_argument("--ranks", type=int, default=2, help="P, the ranks modelled and measured")
    p.add_argument("--json", default=None, help="also write the figures to this JSON file")
    p.add_argument(
        "--repeats", type=int, default=3,
        help="interleaved repeats of (one rank, P ranks, the ceiling's pair); medians reported",
    )  # fmt: skip
    add_data_flags(p, validation=False, train_size=False)
    p.add_argument("--quick", action="store_true", help="the embedded 5k MNIST sample")
    p.add_argument("--alone", default=None, help=argparse.SUPPRESS)  # a ceiling's epoch
    p.add_argument("--share", type=int, default=0, help=argparse.SUPPRESS)  # (``alone``)
    args = check_networks_and_json(p, p.parse_args(argv))
    if args.ranks < 2:
        p.error(f"--ranks must be >= 2, got {args.ranks}")
    if args.repeats < 1:
        p.error(f"--repeats must be >= 1, got {args.repeats}")
    return args


def data(args):
    from fenchel_cvx.datasets import one_hot

    ds, _ = load(args, dtype="float32")
    X = np.ascontiguousarray(ds.X_train[:, :M], dtype=np.float32)
    return X, one_hot(ds.y_train[:M], ds.n_classes).astype(np.float32)


def epoch(network, X, Y, probe=None, ranks=None, waits=None, share=1, blocks=None):
    """One epoch of ``network``'s FLN: the timed batches' seconds (``probe``: called with each
    batch's number, from 1, as it ends); ``ranks``: on those ranks of this machine
    (``parallel.Ranks``, kept between epochs as a run keeps them), timed on rank 0; None: in
    this process. ``waits``: a list that receives the seconds rank 0 spent in collectives in
    each timed batch (``fast.torch_comm.CLOCK``: the transport and the wait for the other
    ranks). ``share``: batches of 500 / share images (one rank's share of a split batch).
    ``blocks``: a list that receives each timed batch's ``{block: seconds}`` (rank 0's, as its
    history records them: a block's solve, its waits for the other ranks included)."""
    import fenchel_cvx as pkg
    import fenchel_cvx.bcd
    import fenchel_cvx.defaults
    import fenchel_cvx.fast  # noqa: F401 - recipe reads pkg.fast
    from fenchel_cvx.fast.torch_comm import CLOCK

    net, backend, fit = recipe(pkg, network)
    fit["batch_size"] //= share
    stamps, clock = [time.perf_counter()], [CLOCK.seconds]

    def after(net_, rec):
        stamps.append(time.perf_counter())
        clock.append(CLOCK.seconds)
        if probe is not None:
            probe(rec["batch"])

    if ranks is None:
        res = fenchel_cvx.bcd.fit_bcd(net, X, Y, backend=backend, callback=after, **fit)
    else:
        res = ranks.fit(net, X, Y, backend=backend, callback=after, **fit)
    if waits is not None:
        waits.extend(np.diff(clock)[TIMED])
    if blocks is not None:
        per_batch = defaultdict(lambda: defaultdict(float))
        for rec in res.history.records:  # (a record a round: a batch's rounds added)
            for b in rec["blocks"]:
                per_batch[rec["batch"]][b["block"]] += b["seconds"]
        blocks.extend(dict(per_batch[n]) for n in sorted(per_batch)[TIMED])
    return list(np.diff(stamps)[TIMED])


def counted_epoch(network, X, Y, P, share=1):
    """``(batch seconds, {block: figures per batch})``: one epoch with every solve counted, in
    batches of 500 / ``share``; each block moved to rows (``share`` 1) then solved again on
    rank 0's p/P rows alone (``rank_s``), after the epoch."""
    from fenchel_cvx import fast
    from fenchel_cvx.blocks import WHidden
    from fenchel_cvx.fast._util import part
    from fenchel_cvx.reduce import LOCAL
    from fenchel_cvx.threads import limit_threads

    figures, batch, moved_blocks = defaultdict(lambda: defaultdict(float)), [0], []
    solve_x, solve_pncg = fast.solve_x, fast.solve_pncg
    timed = range(1 + TIMED.start, 1 + BATCHES * share + TIMED.stop)  # (numbered from 1)

    def record(block, seconds, comm, solve=()):
        if batch[0] + 1 not in timed:
            return
        key = f"{'X' if block.kind.startswith('x') else 'W'}_{block.layer}"
        f = figures[key]
        moved = isinstance(block, WHidden) and share * block.Xt.shape[1] < block.Xt.shape[0]
        f["compute_s"] += seconds
        if solve:  # a W-block's columns (targets and start image too) and W: the layer split's
            m, size = block.Xt.shape[1], block.Xt.dtype.itemsize
            rows = sum(getattr(block, k).shape[0] for k in block.column_fields)
            f["column_bytes"] += (rows + solve[1].shape[0]) * m * size
            f["w_bytes"] += solve[1].shape[0] * solve[1].shape[1] * size
        f["moved"], f["as_on_ranks"] = float(moved), float(isinstance(comm, Shares))
        if moved:  # a row split: its rows' figures, and the move
            f["collectives"] += comm.rows.calls + MOVE_COLLECTIVES
            n1, m = block.Xt.shape
            f["bytes"] += comm.rows.bytes + 4 * (n1 * m + 2 * block.V.shape[0] * m)
            if share == 1:  # rank 0's rows, copied as they are now
                r = slice(0, -(-block.V.shape[0] // P))
                sub = part(block, V=block.V[r].copy(), W0=block.W0[r].copy(), Xt=block.Xt.copy())
                W = sub.W0 if solve[1] is block.W0 else solve[1][r].copy()
                moved_blocks.append((key, sub, W, solve))
        else:
            f["collectives"] += comm.calls
            f["bytes"] += comm.bytes

    def x(xp, block, Z, tol, max_iter, settings, _comm=None):  # (one process's)
        comm, t0 = Roles(), time.perf_counter()
        out = solve_x(xp, block, Z, tol, max_iter, settings, comm)
        record(block, time.perf_counter() - t0, comm)
        return out

    def w(xp, block, W, tol, max_iter, cache, settings, _comm=None):  # (a share: as a rank's)
        comm = Shares(share) if parameter_space_on_ranks(block, share) else Roles()
        t0 = time.perf_counter()
        out = solve_pncg(xp, block, W, tol, max_iter, cache, settings, comm)
        record(block, time.perf_counter() - t0, comm, (xp, W, tol, max_iter, settings))
        return out

    fast.solve_x, fast.solve_pncg = x, w
    try:
        seconds = epoch(network, X, Y, probe=lambda b: batch.__setitem__(0, b), share=share)
    finally:
        fast.solve_x, fast.solve_pncg = solve_x, solve_pncg
    for key, sub, W, (xp, _, tol, max_iter, settings) in moved_blocks:
        with limit_threads(1):  # (a new cache: the factor formed anew, as every rank forms it)
            t0 = time.perf_counter()
            solve_pncg(xp, sub, W, tol, max_iter, {}, settings, LOCAL)
            figures[key]["rank_s"] += time.perf_counter() - t0
    n = len(seconds)
    per_batch = {k: {name: v / n for name, v in f.items()} for k, f in figures.items()}
    for k, f in per_batch.items():
        f["moved"], f["as_on_ranks"] = figures[k]["moved"], figures[k]["as_on_ranks"]  # flags
    return seconds, per_batch


# --- the ceiling ----------------------------------------------------------------------------------
def run_alone(network, args, n=1, share=0):
    """The last line printed by each of ``n`` processes of this script run at once (one thread
    each): with ``share`` 0, the median timed batch of one rank's epoch (after ``WARM``); else
    the JSON of ``counted_epoch`` in batches of 500 / ``share``, whose kernels are then
    compiled for that size alone (``torch.compile`` makes a kernel shape-generic, and slower,
    once a process has seen a second size)."""
    source = ["--quick"] if args.quick else ["--data-dir", str(args.data_dir)]
    cmd = [sys.executable, __file__, "--alone", network, "--ranks", str(args.ranks), "--share"]
    cmd += [str(share), *source]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True) for _ in range(n)]
    return [p.communicate(timeout=1200)[0].strip().splitlines()[-1] for p in procs]


def ceiling(network, P, args):
    """``(alone, together)``: the median timed batch of one rank's epoch alone, and of P such
    epochs run at once as P processes (the slowest's)."""
    return tuple(max(float(line) for line in run_alone(network, args, n)) for n in (1, P))


@contextlib.contextmanager
def warm_ranks(network, X, Y, P, shared_memory=True):
    """``parallel.Ranks`` of P processes, one thread each, after ``WARM`` epochs of
    ``network`` on them: a rank's first epochs compile its kernels and grow its memory, which a
    run pays once."""
    from fenchel_cvx.parallel import Ranks

    with Ranks(P, threads=1, shared_memory=shared_memory) as ranks:
        for _ in range(WARM):
            epoch(network, X, Y, ranks=ranks)
        yield ranks


def interleaved(network, X, Y, ranks, args, blocks):
    """One repeat, in turn: ``(one rank, P ranks, rank 0's seconds in collectives, together)``,
    each the median timed batch (``REPEAT_KEYS``): the epoch on ``ranks`` (``blocks``: receives
    rank 0's seconds per block of each timed batch), then the ceiling's pair (one rank alone,
    then P at once), so that the machine's drift between repeats falls on both sides of each
    ratio."""
    waits = []
    p_ranks = statistics.median(epoch(network, X, Y, ranks=ranks, waits=waits, blocks=blocks))
    one, together = ceiling(network, ranks.nproc, args)
    return one, p_ranks, statistics.median(waits), together


def each_network_alone(args):
    """The report of each of ``--networks`` measured in a process of its own (one network's
    compiled kernels and memory would slow the next one's one-rank epochs in this process, not
    its fresh ranks'), printed as it comes, merged (the latency tables: the last network's)."""
    flags = ["--ranks", str(args.ranks), "--repeats", str(args.repeats)]
    flags += ["--quick"] if args.quick else ["--data-dir", str(args.data_dir)]
    report = {}
    with tempfile.TemporaryDirectory() as folder:
        for network in args.network_list:
            part = Path(folder) / f"{network}.json"
            cmd = [sys.executable, __file__, *flags, "--networks", network, "--json", str(part)]
            subprocess.run(cmd, check=True, timeout=3600)
            report.update(json.loads(part.read_text()))
    return _written(args, report)


def main(argv=None):
    args = parse_args(argv)
    keep_freed_memory()  # as the command line, and the ranks spawned from here (``heap.py``)
    if args.alone is None and len(args.network_list) > 1:
        return each_network_alone(args)
    X, Y = data(args)
    if args.alone is not None:
        for _ in range(WARM):  # (kernels compiled and memory grown before the clock)
            epoch(args.alone, X, Y, share=args.share or 1)
        if args.share:
            print(json.dumps(counted_epoch(args.alone, X, Y, args.ranks, args.share)), flush=True)
        else:
            print(statistics.median(epoch(args.alone, X, Y)), flush=True)
        return None
    import fenchel_cvx.defaults  # noqa: F401 - recipe reads fenchel_cvx.defaults and .fast
    import fenchel_cvx.fast  # noqa: F401
    from fenchel_cvx.layer_split import owners

    P, machine, times = args.ranks, cpu_model(), 20 if args.quick else 200  # (smoke: mean of 20)
    table, gloo = latency_tables(P, times=times)
    report = dict(
        machine=machine, cores=os.cpu_count(), ranks=P, kernels=blas_record(1),
        latency_s={str(k): v for k, v in table.items()},
        latency_gloo_s={str(k): v for k, v in gloo.items()},
    )  # fmt: skip
    print(machine_text({**report["kernels"], "processor": machine, "cpus": os.cpu_count()}))
    for name, t in (("shared memory", table), ("gloo alone", gloo)):
        print(f"{P} ranks on {os.cpu_count()} cores ({report['machine']}); a reduction's mean "
              f"latency, {name}:",
              ", ".join(f"{k} B {v * 1e3:.3f} ms" for k, v in t.items()))  # fmt: skip
    for network in args.network_list:
        seconds, figures = json.loads(run_alone(network, args, share=1)[0])
        share_seconds, share = json.loads(run_alone(network, args, share=P)[0])
        batch_s = statistics.median(seconds)
        plan = owners(*recipe(fenchel_cvx, network)[:2], P)  # (the W-blocks by layer)
        m = model(figures, batch_s, share, statistics.median(share_seconds), table, P, plan)
        on_ranks = []  # (rank 0's {block: seconds} of every timed batch on P ranks)
        with warm_ranks(network, X, Y, P) as ranks:
            pairs = [interleaved(network, X, Y, ranks, args, on_ranks) for _ in range(args.repeats)]
        one, measured, waited, together = (statistics.median(p[k] for p in pairs) for k in range(4))
        rank0 = {k: statistics.median(b[k] for b in on_ranks) for k in figures}
        speedup = statistics.median(p[0] / p[1] for p in pairs)
        limit = statistics.median(P * p[0] / p[3] for p in pairs)
        slowdown = statistics.median(p[3] / p[0] for p in pairs)  # (P at once against alone)
        m.update(slowdown=slowdown, contended_batch_P_s=contended(m, slowdown))
        with warm_ranks(network, X, Y, P, shared_memory=False) as ranks:
            via_gloo = statistics.median(epoch(network, X, Y, ranks=ranks))
        print(f"\n{network}: one rank {batch_s * 1e3:.1f} ms a batch in the counted epoch; per "
              "block and batch:")  # fmt: skip
        print(f"  {'block':6} {'compute ms':>10} {'rank ms':>8} {'on ranks':>8} "
              f"{'collectives':>11} {'KB':>9} {'comm ms':>8}")  # fmt: skip
        for key in sorted(figures, key=lambda k: (k[0], int(k[2:]))):
            f = figures[key]
            c = 0.0 if "layer_rank" in f else f["collectives"] * latency(  # (by layer: below)
                table, f["bytes"] / max(f["collectives"], 1))  # fmt: skip
            moved = "  (moved to rows)" if f["moved"] else ""
            moved += f"  (by layer: rank {f['layer_rank']})" if "layer_rank" in f else ""
            moved += "  (rank: parameter space)" if f.get("as_on_ranks") else ""
            print(f"  {key:6} {f['compute_s'] * 1e3:10.1f} {f['rank_s'] * 1e3:8.1f} "
                  f"{rank0[key] * 1e3:8.1f} {f['collectives']:11.0f} {f['bytes'] / 1e3:9.1f} "
                  f"{c * 1e3:8.1f}" + moved)  # fmt: skip
        if plan:
            print("  by layer: the ranks' loads " + ", ".join(
                f"{s * 1e3:.1f}" for s in m["layer_loads_s"]
            ) + f" ms (the batch waits for the most); gather and exchange "
              f"{m['layer_split_comm_s'] * 1e3:.1f} ms")  # fmt: skip
        print(
            f"  driver {m['driver_s'] * 1e3:.1f} ms; model of {P} ranks: "
            f"{m['batch_P_s'] * 1e3:.1f} ms a batch = a rank's blocks "
            f"{m['rank_blocks_s'] * 1e3:.1f} + its driver {m['rank_driver_s'] * 1e3:.1f} + "
            f"communication {m['comm_s'] * 1e3:.1f}; {one / m['batch_P_s']:.2f}x one rank alone "
            f"(no communication: {one / (m['batch_P_s'] - m['comm_s']):.2f}x), "
            f"communication {m['comm_s'] / m['batch_P_s']:.0%} of the batch"
        )
        print(f"  ceiling (median of {args.repeats}): one rank alone {one * 1e3:.1f} ms a "
              f"batch, {P} at once {together * 1e3:.1f} ms: at most {limit:.2f}x on this "
              f"machine; the model at its contention (a rank's work x{m['slowdown']:.2f}, the "
              f"repeats' median): {one / m['contended_batch_P_s']:.2f}x one rank")  # fmt: skip
        print(
            f"  measured (median of {args.repeats}): {P} ranks (one thread each) "
            f"{measured * 1e3:.1f} ms a batch: {speedup:.2f}x one rank alone, "
            f"{speedup / limit:.2f} of the ceiling; through gloo alone {via_gloo * 1e3:.1f} ms: "
            f"{one / via_gloo:.2f}x one rank"
        )
        blocks_0, rest = sum(rank0.values()), m["rank_driver_s"] + m["comm_s"]
        print(f"  on {P} ranks (medians): rank 0's blocks {blocks_0 * 1e3:.1f} ms a batch (the "
              f"model's {m['rank_blocks_s'] * 1e3:.1f}; per block: 'on ranks', its waits "
              f"included), the rest of its batch {(measured - blocks_0) * 1e3:.1f} (the model's "
              f"driver and communication {rest * 1e3:.1f})")  # fmt: skip
        print("  each repeat (one rank alone, P ranks, P at once; ms): " + "; ".join(
            ", ".join(f"{p[k] * 1e3:.1f}" for k in (0, 1, 3)) for p in pairs
        ))  # fmt: skip
        print(f"  rank 0 in collectives (transport and waits for the other ranks): "
              f"{waited * 1e3:.1f} ms a batch, {waited / measured:.0%} of it")  # fmt: skip
        report[network] = dict(
            batch_s=batch_s, blocks=figures, model=m, speedup=one / m["batch_P_s"],
            ceiling=dict(alone_s=one, together_s=together, speedup=limit),
            measured=dict(
                one_rank_s=one, batch_P_s=measured, speedup=speedup, gloo_batch_P_s=via_gloo,
                gloo_speedup=one / via_gloo, collectives_s=waited, rank0_blocks_s=rank0,
                repeats=[dict(zip(REPEAT_KEYS, p)) for p in pairs],
            ),
        )  # fmt: skip
    return _written(args, report)


def _written(args, report):
    """``report``, written to ``--json`` where given."""
    if args.json:
        from fenchel_cvx.io import write_json

        write_json(args.json, report)
    return report


if __name__ == "__main__":
    main()
