"""Validation of every input of the package: each check declared once, as constraints.

In the spirit of scikit-learn's ``_parameter_constraints``, a parameter's constraint is an
object (:class:`Interval`, :class:`Options`, :class:`PerLayer`, ...) or a list of alternatives
(``None`` among them: None is allowed), and :func:`validate` checks a dict of values against a
dict of constraints before any work::

    validate({"lam": PerLayer(LAM, 2), "seed": SEED}, dict(lam=lam, seed=seed))

Every error is a ``ValueError`` that names the parameter and the value: ``"lam must be > 0 and
finite, got -1"``. The name is the Python keyword, or whatever the caller maps it to: the
command line passes its flags (``--lam``). The constraints of the paper's hyperparameters (eq.
(7): lam_l > 0, rho_l >= 0, gamma_l >= 0) are :data:`LAM`, :data:`RHO` and :data:`GAMMA`; their
defaults live in ``defaults.py``.

**Sane bounds.** A weight (lam, rho, gamma, a learning rate) is at most :data:`MAX_WEIGHT` = 1e6,
four orders of magnitude above the largest value measured useful (the paper's gamma 100); a
tolerance (a scaled KKT residual, ``blocks.kkt_residual``) is at most 1; a run has at most
:data:`MAX_ROUNDS` rounds. Beyond them a value is almost surely a typo (``--lam 1e308``
overflows the objective).

**Data** (:func:`check_matrix`): a dense, real, finite 2-D array (features x data points). Integer
and boolean entries become floats (the working dtype: the network's, else float64); half
precision is upcast with a warning; complex, object, string and masked arrays, and sparse
matrices, are refused by name; so is data whose scale the working precision cannot carry
(:func:`check_scale`): ``max|A|^2 * A.size``, a bound of the squared Frobenius norm of ``A``
and of every entry of the Gram product ``A A^T`` of the blocks, must be at most the square root
of the dtype's largest number, so that the Gram's own squared norm (the blocks' step sizes and
spectral bounds are computed from it) is finite too.

**Memory** (:func:`check_memory`): a network whose weights alone would not fit in this
machine's memory (:func:`memory_budget`) is refused before any array is allocated, with the
GiB it would need.
"""

from __future__ import annotations

import math
import numbers
import os
import warnings
from collections.abc import Collection, Iterable, Mapping
from types import ModuleType
from typing import TYPE_CHECKING, Any, SupportsInt, TypeGuard

if TYPE_CHECKING:  # not imported at run time: ``fenchel-cvx --help`` stays fast
    import numpy as np

    from .arrays import Array

__all__ = [
    "ALTERNATIONS",
    "BOOL",
    "CALLABLE",
    "COUNT",
    "GAMMA",
    "Interval",
    "LAM",
    "MAX_ROUNDS",
    "MAX_WEIGHT",
    "MOMENTUM",
    "Options",
    "PATH",
    "PerLayer",
    "RHO",
    "ROUNDS",
    "SEED",
    "Sizes",
    "TOL",
    "WEIGHT",
    "check",
    "check_dtype",
    "check_memory",
    "check_plain",
    "failure",
    "check_matrix",
    "check_real",
    "check_rounds",
    "check_scale",
    "memory_budget",
    "scale_problem",
    "validate",
]

MAX_WEIGHT = 1e6
MAX_ROUNDS = 10**6


class Constraint:
    """What a value must be. ``applies``: the value has the constraint's type; ``accepts``: it
    satisfies it; ``describe(value)``: what it must be (the side it fails, where it has sides);
    ``convert``: the value normalised (an ``int``, a ``float``, a list of floats)."""

    def applies(self, value: object) -> bool:
        return self.accepts(value)

    def accepts(self, value: object) -> bool:
        raise NotImplementedError

    def describe(self, value: object = None) -> str:
        raise NotImplementedError

    def parts(self) -> list[str]:
        """The description as items of a list of alternatives ("None, 'auto' or ...")."""
        return [self.describe()]

    def convert(self, value: Any) -> Any:  # an accepted value, as the subclass normalises it
        return value


def _is_bool(value: object) -> bool:
    """A Python or NumPy bool (NumPy is not imported for it: ``fenchel-cvx --help`` stays fast)."""
    return isinstance(value, bool) or (
        type(value).__module__ == "numpy" and type(value).__name__ in ("bool", "bool_")
    )


def _is_vector(value: object) -> TypeGuard[Collection[Any]]:
    """A list, tuple or 1-D NumPy array."""
    if type(value).__module__ == "numpy":
        return getattr(value, "ndim", None) == 1
    return isinstance(value, (list, tuple)) and all(not isinstance(v, (list, tuple)) for v in value)


def _g(x: object) -> str:
    return f"{x:g}" if isinstance(x, float) else str(x)


class Interval(Constraint):
    """A number of type ``number`` (``numbers.Integral`` or ``numbers.Real``; never a bool) between
    ``low`` and ``high`` (None: unbounded); ``closed``: which ends belong to it ("both",
    "left", "right", "neither"). A Real must be finite. ``note`` explains an upper bound that
    only caps absurd values (a sane bound): the error then names the side the value fails."""

    def __init__(
        self,
        number: type,
        low: float | None,
        high: float | None,
        closed: str = "both",
        note: str = "",
    ) -> None:
        self.number, self.low, self.high, self.closed, self.note = number, low, high, closed, note

    def applies(self, value: object) -> TypeGuard[numbers.Real]:
        return isinstance(value, self.number) and not _is_bool(value)

    def _above_low(self, v):
        return self.low is None or (
            v >= self.low if self.closed in ("both", "left") else v > self.low
        )

    def _below_high(self, v):
        return self.high is None or (
            v <= self.high if self.closed in ("both", "right") else v < self.high
        )

    def accepts(self, value: object) -> bool:
        return (
            self.applies(value)
            and (self.number is numbers.Integral or math.isfinite(value))
            and self._above_low(value)
            and self._below_high(value)
        )

    def _lower(self):
        op = ">=" if self.closed in ("both", "left") else ">"
        if self.number is numbers.Integral:
            return f"an integer {op} {self.low}"
        return f"{op} {_g(self.low)} and finite"

    def _upper(self):
        op = "<=" if self.closed in ("both", "right") else "<"
        what = "an integer " if self.number is numbers.Integral else ""
        return f"{what}{op} {_g(self.high)}" + (f" ({self.note})" if self.note else "")

    def describe(self, value: object = None) -> str:
        if value is not None and self.applies(value) and (self.high is None or self.note):
            finite = self.number is numbers.Integral or math.isfinite(value)
            if not finite or not self._above_low(value) or self.high is None:
                return self._lower()
            return self._upper()
        if self.high is None:
            return self._lower() if self.number is numbers.Integral else f"a number {self._lower()}"
        left = "[" if self.closed in ("both", "left") else "("
        right = "]" if self.closed in ("both", "right") else ")"
        what = "an integer" if self.number is numbers.Integral else "a number"
        return f"{what} in {left}{_g(self.low)}, {_g(self.high)}{right}"

    def convert(self, value: float) -> int | float:
        return int(value) if self.number is numbers.Integral else float(value)


class Options(Constraint):
    """One of the given values (strings, compared by equality)."""

    def __init__(self, options: Iterable[str]) -> None:
        self.options = tuple(options)

    def accepts(self, value: object) -> bool:
        return isinstance(value, str) and value in self.options

    def describe(self, value: object = None) -> str:
        return f"one of {list(self.options)}"

    def parts(self) -> list[str]:
        return [repr(self.options[0])] if len(self.options) == 1 else [self.describe()]


class _Boolean(Constraint):
    def accepts(self, value: object) -> bool:
        return _is_bool(value)

    def describe(self, value: object = None) -> str:
        return "True or False"

    def parts(self) -> list[str]:
        return ["True", "False"]

    def convert(self, value: object) -> bool:
        return bool(value)


class InstanceOf(Constraint):
    """An instance of ``types``, described as ``text``."""

    def __init__(self, types: type | tuple[type, ...], text: str) -> None:
        self.types, self.text = types, text

    def accepts(self, value: object) -> bool:
        return isinstance(value, self.types)

    def describe(self, value: object = None) -> str:
        return self.text


class _Callable(Constraint):
    def accepts(self, value: object) -> bool:
        return callable(value)

    def describe(self, value: object = None) -> str:
        return "callable"


class PerLayer(Constraint):
    """One value for every layer: a number, or a sequence of ``n`` numbers (any length >= 1
    for ``n=None``), each satisfying ``inner``; converted to a list of ``n`` floats."""

    def __init__(self, inner: Constraint, n: int | None = None) -> None:
        self.inner, self.n = inner, n

    def applies(self, value: object) -> bool:
        return self.inner.applies(value) or (
            _is_vector(value) and (len(value) == self.n if self.n is not None else len(value) >= 1)
        )

    def accepts(self, value: object) -> bool:
        return self.applies(value) and all(self.inner.accepts(v) for v in self._values(value))

    def _values(self, value: Any) -> list[Any]:
        return [value] * (self.n or 1) if self.inner.applies(value) else list(value)

    def describe(self, value: object = None) -> str:
        return f"a number or a sequence of {self.n or ''} numbers".replace("  ", " ")

    def convert(self, value: object) -> list[float]:
        return [self.inner.convert(v) for v in self._values(value)]


class Sizes(Constraint):
    """Layer sizes: a sequence of at least ``min_len`` integers >= 1 (never a bool)."""

    def __init__(self, min_len: int = 1) -> None:
        self.min_len = min_len

    def accepts(self, value: object) -> bool:
        return (
            _is_vector(value)
            and len(value) >= self.min_len
            and all(COUNT.accepts(p) for p in value)
        )

    def describe(self, value: object = None) -> str:
        return (
            "a sequence of positive integers"
            if self.min_len <= 1
            else f"a sequence of at least {self.min_len} positive integers"
        )

    def convert(self, value: Iterable[SupportsInt]) -> tuple[int, ...]:
        return tuple(int(p) for p in value)


# --- the constraints of the package's parameters ---------------------------------------------
_TYPO = "fenchel_cvx.validation.MAX_WEIGHT: a larger weight is almost surely a typo"
#: lambda_l > 0, the weight of B_l (eq. (7))
LAM = Interval(numbers.Real, 0, MAX_WEIGHT, closed="right", note=_TYPO)
#: rho_l >= 0, the Frobenius penalty of W_l
RHO = Interval(numbers.Real, 0, MAX_WEIGHT, note=_TYPO)
#: gamma_l >= 0, the proximal weight of W_l (Algorithm 2)
GAMMA = RHO
#: beta_l in [0, 1), the inertia of W_l across batches (``fit_bcd(momentum=...)``)
MOMENTUM = Interval(numbers.Real, 0, 1, closed="left")
#: any other positive weight or step (a learning rate, a penalty of a peer method)
WEIGHT = LAM
#: a tolerance on a scaled KKT residual (``blocks.kkt_residual``: 1 is the gradient's own scale)
TOL = Interval(
    numbers.Real, 0, 1, closed="right", note="a residual relative to the gradient's scale"
)
#: a count: an integer >= 1 (rounds between checks, threads, sizes, ...)
COUNT = Interval(numbers.Integral, 1, None)
#: the length of a run: iterations, epochs, alternations (at most MAX_ROUNDS)
ROUNDS = Interval(
    numbers.Integral,
    1,
    MAX_ROUNDS,
    note="fenchel_cvx.validation.MAX_ROUNDS: more rounds than a run can finish",
)
ALTERNATIONS = ROUNDS
#: a seed: an integer >= 0
SEED = Interval(numbers.Integral, 0, None)
#: a fraction in (0, 1)
FRACTION = Interval(numbers.Real, 0, 1, closed="neither")
BOOL = _Boolean()
CALLABLE = _Callable()
PATH = InstanceOf((str, os.PathLike), "a path (str or os.PathLike)")


# --- checking ---------------------------------------------------------------------------------
def failure(
    value: object, constraint: Constraint | None | list[Constraint | None]
) -> tuple[str, object] | None:
    """``(what, shown)`` when ``value`` fails ``constraint`` (a constraint or a list of
    alternatives, ``None`` allowing None): what it must be, and the value to show (a
    per-layer sequence shows its first bad element); None when it satisfies it."""
    alternatives = constraint if isinstance(constraint, list) else [constraint]
    if any(value is None if c is None else c.accepts(value) for c in alternatives):
        return None
    real = [c for c in alternatives if c is not None]
    if len(real) == 1 and isinstance(real[0], PerLayer) and real[0].applies(value):
        bad = next(v for v in real[0]._values(value) if not real[0].inner.accepts(v))
        return real[0].inner.describe(bad), bad
    parts = []
    for c in alternatives:
        if c is None:
            parts.append("None")
        elif len(alternatives) == 1 or c.applies(value):
            parts.append(c.describe(value))  # the side it fails
        else:
            parts.extend(c.parts())
    return (parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " or " + parts[-1]), value


def check(
    name: str, value: object, constraint: Constraint | None | list[Constraint | None]
) -> Any:  # the normalised value: of whichever type the constraint converts to
    """``value`` normalised if it satisfies ``constraint`` (a constraint or a list of
    alternatives, ``None`` allowing None), else a ``ValueError`` naming ``name`` and ``value``."""
    failed = failure(value, constraint)
    if failed is not None:
        raise ValueError(f"{name} must be {failed[0]}, got {failed[1]!r}")
    alternatives = constraint if isinstance(constraint, list) else [constraint]
    return next(
        value if c is None else c.convert(value)
        for c in alternatives
        if (value is None if c is None else c.accepts(value))
    )


def validate(
    constraints: Mapping[str, Any],
    values: Mapping[str, object],
    names: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Check every ``values[k]`` against ``constraints[k]``; return the normalised values.
    ``names`` maps a keyword to the name the errors give it (the command line: its flag)."""
    names = names or {}
    return {k: check(names.get(k, k), v, constraints[k]) for k, v in values.items()}


def check_rounds(
    m: int,
    batch_size: int | None,
    epochs: int,
    alternations: int,
    names: Mapping[str, str] | None = None,
) -> None:
    """Refuse, naming the three, an Algorithm-2 schedule of more than ``MAX_ROUNDS`` rounds
    (``epochs`` x the batches of ``batch_size`` among ``m`` points x ``alternations``);
    ``names`` maps the keywords to the names the error gives them."""
    if batch_size is None:
        return
    n = {k: (names or {}).get(k, k) for k in ("epochs", "batch_size", "alternations")}
    batches = -(-m // batch_size)
    if epochs * batches * alternations > MAX_ROUNDS:
        raise ValueError(
            f"{n['epochs']} x batches x {n['alternations']} must be at most "
            f"{MAX_ROUNDS} rounds (MAX_ROUNDS), got {epochs} x {batches} "
            f"({n['batch_size']} {batch_size} of {m} points) x {alternations} = "
            f"{epochs * batches * alternations}"
        )


def check_dtype(dtype: object, name: str = "dtype") -> np.dtype:
    """``dtype`` (a name, a NumPy / CuPy dtype or type, or another array library's float type
    such as ``array_api_strict.float32``) as a NumPy float32 or float64 dtype, or a ValueError
    naming it."""
    import numpy as np

    dt = None
    candidate: Any  # the dtype as given, then its name's last part: either may name a dtype
    if not isinstance(dtype, (bool, numbers.Number)):
        for candidate in (dtype, str(dtype).rsplit(".", 1)[-1]):
            try:
                dt = np.dtype(candidate)
                break
            except TypeError:
                continue
    if dt not in (np.dtype(np.float32), np.dtype(np.float64)):
        raise ValueError(f"{name} must be 'float32' or 'float64', got {dtype!r}")
    return dt


# --- data -------------------------------------------------------------------------------------
def _np_dtype(dt: Any) -> np.dtype:
    """The NumPy dtype of an array's dtype (NumPy, CuPy, or an array-API library's)."""
    import numpy as np

    try:
        return np.dtype(dt)
    except TypeError:
        return np.dtype(str(dt).rsplit(".", 1)[-1])


def check_real(name: str, A: Array) -> np.dtype:
    """Refuse complex, string and object entries of the array ``A`` by name; return the NumPy
    dtype of its entries (a float, integer or bool type)."""
    import numpy as np

    try:
        dt = _np_dtype(A.dtype)
    except TypeError:
        dt = np.dtype(object)
    if np.issubdtype(dt, np.complexfloating):
        raise ValueError(
            f"{name} must be real (Complex data not supported), got {dt.name} "
            f"entries: pass {name}.real if the imaginary part is meant to be dropped"
        )
    if not (np.issubdtype(dt, np.number) or np.issubdtype(dt, np.bool_)):
        raise ValueError(f"{name} must be an array of numbers, got entries of dtype {dt}")
    return dt


def scale_problem(A: Array, dtype: object = None) -> str | None:
    """Why the array ``A`` cannot be computed with in ``dtype`` (default: its own), in words,
    or None: NaN or inf entries, or ``max|A|^2 * A.size`` above the square root of the dtype's
    largest number (the module docstring's bound)."""
    import numpy as np
    from array_api_compat import array_namespace

    xp = np if isinstance(A, np.ndarray) else array_namespace(A)  # also a torch tensor's
    if A.size == 0 if xp is np else math.prod(A.shape) == 0:
        return None
    # max|A| from the largest and the smallest entry, with no |A| the size of the data (MNIST's
    # 784 x 60,000 float32: a fresh 188 MB array costs a process 0.1-0.4 s to fault in)
    hi, lo = float(xp.max(A)), float(xp.min(A))
    if not (math.isfinite(hi) and math.isfinite(lo)):
        return "NaN or inf entries"
    big = max(hi, -lo)
    name = _np_dtype(dtype if dtype is not None else A.dtype).name
    limit = math.sqrt(float(np.finfo(name).max))
    if big * big * math.prod(A.shape) > limit:
        return (
            f"a scale that overflows {name}: its largest entry {big:.3g} squared, times its "
            f"{math.prod(A.shape)} entries, exceeds {limit:.3g} (the square root of "
            f"{name}'s largest number, so that the Gram A A^T and its norm stay finite)"
        )
    return None


def check_scale(name: str, A: Array, dtype: object = None) -> Array:
    """Refuse, naming ``name``, NaN, inf, and a scale that ``dtype`` (the dtype the run
    computes in; default ``A``'s own) cannot carry (:func:`scale_problem`); returns ``A``."""
    problem = scale_problem(A, dtype)
    if problem is None:
        return A
    if problem.startswith("NaN"):
        raise ValueError(f"{name} must be finite, got NaN or inf entries")
    raise ValueError(
        f"{name} has {problem}; rescale it (features of order one, e.g. StandardScaler)"
    )


def memory_budget() -> int | None:
    """The bytes of this machine's physical memory (None where the system does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):  # no sysconf (Windows) or no such name
        try:
            import psutil
        except ImportError:
            return None
        return psutil.virtual_memory().total


def check_memory(name: str, nbytes: int, what: str) -> int:
    """Refuse, naming ``name``, ``nbytes`` (of ``what``, in words) beyond :func:`memory_budget`,
    with the GiB needed, before anything is allocated."""
    budget = memory_budget()
    if budget is not None and nbytes > budget:
        raise ValueError(
            f"{name} needs {nbytes / 2**30:.3g} GiB for {what}, more than this "
            f"machine's {budget / 2**30:.3g} GiB of memory"
        )
    return nbytes


def _as_array(name: str, A: Array, dtype: object, xp: ModuleType | None) -> Array:
    """``A`` as an array of ``xp`` (default: its own library, NumPy for anything else) in the
    working dtype: ``dtype``, else A's float32 / float64, else float64."""
    import numpy as np

    module = type(A).__module__
    if module.startswith("scipy.sparse") or module.split(".")[0] == "sparse":
        raise ValueError(
            f"{name} must be a dense array, got a {module.split('.')[0]}.sparse "
            f"{type(A).__name__}: pass {name}.toarray() (every block of the lifted "
            f"problem is dense)".replace("sparse.sparse", "sparse")
        )
    check_plain(name, A)
    where = "" if xp is None else f" that {xp.__name__} takes"
    if xp is None:
        from .arrays import namespace

        xp = namespace(A)
    given = f"{type(A).__module__}.{type(A).__name__}" + (
        f" of dtype {A.dtype}" if hasattr(A, "dtype") else ""
    )
    try:
        if xp is np:
            A = np.asarray(A.detach().cpu() if hasattr(A, "detach") else A)
        else:
            A = xp.asarray(A)
        if xp is np and (np.issubdtype(A.dtype, np.character) or np.issubdtype(A.dtype, np.void)):
            raise TypeError
    except (TypeError, ValueError, AttributeError, RuntimeError):
        raise ValueError(f"{name} must be a 2-D array of numbers{where}, got {given}") from None
    if xp is np and A.dtype == object:  # Python numbers only: never a parsed string
        A = _object_numbers(name, A)
    current = check_real(name, A)
    floating = np.issubdtype(current, np.floating)
    target = (
        check_dtype(dtype)
        if dtype is not None
        else (current if floating and current.itemsize >= 4 else np.dtype(np.float64))
    )
    if floating and current.itemsize == 2:
        whose = "the network's " if dtype is not None else ""
        warnings.warn(
            f"{name} is {current.name}: upcast to {whose}{target.name} (half precision "
            "is too coarse for the block solvers' tolerances)",
            UserWarning,
            stacklevel=4,
        )
    if current != target:
        A = A.astype(target) if xp is np else xp.astype(A, getattr(xp, target.name))
    return A


def check_plain(name: str, A: Array) -> Array:
    """Refuse, naming ``name``, a masked array (its mask would be dropped) and an object array
    holding anything but real numbers (a string such as ``"1.5"`` is never parsed); returns
    ``A``."""
    import numpy as np

    if isinstance(A, np.ma.MaskedArray):
        raise ValueError(
            f"{name} must be a plain array, got a masked array with "
            f"{int(np.ma.count_masked(A))} masked entries: the mask would be "
            f"dropped; pass {name}.filled(value) or drop the masked data points"
        )
    if isinstance(A, np.ndarray) and A.dtype == object:
        _object_numbers(name, A)
    return A


def _object_numbers(name: str, A: np.ndarray) -> np.ndarray:
    """An object array of real Python or NumPy numbers as float64, or a ValueError naming
    ``name`` and the first entry that is not one (a string such as ``"1.5"`` is never parsed)."""
    import numpy as np

    for index, v in np.ndenumerate(A):
        if not isinstance(v, numbers.Real) or _is_bool(v):
            raise NotNumbersError(
                f"{name} must be an array of numbers, got an object array "
                f"holding {type(v).__name__} {v!r} at {index}: each argument "
                f"must be a real number, not a string or another object; "
                f"convert it to numbers first"
            )
    return A.astype(np.float64)


class NotNumbersError(ValueError, TypeError):
    """An array holding entries that are not numbers: a ``ValueError`` like every refusal of
    bad input, and a ``TypeError`` as NumPy's and scikit-learn's own conversions raise."""


def check_matrix(
    name: str,
    A: Array,
    *,
    dtype: object = None,
    xp: ModuleType | None = None,
    rows: int | None = None,
    cols: int | None = None,
    rows_what: str | None = None,
) -> Array:
    """``A`` as a dense, real, finite 2-D array (features x data points) in the working dtype
    (``dtype``, else its own float32 / float64, else float64) of ``xp`` (the data's library),
    or a ``ValueError`` naming ``name``. ``rows`` / ``cols``: the shape it must have;
    ``rows_what``: what the rows are (named in the error)."""
    A = _as_array(name, A, dtype, xp)
    if A.ndim != 2:
        raise ValueError(
            f"{name} must be a 2-D array (features x data points), got shape {tuple(A.shape)}"
        )
    if rows is not None and A.shape[0] != rows:
        what = f" ({rows_what})" if rows_what else ""
        raise ValueError(f"{name} must have {rows} rows{what}, got shape {tuple(A.shape)}")
    if cols is not None and A.shape[1] != cols:
        raise ValueError(
            f"{name} must have {cols} columns (data points), got shape {tuple(A.shape)}"
        )
    if A.shape[1] == 0 or A.shape[0] == 0:
        raise ValueError(f"{name} must hold at least one data point, got shape {tuple(A.shape)}")
    return check_scale(name, A)
