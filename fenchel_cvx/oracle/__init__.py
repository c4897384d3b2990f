"""The CVXPY correctness oracle: every block of the lifted objective solved to certified optimality.

docs/mathematics.md, "The four blocks"; docs/certificate.md, check 4. ``OracleBackend`` solves the
four blocks of ``blocks.py`` (X hidden, X last for MSE and cross-entropy, W hidden, W last, with
the optional proximal term gamma ||W - W0||^2 and the penalty rho ||W||_F^2) by small DPP
templates compiled once per shape (``templates.py``), the MSE + ReLU X_L block by
nonnegative least squares (``nnls.py``), and the (leaky) ReLU hidden and the last W-blocks and
the cross-entropy and the MSE + ReLU X_L blocks by exact methods certified by their KKT residual
(``exact.py``, ``ce_columns.py``, ``output_dual.py``: the MSE one by its dual in the output
dimension, with the nonnegative least squares as its fallback; the templates are the fallback
of the others); ``active_rows.py`` solves ReLU W-rows on many points by active-set Newton, on
Dask workers where there are any (``dask_rows.py``; ``cluster.py`` starts the oracle's own);
``polish.py`` takes Newton steps from the solver's point
where its residual exceeds the tolerance. ``block_problem(block)`` returns the whole block as one
explicit ``cp.Problem`` for reading and printing. ``certify(block, Z)`` checks anyone's solution
(``certify.py``); ``wellposed.py`` finds W-blocks without a minimiser before a solve and solves
those that are not strictly convex by proximal steps.
"""

from .backend import ATTEMPTS, DEFAULT_SOLVER, SOLVER_OPTS, OracleBackend, check_block
from .certify import BlockCertificate, certify
from .nnls import solve_x_last as nnls_x_last
from .polish import polish as polish_block
from .templates import TemplateError, block_problem
from .wellposed import NoMinimiser

__all__ = [
    "OracleBackend",
    "block_problem",
    "check_block",
    "nnls_x_last",
    "polish_block",
    "TemplateError",
    "DEFAULT_SOLVER",
    "SOLVER_OPTS",
    "ATTEMPTS",
    "certify",
    "BlockCertificate",
    "NoMinimiser",
]
