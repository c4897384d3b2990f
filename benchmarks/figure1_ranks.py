"""Figure 1's FLN round on one rank and on P ranks, interleaved in one run: the speed-up.

The paper's Figure 1 trains the 784-300-10 ReLU network with MSE on all 60,000 training images
in every round; ``benchmarks/mnist_lifted.py``'s FLN does so as Algorithm 2 with one batch of
all the data (gamma 0, K = 1, X re-fed forward every round: ``baselines.lifted.fln``, its tuned
setting ``SETTINGS["fln"]``). On P ranks (``parallel.Ranks``, one thread each) every rank holds
its share of the columns: the X-blocks split, and the W-blocks' sums (W_0's gradient, 942 KB in
float32, and its Gram once a run) are reduced over the ranks.

Each repeat trains ``--rounds`` rounds from the same start on one rank, then on P ranks (a
warm-up run of each first: the kernels compile, the ranks start). A run's first round also
factorises W_0's Gram matrix, and every ``check_every``-th round and the last are checked (the
certificate's figures). Both sides keep their freed memory (``fenchel_cvx.heap``, as the
command line's runs do: the ranks take the setting from this process). The report gives the
median of the other rounds, of the checked ones, and the first, for each side, with the
speed-up and the largest difference of the two sides' final weights (the same iterates to
round-off).

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/figure1_ranks.py \\
        --data-dir DIR
    python benchmarks/figure1_ranks.py --quick --rounds 3 --repeats 1      # a smoke run

``--no-compile`` trains both sides on NumPy alone (no kernel compiled; the default is the fast
backend's ``compile="auto"``).
"""

import argparse
import copy
import json
import statistics

import common  # noqa: F401  (puts the repository on the path)
from common import data
from common.devices import machine
from common.flags import add_compile_flag, check_compile
from fenchel_cvx import LiftedNetwork
from fenchel_cvx.baselines.lifted import METHODS
from fenchel_cvx.bcd import fit_bcd
from fenchel_cvx.fast import FastBackend
from fenchel_cvx.heap import keep_freed_memory
from fenchel_cvx.io import write_text
from fenchel_cvx.parallel import Ranks
from fenchel_cvx.threads import limit_threads
from mnist_lifted import SETTINGS, load


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    data.add_data_flags(p)
    p.add_argument("--ranks", type=int, default=2, help="P, the ranks beside one (default 2)")
    p.add_argument("--rounds", type=int, default=6, help="rounds a run (default 6)")
    p.add_argument("--repeats", type=int, default=3, help="runs of each side (default 3)")
    p.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    p.add_argument("--quick", action="store_true", help="the embedded 5k MNIST sample")
    p.add_argument("--json", default=None, help="also write the figures to this JSON file")
    add_compile_flag(p)
    args = p.parse_args(argv)
    check_compile(p, args)
    for name, least in (("ranks", 2), ("rounds", 2), ("repeats", 1)):
        if getattr(args, name) < least:
            p.error(f"--{name} must be >= {least}, got {getattr(args, name)}")
    data.check_data_flags(p, args)
    args.threads = 1
    return args


def run(fit, net, X, Y, rounds, compile="auto"):
    """One run of Figure 1's FLN (``fit``: ``fit_bcd`` or ``Ranks.fit``) on a copy of ``net``,
    its backend's ``compile`` as given: its rounds' seconds and whether each was checked, and its
    final weights."""
    net = copy.deepcopy(net)
    settings = METHODS["fln"](**SETTINGS["fln"]).fit_settings(net, X.shape[1], rounds)
    settings["backend"] = FastBackend(**{**settings["backend"].options(), "compile": compile})
    seconds, checked = [], []

    def callback(net_, rec):
        seconds.append(rec["seconds"])
        checked.append(bool(rec["certificate"]["checked"]))

    fit(net, X, Y, callback=callback, **settings)
    return seconds, checked, net.W


def figures(runs):
    """The medians of the runs' rounds: the first, the checked and the others (seconds)."""
    first = [s[0] for s, _ in runs]
    checked = [t for s, c in runs for t, k in zip(s[1:], c[1:]) if k]
    other = [t for s, c in runs for t, k in zip(s[1:], c[1:]) if not k]
    median = lambda v: statistics.median(v) if v else None  # noqa: E731
    return dict(first=median(first), checked=median(checked), round=median(other))


def main(argv=None):
    args = parse_args(argv)
    keep_freed_memory()  # both sides' temporaries reuse the heap; the ranks take it from here
    (X, Y, _, _), desc = load(args)
    net = LiftedNetwork((X.shape[0], 300, Y.shape[0]), "relu", "mse", seed=0, dtype=args.dtype)
    one, many, gap = [], [], 0.0
    with limit_threads(1), Ranks(args.ranks, threads=1) as ranks:
        run(fit_bcd, net, X, Y, 2, args.compile)  # the warm-ups: kernels compiled on every rank
        run(ranks.fit, net, X, Y, 2, args.compile)
        for _ in range(args.repeats):
            s1, c1, W1 = run(fit_bcd, net, X, Y, args.rounds, args.compile)
            sP, cP, WP = run(ranks.fit, net, X, Y, args.rounds, args.compile)
            one.append((s1, c1))
            many.append((sP, cP))
            gap = max([gap] + [float(abs(a - b).max() / abs(a).max()) for a, b in zip(W1, WP)])
    f1, fP = figures(one), figures(many)
    speed = {k: f1[k] / fP[k] for k in f1 if f1[k] and fP[k]}
    out = dict(data=desc, ranks=args.ranks, rounds=args.rounds, repeats=args.repeats,
               compile=args.compile,
               one_rank=f1, p_ranks=fP, speed_up=speed, weight_gap=gap, machine=machine(args),
               raw=dict(one=one, p_ranks=many))  # fmt: skip
    print(f"Figure 1's FLN, {desc}, {args.dtype}: {args.repeats} x {args.rounds} rounds a side")
    print(f"| round (median s) | 1 rank | {args.ranks} ranks | speed-up |")
    print("|---|---|---|---|")
    for k, name in (("round", "unchecked"), ("checked", "checked"), ("first", "first")):
        if f1[k] and fP[k]:
            print(f"| {name} | {f1[k]:.3f} | {fP[k]:.3f} | {speed[k]:.2f}x |")
    print(f"final weights: largest difference {gap:.1e} of each array's largest entry")
    if args.json:
        write_text(args.json, json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
