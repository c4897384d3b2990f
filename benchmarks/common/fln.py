"""FLN's timed training on a benchmark's batches: Algorithm 2 of the paper through ``fit_bcd``.

``fln_backend`` is the benchmarks' fast backend; ``train_fln`` times training alone (evaluation
excluded) and records the test accuracy at checkpoints and after every epoch, the certificate
over the run (``certificate_summary``) and the host reads of one unchecked batch
(``host_reads``: what a GPU would wait for); ``warm_up`` compiles the kernels before the clock.
On P ranks (``--nproc P`` or a launch ``fln:rP``, P > 1) FLN trains on P ranks of this machine
(``parallel.Ranks``: started, and their kernels compiled by the warm-up, before the clock; each
run's data reaches the ranks within it, through shared memory: ``rank_arrays``), timed on rank 0,
this process. With ``--group gloo|nccl`` (one rank) it trains through a process group of this
process alone (``parallel.one_rank_group``), every reduction a collective: their count and
seconds per batch are printed and returned (``group_gathers_per_batch``,
``group_ms_per_batch``).
"""

import contextlib
import copy
import functools
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from fenchel_cvx.fast.torch_comm import CLOCK
from fenchel_cvx.parallel import one_rank_group, ranks_for


def fln_backend(args, **options):
    """FLN's ``FastBackend`` for both benchmarks (``options``: more of its settings).
    capped_residual=False, capped_value=False: a capped block evaluates neither its final
    residual nor its value (reported NaN; the certificate recomputes both on its checked
    rounds): one gradient, or LeNet-5's map and adjoint, and a pass over the block's arrays
    less per block. ``threads``: the backend's budget, which ``fit_bcd`` applies over the whole
    run (the default, 1, would override ``--threads``)."""
    from fenchel_cvx.fast import FastBackend

    options = {"compile": getattr(args, "compile", "auto"), **options}  # --compile unless given
    return FastBackend(
        w_steps=args.w_steps,
        x_steps=args.x_steps,
        gram_reuse=args.gram_reuse,
        capped_residual=False,
        capped_value=False,
        threads=args.threads,
        **options,
    )


def fit_settings(args):
    """``fit_bcd``'s per-run settings from the flags: gamma, momentum (one number for all
    layers, or the list) and the X-sweep's order (``mnist_deep``'s plans set it; default the
    paper's backward sweep)."""
    return dict(
        gamma=one_or_all(args.gamma),
        momentum=one_or_all(args.momentum),
        x_sweep=getattr(args, "x_sweep", "backward"),
    )


def one_or_all(values):
    """A per-layer flag's values as ``fit_bcd`` takes them: one number for all, or the list."""
    return values[0] if len(values) == 1 else values


def train_fln(
    args,
    net,
    X,
    Y,
    test_accuracy,
    batches,
    backend,
    due=None,
    announce=(),
    epoch_accuracy=None,
    epoch_end=None,
    epoch_report=None,
    sync=lambda: None,
    relaxation=False,
):
    """``fit_bcd`` on the schedule ``batches``, timing training only: ``test_accuracy()`` after
    the batches where ``due(seen)`` (default: every ``args.eval_every``) and every epoch's end,
    evaluation time excluded; a line printed after each epoch and each batch in ``announce``.
    ``epoch_accuracy()``, if given, is the accuracy recorded after every epoch instead (another
    prediction rule; the checkpoints keep ``test_accuracy``); ``epoch_end(epoch)``, if given,
    runs after every epoch but the last (a schedule), outside the timed training.
    ``epoch_report()``, if given, returns a dict of diagnostics after every epoch (untimed),
    printed and returned as ``epoch_reports``. ``sync()`` waits for the device before each clock
    read (a GPU's work is asynchronous). ``relaxation``: also return ``relaxation_log(history)``."""
    from fenchel_cvx.bcd import fit_bcd

    per_epoch = len(batches[0])
    due = due or (lambda seen: seen % args.eval_every == 0)
    state = dict(eval=0.0, t0=time.perf_counter(), ckpt=[], acc=[], sec=[], lam=[], reports=[])

    def callback(net_, rec):
        if rec["alternation"] != args.alternations:  # a batch ends with its last round
            return
        sync()
        t = time.perf_counter()
        train_s = t - state["t0"] - state["eval"]
        seen = (rec["epoch"] - 1) * per_epoch + rec["batch"]
        if due(seen) or rec["batch"] == per_epoch:
            acc = test_accuracy()
            state["ckpt"].append((seen, train_s, acc))
            if seen in announce:
                print(f"  fln batch {seen}: test accuracy {acc:.4f}, {train_s:.1f} s", flush=True)
            if rec["batch"] == per_epoch:
                if epoch_accuracy is not None:
                    print(
                        f"  fln epoch {rec['epoch']}: feed-forward test accuracy {acc:.4f}",
                        flush=True,
                    )
                    acc = epoch_accuracy()
                state["acc"].append(acc)
                state["sec"].append(train_s)
                state["lam"].append([float(lam) for lam in net.lam])
                print(
                    f"  fln epoch {rec['epoch']}: test accuracy {acc:.4f}, {train_s:.1f} s",
                    flush=True,
                )
                if epoch_report is not None:
                    state["reports"].append(epoch_report())
                    print(f"  fln epoch {rec['epoch']}: {state['reports'][-1]}", flush=True)
                if epoch_end is not None and rec["epoch"] < args.epochs:
                    epoch_end(rec["epoch"])
        sync()
        state["eval"] += time.perf_counter() - t

    acc0 = test_accuracy()
    reads = None
    if args.alternations == 1:  # one round a batch: the count's round is a batch
        reads = host_reads(
            net,
            X,
            Y,
            backend,
            args.batch_size,
            **fit_settings(args),
        )
    if reads is not None:
        print(f"  fln: {reads_text(reads.total, reads.by_function())}", flush=True)
    group = getattr(args, "group", None)
    with ranks_for(getattr(args, "nproc", 1), args.threads) as ranks, _group(group) as comm:
        fit = fit_bcd if ranks is None else ranks.fit
        if comm is not None:  # (one rank, through its process group)
            fit = functools.partial(fit_bcd, comm=comm)
        compile_s = (
            warm_up(args, net, X, Y, backend, sync, fit) if backend.kernels.compiled else None
        )
        sync()
        gathers, gather_s = CLOCK.gathers, CLOCK.seconds
        state["t0"] = time.perf_counter()
        hist = _timed(fit, args, net, X, Y, backend, callback)
        gathers, gather_s = CLOCK.gathers - gathers, CLOCK.seconds - gather_s
    cert = certificate_summary(hist)
    out = dict(
        initial_test_accuracy=acc0,
        test_accuracy=state["acc"],
        seconds=state["sec"],
        checkpoints=state["ckpt"],
        certificate=cert,
        lam_per_epoch=state["lam"],
        compile_seconds=compile_s,
        host_reads_per_batch=None if reads is None else reads.total,
        host_reads_by_source=None if reads is None else reads.by_function(),
        round_seconds=[r["seconds"] for r in hist],  # (each round's, on the host's clock)
    )
    if group is not None:
        batches_run = len(hist.records)
        out["group"] = group
        out["group_gathers_per_batch"] = gathers / batches_run
        out["group_ms_per_batch"] = 1e3 * gather_s / batches_run
        print(
            f"  fln through a one-rank {group} group: {gathers / batches_run:.1f} collectives "
            f"a batch, {1e3 * gather_s / batches_run:.2f} ms a batch in them",
            flush=True,
        )
    if epoch_report is not None:
        out["epoch_reports"] = state["reports"]
    if relaxation:
        out["relaxation"] = relaxation_log(hist)
    return out


def _group(backend):
    """A context manager: the communicator of a process group of this process alone on
    ``backend`` (``parallel.one_rank_group``), or None where ``backend`` is None."""
    return contextlib.nullcontext() if backend is None else one_rank_group(backend)


def _timed(fit, args, net, X, Y, backend, callback):
    """The timed run: ``fit`` (``fit_bcd``, or ``Ranks.fit``) of the run's settings; its history."""
    schedule = dict(batch_size=args.batch_size, epochs=args.epochs, alternations=args.alternations)
    progress = not getattr(args, "no_progress", True)
    return fit(
        net, X, Y, backend=backend, strict=False, callback=callback, eval_every=None,
        check_every=args.check_every, progress=progress, **schedule, **fit_settings(args),
    ).history  # fmt: skip


def relaxation_log(hist):
    """Per checked round of an FLN run: its epoch and batch, each layer's divergence B_l after
    the X-sweep (``divergence_x``) and the relaxation gap ``J - F`` (``network_x - lifted_x``:
    the network objective above its lifted lower bound, eqs. (3) and (7), on the round's batch)."""
    return [
        dict(
            epoch=r["epoch"],
            batch=r["batch"],
            divergences=list(r["divergence_x"]),
            gap=r["network_x"] - r["lifted_x"],
        )
        for r in hist
        if r["checked"] and r["network_x"] is not None
    ]


def host_reads(net, X, Y, backend, batch_size, flops=None, **fit_args):
    """The host reads of one unchecked batch of a run's setting, one round a batch
    (``fast.reads.unchecked_batch``: a copy of ``net`` trained two batches on the first three of
    the data as ``array_api_strict`` arrays, which stand in for a GPU's library, where each read
    is a wait for the device; the backend's eager twin, ``FastBackend.options``). ``flops``: a
    ``fast.reads.ProductFlops`` that counts the same batch's products. ``fit_args`` go to
    ``fit_bcd``. -> a ``HostReads`` (``total``, ``by_function()``), or None where
    array_api_strict is not installed (the ``test`` extra), the data hold fewer than three
    batches, or ``backend`` is not a ``FastBackend`` itself (a wrapper's own reads would be
    left out)."""
    from fenchel_cvx.fast import FastBackend

    try:
        import array_api_strict as xps
    except ImportError:
        return None
    if X.shape[1] < 3 * batch_size or type(backend) is not FastBackend:
        return None
    from fenchel_cvx.arrays import to_numpy
    from fenchel_cvx.fast.reads import unchecked_batch

    strict = lambda A: xps.asarray(to_numpy(A))  # noqa: E731
    m = 3 * batch_size
    net = copy.deepcopy(net)
    net.W = [strict(W) for W in net.W]
    eager = FastBackend(**{**backend.options(), "compile": False})
    return unchecked_batch(
        net, strict(X[:, :m]), strict(Y[:, :m]), eager, batch_size, flops=flops, **fit_args
    )


def reads_text(total, by_source):
    """FLN's host reads per unchecked batch in words (``host_reads``' ``total`` and
    ``by_function()``): ``"1 host read per unchecked batch (array_api_strict, ...: 1)"``."""
    sources = ", ".join(f"{k.removeprefix('fenchel_cvx.')} {v}" for k, v in by_source.items())
    return (
        f"{total} host read{'s' * (total != 1)} per unchecked batch "
        f"(array_api_strict, what a GPU waits for{': ' + sources if sources else ''})"
    )


def warm_up(args, net, X, Y, backend, sync=lambda: None, fit=None):
    """Compile FLN's kernels before the clock starts: two batches of the run's setting on a copy
    of the network, an unchecked round and a checked one (the last), so that every process has
    compiled and grown its heap for both kinds of round, as ``host_reads`` leaves this process
    (the run that follows starts without its Gram factors, as ``fit_bcd`` drops a backend's
    factors at a run's start: the same run as without it).
    -> its seconds, the compile's cost (printed), or None where no kernel compiled (every chain
    below ``fused.MIN_SIZE`` under ``compile="auto"``). ``fit``: where the run trains
    (``fit_bcd``, the default, or ``Ranks.fit``: every rank compiles its own)."""
    from fenchel_cvx.bcd import fit_bcd
    from fenchel_cvx.fast.fused import compiled_graphs

    t0, graphs = time.perf_counter(), compiled_graphs()
    (fit or fit_bcd)(
        copy.deepcopy(net),
        X[:, : 2 * args.batch_size],
        Y[:, : 2 * args.batch_size],
        batch_size=args.batch_size,
        backend=backend,
        strict=False,
        eval_every=None,
        check_every=2,
        **fit_settings(args),
    )
    sync()
    seconds = time.perf_counter() - t0
    if compiled_graphs() == graphs:
        print(
            f"  fln: no kernel compiled (its chains run eagerly: below fused.MIN_SIZE); the "
            f"warm-up batches took {seconds:.1f} s",
            flush=True,
        )
        return None
    print(
        f"  fln: compiled its kernels on two batches in {seconds:.1f} s (before the clock)",
        flush=True,
    )
    return seconds


def certificate_summary(hist):
    """The certificate over an FLN run's history: rounds, checked rounds, violations by check."""
    # inexact blocks (w_steps, x_steps) are block_optimality violations by design; the checks
    # that certify the method are the other three, on the rounds where they ran
    checked = [r for r in hist if r["checked"]]
    broken = [
        v
        for r in checked
        for v in r["certificate"]["violations"]
        if v["check"] != "block_optimality"
    ]
    cert = dict(
        rounds=len(hist),
        checked=len(checked),
        violations=len(broken),
        by_check=sorted({v["check"] for v in broken}),
        min_bound_gap=min(r["certificate"]["bound_gap"] for r in checked),
    )
    print(f"  fln certificate: {cert}", flush=True)
    return cert


def matmul_share(script):
    """Share of FLN's ``fit_bcd`` samples inside gemm / matmul frames: ``script`` (a benchmark's
    file) run again under py-spy (native frames) with this process's flags, FLN only.
    -> ``(share, note)``; ``(None, why)`` where py-spy is not installed."""
    spy = shutil.which("py-spy") or shutil.which("py-spy", path=str(Path(sys.executable).parent))
    if spy is None:
        return None, "py-spy not installed (pip install py-spy)"
    argv = [a for a in sys.argv[1:] if a != "--profile"]
    with tempfile.TemporaryDirectory() as tmp:
        raw = Path(tmp) / "prof.txt"
        subprocess.run(
            [
                spy,
                "record",
                "--native",
                "--subprocesses",
                "-r",
                "100",
                "-f",
                "raw",
                "-o",
                str(raw),
                "--",
                sys.executable,
                script,
                *argv,
                "--methods",
                "fln",
                "--out",
                tmp,
            ],
            check=True,
            capture_output=True,
        )
        fit = hit = 0
        for line in raw.read_text().splitlines():
            stack, _, count = line.rpartition(" ")
            if "fit_bcd" in stack:
                fit += int(count)
                hit += int(count) * any(k in stack for k in ("gemm", "matmul"))
    return (hit / fit if fit else None), f"{fit} py-spy samples inside fit_bcd"
