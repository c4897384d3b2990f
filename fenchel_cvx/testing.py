"""Assertions for other people's test suites, like ``numpy.testing``: is this block solved?

``assert_block_optimal(block, Z, rtol=1e-6)`` passes when the candidate ``Z`` (NumPy, PyTorch,
CuPy, ... through DLPack) of one of the four blocks of the lifted objective (the paper's Sec. 4.5,
``blocks.py``) is certified optimal by the oracle: its suboptimality gap against a certified
lower bound on the block's optimal value is at most ``rtol * (1 + |lower bound|) + atol``
(``oracle.certify``). It raises ``AssertionError`` with every number otherwise.

``layer_faults(A, W, rng)`` lists what is wrong with a layer's map ``A`` (a
``layers.LinearMap``: a layer as a linear map, the paper's Sec. 4.2, eqs. (10)-(11)) at the
weights ``W``: the checks a new layer kind needs before it trains (docs page "Add a layer
kind"), which the conformance suite runs on every registered kind.
"""

from __future__ import annotations

import math

import numpy as np

from .arrays import Array
from .blocks import Block
from .layers import LinearMap
from .oracle.backend import OracleBackend
from .oracle.certify import BlockCertificate, certify, optimality_report


def assert_block_optimal(
    block: Block,
    Z: Array,
    rtol: float = 1e-6,
    atol: float = 0.0,
    backend: OracleBackend | None = None,
) -> BlockCertificate:
    """Assert that ``Z`` minimises ``block`` to ``rtol`` (relative) plus ``atol`` (absolute).

    Returns the :class:`~fenchel_cvx.oracle.certify.BlockCertificate` when it passes. A block
    without a certified lower bound (a W-block with ``rho + gamma = 0`` solved without a dual)
    is judged by its distance to the oracle's optimum instead, which the message says.
    """
    for name, v in (("rtol", rtol), ("atol", atol)):
        if not (isinstance(v, (int, float)) and v >= 0):
            raise ValueError(f"{name} must be a number >= 0, got {v!r}")
    cert = certify(block, Z, backend=backend)
    if cert.gap is None or cert.lower_bound is None:  # the one is None with the other
        excess = cert.objective - cert.optimum
        allowed = rtol * (1.0 + abs(cert.optimum)) + atol
        what = "objective - oracle optimum (no certified lower bound)"
    else:
        excess, allowed = cert.gap, rtol * (1.0 + abs(cert.lower_bound)) + atol
        what = "certified suboptimality gap"
    if not excess <= allowed:
        raise AssertionError(
            f"block {block.kind} (layer {block.layer}) is not solved: {what} "
            f"{excess:.3g} > {allowed:.3g} (rtol={rtol:g}, atol={atol:g}); "
            + optimality_report(cert)
        )
    return cert


def layer_faults(A: LinearMap, W: np.ndarray, rng: np.random.Generator, m: int = 5) -> list[str]:
    """What is wrong with the map ``A`` at the weights ``W``: ``[]`` where its methods agree
    with each other and with its explicit matrix (``A.matrix``, from ``forward`` alone): forward
    affine in X, the adjoint identity ``<A x, y> = <x, A^T y>``, the product form
    ``to_rows(A(W, X) + b) = W patches(X)``, the patches of some points their columns of the
    patches of all (``arrays.by_points`` forms them so), ``from_rows`` inverting
    ``to_rows``, and the norm bound at least ``||A||_2^2``; on ``m`` random data points.

    >>> from fenchel_cvx.layers import AvgPool2d, Conv2d, build_maps
    >>> rng = np.random.default_rng(0)
    >>> A = build_maps((1, 6, 6), [AvgPool2d(2), Conv2d(2, 3)])[0]
    >>> layer_faults(A, rng.standard_normal(A.weight_shape), rng)
    []
    """
    X, G = rng.standard_normal((A.n_in, m)), rng.standard_normal((A.n_out, m))
    faults = []
    M, b = A.matrix(W)
    U = A.forward(W, X)
    if not np.allclose(U, M @ X + b, rtol=1e-12, atol=1e-12):
        faults.append("forward is not affine in X")
    lhs, rhs = float(np.sum((U - b) * G)), float(np.sum(X * A.adjoint_x(W, G)))
    if not math.isclose(lhs, rhs, rel_tol=1e-12, abs_tol=1e-12):
        faults.append(f"adjoint_x: <A x, y> = {lhs!r} but <x, A^T y> = {rhs!r}")
    whole, first = A.patches(X), A.patches(X[:, :2])
    if not np.allclose(A.to_rows(U), W @ whole, rtol=1e-12, atol=1e-12):
        faults.append("patches: to_rows(forward(W, X)) is not W @ patches(X)")
    points = whole.reshape(whole.shape[0], -1, m)  # (rows, a point's columns, points)
    if not np.array_equal(points[:, :, :2].reshape(first.shape), first):
        faults.append("patches: a point's patches are not its own columns, the last axis")
    if not np.array_equal(A.from_rows(A.to_rows(U), m), U):
        faults.append("from_rows does not invert to_rows")
    bound, exact = A.norm2_bound(W, 64), float(np.linalg.norm(M, 2) ** 2)
    if bound is not None and not float(bound) >= exact * (1 - 1e-12):
        faults.append(f"norm2_bound: {float(bound)!r} is below ||A||_2^2 = {exact!r}")
    return faults
