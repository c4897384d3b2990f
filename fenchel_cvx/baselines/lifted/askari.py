"""Askari et al. 2018, "Lifted neural networks": ReLU as the penalty ||X_{l+1} - W_l X~_l||^2
with X_{l+1} >= 0, trained by block coordinate descent.

Objective (``X~ = [X; 1]``, biases in the last column of ``W_l``, MSE summed over the data)

    ||Y - W_L X~_L||^2 + sum_{l<L} lam ||X_{l+1} - W_l X~_l||^2 + sum_l rho_l ||W_l||^2,
    subject to X_l >= 0 (l = 1..L)

One iteration: the X-blocks from the output back (X_L, ..., X_1), each a nonnegative least
squares problem in the columns,

    X_l <- argmin_{X >= 0} lam ||X - W_{l-1} X~_{l-1}||^2 + c ||T - A X - a||^2
           (T, A, a = Y, W_L[:, :-1], W_L[:, -1] with c = 1 for X_L; X_{l+1}, ... with c = lam),

solved by ``x_steps`` accelerated projected-gradient (FISTA) steps warm-started at the current
X (step 1 / Lipschitz constant 2 lam + 2 c ||A||_2^2); then the W-blocks, each a ridge
regression in closed form,

    W_l <- argmin_W c ||T - W X~_l||^2 + rho_l ||W||^2.

Askari et al. tuned their hyperparameters on a hold-out set and the Fenchel paper reused them
for its non-batched model: ``lam = 0.1``, ``rho = (1e-2, 10)`` are the defaults (at any depth,
``rho = None``: 1e-2 on every hidden layer's weights, 10 on the output layer's). (The original
X-step is an exact NNLS; ours is exact in the limit of ``x_steps``: the tests check it against
``scipy.optimize.nnls``.)
"""

from collections.abc import Sequence

from array_api_compat import array_namespace

from ...arrays import Array
from ...network import LiftedNetwork, augment
from ...validation import COUNT, WEIGHT, PerLayer
from .common import LiftedMethod, register, ridge, sqnorm


@register
class Askari(LiftedMethod):
    name = "askari"
    defaults = dict(lam=0.1, rho=None, x_steps=50)
    constraints = dict(lam=WEIGHT, rho=[PerLayer(WEIGHT), None], x_steps=COUNT)
    #: ``rho = None``: the hidden layers' and the output layer's weight penalties
    rho_hidden, rho_output = 1e-2, 10.0
    # the hyperparameters (set from ``defaults`` and the arguments by ``LiftedMethod``)
    lam: float
    rho: float | list[float] | tuple[float, ...] | None
    x_steps: int

    def start(self, net: LiftedNetwork, X: Array, Y: Array) -> None:
        self.xp = array_namespace(X)
        self.Y = Y
        rho: Sequence[float]
        if self.rho is None:
            rho = [self.rho_hidden] * (len(net.W) - 1) + [self.rho_output]
        else:
            rho = self.rho if isinstance(self.rho, (list, tuple)) else [self.rho] * len(net.W)
        if len(rho) != len(net.W):
            raise ValueError(
                f"rho must be a number or one per layer ({len(net.W)}), got {self.rho!r}"
            )
        self.rho_l = [float(r) for r in rho]
        self.W = list(net.W)
        self.X = [X, *net.forward(X)[0]]

    def target(self, l: int) -> tuple[Array, float]:
        """(T, c): what W_l X~_l is fitted to, with its weight (Y and 1 at the output)."""
        return (self.Y, 1.0) if l == len(self.W) - 1 else (self.X[l + 1], self.lam)

    def x_step(self, l: int, steps: int | None = None) -> Array:
        """X_l (l >= 1) by ``steps`` FISTA steps on its NNLS problem, from the current X_l."""
        xp = self.xp
        M = self.W[l - 1] @ augment(self.X[l - 1])
        T, c = self.target(l)
        A, a = self.W[l][:, :-1], self.W[l][:, -1:]
        lip = 2 * self.lam + 2 * c * float(xp.linalg.matrix_norm(A, ord=2)) ** 2
        Z = P = self.X[l]
        t = 1.0
        for _ in range(self.x_steps if steps is None else steps):
            grad = 2 * self.lam * (P - M) + 2 * c * (A.T @ (A @ P + a - T))
            Z_new = xp.clip(P - grad / lip, min=0.0)
            t_new = (1 + (1 + 4 * t * t) ** 0.5) / 2
            P = Z_new + ((t - 1) / t_new) * (Z_new - Z)
            Z, t = Z_new, t_new
        return Z

    def w_step(self, l: int) -> Array:
        T, c = self.target(l)
        return ridge(T, augment(self.X[l]), self.rho_l[l] / c)

    def step(self) -> None:
        for l in range(len(self.W) - 1, 0, -1):
            self.X[l] = self.x_step(l)
        for l in range(len(self.W)):
            self.W[l] = self.w_step(l)

    def objective(self) -> float:
        f = sum(r * sqnorm(W) for r, W in zip(self.rho_l, self.W))
        for l in range(len(self.W)):
            T, c = self.target(l)
            f += c * sqnorm(T - self.W[l] @ augment(self.X[l]))
        return f

    def weights(self) -> list[Array]:
        return list(self.W)
