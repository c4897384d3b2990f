"""Whole certified Algorithm-1 iterations of Figure 1's network by the oracle, on Dask workers.

Figure 1's network (the paper's Sec. 5.1: 784-300-10, ReLU; MSE, or cross-entropy with
``--loss cross_entropy``; lam 0.2 in this package's units, rho (1, 10) as
``benchmarks/mnist_lifted.py``), float64, on the first ``m`` training images, from the Xavier
start (seed 0). ``fit_bcd`` runs ``--iterations`` rounds of Algorithm 1 with
``OracleBackend(tol=1e-6)`` on a Dask ``LocalCluster`` of ``--workers`` single-threaded workers
(started and joined before the clock starts: "cold" is the cluster up and the data loaded,
nothing factored yet) and this process on as many threads (``--driver-threads``: P workers make
a run of P cores; the driver works while they wait), every round checked by the whole
certificate (``check_every=1``: every block's recomputed KKT residual <= 1e-6, the descent and
the lower bound). Printed per ``m``:
each iteration's wall seconds (the first cold, the rest warm), each block's seconds and KKT
residual from the round's record, the seconds each worker computed its share of W_0's rows
(Dask's task stream: the shares' balance), and the peak resident memory of this process and of
every worker; with several ``--m``, the log-log slope of the cold and the warm iteration's time
against m.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/oracle_iteration.py \\
        [--data-dir DIR] [--m 7500,15000,30000,60000] [--workers 2] [--iterations 2] \\
        [--loss mse|cross_entropy] [--driver-threads THREADS] [--json OUT]
"""

import argparse
import bisect
import collections
import math
import sys
import time
from pathlib import Path

import numpy as np
from threadpoolctl import threadpool_limits

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common import data  # noqa: E402
from common.devices import machine, machine_text  # noqa: E402
from fenchel_cvx import LiftedNetwork, fit_bcd  # noqa: E402
from fenchel_cvx.datasets import one_hot  # noqa: E402
from fenchel_cvx.heap import keep_freed_memory  # noqa: E402
from fenchel_cvx.io import write_json  # noqa: E402
from fenchel_cvx.oracle import OracleBackend  # noqa: E402
from fenchel_cvx.oracle.cluster import local_cluster  # noqa: E402
from fenchel_cvx.threads import cores  # noqa: E402

SIZES = (784, 300, 10)
RHO = (1.0, 10.0)
TOL = 1e-6


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    data.add_data_flags(p, validation=False)
    p.add_argument("--m", default="60000", help="comma list of training images (default 60000)")
    p.add_argument("--workers", type=int, default=2, help="Dask workers (default 2)")
    p.add_argument("--iterations", type=int, default=2, help="rounds of Algorithm 1 (default 2)")
    p.add_argument("--loss", choices=("mse", "cross_entropy"), default="mse")
    p.add_argument("--lam", type=float, default=0.2, help="lam, this package's units (0.2)")
    p.add_argument(
        "--driver-threads",
        type=int,
        default=None,
        help="BLAS threads of this process, which solves the X- and W_L blocks and checks the "
        "certificate while the workers wait (default: one a worker, at most this machine's "
        "cores: P workers make a run of P cores; the workers have one each)",
    )
    p.add_argument("--json", type=Path, default=None, help="write the figures here")
    args = p.parse_args(argv)
    try:
        args.m = [int(v) for v in args.m.split(",")]
    except ValueError:
        p.error(f"--m must be a comma list of integers, got {args.m!r}")
    if args.driver_threads is None:
        args.driver_threads = min(args.workers, cores())
    for name, value in (
        ("m", min(args.m)),
        ("workers", args.workers),
        ("iterations", args.iterations),
        ("driver-threads", args.driver_threads),
    ):
        if value < 1:
            p.error(f"--{name} must be >= 1, got {value}")
    args.threads = args.driver_threads
    return args


def _peak_rss():
    """This process's peak resident memory in bytes (Linux: ``ru_maxrss`` in KiB)."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def one_size(args, ds, m):
    """``--iterations`` certified rounds on the first ``m`` images: the figures of each."""
    from distributed import get_task_stream

    X0 = np.ascontiguousarray(ds.X_train[:, :m])
    Y = one_hot(ds.y_train[:m], SIZES[-1])
    net = LiftedNetwork(SIZES, loss=args.loss, lam=args.lam, rho=RHO, seed=0)
    client, cluster = local_cluster(args.workers)  # the backend's own kind of cluster
    stamps, walls = [time.perf_counter()], [time.time()]  # (walls: the task stream's clock)
    try:
        backend = OracleBackend(tol=TOL, client=client)
        with get_task_stream(client) as stream:
            res = fit_bcd(
                net,
                X0,
                Y,
                backend=backend,
                iterations=args.iterations,
                check_every=1,
                progress=False,
                callback=lambda net, rec: (
                    stamps.append(time.perf_counter()) or walls.append(time.time())
                ),
            )
        held = client.run(_peak_rss)
    finally:
        client.close()
        cluster.close()
    seconds = list(np.diff(stamps))
    shares = share_seconds(stream.data, walls)
    rounds = []
    for rec, s, share in zip(res.history.records, seconds, shares):
        blocks = {
            b["block"]: dict(seconds=b["seconds"], residual=b["residual"], status=b["status"])
            for b in rec["blocks"]
        }
        rounds.append(
            dict(seconds=s, certificate=rec["certificate"], blocks=blocks, shares_s=share)
        )
    return dict(
        m=m,
        rounds=rounds,
        peak_gib=dict(driver=_peak_rss() / 2**30, workers=[v / 2**30 for v in held.values()]),
    )


def share_seconds(tasks, walls):
    """Each round's W_0 rows on the workers: the seconds each worker computed its share of them,
    in the workers' order (Dask's task stream: the ``solve_share`` tasks whose computing started
    between the round's wall-clock stamps ``walls[i]`` and ``walls[i + 1]``, the workers' clock
    being this machine's); none where the rows ran in this process (the dual route:
    ``rows.route``)."""
    rounds = [collections.defaultdict(float) for _ in walls[1:]]
    for task in tasks:
        if "solve_share" not in str(task["key"]):
            continue
        for ss in task["startstops"]:
            i = bisect.bisect_right(walls, ss["start"]) - 1
            if ss["action"] == "compute" and 0 <= i < len(rounds):
                rounds[i][task["worker"]] += ss["stop"] - ss["start"]
    return [[busy[w] for w in sorted(busy)] for busy in rounds]


def slope(sizes, key):
    """The least-squares slope of log(seconds) against log(m)."""
    x = np.log([s["m"] for s in sizes])
    y = np.log([key(s) for s in sizes])
    return float(np.polyfit(x, y, 1)[0]) if len(sizes) > 1 else math.nan


def main(argv=None):
    args = parse_args(argv)
    keep_freed_memory()  # the temporaries reuse the heap (fenchel_cvx/heap.py)
    ds, desc = data.load(argparse.Namespace(data_dir=args.data_dir, dtype="float64"))
    print(
        f"{desc}; 784-300-10 ReLU, {args.loss}, lam {args.lam:g}, rho {RHO}, tol {TOL:g}; "
        f"{args.workers} Dask worker(s) of one thread, {args.driver_threads} in this process"
    )
    sizes = []
    with threadpool_limits(args.driver_threads):
        for m in args.m:
            s = one_size(args, ds, m)
            sizes.append(s)
            times = ", ".join(f"{r['seconds']:.1f}" for r in s["rounds"])
            held = ", ".join(f"{v:.2f}" for v in s["peak_gib"]["workers"])
            total = s["peak_gib"]["driver"] + sum(s["peak_gib"]["workers"])
            print(
                f"m = {m:,}: iterations {times} s (the first cold); peak memory driver "
                f"{s['peak_gib']['driver']:.2f} GiB, workers {held} GiB, {total:.2f} GiB in all"
            )
            for i, r in enumerate(s["rounds"], 1):
                blocks = "; ".join(
                    f"{k} {b['seconds']:.1f} s (KKT {b['residual']:.1e})"
                    for k, b in r["blocks"].items()
                )
                held = "held" if r["certificate"]["held"] else "VIOLATED"
                shares = ", ".join(f"{v:.1f} s" for v in r["shares_s"]) or "none (in this process)"
                print(f"  iteration {i}: {blocks}; certificate {held}; W_0's rows on the workers:")
                print(f"    {shares}")
    if len(sizes) > 1:
        cold = slope(sizes, lambda s: s["rounds"][0]["seconds"])
        warm = slope(sizes, lambda s: s["rounds"][-1]["seconds"])
        print(f"log-log slope of the iteration's time against m: cold {cold:.2f}, warm {warm:.2f}")
    record = machine(args)
    print(machine_text(record))
    if args.json is not None:
        write_json(
            args.json,
            dict(
                settings=vars(args) | dict(json=str(args.json)),
                machine=record,
                data=desc,
                sizes=sizes,
            ),
        )


if __name__ == "__main__":
    main()
