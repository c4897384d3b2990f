"""``fenchel-cvx train`` and ``resume``: the checks across ``train``'s flags before any work
(:func:`_check_train`, the hyperparameters left unset filled with the training setting,
:func:`_fill_defaults`), the network of ``--arch`` and the block solver of ``--backend``, and
the run itself: ``bcd.fit_bcd`` on the data set, Algorithm 1 without ``--batch-size`` and
Algorithm 2 with it, checkpointing into the run folder that ``run_folder.py`` prepares, with
the banner and the summary of ``reports.py``. :func:`resume` continues a run from its
folder's ``run.json`` and ``checkpoint.npz``, to the same result as an uninterrupted run, and
says so where the run has ended and written its files.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import TYPE_CHECKING

from .. import defaults
from ..validation import check_rounds
from . import data_flags
from .data_flags import IMAGES, SHAPES, TRAIN_SIZES, _check_data_dir
from .flags import _fail
from .parser import build_parser
from .reports import _banner, _interrupted, _oracle_estimate, _summary
from .run_folder import (
    _before_settings,
    _check_out,
    _record,
    _remove_temporaries,
    _run_args,
    _start,
)

if TYPE_CHECKING:
    import argparse

LENET5_HIDDEN = defaults.LeNet5.n_hidden  # conv, conv, fc 120, fc 84
FAST_ONLY = ("max_iter", "w_steps", "x_steps", "newton_cap", "gram_reuse", "compile")
LARGE = 3000  # the oracle on more training points prints an estimate and suggests --backend fast


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
    _check_ranks(args)
    if args.compile:
        from ..fast.fused import compiler_problem

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


def _check_ranks(args):
    """``--nproc`` and a launch by torchrun (``WORLD_SIZE`` > 1): the fast backend, PyTorch,
    no recorded blocks, and not both."""
    import os

    nproc = getattr(args, "nproc", 1)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if nproc == 1 and world == 1:
        return
    flag = "--nproc" if nproc > 1 else "torchrun"
    if nproc > 1 and world > 1:
        _fail("--nproc", f"{nproc} under torchrun ({world} ranks): torchrun starts the ranks")
    if args.backend != "fast":
        _fail(flag, "needs --backend fast (the oracle runs on one process, with Dask workers)")
    if args.record_blocks:
        _fail("--record-blocks", f"records one process's blocks, not {max(nproc, world)} ranks'")
    import importlib.util

    if importlib.util.find_spec("torch") is None:  # (imported where the ranks join)
        _fail(flag, "needs PyTorch (torch.distributed): pip install torch")


def _ranks(args, stack):
    """``(fit, keywords, lead)``: what trains (``fit_bcd``, on this process or the torchrun
    rank it is; for ``--nproc``, ``parallel.Ranks.fit`` on ranks spawned now, which start
    while this process loads the data, and end with ``stack``), its keywords, and whether this
    process leads (prints and writes: one process, or rank 0)."""
    from ..bcd import fit_bcd
    from ..parallel import Ranks, comm_from_environment

    if getattr(args, "nproc", 1) > 1:
        return stack.enter_context(Ranks(args.nproc, args.threads, join=False)).fit, {}, True
    comm = comm_from_environment()
    if comm is None:
        return fit_bcd, {}, True
    return fit_bcd, {"comm": comm}, comm.rank == 0


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


def _threads(n):
    """``--threads``: each native pool limited by library as the fast backend's solves are
    (``threads.plan``: SciPy's one, every other pool n; two pools of two threads each
    oversubscribe two cores)."""
    from ..threads import limit_threads

    return limit_threads(n)


def _network(args, data):
    """The network of ``--arch`` (default <features>-32-<classes>) and its label for the banner."""
    from ..network import LiftedNetwork, lenet5

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
    from ..fast import FastBackend

    given = {k: getattr(args, k) for k in FAST_ONLY if getattr(args, k) is not None}
    return FastBackend(tol=args.tol, threads=args.threads, **given)


def _recording(args, net):
    """``--backend``, wrapped with ``--record-blocks`` in a ``RecordingBackend`` (the oracle
    given ``--tol`` and ``--no-strict`` as ``fit_bcd`` gives them)."""
    backend = _backend(args)
    if not args.record_blocks:
        return backend
    from ..recorded_blocks import RecordingBackend

    if not isinstance(backend, str):
        return RecordingBackend(backend, net)
    strict = dict(strict=False) if args.strict is False else {}
    return RecordingBackend(backend, net, tol=args.tol, **strict)


def _rounds(args, m):
    """The rounds of the run of ``args`` on ``m`` training points."""
    if args.batch_size is None:
        return args.iterations
    return args.epochs * args.alternations * (-(-m // args.batch_size))


def train(args: argparse.Namespace, resume: bool = False) -> int:
    """``fenchel-cvx train`` (and, ``resume``, the rest of a run); its last line names every
    file it wrote."""
    from ..io import recording_writes

    with recording_writes() as written, contextlib.ExitStack() as stack:
        return _train(args, resume, written, stack)


def _train(args, resume, written, stack):
    from .. import datasets

    t0 = time.perf_counter()
    _check_train(args)
    fit, ranks, lead = _ranks(args, stack)
    new = not resume and not (args.out is not None and args.out.exists())
    if "comm" in ranks:  # torchrun's ranks write into rank 0's folder
        out = _shared_folder(_start(args, resume) if lead else None, ranks["comm"])
    else:
        out = _start(args, resume)
    try:
        data = data_flags.load(args)
        net, arch = _network(args, data)
    except BaseException:  # a run that fails on its data leaves no folder it created
        if lead and new and out.is_dir() and not any(out.iterdir()):
            out.rmdir()
        raise
    if not resume and lead:
        _record(args, out)
    X, y = data.X_train[:, : args.train_size], data.y_train[: args.train_size]
    X, X_test = X.astype(args.dtype, copy=False), data.X_test.astype(args.dtype, copy=False)
    Y, Y_test = datasets.one_hot(y, data.n_classes), datasets.one_hot(data.y_test, data.n_classes)
    total = _rounds(args, X.shape[1])
    callback = None
    if args.backend == "cvxpy" and X.shape[1] > LARGE:
        callback = _oracle_estimate(total, X.shape[1])
    if lead:
        _banner(args, resume, X.shape[1], X_test.shape[1], arch, out)
    backend = _recording(args, net)
    try:  # fit_bcd checkpoints on Ctrl-C; before it starts there is nothing to save
        res = fit(
            net,
            X,
            Y,
            batch_size=args.batch_size,
            epochs=args.epochs,
            iterations=args.iterations,
            alternations=args.alternations,
            gamma=args.gamma,
            momentum=args.momentum,
            backend=backend,
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
            **ranks,
        )
    except KeyboardInterrupt:
        return _interrupted(out, total) if lead else 130
    stack.close()  # (--nproc's ranks end with the training, before the summary)
    if not lead:  # (rank 0 writes the run's files)
        return 0
    if args.record_blocks:
        from ..recorded_blocks import FILE

        backend.save(out / FILE)
    res.history.config.update(dataset=args.dataset, train_size=int(X.shape[1]))
    _summary(args, net, res.history, out, (X, y), (X_test, data.y_test), t0, written)
    return 0


def _shared_folder(out, comm):
    """Rank 0's run folder, on every rank (``out``: rank 0's; None elsewhere)."""
    import numpy as np

    mine = np.frombuffer(str(out or "").encode(), np.uint8)
    return Path(bytes(comm.all_gather(mine)[0]).decode())


def resume(args: argparse.Namespace) -> int:
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
    from ..checkpoints import checkpoint_meta
    from ..io import RUN_FILES

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
