"""The registered activations and losses as test parameters, read from the registries.

A test parametrised over every activation or loss takes its list from here, read from the
registries (``activations.ACTIVATIONS``, ``losses.LOSSES``) when the test module is collected:
a class registered with ``@register_activation`` or ``@register_loss`` (a module of
``fenchel_cvx.extensions``, say) reaches every such test with no test file changed. A test
that needs a subset selects it by a fact of the class (``where``: a predicate on the class,
e.g. ``closed_form_prox``), never by a name; ``tests/test_conformance.py`` checks that the
facts themselves hold.
"""

import math

import numpy as np

from fenchel_cvx.activations import ACTIVATIONS, LeakyReLU, activation, activation_names
from fenchel_cvx.facts import has_fact
from fenchel_cvx.losses import LOSSES, loss, loss_names


def activations(where=None):
    """The registered activations' names, sorted, that ``activation(name)`` builds without a
    parameter (``activation_names``: every one but ``monotone``, which needs a function);
    ``where(cls)``: only those whose class it holds for."""
    return [n for n in activation_names() if where is None or where(ACTIVATIONS[n])]


def losses(where=None):
    """The registered losses' names, sorted; ``where(cls)``: only those whose class it holds
    for."""
    return [n for n in loss_names() if where is None or where(LOSSES[n])]


# --- facts a test selects by ----------------------------------------------------------------
def closed_form_prox(cls):
    """The class gives the X-blocks' prox in closed form (``x_prox``); otherwise the fast
    backend solves it by Newton."""
    return cls.x_prox is not None


def bounded_range(cls):
    """phi's range has a finite end (where B is +inf beyond it)."""
    return any(math.isfinite(end) for end in cls.v_range)


def has_torch_module(cls):
    """The class gives its PyTorch module (the backprop baselines need it)."""
    return has_fact(cls, "torch_module")


def has_cvxpy_forms(cls):
    """The CVXPY oracle has the class's forms (registered in ``oracle.atoms`` or its own
    ``F_cvxpy`` / ``Fstar_cvxpy``, ``value_cvxpy``): the oracle can solve its blocks."""
    from fenchel_cvx.oracle.atoms import has_forms

    return has_forms(cls)


def elementwise_cvxpy_Fstar(cls):
    """The oracle has the class's forms and writes its F* elementwise (not as an epigraph, with
    a variable and constraints of its own: ELU's ``Fstar_cvxpy``)."""
    from fenchel_cvx.oracle.atoms import Fstar_cvx

    return has_cvxpy_forms(cls) and Fstar_cvx.dispatch(cls) is not Fstar_cvx.dispatch(object)


# --- instances and data -----------------------------------------------------------------------
#: the parameters the solver tests build a class with in place of its defaults: leaky ReLU at
#: slope 0.1 (at its default 0.01, F'' = 1/a = 100 below 0 and the blocks are ill-conditioned)
TEST_PARAMS = {LeakyReLU: {"slope": 0.1}}


def built(name):
    """The activation ``name`` with the tests' parameters (``TEST_PARAMS``) or its defaults."""
    return activation(name, **TEST_PARAMS.get(ACTIVATIONS[name], {}))


def clip_bounds(act, margin):
    """``(lo, hi)`` for ``np.clip``: phi's range, each finite end moved ``margin`` inward where
    F' is infinite there (``open_range``), None for an infinite end."""
    act = activation(act)
    inward = margin if act.open_range else 0.0
    lo, hi = act.v_range
    return (
        None if math.isinf(lo) else lo + inward,
        None if math.isinf(hi) else hi - inward,
    )


def takes_labels(name):
    """The loss serves classification only (no regression): its targets are one-hot labels."""
    return "regression" not in loss(name).tasks


def targets(name, k, m, rng):
    """Targets of the loss ``name`` for ``k`` outputs and ``m`` points: one-hot columns of random
    classes where it takes labels (``takes_labels``), standard normal otherwise."""
    if takes_labels(name):
        return np.eye(k)[:, rng.integers(0, k, m)]
    return rng.standard_normal((k, m))
