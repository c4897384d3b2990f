"""Deprecated alias of :mod:`fenchel_cvx.paper_hyperparameters` (Algorithm 2, eq. (13)).

The paper's batched hyperparameters in this package's units moved to
``fenchel_cvx.paper_hyperparameters``; importing this module warns and gives the same names.
"""

import warnings

from .paper_hyperparameters import __all__, from_reference  # noqa: F401

warnings.warn(
    "fenchel_cvx.units is deprecated; use fenchel_cvx.paper_hyperparameters",
    DeprecationWarning,
    stacklevel=2,
)
