"""The ``fenchel-cvx`` command: train, resume, evaluate, predict with and certify Fenchel lifted
networks.

    fenchel-cvx train                         # digits, 64-32-10 ReLU, MSE, the oracle (see README)
    fenchel-cvx train --loss cross_entropy --iterations 3
    fenchel-cvx train --dataset mnist --data-dir data/mnist --download --arch 784-300-10 \\
        --backend fast --batch-size 500 --epochs 2 --check-every 20   # the dense training setting
    fenchel-cvx resume runs/20260101-120000   # continue an interrupted run (Ctrl-C saves it)
    fenchel-cvx evaluate runs/20260101-120000 # loss and accuracy of its model on its test split
    fenchel-cvx predict runs/20260101-120000 points.csv --out labels.csv
    fenchel-cvx certify runs/20260101-120000  # every block at its saved iterate, by the oracle

Data sets: ``digits`` and ``mnist5k`` are embedded; ``mnist``, ``fashion-mnist`` and ``cifar10``
are read from ``--data-dir`` (default: ``$FENCHEL_DATA/<name>``; see ``datasets.py``), with
``--download`` the missing files of mnist and fashion-mnist fetched into it, and with ``--verify``
checked against the official release's checksums. A loader's error names its parameters as
these flags (``DATA_FLAGS``).
``train`` (``bcd.fit_bcd``) writes to ``--out`` (default ``runs/<timestamp>``): ``run.json``
(format ``fenchel_cvx.Run/1``: the arguments, for ``resume``, and the data's preprocessing, which
``predict`` applies to its input), ``checkpoint.npz`` (every ``--checkpoint-every`` rounds and
on Ctrl-C), and at the end ``history.json`` (``History.load``), ``model.npz``
(``LiftedNetwork.load``), ``objectives.png`` (lifted vs network objective: the gap) and
``accuracy.png``; its last line names every file it wrote. Per-layer values (``--lam``,
``--rho``, ``--gamma``) take one number or a comma-separated list, one per layer. Losses and
penalties are sums over the data points (as in the paper), so lam and rho are on the scale of
the training set (of a batch in Algorithm 2).
The hyperparameters' defaults are the package's training settings (``defaults.training``):
with ``--batch-size``, the benchmarks' tuned setting of the network's kind (a dense network: lam
0.2, rho 0, gamma 1 for the hidden layers and 30 for the output layer, momentum (0.7, 0), and on
the fast backend 10 W-steps for the hidden layers and one for the output layer, 20 X-steps;
``--arch lenet5``: the LeNet-5 benchmark's); without it, Algorithm 1 with lam 10, rho 1, every
block solved to ``--tol``. Every argument and the output folder are checked before any work
(the constraints of ``validation.py``); errors name the flag. ``run.json`` is written once the
data is read and the network built, so a ``train`` that fails on its data leaves an empty
folder, and one that fails later a folder that ``train --out`` reuses. Every command in a run
folder (``train --out`` reusing it, ``resume``, ``evaluate``, ``predict``) removes the temporary
files that a killed write left there, never a live writer's (``io.remove_temporaries``), naming
them on standard error in one line. ``resume`` of a run that finished all its rounds, its files
all written, says so and writes nothing.
BLAS runs on ``--threads`` threads (default 1), in the fast backend's solves too: NumPy's pool
gets them, SciPy's one (on 2 cores two pools of two oversubscribe the machine; see
docs/installation.md).

The command's modules: ``parser.py`` (the parser and every flag), ``flags.py`` (each flag's
conversion and check, and the error of a check after parsing), ``data_flags.py`` (the data
sets, their folder's checks and loading), ``training.py`` (train and resume), ``run_folder.py``
(the run folder and its ``run.json``), ``reports.py`` (what a run prints and its summary),
``saved_model.py`` (evaluate and predict), ``certify.py`` (certify and its flags); here,
:func:`main` and its exit statuses: 2 with one line for a ValueError (a flag, or a file refused
by name), 1 for an OSError or another of the package's errors (``errors.FenchelError``), 130 on
Ctrl-C.
"""

import sys

from ..heap import keep_freed_memory

# The names read as ``fenchel_cvx.cli.<name>``; a value the commands look up when they run
# (``training.LARGE``, ``data_flags.load``) is replaced in its own module.
from .certify import certify as certify
from .data_flags import DATA_FLAGS as DATA_FLAGS
from .data_flags import DATASETS as DATASETS
from .data_flags import IMAGES as IMAGES
from .data_flags import SHAPES as SHAPES
from .data_flags import TRAIN_SIZES as TRAIN_SIZES
from .data_flags import VERIFIABLE as VERIFIABLE
from .flags import COUNT_ as COUNT_
from .flags import ROUNDS_ as ROUNDS_
from .flags import SEED_ as SEED_
from .parser import ACTIVATIONS as ACTIVATIONS
from .parser import DEFAULTS as DEFAULTS
from .parser import DESCRIPTION as DESCRIPTION
from .parser import build_parser as build_parser
from .run_folder import BEFORE_SETTINGS as BEFORE_SETTINGS
from .run_folder import RUN_FORMAT as RUN_FORMAT
from .run_folder import _before_settings as _before_settings
from .run_folder import _check_saved as _check_saved
from .run_folder import _run_args as _run_args
from .saved_model import evaluate as evaluate
from .saved_model import predict as predict
from .training import FAST_ONLY as FAST_ONLY
from .training import LENET5_HIDDEN as LENET5_HIDDEN
from .training import _backend as _backend
from .training import _check_train as _check_train
from .training import _threads as _threads
from .training import resume as resume
from .training import train as train

COMMANDS = {
    "train": train,
    "resume": resume,
    "evaluate": evaluate,
    "predict": predict,
    "certify": certify,
}


def main(argv=None):
    """Entry point of ``fenchel-cvx``; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    sub = parser._subparsers._group_actions[0].choices[args.command]
    keep_freed_memory()  # the process's temporaries reuse the heap (``heap.py``)
    try:
        if args.command == "resume":
            return resume(args)
        with _threads(args.threads):
            return COMMANDS[args.command](args)
    except KeyboardInterrupt:
        print(f"\nfenchel-cvx {args.command}: interrupted", file=sys.stderr)
        return 130
    except ValueError as err:
        sub.error(str(err))
    except OSError as err:  # a disk filling up or a folder removed during the run
        print(f"fenchel-cvx {args.command}: {err}", file=sys.stderr)
        return 1
    except Exception as err:
        from ..errors import FenchelError

        if not isinstance(err, FenchelError):
            raise
        print(f"fenchel-cvx: {type(err).__name__}: {err}", file=sys.stderr)
        return 1
