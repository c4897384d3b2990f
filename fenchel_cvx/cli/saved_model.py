"""``fenchel-cvx evaluate`` and ``predict``: the commands that use a saved network, given as
a run folder, a ``model.npz`` inside one, or any ``model.npz`` (:func:`_model`).
:func:`evaluate` prints the loss per point and the accuracy of the network on a data set's test
or training split (the run's data set, folder and seed unless given). :func:`predict` writes the
network's output for the rows of a ``.npy`` or ``.csv`` file (``files.read_points``) as class
labels, class probabilities or the raw output, the feed-forward rule, after the run's recorded
preprocessing (``run.json``'s ``preprocessing``; ``--raw`` skips it). No equation of the paper
is implemented here.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from . import data_flags
from .data_flags import SHAPES, _check_data_dir
from .flags import _fail
from .run_folder import _remove_temporaries, _run_args

if TYPE_CHECKING:
    import argparse


def _model(flag, path):
    """The network of ``path`` (a run folder, or a model file) and the arguments of the run
    whose folder holds it (``{}`` for a model outside a run folder)."""
    from ..network import LiftedNetwork

    file = path / "model.npz" if path.is_dir() else path
    if not file.is_file():
        _fail(flag, f"{str(path)!r} is neither a model.npz nor a run folder holding one")
    try:
        net = LiftedNetwork.load(file)
    except ValueError as err:  # FileFormatError: named as the argument
        _fail(flag, str(err))
    return net, _run_args(file.parent) or {}


def evaluate(args: argparse.Namespace) -> int:
    from ..bcd import evaluate as evaluate_net
    from ..datasets import one_hot

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
    data = data_flags.load(args)
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
    from ..io import check_destination

    try:
        return check_destination(flag, path)
    except ValueError as err:
        _fail(flag, str(err).removeprefix(f"{flag} "))


def _preprocess(args, run, A):
    """``A`` with the run's recorded preprocessing applied (``run.json``'s ``preprocessing``;
    from its data set where an older run.json has none), said on standard error; as it is with
    ``--raw`` or for a model outside a run folder."""
    from ..datasets import PIXEL_SCALE

    scale = (run.get("preprocessing") or {}).get("divide_by", PIXEL_SCALE.get(run.get("dataset")))
    if args.raw or scale is None:
        return A
    print(
        f"fenchel-cvx predict: input divided by {scale:g}, the run's preprocessing (the "
        f"pixels of {run.get('dataset')} to [0, 1]); pass --raw if it is applied already",
        file=sys.stderr,
    )
    return A / scale


def predict(args: argparse.Namespace) -> int:
    import numpy as np

    from ..files import read_points

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

        from ..io import write_text

        buf = _io.StringIO()
        np.savetxt(buf, table, fmt=fmt, delimiter=",")
        write_text(args.out, buf.getvalue())
        print(f"wrote {len(table)} predictions to {args.out}")
    return 0
