"""What ``fenchel-cvx train`` and ``resume`` print around a run: the banner (data, network,
algorithm, backend, output folder), the oracle's estimate of the run's time after its first
round on many points, the Ctrl-C message (where the state is saved and how to resume), and the
summary that writes ``history.json``, ``model.npz`` and the two plots, then prints the
accuracies, the lifted objective (eq. (7)) against the network objective (eq. (3)) at the last
X-sweep, the certificate's verdict and every file the run wrote.
"""

import sys
import time


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


def _ranks_and_threads(args):
    """``"2 thread(s)"``, or on ranks ``"2 ranks x 1 thread(s)"`` (``--nproc``, torchrun)."""
    import os

    ranks = max(getattr(args, "nproc", 1), int(os.environ.get("WORLD_SIZE", "1")))
    return f"{ranks} ranks x {args.threads} thread(s)" if ranks > 1 else f"{args.threads} thread(s)"


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
        f"{_ranks_and_threads(args)}; "
        f"output {out}",
        flush=True,
    )


def _interrupted(out, total):
    """Ctrl-C: say where the state is and how to resume (exit status 130)."""
    from ..checkpoints import load_checkpoint

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
    from ..plotting import plot_accuracy, plot_objectives

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
