"""The ``fenchel-cvx`` command: train, resume, evaluate and predict with Fenchel lifted networks.

    fenchel-cvx train                         # digits, 64-32-10 ReLU, MSE, the oracle (see README)
    fenchel-cvx train --loss cross_entropy --iterations 3
    fenchel-cvx train --dataset mnist --data-dir ~/data --arch 784-300-10 --backend fast \\
        --batch-size 256 --epochs 2 --gamma 3 --w-steps 1 --x-steps 10 --check-every 20
    fenchel-cvx resume runs/20260101-120000   # continue an interrupted run (Ctrl-C saves it)
    fenchel-cvx evaluate runs/20260101-120000 # loss and accuracy of its model on its test split
    fenchel-cvx predict runs/20260101-120000 points.csv --out labels.csv

Data sets: ``digits`` and ``mnist5k`` are embedded; ``mnist``, ``fashion-mnist`` and ``cifar10``
are read from ``--data-dir`` (default: ``$FENCHEL_DATA/<name>``; see ``datasets.py``).
``train`` (``bcd.fit_bcd``) writes to ``--out`` (default ``runs/<timestamp>``): ``run.json``
(the arguments, for ``resume``), ``checkpoint.npz`` (every ``--checkpoint-every`` rounds and
on Ctrl-C), and at the end ``history.json`` (``History.load``), ``model.npz``
(``LiftedNetwork.load``), ``objectives.png`` (lifted vs network objective: the gap) and
``accuracy.png``. Per-layer values (``--lam``, ``--rho``, ``--gamma``) take one number or a
comma-separated list, one per layer. Losses and penalties are sums over the data points (as in
the paper), so lam and rho are on the scale of the training set (of a batch in Algorithm 2).
Every argument and the output folder are checked before any work; errors name the flag.
BLAS runs on ``--threads`` threads (default 1: on 2 cores NumPy's and SciPy's two OpenBLAS
pools oversubscribe the machine; see docs/installation.md).
"""
import argparse
import json
import math
import os
import sys
import time
from datetime import datetime
from pathlib import Path

from . import __version__

DATASETS = ("digits", "mnist5k", "mnist", "fashion-mnist", "cifar10")
ACTIVATIONS = ("relu", "leaky_relu", "sigmoid", "tanh")
# Defaults measured on digits (1,347 train / 450 test, the oracle, 2 cores); see the README.
DEFAULTS = dict(dataset="digits", activation="relu", loss="mse", lam="10", rho="1", gamma="0",
                epochs=1, iterations=10, alternations=1, backend="cvxpy", seed=0)
#: (features, classes) of each data set, so that --arch is checked before any data is read
SHAPES = {"digits": (64, 10), "mnist5k": (784, 10), "mnist": (784, 10),
          "fashion-mnist": (784, 10), "cifar10": (3072, 10)}
#: the image shape (C, H, W) of the data sets --arch lenet5 takes
IMAGES = {"mnist5k": (1, 28, 28), "mnist": (1, 28, 28), "fashion-mnist": (1, 28, 28),
          "cifar10": (3, 32, 32)}
LENET5_HIDDEN = 4   # conv, conv, fc 120, fc 84
FAST_ONLY = ("max_iter", "w_steps", "x_steps", "newton_cap", "gram_reuse")
LARGE = 3000   # the oracle on more training points prints an estimate and suggests --backend fast


# --- argument types: each names its flag through argparse ("argument --lam: ...") -------------
def _integer(minimum):
    def parse(text):
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be an integer >= {minimum}, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be an integer >= {minimum}, got {text!r}")
        return value
    parse.__name__ = "integer"
    return parse


def _positive_float(text):
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number > 0, got {text!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a number > 0, got {text!r}")
    return value


def _per_layer(positive):
    def parse(text):
        try:
            values = [float(v) for v in text.split(",")]
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"must be a number or a comma-separated list of numbers, got {text!r}") from None
        if not all(math.isfinite(v) and (v > 0 if positive else v >= 0) for v in values):
            raise argparse.ArgumentTypeError(
                f"must be {'> 0' if positive else '>= 0'} and finite, got {text!r}")
        return values[0] if len(values) == 1 else values
    parse.__name__ = "per-layer list"
    return parse


def _arch(text):
    if text == "lenet5":
        return text
    try:
        sizes = [int(p) for p in text.split("-")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"must look like 64-32-10 (or lenet5), got {text!r}") from None
    if len(sizes) < 2 or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"needs >= 2 positive sizes like 64-32-10, got {text!r}")
    return sizes


def build_parser():
    parser = argparse.ArgumentParser(prog="fenchel-cvx", description=__doc__.split("\n\n")[0])
    parser.add_argument("--version", action="version", version=f"fenchel-cvx {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    fmt = argparse.ArgumentDefaultsHelpFormatter
    t = sub.add_parser("train", help="train a lifted network by BCD; write its history, model and plots",
                       formatter_class=fmt)
    d = t.add_argument_group("data")
    d.add_argument("--dataset", choices=DATASETS, default=DEFAULTS["dataset"])
    d.add_argument("--data-dir", type=Path, default=None,
                   help="folder of the data set's files (default $FENCHEL_DATA/<dataset>)")
    d.add_argument("--train-size", type=_integer(1), default=None,
                   help="use only the first N training points (quick runs)")
    d.add_argument("--dtype", choices=("float32", "float64"), default="float64",
                   help="float type of the data and the weights")
    n = t.add_argument_group("network")
    n.add_argument("--arch", type=_arch, default=None,
                   help="layer sizes like 64-32-10, or lenet5 on image data (default: <features>-32-<classes>)")
    n.add_argument("--activation", default=DEFAULTS["activation"], choices=ACTIVATIONS)
    n.add_argument("--loss", default=DEFAULTS["loss"], choices=["mse", "cross_entropy"])
    n.add_argument("--lam", type=_per_layer(True), default=DEFAULTS["lam"],
                   help="lambda_l > 0 of the divergences: one, or one per hidden layer")
    n.add_argument("--rho", type=_per_layer(False), default=DEFAULTS["rho"],
                   help="rho_l >= 0, Frobenius penalty of W_l: one, or one per layer")
    n.add_argument("--seed", type=_integer(0), default=DEFAULTS["seed"],
                   help="seed of the split, the initialisation and the batches")
    a = t.add_argument_group("algorithm (fit_bcd)")
    a.add_argument("--batch-size", type=_integer(1), default=None,
                   help="mini-batch size (Algorithm 2); omit for full-batch Algorithm 1")
    a.add_argument("--epochs", type=_integer(1), default=DEFAULTS["epochs"], help="Algorithm 2 epochs")
    a.add_argument("--iterations", type=_integer(1), default=DEFAULTS["iterations"],
                   help="Algorithm 1 iterations")
    a.add_argument("--alternations", type=_integer(1), default=DEFAULTS["alternations"],
                   help="Algorithm 2 rounds per batch (K)")
    a.add_argument("--gamma", type=_per_layer(False), default=DEFAULTS["gamma"],
                   help="gamma_l >= 0 of the proximal term ||W_l - W0_l||^2: one, or one per layer")
    a.add_argument("--backend", choices=["cvxpy", "fast"], default=DEFAULTS["backend"])
    a.add_argument("--tol", type=_positive_float, default=1e-6, help="certificate / block tolerance")
    a.add_argument("--strict", action=argparse.BooleanOptionalAction, default=None,
                   help="stop at the first certificate violation (default: only for cvxpy)")
    a.add_argument("--check-every", type=_integer(1), default=1,
                   help="run the whole certificate every N rounds (and on the last)")
    a.add_argument("--eval-every", type=_integer(1), default=1,
                   help="evaluate train/test accuracy every N rounds (and at epoch ends)")
    a.add_argument("--checkpoint-every", type=_integer(1), default=10,
                   help="write checkpoint.npz every N rounds (and on Ctrl-C)")
    f = t.add_argument_group("fast backend (FastBackend; --backend fast only)")
    f.add_argument("--max-iter", type=_integer(1), default=None, help="iteration cap of every loop (500)")
    f.add_argument("--w-steps", type=_integer(1), default=None,
                   help="warm-started steps per W-block (default: to --tol)")
    f.add_argument("--x-steps", type=_integer(1), default=None,
                   help="FISTA steps per X-block (default: to --tol)")
    f.add_argument("--newton-cap", type=_integer(0), default=None,
                   help="active-set size up to which W rows take Newton steps (default: balanced)")
    f.add_argument("--gram-reuse", type=_integer(1), default=None,
                   help="W solves one Gram factorisation serves (1)")
    o = t.add_argument_group("run")
    o.add_argument("--out", type=Path, default=None, help="output folder (default runs/<timestamp>)")
    o.add_argument("--threads", type=_integer(1), default=1, help="BLAS threads (threadpoolctl)")
    o.add_argument("--no-baseline", action="store_true",
                   help="skip the logistic-regression accuracy in the summary")
    o.add_argument("--quiet", action="store_true", help="no progress bar")

    r = sub.add_parser("resume", help="continue an interrupted train run from its folder",
                       formatter_class=fmt)
    r.add_argument("run", type=Path, help="the run's folder (holding run.json and checkpoint.npz)")
    r.add_argument("--threads", type=_integer(1), default=None, help="BLAS threads (default: the run's)")
    r.add_argument("--quiet", action="store_true", help="no progress bar")

    e = sub.add_parser("evaluate", help="loss and accuracy of a saved model on a data set",
                       formatter_class=fmt)
    e.add_argument("model", type=Path, help="a model.npz, or a run folder holding one")
    e.add_argument("--dataset", choices=DATASETS, default=None, help="(default: the run's)")
    e.add_argument("--data-dir", type=Path, default=None, help="(default: the run's, or $FENCHEL_DATA)")
    e.add_argument("--seed", type=_integer(0), default=None, help="seed of the split (default: the run's, or 0)")
    e.add_argument("--split", choices=("test", "train"), default="test")
    e.add_argument("--threads", type=_integer(1), default=1, help="BLAS threads")

    p = sub.add_parser("predict", help="predict from a saved model; rows of INPUT are data points",
                       formatter_class=fmt)
    p.add_argument("model", type=Path, help="a model.npz, or a run folder holding one")
    p.add_argument("input", type=Path, help=".npy or .csv file, one data point per row")
    p.add_argument("--out", type=Path, default=None, help="CSV to write (default: standard output)")
    p.add_argument("--output", choices=("label", "proba", "raw"), default="label",
                   help="class labels, class probabilities (cross-entropy: softmax), or the network output")
    p.add_argument("--threads", type=_integer(1), default=1, help="BLAS threads")
    return parser


# --- checks before any work ---------------------------------------------------------------------
def _fail(flag, message):
    raise ValueError(f"argument {flag}: {message}")


def _check_out(flag, path, must_not_exist=False):
    """Create the output folder now and prove it writable, so no run is lost at its end."""
    from .io import check_writable_dir

    if must_not_exist and path.exists() and any(path.iterdir()):
        _fail(flag, f"{str(path)!r} already holds files (a run there is resumed with "
                    f"'fenchel-cvx resume {path}'); choose another folder")
    try:
        return check_writable_dir(flag, path)
    except ValueError as err:
        _fail(flag, str(err).split(" must be ", 1)[-1].replace("a writable folder, got", "not writable:"))


def _check_data_dir(args):
    if args.dataset in ("digits", "mnist5k"):
        if args.data_dir is not None:
            _fail("--data-dir", f"{args.dataset} is embedded and reads no folder")
        return
    root = args.data_dir or (Path(os.environ["FENCHEL_DATA"]) / args.dataset
                             if os.environ.get("FENCHEL_DATA") else None)
    if root is None:
        _fail("--data-dir", f"{args.dataset} needs its files: pass --data-dir or set FENCHEL_DATA")
    if not Path(root).is_dir():
        _fail("--data-dir", f"{str(root)!r} is not a folder (for {args.dataset})")


def _check_train(args):
    if args.arch == "lenet5" and args.dataset not in IMAGES:
        _fail("--arch", f"lenet5 takes 28 x 28 or 32 x 32 images ({', '.join(IMAGES)}), "
                        f"not {args.dataset}")
    n_hidden = (1 if args.arch is None else LENET5_HIDDEN if args.arch == "lenet5"
                else len(args.arch) - 2)
    for flag, value, n in (("--lam", args.lam, n_hidden), ("--rho", args.rho, n_hidden + 1),
                           ("--gamma", args.gamma, n_hidden + 1)):
        if isinstance(value, list) and len(value) != n:
            _fail(flag, f"needs one value or {n} (one per {'hidden ' if flag == '--lam' else ''}"
                        f"layer), got {len(value)}")
    if args.backend != "fast":
        given = [k for k in FAST_ONLY if getattr(args, k) is not None]
        if given:
            _fail("--" + given[0].replace("_", "-"), "needs --backend fast")
    p_in, k = SHAPES[args.dataset]
    if args.arch not in (None, "lenet5") and (args.arch[0] != p_in or args.arch[-1] != k):
        _fail("--arch", f"{'-'.join(map(str, args.arch))} does not fit {args.dataset}: the input "
                        f"size must be {p_in} and the output size {k}")
    _check_data_dir(args)


# --- the commands -------------------------------------------------------------------------------
def _threads(n):
    from threadpoolctl import threadpool_limits

    return threadpool_limits(limits=n)


def _load(args):
    from . import datasets

    kw = dict(seed=args.seed) if args.dataset in ("digits", "mnist5k") else dict(data_dir=args.data_dir)
    if args.dataset in ("mnist", "fashion-mnist", "cifar10"):
        kw["dtype"] = getattr(args, "dtype", "float64")
    return datasets.load_dataset(args.dataset, **kw)


def _oracle_estimate(total, m):
    """A callback printing, after the oracle's first round, how long the run will take."""
    def estimate(net, rec):
        if rec["iteration"] == 1:
            mins = rec["seconds"] * total / 60
            print(f"\nfenchel-cvx: the oracle took {rec['seconds']:.1f} s for round 1 on {m} points: "
                  f"about {mins:.0f} min for the {total} rounds. --backend fast solves the same "
                  f"blocks in a small fraction of that.", file=sys.stderr, flush=True)
    return estimate


def train(args, resume=False):
    import numpy as np

    from . import datasets
    from .bcd import fit_bcd
    from .network import LiftedNetwork, lenet5
    from .plotting import plot_accuracy, plot_objectives

    t0 = time.perf_counter()
    _check_train(args)
    out = args.out
    if not resume:
        out = _check_out("--out", args.out or _default_out(), must_not_exist=True)
        saved = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
        from .io import write_json

        write_json(out / "run.json", dict(saved, out=str(out)))
    data = _load(args)
    X, y = data.X_train, data.y_train
    if args.train_size is not None:
        X, y = X[:, :args.train_size], y[:args.train_size]
    arch = args.arch or [data.n_features, 32, data.n_classes]
    dtype = np.dtype(args.dtype)
    X, X_test = X.astype(dtype, copy=False), data.X_test.astype(dtype, copy=False)
    Y, Y_test = datasets.one_hot(y, data.n_classes), datasets.one_hot(data.y_test, data.n_classes)
    kw = dict(activation=args.activation, loss=args.loss, lam=args.lam, rho=args.rho,
              seed=args.seed, dtype=dtype)
    net = (lenet5(IMAGES[args.dataset], data.n_classes, **kw) if arch == "lenet5"
           else LiftedNetwork(arch, **kw))
    arch = "-".join(map(str, net.layer_sizes)) + (" (LeNet-5)" if arch == "lenet5" else "")
    backend = args.backend
    if backend == "fast":
        from .fast import FastBackend

        backend = FastBackend(tol=args.tol, **{k: getattr(args, k) for k in FAST_ONLY
                                                if getattr(args, k) is not None})
    total = args.iterations if args.batch_size is None else args.epochs * args.alternations * (
        -(-X.shape[1] // args.batch_size))
    callback = None
    if args.backend == "cvxpy" and X.shape[1] > LARGE:
        callback = _oracle_estimate(total, X.shape[1])
    algo = (f"Algorithm 1, {args.iterations} iterations" if args.batch_size is None else
            f"Algorithm 2, batch {args.batch_size}, {args.epochs} epochs x {args.alternations} "
            f"alternations, gamma={args.gamma}")
    print(f"fenchel-cvx {'resume' if resume else 'train'}: {args.dataset} ({X.shape[1]} train / "
          f"{X_test.shape[1]} test), {arch} {args.activation}, {args.loss}, "
          f"lam={args.lam}, rho={args.rho}; {algo}; backend {args.backend}; {args.threads} "
          f"thread(s); output {out}", flush=True)
    try:  # fit_bcd checkpoints on Ctrl-C; before it starts there is nothing to save
        res = fit_bcd(net, X, Y, batch_size=args.batch_size, epochs=args.epochs,
                      iterations=args.iterations, alternations=args.alternations, gamma=args.gamma,
                      backend=backend, strict=args.strict, tol=args.tol, X_test=X_test,
                      Y_test=Y_test, progress=not args.quiet, eval_every=args.eval_every,
                      check_every=args.check_every, callback=callback, checkpoint=out,
                      checkpoint_every=args.checkpoint_every, resume=out if resume else None)
    except KeyboardInterrupt:
        from .io import load_checkpoint

        if not (out / "checkpoint.npz").is_file():
            print("\nfenchel-cvx: interrupted before the first round; nothing to resume",
                  file=sys.stderr)
            return 130
        done = load_checkpoint(out)[1]["iteration"]
        print(f"\nfenchel-cvx: interrupted after round {done} of {total}; the state is saved in "
              f"{out / 'checkpoint.npz'}.\nContinue with:  fenchel-cvx resume {out}",
              file=sys.stderr)
        return 130
    h = res.history
    h.config.update(dataset=args.dataset, train_size=int(X.shape[1]))
    files = [h.save(out / "history.json"), net.save(out / "model.npz"), out / "objectives.png",
             out / "accuracy.png"]
    plot_objectives(h, files[2])
    plot_accuracy(h, files[3])
    last = h.last
    line = (f"final train accuracy {last['train_accuracy']:.4f}, test accuracy "
            f"{last['test_accuracy']:.4f}")
    if not args.no_baseline:
        from sklearn.linear_model import LogisticRegression

        lr = LogisticRegression(max_iter=5000).fit(X.T, y)
        line += f" (logistic regression on the same split: {lr.score(X_test.T, data.y_test):.4f})"
    print(line)
    if last["checked"]:
        print(f"lifted objective {last['lifted_x']:.6g} <= network objective "
              f"{last['network_x']:.6g} at the last X-sweep; ", end="")
    print(f"certificate held at every iteration: "
          f"{'yes' if h.certificate_held else 'no (' + str(len(h.violations)) + ' violations)'}")
    print(f"wrote {', '.join(str(f) for f in files)} in {time.perf_counter() - t0:.1f} s")
    return 0


def _default_out():
    base = Path("runs") / datetime.now().strftime("%Y%m%d-%H%M%S")
    path, k = base, 1
    while path.exists():
        path, k = Path(f"{base}-{k}"), k + 1
    return path


def _run_args(folder):
    """The arguments a ``train`` run saved in ``folder/run.json``."""
    try:
        saved = json.loads((folder / "run.json").read_text())
    except (OSError, ValueError):
        return None
    for k in ("out", "data_dir"):
        saved[k] = None if saved.get(k) is None else Path(saved[k])
    return saved


def resume(args):
    saved = _run_args(args.run)
    if saved is None:
        _fail("run", f"{str(args.run)!r} holds no run.json of a 'fenchel-cvx train' run")
    if not (args.run / "checkpoint.npz").is_file():
        _fail("run", f"{str(args.run)!r} holds no checkpoint.npz (nothing to resume)")
    _check_out("run", args.run)
    targs = build_parser().parse_args(["train"])
    vars(targs).update(saved, out=args.run, quiet=args.quiet,
                       threads=args.threads or saved.get("threads", 1))
    with _threads(targs.threads):
        return train(targs, resume=True)


def _model(flag, path):
    from .network import LiftedNetwork

    folder = path if path.is_dir() else None
    file = path / "model.npz" if folder else path
    if not file.is_file():
        _fail(flag, f"{str(path)!r} is neither a model.npz nor a run folder holding one")
    return LiftedNetwork.load(file), (_run_args(folder) if folder else None) or {}


def evaluate(args):
    from .bcd import evaluate as evaluate_net
    from .datasets import one_hot

    net, run = _model("model", args.model)
    args.dataset = args.dataset or run.get("dataset")
    if args.dataset is None:
        _fail("--dataset", "needed: the model is not in a run folder that names its data set")
    args.data_dir = args.data_dir or run.get("data_dir") if args.dataset == run.get("dataset") else args.data_dir
    args.seed = run.get("seed", 0) if args.seed is None else args.seed
    p_in, k = SHAPES[args.dataset]
    if (p_in, k) != (net.layer_sizes[0], net.layer_sizes[-1]):
        _fail("--dataset", f"{args.dataset} has {p_in} features and {k} classes; the model "
                           f"takes {net.layer_sizes[0]} and gives {net.layer_sizes[-1]}")
    _check_data_dir(args)
    data = _load(args)
    X, y = (data.X_test, data.y_test) if args.split == "test" else (data.X_train, data.y_train)
    loss, acc = evaluate_net(net, X.astype(net.W[0].dtype, copy=False), one_hot(y, data.n_classes), True)
    print(f"{args.dataset} {args.split} ({X.shape[1]} points, seed {args.seed}): loss per point "
          f"{loss:.6g}, accuracy {acc:.4f}")
    return 0


def _read_points(path, features):
    import numpy as np

    if not path.is_file():
        _fail("input", f"{str(path)!r} is not a file")
    try:
        A = (np.load(path, allow_pickle=False) if path.suffix == ".npy"
             else np.loadtxt(path, delimiter=",", ndmin=2))
    except (OSError, ValueError) as err:
        _fail("input", f"{str(path)!r} is not a .npy or a numeric .csv file ({err})")
    A = np.atleast_2d(A)
    if A.ndim != 2 or A.shape[1] != features or not np.issubdtype(A.dtype, np.number):
        _fail("input", f"needs rows of {features} numbers (one data point per row), got shape {A.shape}")
    if not np.all(np.isfinite(A)):
        _fail("input", "holds NaN or inf")
    return A


def predict(args):
    import numpy as np

    net, _ = _model("model", args.model)
    A = _read_points(args.input, net.layer_sizes[0])
    if args.out is not None:
        _check_out("--out", args.out.parent if str(args.out.parent) else Path("."))
    Yhat = net.predict(A.T.astype(net.W[0].dtype))
    if args.output == "label":
        table, fmt = Yhat.argmax(axis=0)[:, None], "%d"
    elif args.output == "proba":
        if net.loss.name != "cross_entropy":
            _fail("--output", "proba needs a cross-entropy model (this one is "
                              f"{net.loss.name}); use --output raw")
        Z = np.exp(Yhat - Yhat.max(axis=0))
        table, fmt = (Z / Z.sum(axis=0)).T, "%.8g"
    else:
        table, fmt = Yhat.T, "%.8g"
    if args.out is None:
        np.savetxt(sys.stdout, table, fmt=fmt, delimiter=",")
    else:
        from .io import write_text

        import io as _io

        buf = _io.StringIO()
        np.savetxt(buf, table, fmt=fmt, delimiter=",")
        write_text(args.out, buf.getvalue())
        print(f"wrote {len(table)} predictions to {args.out}")
    return 0


COMMANDS = {"train": train, "resume": resume, "evaluate": evaluate, "predict": predict}


def main(argv=None):
    """Entry point of ``fenchel-cvx``; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    sub = parser._subparsers._group_actions[0].choices[args.command]
    try:
        if args.command == "resume":
            return resume(args)
        with _threads(args.threads):
            return COMMANDS[args.command](args)
    except KeyboardInterrupt:
        print(f"\nfenchel-cvx {args.command}: interrupted", file=sys.stderr)
        return 130
    except ValueError as err:
        sub.error(str(err))
    except OSError as err:   # a disk filling up or a folder removed during the run
        print(f"fenchel-cvx {args.command}: {err}", file=sys.stderr)
        return 1
    except Exception as err:
        from .errors import FenchelError

        if not isinstance(err, FenchelError):
            raise
        print(f"fenchel-cvx: {type(err).__name__}: {err}", file=sys.stderr)
        return 1
