"""Typed exceptions of fenchel_cvx.

Solver failures name the block, the layer and the status; certificate violations (docs page
"The certificate") name the check, the layer, the two numbers and the tolerance.
Bad user input is a plain ``ValueError`` whose message names the parameter and the value.
A file that fails a check of the package's one checked reader (``files.py``) raises
:class:`FileFormatError`, which names the file, the field or array, and what was expected
against what was found.
"""


class FenchelError(Exception):
    """Base class of every error this package raises on purpose."""


class SolverError(FenchelError):
    """A block solve did not reach status ``optimal``."""

    def __init__(self, block, layer, status, detail=""):
        self.block, self.layer, self.status = block, layer, status
        msg = f"{block} block of layer {layer}: solver status {status!r}"
        super().__init__(msg + (f" ({detail})" if detail else ""))


class SolverInfeasible(SolverError):
    """The solver declared the block infeasible or unbounded (a modelling bug: blocks are
    feasible)."""


class SolverInaccurate(SolverError):
    """The solver stopped at ``optimal_inaccurate`` or its KKT residual exceeds the tolerance."""


class CertificateError(FenchelError):
    """One of the four per-iteration checks failed in strict mode."""

    def __init__(self, check, layer, value, bound, tol, iteration=None):
        self.check, self.layer, self.value, self.bound, self.tol = check, layer, value, bound, tol
        self.iteration = iteration
        where = f"iteration {iteration}, " if iteration is not None else ""
        super().__init__(
            f"certificate check {check!r} failed ({where}layer {layer}): "
            f"{value:.10g} vs bound {bound:.10g}, tolerance {tol:.3g}"
        )


class FileFormatError(FenchelError, ValueError):
    """A file the package reads (a network, a checkpoint, a run's ``run.json``, a history, a
    data set, the input of ``predict``) failed one of the checks made before it is used.

    ``path``: the file; ``field``: the array, key or byte range that failed; ``expected`` and
    ``found``: what the check wanted and what the file holds (both in words). A ``ValueError``
    too, so that code catching bad input catches it."""

    def __init__(self, path, field, expected, found, hint=""):
        self.path, self.field, self.expected, self.found = str(path), field, expected, found
        where = f"{self.path}: {field}" if field else self.path
        super().__init__(
            f"{where}: expected {expected}, found {found}" + (f"; {hint}" if hint else "")
        )
