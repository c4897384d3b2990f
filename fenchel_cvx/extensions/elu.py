"""The ELU activation as one registered class: Theorem 1 of the paper for phi(u) = u (u >= 0),
e^u - 1 (u < 0).

phi is continuous and strictly increasing onto the range (-1, inf), with phi' = 1 on u >= 0 and
e^u below (sup phi' = 1). With phi^{-1}(v) = v (v >= 0), log(1 + v) (v < 0), the pair of the
divergence ``B(v, u) = F(v) + F*(u) - u v`` (the paper's eq. (4)) is

    F(v)  = v^2 / 2                       (v >= 0),   (1 + v) log(1 + v) - v   (-1 <= v < 0),
    F*(u) = u^2 / 2                       (u >= 0),   e^u - 1 - u              (u < 0),

both convex and C^1, with F(0) = F*(0) = 0. F' = log(1 + v) is -inf at v = -1: iterates stay
strictly inside the range (``open_range``), as for sigmoid and tanh. The X-blocks' prox has no
closed form (``z + tau log(1 + z) = r`` below 0), so the fast backend solves it by Newton.

CVXPY forms: F is the larger of its two pieces, ``max(v^2/2, (1 + v) log(1 + v) - v)`` (the
second lies above the first for v < 0 and below it for v > 0: their difference has derivative 0
and second derivative ``1/(1 + v) - 1`` of the sign of -v), a maximum of convex atoms. F* is the
smaller of its pieces, which no atom writes; it is a partial minimum instead,
``F*(u) = min_{a >= max(u, 0)} a^2/2 + e^{u - a} - 1 - (u - a)`` (the objective grows in a for
a >= 0, so the minimum sits at ``a = max(u, 0)``): one epigraph variable and two constraints.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from array_api_compat import array_namespace

from ..activations import Activation, register_activation
from ..arrays import Array

if TYPE_CHECKING:
    import cvxpy as cp
    import torch


@register_activation
class ELU(Activation):
    """phi(u) = u for u >= 0, e^u - 1 for u < 0 (ELU with alpha = 1).

    >>> import numpy as np
    >>> from fenchel_cvx.activations import activation
    >>> elu, u = activation("elu"), np.array([-1.0, 0.0, 2.0])
    >>> v = elu.phi(u)
    >>> np.round(v, 4), bool(np.allclose(elu.phi_inv(v), u))
    (array([-0.6321,  0.    ,  2.    ]), True)
    >>> bool(np.allclose(elu.F(v) + elu.Fstar(u), u * v))  # Fenchel-Young: equality at v = phi(u)
    True
    """

    name = "elu"
    v_range = (-1.0, math.inf)
    dphi_max = 1.0
    open_range = True

    def phi(self, u: Array) -> Array:
        xp = array_namespace(u)
        return xp.where(u > 0, u, xp.expm1(xp.minimum(u, xp.zeros_like(u))))

    def dphi(self, u: Array) -> Array:
        xp = array_namespace(u)
        return xp.where(u > 0, xp.ones_like(u), xp.exp(xp.minimum(u, xp.zeros_like(u))))

    def phi_inv(self, v: Array) -> Array:
        """v for v >= 0, log(1 + v) on (-1, 0); -inf at -1 and NaN below (not attained)."""
        xp = array_namespace(v)
        inside = v > -1
        w = xp.where(inside, v, xp.zeros_like(v))
        neg = xp.log1p(xp.minimum(w, xp.zeros_like(w)))
        return xp.where(
            inside,
            xp.where(v > 0, v, neg),
            xp.where(v == -1, xp.full_like(v, -math.inf), xp.full_like(v, math.nan)),
        )

    def F(self, v: Array) -> Array:
        xp = array_namespace(v)
        n = xp.minimum(v, xp.zeros_like(v))  # the piece below 0 (0 above)
        p = 1 + n
        pos = p > 0
        xlogx = xp.where(pos, p * xp.log(xp.where(pos, p, xp.ones_like(p))), xp.zeros_like(p))
        return xp.where(v > 0, 0.5 * v * v, xlogx - n)

    def Fstar(self, u: Array) -> Array:
        xp = array_namespace(u)
        n = xp.minimum(u, xp.zeros_like(u))
        return xp.where(u > 0, 0.5 * u * u, xp.expm1(n) - n)

    def torch_module(self) -> torch.nn.Module:
        import torch

        return torch.nn.ELU(alpha=1.0)

    # --- CVXPY forms (the oracle: ``oracle.atoms``), CVXPY imported only here ------------------
    def F_cvxpy(self, v: cp.Expression) -> cp.Expression:
        """Elementwise F(v): ``max(v^2/2, -entr(1 + v) - v)`` (module docstring)."""
        import cvxpy as cp

        return cp.maximum(0.5 * cp.square(v), -cp.entr(1 + v) - v)

    def Fstar_cvxpy(self, u: cp.Expression) -> tuple[cp.Expression, list[cp.Constraint]]:
        """``(sum F*(u), constraints)`` through the epigraph variable ``a >= max(u, 0)``."""
        import cvxpy as cp

        a = cp.Variable(u.shape, name="a_elu")
        value = cp.sum(0.5 * cp.square(a) + cp.exp(u - a) - (u - a)) - math.prod(u.shape)
        return value, [a >= u, a >= 0]
