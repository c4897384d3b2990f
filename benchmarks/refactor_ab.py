"""Batch time of this tree's FLN against an earlier commit's, in one process, interleaved.

A refactor of the driver or the solvers must not cost speed. This script exports the package of
``--old`` (a git commit, tag or branch of this repository) into a temporary folder under the
name ``fenchel_cvx_old`` and imports it beside this tree's ``fenchel_cvx``, so that both run in
the same process on the same data, in turn. For each network (the MNIST MLP's and LeNet-5's FLN
as ``benchmarks/mnist_mlp.py`` and ``mnist_lenet5.py`` train them: ``defaults.training``'s
tuned setting, the benchmarks' fast backend with ``compile="auto"``, float32, one thread) and
each of ``--repeats`` repeats, the old and the new code each train one epoch of the first
4,000 training images (8 batches of 500, Algorithm 2 with K = 1; MNIST from ``--data-dir``,
``--quick``: the embedded 5k sample), in alternating order. The
batches between the first (one-off costs) and the last (a checked round) are timed from one
callback to the next: 6 a run. Prints the median batch time of each, their ratio (new / old),
the median over the repeats of each repeat's ratio (the two epochs of a repeat run one after
the other: drift on a shared machine falls on both) and the largest difference of the final
weights (the same iterates: 0, or rounding).

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/refactor_ab.py --old 399d812
    python benchmarks/refactor_ab.py --old HEAD --repeats 1 --networks mlp --quick   # a smoke run
"""

import argparse
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common.data import add_data_flags, load  # noqa: E402
from common.devices import cpu_model  # noqa: E402

NETWORKS = ("mlp", "lenet5")
#: the training images of the timed epoch
M = 4000
#: the epoch's batches timed: all but the first and the last (Algorithm 2, 8 batches of 500)
TIMED = slice(1, -1)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--old", required=True, help="the git commit to compare with (e.g. HEAD~1)")
    p.add_argument("--networks", default="mlp,lenet5", help="of: " + ", ".join(NETWORKS))
    p.add_argument("--repeats", type=int, default=7, help="epochs a version and network")
    p.add_argument("--json", default=None, help="also write the figures to this JSON file")
    add_data_flags(p, validation=False, train_size=False)
    p.add_argument("--quick", action="store_true", help="the embedded 5k MNIST sample")
    args = check_networks_and_json(p, p.parse_args(argv))
    if args.repeats < 1:
        p.error(f"--repeats must be >= 1, got {args.repeats}")
    return args


def check_networks_and_json(p, args):
    """``args`` with ``network_list`` (``--networks`` split and checked) and ``--json``'s folder
    checked, before any work (``p.error`` naming the flag)."""
    if args.json is not None:
        from fenchel_cvx.io import check_destination

        check_destination("--json", args.json)
    args.network_list = args.networks.split(",")
    unknown = sorted(set(args.network_list) - set(NETWORKS))
    if unknown:
        p.error(f"--networks must name networks of {list(NETWORKS)}; got {unknown}")
    return args


def export_old(ref, folder):
    """The package at ``ref`` as ``fenchel_cvx_old`` in ``folder`` (every mention of the
    package's name in its Python files renamed, so that its absolute imports find itself)."""
    tar = subprocess.run(
        ["git", "-C", str(ROOT), "archive", ref, "fenchel_cvx"], capture_output=True, check=False
    )
    if tar.returncode != 0:
        raise SystemExit(f"--old {ref!r}: {tar.stderr.decode().strip()}")
    subprocess.run(["tar", "-x", "-C", str(folder)], input=tar.stdout, check=True)
    package = Path(folder) / "fenchel_cvx_old"
    (Path(folder) / "fenchel_cvx").rename(package)
    for path in package.rglob("*.py"):
        text = path.read_text(encoding="utf-8")
        path.write_text(re.sub(r"\bfenchel_cvx\b", "fenchel_cvx_old", text), encoding="utf-8")
    sys.path.insert(0, str(folder))


def recipe(pkg, network):
    """(network, backend, fit_bcd's settings) of ``network`` in the package ``pkg``."""
    defaults = pkg.defaults
    FastBackend = pkg.fast.FastBackend
    kind = "dense" if network == "mlp" else "lenet5"
    s = defaults.training(kind, 1 if network == "mlp" else 4, batched=True)
    if network == "mlp":
        net = pkg.LiftedNetwork(
            [784, 300, 10], "relu", "cross_entropy", lam=s.lam[0], rho=s.rho[0], seed=0,
            dtype="float32",
        )  # fmt: skip
        x_steps, reuse, more = s.x_steps[0], 1, dict(newton_cap=None)
    else:
        net = pkg.lenet5(
            (1, 28, 28), 10, activation="relu", loss="cross_entropy", lam=s.lam, rho=s.rho,
            seed=0, dtype="float32",
        )  # fmt: skip
        x_steps, reuse, more = s.x_steps, s.gram_reuse, {}
    backend = FastBackend(
        w_steps=s.w_steps, x_steps=x_steps, gram_reuse=reuse, capped_residual=False,
        capped_value=False, threads=1, compile="auto", **more,
    )  # fmt: skip
    fit = dict(gamma=s.gamma, momentum=s.momentum, batch_size=500, epochs=1, eval_every=None)
    return net, backend, dict(fit, check_every=10**6)


def one_epoch(pkg, network, X, Y):
    """One epoch of ``network``'s FLN in ``pkg``: (the timed batches' seconds, final W)."""
    net, backend, fit = recipe(pkg, network)
    stamps = [time.perf_counter()]
    pkg.bcd.fit_bcd(
        net, X, Y, backend=backend, callback=lambda n, r: stamps.append(time.perf_counter()), **fit
    )
    return list(np.diff(stamps)[TIMED]), [np.asarray(W, dtype=np.float64) for W in net.W]


def main(argv=None):
    args = parse_args(argv)
    import fenchel_cvx
    import fenchel_cvx.bcd
    import fenchel_cvx.datasets
    import fenchel_cvx.defaults
    import fenchel_cvx.fast
    from fenchel_cvx.io import write_json

    with tempfile.TemporaryDirectory() as folder:
        export_old(args.old, folder)
        import fenchel_cvx_old
        import fenchel_cvx_old.bcd
        import fenchel_cvx_old.defaults
        import fenchel_cvx_old.fast

        ds, _ = load(args, dtype="float32")
        X = np.ascontiguousarray(ds.X_train[:, :M], dtype=np.float32)
        Y = fenchel_cvx.datasets.one_hot(ds.y_train[:M], ds.n_classes).astype(np.float32)
        versions = {"old": fenchel_cvx_old, "new": fenchel_cvx}
        report = dict(old=args.old, machine=cpu_model())
        for network in args.network_list:
            times, final, paired = {"old": [], "new": []}, {}, []
            for v in versions:  # warm-up: each version's kernels compiled before the clock
                one_epoch(versions[v], network, X, Y)
            for r in range(args.repeats):
                epoch = {}
                for v in ("old", "new") if r % 2 == 0 else ("new", "old"):
                    epoch[v], final[v] = one_epoch(versions[v], network, X, Y)
                    times[v] += epoch[v]
                paired.append(statistics.median(epoch["new"]) / statistics.median(epoch["old"]))
            old, new = (statistics.median(times[v]) for v in ("old", "new"))
            diff = max(
                float(np.max(np.abs(a - b)) / max(float(np.max(np.abs(a))), 1e-300))
                for a, b in zip(final["old"], final["new"])
            )
            report[network] = dict(
                batches=len(times["new"]), old_median_s=old, new_median_s=new,
                ratio=new / old, paired_ratio=statistics.median(paired), weights_rel_diff=diff,
            )  # fmt: skip
            print(
                f"{network}: {len(times['new'])} batches each; median old {old * 1e3:.1f} ms, "
                f"new {new * 1e3:.1f} ms, new / old {new / old:.3f} (median of the "
                f"{len(paired)} epochs' paired ratios {statistics.median(paired):.3f}); final W "
                f"differ by {diff:.1e} of the largest entry",
                flush=True,
            )
    if args.json:
        write_json(args.json, report)  # a temporary name, then renamed
    return report


if __name__ == "__main__":
    main()
