"""The flags the training benchmarks share, their parsers and their checks.

Every check names the flag and the value (``p.error``), before any work: the per-layer lists
(``per_layer``), the learning-rate grids (``learning_rates``), the baselines' rates
(``add_baseline_flags``, ``baseline_rates``), the compile switch (``add_compile_flag``) and the
run's schedule (``add_run_flags``, ``check_run_flags``).
"""

import argparse
import re

import numpy as np

from common.devices import DEVICES

#: the paper's learning rates of the baselines (its appendix: picked from 1e-1 .. 1e-4 on the
#: test set); "sgd_momentum" in a benchmark's ``TUNED_LR``: SGD with momentum TUNED_MOMENTUM
PAPER_LR = {"sgd": 1e-2, "adam": 1e-3}
TUNED_MOMENTUM = 0.9
METHODS = ("fln", "adam", "sgd")
#: a method of ``--methods`` with its launch: ``NAME`` (the run's ``--threads``, ``--nproc``),
#: ``NAME:tT`` (T threads), ``NAME:rP`` (P ranks), ``NAME:rPtT`` (P ranks of T threads each)
LAUNCH = re.compile(r"([a-z]+)(?::(?=.)(?:r(\d+))?(?:t(\d+))?)?")
#: the run flags that take integers >= 1
COUNTS = (
    "epochs",
    "batch_size",
    "threads",
    "eval_every",
    "check_every",
    "alternations",
    "seeds",
    "jobs",
    "nproc",
)


def add_run_flags(p, out, epochs=10, epochs_help=None):
    """The schedule and the machine of a training benchmark: ``--epochs``, ``--batch-size``,
    ``--threads``, ``--nproc``, ``--methods``, ``--jobs``, ``--alternations``, ``--check-every``,
    ``--dtype``, ``--device``, ``--eval-every``, ``--seed``, ``--seeds``, ``--quick`` and
    ``--out`` (default ``out``), with ``--compile``; ``epochs_help`` says what the default
    ``epochs`` means."""
    p.add_argument("--epochs", type=int, default=epochs, help=epochs_help or f"default {epochs}")
    p.add_argument("--batch-size", type=int, default=500)
    p.add_argument(
        "--threads",
        type=int,
        default=1,
        help="cores per method: NumPy's BLAS and PyTorch get them all, SciPy's BLAS one "
        "(fenchel_cvx.threads.plan); 1 is fastest on a shared machine (docs page Results)",
    )
    p.add_argument(
        "--nproc",
        type=int,
        default=1,
        help="every method's ranks, each with its share of every batch and --threads cores: "
        "FLN on fenchel_cvx.parallel.Ranks, SGD and Adam under PyTorch DDP (default 1: one "
        "process)",
    )
    p.add_argument(
        "--methods",
        default=",".join(METHODS),
        help="a comma list of fln, adam, sgd, each with its own launch where given: NAME:tT "
        "(T threads), NAME:rP (P ranks), NAME:rPtT (e.g. fln:r2t1,adam:t1,adam:t2,adam:r2t1: "
        "every launch in one run, on the same machine)",
    )
    p.add_argument(
        "--jobs",
        type=int,
        default=1,
        help="methods (and seeds) run at once, each in its own process on --threads cores "
        "(default 1: one after another, timings free of each other)",
    )
    p.add_argument("--alternations", type=int, default=1, help="FLN rounds per batch (K)")
    p.add_argument(
        "--check-every",
        type=int,
        default=20,
        help="FLN rounds between full certificate checks (block statuses: every round)",
    )
    p.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    p.add_argument(
        "--device",
        default="cpu",
        choices=sorted(DEVICES),
        help="where the methods run: the CPU, or a GPU (cupy: FLN in CuPy, the baselines in "
        "PyTorch on CUDA; torch: every method in PyTorch on CUDA)",
    )
    p.add_argument("--eval-every", type=int, default=20, help="batches between test evaluations")
    p.add_argument("--seed", type=int, default=0, help="the first seed")
    p.add_argument(
        "--seeds",
        type=int,
        default=1,
        help="run seeds seed..seed+N-1; report means and the final accuracy's spread (max - min)",
    )
    p.add_argument("--quick", action="store_true", help="embedded 5k MNIST, 2 epochs: a smoke run")
    p.add_argument("--out", default=None if out is None else str(out))
    add_compile_flag(p)


def check_run_flags(p, args, counts=COUNTS):
    """``p.error`` naming the flag: a count below 1, an unknown method or a malformed launch
    (``launches``), ranks off the CPU, a device that cannot run the methods,
    ``--compile-blocks`` off ``--device torch``. ``--quick`` caps the epochs at 2."""
    check_counts(p, args, counts)
    args.launches = launches(p, args)
    ranked = [label for label, (_, nproc, _) in args.launches.items() if nproc > 1]
    if ranked and args.device != "cpu":
        p.error(
            f"--methods {','.join(ranked)}: ranks run on the CPU (gloo), got --device {args.device}"
        )
    missing = DEVICES[args.device].missing(method_names(args))
    if missing:
        p.error(missing)
    check_compile(p, args)
    if args.quick and args.epochs is not None:
        args.epochs = min(args.epochs, 2)


def launches(p, args):
    """``--methods`` as ``{label: (method, nproc, threads)}`` (``LAUNCH``: a launch's own
    ranks and threads, else ``--nproc`` and ``--threads``); ``p.error`` naming the flag: an
    unknown method, a malformed or repeated launch, a count below 1."""
    out = {}
    for label in args.methods.split(","):
        match = LAUNCH.fullmatch(label)
        if match is None or match[1] not in METHODS:
            p.error(
                f"--methods must name {', '.join(METHODS)}, each as NAME, NAME:tT, NAME:rP or "
                f"NAME:rPtT; got {label!r}"
            )
        if label in out:
            p.error(f"--methods names {label!r} twice")
        nproc = args.nproc if match[2] is None else int(match[2])
        threads = args.threads if match[3] is None else int(match[3])
        if min(nproc, threads) < 1:
            p.error(f"--methods {label!r}: ranks and threads must be >= 1")
        out[label] = (match[1], nproc, threads)
    return out


def method_names(args):
    """The methods of ``--methods``, without their launches (``check_run_flags`` parsed them)."""
    return sorted({method for method, _, _ in args.launches.values()})


def check_counts(p, args, names):
    """``p.error`` naming the flag where one of ``names`` (given, not None) is below 1."""
    for name in names:
        value = getattr(args, name, None)
        if value is not None and value < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, got {value}")


def add_baseline_flags(p, tuned):
    """The baselines' flags: ``--sgd-lr``, ``--adam-lr`` (default: ``tuned``, the rates chosen
    on the validation split), ``--sgd-momentum`` and ``--paper-lr``."""
    p.add_argument(
        "--sgd-lr",
        type=float,
        default=None,
        help="SGD's learning rate (default: "
        f"the choice on the MNIST validation split, {tuned['sgd']:g} without momentum, "
        f"{tuned['sgd_momentum']:g} with --sgd-momentum {TUNED_MOMENTUM:g}; with "
        f"--paper-lr the paper's {PAPER_LR['sgd']:g})",
    )
    p.add_argument(
        "--adam-lr",
        type=float,
        default=None,
        help="Adam's learning rate (default: "
        f"the choice on the MNIST validation split, {tuned['adam']:g}; with --paper-lr the "
        f"paper's {PAPER_LR['adam']:g})",
    )
    p.add_argument(
        "--sgd-momentum",
        type=float,
        default=0.0,
        help="SGD's heavy-ball momentum "
        f"in [0, 1) (0: plain SGD, the paper's; {TUNED_MOMENTUM:g} has a tuned rate)",
    )
    p.add_argument(
        "--paper-lr",
        action="store_true",
        help="the paper's learning rates "
        f"(SGD {PAPER_LR['sgd']:g}, Adam {PAPER_LR['adam']:g}) instead of the tuned ones",
    )


def baseline_rates(p, args, tuned):
    """Check the baselines' flags (``p.error`` names the flag) and fill in ``args.sgd_lr`` and
    ``args.adam_lr`` from ``tuned`` (None: no tuned rates, the paper's);
    ``args.learning_rates`` records the paper's, the tuned and the used ones."""
    for name in ("sgd_lr", "adam_lr"):
        value = getattr(args, name)
        if value is not None and (not np.isfinite(value) or value <= 0):
            p.error(f"--{name.replace('_', '-')} must be > 0, got {value}")
    if not 0 <= args.sgd_momentum < 1:
        p.error(f"--sgd-momentum must be in [0, 1), got {args.sgd_momentum}")
    paper = args.paper_lr or tuned is None
    sgd_key = {0.0: "sgd", **({} if paper else {TUNED_MOMENTUM: "sgd_momentum"})}.get(
        args.sgd_momentum
    )
    if args.sgd_lr is None and sgd_key is None and "sgd" in method_names(args):
        p.error(
            f"--sgd-momentum {args.sgd_momentum} has no {'paper' if paper else 'tuned'} "
            "learning rate: give --sgd-lr"
        )
    source = PAPER_LR if paper else {"sgd": tuned.get(sgd_key), "adam": tuned["adam"]}
    args.sgd_lr = source["sgd"] if args.sgd_lr is None else args.sgd_lr
    args.adam_lr = source["adam"] if args.adam_lr is None else args.adam_lr
    args.learning_rates = dict(
        paper=PAPER_LR,
        tuned=tuned and dict(tuned, momentum=TUNED_MOMENTUM),
        used=dict(sgd=args.sgd_lr, sgd_momentum=args.sgd_momentum, adam=args.adam_lr),
    )


def rates_text(settings):
    """The baselines' learning rates of a run, for its report's header."""
    rates = settings["learning_rates"]
    return (
        f"Baselines: SGD lr {rates['used']['sgd']:g} (momentum {rates['used']['sgd_momentum']:g}), "
        f"Adam lr {rates['used']['adam']:g}; paper's: SGD {rates['paper']['sgd']:g}, Adam "
        f"{rates['paper']['adam']:g}"
    )


def baseline_options(args, optimizer):
    """``train_backprop``'s learning rate and momentum for ``optimizer`` from the flags."""
    return dict(
        lr=getattr(args, f"{optimizer}_lr"),
        momentum=args.sgd_momentum if optimizer == "sgd" else 0.0,
    )


def add_compile_flag(p):
    """``--compile`` / ``--no-compile`` / ``--compile-blocks``."""
    p.add_argument(
        "--compile",
        action=argparse.BooleanOptionalAction,
        default="auto",
        help="FLN's elementwise chains as fused kernels compiled by torch.compile "
        "(FastBackend(compile=True)), or all eager NumPy (--no-compile); default: the "
        'fast backend\'s "auto", compiled where PyTorch and a C++ compiler are present '
        "and the arrays large enough to gain. A compile runs on one batch before the "
        "clock starts, and its seconds are reported",
    )
    p.add_argument(
        "--compile-blocks",
        dest="compile",
        action="store_const",
        const="blocks",
        help='FLN\'s block solves each compiled whole (FastBackend(compile="blocks"): a CUDA '
        "graph per solve on a GPU); with --device torch",
    )


def check_compile(p, args):
    """Refuse ``--compile-blocks`` off ``--device torch`` (it compiles solves on tensors)."""
    if args.compile == "blocks" and getattr(args, "device", "cpu") != "torch":
        p.error(
            "--compile-blocks compiles FLN's block solves on PyTorch tensors: it needs "
            f"--device torch, got --device {getattr(args, 'device', 'cpu')}"
        )


def add_group_flag(p):
    """``--group``: FLN of one rank through a process group of one process (``check_group``)."""
    p.add_argument(
        "--group",
        default=None,
        help="train FLN (one rank) through a torch.distributed process group of this one "
        "process on gloo or nccl (fenchel_cvx.parallel.one_rank_group: every reduction a "
        "collective) instead of the no-op communicator; nccl with --device torch. Default: none",
    )


def check_group(p, args):
    """``p.error`` naming the flag: a ``--group`` other than gloo and nccl, NCCL off the GPU's
    tensors (``--device torch``), a group off NumPy or PyTorch arrays (``--device cupy``), or a
    group beside FLN's own ranks (a launch ``fln:rP``, ``--nproc``)."""
    if args.group is None:
        return
    from fenchel_cvx.parallel import GROUP_BACKENDS

    if args.group not in GROUP_BACKENDS:
        p.error(f"--group must be one of {', '.join(GROUP_BACKENDS)}, got {args.group!r}")
    device = getattr(args, "device", "cpu")
    if args.group == "nccl" and device != "torch":
        p.error(f"--group nccl moves CUDA tensors: it needs --device torch, got --device {device}")
    if device == "cupy":
        p.error("--group reduces NumPy arrays or PyTorch tensors, got --device cupy")
    ranked = [label for label, (m, nproc, _) in args.launches.items() if m == "fln" and nproc > 1]
    if ranked:
        p.error(f"--group trains FLN on one rank, got --methods {','.join(ranked)} (ranks)")


def per_layer(n, name, integers=False):
    """The parser of a flag with 1 or ``n`` comma-separated values (one: the same for all):
    finite numbers >= 0, or ``integers`` >= 1."""
    cast, what = (int, "integers") if integers else (float, "numbers")
    bad = (lambda v: v < 1) if integers else (lambda v: not np.isfinite(v) or v < 0)
    bound = "integers >= 1" if integers else "finite numbers >= 0"

    def parse(text):
        vals = tuple(comma_list(text, cast, f"{name} must be {n} comma-separated {what}"))
        if len(vals) not in (1, n) or any(bad(v) for v in vals):
            raise argparse.ArgumentTypeError(f"{name} must be 1 or {n} {bound}, got {text!r}")
        return vals if len(vals) == n else vals * n

    return parse


def counts(text):
    """A comma list of integers >= 1 (an ``argparse`` type)."""
    try:
        values = tuple(int(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected integers like 1,2,4, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected integers >= 1, got {text!r}")
    return values


def steps_text(steps):
    """``10`` for equal per-layer steps, else ``(1, 3, 10, 10)``."""
    return str(steps[0]) if len(set(steps)) == 1 else str(tuple(steps))


def learning_rates(flag):
    """The parser of ``flag``: a comma list of learning rates, each finite and > 0 (a grid)."""

    def parse(text):
        rates = tuple(comma_list(text, float, f"{flag} must be comma-separated numbers"))
        if not rates or not all(np.isfinite(r) and r > 0 for r in rates):
            raise argparse.ArgumentTypeError(f"{flag} must be learning rates > 0, got {text!r}")
        return rates

    return parse


def floats(text):
    """``"1,100"`` -> ``[1.0, 100.0]`` (argparse type of the per-layer flags)."""
    return comma_list(text, float, "expected a number or a comma list of numbers")


def comma_list(text, cast, message):
    """``[cast(v) for v in text.split(",")]``; an ``argparse.ArgumentTypeError`` of
    ``message``, with the text, where a value does not cast."""
    try:
        return [cast(v) for v in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{message}, got {text!r}") from None
