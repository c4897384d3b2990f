"""The block-solver backends by name: one registry for the driver, ``predict`` and the estimator.

A backend solves one convex block of the lifted objective (the paper's Sec. 4.5: each block of
Algorithms 1 and 2 is a convex problem) through ``solve(block, start)``. Two are registered:

- ``"cvxpy"``: the CVXPY oracle (``fenchel_cvx.oracle.OracleBackend``), certified optimal blocks;
- ``"fast"``: the batched array solvers (``fenchel_cvx.fast.FastBackend``), NumPy or CuPy.

Each is imported only when it is built, so that importing the package (or its fast backend)
loads no CVXPY. Any object with a ``solve`` method is accepted in place of a name.
"""
import importlib

__all__ = ["BACKENDS", "STRICT_AWARE", "check_backend", "get_backend", "optional",
           "register_backend"]


def _lazy(module, cls):
    """A factory that imports ``module`` (relative to this package) only when called."""
    def make(**kwargs):
        return getattr(importlib.import_module(module, __package__), cls)(**kwargs)
    make.__name__ = cls
    return make


#: name -> factory(**kwargs) -> backend object
BACKENDS = {}


def register_backend(name, module, cls):
    """Register the backend class ``cls`` of ``module`` (e.g. ``".fast"``) under ``name``."""
    BACKENDS[name] = _lazy(module, cls)


register_backend("cvxpy", ".oracle", "OracleBackend")
register_backend("fast", ".fast", "FastBackend")

#: registry names whose constructor takes ``strict`` (the driver's recorded mode builds them
#: non-strict, so inaccurate solves are recorded instead of raised)
STRICT_AWARE = {"cvxpy"}


def check_backend(backend):
    """Refuse, by name, a backend that is neither a registered name nor an object with ``solve``."""
    if isinstance(backend, str) and backend in BACKENDS:
        return
    if not isinstance(backend, str) and callable(getattr(backend, "solve", None)):
        return
    raise ValueError(f"backend must be one of {sorted(BACKENDS)} or an object with a "
                     f"solve(block, start) method, got {backend!r}")


def optional(backend, name):
    """The backend's optional method ``name``, or None where it has none. Beside ``solve``, a
    backend may offer ``check_network(net)`` (per-layer settings checked before any work),
    ``steps_of(block)`` (its step cap for the block), ``settings()`` (what decides its solves,
    for the history) and ``forget()`` (drop what it reuses across solves, at a checkpoint):
    ``FastBackend`` offers all four, ``OracleBackend`` ``settings``."""
    method = getattr(backend, name, None)
    return method if callable(method) else None


def get_backend(backend="cvxpy", net=None, **kwargs):
    """A backend object: built from a registry name with ``kwargs``, or an object with ``.solve``
    (used as given: ``kwargs`` only build a backend by name).
    ``net``: a backend with ``check_network`` (per-layer settings: ``FastBackend``) checks the
    network it will solve the blocks of, before any work."""
    check_backend(backend)
    obj = BACKENDS[backend](**kwargs) if isinstance(backend, str) else backend
    check_network = optional(obj, "check_network")
    if net is not None and check_network is not None:
        check_network(net)
    return obj
