"""Assertions for other people's test suites, like ``numpy.testing``: is this block solved?

``assert_block_optimal(block, Z, rtol=1e-6)`` passes when the candidate ``Z`` (NumPy, PyTorch,
CuPy, ... through DLPack) of one of the four blocks of the lifted objective (the paper's Sec. 4.5,
``blocks.py``) is certified optimal by the oracle: its suboptimality gap against a certified
lower bound on the block's optimal value is at most ``rtol * (1 + |lower bound|) + atol``
(``oracle.certify``). It raises ``AssertionError`` with every number otherwise.
"""

from __future__ import annotations

from .arrays import Array
from .blocks import Block
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
