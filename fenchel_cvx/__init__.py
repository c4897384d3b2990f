"""fenchel_cvx: Fenchel lifted networks (Gu, Askari, El Ghaoui, AISTATS 2020),
convex-optimization first.

Public names only; the docs pages hold the mathematics and the layout. The
names load lazily (PEP 562), so ``fenchel-cvx --help`` and ``import fenchel_cvx`` import
neither CVXPY nor PyTorch until a name that needs them is used.
"""

import importlib
import sys
import types

__version__ = "0.1.0"

_WHERE = {
    "ACTIVATIONS": "activations",
    "Activation": "activations",
    "activation": "activations",
    "monotone": "activations",
    "BACKENDS": "backends",
    "BCDResult": "bcd",
    "BCDState": "bcd",
    "fit_bcd": "bcd",
    "FenchelClassifier": "estimator",
    "FenchelRegressor": "estimator",
    "CertificateError": "errors",
    "FenchelError": "errors",
    "SolverError": "errors",
    "History": "history",
    "LOSSES": "losses",
    "loss": "losses",
    "LiftedNetwork": "network",
    "lenet5": "network",
    "Dense": "layers",
    "Conv2d": "layers",
    "AvgPool2d": "layers",
    "Flatten": "layers",
    "predict": "predict",
    "predict_classes": "predict",
}
__all__ = sorted(_WHERE)


def __getattr__(name):
    if name in _WHERE:
        value = getattr(importlib.import_module(f".{_WHERE[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + __all__)


class _Package(types.ModuleType):
    def __setattr__(self, name, value):
        if name in _WHERE and isinstance(value, types.ModuleType):
            return  # loading the submodule predict never hides the function predict
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
