"""The run folder of ``fenchel-cvx train`` and ``resume``: the output folder checked writable
before any work (:func:`_check_out`), its default name ``runs/<timestamp>``, the temporary
files a killed write left there removed and named (:func:`_remove_temporaries`),
``run.json`` written (:func:`_record`: the arguments, for ``resume``, and the data's
preprocessing, for ``predict``) and read back (:func:`_run_args`: each value checked by its
flag's own conversion, then by the schema ``schemas.RUN``), and the values a run.json written
before the training settings took (:func:`_before_settings`). No equation of the paper is
implemented here.
"""

import argparse
import json
import sys
from datetime import datetime
from pathlib import Path

from .. import defaults
from .flags import _fail
from .parser import build_parser

#: what a batched run on the fast backend took where its flags were unset in a run.json without
#: a ``settings`` entry: one W-step, 10 X-steps and a fresh Gram every solve (and every run
#: fit_bcd's gamma and no momentum). ``resume`` of such a run.json goes on with them.
BEFORE_SETTINGS = dict(w_steps=1, x_steps=10, gram_reuse=1)
#: the format and version of run.json (a run.json without it is read as version 1)
RUN_FORMAT = "fenchel_cvx.Run/1"


def _check_out(flag, path, must_not_exist=False):
    """Create the output folder now and prove it writable, so no run is lost at its end.
    ``must_not_exist``: the folder must be new, empty, or hold only what a run that failed
    before its first checkpoint leaves (``run.json``, temporary files): it is reused."""
    from ..io import check_writable_dir

    left = (
        []
        if not (must_not_exist and path.is_dir())
        else [
            p.name
            for p in path.iterdir()
            if p.name != "run.json" and not (p.name.startswith(".") and p.name.endswith(".tmp"))
        ]
    )
    if left or (must_not_exist and path.is_dir() and (path / "checkpoint.npz").exists()):
        _fail(
            flag,
            f"{str(path)!r} already holds files (a run there is resumed with "
            f"'fenchel-cvx resume {path}'); choose another folder",
        )
    try:
        return check_writable_dir(flag, path)
    except ValueError as err:
        _fail(
            flag,
            str(err).split(" must be ", 1)[-1].replace("a writable folder, got", "not writable:"),
        )


def _start(args, resume):
    """The run's folder, without the temporary files a killed run left there: for a new run,
    created now (or reused: ``_check_out``), ``run.json`` comes once the data is read
    (``_record``)."""
    out = (
        args.out if resume else _check_out("--out", args.out or _default_out(), must_not_exist=True)
    )
    _remove_temporaries("resume" if resume else "train", out)
    return out


def _remove_temporaries(command, folder):
    """Delete the temporary files that writers since killed left in ``folder`` (never a live
    writer's: ``io.remove_temporaries``), and name them on standard error in one line."""
    from ..io import remove_temporaries

    removed = remove_temporaries(folder)
    if removed:
        print(
            f"fenchel-cvx {command}: removed {len(removed)} temporary file(s) that a killed "
            f"write left in {folder}: {', '.join(p.name for p in removed)}",
            file=sys.stderr,
        )


def _record(args, out):
    """Write ``out/run.json``: the arguments (for ``resume``) and the data's preprocessing (for
    ``predict``)."""
    from ..datasets import PIXEL_SCALE
    from ..io import write_json

    saved = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    scale = PIXEL_SCALE[args.dataset]
    write_json(
        out / "run.json",
        dict(
            saved,
            out=str(out),
            format=RUN_FORMAT,
            preprocessing=dict(
                divide_by=scale,
                what=f"the pixels of {args.dataset} divided by {scale:g}, to [0, 1]",
            ),
        ),
    )


def _default_out():
    base = Path("runs") / datetime.now().strftime("%Y%m%d-%H%M%S")
    path, k = base, 1
    while path.exists():
        path, k = Path(f"{base}-{k}"), k + 1
    return path


def _run_args(folder):
    """The arguments a ``train`` run saved in ``folder/run.json`` (None where there is none),
    each checked as its flag is (``_check_saved``), then every field by the schema of run.json
    (``schemas.RUN``: its type, whether it may be null, its range; the preprocessing that
    ``predict`` applies), a refusal naming the file and the field."""
    from ..files import check_format, read_json
    from ..schemas import RUN

    path = folder / "run.json"
    if not path.is_file():
        return None
    saved = read_json(path, "run.json (fenchel-cvx train)")
    if "format" in saved:
        check_format(path, saved, RUN_FORMAT, "format")
    _check_saved(path, saved)
    RUN.check(path, "", saved)
    for k in ("out", "data_dir"):
        saved[k] = None if saved.get(k) is None else Path(saved[k])
    return saved


def _check_saved(path, saved):
    """Each value of a run.json that ``train`` has a flag for, checked by that flag's own
    conversion and choices: an edited run.json is refused by its entry's name."""
    from ..errors import FileFormatError

    train = build_parser()._subparsers._group_actions[0].choices["train"]
    for action in train._actions:
        value = saved.get(action.dest)
        if value is None or not action.option_strings or action.dest == "help":
            continue
        if isinstance(value, list) and all(isinstance(v, (int, float)) for v in value):
            text = ("-" if action.dest == "arch" else ",").join(str(v) for v in value)
        else:
            text = value if isinstance(value, str) else json.dumps(value)
        ok = (
            isinstance(value, (str, int, float, list)) and not isinstance(value, bool)
            if action.type is not None or action.choices
            else isinstance(value, bool)
        )
        try:
            ok = ok and (action.type is None or action.type(text) is not None)
        except (argparse.ArgumentTypeError, ValueError):
            ok = False
        if not ok or (action.choices and value not in action.choices):
            raise FileFormatError(
                path, action.dest, f"a value {action.option_strings[0]} takes", repr(value)[:200]
            )


def _before_settings(args):
    """The arguments of a run.json written before the training settings (no ``settings``
    entry; since then every run.json has one and records every value): what that run took
    where they are unset (fit_bcd's gamma, no momentum, on the fast backend
    ``BEFORE_SETTINGS``), so that it resumes as it began."""
    if getattr(args, "settings", None) is not None:
        return
    before = dict(gamma=defaults.gamma_for(args.batch_size), momentum=0.0)
    if args.backend == "fast":
        before.update(BEFORE_SETTINGS if args.batch_size is not None else dict(gram_reuse=1))
    vars(args).update(
        {k: v for k, v in before.items() if getattr(args, k, None) is None},
        settings="before the training settings",
    )
