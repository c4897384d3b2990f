"""``certify(block, Z)``: check anyone's solution of a block against the oracle.

For one of the four blocks of ``blocks.py`` (the paper's Sec. 4.5; X_l and W_l steps of
Algorithms 1-2) and a candidate ``Z`` from any solver, on any array library (NumPy, PyTorch,
CuPy, JAX: read through DLPack, copied to the host when it lives on a device), ``certify``
returns a :class:`BlockCertificate`:

* ``objective``: the block objective ``f(Z)`` (``block.value``);
* ``optimum``: ``f(Z*)`` at the oracle's argmin ``Z*`` (``OracleBackend``), an upper bound on the
  block's optimal value ``f*``;
* ``lower_bound``: a certified ``L <= f*``. For a block that is ``mu``-strongly convex on its
  domain ``C`` (every X-block: ``mu = lam_in / max phi'``; a W-block with ``rho + gamma > 0``:
  ``mu = 2 (rho + gamma)``) the quadratic minorant at a point ``z`` gives
  ``f* >= f(z) + min_{x in C} <g, x - z> + mu/2 ||x - z||^2`` (closed form on the box ``C``),
  taken at ``Z*`` and at ``Z``; otherwise the solver's duality gap ``L = f(Z*) - gap`` (``None``
  where no dual is available);
* ``gap = objective - lower_bound``: a certified bound on the candidate's suboptimality, and
  ``relative_gap = gap / (1 + |lower_bound|)``;
* ``kkt_residual``: ``blocks.kkt_residual`` at ``Z`` (0 exactly at a minimiser).

A candidate of the wrong shape, with NaN or inf entries, or outside the activation's range is a
``ValueError`` naming it, before any solve. ``fenchel_cvx.testing.assert_block_optimal`` wraps
this for test suites.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from ..arrays import Array
from ..blocks import Block, WBlock, XBlock, kkt_residual
from .backend import OracleBackend


@dataclass
class BlockCertificate:
    """What ``certify`` returns (see the module docstring)."""

    objective: float
    optimum: float
    lower_bound: float | None  # None when no certified lower bound is available
    gap: float | None  # objective - lower_bound (None with it)
    relative_gap: float | None  # gap / (1 + |lower_bound|)
    kkt_residual: float
    argmin: np.ndarray  # the oracle's argmin (NumPy)
    bound: str  # how lower_bound was obtained: "strong convexity", "duality gap"


def to_numpy(Z: Array, name: str = "Z") -> np.ndarray:
    """A float64 NumPy copy of an array from any library (DLPack; host copy of device arrays)."""
    if isinstance(Z, np.ndarray):
        return np.array(Z, dtype=np.float64)
    if hasattr(Z, "detach"):  # torch: a tensor that requires grad cannot be exported
        Z = Z.detach()
    if hasattr(Z, "__dlpack__"):
        try:
            return np.array(np.from_dlpack(Z), dtype=np.float64)
        except (BufferError, RuntimeError, TypeError, ValueError):
            pass  # on a device: copy to the host first
        for host in ("get", "cpu"):  # CuPy: .get(); torch: .cpu()
            if callable(getattr(Z, host, None)):
                return to_numpy(getattr(Z, host)(), name)
    try:
        return np.array(Z, dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError(
            f"{name} must be an array (NumPy, PyTorch, CuPy, ... through DLPack), "
            f"got {type(Z).__module__}.{type(Z).__name__}"
        ) from None


def check_candidate(block: Block, Z: Array, name: str = "Z") -> np.ndarray:
    """``Z`` as NumPy, or a ``ValueError`` naming it: wrong shape, NaN / inf, outside the range."""
    Z = to_numpy(Z, name)
    shape = block.shape
    if Z.shape != shape:
        raise ValueError(
            f"{name} must have the shape {shape} of the {block.kind} block's "
            f"variable, got {Z.shape}"
        )
    if not np.all(np.isfinite(Z)):
        raise ValueError(
            f"{name} must be finite, got {int(np.sum(~np.isfinite(Z)))} NaN or inf entries"
        )
    _check_in_domain(block, Z, name)
    return Z


@functools.singledispatch
def _check_in_domain(block, Z, name):
    """A ``ValueError`` naming ``Z`` outside the block's domain (W-blocks: unconstrained)."""


@_check_in_domain.register
def _(block: XBlock, Z, name):
    block.act_in.check_range(name, Z)


@functools.singledispatch
def strong_convexity(block: Block) -> float:
    """The modulus ``mu`` with ``f(x) >= f(z) + <g, x - z> + mu/2 ||x - z||^2`` (0: none)."""
    raise TypeError(f"no strong convexity is registered for {type(block).__name__}")


@strong_convexity.register
def _(block: XBlock):
    """``lam_in / sup phi'`` (the strong convexity of F is 1 / sup phi'); 0 where the
    activation has no known bound (``dphi_max`` None)."""
    sup = block.act_in.dphi_max
    return 0.0 if sup is None else block.lam_in / sup


@strong_convexity.register
def _(block: WBlock):
    return 2.0 * (block.rho + block.gamma)


def minorant_bound(block: Block, Z: np.ndarray, mu: float) -> float:
    """``f(Z) + min_{x in C} <g, x - Z> + mu/2 ||x - Z||^2``: a lower bound on the block's
    optimal value (``C`` the box of the block's domain; ``block.project`` projects on it)."""
    g = block.grad(Z)
    D = block.project(Z - g / mu) - Z
    return float(block.value(Z)) + float(np.sum(g * D)) + 0.5 * mu * float(np.sum(D * D))


def certify(block: Block, Z: Array, backend: OracleBackend | None = None) -> BlockCertificate:
    """Certify ``Z`` (any array library) as a solution of ``block``; see the module docstring.

    ``backend``: the oracle to compare with (default ``OracleBackend(tol=1e-9)``).

    >>> import numpy as np
    >>> from fenchel_cvx import blocks
    >>> from fenchel_cvx.fast import FastBackend
    >>> from fenchel_cvx.network import LiftedNetwork
    >>> net = LiftedNetwork([3, 4, 2], seed=0)
    >>> X0, Y = np.arange(12.0).reshape(3, 4) / 10, np.ones((2, 4))
    >>> Xs, _ = net.forward(X0)
    >>> block = blocks.x_block(net, X0, Y, Xs, 1)
    >>> cert = certify(block, FastBackend(tol=1e-10).solve(block).argmin)
    >>> cert.bound, cert.gap < 1e-9, cert.kkt_residual < 1e-9
    ('strong convexity', True, True)
    >>> cert = certify(block, Xs[0])          # the feed-forward point: far from optimal
    >>> round(cert.gap, 3), round(cert.objective, 3), round(cert.lower_bound, 3)
    (8.603, 15.975, 7.372)
    >>> certify(block, np.full((4, 4), -1.0))
    Traceback (most recent call last):
    ...
    ValueError: Z must lie in the range (0.0, inf) of relu, got -1.0
    """
    Z = check_candidate(block, Z)
    oracle = OracleBackend(tol=1e-9) if backend is None else backend
    res = oracle.solve(block, start=Z)
    Zs = np.asarray(res.argmin, dtype=np.float64)
    objective, optimum = float(block.value(Z)), float(block.value(Zs))
    mu = strong_convexity(block)
    lower: float | None = None
    how = "none"
    if mu > 0:
        lower = max(minorant_bound(block, Zs, mu), minorant_bound(block, Z, mu))
        how = "strong convexity"
    elif res.info.get("duality_gap") is not None:
        lower, how = optimum - float(res.info["duality_gap"]), "duality gap"
    gap: float | None = None
    rel: float | None = None
    if lower is not None:
        lower = min(lower, optimum)
        gap = objective - lower
        rel = gap / (1.0 + abs(lower))
    return BlockCertificate(
        objective, optimum, lower, gap, rel, float(kkt_residual(block, Z)), Zs, how
    )


def optimality_report(cert: BlockCertificate) -> str:
    """One line with the certificate's numbers (for error messages)."""
    lb = "none" if cert.lower_bound is None else f"{cert.lower_bound:.10g}"
    gap = "unknown" if cert.gap is None else f"{cert.gap:.3g} (relative {cert.relative_gap:.3g})"
    return (
        f"objective {cert.objective:.10g}, oracle optimum {cert.optimum:.10g}, certified "
        f"lower bound {lb} ({cert.bound}), suboptimality gap {gap}, KKT residual "
        f"{cert.kkt_residual:.3g}"
    )


__all__ = ["certify", "BlockCertificate", "check_candidate", "to_numpy", "optimality_report"]
