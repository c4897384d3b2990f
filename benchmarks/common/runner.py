"""Each benchmark method in a process of its own, and the backprop baselines.

``run_methods`` runs ``(method, args)`` tasks, at most ``jobs`` at once, each in a fresh process
(its peak memory its own, forked from a server that has imported the libraries once): a run
that fails or dies stops the others at once and names itself. ``method_tasks`` lists a run's
tasks (launches of ``--methods`` x seeds); ``run_backprop`` trains a baseline in PyTorch
(``fenchel_cvx.baselines.train_backprop``) on the benchmark's batches, under DDP on the launch's
ranks (``parallel.Ranks.run``) where it has more than one.
"""

import argparse
import multiprocessing as mp
import multiprocessing.connection
import resource
import signal
import sys
import threading
import time
import traceback
from functools import partial

from common.devices import DEVICES
from common.flags import baseline_options
from fenchel_cvx.datasets import batch_order
from fenchel_cvx.heap import keep_freed_memory
from fenchel_cvx.parallel import ranks_for
from fenchel_cvx.threads import limit_threads


def backprop_record(r, per_epoch):
    """A ``BackpropResult`` as the report's record; every epoch's end is a checkpoint."""
    ckpt = list(r.checkpoints)
    for e, (acc, sec) in enumerate(zip(r.test_accuracy, r.seconds), start=1):
        if all(c[0] != e * per_epoch for c in ckpt):
            ckpt.append((e * per_epoch, sec, acc))
    return dict(
        initial_test_accuracy=r.initial_test_accuracy,
        test_accuracy=r.test_accuracy,
        seconds=r.seconds,
        checkpoints=sorted(ckpt),
    )


def method_tasks(args):
    """``(label, args)`` for every launch of ``--methods`` (``flags.launches``: its label as
    given, ``args.method`` its method, ``args.nproc`` and ``args.threads`` its own) and every
    seed of ``--seed``, ``--seeds``, in that order (the tasks of ``run_methods``)."""
    return [
        (
            label,
            argparse.Namespace(
                **{**vars(args), "seed": seed, "method": method, "nproc": nproc, "threads": threads}
            ),
        )
        for label, (method, nproc, threads) in args.launches.items()
        for seed in range(args.seed, args.seed + args.seeds)
    ]


def run_backprop(args, ds, batches, optimizer, model, **options):
    """A backprop baseline (``optimizer``: "sgd" or "adam") of ``model`` (a lifted network or
    the layer sizes) in PyTorch, on the benchmark's ``batches``, at the flags' learning rate,
    seed, threads and device; ``options`` go to ``train_backprop`` (an ``lr`` there replaces the
    flags' rate and momentum). -> its record (``backprop_record``), with a line printed after
    every epoch. With ``args.nproc`` > 1: under DDP on that many ranks of ``args.threads``
    threads (started before, and not counted in, its training seconds)."""
    from fenchel_cvx.baselines import train_backprop

    rates = {} if "lr" in options else baseline_options(args, optimizer)
    settings = dict(
        batches=batches,
        optimizer=optimizer,
        **rates,
        seed=args.seed,
        threads=args.threads,
        eval_every=args.eval_every,
        device=DEVICES[getattr(args, "device", "cpu")].torch,
        callback=lambda e, res: print(
            f"  {optimizer} epoch {e}: test accuracy {res.test_accuracy[-1]:.4f}, "
            f"{res.seconds[-1]:.1f} s",
            flush=True,
        ),
        **options,
    )
    with ranks_for(getattr(args, "nproc", 1), args.threads) as ranks:
        train = train_backprop if ranks is None else partial(ranks.run, train_backprop)
        r = train(model, ds.X_train, ds.y_train, ds.X_test, ds.y_test, **settings)
    return backprop_record(r, len(batches[0]))


def run_one(label, args, load, run_fln=None, run_backprop=None):
    """One launch in this (the run's own) process: ``load(args)`` -> ``(ds, desc)``, then
    ``run_fln(args, ds, batches)`` or ``run_backprop(args, ds, batches, optimizer)`` on the
    run's ``batch_order``, timed, with its peak memory (host and GPU; rank 0's), seed and launch
    (``label``, a launch of ``--methods``; ``args.method`` its method, else the label)."""
    print(f"{label}, seed {args.seed}: started", flush=True)
    method = getattr(args, "method", label)
    keep_freed_memory()  # every method's temporaries reuse the heap (``fenchel_cvx.heap``)
    with limit_threads(args.threads):
        ds, _ = load(args)
        batches = batch_order(ds.X_train.shape[1], args.batch_size, args.epochs, seed=args.seed)
        t = time.perf_counter()
        out = (
            run_fln(args, ds, batches)
            if method == "fln"
            else run_backprop(args, ds, batches, method)
        )
        out["wall"] = time.perf_counter() - t
    out["peak_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    out["peak_gpu_mib"] = DEVICES[getattr(args, "device", "cpu")].gpu_peak_mib(method)
    out["seed"] = args.seed
    out["launch"] = dict(
        label=label, method=method, nproc=getattr(args, "nproc", 1), threads=args.threads
    )
    return out


def _send(conn, method, args, hooks):
    """``run_one`` in the run's own process; its result or traceback goes back through ``conn``."""
    try:
        conn.send(("result", run_one(method, args, **hooks)))
    except BaseException:
        conn.send(("error", traceback.format_exc()))
    finally:
        conn.close()


#: what the server that forks each run's process imports once, so that a run's process starts
#: with it imported (``mnist_deep.py --quick``, 20 runs: 58 s against 77 s spawned, on a 2-core
#: VM): what every method imports, so that a method's peak memory counts no library it does not
#: use (the backprop baselines import PyTorch themselves); nothing is run there (no BLAS thread
#: pool used, no device touched)
PRELOAD = ["numpy", "scipy.linalg", "scipy.optimize", "fenchel_cvx.fast", "fenchel_cvx.datasets"]


def run_methods(tasks, jobs=1, on_result=None, **hooks):
    """``run_one(method, args, **hooks)`` for each ``(method, args)`` of ``tasks``, each in a
    fresh process (its peak memory its own) forked from a server that has imported ``PRELOAD``
    (``multiprocessing``'s forkserver), at most ``jobs`` at once, started in the order given:
    their results, in that order. ``on_result(i, result)`` as each one arrives (``tasks[i]``'s),
    so that a long benchmark can keep what it has.

    A run that raises, or whose process dies without a result (killed by the OS for memory),
    stops the others at once and raises a ``RuntimeError`` naming the method and seed. Ctrl-C
    and SIGTERM (``kill``, ``pkill``) stop them too, instead of leaving them running."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)  # (where the server is not running yet)
    results, waiting, running = [None] * len(tasks), list(enumerate(tasks)), {}
    previous = _sigterm_as_exit()
    try:
        while waiting or running:
            while waiting and len(running) < jobs:
                i, (method, args) = waiting.pop(0)
                recv, send = ctx.Pipe(duplex=False)
                # (not daemonic: a method may start processes of its own, FLN's --nproc ranks;
                # the ``finally`` below stops it where the run ends early)
                proc = ctx.Process(target=_send, args=(send, method, args, hooks))
                proc.start()
                send.close()  # the child's copy is the only writer: its death is EOF here
                running[recv] = (i, proc, f"{method}, seed {args.seed}")
            for recv in mp.connection.wait(list(running)):
                i, proc, name = running[recv]
                try:
                    kind, value = recv.recv()
                except EOFError:  # the process ended without sending anything
                    kind, value = "died", None
                proc.join()
                del running[recv]
                recv.close()
                if kind == "died":
                    code = proc.exitcode
                    how = (
                        f"was killed by signal {-code}"
                        if code < 0
                        else f"ended with exit code {code}"
                    )
                    raise RuntimeError(
                        f"{name}: its process {how} without a result (out of memory?)"
                    )
                if kind == "error":
                    raise RuntimeError(f"{name} failed:\n{value}")
                results[i] = value
                if on_result is not None:
                    on_result(i, value)
    finally:
        for recv, (_, proc, _) in running.items():
            proc.terminate()
            proc.join(5)
            if proc.is_alive():
                proc.kill()
                proc.join()
            recv.close()
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    return results


def _sigterm_as_exit():
    """Make SIGTERM raise ``SystemExit`` (in the main thread), so that ``run_methods``'s cleanup
    runs: its default action ends the process at once and leaves the runs' processes orphaned,
    each still holding a core. Returns the handler it replaced (None: not the main thread)."""
    if threading.current_thread() is not threading.main_thread():
        return None
    return signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
