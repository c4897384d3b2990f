"""The paper's batched hyperparameters in this package's units (Algorithm 2, eq. (13); Appendix C).

The paper's appendix and the first author's TensorFlow code state lam, rho and a per-layer
``lbd_coef`` in the code's units, which differ from this package's in two ways:

- the code's ReLU penalty is ``sum(v^2 - 2uv + u_+^2) = 2 B(v, u)``, twice the divergence of
  Theorem 1 that this package sums (docs/mathematics.md); its losses are sums, as here;
- the X-block of ``X_l`` weighs the next layer's term by ``lbd_coef_l``, which the W-blocks do not
  see.

None of this leaves the Lagrangian. An X-block's minimiser depends only on the ratios of its two
terms, and a W-block's only on the ratio of its divergence to its proximal weight. So the code's
BCD is Algorithm 2 on one lifted objective, ``L + sum_l lam'_l B_l``, with the proximal weights
``gamma'_l``, where, with the code's ``lam_l``, ``rho_l`` (its ``rhod``: the proximal weight of
``||W_l - W0_l||^2``, bias included) and ``c_l`` (``lbd_coef``):

    X_L:        c_L L + 2 lam_{L-1} B_{L-1}           -> lam'_{L-1} = 2 lam_{L-1} / c_L
    X_l, l < L: 2 c_l lam_l B_l + 2 lam_{l-1} B_{l-1} -> lam'_{l-1} = lam'_l lam_{l-1} / (c_l lam_l)
    W_l, l < L: 2 lam_l B_l + rho_l ||W - W0||^2      -> gamma'_l = lam'_l rho_l / (2 lam_l)
    W_L:        L + rho_L ||W - W0||^2                -> gamma'_L = rho_L

and the certificate checks that objective like any other. ``tests/test_paper_hyperparameters.py``
checks, block by block, that the code's objective is a positive multiple of this package's plus a
constant.
"""

from __future__ import annotations

from collections.abc import Sequence

from .validation import LAM, RHO, PerLayer, check

__all__ = ["from_reference"]


def from_reference(
    lam: Sequence[float], rho: Sequence[float], lbd_coef: float | Sequence[float] = 1.0
) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """``(lam, gamma)`` of this package for the paper's (or its code's) batched setting.

    Parameters
    ----------
    lam : sequence of L floats > 0
        The code's ``lmbda`` of each hidden layer (the paper's lambda_l).
    rho : sequence of L + 1 floats >= 0
        The code's ``rhod``, the proximal weight of each layer (the paper appendix's rho_l).
    lbd_coef : float or sequence of L floats > 0
        The code's ``lbd_coef`` of layers 1..L: the weight of layer l's term in the X-block of
        its input X_l (1 where the paper's appendix gives none).

    Returns
    -------
    lam, gamma : tuples of L and L + 1 floats, for ``LiftedNetwork(lam=...)`` and
        ``fit_bcd(gamma=...)`` (or the benchmarks' ``--lam`` and ``--gamma``).

    Examples
    --------
    The paper's 784-300-10 setting (lambda 0.1, rho (1, 100)) and LeNet-5's:

    >>> from_reference([0.1], [1, 100])
    ((0.2,), (1.0, 100.0))
    >>> from_reference([5, 5, 1, 1], [1e-4, 1e-2, 1, 1, 1])
    ((10.0, 10.0, 2.0, 2.0), (0.0001, 0.01, 1.0, 1.0, 1.0))
    """
    lam = check("lam", lam, PerLayer(LAM))
    L = len(lam)
    rho = check("rho", rho, PerLayer(RHO, L + 1))
    c = check("lbd_coef", lbd_coef, PerLayer(LAM, L))
    out = [2 * lam[L - 1] / c[L - 1]]  # lam'_{L-1}, from the X_L block
    for l in range(L - 1, 0, -1):  # lam'_{l-1}, from the X_l block
        out.insert(0, out[0] * lam[l - 1] / (c[l - 1] * lam[l]))
    gamma = [out[l] * rho[l] / (2 * lam[l]) for l in range(L)] + [rho[L]]
    return tuple(_round(v) for v in out), tuple(_round(v) for v in gamma)


def _round(v: float) -> float:
    """``v`` to 12 significant digits: the products above, without their last-bit noise."""
    return float(f"{v:.12g}")
