"""Activations (Theorem 1: phi and the pair F, F* of the paper's eq. (4)) and output losses (the
loss of eq. (3)) added as one file each: every module of this package is imported
when ``fenchel_cvx.activations`` or ``fenchel_cvx.losses`` loads, and registers its classes
(``register_activation``, ``register_loss``), so that a new one needs no other file to change.

- ``elu``: the ELU activation, ``phi(u) = u`` for ``u >= 0``, ``e^u - 1`` below;
- ``huber``: the Huber loss for regression.

docs page "Add an activation or a loss" walks through one.
"""

import importlib
import pkgutil

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")
