"""Facts: what the solvers ask of an activation or a loss, and the refusal of one that lacks it.

Each activation (``activations.py``: phi of Theorem 1, its pair F, F* of the paper's eq. (4))
and each loss (``losses.py``) is a class that carries what the solvers need as methods and
attributes: its *facts*. A base class marks a fact that a subclass must give with ``stub``; an
optional one is an attribute None. ``has_fact`` tells whether an object carries one, and
``require`` refuses, before any work, an object that lacks a fact a caller needs, naming its
class and the fact.
"""


class Named:
    """What an activation and a loss share: the registry's ``name``, the parameters that build
    one again (``params``; ``config`` adds the name: what save / load records) and a repr that
    shows both (``kind``: how the registry's builder is called)."""

    name = "named"
    kind = "named"

    def __repr__(self):
        params = "".join(f", {k}={v!r}" for k, v in self.params().items())
        return f"{self.kind}({self.name!r}{params})"

    def params(self):
        """The parameters that the registry's builder takes to build this one again."""
        return {}

    def config(self):
        """``{"name": ..., **params}``: what a saved network records of it."""
        return {"name": self.name, **self.params()}


def stub(fact):
    """A base class's placeholder for the method ``fact``: it raises ``NotImplementedError``,
    and ``has_fact`` reads it as absent."""

    def missing(self, *args, **kwargs):
        raise NotImplementedError(f"{type(self).__name__} has no {fact}")

    missing.__name__, missing.missing_fact = fact, True
    return missing


def has_fact(obj, fact):
    """Whether ``obj`` (an activation or a loss, or its class) carries ``fact``: a method of
    its own (not a ``stub``) or an attribute that is not None."""
    value = getattr(obj, fact, None)
    return value is not None and not getattr(value, "missing_fact", False)


def require(obj, facts, who):
    """``obj``, or a ``ValueError`` naming its class and the first of ``facts`` it lacks, which
    ``who`` needs."""
    cls = obj if isinstance(obj, type) else type(obj)
    for fact in facts:
        if not has_fact(obj, fact):
            raise ValueError(
                f"{cls.__name__} lacks the fact {fact!r}, which {who} needs: "
                f"define {cls.__name__}.{fact}"
            )
    return obj


class Registry(dict):
    """``name -> class`` for one kind (activations, losses): the one table keyed by their names.

    ``register(cls)`` adds a subclass of ``base`` under ``cls.name`` once it carries ``facts``
    (a ``ValueError`` naming the class and the fact it lacks); a name another class holds is
    refused (a class counts as the one it replaces where its module and qualified name are the
    same: a module reloaded). ``build(name, params)`` makes the registered class with
    ``params``, or passes an instance of ``base`` through once it carries ``facts``."""

    def __init__(self, kind, base, facts):
        super().__init__()
        self.kind, self.base, self.facts = kind, base, tuple(facts)

    def register(self, cls):
        if not (isinstance(cls, type) and issubclass(cls, self.base)):
            raise ValueError(
                f"register_{self.kind} takes a subclass of {self.base.__name__}, got {cls!r}"
            )
        require(cls, self.facts, "every solver")
        held = self.get(cls.name)
        if held is not None and _where(held) != _where(cls):
            raise ValueError(
                f"the {self.kind} name {cls.name!r} is taken by "
                f"{held.__qualname__} of {held.__module__}, refused for "
                f"{cls.__qualname__} of {cls.__module__}: give it another name"
            )
        self[cls.name] = cls
        return cls

    def build(self, name, params):
        if isinstance(name, self.base):
            return require(name, self.facts, "every solver")
        if not isinstance(name, str) or name not in self:
            raise ValueError(f"{self.kind} must be one of {sorted(self)}, got {name!r}")
        return self[name](**params)


def _where(cls):
    """``(module, qualname)``: what tells two classes of one name apart (a reloaded module's
    class is the same one)."""
    return cls.__module__, cls.__qualname__
