"""The four convex blocks of the lifted objective (docs page "Mathematics"; the paper's Sec. 4.5,
eqs. (14)-(20)).

Each block holds its data and gives, for any array-API namespace, the part of
F(W, X) that depends on its variable (``value``), the gradient (``grad``), the projection
onto its domain (``project``) and the KKT residual of a candidate point. Every backend
(the CVXPY oracle, the fast array solvers) solves these same objects, and the driver uses
``value`` for its descent check, so "the same block" means the same code.

    XHidden  (X_l, 1 <= l < L)
        min_Z  lam_{l-1} B_{l-1}(Z, U_{l-1}) + lam_l B_l(X_{l+1}, A(W_l, Z))
    XLast    (X_L)
        min_Z  L(Y, A(W_L, Z)) + lam_{L-1} B_{L-1}(Z, U_{L-1})
    WHidden  (W_l, l < L)
        min_W  lam_l B_l(X_{l+1}, W X~_l) + rho_l ||W||^2 + gamma_l ||W - W0||^2
    WLast    (W_L)
        min_W  L(Y, W X~_L) + rho_L ||W||^2 + gamma_L ||W - W0||^2

``A(W, Z)`` is the linear map of the layer that Z feeds (``layers.py``; dense: ``W [Z; 1]``),
held by the X-blocks as ``map``. A W-block sees its layer as a product ``W X~``: ``X~`` is the
layer's ``patches`` of its input (dense: ``[X_l; 1]``; a convolution: the im2col patches) and
``V`` its output as ``rows`` (a convolution: one row per output channel), so a conv W-block is a
dense W-block on patches. X-blocks separate by column (data point), hidden W-blocks by row
(output unit, or output channel).

Each block class owns what differs between blocks: the shape of its variable (``shape``), the
activations it involves (``activations``), the axis along which it separates into independent
pieces (``piece_axis``) and the block of a subset of those pieces (``restrict``). ``XBlock`` and
``WBlock`` are the two families. ``kind`` names a block in messages and histories and in the
registry of block classes, ``BLOCKS`` (``@register_block``, once a class carries the block
facts, ``example`` among them: the conformance suite checks each registered class on it):
backends dispatch on the class (``functools.singledispatch``), never on ``kind``.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields, replace
from types import ModuleType
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
from array_api_compat import array_namespace

from .arrays import Array
from .facts import Registry, placeholder
from .layers import Dense, LinearMap
from .reduce import LOCAL, Comm

if TYPE_CHECKING:
    from .activations import Activation
    from .losses import Loss
    from .network import LiftedNetwork


def _sq(xp, A):
    return xp.sum(A * A)


def kkt_residual(block: Block, Z: Array, U: Array | None = None, comm: Comm = LOCAL) -> float:
    """Scaled natural residual  ||Z - P(Z - g)||_inf / (1 + max_i ||g_i||_inf)  at Z.

    ``g = sum_i g_i`` is the block's gradient split into its terms (``grad_parts``), ``P`` the
    projection on the block's domain. It is 0 exactly at the block's minimiser, and +inf where
    a gradient term is infinite. The scale makes it relative to the terms' size when they are
    large; when they are small (a warm-started W-block, |g_i| ~ 1e-4) it is nearly absolute,
    so a tol of 1e-6 is then stricter than 1e-6 relative accuracy of the block's value.
    ``U``: the block's image ``block.forward(Z)``, where the caller formed it already.
    ``comm``: the ranks that hold the block's data points (``reduce.py``; one process: none):
    the residual of the whole block (:meth:`Block.summed`, :meth:`Block.maxima`).
    """
    parts = block.grad_parts(Z) if U is None else block.grad_parts_with_forward(Z, U)
    return residual_and_scale(block, Z, block.summed(parts, comm), comm)[0]


def residual_and_scale(
    block: Block, Z: Array, parts: Sequence[Array], comm: Comm = LOCAL
) -> tuple[float, float]:
    """``(kkt_residual, 1 + max_i ||g_i||_inf)`` at Z from the whole block's gradient terms
    ``parts`` (:meth:`Block.summed`): the residual and its scale."""
    return scaled_residual(block.maxima(residual_maxima(Z, parts, block.project), comm))


def residual_maxima(
    Z: Array, parts: Sequence[Array], project: Callable[[Array], Array] | None = None
) -> list[Array]:
    """``[max |Z - P(Z - g)|, *max ||g_i||_inf]``, 0-d arrays: the maxima that
    :func:`residual_and_scale` takes over the shares of Z (``Block.maxima``: an X-block's over
    the ranks' or column shares' columns; a W-block's are the whole W's already)."""
    xp = array_namespace(Z)
    return [xp.max(residual_elements(xp, Z, parts, project)), *part_maxima(xp, parts)]


def scaled_residual(maxima: Sequence[Any]) -> tuple[float, float]:
    """``(r / scale, scale)`` from the whole block's :func:`residual_maxima` ``[r, *m]``, with
    ``scale = 1 + max(m)``; an infinite residual where either is not finite (e.g. sigmoid at a
    range end: phi^{-1}(0) = -inf, not optimal)."""
    r, *maxima = (float(f) for f in maxima)
    scale = 1.0 + max(maxima)
    if not (math.isfinite(r) and math.isfinite(scale)):
        return math.inf, scale
    return r / scale, scale


def natural_residual(block: Block, Z: Array, U: Array | None = None) -> tuple[Array, float]:
    """``(|Z - P(Z - g)|, max_i ||g_i||_inf)``: the elementwise residual and the scale of
    ``kkt_residual``, for callers that need it per piece (column or row); ``U``: the image
    ``block.forward(Z)`` if at hand."""
    parts = block.grad_parts(Z) if U is None else block.grad_parts_with_forward(Z, U)
    return residual_parts(array_namespace(Z), Z, parts, block.project)


def residual_parts(
    xp: ModuleType,
    Z: Array,
    parts: Sequence[Array],
    project: Callable[[Array], Array] | None = None,
) -> tuple[Array, float]:
    """``(|Z - P(Z - g)|, max_i ||g_i||_inf)`` from the gradient's terms ``parts`` (``g`` their
    sum) and the projection ``P`` (None: none, the residual is ``|g|``): what
    ``natural_residual`` forms, for a solver that holds the parts already."""
    return residual_elements(xp, Z, parts, project), max(float(m) for m in part_maxima(xp, parts))


def residual_elements(
    xp: ModuleType,
    Z: Array,
    parts: Sequence[Array],
    project: Callable[[Array], Array] | None = None,
) -> Array:
    """``|Z - P(Z - g)|``, elementwise (``residual_parts``)."""
    g = sum(parts[1:], parts[0])
    return xp.abs(g) if project is None else xp.abs(Z - project(Z - g))


def part_maxima(xp: ModuleType, parts: Sequence[Array]) -> list[Array]:
    """``[max ||g_i||_inf]``, 0-d arrays: the terms of ``residual_parts``'s scale."""
    return [xp.max(xp.abs(p)) for p in parts]


class Block:
    """The interface of a block; ``XBlock`` and ``WBlock`` are its two families."""

    kind = "block"  # a name for messages and histories; nothing branches on it
    layer: int  # l of the block's variable (X_l, W_l): a field of each block class
    #: the axis of the variable whose slices are independent pieces (None: one)
    piece_axis: int | None = None

    @property
    def shape(self) -> tuple[int, ...]:
        """The shape of the block's variable."""
        raise NotImplementedError

    @property
    def activations(self) -> tuple[Activation, ...]:
        """The activations the block involves."""
        raise NotImplementedError

    @placeholder
    def restrict(self, index: Array) -> Block:
        """The block of the pieces ``index`` (along ``piece_axis``) alone."""
        raise NotImplementedError

    @placeholder
    def columns(self, index: slice) -> Block:
        """The block of the columns ``index`` of its image (:meth:`forward`) alone: the terms of
        those data points (a convolution's W-block: of those patches), whose figures add and
        take maxima over the columns (``column_threads``). An X-block's are its pieces; a
        W-block keeps W, its regulariser and ``W0`` whole."""
        raise NotImplementedError

    @placeholder
    def variable_columns(self, Z: Array, index: slice) -> Array:
        """``Z``'s part in :meth:`columns` ``(index)``: an X-block's columns, a W-block's W."""
        raise NotImplementedError

    @property
    def n_columns(self) -> int:
        """The columns of the block's image (:meth:`columns` takes a share of them)."""
        raise NotImplementedError(f"{type(self).__name__} gives no n_columns")

    @placeholder
    def forward(self, Z: Array) -> Array:
        """The block's image of ``Z``: the one product its value depends on besides Z itself
        (an X-block's ``A(W, Z)``, a W-block's ``Z X~``)."""
        raise NotImplementedError

    @placeholder
    def value_with_forward(self, Z: Array, U: Array) -> Array:
        """The value at Z from its image ``U = forward(Z)`` at hand (a solver that holds it, or
        a check that formed it once for the value and the residual): :meth:`value` without
        forming ``U`` again."""
        raise NotImplementedError

    @placeholder
    def grad_parts_with_forward(self, Z: Array, U: Array) -> list[Array]:
        """:meth:`grad_parts` from the image ``U = forward(Z)`` at hand."""
        raise NotImplementedError

    def value(self, Z: Array) -> Array:
        """The block's objective at ``Z`` (a 0-d array of Z's namespace)."""
        return self.value_with_forward(Z, self.forward(Z))

    def grad_parts(self, Z: Array) -> list[Array]:
        """The gradient at ``Z`` split into its terms (``grad`` is their sum)."""
        return self.grad_parts_with_forward(Z, self.forward(Z))

    def grad(self, Z: Array) -> Array:
        parts = self.grad_parts(Z)
        return sum(parts[1:], parts[0])

    def project(self, Z: Array) -> Array:
        return Z

    def in_domain(self, Z: Array) -> Array:
        """0-d boolean: ``project`` leaves ``Z`` (the certificate's argmin check)."""
        return array_namespace(Z).all(self.project(Z) == Z)

    @classmethod
    @placeholder
    def example(cls) -> Block:
        """A block of this class on a small network (the conformance suite's case)."""
        raise NotImplementedError(f"{cls.__name__} has no example")

    def kkt_residual(self, Z: Array) -> float:
        return kkt_residual(self, Z)

    # --- the whole block where ranks hold shares of its data points (``reduce.py``) ------------
    @placeholder
    def value_over(self, Z: Array, U: Array, comm: Comm = LOCAL) -> Array:
        """The whole block's value at ``Z`` (its image ``U`` at hand) where the ranks of
        ``comm`` hold shares of its data points: :meth:`value_with_forward` in one process."""
        raise NotImplementedError

    @placeholder
    def summed(self, parts: list[Array], comm: Comm = LOCAL) -> list[Array]:
        """The gradient's terms ``parts`` of the whole block, from this rank's."""
        raise NotImplementedError

    @placeholder
    def maxima(self, figures: list[Array], comm: Comm = LOCAL) -> list:
        """Maxima (``figures``: this rank's) over the whole block."""
        raise NotImplementedError


#: the facts every block class gives (``Block``'s placeholders stand for them)
BLOCK_FACTS = (
    "restrict",
    "columns",
    "variable_columns",
    "forward",
    "value_with_forward",
    "grad_parts_with_forward",
    "value_over",
    "summed",
    "maxima",
    "example",
)
#: ``kind -> class`` of every block: what the conformance suite checks, and what a backend
#: solves (each backend registers its solver for each class)
BLOCKS: Registry[Block] = Registry("block", Block, BLOCK_FACTS, key="kind")
#: registers a block class (a class decorator), once it carries the block facts
register_block = BLOCKS.register


class XBlock(Block):
    """An X-block: ``Z`` (p x m) is the output of B_{l-1}, so it lies in the range of phi_{l-1}
    (``act_in``); it feeds the layer ``map`` with weights ``W``; it separates by column."""

    piece_axis = 1
    # the fields both X-blocks have (their dataclasses declare them)
    act_in: Activation
    U_prev: Array
    lam_in: float
    W: Array
    map: LinearMap  # set by __post_init__ where the dataclass got None (dense)

    def __post_init__(self) -> None:
        if self.map is None:
            self.map = LinearMap((), Dense(self.W.shape[0]), (self.W.shape[1] - 1,))

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.U_prev.shape)

    def forward(self, Z: Array) -> Array:
        """``A(W, Z)``, the pre-activation of the layer that Z feeds."""
        return self.map.forward(self.W, Z)

    # an image's columns are the data points, each its own piece
    def columns(self, index: slice) -> Block:
        return self.restrict(index)

    def variable_columns(self, Z: Array, index: slice) -> Array:
        return Z[:, index]

    @property
    def n_columns(self) -> int:
        return int(self.U_prev.shape[1])

    def adjoint(self, G: Array) -> Array:
        """``A(W, .)^T G``."""
        return self.map.adjoint_x(self.W, G)

    def value_at(self, Z: Array, U: Array) -> Array:
        """Deprecated name of :meth:`value_with_forward`."""
        warnings.warn(
            "value_at is deprecated; use value_with_forward", DeprecationWarning, stacklevel=2
        )
        return self.value_with_forward(Z, U)

    def dense_W(self) -> Array:
        """``[A | b]``, the map as explicit dense weights with the bias as last column
        (``W`` itself for a dense layer; a convolution's Toeplitz matrix: small blocks only)."""
        if self.map.is_dense:
            return self.W
        A, b = self.map.matrix(self.W)
        return np.hstack([A, b])

    def project(self, Z: Array) -> Array:
        return self.act_in.project(Z)

    def in_domain(self, Z: Array) -> Array:
        return self.act_in.contains(Z)

    def grad_in(self, Z: Array) -> Array:
        """The gradient of ``lam_in B_in(Z, U_prev)`` in Z, one of ``grad_parts``."""
        return self.lam_in * self.act_in.grad_v(Z, self.U_prev)

    # the variable's columns are the data points: a rank holds its own columns of Z; values
    # add over the ranks, the gradient is per column, maxima are over every rank's columns
    def value_over(self, Z: Array, U: Array, comm: Comm = LOCAL) -> Array:
        (value,) = comm.reduce([self.value_with_forward(Z, U)], "sum")
        return value

    def summed(self, parts: list[Array], comm: Comm = LOCAL) -> list[Array]:
        return parts

    def maxima(self, figures: list[Array], comm: Comm = LOCAL) -> list:
        return comm.reduce(figures, "max")


@register_block
@dataclass
class XHidden(XBlock):
    """X_l for 1 <= l < L: between B_{l-1} (Z is its output v) and B_l (Z feeds its input u)."""

    layer: int
    act_in: Activation  # phi_{l-1}
    U_prev: Array  # U_{l-1} = W_{l-1} X~_{l-1}
    lam_in: float
    act_out: Activation  # phi_l
    W: Array  # W_l
    V_next: Array  # X_{l+1}
    lam_out: float
    map: LinearMap = None  # type: ignore[assignment]  # the map of W_l (None: dense)
    kind = "x_hidden"

    @classmethod
    def example(cls) -> XHidden:
        return _example(cls, x_block, 1)

    def value_with_forward(self, Z: Array, U: Array) -> Array:
        xp = array_namespace(Z)
        return self.lam_in * xp.sum(self.act_in.divergence(Z, self.U_prev)) + self.lam_out * xp.sum(
            self.act_out.divergence(self.V_next, U)
        )

    def grad_parts_with_forward(self, Z: Array, U: Array) -> list[Array]:
        return [self.grad_in(Z), self.lam_out * self.adjoint(self.act_out.grad_u(self.V_next, U))]

    @property
    def activations(self) -> tuple[Activation, ...]:
        return (self.act_in, self.act_out)

    def restrict(self, index: Array) -> XHidden:
        return replace(self, U_prev=self.U_prev[:, index], V_next=self.V_next[:, index])


@register_block
@dataclass
class XLast(XBlock):
    """X_L: the loss of the output layer plus B_{L-1} (Z is its output v)."""

    layer: int
    act_in: Activation
    U_prev: Array
    lam_in: float
    loss: Loss
    W: Array  # W_L
    Y: Array
    map: LinearMap = None  # type: ignore[assignment]  # the map of W_L (None: dense)
    kind = "x_last"

    @classmethod
    def example(cls) -> XLast:
        return _example(cls, x_block, 2)

    def value_with_forward(self, Z: Array, U: Array) -> Array:
        xp = array_namespace(Z)
        return self.loss.value(self.Y, U) + self.lam_in * xp.sum(
            self.act_in.divergence(Z, self.U_prev)
        )

    def grad_parts_with_forward(self, Z: Array, U: Array) -> list[Array]:
        return [self.adjoint(self.loss.grad(self.Y, U)), self.grad_in(Z)]

    @property
    def activations(self) -> tuple[Activation, ...]:
        return (self.act_in,)

    def restrict(self, index: Array) -> XLast:
        return replace(self, U_prev=self.U_prev[:, index], Y=self.Y[:, index])


@dataclass
class WBlock(Block):
    """A W-block: ``W`` (rows x n) acts on ``Xt``; rows are independent pieces, except where a
    loss couples them (``piece_axis`` None)."""

    layer: int
    Xt: Array  # X~_l = [X_l; 1]
    rho: float
    gamma: float = 0.0
    W0: Array = None  # the proximal centre (batched model); None when gamma = 0
    #: the fields with a column per data point (a convolution's X~: per patch): what
    #: :meth:`columns` takes a share of, and what ranks gather to solve the block whole
    column_fields: ClassVar[tuple[str, ...]] = ("Xt",)

    def forward(self, W: Array) -> Array:
        """``W X~``, the rows of the layer's pre-activation."""
        return W @ self.Xt

    def columns(self, index: slice) -> WBlock:
        return replace(self, **{f: getattr(self, f)[:, index] for f in self.column_fields})

    def variable_columns(self, W: Array, index: slice) -> Array:
        return W

    @property
    def n_columns(self) -> int:
        return int(self.Xt.shape[1])

    def _W0_rows(self, index: Array) -> Array | None:
        return None if self.W0 is None else self.W0[index]

    def _reg_value(self, W: Array) -> Array:
        xp = array_namespace(W)
        val = self.rho * _sq(xp, W)
        return val + self.gamma * _sq(xp, W - self.W0) if self.gamma else val

    def _reg_grad(self, W: Array) -> Array:
        g = 2 * self.rho * W
        return g + 2 * self.gamma * (W - self.W0) if self.gamma else g

    def data_value(self, W: Array, U: Array) -> Array:
        """The block's data term at ``W`` (image ``U``): a sum over its data points."""
        raise NotImplementedError

    def value_with_forward(self, W: Array, U: Array) -> Array:
        return self.data_value(W, U) + self._reg_value(W)

    # W is whole on every rank: the data term and the first gradient term (the data's) add
    # over the ranks' points; the regularisers and every maximum are the same on each rank
    def value_over(self, W: Array, U: Array, comm: Comm = LOCAL) -> Array:
        (data,) = comm.reduce([self.data_value(W, U)], "sum")
        return data + self._reg_value(W)

    def summed(self, parts: list[Array], comm: Comm = LOCAL) -> list[Array]:
        (data,) = comm.reduce([parts[0]], "sum")
        return [data, *parts[1:]]

    def maxima(self, figures: list[Array], comm: Comm = LOCAL) -> list:
        return figures


@register_block
@dataclass
class WHidden(WBlock):
    """W_l for l < L: lam_l B_l(X_{l+1}, W X~_l) + rho_l ||W||^2 + gamma_l ||W - W0||^2."""

    act: Activation = None  # type: ignore[assignment]  # phi_l (a default: W0, U have one)
    V: Array = None  # X_{l+1}
    lam: float = 1.0
    kind = "w_hidden"
    column_fields = ("Xt", "V")
    piece_axis = 0

    @classmethod
    def example(cls) -> WHidden:
        return _example(cls, w_block, 1, gamma=0.5)

    def data_value(self, W: Array, U: Array) -> Array:
        return self.lam * array_namespace(W).sum(self.act.divergence(self.V, U))

    def grad_parts_with_forward(self, W: Array, U: Array) -> list[Array]:
        return [self.lam * (self.act.grad_u(self.V, U) @ self.Xt.T), self._reg_grad(W)]

    @property
    def shape(self) -> tuple[int, ...]:
        return (self.V.shape[0], self.Xt.shape[0])

    @property
    def activations(self) -> tuple[Activation, ...]:
        return (self.act,)

    def restrict(self, index: Array) -> WHidden:
        return replace(self, V=self.V[index], W0=self._W0_rows(index))


@register_block
@dataclass
class WLast(WBlock):
    """W_L: L(Y, W X~_L) + rho_L ||W||^2 + gamma_L ||W - W0||^2."""

    loss: Loss = None  # type: ignore[assignment]  # (a default: W0, U have one)
    Y: Array = None
    kind = "w_last"
    column_fields = ("Xt", "Y")

    @classmethod
    def example(cls) -> WLast:
        return _example(cls, w_block, 2)

    def data_value(self, W: Array, U: Array) -> Array:
        return self.loss.value(self.Y, U)

    def grad_parts_with_forward(self, W: Array, U: Array) -> list[Array]:
        return [self.loss.grad(self.Y, U) @ self.Xt.T, self._reg_grad(W)]

    @property
    def shape(self) -> tuple[int, ...]:
        return (self.Y.shape[0], self.Xt.shape[0])

    @property
    def activations(self) -> tuple[Activation, ...]:
        return ()

    @property
    def piece_axis(self) -> int | None:  # type: ignore[override]  # the other blocks': a field
        """Rows for a loss that is a sum over them (MSE); None for one that couples them
        (cross-entropy's log-sum-exp)."""
        return 0 if self.loss.separable_rows else None

    def restrict(self, index: Array) -> WLast:
        if self.piece_axis is None:  # one piece: the block itself
            return self
        return replace(self, Y=self.Y[index], W0=self._W0_rows(index))


# --- the blocks of a network at its current iterate ------------------------------------------
def _example(cls: type, build: Callable[..., Block], l: int, gamma: float = 0.0) -> Any:
    """The block ``build(..., l)`` of a 3-4-3-2 ReLU network with the squared error, on 6 data
    points, at a point off its feed-forward pass (``gamma``: a W-block's proximal term, about
    ``W0`` = its weights moved at random), as an instance of ``cls`` (a subclass of the class
    ``build`` makes inherits its example)."""
    from .network import LiftedNetwork

    rng = np.random.default_rng(0)
    net = LiftedNetwork((3, 4, 3, 2), "relu", "mse", lam=1.0, rho=0.1, seed=0)
    X0, Y = rng.standard_normal((3, 6)), rng.standard_normal((2, 6))
    Xs, _ = net.forward(X0)
    Xs = [np.maximum(X + 0.2 * rng.standard_normal(X.shape), 0.0) for X in Xs]
    block: Any  # a dataclass of this module
    if gamma:
        W0 = net.W[l] + 0.3 * rng.standard_normal(net.W[l].shape)
        block = build(net, X0, Y, Xs, l, gamma=gamma, W0=W0)
    else:
        block = build(net, X0, Y, Xs, l)
    return cls(**{f.name: getattr(block, f.name) for f in fields(block) if f.init})


def x_block(
    net: LiftedNetwork,
    X0: Array,
    Y: Array,
    Xs: list[Array],
    l: int,
    U_prev: Array | None = None,
) -> XHidden | XLast:
    """The block of the lifted variable X_l (1 <= l <= L) at the iterate (net.W, Xs).

    ``U_prev``: ``W_{l-1} X~_{l-1}`` at this iterate if already at hand (the driver's
    pre-activations), else computed here.

    >>> import numpy as np
    >>> from fenchel_cvx.network import LiftedNetwork
    >>> net = LiftedNetwork([3, 4, 2], seed=0)
    >>> X0, Y = np.arange(12.0).reshape(3, 4) / 10, np.ones((2, 4))
    >>> Xs, _ = net.forward(X0)
    >>> block = x_block(net, X0, Y, Xs, 1)
    >>> type(block).__name__, block.shape, block.piece_axis   # X_1 = X_L: 4 units x 4 points
    ('XLast', (4, 4), 1)
    >>> round(float(block.value(Xs[0])), 4)        # L(Y, W_1 X~_1) + lam B_0 (0 here)
    15.9746
    >>> block.restrict([0, 2]).shape                 # two columns: two independent pieces
    (4, 2)
    """
    L = net.n_hidden
    if not 1 <= l <= L:
        raise ValueError(f"l must be in 1..{L} for an X-block, got {l}")
    X = [X0, *Xs]
    if U_prev is None:
        U_prev = net.pre_activation(l - 1, X[l - 1])
    common = dict(layer=l, act_in=net.activations[l - 1], U_prev=U_prev, lam_in=net.lam[l - 1])
    if l < L:
        return XHidden(
            **common,
            act_out=net.activations[l],
            W=net.W[l],
            V_next=X[l + 1],
            lam_out=net.lam[l],
            map=net.layers[l],
        )
    return XLast(**common, loss=net.loss, W=net.W[L], Y=Y, map=net.layers[L])


def w_block(
    net: LiftedNetwork,
    X0: Array,
    Y: Array,
    Xs: list[Array],
    l: int,
    gamma: float = 0.0,
    W0: Array | None = None,
    Xt: Array | None = None,
) -> WHidden | WLast:
    """The block of the weights W_l (0 <= l <= L); ``gamma > 0`` adds gamma ||W - W0||^2.

    ``Xt``: the patches ``X~_l`` if at hand (else formed here).

    >>> import numpy as np
    >>> from fenchel_cvx.network import LiftedNetwork
    >>> net = LiftedNetwork([3, 4, 2], seed=0)
    >>> X0, Y = np.arange(12.0).reshape(3, 4) / 10, np.ones((2, 4))
    >>> Xs, _ = net.forward(X0)
    >>> block = w_block(net, X0, Y, Xs, 0, gamma=0.5, W0=net.W[0])
    >>> type(block).__name__, block.shape, block.piece_axis   # W_0: one piece per row
    ('WHidden', (4, 4), 0)
    >>> B = float(block.value(net.W[0]) - block.rho * np.sum(net.W[0] ** 2))
    >>> abs(B) < 1e-12               # B_0(X_1, W_0 X~_0) = 0 at the feed-forward X_1
    True
    >>> w_block(net, X0, Y, Xs, 2)
    Traceback (most recent call last):
    ...
    ValueError: l must be in 0..1 for a W-block, got 2
    """
    L = net.n_hidden
    if not 0 <= l <= L:
        raise ValueError(f"l must be in 0..{L} for a W-block, got {l}")
    if not (math.isfinite(gamma) and gamma >= 0):
        raise ValueError(f"gamma must be >= 0 and finite, got {gamma!r}")
    if gamma and W0 is None:
        raise ValueError("W0 is required when gamma > 0")
    X, A = [X0, *Xs], net.layers[l]
    common = dict(
        layer=l,
        Xt=A.patches(X[l]) if Xt is None else Xt,
        rho=net.rho[l],
        gamma=float(gamma),
        W0=W0 if gamma else None,
    )
    if l < L:
        return WHidden(**common, act=net.activations[l], V=A.to_rows(X[l + 1]), lam=net.lam[l])
    return WLast(**common, loss=net.loss, Y=A.to_rows(Y))


@dataclass
class BlockResult:
    """What every backend returns for one block solve."""

    argmin: Array
    value: float  # the block objective at argmin (Block.value); NaN where a capped
    # fast solve was asked not to form it (capped_value=False)
    status: str  # "optimal" or the solver's status
    residual: float  # kkt_residual(block, argmin); an inexact fast W solve reports
    # its own (from W X~ updated in place; exact when converged)
    seconds: float = 0.0
    iterations: int = 0
    converged: bool = True
    info: dict[str, Any] = field(default_factory=dict)  # solver-specific: duality gap, name, ...
    U: Array | None = None  # the argmin's image where the solver holds it, else None: an
    # X-block's A(W, argmin) + b (the W-block of the same layer starts from it), a W-block's
    # argmin X~ (rows form; as the solver updated it, exact up to rounding)
