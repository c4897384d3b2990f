"""The ``fenchel-cvx`` command: train, resume, evaluate and predict with Fenchel lifted networks.

    fenchel-cvx train                         # digits, 64-32-10 ReLU, MSE, the oracle (see README)
    fenchel-cvx train --loss cross_entropy --iterations 3
    fenchel-cvx train --dataset mnist --data-dir data/mnist --download --arch 784-300-10 \\
        --backend fast --batch-size 500 --epochs 2 --check-every 20   # the dense training setting
    fenchel-cvx resume runs/20260101-120000   # continue an interrupted run (Ctrl-C saves it)
    fenchel-cvx evaluate runs/20260101-120000 # loss and accuracy of its model on its test split
    fenchel-cvx predict runs/20260101-120000 points.csv --out labels.csv

Data sets: ``digits`` and ``mnist5k`` are embedded; ``mnist``, ``fashion-mnist`` and ``cifar10``
are read from ``--data-dir`` (default: ``$FENCHEL_DATA/<name>``; see ``datasets.py``), with
``--download`` the missing files of mnist and fashion-mnist fetched into it, and with ``--verify``
checked against the official release's checksums. A loader's error names its parameters as
these flags (``DATA_FLAGS``).
``train`` (``bcd.fit_bcd``) writes to ``--out`` (default ``runs/<timestamp>``): ``run.json``
(format ``fenchel_cvx.Run/1``: the arguments, for ``resume``, and the data's preprocessing, which
``predict`` applies to its input), ``checkpoint.npz`` (every ``--checkpoint-every`` rounds and
on Ctrl-C), and at the end ``history.json`` (``History.load``), ``model.npz``
(``LiftedNetwork.load``), ``objectives.png`` (lifted vs network objective: the gap) and
``accuracy.png``; its last line names every file it wrote. Per-layer values (``--lam``,
``--rho``, ``--gamma``) take one number or a comma-separated list, one per layer. Losses and
penalties are sums over the data points (as in the paper), so lam and rho are on the scale of
the training set (of a batch in Algorithm 2).
The hyperparameters' defaults are the package's training settings (``defaults.training``):
with ``--batch-size``, the benchmarks' tuned setting of the network's kind (a dense network: lam
0.2, rho 0, gamma 1 for the hidden layers and 30 for the output layer, momentum (0.7, 0), and on
the fast backend 10 W-steps for the hidden layers and one for the output layer, 20 X-steps;
``--arch lenet5``: the LeNet-5 benchmark's); without it, Algorithm 1 with lam 10, rho 1, every
block solved to ``--tol``. Every argument and the output folder are checked before any work
(the constraints of ``validation.py``); errors name the flag. ``run.json`` is written once the
data is read and the network built, so a ``train`` that fails on its data leaves an empty
folder, and one that fails later a folder that ``train --out`` reuses. Every command in a run
folder (``train --out`` reusing it, ``resume``, ``evaluate``, ``predict``) removes the temporary
files that a killed write left there, never a live writer's (``io.remove_temporaries``), naming
them on standard error in one line. ``resume`` of a run that finished all its rounds, its files
all written, says so and writes nothing.
BLAS runs on ``--threads`` threads (default 1), in the fast backend's solves too: NumPy's pool
gets them, SciPy's one (on 2 cores two pools of two oversubscribe the machine; see
docs/installation.md).
"""

import argparse
import json
import numbers
import os
import sys
import time
from datetime import datetime
from pathlib import Path

from . import __version__, defaults
from .activations import activation_names
from .heap import keep_freed_memory
from .losses import loss_names
from .validation import (
    COUNT,
    GAMMA,
    LAM,
    MOMENTUM,
    RHO,
    ROUNDS,
    SEED,
    TOL,
    Interval,
    PerLayer,
    check_rounds,
    failure,
)

DATASETS = ("digits", "mnist5k", "mnist", "fashion-mnist", "cifar10")
ACTIVATIONS = tuple(activation_names())
# The command's own defaults (its data set, loss and oracle, measured on digits: see the README);
# the hyperparameters (lam, rho, gamma, momentum, iterations, alternations, tol, the fast
# backend's steps) are the package's, ``defaults.py``.
DEFAULTS = dict(dataset="digits", activation="relu", loss="mse", epochs=1, backend="cvxpy", seed=0)
#: (features, classes) of each data set, so that --arch is checked before any data is read
SHAPES = {
    "digits": (64, 10),
    "mnist5k": (784, 10),
    "mnist": (784, 10),
    "fashion-mnist": (784, 10),
    "cifar10": (3072, 10),
}
#: training points of each data set (digits and mnist5k: their default split)
TRAIN_SIZES = {
    "digits": 1347,
    "mnist5k": 4000,
    "mnist": 60000,
    "fashion-mnist": 60000,
    "cifar10": 50000,
}
#: the image shape (C, H, W) of the data sets --arch lenet5 takes
IMAGES = {
    "mnist5k": (1, 28, 28),
    "mnist": (1, 28, 28),
    "fashion-mnist": (1, 28, 28),
    "cifar10": (3, 32, 32),
}
LENET5_HIDDEN = defaults.LeNet5.n_hidden  # conv, conv, fc 120, fc 84
#: what a batched run on the fast backend took where its flags were unset in a run.json without
#: a ``settings`` entry: one W-step, 10 X-steps and a fresh Gram every solve (and every run
#: fit_bcd's gamma and no momentum). ``resume`` of such a run.json goes on with them.
BEFORE_SETTINGS = dict(w_steps=1, x_steps=10, gram_reuse=1)
FAST_ONLY = ("max_iter", "w_steps", "x_steps", "newton_cap", "gram_reuse", "compile")
#: the format and version of run.json (a run.json without it is read as version 1)
RUN_FORMAT = "fenchel_cvx.Run/1"
#: the data sets whose files --verify checks
VERIFIABLE = ("mnist", "fashion-mnist", "cifar10")
#: the flag of each data loader's parameter that its errors name (``datasets.MissingDataError``)
DATA_FLAGS = {"data_dir": "--data-dir", "download": "--download"}
DESCRIPTION = (
    "Train, resume, evaluate and predict with Fenchel lifted networks (Gu, Askari and "
    "El Ghaoui, AISTATS 2020), trained by block-coordinate descent with a certificate "
    "checked at every round. 'fenchel-cvx COMMAND --help' describes each command."
)
LARGE = 3000  # the oracle on more training points prints an estimate and suggests --backend fast


# --- argument types: each checks its flag's constraint (validation.py); argparse names the flag
def _flag(constraint, parse=int):
    """An argparse type: ``parse`` the text, then check the value against ``constraint``; the
    error (argparse writes "argument --flag: ...") says what it must be."""

    def convert(text):
        try:
            value = parse(text)
        except ValueError:
            value = text  # unparsable: fails the constraint's type
        failed = failure(value, constraint)
        if failed is not None:
            raise argparse.ArgumentTypeError(f"must be {failed[0]}, got {text!r}")
        return value

    convert.__name__ = "integer" if parse is int else "number"
    return convert


def _numbers(text):
    """``"1"`` -> 1.0, ``"1,100"`` -> [1.0, 100.0]: one value, or one per layer."""
    try:
        values = [float(v) for v in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"must be a number or a comma-separated list of numbers, got {text!r}"
        ) from None
    return values[0] if len(values) == 1 else values


def _integers(text):
    """``"10"`` -> 10, ``"1,1,10,10"`` -> [1, 1, 10, 10]: one count, or one per layer."""
    values = [int(v) for v in text.split(",")]
    return values[0] if len(values) == 1 else values


def _per_layer(constraint, parse=_numbers):
    convert = _flag(PerLayer(constraint), parse)
    convert.__name__ = "per-layer list"
    return convert


def _arch(text):
    if text == "lenet5":
        return text
    try:
        sizes = [int(p) for p in text.split("-")]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"must look like 64-32-10 (or lenet5), got {text!r}"
        ) from None
    if len(sizes) < 2 or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"needs >= 2 positive sizes like 64-32-10, got {text!r}")
    return sizes


COUNT_, ROUNDS_, SEED_ = _flag(COUNT), _flag(ROUNDS), _flag(SEED)


def _values(v):
    """A setting's per-layer values in words: one number, or the list."""
    if v is None:
        return None
    v = v if isinstance(v, (tuple, list)) else (v,)
    return f"{v[0]:g}" if len(set(v)) == 1 else ",".join(f"{x:g}" for x in v)


def _tuned(name, without):
    """The help's default of a hyperparameter flag: ``without`` for Algorithm 1 (no
    --batch-size), and the tuned setting of each kind of network (``defaults.training``)."""
    dense, lenet = defaults.SETTINGS["dense"].for_layers(1), defaults.LeNet5.setting
    d, le = getattr(dense, name), getattr(lenet, name)
    if isinstance(d, tuple) and len(d) == 2 and d[0] != d[1]:
        d = f"{d[0]:g} for the hidden layers and {d[1]:g} for the output layer"
    else:
        d = _values(d) or "1"
    return (
        f"default: {without} without --batch-size; with it, the tuned setting: {d} on a "
        f"dense network, {_values(le)} on lenet5"
    )


class _Help(argparse.HelpFormatter):
    """Each flag's help once: its sentence, then its default unless the sentence gives it."""

    def _get_help_string(self, action):
        text = action.help or ""
        shown = (
            action.option_strings
            and action.default is not None
            and action.default is not False
            and action.default is not argparse.SUPPRESS
        )
        if shown and "default" not in text:
            text += " (default: %(default)s)"
        return text


def _train_arguments(t):
    """The flags of ``train``: data, network, algorithm, fast backend, run."""
    _data_arguments(t.add_argument_group("data"))
    _network_arguments(t.add_argument_group("network"))
    algorithm = t.add_argument_group("algorithm (fit_bcd)")
    _schedule_arguments(algorithm)
    _solver_arguments(algorithm)
    _fast_arguments(t.add_argument_group("fast backend (FastBackend; --backend fast only)"))
    _run_arguments(t.add_argument_group("run"))


def _data_arguments(d):
    """Which data set ``train`` reads, how much of it, and in which float type."""
    d.add_argument(
        "--dataset",
        choices=DATASETS,
        default=DEFAULTS["dataset"],
        help="the data set: digits (scikit-learn's 8x8 digits) and mnist5k (5,000 MNIST "
        "digits) are embedded; mnist, fashion-mnist and cifar10 are read from "
        "--data-dir",
    )
    d.add_argument(
        "--data-dir",
        type=Path,
        default=None,
        help="folder of the data set's files (default: $FENCHEL_DATA/<dataset>)",
    )
    _download_argument(d)
    d.add_argument(
        "--verify",
        action="store_true",
        help="check the data set's files against the official release's checksums "
        "before training (mnist, fashion-mnist, cifar10)",
    )
    d.add_argument(
        "--train-size",
        type=COUNT_,
        default=None,
        help="train on the first N training points only, for quick runs (default: all of them)",
    )
    d.add_argument(
        "--dtype",
        choices=("float32", "float64"),
        default="float64",
        help="float type of the data and the weights",
    )


def _download_argument(d):
    d.add_argument(
        "--download",
        action="store_true",
        help="fetch the data set's missing files from the official mirrors into --data-dir, "
        "each kept once its checksum matches (mnist, fashion-mnist)",
    )


def _network_arguments(n):
    """The lifted network: its layers, activation, loss, and the weights lam and rho."""
    n.add_argument(
        "--arch",
        type=_arch,
        default=None,
        help="layer sizes like 64-32-10, or lenet5 on image data (default: "
        "<features>-32-<classes>)",
    )
    n.add_argument(
        "--activation",
        default=DEFAULTS["activation"],
        choices=ACTIVATIONS,
        help="activation of every hidden layer",
    )
    n.add_argument(
        "--loss",
        default=DEFAULTS["loss"],
        choices=loss_names(),
        help="training loss: mse (squared error to the one-hot labels, the quick "
        "start's) or cross_entropy (softmax, the benchmarks')",
    )
    n.add_argument(
        "--lam",
        type=_per_layer(LAM),
        default=None,
        help="lambda_l > 0, the weight of the divergences: one, or one per hidden "
        f"layer ({_tuned('lam', f'{defaults.FULL_BATCH.lam:g}')})",
    )
    n.add_argument(
        "--rho",
        type=_per_layer(RHO),
        default=None,
        help="rho_l >= 0, the Frobenius penalty of W_l: one, or one per layer "
        f"({_tuned('rho', f'{defaults.FULL_BATCH.rho:g}')})",
    )
    n.add_argument(
        "--seed",
        type=SEED_,
        default=DEFAULTS["seed"],
        help="seed of the split, the initialisation and the batches",
    )


def _schedule_arguments(a):
    """Algorithm 1 or 2: the batches, the rounds, and the proximal terms between batches."""
    a.add_argument(
        "--batch-size",
        type=COUNT_,
        default=None,
        help="mini-batch size: Algorithm 2 (default: none, full-batch Algorithm 1)",
    )
    a.add_argument(
        "--epochs",
        type=ROUNDS_,
        default=DEFAULTS["epochs"],
        help="passes over the training data (Algorithm 2)",
    )
    a.add_argument(
        "--iterations",
        type=ROUNDS_,
        default=defaults.ITERATIONS,
        help="rounds on all the data (Algorithm 1)",
    )
    a.add_argument(
        "--alternations",
        type=ROUNDS_,
        default=defaults.ALTERNATIONS,
        help="rounds per batch, the paper's K (Algorithm 2)",
    )
    a.add_argument(
        "--gamma",
        type=_per_layer(GAMMA),
        default=None,
        help="gamma_l >= 0, the weight of the proximal term ||W_l - W0_l||^2: one, "
        f"or one per layer ({_tuned('gamma', f'{defaults.GAMMA_FULL_BATCH:g}')})",
    )
    a.add_argument(
        "--momentum",
        type=_per_layer(MOMENTUM),
        default=None,
        help="beta_l in [0, 1): each batch starts from W + beta_l (W - W_prev), the "
        "weights moved on along their last change; one, or one per layer; 0 is "
        f"the paper's ({_tuned('momentum', '0')})",
    )


def _solver_arguments(a):
    """The block solver and its tolerance; how often to certify, evaluate and checkpoint."""
    a.add_argument(
        "--backend",
        choices=["cvxpy", "fast"],
        default=DEFAULTS["backend"],
        help="block solver: cvxpy (the CVXPY oracle, every block solved to --tol; "
        "slow beyond a few thousand points) or fast (the package's own solvers)",
    )
    a.add_argument(
        "--tol",
        type=_flag(TOL, float),
        default=defaults.TOL,
        help="tolerance of the certificate's checks and of every block's scaled KKT residual",
    )
    a.add_argument(
        "--strict",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="stop at the first certificate violation (default: on with --backend "
        "cvxpy, off with fast)",
    )
    a.add_argument(
        "--check-every",
        type=COUNT_,
        default=1,
        help="run the whole certificate every N rounds (and on the last)",
    )
    a.add_argument(
        "--eval-every",
        type=COUNT_,
        default=1,
        help="evaluate train/test accuracy every N rounds (and at epoch ends)",
    )
    a.add_argument(
        "--checkpoint-every",
        type=COUNT_,
        default=10,
        help="write checkpoint.npz every N rounds (and on Ctrl-C); each one also "
        "starts the fast backend's reused Gram factors afresh (--gram-reuse)",
    )


def _run_arguments(o):
    """The run's output folder, its BLAS threads, its summary and progress bar."""
    o.add_argument(
        "--out",
        type=Path,
        default=None,
        help="output folder, new or empty (default: runs/<timestamp>)",
    )
    o.add_argument(
        "--threads",
        type=COUNT_,
        default=1,
        help="BLAS threads of NumPy's pool, in the fast backend's solves too "
        "(SciPy's pool stays at 1)",
    )
    o.add_argument(
        "--no-baseline",
        action="store_true",
        help="skip the logistic-regression accuracy in the summary",
    )
    o.add_argument("--quiet", action="store_true", help="show no progress bar")


def _fast_arguments(f):
    """The fast backend's step counts, caps and compiled kernels."""
    f.add_argument(
        "--max-iter",
        type=COUNT_,
        default=None,
        help="iteration cap of every loop of the solvers (default: 500)",
    )
    f.add_argument(
        "--w-steps",
        type=_per_layer(COUNT, _integers),
        default=None,
        help="warm-started steps per W-block: one, or one per layer "
        f"({_tuned('w_steps', 'solved to --tol')})",
    )
    f.add_argument(
        "--x-steps",
        type=_per_layer(COUNT, _integers),
        default=None,
        help="FISTA steps per X-block: one, or one per hidden layer, X_1 first "
        f"({_tuned('x_steps', 'solved to --tol')})",
    )
    f.add_argument(
        "--newton-cap",
        type=_flag(Interval(numbers.Integral, 0, None)),
        default=None,
        help="active-set size up to which W rows take Newton steps (default: the "
        "backend's balance of the two kinds of step)",
    )
    f.add_argument(
        "--gram-reuse",
        type=_per_layer(COUNT, _integers),
        default=None,
        help="W solves one Gram factorisation serves: one, or one per layer "
        f"({_tuned('gram_reuse', '1')})",
    )
    f.add_argument(
        "--compile",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="run the solvers' elementwise chains as fused kernels compiled by "
        "torch.compile (needs PyTorch and a C++ compiler; the first batch pays "
        "the compile, cached on disk for later runs), or all eager NumPy "
        "(--no-compile); default: compiled where PyTorch and a C++ compiler are "
        "present and the arrays are large enough to gain",
    )


def build_parser():
    """The ``fenchel-cvx`` parser: the subcommands train, resume, evaluate and predict."""
    parser = argparse.ArgumentParser(prog="fenchel-cvx", description=DESCRIPTION)
    parser.add_argument("--version", action="version", version=f"fenchel-cvx {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    _train_arguments(
        sub.add_parser(
            "train",
            help="train a lifted network by BCD; write its history, model and plots",
            description="Train a lifted network by block-coordinate descent and write run.json, "
            "checkpoint.npz, history.json, model.npz and two plots to --out. Without "
            "flags: digits, 64-32-10 ReLU, mse, the cvxpy oracle, Algorithm 1.",
            formatter_class=_Help,
        )
    )
    _resume_arguments(
        sub.add_parser(
            "resume",
            help="continue an interrupted train run from its folder",
            description="Continue a train run from its folder's run.json and "
            "checkpoint.npz, to the same result as an uninterrupted run.",
            formatter_class=_Help,
        )
    )
    _evaluate_arguments(
        sub.add_parser(
            "evaluate",
            help="loss and accuracy of a saved model on a data set",
            description="Loss per point and accuracy of a saved model on a data "
            "set's test or training split.",
            formatter_class=_Help,
        )
    )
    _predict_arguments(
        sub.add_parser(
            "predict",
            help="predict from a saved model; rows of INPUT are data points",
            description="Predict from a saved model, one row of INPUT per data point. "
            "A model in a run folder first gets the run's preprocessing "
            "(recorded in run.json, e.g. digits' pixels / 16) applied to "
            "INPUT, as its training data had; --raw skips it.",
            formatter_class=_Help,
        )
    )
    return parser


def _resume_arguments(r):
    """The flags of ``resume``: the run's folder; the data's folder, threads and progress bar
    may change."""
    r.add_argument("run", type=Path, help="the run's folder (holding run.json and checkpoint.npz)")
    r.add_argument(
        "--data-dir",
        type=Path,
        default=None,
        help="folder of the data set's files, where they are now (default: the run's); the "
        "data must be the run's",
    )
    _download_argument(r)
    r.add_argument(
        "--threads", type=COUNT_, default=None, help="BLAS threads (default: the run's --threads)"
    )
    r.add_argument("--quiet", action="store_true", help="show no progress bar")


def _evaluate_arguments(e):
    """The flags of ``evaluate``: the model, and the data set and split to score it on."""
    e.add_argument(
        "model",
        type=Path,
        help="a run folder, a model.npz inside one, or any model.npz (then give --dataset)",
    )
    e.add_argument(
        "--dataset", choices=DATASETS, default=None, help="the data set (default: the run's)"
    )
    e.add_argument(
        "--data-dir",
        type=Path,
        default=None,
        help="folder of the data set's files (default: the run's, else $FENCHEL_DATA/<dataset>)",
    )
    _download_argument(e)
    e.add_argument(
        "--verify",
        action="store_true",
        help="check the data set's files against the official release's checksums "
        "(mnist, fashion-mnist, cifar10)",
    )
    e.add_argument(
        "--seed",
        type=SEED_,
        default=None,
        help="seed of the split of digits and mnist5k (default: the run's, else 0)",
    )
    e.add_argument(
        "--split", choices=("test", "train"), default="test", help="which split to evaluate on"
    )
    e.add_argument("--threads", type=COUNT_, default=1, help="BLAS threads")


def _predict_arguments(p):
    """The flags of ``predict``: the model, its input, and what to write where."""
    p.add_argument(
        "model", type=Path, help="a run folder, a model.npz inside one, or any model.npz"
    )
    p.add_argument("input", type=Path, help=".npy or .csv file, one data point per row")
    p.add_argument(
        "--out", type=Path, default=None, help="CSV file to write (default: standard output)"
    )
    p.add_argument(
        "--output",
        choices=("label", "proba", "raw"),
        default="label",
        help="class labels, class probabilities (softmax of a cross-entropy model), "
        "or the network output",
    )
    p.add_argument(
        "--raw",
        action="store_true",
        help="INPUT is preprocessed already: do not apply the run's preprocessing",
    )
    p.add_argument("--threads", type=COUNT_, default=1, help="BLAS threads")


# --- checks before any work ---------------------------------------------------------------------
def _fail(flag, message):
    raise ValueError(f"argument {flag}: {message}")


def _check_out(flag, path, must_not_exist=False):
    """Create the output folder now and prove it writable, so no run is lost at its end.
    ``must_not_exist``: the folder must be new, empty, or hold only what a run that failed
    before its first checkpoint leaves (``run.json``, temporary files): it is reused."""
    from .io import check_writable_dir

    left = (
        []
        if not (must_not_exist and path.is_dir())
        else [
            p.name
            for p in path.iterdir()
            if p.name != "run.json" and not (p.name.startswith(".") and p.name.endswith(".tmp"))
        ]
    )
    if left or (must_not_exist and path.is_dir() and (path / "checkpoint.npz").exists()):
        _fail(
            flag,
            f"{str(path)!r} already holds files (a run there is resumed with "
            f"'fenchel-cvx resume {path}'); choose another folder",
        )
    try:
        return check_writable_dir(flag, path)
    except ValueError as err:
        _fail(
            flag,
            str(err).split(" must be ", 1)[-1].replace("a writable folder, got", "not writable:"),
        )


def _downloadable():
    """The data sets whose loader fetches missing files (takes ``download``)."""
    import inspect

    from .datasets import DATASETS as LOADERS

    return [n for n, load in LOADERS.items() if "download" in inspect.signature(load).parameters]


def _check_data_dir(args):
    """``--verify``, ``--download`` and the data's folder (``datasets.data_folder``: --data-dir,
    else $FENCHEL_DATA/<dataset>): a folder, or with --download one that can be created."""
    from .datasets import MissingDataError, data_folder

    if getattr(args, "verify", False) and args.dataset not in VERIFIABLE:
        _fail(
            "--verify",
            f"{args.dataset} is embedded in the package: there are no files to "
            f"verify (--verify checks {', '.join(VERIFIABLE)})",
        )
    download = getattr(args, "download", False)
    if download and args.dataset not in (can := _downloadable()):
        _fail(
            "--download",
            f"the package fetches no files of {args.dataset} (--download fetches those of "
            f"{', '.join(can)})",
        )
    if args.dataset in ("digits", "mnist5k"):
        if args.data_dir is not None:
            _fail("--data-dir", f"{args.dataset} is embedded and reads no folder")
        return
    try:
        root = data_folder(args.dataset, args.data_dir)
    except MissingDataError as err:
        _fail("--data-dir", err.naming(DATA_FLAGS))
    if root.is_dir():
        return
    if not download or root.exists():
        creatable = not download and not root.exists() and args.dataset in _downloadable()
        hint = "; --download creates it" if creatable else ""
        _fail("--data-dir", f"{str(root)!r} is not a folder (for {args.dataset}){hint}")
    base = next(p for p in root.parents if p.exists())  # the folder --download creates it in
    if not base.is_dir() or not os.access(base, os.W_OK):
        _fail(
            "--data-dir",
            f"{str(root)!r} does not exist and --download cannot create it in {str(base)!r}",
        )


def _check_train(args):
    if args.arch == "lenet5" and args.dataset not in IMAGES:
        _fail(
            "--arch",
            f"lenet5 takes 28 x 28 or 32 x 32 images ({', '.join(IMAGES)}), not {args.dataset}",
        )
    n_hidden = (
        1 if args.arch is None else LENET5_HIDDEN if args.arch == "lenet5" else len(args.arch) - 2
    )
    _fill_defaults(args, n_hidden)
    for flag, value, n in (
        ("--lam", args.lam, n_hidden),
        ("--rho", args.rho, n_hidden + 1),
        ("--gamma", args.gamma, n_hidden + 1),
        ("--momentum", args.momentum, n_hidden + 1),
        ("--w-steps", args.w_steps, n_hidden + 1),
        ("--x-steps", args.x_steps, n_hidden),
        ("--gram-reuse", args.gram_reuse, n_hidden + 1),
    ):
        if isinstance(value, list) and len(value) != n:
            hidden = "hidden " if flag in ("--lam", "--x-steps") else ""
            _fail(flag, f"needs one value or {n} (one per {hidden}layer), got {len(value)}")
    if args.backend != "fast":
        given = [k for k in FAST_ONLY if getattr(args, k) is not None]
        if given:
            _fail("--" + given[0].replace("_", "-"), "needs --backend fast")
    if args.compile:
        from .fast.fused import compiler_problem

        if (problem := compiler_problem()) is not None:
            _fail("--compile", problem)
    p_in, k = SHAPES[args.dataset]
    if args.arch not in (None, "lenet5") and (args.arch[0] != p_in or args.arch[-1] != k):
        _fail(
            "--arch",
            f"{'-'.join(map(str, args.arch))} does not fit {args.dataset}: the input "
            f"size must be {p_in} and the output size {k}",
        )
    m = TRAIN_SIZES[args.dataset]
    if (args.train_size or 0) > m:
        _fail("--train-size", f"{args.dataset} has {m} training points, got {args.train_size}")
    check_rounds(
        args.train_size or m,
        args.batch_size,
        args.epochs,
        args.alternations,
        names={
            "epochs": "--epochs",
            "batch_size": "--batch-size",
            "alternations": "--alternations",
        },
    )
    _check_data_dir(args)


def _fill_defaults(args, n_hidden):
    """Every hyperparameter flag not given takes the run's training setting
    (``defaults.training``: the kind of network's with ``--batch-size``, Algorithm 1's without;
    the fast backend's steps only on it), so that ``run.json`` records the values the run used."""
    network = args.arch if isinstance(args.arch, str) else "dense"  # --arch lenet5, or sizes
    setting = defaults.training(network, n_hidden, batched=args.batch_size is not None)
    setting.fill(
        vars(args),
        ("lam", "rho", "gamma", "momentum")
        + (("w_steps", "x_steps", "gram_reuse") if args.backend == "fast" else ()),
    )
    args.settings = getattr(args, "settings", None) or "defaults.training"  # run.json says so


# --- the commands -------------------------------------------------------------------------------
def _threads(n):
    """``--threads``: each native pool limited by library as the fast backend's solves are
    (``threads.plan``: SciPy's one, every other pool n; two pools of two threads each
    oversubscribe two cores)."""
    from .threads import limit_threads

    return limit_threads(n)


def _load(args):
    """The data set of ``args``; files missing from its folder are refused by ``--data-dir``,
    the loader's message naming its parameters as their flags (``DATA_FLAGS``)."""
    from . import datasets

    kw = (
        dict(seed=args.seed)
        if args.dataset in ("digits", "mnist5k")
        else dict(data_dir=args.data_dir)
    )
    if args.dataset in VERIFIABLE:
        kw.update(
            dtype=getattr(args, "dtype", "float64"), verify=bool(getattr(args, "verify", False))
        )
    if getattr(args, "download", False):
        kw.update(download=True)
    try:
        return datasets.load_dataset(args.dataset, **kw)
    except datasets.MissingDataError as err:
        _fail("--data-dir", err.naming(DATA_FLAGS))


def _oracle_estimate(total, m):
    """A callback printing, after the oracle's first round, how long the run will take."""

    def estimate(net, rec):
        if rec["iteration"] == 1:
            mins = rec["seconds"] * total / 60
            print(
                f"\nfenchel-cvx: the oracle took {rec['seconds']:.1f} s for round 1 on {m} points: "
                f"about {mins:.0f} min for the {total} rounds. --backend fast solves the same "
                f"blocks in a small fraction of that.",
                file=sys.stderr,
                flush=True,
            )

    return estimate


def _start(args, resume):
    """The run's folder, without the temporary files a killed run left there: for a new run,
    created now (or reused: ``_check_out``), ``run.json`` comes once the data is read
    (``_record``)."""
    out = (
        args.out if resume else _check_out("--out", args.out or _default_out(), must_not_exist=True)
    )
    _remove_temporaries("resume" if resume else "train", out)
    return out


def _remove_temporaries(command, folder):
    """Delete the temporary files that writers since killed left in ``folder`` (never a live
    writer's: ``io.remove_temporaries``), and name them on standard error in one line."""
    from .io import remove_temporaries

    removed = remove_temporaries(folder)
    if removed:
        print(
            f"fenchel-cvx {command}: removed {len(removed)} temporary file(s) that a killed "
            f"write left in {folder}: {', '.join(p.name for p in removed)}",
            file=sys.stderr,
        )


def _record(args, out):
    """Write ``out/run.json``: the arguments (for ``resume``) and the data's preprocessing (for
    ``predict``)."""
    from .datasets import PIXEL_SCALE
    from .io import write_json

    saved = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    scale = PIXEL_SCALE[args.dataset]
    write_json(
        out / "run.json",
        dict(
            saved,
            out=str(out),
            format=RUN_FORMAT,
            preprocessing=dict(
                divide_by=scale,
                what=f"the pixels of {args.dataset} divided by {scale:g}, to [0, 1]",
            ),
        ),
    )


def _network(args, data):
    """The network of ``--arch`` (default <features>-32-<classes>) and its label for the banner."""
    from .network import LiftedNetwork, lenet5

    arch = args.arch or [data.n_features, 32, data.n_classes]
    kw = dict(
        activation=args.activation,
        loss=args.loss,
        lam=args.lam,
        rho=args.rho,
        seed=args.seed,
        dtype=args.dtype,
    )
    net = (
        lenet5(IMAGES[args.dataset], data.n_classes, **kw)
        if arch == "lenet5"
        else LiftedNetwork(arch, **kw)
    )
    return net, "-".join(map(str, net.layer_sizes)) + (" (LeNet-5)" if arch == "lenet5" else "")


def _backend(args):
    """``--backend``: the oracle by name, or a FastBackend of the fast flags (a batched run
    takes its training setting's inexact steps per batch unless they are given: ``_check_train``
    filled them in)."""
    if args.backend != "fast":
        return args.backend
    from .fast import FastBackend

    given = {k: getattr(args, k) for k in FAST_ONLY if getattr(args, k) is not None}
    return FastBackend(tol=args.tol, threads=args.threads, **given)


def _banner(args, resume, n_train, n_test, arch, out):
    algo = (
        f"Algorithm 1, {args.iterations} iterations"
        if args.batch_size is None
        else f"Algorithm 2, batch {args.batch_size}, {args.epochs} epochs x {args.alternations} "
        f"alternations, gamma={args.gamma}"
    )
    beta = args.momentum if isinstance(args.momentum, list) else [args.momentum]
    algo += f", momentum={args.momentum}" if any(beta) else ""
    print(
        f"fenchel-cvx {'resume' if resume else 'train'}: {args.dataset} ({n_train} train / "
        f"{n_test} test), {arch} {args.activation}, {args.loss}, lam={args.lam}, "
        f"rho={args.rho}; {algo}; backend {args.backend}"
        f"{' (compiled kernels)' if getattr(args, 'compile', None) else ''}; "
        f"{args.threads} thread(s); "
        f"output {out}",
        flush=True,
    )


def _interrupted(out, total):
    """Ctrl-C: say where the state is and how to resume (exit status 130)."""
    from .checkpoints import load_checkpoint

    if not (out / "checkpoint.npz").is_file():
        print(
            "\nfenchel-cvx: interrupted before the first round; nothing to resume", file=sys.stderr
        )
        return 130
    done = load_checkpoint(out)[1]["iteration"]
    print(
        f"\nfenchel-cvx: interrupted after round {done} of {total}; the state is saved in "
        f"{out / 'checkpoint.npz'}.\nContinue with:  fenchel-cvx resume {out}",
        file=sys.stderr,
    )
    return 130


def _summary(args, net, h, out, train, test, t0, written):
    """Write the history, the model and the plots; print the accuracies, the certificate and
    every file the run wrote (``written``: ``io.recording_writes``)."""
    from .plotting import plot_accuracy, plot_objectives

    h.save(out / "history.json")
    net.save(out / "model.npz")
    plot_objectives(h, out / "objectives.png")
    plot_accuracy(h, out / "accuracy.png")
    last = h.last
    line = (
        f"final train accuracy {last['train_accuracy']:.4f}, test accuracy "
        f"{last['test_accuracy']:.4f}"
    )
    if not args.no_baseline:
        from sklearn.linear_model import LogisticRegression

        lr = LogisticRegression(max_iter=5000).fit(train[0].T, train[1])
        line += f" (logistic regression on the same split: {lr.score(test[0].T, test[1]):.4f})"
    print(line)
    if last["checked"]:
        print(
            f"lifted objective {last['lifted_x']:.6g} <= network objective "
            f"{last['network_x']:.6g} at the last X-sweep; ",
            end="",
        )
    print(f"certificate held at every iteration: {h.verdict}")
    print(f"wrote {_files(out, written)} in {time.perf_counter() - t0:.1f} s")


def _files(out, paths):
    """``paths`` in words: those in the folder ``out`` by their names, after it the others."""
    inside = [p.name for p in paths if p.parent == out]
    others = [str(p) for p in paths if p.parent != out]
    return f"{', '.join(inside)} to {out}" + (f", and {', '.join(others)}" if others else "")


def _rounds(args, m):
    """The rounds of the run of ``args`` on ``m`` training points."""
    if args.batch_size is None:
        return args.iterations
    return args.epochs * args.alternations * (-(-m // args.batch_size))


def train(args, resume=False):
    """``fenchel-cvx train`` (and, ``resume``, the rest of a run); its last line names every
    file it wrote."""
    from .io import recording_writes

    with recording_writes() as written:
        return _train(args, resume, written)


def _train(args, resume, written):
    from . import datasets
    from .bcd import fit_bcd

    t0 = time.perf_counter()
    _check_train(args)
    new = not resume and not (args.out is not None and args.out.exists())
    out = _start(args, resume)
    try:
        data = _load(args)
        net, arch = _network(args, data)
    except BaseException:  # a run that fails on its data leaves no folder it created
        if new and out.is_dir() and not any(out.iterdir()):
            out.rmdir()
        raise
    if not resume:
        _record(args, out)
    X, y = data.X_train[:, : args.train_size], data.y_train[: args.train_size]
    X, X_test = X.astype(args.dtype, copy=False), data.X_test.astype(args.dtype, copy=False)
    Y, Y_test = datasets.one_hot(y, data.n_classes), datasets.one_hot(data.y_test, data.n_classes)
    total = _rounds(args, X.shape[1])
    callback = None
    if args.backend == "cvxpy" and X.shape[1] > LARGE:
        callback = _oracle_estimate(total, X.shape[1])
    _banner(args, resume, X.shape[1], X_test.shape[1], arch, out)
    try:  # fit_bcd checkpoints on Ctrl-C; before it starts there is nothing to save
        res = fit_bcd(
            net,
            X,
            Y,
            batch_size=args.batch_size,
            epochs=args.epochs,
            iterations=args.iterations,
            alternations=args.alternations,
            gamma=args.gamma,
            momentum=args.momentum,
            backend=_backend(args),
            strict=args.strict,
            tol=args.tol,
            X_test=X_test,
            Y_test=Y_test,
            progress=not args.quiet,
            eval_every=args.eval_every,
            check_every=args.check_every,
            callback=callback,
            checkpoint=out,
            checkpoint_every=args.checkpoint_every,
            resume=out if resume else None,
        )
    except KeyboardInterrupt:
        return _interrupted(out, total)
    res.history.config.update(dataset=args.dataset, train_size=int(X.shape[1]))
    _summary(args, net, res.history, out, (X, y), (X_test, data.y_test), t0, written)
    return 0


def _default_out():
    base = Path("runs") / datetime.now().strftime("%Y%m%d-%H%M%S")
    path, k = base, 1
    while path.exists():
        path, k = Path(f"{base}-{k}"), k + 1
    return path


def _run_args(folder):
    """The arguments a ``train`` run saved in ``folder/run.json`` (None where there is none),
    each checked as its flag is (``_check_saved``), then every field by the schema of run.json
    (``schemas.RUN``: its type, whether it may be null, its range; the preprocessing that
    ``predict`` applies), a refusal naming the file and the field."""
    from .files import check_format, read_json
    from .schemas import RUN

    path = folder / "run.json"
    if not path.is_file():
        return None
    saved = read_json(path, "run.json (fenchel-cvx train)")
    if "format" in saved:
        check_format(path, saved, RUN_FORMAT, "format")
    _check_saved(path, saved)
    RUN.check(path, "", saved)
    for k in ("out", "data_dir"):
        saved[k] = None if saved.get(k) is None else Path(saved[k])
    return saved


def _check_saved(path, saved):
    """Each value of a run.json that ``train`` has a flag for, checked by that flag's own
    conversion and choices: an edited run.json is refused by its entry's name."""
    from .errors import FileFormatError

    train = build_parser()._subparsers._group_actions[0].choices["train"]
    for action in train._actions:
        value = saved.get(action.dest)
        if value is None or not action.option_strings or action.dest == "help":
            continue
        if isinstance(value, list) and all(isinstance(v, (int, float)) for v in value):
            text = ("-" if action.dest == "arch" else ",").join(str(v) for v in value)
        else:
            text = value if isinstance(value, str) else json.dumps(value)
        ok = (
            isinstance(value, (str, int, float, list)) and not isinstance(value, bool)
            if action.type is not None or action.choices
            else isinstance(value, bool)
        )
        try:
            ok = ok and (action.type is None or action.type(text) is not None)
        except (argparse.ArgumentTypeError, ValueError):
            ok = False
        if not ok or (action.choices and value not in action.choices):
            raise FileFormatError(
                path, action.dest, f"a value {action.option_strings[0]} takes", repr(value)[:200]
            )


def resume(args):
    saved = _run_args(args.run) if args.run.is_dir() else None
    if saved is None:
        _fail("run", f"{str(args.run)!r} holds no run.json of a 'fenchel-cvx train' run")
    _remove_temporaries("resume", args.run)  # a finished run's folder too
    if not (args.run / "checkpoint.npz").is_file():
        _fail("run", f"{str(args.run)!r} holds no checkpoint.npz (nothing to resume)")
    targs = build_parser().parse_args(["train"])
    vars(targs).update(
        saved, out=args.run, quiet=args.quiet, threads=args.threads or saved.get("threads", 1)
    )
    targs.data_dir = args.data_dir or targs.data_dir
    targs.download = args.download or targs.download
    if args.data_dir is not None or args.download:  # flags given: checked before any work
        _check_data_dir(targs)
    if _finished(args.run, targs):
        return 0
    _check_out("run", args.run)
    _before_settings(targs)
    with _threads(targs.threads):
        return train(targs, resume=True)


def _finished(run, args):
    """Whether the run in ``run`` (of the arguments ``args``) ended, all its rounds done or a
    halted round its last, and wrote all its files; if so, says so. Reads the checkpoint's meta
    alone, never its arrays."""
    from .checkpoints import checkpoint_meta
    from .io import RUN_FILES

    if not all((run / name).is_file() for name in RUN_FILES):
        return False
    meta = checkpoint_meta(run)
    done, records = meta["iteration"], meta["history"]["records"]
    total = _rounds(args, args.train_size or TRAIN_SIZES[args.dataset])
    halted = bool(records) and isinstance(records[-1], dict) and bool(records[-1].get("halted"))
    if done != total and not halted:
        return False
    plan = (
        f"Algorithm 1: {args.iterations} iterations"
        if args.batch_size is None
        else f"Algorithm 2: {args.epochs} epochs of {total // args.epochs // args.alternations} "
        f"batches x {args.alternations} alternations"
    )
    ended = (
        f"ended at round {done} of {total} ({plan}), halted by {records[-1]['halted']}"
        if done != total
        else f"already finished {done} of {total} rounds ({plan})"
    )
    print(f"fenchel-cvx resume: {run} {ended} and wrote its files; nothing to do")
    return True


def _before_settings(args):
    """The arguments of a run.json written before the training settings (no ``settings``
    entry; since then every run.json has one and records every value): what that run took
    where they are unset (fit_bcd's gamma, no momentum, on the fast backend
    ``BEFORE_SETTINGS``), so that it resumes as it began."""
    if getattr(args, "settings", None) is not None:
        return
    before = dict(gamma=defaults.gamma_for(args.batch_size), momentum=0.0)
    if args.backend == "fast":
        before.update(BEFORE_SETTINGS if args.batch_size is not None else dict(gram_reuse=1))
    vars(args).update(
        {k: v for k, v in before.items() if getattr(args, k, None) is None},
        settings="before the training settings",
    )


def _model(flag, path):
    """The network of ``path`` (a run folder, or a model file) and the arguments of the run
    whose folder holds it (``{}`` for a model outside a run folder)."""
    from .network import LiftedNetwork

    file = path / "model.npz" if path.is_dir() else path
    if not file.is_file():
        _fail(flag, f"{str(path)!r} is neither a model.npz nor a run folder holding one")
    try:
        net = LiftedNetwork.load(file)
    except ValueError as err:  # FileFormatError: named as the argument
        _fail(flag, str(err))
    return net, _run_args(file.parent) or {}


def evaluate(args):
    from .bcd import evaluate as evaluate_net
    from .datasets import one_hot

    net, run = _model("model", args.model)
    _remove_temporaries("evaluate", args.model if args.model.is_dir() else args.model.parent)
    args.dataset = args.dataset or run.get("dataset")
    if args.dataset is None:
        _fail(
            "--dataset",
            "needed: the model is not in a run folder (one holding the run.json "
            "of 'fenchel-cvx train') that names its data set",
        )
    args.data_dir = (
        args.data_dir or run.get("data_dir")
        if args.dataset == run.get("dataset")
        else args.data_dir
    )
    args.seed = run.get("seed", 0) if args.seed is None else args.seed
    p_in, k = SHAPES[args.dataset]
    if (p_in, k) != (net.layer_sizes[0], net.layer_sizes[-1]):
        _fail(
            "--dataset",
            f"{args.dataset} has {p_in} features and {k} classes; the model "
            f"takes {net.layer_sizes[0]} and gives {net.layer_sizes[-1]}",
        )
    _check_data_dir(args)
    data = _load(args)
    X, y = (data.X_test, data.y_test) if args.split == "test" else (data.X_train, data.y_train)
    loss, acc = evaluate_net(
        net, X.astype(net.W[0].dtype, copy=False), one_hot(y, data.n_classes), True
    )
    print(
        f"{args.dataset} {args.split} ({X.shape[1]} points, seed {args.seed}): loss per point "
        f"{loss:.6g}, accuracy {acc:.4f}"
    )
    return 0


def _destination(flag, path):
    """``io.check_destination`` with the error in argparse's words, naming ``flag``."""
    from .io import check_destination

    try:
        return check_destination(flag, path)
    except ValueError as err:
        _fail(flag, str(err).removeprefix(f"{flag} "))


def _preprocess(args, run, A):
    """``A`` with the run's recorded preprocessing applied (``run.json``'s ``preprocessing``;
    from its data set where an older run.json has none), said on standard error; as it is with
    ``--raw`` or for a model outside a run folder."""
    from .datasets import PIXEL_SCALE

    scale = (run.get("preprocessing") or {}).get("divide_by", PIXEL_SCALE.get(run.get("dataset")))
    if args.raw or scale is None:
        return A
    print(
        f"fenchel-cvx predict: input divided by {scale:g}, the run's preprocessing (the "
        f"pixels of {run.get('dataset')} to [0, 1]); pass --raw if it is applied already",
        file=sys.stderr,
    )
    return A / scale


def predict(args):
    import numpy as np

    from .files import read_points

    if args.out is not None:  # before any work
        _destination("--out", args.out)
    net, run = _model("model", args.model)
    _remove_temporaries("predict", args.model if args.model.is_dir() else args.model.parent)
    try:
        A = read_points(args.input, net.layer_sizes[0])
    except ValueError as err:  # FileFormatError: named as the argument INPUT
        _fail("input", str(err))
    Yhat = net.predict(_preprocess(args, run, A).T.astype(net.W[0].dtype))
    if args.output == "label":
        table, fmt = Yhat.argmax(axis=0)[:, None], "%d"
    elif args.output == "proba":
        if net.loss.probabilities is None:
            _fail(
                "--output",
                "proba needs a loss with class probabilities, such as "
                f"cross_entropy (this model's is {net.loss.name}); use --output raw",
            )
        table, fmt = net.loss.probabilities(Yhat).T, "%.8g"
    else:
        table, fmt = Yhat.T, "%.8g"
    if args.out is None:
        np.savetxt(sys.stdout, table, fmt=fmt, delimiter=",")
    else:
        import io as _io

        from .io import write_text

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
    keep_freed_memory()  # the process's temporaries reuse the heap (``heap.py``)
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
    except OSError as err:  # a disk filling up or a folder removed during the run
        print(f"fenchel-cvx {args.command}: {err}", file=sys.stderr)
        return 1
    except Exception as err:
        from .errors import FenchelError

        if not isinstance(err, FenchelError):
            raise
        print(f"fenchel-cvx: {type(err).__name__}: {err}", file=sys.stderr)
        return 1
