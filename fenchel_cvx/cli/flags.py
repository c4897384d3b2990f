"""The flags' conversions and errors of ``fenchel-cvx``: argparse types that check a flag's
value against its constraint (``validation.py``), so that argparse names the flag in its error;
the per-layer lists (``--lam 1,100``) and ``--arch``; the help's defaults of the
hyperparameter flags (``defaults.training``); and :func:`_fail`, the error of a check made
after parsing, in argparse's words. No equation of the paper is implemented here.
"""

import argparse
from typing import NoReturn

from .. import defaults
from ..validation import COUNT, ROUNDS, SEED, PerLayer, failure


# --- argument types: each checks its flag's constraint (validation.py); argparse names the flag
def _flag(constraint, parse=int):
    """An argparse type: ``parse`` the text, then check the value against ``constraint``; the
    error (argparse writes "argument --flag: ...") says what it must be."""

    def convert(text):
        try:
            value = parse(text)
        except ValueError:
            value = text  # unparsable: fails the constraint's type
        failed = failure(value, constraint)
        if failed is not None:
            raise argparse.ArgumentTypeError(f"must be {failed[0]}, got {text!r}")
        return value

    convert.__name__ = "integer" if parse is int else "number"
    return convert


def _numbers(text):
    """``"1"`` -> 1.0, ``"1,100"`` -> [1.0, 100.0]: one value, or one per layer."""
    try:
        values = [float(v) for v in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"must be a number or a comma-separated list of numbers, got {text!r}"
        ) from None
    return values[0] if len(values) == 1 else values


def _integers(text):
    """``"10"`` -> 10, ``"1,1,10,10"`` -> [1, 1, 10, 10]: one count, or one per layer."""
    values = [int(v) for v in text.split(",")]
    return values[0] if len(values) == 1 else values


def _per_layer(constraint, parse=_numbers):
    convert = _flag(PerLayer(constraint), parse)
    convert.__name__ = "per-layer list"
    return convert


def _arch(text):
    if text == "lenet5":
        return text
    try:
        sizes = [int(p) for p in text.split("-")]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"must look like 64-32-10 (or lenet5), got {text!r}"
        ) from None
    if len(sizes) < 2 or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"needs >= 2 positive sizes like 64-32-10, got {text!r}")
    return sizes


COUNT_, ROUNDS_, SEED_ = _flag(COUNT), _flag(ROUNDS), _flag(SEED)


def _values(v):
    """A setting's per-layer values in words: one number, or the list."""
    if v is None:
        return None
    v = v if isinstance(v, (tuple, list)) else (v,)
    return f"{v[0]:g}" if len(set(v)) == 1 else ",".join(f"{x:g}" for x in v)


def _tuned(name, without):
    """The help's default of a hyperparameter flag: ``without`` for Algorithm 1 (no
    --batch-size), and the tuned setting of each kind of network (``defaults.training``)."""
    dense, lenet = defaults.SETTINGS["dense"].for_layers(1), defaults.LeNet5.setting
    d, le = getattr(dense, name), getattr(lenet, name)
    if isinstance(d, tuple) and len(d) == 2 and d[0] != d[1]:
        d = f"{d[0]:g} for the hidden layers and {d[1]:g} for the output layer"
    else:
        d = _values(d) or "1"
    return (
        f"default: {without} without --batch-size; with it, the tuned setting: {d} on a "
        f"dense network, {_values(le)} on lenet5"
    )


class _Help(argparse.HelpFormatter):
    """Each flag's help once: its sentence, then its default unless the sentence gives it."""

    def _get_help_string(self, action):
        text = action.help or ""
        shown = (
            action.option_strings
            and action.default is not None
            and action.default is not False
            and action.default is not argparse.SUPPRESS
        )
        if shown and "default" not in text:
            text += " (default: %(default)s)"
        return text


def _fail(flag: str, message: str) -> NoReturn:
    """Refuse ``flag`` after parsing: a ValueError in argparse's words, which ``main`` passes
    to the subcommand's parser (exit status 2, one line naming the flag)."""
    raise ValueError(f"argument {flag}: {message}")
