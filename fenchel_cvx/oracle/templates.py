"""DPP templates: one small ``cp.Problem`` per (block kind, shape, activation, loss), built once.

The four blocks (docs/mathematics.md, "The four blocks"; the paper's Sec. 4.5, eqs. (14)-(20)) are
separable: X-blocks by data point (column), the hidden W-block and the MSE last W-block by output
unit (row). A *template* is the problem of one *piece*: ``k`` columns or ``r`` rows. What changes
from piece to piece is a ``cp.Parameter``; products of parameters are precomputed in NumPy into one
parameter (``Q`` below), constants that do not depend on the variable are dropped (the backend
returns ``block.value(argmin)`` computed in NumPy), and each objective is divided by the scalar
that multiplies its nonlinear term so that every problem is DPP (``is_dcp(dpp=True)``, checked):

    x_hidden   (Z: p x k)  a sum F_{l-1}(Z) - <Q, Z> + sum F*_l(W_x Z + b)            (/ lam_l)
               a = lam_{l-1}/lam_l,  Q = a U_{l-1} + W_x^T X_{l+1}
    x_last mse (Z: p x k)  ||W_x Z - R||^2 + lam sum F_{L-1}(Z) - <Q, Z>
               R = Y - b 1^T,  Q = lam U_{L-1}
    x_last ce  (Z, t)      <s, t> - <Q, Z> + lam sum F_{L-1}(Z),  lse(W_x z_j + b - t_j) <= 0
               s = 1^T Y (column sums),  Q = W_x^T Y + lam U_{L-1}
    w_hidden   (W: r x n)  sum F*_l(W X~) - <Q, W> + c ||W||^2                          (/ lam_l)
               Q = X_{l+1} X~^T + (2 gamma / lam) W0,  c = (rho + gamma) / lam
    w_last mse (W: r x n)  ||W X~ - Y||^2 + c ||W||^2 - <Q, W>,  Q = 2 gamma W0,  c = rho + gamma
    w_last ce  (W, t)      <s, t> - <Q, W> + c ||W||^2,  lse(W x~_j - t_j) <= 0
               Q = Y X~^T + 2 gamma W0,  c = rho + gamma
    x_last any (Z: p x k)  L(Y, W_x Z + b) + lam sum F_{L-1}(Z) - <Q, Z>,  Q = lam U_{L-1}
    w_last any (W: r x n)  L(Y, W X~) + c ||W||^2 - <Q, W>,  Q = 2 gamma W0,  c = rho + gamma
               (any other loss, its CVXPY form ``atoms.loss_cvx`` with Y a parameter: Huber)

(``W_x = W[:, :p]`` and ``b = W[:, p]`` split the weights of the layer a Z feeds, a convolution
given by its explicit matrix ``block.dense_W()``; a conv W-block is a W-block on patches; ``F``,
``F*`` are the Theorem-1 pair of the activation, ``activations.py``; ReLU's F* enters through its
epigraph.) The cross-entropy W-block couples its rows through log-sum-exp, so it is one piece.

X-blocks keep ``W_x`` as a parameter (it is small). W-blocks compile ``X~`` in as a constant and
are rebuilt in place when it changes: a parameter ``X~`` made CVXPY's DPP compilation take
seconds per MNIST row and 22 GB for the cross-entropy W_L block (docs/oracle.md).
``block_problem`` gives the whole, unsplit block as an explicit ``cp.Problem`` with NumPy
constants, for teaching and for the tests. ``plan`` and ``block_problem`` dispatch on the block's
class (``functools.singledispatch``): one registered function per class of ``blocks.py``; the
last blocks' plans then on the loss's type, and ``_fstar`` on the activation's.
"""

import functools
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeAlias

import cvxpy as cp
import numpy as np
import scipy.sparse as sp

from ..activations import Activation, ReLU
from ..blocks import Block, WBlock, WHidden, WLast, XBlock, XHidden, XLast
from ..errors import FenchelError
from ..losses import MSE, CrossEntropy, Loss
from .atoms import F_cvx, Fstar_sum_cvx, divergence_cvx, loss_cvx


class TemplateError(FenchelError):
    """A template is not DPP (a modelling bug: the backend would re-canonicalise every solve)."""


@dataclass
class Template:
    """A compiled piece problem: set ``params[name].value`` and solve; read ``var.value``."""

    key: tuple
    problem: cp.Problem
    var: cp.Variable
    params: dict
    consts: dict | None = (
        None  # data compiled in as constants (a template is rebuilt when they change)
    )

    def matches(self, consts: Mapping[str, Any]) -> bool:
        """True if this template was compiled with exactly these constants."""
        mine = self.consts or {}
        return mine.keys() == consts.keys() and all(
            mine[k].shape == A.shape and np.array_equal(mine[k], A) for k, A in consts.items()
        )

    def set(self, values: Mapping[str, Any]) -> None:
        for name, value in values.items():
            self.params[name].value = value


def _domain(act, Z):
    """The constraints lo <= Z <= hi of the range of ``act`` (the domain of F)."""
    lo, hi = act.v_range
    return ([Z >= lo] if not math.isinf(lo) else []) + ([Z <= hi] if not math.isinf(hi) else [])


def _linear(Q, V):
    return cp.sum(cp.multiply(Q, V))


def _epigraph_lse(U, t, k):
    """lse(U[:, j] - t_j) <= 0 for every column j, i.e. t_j >= lse(U[:, j])."""
    return [
        cp.log_sum_exp(U - np.ones((U.shape[0], 1)) @ cp.reshape(t, (1, k), order="F"), axis=0) <= 0
    ]


@functools.singledispatch
def _fstar(act, U):
    """sum F*(U) and its constraints (``atoms.Fstar_sum_cvx``), registered by the activation's
    type where a template takes another form."""
    return Fstar_sum_cvx(act, U)


@_fstar.register
def _(act: ReLU, U):
    """The epigraph ||t||^2/2, t >= U, t >= 0 of ||U_+||^2/2 (measured 28% faster in Clarabel
    than CVXPY's ``square(pos(.))``)."""
    t = cp.Variable(U.shape, nonneg=True, name="t_relu")
    return 0.5 * cp.sum_squares(t), [t >= U]


def _check_dpp(key, problem):
    if not problem.is_dcp(dpp=True):
        raise TemplateError(
            f"the {key[0]} template {key} is not DPP; it would be re-canonicalised on every solve"
        )
    return problem


# --- the builders: one per block kind ---------------------------------------------------------
#: what a builder returns: the problem, its variable and its parameters by name
Built: TypeAlias = tuple[cp.Problem, cp.Variable, dict[str, cp.Parameter]]


def x_hidden(p: int, q: int, k: int, act_in: Activation, act_out: Activation) -> Built:
    Z = cp.Variable((p, k), name="Z")
    P = dict(
        a=cp.Parameter(nonneg=True, name="a"),
        Q=cp.Parameter((p, k), name="Q"),
        Wx=cp.Parameter((q, p), name="Wx"),
        b=cp.Parameter((q, 1), name="b"),
    )
    fstar, cons = _fstar(act_out, P["Wx"] @ Z + P["b"])
    obj = P["a"] * cp.sum(F_cvx(act_in, Z)) - _linear(P["Q"], Z) + fstar
    return cp.Problem(cp.Minimize(obj), _domain(act_in, Z) + cons), Z, P


def x_last_mse(p: int, c: int, k: int, act_in: Activation) -> Built:
    Z = cp.Variable((p, k), name="Z")
    P = dict(
        lam=cp.Parameter(nonneg=True, name="lam"),
        Q=cp.Parameter((p, k), name="Q"),
        Wx=cp.Parameter((c, p), name="Wx"),
        R=cp.Parameter((c, k), name="R"),
    )
    obj = (
        cp.sum_squares(P["Wx"] @ Z - P["R"])
        + P["lam"] * cp.sum(F_cvx(act_in, Z))
        - _linear(P["Q"], Z)
    )
    return cp.Problem(cp.Minimize(obj), _domain(act_in, Z)), Z, P


def x_last_ce(p: int, c: int, k: int, act_in: Activation) -> Built:
    Z, t = cp.Variable((p, k), name="Z"), cp.Variable(k, name="t")
    P = dict(
        lam=cp.Parameter(nonneg=True, name="lam"),
        Q=cp.Parameter((p, k), name="Q"),
        Wx=cp.Parameter((c, p), name="Wx"),
        b=cp.Parameter((c, 1), name="b"),
        s=cp.Parameter(k, nonneg=True, name="s"),
    )
    obj = P["s"] @ t - _linear(P["Q"], Z) + P["lam"] * cp.sum(F_cvx(act_in, Z))
    cons = _domain(act_in, Z) + _epigraph_lse(P["Wx"] @ Z + P["b"], t, k)
    return cp.Problem(cp.Minimize(obj), cons), Z, P


def w_hidden(n: int, m: int, r: int, act: Activation, Xt: np.ndarray | cp.Expression) -> Built:
    W = cp.Variable((r, n), name="W")
    P = dict(Q=cp.Parameter((r, n), name="Q"), c=cp.Parameter(nonneg=True, name="c"))
    fstar, cons = _fstar(act, W @ Xt)
    obj = fstar - _linear(P["Q"], W) + P["c"] * cp.sum_squares(W)
    return cp.Problem(cp.Minimize(obj), cons), W, P


def w_last_mse(n: int, m: int, r: int, Xt: np.ndarray | cp.Expression) -> Built:
    W = cp.Variable((r, n), name="W")
    P = dict(
        Y=cp.Parameter((r, m), name="Y"),
        Q=cp.Parameter((r, n), name="Q"),
        c=cp.Parameter(nonneg=True, name="c"),
    )
    obj = cp.sum_squares(W @ Xt - P["Y"]) + P["c"] * cp.sum_squares(W) - _linear(P["Q"], W)
    return cp.Problem(cp.Minimize(obj)), W, P


def w_last_ce(n: int, m: int, c: int, Xt: np.ndarray | cp.Expression) -> Built:
    W, t = cp.Variable((c, n), name="W"), cp.Variable(m, name="t")
    P = dict(
        Q=cp.Parameter((c, n), name="Q"),
        s=cp.Parameter(m, nonneg=True, name="s"),
        c=cp.Parameter(nonneg=True, name="c"),
    )
    obj = P["s"] @ t - _linear(P["Q"], W) + P["c"] * cp.sum_squares(W)
    return cp.Problem(cp.Minimize(obj), _epigraph_lse(W @ Xt, t, m)), W, P


def x_last_any(p: int, c: int, k: int, act_in: Activation, loss: Loss) -> Built:
    """Any loss with a CVXPY form that stays DPP with the targets as a parameter (Huber)."""
    Z = cp.Variable((p, k), name="Z")
    P = dict(
        lam=cp.Parameter(nonneg=True, name="lam"),
        Q=cp.Parameter((p, k), name="Q"),
        Wx=cp.Parameter((c, p), name="Wx"),
        b=cp.Parameter((c, 1), name="b"),
        Y=cp.Parameter((c, k), name="Y"),
    )
    obj = (
        loss_cvx(loss, P["Y"], P["Wx"] @ Z + P["b"])
        + P["lam"] * cp.sum(F_cvx(act_in, Z))
        - _linear(P["Q"], Z)
    )
    return cp.Problem(cp.Minimize(obj), _domain(act_in, Z)), Z, P


def w_last_any(n: int, m: int, r: int, loss: Loss, Xt: np.ndarray | cp.Expression) -> Built:
    """Any loss with a CVXPY form that stays DPP with the targets as a parameter (Huber)."""
    W = cp.Variable((r, n), name="W")
    P = dict(
        Y=cp.Parameter((r, m), name="Y"),
        Q=cp.Parameter((r, n), name="Q"),
        c=cp.Parameter(nonneg=True, name="c"),
    )
    obj = loss_cvx(loss, P["Y"], W @ Xt) + P["c"] * cp.sum_squares(W) - _linear(P["Q"], W)
    return cp.Problem(cp.Minimize(obj)), W, P


#: the builders by name (each takes its dimensions, activations and constants: ``Plan``)
BUILDERS: dict[str, Callable[..., Built]] = {
    "x_hidden": x_hidden,
    "x_last_mse": x_last_mse,
    "x_last_cross_entropy": x_last_ce,
    "w_hidden": w_hidden,
    "w_last_mse": w_last_mse,
    "w_last_cross_entropy": w_last_ce,
    "x_last_any": x_last_any,
    "w_last_any": w_last_any,
}


def _constant(A):
    """A data matrix as a CVXPY constant: sparse when mostly zero (MNIST pixels), else dense."""
    return sp.csc_array(A) if np.count_nonzero(A) < 0.5 * A.size else np.asarray(A)


def build(key: tuple, acts: tuple, consts: Mapping[str, Any] | None = None) -> Template:
    """Build the template ``key = (name, dims, activation reprs)``.

    ``acts`` are the activations, ``consts`` the data compiled in as constants (W-blocks: X~).
    """
    name, dims = key[0], key[1]
    consts = consts or {}
    problem, var, params = BUILDERS[name](*dims, *acts, *(_constant(A) for A in consts.values()))
    return Template(
        key,
        _check_dpp(key, problem),
        var,
        params,
        {k: np.array(A, copy=True) for k, A in consts.items()},
    )


# --- the split of a block into pieces ---------------------------------------------------------
@dataclass
class Piece:
    """Parameter values of one piece and where its solution goes (``index`` into the argmin)."""

    index: object  # slice of columns (X-blocks) or rows (W-blocks) of the argmin
    size: int  # number of real columns / rows (the rest is padding)
    values: dict


@dataclass
class Plan:
    """How a block is solved: template key and activations, shared and per-piece parameters."""

    name: str  # the builder (a key of BUILDERS)
    dims: tuple  # its dimensions
    acts: tuple  # its activations
    shared: dict  # parameter values common to all pieces
    consts: dict  # data compiled into the template as constants (W-blocks: X~)
    pieces: list  # Piece per group of columns / rows
    axis: int  # 1: pieces are columns, 0: rows
    scale: float  # the objective of a piece is (block objective) / scale
    fixed: list | tuple = ()  # (columns, values) solved in closed form, outside any piece

    @property
    def key(self) -> tuple:
        """The template cache key: builder, dimensions, activations (slope included)."""
        return (self.name, self.dims, tuple(repr(a) for a in self.acts))


def _chunks(count, size):
    """Balanced consecutive chunks of at most ``size`` out of ``count``: (start, stop) pairs."""
    if count == 0:
        return [], 1
    n = max(1, math.ceil(count / max(1, size)))
    size = math.ceil(count / n)
    return [(i, min(count, i + size)) for i in range(0, count, size)], size


def pad(A: np.ndarray, axis: int, size: int) -> np.ndarray:
    """Pad A along ``axis`` to ``size`` by repeating its first slice (a valid, discarded
    problem).

    >>> pad(np.arange(6).reshape(2, 3), axis=1, size=5)
    array([[0, 1, 2, 0, 0],
           [3, 4, 5, 3, 3]])
    """
    extra = size - A.shape[axis]
    if extra <= 0:
        return A
    first = np.take(A, [0] * extra, axis=axis)
    return np.concatenate([A, first], axis=axis)


def _column_pieces(cols, size, per_column):
    """Pieces of consecutive entries of ``cols``; ``per_column`` maps a name to a (., m) array."""
    chunks, k = _chunks(len(cols), size)
    pieces = []
    for a, b in chunks:
        idx = cols[a:b]
        vals = {}
        for name, A in per_column.items():
            vals[name] = pad(A[..., idx], A.ndim - 1, k)
        pieces.append(Piece(idx, b - a, vals))
    return pieces, k


def _row_pieces(rows, size, per_row):
    chunks, r = _chunks(rows, size)
    return [
        Piece(slice(a, b), b - a, {name: pad(A[a:b], 0, r) for name, A in per_row.items()})
        for a, b in chunks
    ], r


@functools.singledispatch
def plan(block: Block, budget: int) -> Plan:
    """Split ``block`` into pieces whose parametrised problem has about ``budget`` coefficients
    (one planner per block class, registered below)."""
    raise TypeError(f"no template plan is registered for {type(block).__name__}")


def _x_setup(block, budget):
    """An X-block's ``U_{l-1}``, ``W_x``, ``b``, the columns per piece and the column indices."""
    U, W = block.U_prev, block.dense_W()
    p, m = U.shape
    Wx, b = W[:, :p], W[:, p : p + 1]
    return U, Wx, b, max(1, budget // max(1, Wx.size)), np.arange(m)


@plan.register
def _(block: XHidden, budget):
    U, Wx, b, size, cols = _x_setup(block, budget)
    a = block.lam_in / block.lam_out
    pieces, k = _column_pieces(cols, size, {"Q": a * U + Wx.T @ block.V_next})
    return Plan(
        "x_hidden",
        (U.shape[0], Wx.shape[0], k),
        (block.act_in, block.act_out),
        {"a": a, "Wx": Wx, "b": b},
        {},
        pieces,
        1,
        block.lam_out,
    )


@plan.register
def _(block: XLast, budget):
    return _x_last_plan(block.loss, block, *_x_setup(block, budget))


@functools.singledispatch
def _x_last_plan(loss, block, U, Wx, b, size, cols):
    """The X_L plan of a loss (registered by its type below; any other loss: ``x_last_any``)."""
    p, Y = U.shape[0], block.Y
    pieces, k = _column_pieces(cols, size, {"Q": block.lam_in * U, "Y": Y})
    return Plan(
        "x_last_any",
        (p, Y.shape[0], k),
        (block.act_in, loss),
        {"lam": block.lam_in, "Wx": Wx, "b": b},
        {},
        pieces,
        1,
        1.0,
    )


@_x_last_plan.register
def _(loss: MSE, block, U, Wx, b, size, cols):
    p, lam, Y = U.shape[0], block.lam_in, block.Y
    pieces, k = _column_pieces(cols, size, {"Q": lam * U, "R": Y - b})
    return Plan(
        "x_last_mse",
        (p, Y.shape[0], k),
        (block.act_in,),
        {"lam": lam, "Wx": Wx},
        {},
        pieces,
        1,
        1.0,
    )


@_x_last_plan.register
def _(loss: CrossEntropy, block, U, Wx, b, size, cols):
    p, lam, Y = U.shape[0], block.lam_in, block.Y
    s = Y.sum(axis=0)
    fixed = []
    if np.any(s == 0):  # no label mass: the column minimises lam B(z, u) alone, z = phi(u)
        zero = np.flatnonzero(s == 0)
        fixed.append((zero, block.act_in.phi(U[:, zero])))
        cols = np.flatnonzero(s > 0)
    pieces, k = _column_pieces(cols, size, {"Q": Wx.T @ Y + lam * U, "s": s})
    return Plan(
        "x_last_cross_entropy",
        (p, Y.shape[0], k),
        (block.act_in,),
        {"lam": lam, "Wx": Wx, "b": b},
        {},
        pieces,
        1,
        1.0,
        fixed,
    )


@plan.register
def _(block: WHidden, budget):
    Xt, W0, g, lam, V = block.Xt, block.W0, block.gamma, block.lam, block.V
    n, m = Xt.shape
    Q = V @ Xt.T + ((2 * g / lam) * W0 if g else 0.0)
    pieces, r = _row_pieces(V.shape[0], max(1, budget // max(1, Xt.size)), {"Q": Q})
    return Plan(
        "w_hidden",
        (n, m, r),
        (block.act,),
        {"c": (block.rho + g) / lam},
        {"Xt": Xt},
        pieces,
        0,
        lam,
    )


@plan.register
def _(block: WLast, budget):
    return _w_last_plan(block.loss, block, budget)


def _w_last_rows(block, budget, Y):
    """The proximal term's ``Q = 2 gamma W0`` and the row pieces of a last W-block."""
    Xt, W0, g = block.Xt, block.W0, block.gamma
    Q = 2 * g * W0 if g else np.zeros((Y.shape[0], Xt.shape[0]))
    size = max(1, budget // max(1, Xt.size)) if block.piece_axis == 0 else Y.shape[0]
    return _row_pieces(Y.shape[0], size, {"Q": Q, "Y": Y})


@functools.singledispatch
def _w_last_plan(loss, block, budget):
    """The W_L plan of a loss (registered by its type below; any other loss: ``w_last_any``,
    by rows where the loss separates by rows, else one piece)."""
    pieces, r = _w_last_rows(block, budget, block.Y)
    n, m = block.Xt.shape
    return Plan(
        "w_last_any",
        (n, m, r),
        (loss,),
        {"c": block.rho + block.gamma},
        {"Xt": block.Xt},
        pieces,
        0,
        1.0,
    )


@_w_last_plan.register
def _(loss: MSE, block, budget):
    pieces, r = _w_last_rows(block, budget, block.Y)
    n, m = block.Xt.shape
    return Plan(
        "w_last_mse",
        (n, m, r),
        (),
        {"c": block.rho + block.gamma},
        {"Xt": block.Xt},
        pieces,
        0,
        1.0,
    )


@_w_last_plan.register
def _(loss: CrossEntropy, block, budget):
    Xt, W0, g, Y = block.Xt, block.W0, block.gamma, block.Y
    n, m = Xt.shape
    c = block.rho + g
    s = Y.sum(axis=0)
    keep = np.flatnonzero(s > 0)  # columns without label mass do not enter the loss
    Xk = Xt[:, keep]
    Q = Y[:, keep] @ Xk.T + (2 * g * W0 if g else 0.0)
    piece = Piece(slice(0, Y.shape[0]), Y.shape[0], {"Q": Q})
    return Plan(
        "w_last_cross_entropy",
        (n, len(keep), Y.shape[0]),
        (),
        {"s": s[keep], "c": c},
        {"Xt": Xk},
        [piece],
        0,
        1.0,
    )


# --- the whole block, for teaching --------------------------------------------------------------
@functools.singledispatch
def block_problem(block: Block) -> tuple[cp.Problem, cp.Variable]:
    """The unsplit block as an explicit ``cp.Problem`` with NumPy data; returns ``(problem, var)``.

    Its optimal value *is* the block objective (constants included), written with the CVXPY
    forms of ``atoms.py`` (``divergence_cvx``, ``loss_cvx``). It is
    canonicalised from scratch (no parameters): use it for small blocks, to read or print.
    """
    raise TypeError(f"no CVXPY form is registered for {type(block).__name__}")


@block_problem.register
def _(block: XBlock):
    Z = cp.Variable(block.shape, name="Z")
    Zt = cp.vstack([Z, np.ones((1, Z.shape[1]))])
    W = block.dense_W()  # a convolution: its explicit (Toeplitz) matrix
    B_in, cons = divergence_cvx(block.act_in, Z, block.U_prev)
    out, c2 = _outer_term(block, W @ Zt)
    return cp.Problem(cp.Minimize(block.lam_in * B_in + out), cons + c2), Z


@block_problem.register
def _(block: WBlock):
    W = cp.Variable(block.shape, name="W")
    obj, cons = _outer_term(block, W @ block.Xt)
    obj = obj + block.rho * cp.sum_squares(W)
    if block.gamma:
        obj = obj + block.gamma * cp.sum_squares(W - block.W0)
    return cp.Problem(cp.Minimize(obj), cons), W


@functools.singledispatch
def _outer_term(block, U):
    """The block's term in the pre-activation ``U`` it produces: ``(expression, constraints)``."""
    raise TypeError(f"no CVXPY form is registered for {type(block).__name__}")


@_outer_term.register
def _(block: XHidden, U):
    B, cons = divergence_cvx(block.act_out, block.V_next, U)
    return block.lam_out * B, cons


@_outer_term.register
def _(block: WHidden, U):
    B, cons = divergence_cvx(block.act, block.V, U)
    return block.lam * B, cons


@_outer_term.register(XLast)
@_outer_term.register(WLast)
def _(block, U):
    return loss_cvx(block.loss, block.Y, U), []
