"""Each rank's batch on P ranks, step by step: where a rank works and where it waits.

For the MNIST MLP's or LeNet-5's FLN as ``parallel_model.py`` trains it (the benchmarks' tuned
setting, one thread a rank, freed memory kept; one epoch of the first 4,000 training images, 8
batches of 500, the middle 6 timed, after ``WARM`` epochs on the same ranks), every rank times
each step of its rounds (``rounds.Round``): the driver's (``centre``, ``feed_forward``,
``begin``, ``end``), each block's (``x_block``, ``w_block``) and, on LeNet-5, the layer split's
meetings (``LayerSplit.gather`` and ``exchange``, inside the W-block that holds them). For each
step it prints, per rank, the median seconds a batch, the part of them inside collectives
(``torch_comm.CLOCK``: the transport and the waits for the other ranks) and how much later than
rank 0 the rank started it. A step where one rank's collectives hold its time while another's
hold none is where the ranks' work is uneven: on LeNet-5, the rank that solves W_3 and W_4
waits at the exchange for the one that solves W_2 (docs page "Training in parallel").

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/rank_timeline.py \\
        --data-dir DIR --network lenet5
    python benchmarks/rank_timeline.py --quick --network mlp     # a smoke run
"""

import argparse
import functools
import json
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common.data import add_data_flags  # noqa: E402
from common.devices import cpu_model  # noqa: E402
from fenchel_cvx.fast.torch_comm import CLOCK  # noqa: E402
from fenchel_cvx.layer_split import LayerSplit  # noqa: E402
from fenchel_cvx.rounds import Round  # noqa: E402
from parallel_model import WARM, data  # noqa: E402
from refactor_ab import NETWORKS, TIMED, recipe  # noqa: E402

#: the steps of a round that each rank times: (class, method, label of its arguments)
STEPS = (
    (Round, "centre", lambda a: "centre"),
    (Round, "feed_forward", lambda a: "feed_forward"),
    (Round, "begin", lambda a: "begin"),
    (Round, "x_block", lambda a: f"X_{a[0]}"),
    (Round, "w_block", lambda a: f"W_{a[0]}"),
    (Round, "end", lambda a: "end"),
    (LayerSplit, "gather", lambda a: "gather"),
    (LayerSplit, "exchange", lambda a: "exchange"),
)
#: the steps timed inside another (the layer split's meetings, inside their W-blocks)
INNER = ("gather", "exchange")
#: this rank's steps: (label, start, end, seconds in collectives, collectives), in the order
#: they ended
EVENTS: list = []


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--network", default="lenet5", choices=NETWORKS)
    p.add_argument("--ranks", type=int, default=2, help="P, the ranks")
    p.add_argument("--json", default=None, help="also write the figures to this JSON file")
    add_data_flags(p, validation=False, train_size=False)
    p.add_argument("--quick", action="store_true", help="the embedded 5k MNIST sample")
    args = p.parse_args(argv)
    if args.ranks < 2:
        p.error(f"--ranks must be >= 2, got {args.ranks}")
    if args.json is not None:  # (before any work)
        from fenchel_cvx.io import check_destination

        check_destination("--json", args.json)
    return args


def _timed(method, label):
    """``method`` that appends its step to ``EVENTS`` as it ends."""

    @functools.wraps(method)
    def step(self, *args, **kwargs):
        c0, g0, t0 = CLOCK.seconds, CLOCK.gathers, time.perf_counter()
        try:
            return method(self, *args, **kwargs)
        finally:
            waited, met = CLOCK.seconds - c0, CLOCK.gathers - g0
            EVENTS.append((label(args), t0, time.perf_counter(), waited, met))

    step.timed = True
    return step


def timed_epoch(net, X, Y, backend, fit, *, comm):
    """On each rank: ``fit_bcd`` with every step of ``STEPS`` timed; every rank's steps, on
    every rank (one gather of their JSON)."""
    from fenchel_cvx.bcd import fit_bcd

    for cls, name, label in STEPS:
        if not getattr(getattr(cls, name), "timed", False):
            setattr(cls, name, _timed(getattr(cls, name), label))
    EVENTS.clear()
    fit_bcd(net, X, Y, backend=backend, comm=comm.on_copies(), **fit)
    mine = np.frombuffer(json.dumps(EVENTS).encode(), np.uint8)
    return [json.loads(bytes(np.asarray(got))) for got in comm.all_gather(mine)]


def rounds(events):
    """A rank's steps, round by round (a round ends with its ``end``)."""
    out, current = [], []
    for e in events:
        current.append(e)
        if e[0] == "end":
            out.append(current)
            current = []
    return out


def table(every):
    """``{step: {"seconds": [per rank], "collectives_s": [...], "collectives": [...], "later_s":
    [...]}}``: medians over the timed rounds (a step that a round takes twice, both in one);
    ``"batch"``: from the end of the round before to the end of this one, its collectives those
    of its outer steps."""
    by_rank = [rounds(e) for e in every]
    steps: dict = defaultdict(lambda: defaultdict(lambda: [[] for _ in every]))
    for n in range(min(len(r) for r in by_rank))[TIMED]:
        start = {e[0]: e[1] for e in by_rank[0][n]}
        for r, rank in enumerate(by_rank):
            batch = rank[n][-1][2] - rank[n - 1][-1][2]
            steps["batch"]["seconds"][r].append(batch)
            top = [e for e in rank[n] if e[0] not in INNER]  # (inner steps: counted once)
            steps["batch"]["collectives_s"][r].append(sum(e[3] for e in top))
            steps["batch"]["collectives"][r].append(sum(e[4] for e in top))
            steps["batch"]["later_s"][r].append(rank[n - 1][-1][2] - by_rank[0][n - 1][-1][2])
            for label, t0, t1, waited, met in rank[n]:
                steps[label]["seconds"][r].append(t1 - t0)
                steps[label]["collectives_s"][r].append(waited)
                steps[label]["collectives"][r].append(met)
                steps[label]["later_s"][r].append(t0 - start.get(label, t0))
    return {
        label: {k: [statistics.median(v) if v else 0.0 for v in per] for k, per in f.items()}
        for label, f in steps.items()
    }


def main(argv=None):
    args = parse_args(argv)
    import fenchel_cvx as pkg
    import fenchel_cvx.defaults  # noqa: F401 - recipe reads pkg.defaults and pkg.fast
    import fenchel_cvx.fast  # noqa: F401
    from fenchel_cvx.heap import keep_freed_memory
    from fenchel_cvx.parallel import Ranks

    keep_freed_memory()  # as the command line, and the ranks spawned from here (``heap.py``)
    X, Y = data(args)
    with Ranks(args.ranks, threads=1) as ranks:
        for _ in range(WARM + 1):  # (the last epoch timed)
            net, backend, fit = recipe(pkg, args.network)
            every = ranks.run(timed_epoch, net, X, Y, backend, fit)
    figures = table(every)
    P = args.ranks
    print(f"{args.network} on {P} ranks of {cpu_model()}, one thread each; per step of a batch "
          "(medians of the timed batches), each rank's ms, of them in collectives, and how much "
          "later than rank 0 it started:")  # fmt: skip
    print(f"  {'step':12}" + "".join(f" {f'rank {r}: ms (in coll.) later':>32}" for r in range(P)))
    for label, f in figures.items():
        print(f"  {label:12}" + "".join(
            f" {f['seconds'][r] * 1e3:14.2f} ({f['collectives_s'][r] * 1e3:6.2f}) "
            f"{f['later_s'][r] * 1e3:8.2f}" for r in range(P)
        ))  # fmt: skip
    report = dict(machine=cpu_model(), network=args.network, ranks=P, steps=figures)
    if args.json:
        from fenchel_cvx.io import write_json

        write_json(args.json, report)
    return report


if __name__ == "__main__":
    main()
