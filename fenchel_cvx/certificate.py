"""The per-iteration certificate of the BCD driver (docs/certificate.md;
the paper's Algorithms 1-2).

At every iteration (Algorithm 1) or every alternation of every batch (Algorithm 2) the driver
asks a :class:`Certificate` four questions about the iterate ``(W, X)``:

1. ``fenchel_young``: every elementwise divergence ``B_l(X_{l+1}, W_l X~_l) >= -tol``, and every
   ``X_{l+1}`` lies in the range of ``phi_l`` (Theorem 1: B >= 0 with equality iff
   ``X_{l+1} = phi_l(W_l X~_l)``; a point outside the range has ``B = +inf``).
2. ``descent``: no block update raised its block value (the part of F that depends on the block,
   so the change of F itself) by more than ``tol * (|F| + 1)``.
3. ``lower_bound``: after the X-sweep, ``F(W, X) <= J(W) + tol * (|J| + 1)`` at the same weights:
   the feed-forward point is feasible for every X-block with ``B = 0``, so the lifted objective
   (a Lagrangian relaxation) lies below the network objective there. The driver starts each
   X-sweep from the feed-forward point whenever the carried-over X are worse than it (see
   ``bcd.py``), so exact X-blocks keep this bound.
4. ``block_optimality``: the certificate trusts no backend's report about its own point. The
   returned argmin must have the block's shape, be finite and lie in the block's domain
   (``check_argmin``: else the block fails at once, by name); its KKT residual
   (``blocks.kkt_residual``) is recomputed here from the argmin, recorded, the maximum reported,
   and checked against ``residual_tol`` (``fit_bcd`` sets it to the larger of its ``tol`` and the
   backend's). The backend's status
   can only fail a block (a status other than ``"optimal"``, or ``converged=False``), never pass
   it.

The certificate is handed what it checks (the lifted variables, the pre-activations, the
blocks' values, argmins and residuals) and reaches back into no network or block solver; the
driver (``bcd.py``) computes them.

In strict mode (the oracle's default) the first violation raises
:class:`~fenchel_cvx.errors.CertificateError` naming the check, the layer, the two numbers, the
tolerance and the iteration; otherwise violations are recorded and the run goes on. Every
outcome is a plain dict, so the history can be written as JSON.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Protocol

from array_api_compat import array_namespace

from .arrays import Array
from .errors import CertificateError
from .reduce import LOCAL, Comm
from .validation import TOL, check

if TYPE_CHECKING:
    from .activations import Activation

CHECKS = ("fenchel_young", "descent", "lower_bound", "block_optimality")


class _Domain(Protocol):
    """What the argmin checks ask of a block (``blocks.Block``, which this module does not
    import: ``blocks`` reaches it through ``network``)."""

    def project(self, Z: Array) -> Array: ...

    def in_domain(self, Z: Array) -> Array: ...

    def maxima(self, figures: list[Array], comm: Comm = ...) -> list[Any]: ...


class _Solved(Protocol):
    """What ``check_block`` reads of a block's result (``blocks.BlockResult``)."""

    @property
    def status(self) -> str: ...

    @property
    def converged(self) -> bool: ...


@dataclass
class Violation:
    """One failed check: ``value`` should have been ``<= bound`` (``>= bound`` for
    fenchel_young)."""

    check: str
    layer: object  # int, a block name like "W_2", or None for whole-network checks
    value: float
    bound: float
    tol: float
    iteration: int | None = None
    detail: str = ""
    capped: bool = False  # a block stopped at the step cap it was given: inexact by design

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def error(self) -> CertificateError:
        return CertificateError(
            self.check, self.layer, self.value, self.bound, self.tol, self.iteration
        )


class Certificate:
    """Runs the four checks of one iteration and collects their outcome.

    Parameters
    ----------
    strict : raise ``CertificateError`` at the first violation (True) or record it (False).
    tol : the tolerance of the checks (absolute for Fenchel-Young, relative to ``|F| + 1`` for
        descent and to ``|J| + 1`` for the lower bound).
    residual_tol : if not None, a block whose KKT residual exceeds it fails ``block_optimality``.
    """

    def __init__(
        self, strict: bool = True, tol: float = 1e-6, residual_tol: float | None = None
    ) -> None:
        tol = check("tol", tol, TOL)  # the one tolerance rule (validation.TOL)
        if residual_tol is not None and not residual_tol > 0:
            raise ValueError(f"residual_tol must be > 0 or None, got {residual_tol!r}")
        self.strict, self.tol, self.residual_tol = bool(strict), float(tol), residual_tol
        self.begin(None)

    # --- bookkeeping --------------------------------------------------------------------------
    def begin(self, iteration: int | None, full: bool = True, restarted: bool = False) -> None:
        """Start the checks of a new iteration (``full=False``: block optimality only);
        ``restarted``: its X-sweep starts from the feed-forward point (the restart rule)."""
        self.iteration = iteration
        self.full = bool(full)
        self.violations: list[Violation] = []
        self.max_residual = 0.0
        self.min_divergence: list[float] = []
        self.max_increase = -math.inf
        self.bound_gap: float | None = None
        self.restarted = bool(restarted)
        self.statuses_ok = True

    def _fail(self, check, layer, value, bound, tol, detail="", capped=False):
        """A violation: raised (strict) or recorded."""
        v = Violation(
            check, layer, float(value), float(bound), float(tol), self.iteration, detail, capped
        )
        if self.strict:
            raise v.error()
        self.violations.append(v)

    def outcome(self) -> dict[str, Any]:
        """The iteration's certificate as a JSON-ready dict."""
        return {
            "held": not self.violations,
            "checked": self.full,  # False: only block_optimality ran (fit_bcd's check_every)
            "violations": [v.to_dict() for v in self.violations],
            "max_residual": float(self.max_residual),
            "min_divergence": [float(b) for b in self.min_divergence],
            "max_increase": None if math.isinf(self.max_increase) else float(self.max_increase),
            "bound_gap": None if self.bound_gap is None else float(self.bound_gap),
            "restarted": bool(self.restarted),
        }

    # --- the four checks ----------------------------------------------------------------------
    def check_fenchel_young(
        self,
        activations: Sequence[Activation],
        Xs: Sequence[Array],
        Us: Sequence[Array],
        comm: Comm = LOCAL,
    ) -> None:
        """Check 1: ``X_{l+1}`` (``Xs[l]``) in the range of ``phi_l`` (``activations[l]``) and
        every ``B_l(X_{l+1}, U_l) >= -tol`` elementwise, ``U_l = W_l X~_l`` (``Us[l]``).
        ``comm``: the ranks that hold shares of the data points (``reduce.py``): every layer's
        figures over all of them, in one reduction."""
        self.check_fenchel_young_figures(
            activations, fenchel_young_figures(activations, Xs, Us, comm)
        )

    def check_fenchel_young_figures(
        self, activations: Sequence[Activation], reduced: Sequence[Any]
    ) -> None:
        """Check 1 from its figures over the whole batch (``fenchel_young_figures``), recorded
        here once (a caller that forms them on several threads: ``column_threads``)."""
        self.min_divergence = []
        for l, act in enumerate(activations):
            outside, out, bmin = reduced[3 * l : 3 * l + 3]
            if outside:  # (the range check, by its distance)
                self.min_divergence.append(-math.inf)
                self._fail(
                    "fenchel_young",
                    l,
                    -out,
                    0.0,
                    self.tol,
                    f"X_{l + 1} leaves the range {act.v_range} of {act.name} by {out:.3g}",
                )
                continue
            self.min_divergence.append(bmin)
            if not bmin >= -self.tol:
                self._fail(
                    "fenchel_young",
                    l,
                    bmin,
                    0.0,
                    self.tol,
                    f"min elementwise B_{l}(X_{l + 1}, W_{l} X~_{l}) is negative",
                )

    def check_descent(
        self, name: str, before: float | Array, after: float | Array, scale: float | Array
    ) -> None:
        """Check 2: a block update from value ``before`` to ``after``; ``scale`` ~ |F|."""
        inc = float(after) - float(before)
        self.max_increase = max(self.max_increase, inc)
        tol = self.tol * (abs(float(scale)) + 1.0)
        if not inc <= tol:  # also catches NaN
            self._fail(
                "descent", name, after, before, tol, f"block {name} raised its value by {inc:.3g}"
            )

    def check_lower_bound(self, F: float | Array, J: float | Array) -> None:
        """Check 3: the lifted objective after the X-sweep is below J at the same weights."""
        self.bound_gap = float(J) - float(F)
        tol = self.tol * (abs(float(J)) + 1.0)
        if not float(F) <= float(J) + tol:
            self._fail(
                "lower_bound",
                None,
                F,
                J,
                tol,
                "F(W, X) after the X-sweep exceeds J(W) at the same weights",
            )

    def solver_failed(self, name: str, error: BaseException) -> None:
        """Check 4 for a block whose backend raised ``SolverError`` ``error``: a
        ``block_optimality`` violation (recorded mode; strict mode re-raises the error before)."""
        self.statuses_ok = False
        self._fail("block_optimality", name, math.nan, 0.0, self.tol, str(error))

    def check_argmin(
        self, name: str, block: _Domain, Z: Array, shape: Sequence[int], comm: Comm = LOCAL
    ) -> bool:
        """Check 4, first part: ``Z`` (a backend's argmin of ``block``) has ``shape``, is finite and
        lies in the block's domain (``block.project(Z) == Z``).

        Returns True when it does. Otherwise the block fails ``block_optimality`` by name at
        once (strict: ``CertificateError``; recorded: the violation is kept) and False is
        returned: the driver must not hand such a point to the next block.
        """
        problem = argmin_problem(block, Z, shape)
        if comm.P > 1:  # an X-block's columns on every rank: unusable on one, unusable on all
            (unusable,) = block.maxima([float(problem is not None)], comm)
            if unusable and problem is None:
                problem = "argmin unusable on another rank (not finite, or outside the domain)"
        if problem is None:
            return True
        self.statuses_ok = False
        self._fail("block_optimality", name, math.inf, self.residual_tol or 0.0, self.tol, problem)
        return False

    def check_block(
        self, name: str, result: _Solved, residual: float | None = None, capped: bool = False
    ) -> None:
        """Check 4: ``residual`` is the KKT residual recomputed from the argmin (``None``: not
        recomputed this round, so only the backend's status can fail the block); the backend's
        status must be optimal. The backend's own ``result.residual`` is never used.
        ``capped``: the block was given a step cap and stopped there (``fit_bcd`` asks the
        backend's own setting), so its failure is marked as inexact by design; it still fails."""
        if residual is not None:
            residual = float(residual)
            if not math.isnan(residual):
                self.max_residual = max(self.max_residual, residual)
        shown = math.nan if residual is None else residual
        if result.status != "optimal" or not result.converged:
            self.statuses_ok = False
            self._fail(
                "block_optimality",
                name,
                shown,
                self.residual_tol or 0.0,
                self.tol,
                f"status {result.status!r}, converged={result.converged}",
                capped=capped,
            )
        elif (
            residual is not None
            and self.residual_tol is not None
            and not residual <= self.residual_tol
        ):
            self._fail(
                "block_optimality",
                name,
                residual,
                self.residual_tol,
                self.residual_tol,
                f"KKT residual {residual:.3g} (recomputed from the argmin) above residual_tol",
            )


def fenchel_young_figures(
    activations: Sequence[Activation], Xs: Sequence[Array], Us: Sequence[Array], comm: Comm = LOCAL
) -> list:
    """Check 1's figures, three a layer (outside the range, how far, the least elementwise
    divergence), over every data point of ``comm``'s ranks in one reduction."""
    figures = [_range_and_divergence(act, V, U) for act, V, U in zip(activations, Xs, Us)]
    if not figures:
        return []
    return comm.reduce(
        [f for layer in figures for f in layer], ("max", "max", "min") * len(figures)
    )


def _range_and_divergence(act: Activation, V: Array, U: Array) -> tuple[float, float, float]:
    """This rank's figures of check 1 for one layer: ``(1.0 where V leaves the activation's
    range else 0.0, by how far, min elementwise B(V, U))`` (B only where V is in the range)."""
    xp = array_namespace(V)
    if not bool(xp.all(act.in_range(V))):
        lo, hi = act.v_range
        return 1.0, float(xp.max(xp.maximum(lo - V, V - hi))), math.inf
    B = act.divergence(V, U)
    return 0.0, -math.inf, float(xp.min(B)) if math.prod(B.shape) else 0.0


def argmin_usable(block: _Domain, Z: Array, shape: Sequence[int]) -> bool | Array:
    """Whether ``Z`` can be the argmin of ``block``: False where it is not an array of ``shape``,
    else a 0-d boolean array, on the device, that holds where Z is finite and in the block's
    domain (``block.in_domain``: ``block.project`` leaves it). ``argmin_problem`` says why
    not."""
    try:
        xp = array_namespace(Z)
    except TypeError:
        return False
    if tuple(Z.shape) != tuple(shape):
        return False
    # NaN propagates through max and min, and an inf is one of them: two passes, no mask
    finite = xp.isfinite(xp.max(Z)) & xp.isfinite(xp.min(Z))
    return finite & block.in_domain(Z)


def argmin_problem(block: _Domain, Z: Array, shape: Sequence[int]) -> str | None:
    """Why ``Z`` cannot be the argmin of ``block`` at all, or None: not an array of ``shape``, a
    NaN or inf entry, or a point outside the block's domain (``block.project`` moves it). One
    host read where the point is usable."""
    try:
        xp = array_namespace(Z)
    except TypeError:
        return f"argmin is not an array (got {type(Z).__name__})"
    if tuple(Z.shape) != tuple(shape):
        return f"argmin has shape {tuple(Z.shape)}, the block's variable {tuple(shape)}"
    if bool(argmin_usable(block, Z, shape)):
        return None
    if not bool(xp.isfinite(xp.max(Z)) & xp.isfinite(xp.min(Z))):
        bad = int(xp.sum(xp.astype(~xp.isfinite(Z), xp.int64)))
        return f"argmin has {bad} NaN or inf entries"
    out = float(xp.max(xp.abs(block.project(Z) - Z)))
    return f"argmin leaves the block's domain by {out:.3g}"
