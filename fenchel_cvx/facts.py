"""Facts: what the solvers ask of an activation, a loss, a layer kind or a block, and the refusal
of one that lacks it.

Each activation (``activations.py``: phi of Theorem 1, its pair F, F* of the paper's eq. (4)),
each loss (``losses.py``), each layer kind (``layers.py``: a layer as a linear map, the paper's
Sec. 4.2, eqs. (10)-(11)) and each block (``blocks.py``: the convex blocks of Sec. 4.5) is a
class that carries what the solvers need as methods and attributes: its *facts*. A base class
marks a fact that a subclass must give with ``stub`` (or ``placeholder``); an optional one is
an attribute None. ``has_fact`` tells whether an object carries one, and ``require`` refuses,
before any work, an object that lacks a fact a caller needs, naming its class and the fact.
``Registry`` is the one table of each kind, by name, that takes a class only once it carries
its kind's facts.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, Generic, TypeVar


class Named:
    """What an activation and a loss share: the registry's ``name``, the parameters that build
    one again (``params``; ``config`` adds the name: what save / load records) and a repr that
    shows both (``kind``: how the registry's builder is called)."""

    name = "named"
    kind = "named"

    def __repr__(self) -> str:
        params = "".join(f", {k}={v!r}" for k, v in self.params().items())
        return f"{self.kind}({self.name!r}{params})"

    def params(self) -> dict[str, Any]:
        """The parameters that the registry's builder takes to build this one again."""
        return {}

    def config(self) -> dict[str, Any]:
        """``{"name": ..., **params}``: what a saved network records of it.

        >>> from fenchel_cvx.activations import LeakyReLU
        >>> LeakyReLU(slope=0.1).config()
        {'name': 'leaky_relu', 'slope': 0.1}
        """
        return {"name": self.name, **self.params()}


_C = TypeVar("_C", bound=type)
_F = TypeVar("_F", bound=Callable[..., Any])
_N = TypeVar("_N")


def stub(fact: str) -> Callable[..., Any]:
    """A base class's placeholder for the method ``fact``: it raises ``NotImplementedError``,
    and ``has_fact`` reads it as absent.

    >>> class Shape:
    ...     area = stub("area")
    >>> Shape().area()
    Traceback (most recent call last):
    ...
    NotImplementedError: Shape has no area
    >>> has_fact(Shape, "area")
    False
    """

    def missing(self: object, *args: object, **kwargs: object) -> Any:
        raise NotImplementedError(f"{type(self).__name__} has no {fact}")

    missing.__name__ = fact
    setattr(missing, "missing_fact", True)  # noqa: B010 (a function has no declared attributes)
    return missing


def placeholder(method: _F) -> _F:
    """``stub`` for a method written out in the base class (its signature and docstring kept,
    its body raising ``NotImplementedError``): ``has_fact`` reads it as absent.

    >>> class Shape:
    ...     @placeholder
    ...     def area(self) -> float:
    ...         raise NotImplementedError("Shape has no area")
    >>> has_fact(Shape, "area")
    False
    """
    setattr(method, "missing_fact", True)  # noqa: B010 (a function has no declared attributes)
    return method


def has_fact(obj: object, fact: str) -> bool:
    """Whether ``obj`` (an activation or a loss, or its class) carries ``fact``: a method of
    its own (not a ``stub``) or an attribute that is not None.

    >>> class Shape:
    ...     area = stub("area")
    ...     perimeter = None  # an optional fact
    >>> class Square(Shape):
    ...     def area(self):
    ...         return 1.0
    >>> has_fact(Square, "area"), has_fact(Square(), "perimeter"), has_fact(Shape, "area")
    (True, False, False)
    """
    value = getattr(obj, fact, None)
    return value is not None and not getattr(value, "missing_fact", False)


def require(obj: Any, facts: Iterable[str], who: str) -> Any:
    """``obj``, or a ``ValueError`` naming its class and the first of ``facts`` it lacks, which
    ``who`` needs. (Typed ``Any``: a caller reads the facts it required, which ``obj``'s class
    may declare optional, None.)

    >>> from fenchel_cvx.activations import ReLU
    >>> require(ReLU(), ["phi", "F"], "the X-blocks")
    activation('relu')
    >>> require(ReLU(), ["phi", "log_cosh"], "my solver")
    Traceback (most recent call last):
    ...
    ValueError: ReLU lacks the fact 'log_cosh', which my solver needs: define ReLU.log_cosh
    """
    cls = obj if isinstance(obj, type) else type(obj)
    for fact in facts:
        if not has_fact(obj, fact):
            raise ValueError(
                f"{cls.__name__} lacks the fact {fact!r}, which {who} needs: "
                f"define {cls.__name__}.{fact}"
            )
    return obj


class Registry(dict[str, type[_N]], Generic[_N]):
    """``name -> class`` for one kind (activations, losses, layer kinds): the one table keyed by
    their names (the class attribute ``key``: ``name``; a layer kind's is ``kind``).

    ``register(cls)`` adds a subclass of ``base`` under its name once it carries ``facts`` (a
    list, or a function of the class that gives its list: a layer with weights needs other
    facts than one without); a class that lacks one is refused with a ``ValueError`` naming the
    class and the fact; a name another class holds is refused (a class counts as the one it
    replaces where its module and qualified name are the same: a module reloaded).
    ``build(name, params)`` makes the registered class with ``params``, or passes an instance of
    ``base`` through once it carries its facts.

    >>> class Shape(Named):
    ...     kind = "shape"
    ...     area = stub("area")
    >>> SHAPES = Registry("shape", Shape, ["area"])
    >>> @SHAPES.register
    ... class Square(Shape):
    ...     name = "square"
    ...     def __init__(self, side=1.0):
    ...         self.side = side
    ...     def params(self):
    ...         return {"side": self.side}
    ...     def area(self):
    ...         return self.side**2
    >>> square = SHAPES.build("square", {"side": 3.0})
    >>> square, square.area(), square.config()
    (shape('square', side=3.0), 9.0, {'name': 'square', 'side': 3.0})
    >>> @SHAPES.register
    ... class Circle(Shape):
    ...     name = "circle"
    Traceback (most recent call last):
    ...
    ValueError: Circle lacks the fact 'area', which every solver needs: define Circle.area
    """

    def __init__(
        self,
        kind: str,
        base: type[_N],
        facts: Iterable[str] | Callable[[type], Iterable[str]],
        key: str = "name",
    ) -> None:
        super().__init__()
        self.kind, self.base, self.key = kind, base, key
        self._facts = facts if callable(facts) else tuple(facts)

    def facts_of(self, cls: type) -> tuple[str, ...]:
        """The facts that ``cls`` must carry to be registered."""
        return tuple(self._facts(cls)) if callable(self._facts) else self._facts

    def register(self, cls: _C) -> _C:
        new: object = cls  # checked as a subclass of base below; ``cls`` keeps its own type
        if not (isinstance(new, type) and issubclass(new, self.base)):
            raise ValueError(
                f"register_{self.kind} takes a subclass of {self.base.__name__}, got {cls!r}"
            )
        require(new, self.facts_of(new), "every solver")
        name = getattr(new, self.key)
        if not isinstance(name, str) or name == getattr(self.base, self.key):
            raise ValueError(
                f"{new.__qualname__} needs a {self.key} of its own to be registered as a "
                f"{self.kind}, got {name!r}"
            )
        held = self.get(name)
        if held is not None and _where(held) != _where(new):
            raise ValueError(
                f"the {self.kind} name {name!r} is taken by "
                f"{held.__qualname__} of {held.__module__}, refused for "
                f"{new.__qualname__} of {new.__module__}: give it another name"
            )
        self[name] = new
        return cls

    def build(self, name: str | _N, params: Mapping[str, Any]) -> _N:
        if isinstance(name, self.base):
            return require(name, self.facts_of(type(name)), "every solver")
        if not isinstance(name, str) or name not in self:
            raise ValueError(f"{self.kind} must be one of {sorted(self)}, got {name!r}")
        return self[name](**params)


def _where(cls: type) -> tuple[str, str]:
    """``(module, qualname)``: what tells two classes of one name apart (a reloaded module's
    class is the same one)."""
    return cls.__module__, cls.__qualname__
