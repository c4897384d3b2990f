"""The block-solver backends: the protocol they implement and one registry by name.

A backend solves one convex block of the lifted objective (the paper's Sec. 4.5: each block of
Algorithms 1 and 2 is a convex problem, eqs. (14)-(20)) through ``solve(block, start)``. What
the BCD driver asks of it beside that is the :class:`Backend` protocol; :class:`BackendDefaults`
gives every method but ``solve`` a default, for a backend to inherit. Two are registered:

- ``"cvxpy"``: the CVXPY oracle (``fenchel_cvx.oracle.OracleBackend``), certified optimal blocks;
- ``"fast"``: the batched array solvers (``fenchel_cvx.fast.FastBackend``), NumPy or CuPy.

Each is imported only when it is built, so that importing the package (or its fast backend)
loads no CVXPY. A new backend is one class registered under its name (``@register_backend``:
docs page "Add a backend"); any object with a ``solve`` method is accepted in place of a name
(:func:`as_backend` gives it the defaults).
"""

from __future__ import annotations

import importlib
import inspect
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, runtime_checkable

from .validation import COUNT, check

if TYPE_CHECKING:
    from .arrays import Array
    from .blocks import Block, BlockResult
    from .network import LiftedNetwork

#: a backend class, or a backend's name (``register_backend``)
_B = TypeVar("_B", bound="str | type[Any]")

__all__ = [
    "BACKENDS",
    "METHODS",
    "Backend",
    "BackendDefaults",
    "as_backend",
    "check_backend",
    "check_threads",
    "get_backend",
    "register_backend",
]


@runtime_checkable
class Backend(Protocol):
    """What the BCD driver asks of a block solver.

    ``name`` names it in the history; ``tol`` is the accuracy asked of it (None: none, the
    certificate's own); ``threads`` its thread budget over a run (None: leave the pools alone);
    ``images``: whether its ``solve`` takes the start's image and hands back the argmin's (the
    keywords ``image`` and ``return_image``; the driver passes them only where True). An
    optional ``check_threads`` (``BackendDefaults``: 1; read by :func:`check_threads`): the
    threads on which the driver forms its figures over the data points on a checked round
    (``column_threads``), cores the backend leaves idle while the driver checks. An optional
    ``map_norm2(A, W)`` (``FastBackend``'s): the bound of ``||A(W, .)||_2^2`` its X-blocks
    take, or None, which ranks compute each once and share (``layer_split.shared_norms``).
    """

    name: str
    tol: Any
    threads: Any
    images: bool

    def solve(self, block: Block, start: Array | None = None) -> BlockResult:
        """The block's argmin from ``start``: a ``blocks.BlockResult``. Neither ``start`` nor the
        block's arrays are written into (``fit_bcd`` hands a W-block the weights themselves as
        its start and its proximal centre ``W0``). A backend whose ``images`` is True also takes
        ``solve(block, start, image=U, return_image=flag)``: ``U`` = ``block.forward(start)``
        where the caller holds it (the solver may start from it, or ignore it), ``flag``: the
        caller takes the argmin's image back as ``BlockResult.U`` where the solver holds it."""

    def check_network(self, net: LiftedNetwork) -> None:
        """Refuse, before any work, a network its settings do not fit (per-layer settings)."""

    def step_setting(self, block: Block) -> tuple[str, int | None]:
        """``(the setting's name, its step cap for block)``; the cap None where it has none."""

    def settings(self) -> dict:
        """What decides its solves, as a run's history records it (``backend_settings``)."""

    def forget(self) -> None:
        """Drop what it reuses across solves (``fit_bcd`` does at the start of a run and at every
        checkpoint)."""

    def on_compile(self, callback: Callable[[str | None], object]) -> Callable[[], None]:
        """Call ``callback(name)`` when its solves start compiling the kernel ``name`` and
        ``callback(None)`` when that is done (the progress bar shows the compile step by it).
        -> the function that stops the calls."""


class _ClassName:
    """A default ``name``: the class's own name (an instance or subclass may set its own)."""

    def __get__(self, obj, cls=None):
        return (cls or type(obj)).__name__


class BackendDefaults:
    """Every method of :class:`Backend` but ``solve``, with its default: no settings, no step
    cap, nothing to check, reuse or compile; ``tol`` and ``threads`` None; no images taken or
    handed back; the checks on one thread; ``name`` the class's."""

    name: Any = _ClassName()
    tol: Any = None
    threads: Any = None
    images: bool = False
    check_threads: int = 1

    def check_network(self, net: LiftedNetwork) -> None:
        return None

    def step_setting(self, block: Block) -> tuple[str, int | None]:
        return "steps", None

    def settings(self) -> dict:
        return {}

    def forget(self) -> None:
        return None

    def on_compile(self, callback: Callable[[str | None], object]) -> Callable[[], None]:
        return _nothing


#: the methods of :class:`Backend`
METHODS = (
    "solve",
    "check_network",
    "step_setting",
    "settings",
    "forget",
    "on_compile",
)


def _nothing() -> None:
    return None


class _Adapted(BackendDefaults):
    """A backend object that does not implement all of :class:`Backend`: its own methods where
    it has them (callable), the defaults of :class:`BackendDefaults` elsewhere; its own
    ``name``, ``tol``, ``threads`` and ``check_threads`` where it has them."""

    def __init__(self, inner):
        self.inner = inner
        self.name = getattr(inner, "name", type(inner).__name__)
        self.tol, self.threads = getattr(inner, "tol", None), getattr(inner, "threads", None)
        self.images = bool(getattr(inner, "images", False)) and takes_images(inner.solve)
        self.check_threads = check_threads(inner)
        for method in METHODS:
            own = getattr(inner, method, None)
            if callable(own):
                setattr(self, method, own)

    def solve(self, block: Any, start: Any = None, **images: Any) -> Any:
        return self.inner.solve(block, start=start, **images)


def check_threads(backend: Any) -> int:
    """The backend's ``check_threads`` (1 where it has none), checked: a positive integer.

    >>> check_threads(object()), check_threads(BackendDefaults())
    (1, 1)
    """
    return check("check_threads", getattr(backend, "check_threads", 1), COUNT)


def as_backend(obj: Any) -> Backend:
    """``obj`` itself where it implements :class:`Backend`, else ``obj`` with the defaults.

    Examples
    --------
    >>> class Nothing:
    ...     def solve(self, block, start=None): ...
    >>> backend = as_backend(Nothing())
    >>> backend.name, backend.settings(), backend.step_setting(None)
    ('Nothing', {}, ('steps', None))

    A backend whose ``images`` is True but whose ``solve`` takes no ``image`` keyword (a
    subclass of one that overrides ``solve(block, start)``) is adapted to take none.
    """
    complete = isinstance(obj, Backend) and all(callable(getattr(obj, m)) for m in METHODS)
    if complete and (not obj.images or takes_images(obj.solve)):
        return obj
    return _Adapted(obj)


def takes_images(solve: Callable) -> bool:
    """Whether ``solve(block, start, image=..., return_image=...)`` is a call ``solve`` takes."""
    try:
        inspect.signature(solve).bind(None, None, image=None, return_image=False)
    except TypeError:
        return False
    return True


def _lazy(module, cls):
    """A factory that imports ``module`` (relative to this package) only when called; the
    keyword ``strict`` goes to a class whose constructor takes it and is dropped otherwise."""

    def make(**kwargs):
        return _build(getattr(importlib.import_module(module, __package__), cls), kwargs)

    make.__name__ = cls
    return make


def _build(klass, kwargs):
    """``klass(**kwargs)``, ``strict`` dropped where its constructor does not take it."""
    if "strict" in kwargs and "strict" not in inspect.signature(klass).parameters:
        kwargs = {k: v for k, v in kwargs.items() if k != "strict"}
    return klass(**kwargs)


def _factory(klass):
    """The registry's factory of a registered class (``_build``)."""

    def make(**kwargs):
        return _build(klass, kwargs)

    make.__name__ = klass.__name__
    return make


#: name -> factory(**kwargs) -> backend object
BACKENDS: dict[str, Callable[..., Any]] = {}


def register_backend(backend: _B, module: str | None = None, cls: str | None = None) -> _B:
    """Register a backend: a class decorator, ``@register_backend`` on a class with a ``name``
    (its constructor's keywords are ``get_backend``'s), as ``register_activation`` is; or a
    name, the module and the class's name (e.g. ``"fast", ".fast", "FastBackend"``), imported
    only when built. A name already taken is refused. -> ``backend``.

    >>> @register_backend
    ... class Nearest(BackendDefaults):
    ...     name = "nearest"
    ...     def solve(self, block, start=None): ...
    >>> type(get_backend("nearest")).__name__
    'Nearest'
    >>> register_backend(Nearest)
    Traceback (most recent call last):
    ...
    ValueError: backend name 'nearest' is taken (by Nearest)
    >>> del BACKENDS["nearest"]
    """
    if isinstance(backend, str):
        name, factory = backend, _lazy(module, cls)
    else:
        name, factory = backend.name, _factory(backend)
    if not isinstance(name, str) or not name:
        raise ValueError(f"a backend's name must be a non-empty string, got {name!r}")
    if name in BACKENDS:
        taken = getattr(BACKENDS[name], "__name__", repr(BACKENDS[name]))
        raise ValueError(f"backend name {name!r} is taken (by {taken})")
    BACKENDS[name] = factory
    return backend


register_backend("cvxpy", ".oracle", "OracleBackend")
register_backend("fast", ".fast", "FastBackend")


def check_backend(backend: object) -> None:
    """Refuse, by name, a backend that is neither a registered name nor an object with ``solve``."""
    if isinstance(backend, str) and backend in BACKENDS:
        return
    if not isinstance(backend, str) and callable(getattr(backend, "solve", None)):
        return
    raise ValueError(
        f"backend must be one of {sorted(BACKENDS)} or an object with a "
        f"solve(block, start) method, got {backend!r}"
    )


def get_backend(
    backend: str | object = "cvxpy", net: LiftedNetwork | None = None, **kwargs: object
) -> Backend:
    """A backend object: built from a registry name with ``kwargs`` (``strict`` only where its
    constructor takes it), or an object with ``.solve`` (used as given, with the defaults of
    :class:`BackendDefaults` where it lacks a method: ``kwargs`` only build a backend by name).
    ``net``: the backend checks the network it will solve the blocks of, before any work."""
    check_backend(backend)
    obj = as_backend(BACKENDS[backend](**kwargs) if isinstance(backend, str) else backend)
    if net is not None:
        obj.check_network(net)
    return obj


def _optional(backend, name):
    """Deprecated: the backend's method ``name``, or None (a backend implements
    :class:`Backend`, or inherits :class:`BackendDefaults`)."""
    method = getattr(backend, name, None)
    return method if callable(method) else None


_DEPRECATED = {
    "optional": ("use the Backend protocol's methods", lambda: _optional),
    "STRICT_AWARE": ("get_backend passes strict to a constructor that takes it", lambda: {"cvxpy"}),
}


def __getattr__(name):
    if name in _DEPRECATED:
        why, value = _DEPRECATED[name]
        warnings.warn(f"backends.{name} is deprecated: {why}", DeprecationWarning, stacklevel=2)
        return value()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
