"""The data-set flags of ``fenchel-cvx`` (``--dataset``, ``--data-dir``, ``--download``,
``--verify``): the data sets the command takes and what it knows of each before reading it
(features and classes, training points, image shape), the checks of the data's folder before
any work (:func:`_check_data_dir`), and :func:`load`, the data set of a command's arguments,
whose loader's errors name their parameters as these flags (``DATA_FLAGS``). The loaders are
``datasets.py``'s. No equation of the paper is implemented here.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from .flags import _fail

if TYPE_CHECKING:
    import argparse

    from ..datasets import Dataset

#: the data sets of --dataset
DATASETS = ("digits", "mnist5k", "mnist", "fashion-mnist", "cifar10")
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
#: the data sets whose files --verify checks
VERIFIABLE = ("mnist", "fashion-mnist", "cifar10")
#: the flag of each data loader's parameter that its errors name (``datasets.MissingDataError``)
DATA_FLAGS = {"data_dir": "--data-dir", "download": "--download"}


def _downloadable():
    """The data sets whose loader fetches missing files (takes ``download``)."""
    import inspect

    from ..datasets import DATASETS as LOADERS

    return [n for n, load in LOADERS.items() if "download" in inspect.signature(load).parameters]


def _check_data_dir(args):
    """``--verify``, ``--download`` and the data's folder (``datasets.data_folder``: --data-dir,
    else $FENCHEL_DATA/<dataset>): a folder, or with --download one that can be created."""
    from ..datasets import MissingDataError, data_folder

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


def load(args: argparse.Namespace) -> Dataset:
    """The data set of ``args``; files missing from its folder are refused by ``--data-dir``,
    the loader's message naming its parameters as their flags (``DATA_FLAGS``)."""
    from .. import datasets

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
