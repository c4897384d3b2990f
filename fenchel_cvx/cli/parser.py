"""The ``fenchel-cvx`` argument parser: :func:`build_parser`, its five subcommands (train,
resume, evaluate, predict, certify) and their flags in groups (data, network, algorithm, fast
backend, run), each flag with its sentence, its choices and its default.

``train``'s flags are the arguments of the network and of ``bcd.fit_bcd`` (Algorithm 1
without ``--batch-size``, Algorithm 2 with it): ``--lam``, the lambda_l of the relaxation
eq. (7); ``--rho``, the Frobenius penalties of eq. (3); ``--gamma``, the proximal term of the
batched model eq. (13). A hyperparameter flag left unset takes the package's training setting
(``defaults.training``, filled in by ``training._fill_defaults``). Each flag's value is checked
by its type (``flags.py``); the checks across flags come after parsing
(``training._check_train``).
"""

import argparse
import numbers
from pathlib import Path

from .. import __version__, defaults
from ..activations import activation_names
from ..losses import loss_names
from ..validation import COUNT, GAMMA, LAM, MOMENTUM, RHO, TOL, Interval
from .data_flags import DATASETS
from .flags import COUNT_, ROUNDS_, SEED_, _arch, _flag, _Help, _integers, _per_layer, _tuned

ACTIVATIONS = tuple(activation_names())
# The command's own defaults (its data set, loss and oracle, measured on digits: see the README);
# the hyperparameters (lam, rho, gamma, momentum, iterations, alternations, tol, the fast
# backend's steps) are the package's, ``defaults.py``.
DEFAULTS = dict(dataset="digits", activation="relu", loss="mse", epochs=1, backend="cvxpy", seed=0)
DESCRIPTION = (
    "Train, resume, evaluate and predict with Fenchel lifted networks (Gu, Askari and "
    "El Ghaoui, AISTATS 2020), trained by block-coordinate descent with a certificate "
    "checked at every round. 'fenchel-cvx COMMAND --help' describes each command."
)


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
    o.add_argument(
        "--nproc",
        type=COUNT_,
        default=1,
        help="train on that many processes of this machine (gloo ranks, --threads each), each "
        "a share of every batch; needs --backend fast and PyTorch (under torchrun: its ranks)",
    )
    o.add_argument(
        "--record-blocks",
        action="store_true",
        help="write blocks.npz: every block of the last round as its solver saw it, with the "
        "solver's argmin ('fenchel-cvx certify --recorded' measures the solver's accuracy)",
    )


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
    """The ``fenchel-cvx`` parser: the subcommands train, resume, evaluate, predict and certify."""
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
    _certify_arguments(
        sub.add_parser(
            "certify",
            help="re-solve every block of a run's saved iterate by the oracle; print the gaps",
            description="Certify a run's saved iterate block by block: each block of the "
            "lifted objective at the run's checkpoint is solved exactly by the oracle, which "
            "prints the run's value, the optimum, a certified lower bound, the gap and the "
            "KKT residual of the run's point (Algorithm 1: on all the data; Algorithm 2: on "
            "the last round's batch).",
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


def _certify_arguments(c):
    """The flags of ``certify``: the run, which blocks, the oracle's workers and tolerance."""
    c.add_argument("run", type=Path, help="the run's folder (holding run.json and checkpoint.npz)")
    c.add_argument(
        "--blocks",
        choices=("all", "X", "W"),
        default="all",
        help="the blocks to certify: all of them, the X-blocks or the W-blocks",
    )
    c.add_argument(
        "--workers",
        type=COUNT_,
        default=1,
        help="Dask workers (one BLAS thread each) for the blocks' independent rows and "
        "columns; 1: in this process",
    )
    c.add_argument(
        "--tol",
        type=_flag(TOL),
        default=1e-9,
        help="the KKT residual to which the oracle solves every block",
    )
    c.add_argument(
        "--data-dir",
        type=Path,
        default=None,
        help="folder of the data set's files, where they are now (default: the run's); the "
        "data must be the run's",
    )
    c.add_argument(
        "--recorded",
        action="store_true",
        help="certify the blocks the run recorded (train --record-blocks) at the inputs its "
        "solver saw, instead of its saved point",
    )
    c.add_argument("--json", type=Path, default=None, help="also write the figures to this file")
    c.add_argument("--threads", type=COUNT_, default=1, help="BLAS threads of this process")
    c.add_argument("--quiet", action="store_true", help="print the table alone")
