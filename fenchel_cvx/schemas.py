"""The schema of every JSON the package reads: ``run.json``, ``history.json``, a checkpoint's meta
and a model's meta. Each field's type, range and meaning is checked when the file is read, and a
field that fails is refused by a :class:`~fenchel_cvx.errors.FileFormatError` naming the file
and the path of the field (``run.json: epochs: expected an integer >= 1, found null``).

A schema is declarative: a :class:`Record` maps each field to a small checker object, one class
per kind of check (:class:`Integer`, :class:`Number`, :class:`Boolean`, :class:`Text`,
:class:`ListOf`, :class:`Record`, :class:`AnyOf`, and :class:`WeightsWithinBudget`, the one
check across a network config's fields). A field missing
from a record is refused only where the record lists it as ``required`` (older files lack newer
fields); fields no schema names pass unchecked. The schemas here:

- :data:`RUN`: ``run.json``, the arguments of ``fenchel-cvx train`` (the values that a flag
  takes are checked by that flag's own conversion too: ``cli._check_saved``) and the data's
  ``preprocessing``, which ``predict`` applies: ``divide_by`` a finite number > 0;
- :data:`HISTORY`: ``history.json`` (``History.to_dict``): the rounds' records, their blocks and
  their certificate (``held`` true or false, ``violations`` a list of the four checks' failures);
- :data:`NETWORK_META` and :data:`NETWORK_CONFIG`: a model's meta, its network config (sizes
  integers >= 1 whose weights fit the read budget, registered activations and loss, the dtype
  float32 or float64, ``lam`` and ``rho`` finite numbers; their ranges are the network's own
  checks, ``validation.py``);
- :data:`CHECKPOINT_META`: a checkpoint's meta: the config, the round counter, the carried
  steps, the data's digest, and a history whose every record holds the certificate the summary
  and the plots of a resumed run read (``certificate.held`` and ``certificate.violations``).

No equation of the paper is implemented here.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterable
from typing import Any, TypeGuard

from .activations import activation_names
from .budget import bounded_product, read_budget
from .certificate import CHECKS
from .errors import FileFormatError
from .layers import LAYERS, build_maps
from .losses import loss_names
from .pre_activations import RESYNC


def found(value: object) -> str:
    """``value`` in words for an error, in bounded length: ``null``, a number or a text as Python
    writes it, a container by its size."""
    if value is None:
        return "null"
    if isinstance(value, dict):
        return f"an object of {len(value)} keys"
    if isinstance(value, list):
        return f"a list of {len(value)} items"
    if isinstance(value, str):
        return repr(value[:100]) + ("..." if len(value) > 100 else "")
    return repr(value)[:100]


def _at(where: str, key: str | int) -> str:
    """The path of the field ``key`` (a name, or a list's index) of the field ``where``."""
    if isinstance(key, int):
        return f"{where}[{key}]"
    return f"{where}.{key}" if where else key


class Check:
    """A check of one JSON value: ``words`` say what it takes, :meth:`check` refuses anything
    else naming the file and the field; ``null``: JSON null passes too."""

    words = "anything"

    def __init__(self, null: bool = False) -> None:
        self.null = null

    def describe(self) -> str:
        """What the check takes, in words (null aside)."""
        return self.words

    def expected(self) -> str:
        return f"null or {self.describe()}" if self.null else self.describe()

    def takes(self, value: object) -> bool:
        """Whether ``value`` is of the JSON type this check is about."""
        return True

    def accepts(self, value: object) -> bool:
        """Whether ``value`` itself (not what it holds) passes."""
        return self.takes(value)

    def check(self, path: str | os.PathLike[str], where: str, value: object) -> None:
        """Refuse ``value``, the field ``where`` of the file ``path``, unless it passes."""
        if value is None and self.null:
            return
        if not self.accepts(value):
            raise FileFormatError(path, where, self.expected(), found(value))
        self.inside(path, where, value)

    def inside(self, path: str | os.PathLike[str], where: str, value: Any) -> None:
        """Check what the container ``value`` holds (a record's fields, a list's items)."""
        # (``value``: of whichever JSON type the subclass takes, once ``accepts`` passed it)


class Number(Check):
    """A number (never a bool) in ``[lo, hi]`` (None: unbounded; ``above``: ``> lo``), finite
    unless ``finite`` is False (a record of a run that diverged: NaN, Infinity)."""

    noun = "a finite number"

    def __init__(
        self,
        lo: float | None = None,
        hi: float | None = None,
        above: bool = False,
        finite: bool = True,
        null: bool = False,
    ) -> None:
        super().__init__(null)
        self.lo, self.hi, self.above, self.finite = lo, hi, above, finite
        words = self.noun if finite else "a number"
        if lo is not None and hi is not None:
            words += f" in {'(' if above else '['}{lo:g}, {hi:g}]"
        elif lo is not None:
            words += f" {'>' if above else '>='} {lo:g}"
        self.words = words

    def takes(self, value: object) -> TypeGuard[int | float]:
        return isinstance(value, (int, float)) and not isinstance(value, bool)

    def accepts(self, value: object) -> bool:
        if not self.takes(value):
            return False
        if self.finite and isinstance(value, float) and not math.isfinite(value):
            return False
        low = self.lo is None or (value > self.lo if self.above else value >= self.lo)
        return low and (self.hi is None or value <= self.hi)


class Integer(Number):
    """An integer (never a bool) in ``[lo, hi]`` (None: unbounded)."""

    noun = "an integer"

    def takes(self, value: object) -> TypeGuard[int]:
        return type(value) is int


class Boolean(Check):
    """true or false."""

    words = "true or false"

    def takes(self, value: object) -> bool:
        return type(value) is bool


class Text(Check):
    """A text; ``choices`` (a tuple, or a function giving one when the file is read: a
    registry's names): one of them; ``words`` say what it is, where not the choices."""

    def __init__(
        self,
        choices: Iterable[str] | Callable[[], Iterable[str]] | None = None,
        words: str | None = None,
        null: bool = False,
    ) -> None:
        super().__init__(null)
        self.choices, self.given = choices, words

    def options(self) -> tuple[str, ...] | None:
        if self.choices is None:
            return None
        return tuple(self.choices() if callable(self.choices) else self.choices)

    def describe(self) -> str:
        options = self.options()
        if self.given is not None or options is None:
            return self.given or "text"
        return "one of " + ", ".join(repr(o) for o in options)

    def takes(self, value: object) -> bool:
        return isinstance(value, str)

    def accepts(self, value: object) -> bool:
        options = self.options()
        return self.takes(value) and (options is None or value in options)


class ListOf(Check):
    """A list of at least ``min_len`` items, each passing ``item``."""

    def __init__(self, item: Check, min_len: int = 0, null: bool = False) -> None:
        super().__init__(null)
        self.item, self.min_len = item, min_len
        self.words = "a list" + (f" of at least {min_len} items" if min_len else "")

    def takes(self, value: object) -> TypeGuard[list[Any]]:
        return isinstance(value, list)

    def accepts(self, value: object) -> bool:
        return self.takes(value) and len(value) >= self.min_len

    def inside(self, path: str | os.PathLike[str], where: str, value: list[Any]) -> None:
        for i, v in enumerate(value):
            self.item.check(path, _at(where, i), v)


class Record(Check):
    """A JSON object: each of ``fields`` (name -> check) where present, every name of
    ``required`` present, any other field passing ``others`` (None: unchecked), then each of
    ``also`` on the whole object (checks across its fields)."""

    words = "an object"

    def __init__(
        self,
        fields: dict[str, Check],
        required: Iterable[str] = (),
        others: Check | None = None,
        also: Iterable[Check] = (),
        null: bool = False,
    ) -> None:
        super().__init__(null)
        self.fields, self.required = dict(fields), tuple(required)
        self.others, self.also = others, tuple(also)

    def requiring(self, *names: str) -> Record:
        """This record with ``names`` required too."""
        return Record(self.fields, self.required + names, self.others, self.also, self.null)

    def takes(self, value: object) -> TypeGuard[dict[str, Any]]:
        return isinstance(value, dict)

    def inside(self, path: str | os.PathLike[str], where: str, value: dict[str, Any]) -> None:
        for name in self.required:
            if name not in value:
                raise FileFormatError(
                    path, _at(where, name), self.fields[name].expected(), "nothing"
                )
        for name, field in self.fields.items():
            if name in value:
                field.check(path, _at(where, name), value[name])
        if self.others is not None:
            for name, v in value.items():
                if name not in self.fields:
                    self.others.check(path, _at(where, name), v)
        for check in self.also:
            check.check(path, where, value)


class AnyOf(Check):
    """A value passing one of ``options``: the first whose JSON type it has checks it (and
    names what fails inside it); a value of none of their types is refused naming them all."""

    def __init__(self, *options: Check, null: bool = False) -> None:
        super().__init__(null)
        self.options = options

    def describe(self) -> str:
        return " or ".join(o.describe() for o in self.options)

    def takes(self, value: object) -> bool:
        return any(o.takes(value) for o in self.options)

    def inside(self, path: str | os.PathLike[str], where: str, value: object) -> None:
        next(o for o in self.options if o.takes(value)).check(path, where, value)


class WeightsWithinBudget(Check):
    """A network config's weights (its ``layers`` on its ``input_shape``, in its ``dtype``)
    within the read budget (``budget.read_budget``), each weight's shape multiplied out by
    ``budget.bounded_product``, before the network allocates them. A config whose layers do not
    fit together is left to the network's own checks, which name the layer."""

    words = "weights within the read budget"

    def check(self, path: str | os.PathLike[str], where: str, value: Any) -> None:
        # (``value``: the network config, a JSON object that its record's fields passed)
        try:
            shapes = [m.weight_shape for m in build_maps(value["input_shape"], value["layers"])]
        except (ValueError, TypeError):
            return
        limit, itemsize, total = read_budget(), 4 if value["dtype"] == "float32" else 8, 0
        for shape in shapes:
            n = bounded_product([*shape, itemsize], limit)
            total = limit + 1 if n is None else total + n
            if total > limit:
                raise FileFormatError(
                    path,
                    _at(where, "layers"),
                    f"weights within the read budget of {limit:,} bytes",
                    f"more than {limit / 2**30:.3g} GiB for the {value['dtype']} weights",
                    "FENCHEL_READ_BUDGET raises the budget",
                )


# --- a model's meta: the network config (LiftedNetwork.get_config) ---------------------------
#: a layer: ``{"kind": ..., **integer parameters}`` (``layers.Spec.to_dict``)
LAYER = Record({"kind": Text(LAYERS)}, required=("kind",), others=Integer(0))
_NAMED = Text(lambda: activation_names(by_name=False))
NETWORK_CONFIG = Record(
    {
        "input_shape": ListOf(Integer(1)),
        "layers": ListOf(LAYER),
        "activations": ListOf(Record({"name": _NAMED}, required=("name",))),
        "loss": AnyOf(Text(loss_names), Record({"name": Text(loss_names)}, required=("name",))),
        "lam": ListOf(Number()),
        "rho": ListOf(Number()),
        "seed": Integer(0),
        "dtype": Text(("float32", "float64")),
    },
    required=("input_shape", "layers", "activations", "loss", "lam", "rho", "seed", "dtype"),
    also=(WeightsWithinBudget(),),
)
NETWORK_META = Record(
    {"format": Text(), "version": Text(), "config": NETWORK_CONFIG}, required=("config",)
)

# --- history.json (History.to_dict) -----------------------------------------------------------
_VALUE = Number(finite=False, null=True)  # an objective or a residual: NaN where it diverged
_VALUES = ListOf(Number(finite=False))
_ACCURACY = Number(0, 1, null=True)
BLOCK = Record(
    {
        **dict.fromkeys(("block", "kind", "status"), Text()),
        "layer": Integer(0),
        **dict.fromkeys(("value_before", "value_after", "residual", "reported_residual"), _VALUE),
        **dict.fromkeys(("seconds", "solver_seconds"), Number(0, null=True)),
        "iterations": Integer(0, null=True),
        "converged": Boolean(),
    }
)
VIOLATION = Record(
    {
        "check": Text(CHECKS),
        "layer": AnyOf(Integer(0), Text(), null=True),  # a layer, a block's name, or none
        **dict.fromkeys(("value", "bound"), Number(finite=False)),
        "tol": Number(0),
        "iteration": Integer(0, null=True),
        "detail": Text(),
        "capped": Boolean(),
    }
)
CERTIFICATE = Record(
    {
        **dict.fromkeys(("held", "checked", "restarted"), Boolean()),
        "violations": ListOf(VIOLATION),
        **dict.fromkeys(("max_residual", "max_increase", "bound_gap"), _VALUE),
        "min_divergence": _VALUES,
    },
    required=("held", "violations"),
)
_OBJECTIVES = ("lifted_x", "network_x", "lifted_w", "network_w", "prox", "train_loss", "test_loss")
RECORD = Record(
    {
        "iteration": Integer(1),
        **dict.fromkeys(("epoch", "batch", "alternation"), Integer(1, null=True)),
        "m": Integer(1),
        **dict.fromkeys(_OBJECTIVES, _VALUE),
        **dict.fromkeys(("divergence_x", "divergence_w"), ListOf(Number(finite=False), null=True)),
        **dict.fromkeys(("restarted", "checked"), Boolean()),
        "blocks": ListOf(BLOCK),
        "halted": Text(null=True),
        "seconds": Number(0),
        **dict.fromkeys(("train_accuracy", "test_accuracy"), _ACCURACY),
        "certificate": CERTIFICATE,
    }
)
#: the history's config: what the plots and ``resume`` read of it
HISTORY_CONFIG = Record(
    {
        "algorithm": Integer(1, 2),
        "task": Text(("classification", "regression")),
        "initial": Record(
            {
                **dict.fromkeys(("network_objective", "train_loss", "test_loss"), _VALUE),
                **dict.fromkeys(("train_accuracy", "test_accuracy"), _ACCURACY),
            },
            null=True,
        ),
    }
)
HISTORY = Record(
    {"format": Text(), "config": HISTORY_CONFIG, "records": ListOf(RECORD)},
    required=("records",),
)

# --- a checkpoint's meta (checkpoints.save_checkpoint) ----------------------------------------
#: a checkpoint's history: every record with the certificate a resumed run's summary and plots
#: read (``History.certificate_held``, ``History.violations``)
CHECKPOINT_HISTORY = Record(
    {
        "format": Text(),
        "config": HISTORY_CONFIG,
        "records": ListOf(RECORD.requiring("certificate")),
    },
    required=("config", "records"),
)
CHECKPOINT_META = Record(
    {
        **dict.fromkeys(("format", "version"), Text()),
        "config": NETWORK_CONFIG,
        "iteration": Integer(0),
        "has_Xs": Boolean(),
        "carried_steps": Integer(0, RESYNC - 1, null=True),
        "history": CHECKPOINT_HISTORY,
        "settings": Record(
            {"data": Text(words="the training data's digest (text)")}, required=("data",)
        ),
    },
    required=("config", "iteration", "has_Xs", "history", "settings"),
)

# --- run.json (fenchel-cvx train) -------------------------------------------------------------
_COUNTS = ("epochs", "iterations", "alternations", "check_every", "eval_every", "checkpoint_every")
RUN = Record(
    {
        **dict.fromkeys(("format", "dataset", "activation", "loss", "backend"), Text()),
        "command": Text(("train",)),
        **dict.fromkeys(("data_dir", "out"), Text(words="a folder's path (text)", null=True)),
        **dict.fromkeys(("download", "verify", "no_baseline", "quiet", "record_blocks"), Boolean()),
        **dict.fromkeys(("strict", "compile"), Boolean(null=True)),
        **dict.fromkeys(("train_size", "batch_size", "max_iter"), Integer(1, null=True)),
        "dtype": Text(("float32", "float64")),
        "arch": AnyOf(Text(("lenet5",)), ListOf(Integer(1), min_len=2), null=True),
        **dict.fromkeys(
            ("lam", "rho", "gamma", "momentum"),
            AnyOf(Number(), ListOf(Number(), min_len=1), null=True),
        ),
        **dict.fromkeys(
            ("w_steps", "x_steps", "gram_reuse"),
            AnyOf(Integer(1), ListOf(Integer(1), min_len=1), null=True),
        ),
        "seed": Integer(0),
        **dict.fromkeys(_COUNTS + ("threads",), Integer(1)),
        "tol": Number(0, above=True),
        "newton_cap": Integer(0, null=True),
        "settings": Text(null=True),
        # what ``predict`` divides its input by (the pixels' scale): it changes every label
        "preprocessing": Record(
            {"divide_by": Number(0, above=True), "what": Text()}, required=("divide_by",)
        ),
    }
)

#: the meta's schema of each format family (``"fenchel_cvx.<Kind>"``) that ``io.read_npz`` reads
META = {
    "fenchel_cvx.LiftedNetwork": NETWORK_META,
    "fenchel_cvx.BCDCheckpoint": CHECKPOINT_META,
}


def check_meta(
    path: str | os.PathLike[str], expected_format: str, meta: dict[str, Any]
) -> dict[str, Any]:
    """``meta`` (an ``.npz``'s JSON object) once it passes the schema of ``expected_format``'s
    family (:data:`META`; a family without one passes), errors naming ``meta.<field>``."""
    schema = META.get(expected_format.rpartition("/")[0])
    if schema is not None:
        schema.check(path, "meta", meta)
    return meta
