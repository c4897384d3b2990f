"""Biconvex activations: Theorem 1 of the paper.

For a continuous, strictly increasing activation phi, with ``F(v) = int phi^{-1}`` and
``F*(u) = int phi`` (its convex conjugate), the *biconvex divergence*

    B_phi(v, u) = F(v) + F*(u) - u v  >= 0,      with equality iff  v = phi(u)

(Fenchel-Young; the paper's eq. (4)) is convex in v and in u separately, so the constraint
``v = phi(u)`` of a network layer can be written as ``B_phi(v, u) <= 0`` (eq. (6)) and dualised:
the Lagrange relaxation of eq. (7).

Each activation here gives, elementwise and for any array-API namespace (NumPy, CuPy,
array-api-strict): ``phi``, its derivative ``dphi``, ``phi_inv``, ``F``, ``Fstar``, the
divergence and its partial gradients. Their CVXPY forms, for the oracle, are in
``fenchel_cvx.oracle.atoms`` (``divergence_cvx(act, v, u)``), so this module needs no CVXPY.
ReLU is not strictly increasing, but its B (``v >= 0`` domain) satisfies the same theorem.
``monotone(phi)`` builds F and F* by quadrature for any continuous strictly increasing phi
(NumPy only, for theorem checks).

Each activation is one class that carries every fact the solvers ask for: the elementwise
functions above; ``dphi_max`` (sup phi', the curvature bound of F*), ``v_range`` and
``open_range`` (F' infinite at a finite end of the range: iterates stay strictly inside) with
the range check ``check_range``; ``d2F`` and ``d2Fstar`` (the Hessians the oracle's Newton polish
multiplies by); ``x_prox`` (the X-blocks' proximal map in closed form, or None: the fast backend
then solves it by Newton); ``torch_module`` (its PyTorch counterpart, for the baselines); and
``params`` / ``config`` (its parameters, for save / load). A class that lacks one of
``CORE_FACTS`` is refused where a network is built (``activation``), naming the class and the
fact; a backend refuses one that lacks a fact of its own (``require``). The one table keyed by
names is the registry ``ACTIVATIONS``: ``register_activation`` adds a class under its ``name``
(every module of ``fenchel_cvx.extensions`` registers its classes when this module loads), and
``activation("relu")`` looks one up.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Mapping
from types import ModuleType
from typing import TYPE_CHECKING, Any

import numpy as np
from array_api_compat import array_namespace

from .arrays import Array, cheap_reads, clip, exact_in_place
from .facts import Named, Registry, stub

if TYPE_CHECKING:
    import torch


def _ends(xp: ModuleType, v: Array, lo: float, hi: float) -> Array:
    """phi^{-1} off the open range (lo, hi): -inf at lo, +inf at hi, NaN beyond (not attained)."""
    inf = xp.full_like(v, math.inf)
    return xp.where(v == lo, -inf, xp.where(v == hi, inf, xp.full_like(v, math.nan)))


def _xlogx(xp: ModuleType, x: Array) -> Array:
    """x log x with the limit 0 at x = 0 (no warning, no NaN)."""
    pos = x > 0
    return xp.where(pos, x * xp.log(xp.where(pos, x, xp.ones_like(x))), xp.zeros_like(x))


#: the facts every solver needs, checked where a network is built (``activation``)
CORE_FACTS = ("phi", "dphi", "phi_inv", "F", "Fstar")


class Activation(Named):
    """An activation phi with its Theorem-1 divergence. Subclasses fill in the closed forms
    (``CORE_FACTS``) and whichever further facts they have (module docstring)."""

    name = kind = "activation"
    v_range = (-math.inf, math.inf)  # the closed range of phi: the domain of v in B(v, u)
    dphi_max: float | None = None  # sup phi' (None: not known)
    open_range = False  # F' infinite at a finite end of the range
    x_prox: Callable[..., Any] | None = None  # prox(xp, act, r, tau, state) -> (z, state)
    torch_module: Callable[..., Any] | None = None  # a method: the torch.nn module

    def check_range(self, name: str, V: Array) -> None:
        """Raise ``ValueError`` naming ``name`` and its first entry outside phi's closed range."""
        ok = self.in_range(V)
        xp = array_namespace(ok)
        if not bool(xp.all(ok)):
            bad = float(xp.reshape(V[~ok], (-1,))[0])
            raise ValueError(
                f"{name} must lie in the range {self.v_range} of {self.name}, got {bad!r}"
            )

    def d2F(self, v: Array) -> Array:
        """F''(v) = 1 / phi'(phi^{-1}(v)), with 1 where phi' vanishes (ReLU at v = 0)."""
        xp = array_namespace(v)
        d = self.dphi(self.phi_inv(v))
        pos = d > 0
        return xp.where(pos, 1.0 / xp.where(pos, d, xp.ones_like(d)), xp.ones_like(d))

    def d2Fstar(self, u: Array) -> Array:
        """F*''(u) = phi'(u)."""
        return self.dphi(u)

    # --- elementwise, array-API -----------------------------------------------------------
    phi = stub("phi")
    dphi = stub("dphi")
    phi_inv = stub("phi_inv")
    F = stub("F")
    #: F*(u) elementwise, as a new array of u's shape (the fast W line search's descent test
    #: works in it in place: ``fast.fused.row_change``)
    Fstar = stub("Fstar")

    def in_range(self, v: Array) -> Array:
        """Boolean mask: v inside the closed range of phi (the domain of F)."""
        lo, hi = self.v_range
        return (v >= lo) & (v <= hi)

    def contains(self, v: Array) -> Array:
        """0-d boolean: ``project`` leaves every entry of ``v``, a non-empty array (each inside
        phi's closed range; a NaN fails), from v's two extrema: no array of v's size (Figure
        1's X_1 is 144 MB)."""
        xp = array_namespace(v)
        lo, hi = self.v_range
        return (xp.min(v) >= lo) & (xp.max(v) <= hi)

    def project(self, v: Array) -> Array:
        """Euclidean projection onto the range of phi (the domain of the X-blocks)."""
        lo, hi = self.v_range
        return clip(v, None if math.isinf(lo) else lo, None if math.isinf(hi) else hi)

    def divergence(self, v: Array, u: Array) -> Array:
        """Elementwise B_phi(v, u) = F(v) + F*(u) - u v; +inf where v is outside phi's range."""
        xp = array_namespace(v, u)
        ok = self.in_range(v)
        vin = xp.where(ok, v, xp.zeros_like(v))
        B = self.F(vin) + self.Fstar(u) - u * vin
        return xp.where(ok, B, xp.full_like(B, math.inf))

    def grad_u(self, v: Array, u: Array) -> Array:
        """dB/du = phi(u) - v."""
        return self.phi(u) - v

    def grad_v(self, v: Array, u: Array) -> Array:
        """dB/dv = phi^{-1}(v) - u (a subgradient for ReLU at v = 0)."""
        return self.phi_inv(v) - u


class ReLU(Activation):
    """phi(u) = max(u, 0).  B(v, u) = v^2/2 + u_+^2/2 - u v on v >= 0."""

    name = "relu"
    v_range = (0.0, math.inf)
    dphi_max = 1.0

    @staticmethod
    def x_prox(
        xp: ModuleType, act: Activation, r: Array, tau: float | Array, state: Array | None
    ) -> tuple[Array, Array | None]:
        """``max(0, r / (1 + tau))``; r (the step's fresh argument, ``fast.fused.fista_step``)
        is scaled in place."""
        r /= 1 + tau
        return clip(r, 0, None), state

    def torch_module(self) -> torch.nn.Module:
        import torch

        return torch.nn.ReLU()

    def phi(self, u: Array) -> Array:
        return clip(u, 0, None)  # one pass, no mask (a hot path of FISTA)

    def dphi(self, u: Array) -> Array:
        xp = array_namespace(u)
        return xp.astype(u > 0, u.dtype)

    def phi_inv(self, v: Array) -> Array:
        return v

    def F(self, v: Array) -> Array:
        return 0.5 * v * v

    # phi's result is a fresh array: the two below work on it in place where that is exact
    # (on LeNet-5's 2.35 M entries a chain of fresh arrays takes twice the time of the same
    # passes in place), else as the base class does (an integer u, a v of another shape or a
    # wider dtype: promoted and broadcast)
    def Fstar(self, u: Array) -> Array:
        p = self.phi(u)
        if not exact_in_place(p):
            return 0.5 * p * p
        p *= p
        p *= 0.5
        return p

    def grad_u(self, v: Array, u: Array) -> Array:
        """dB/du = phi(u) - v."""
        g = self.phi(u)
        if not exact_in_place(g, v):
            return g - v
        g -= v
        return g

    def divergence(self, v: Array, u: Array) -> Array:
        """B(v, u) = 1/2 (v - u_+)^2 + v u_- on v >= 0 (u_- = max(-u, 0)), +inf elsewhere.

        The same value as ``F(v) + F*(u) - u v`` (expand: u v = u_+ v - u_- v), written as a sum
        of nonnegative terms, so it is >= 0 in any precision: the general form cancels large
        terms and goes below zero by rounding in float32 (the Fenchel-Young check, eq. (4)).
        """
        xp = array_namespace(v, u)
        # v in the domain (an X-block's iterate always is): no masks; the test is a host read,
        # made only where reads are cheap (``arrays.cheap_reads``)
        if cheap_reads(xp) and bool(xp.all(v >= 0)):
            return self._divergence_in(v, u)
        ok = self.in_range(v)
        B = self._divergence_in(xp.where(ok, v, xp.zeros_like(v)), u)
        return xp.where(ok, B, xp.full_like(B, math.inf))

    @staticmethod
    def _divergence_in(v: Array, u: Array) -> Array:
        """B(v, u) = (v - u_+)^2 / 2 + v u_- for v >= 0 (``where`` costs ~10 elementwise passes
        on a CPU: avoided here; u_- = -min(u, 0)), in place on its own fresh arrays where that
        is exact (no new array per pass: on Figure 1's 300 x 60,000 arrays, a quarter of the
        time)."""
        d = clip(u, 0.0, None)  # u_+
        if not exact_in_place(d, v):
            d = v - d
            return 0.5 * d * d - v * clip(u, None, 0.0)
        d -= v  # (u_+ - v)^2 = (v - u_+)^2
        d *= d
        d *= 0.5
        m = clip(u, None, 0.0)  # -u_-
        m *= v
        d -= m
        return d


class LeakyReLU(Activation):
    """phi(u) = u for u > 0, a u otherwise (0 < a < 1).

    F(v) = v_+^2/2 + v_-^2/(2a),  F*(u) = u_+^2/2 + a u_-^2/2,  no domain constraint.
    """

    name = "leaky_relu"
    dphi_max = 1.0
    slope: float

    def __init__(self, slope: float = 0.01) -> None:
        if not (isinstance(slope, numbers.Real) and 0 < float(slope) < 1):
            raise ValueError(f"slope must be in (0, 1), got {slope!r}")
        self.slope = float(slope)

    def params(self) -> dict[str, Any]:
        return {"slope": self.slope}

    @staticmethod
    def x_prox(
        xp: ModuleType, act: LeakyReLU, r: Array, tau: float | Array, state: Array | None
    ) -> tuple[Array, Array | None]:
        """``r / (1 + tau)`` where r > 0, ``r / (1 + tau / a)`` elsewhere."""
        return xp.where(r > 0, r / (1 + tau), r / (1 + tau / act.slope)), state

    def torch_module(self) -> torch.nn.Module:
        import torch

        return torch.nn.LeakyReLU(self.slope)

    def phi(self, u: Array) -> Array:
        xp = array_namespace(u)
        return xp.where(u > 0, u, self.slope * u)

    def dphi(self, u: Array) -> Array:
        xp = array_namespace(u)
        return xp.where(u > 0, xp.ones_like(u), xp.full_like(u, self.slope))

    def phi_inv(self, v: Array) -> Array:
        xp = array_namespace(v)
        return xp.where(v > 0, v, v / self.slope)

    def F(self, v: Array) -> Array:
        xp = array_namespace(v)
        return xp.where(v > 0, 0.5 * v * v, v * v / (2 * self.slope))

    def Fstar(self, u: Array) -> Array:
        xp = array_namespace(u)
        return xp.where(u > 0, 0.5 * u * u, 0.5 * self.slope * u * u)


class Sigmoid(Activation):
    """phi(u) = 1 / (1 + e^-u).  F(v) = v log v + (1-v) log(1-v) on [0, 1], F*(u) = log(1 + e^u)."""

    name = "sigmoid"
    v_range = (0.0, 1.0)
    dphi_max = 0.25
    open_range = True

    def torch_module(self) -> torch.nn.Module:
        import torch

        return torch.nn.Sigmoid()

    def phi(self, u: Array) -> Array:
        xp = array_namespace(u)
        e = xp.exp(-xp.abs(u))
        return xp.where(u >= 0, 1 / (1 + e), e / (1 + e))

    def dphi(self, u: Array) -> Array:
        s = self.phi(u)
        return s * (1 - s)

    def phi_inv(self, v: Array) -> Array:
        """log v - log(1 - v); -inf / +inf at the ends 0 / 1 (without a divide warning)."""
        xp = array_namespace(v)
        inside = (v > 0) & (v < 1)
        w = xp.where(inside, v, xp.full_like(v, 0.5))
        return xp.where(inside, xp.log(w) - xp.log1p(-w), _ends(xp, v, 0.0, 1.0))

    def F(self, v: Array) -> Array:
        xp = array_namespace(v)
        return _xlogx(xp, v) + _xlogx(xp, 1 - v)

    def Fstar(self, u: Array) -> Array:
        xp = array_namespace(u)
        return xp.logaddexp(xp.zeros_like(u), u)


class Tanh(Activation):
    """phi(u) = tanh u.  F(v) = [(1+v) log(1+v) + (1-v) log(1-v)]/2 on [-1, 1],
    F*(u) = log cosh u."""

    name = "tanh"
    v_range = (-1.0, 1.0)
    dphi_max = 1.0
    open_range = True

    def torch_module(self) -> torch.nn.Module:
        import torch

        return torch.nn.Tanh()

    def phi(self, u: Array) -> Array:
        return array_namespace(u).tanh(u)

    def dphi(self, u: Array) -> Array:
        t = self.phi(u)
        return 1 - t * t

    def phi_inv(self, v: Array) -> Array:
        """atanh v; -inf / +inf at the ends -1 / 1 (without a divide warning)."""
        xp = array_namespace(v)
        inside = xp.abs(v) < 1
        return xp.where(
            inside, xp.atanh(xp.where(inside, v, xp.zeros_like(v))), _ends(xp, v, -1.0, 1.0)
        )

    def F(self, v: Array) -> Array:
        xp = array_namespace(v)
        return 0.5 * (_xlogx(xp, 1 + v) + _xlogx(xp, 1 - v))

    def Fstar(self, u: Array) -> Array:
        xp = array_namespace(u)
        a = xp.abs(u)
        return a + xp.log1p(xp.exp(-2 * a)) - math.log(2.0)


class Monotone(Activation):
    """Any continuous strictly increasing phi: F* by quadrature, F by Legendre duality.

    NumPy only (for theorem checks). With ``u_v = phi^{-1}(v)``, the divergence is the Bregman
    divergence of F*:  B(v, u) = F*(u) - F*(u_v) - v (u - u_v),  F*(u) = int_0^u phi.
    ``v_range`` is the closed range of phi where known; elsewhere phi^{-1} is found by
    bracketing and bisection, and v outside the range gets B = +inf.
    """

    name = "monotone"

    def __init__(
        self,
        phi: Callable[[np.ndarray], Array],
        v_range: tuple[float, float] = (-math.inf, math.inf),
    ) -> None:
        if not callable(phi):
            raise ValueError(f"phi must be callable, got {phi!r}")
        lo, hi = (float(t) for t in v_range)
        if not lo < hi:
            raise ValueError(f"v_range must be an increasing pair, got {v_range!r}")
        if not float(phi(np.asarray(1.0))) > float(phi(np.asarray(-1.0))):
            raise ValueError("phi must be strictly increasing, got phi(1) <= phi(-1)")
        self._phi, self.v_range = phi, (lo, hi)

    def __repr__(self) -> str:
        return "activation('monotone')"

    def params(self) -> dict[str, Any]:
        return {"phi": self._phi, "v_range": self.v_range}

    def phi(self, u: Array) -> Array:
        return np.asarray(self._phi(np.asarray(u, dtype=float)), dtype=float)

    def dphi(self, u: Array, h: float = 1e-6) -> Array:
        u = np.asarray(u, dtype=float)
        return (self.phi(u + h) - self.phi(u - h)) / (2 * h)

    def phi_inv(self, v: Array) -> Array:
        """Vectorised bracketing + bisection; NaN where v is not attained."""
        v = np.asarray(v, dtype=float)
        lo, hi = -np.ones_like(v), np.ones_like(v)
        for _ in range(64):  # expand brackets to |u| <= 2^64
            grow_lo, grow_hi = self.phi(lo) > v, self.phi(hi) < v
            if not (grow_lo.any() or grow_hi.any()):
                break
            lo, hi = np.where(grow_lo, 2 * lo, lo), np.where(grow_hi, 2 * hi, hi)
        found = (self.phi(lo) <= v) & (self.phi(hi) >= v)
        for _ in range(200):
            mid = 0.5 * (lo + hi)
            below = self.phi(mid) < v
            lo, hi = np.where(below, mid, lo), np.where(below, hi, mid)
        return np.where(found, 0.5 * (lo + hi), np.nan)

    def Fstar(self, u: Array) -> Array:
        from scipy import integrate  # (imported here: most of the package's import time)

        u = np.asarray(u, dtype=float)
        quad = np.vectorize(
            lambda b: integrate.quad(
                lambda t: float(self.phi(t)), 0.0, b, epsabs=1e-13, epsrel=1e-12, limit=200
            )[0]
        )
        return quad(u) if u.size else u.copy()

    def F(self, v: Array) -> Array:
        v = np.asarray(v, dtype=float)
        uv = self.phi_inv(v)
        return v * uv - self.Fstar(np.nan_to_num(uv))

    def in_range(self, v: Array) -> Array:
        v = np.asarray(v, dtype=float)
        return super().in_range(v) & ~np.isnan(self.phi_inv(v))

    def divergence(self, v: Array, u: Array) -> Array:
        v, u = np.broadcast_arrays(np.asarray(v, dtype=float), np.asarray(u, dtype=float))
        uv = self.phi_inv(v)
        ok = ~np.isnan(uv) & Activation.in_range(self, v)
        uv = np.where(ok, uv, 0.0)
        B = self.Fstar(u) - self.Fstar(uv) - v * (u - uv)
        return np.where(ok, B, np.inf)


#: the registry: name -> activation class (the one table keyed by activation names)
ACTIVATIONS = Registry("activation", Activation, CORE_FACTS)
#: class decorator: add an activation class under its ``name`` (``facts.Registry.register``)
register_activation = ACTIVATIONS.register


for _cls in (ReLU, LeakyReLU, Sigmoid, Tanh, Monotone):
    register_activation(_cls)


def activation_names(by_name: bool = True) -> list[str]:
    """The registered names, sorted; ``by_name``: only those ``activation(name)`` builds without
    a parameter (``monotone`` needs a function)."""
    return sorted(n for n, c in ACTIVATIONS.items() if not by_name or _defaults_ok(c))


def _defaults_ok(cls: type[Activation]) -> bool:
    try:
        cls()
    except TypeError:
        return False
    return True


def activation(name: str | Activation, **params: object) -> Activation:
    """The activation registered under ``name`` built with ``params``; an ``Activation`` is
    passed through. Either way it carries the ``CORE_FACTS`` (a ``ValueError`` naming the class
    and the fact it lacks)."""
    return ACTIVATIONS.build(name, params)


def activation_from_config(config: Mapping[str, Any]) -> Activation:
    """The activation a saved ``config()`` describes (``{"name": ..., **params}``)."""
    return activation(config["name"], **{k: v for k, v in config.items() if k != "name"})


def monotone(
    phi: Callable[[np.ndarray], Array], v_range: tuple[float, float] = (-math.inf, math.inf)
) -> Monotone:
    """The Theorem-1 divergence of any continuous strictly increasing ``phi`` (by quadrature)."""
    return Monotone(phi, v_range)


from . import extensions  # noqa: E402,F401  (its modules register their classes)
