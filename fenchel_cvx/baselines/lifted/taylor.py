"""Taylor et al. 2016, "Training neural networks without gradients: a scalable ADMM approach".

Variables: weights ``W_l`` (no biases), pre-activations ``z_l = W_{l-1} a_{l-1}`` and
activations ``a_l = h(z_l)`` (``a_0`` the data, ``h`` = ReLU), output ``z_{L+1} = W_L a_L`` with a
Lagrange multiplier ``lam_mult`` on that output constraint only. The augmented Lagrangian
(MSE, the scale of the released code that the FLN paper cites):

    1/2 ||z_{L+1} - Y||^2 + <lam_mult, z_{L+1} - W_L a_L> + beta/2 ||z_{L+1} - W_L a_L||^2
      + sum_{l=1..L} gamma/2 ||a_l - h(z_l)||^2 + beta/2 ||z_l - W_{l-1} a_{l-1}||^2

One iteration, layer by layer from the input, every step in closed form (Taylor et al.'s Sec. 4):

    W_{l-1} <- z_l a_{l-1}^+                                   (least squares, ``ridge``)
    a_l     <- (beta W_l^T W_l + gamma I)^{-1} (beta W_l^T z_{l+1} + gamma h(z_l))
    z_l     <- argmin_z gamma (a_l - h(z))^2 + beta (z - W_{l-1} a_{l-1})^2   (``relu_prox``)
    W_L     <- z_{L+1} a_L^+
    z_{L+1} <- (Y - lam_mult + beta W_L a_L) / (1 + beta)
    lam_mult <- beta (z_{L+1} - W_L a_L)          (after ``warm`` warm-start iterations)

Defaults from that code's MATLAB main script: ``beta = gamma = 5``, 5 warm-start iterations
without multiplier updates. Where paper and code differ we follow the code: the multiplier is
*replaced* by ``beta (z - W a)`` (the paper adds it: ``lam += beta (z - W a)``); MSE instead of
the paper's binary hinge loss; no biases (the bias column stays 0). Unlike the code we start
from the common Xavier weights with ``z, a`` at their feed-forward values and
``lam_mult = 0`` (the code: zero weights, random ``z, a``, ``lam_mult = 1``).
"""

import numbers

from array_api_compat import array_namespace, device

from ...arrays import Array
from ...network import LiftedNetwork
from ...validation import WEIGHT, Interval
from .common import LiftedMethod, register, relu_prox, ridge, sqnorm


def relu(A: Array) -> Array:
    return array_namespace(A).clip(A, min=0.0)


@register
class Taylor(LiftedMethod):
    name = "taylor"
    defaults = dict(beta=5.0, gamma=5.0, warm=5)
    constraints = dict(beta=WEIGHT, gamma=WEIGHT, warm=Interval(numbers.Integral, 0, None))
    # the hyperparameters (set from ``defaults`` and the arguments by ``LiftedMethod``)
    beta: float
    gamma: float
    warm: int

    def start(self, net: LiftedNetwork, X: Array, Y: Array) -> None:
        self.xp = array_namespace(X)
        self.Y = Y
        self.W = [W[:, :-1] for W in net.W]  # no biases (the authors' code)
        self.a, self.z = [X], []
        for l, W in enumerate(self.W):
            self.z.append(W @ self.a[-1])
            if l < len(self.W) - 1:
                self.a.append(relu(self.z[-1]))
        self.lam_mult = self.xp.zeros_like(self.z[-1])
        self.k = 0

    # the closed-form steps (each the exact minimiser of its block of the Lagrangian)
    def w_step(self, l: int) -> Array:
        return ridge(self.z[l], self.a[l])

    def a_step(self, l: int) -> Array:
        """a_l (``self.a[l]``, l >= 1): beta/2 ||z_{l+1} - W_l a||^2 + gamma/2 ||a - h(z_l)||^2."""
        xp, W = self.xp, self.W[l]
        G = self.beta * (W.T @ W) + self.gamma * xp.eye(W.shape[1], dtype=W.dtype, device=device(W))
        return xp.linalg.solve(G, self.beta * (W.T @ self.z[l]) + self.gamma * relu(self.z[l - 1]))

    def z_step(self, l: int) -> Array:
        """Hidden z (``self.z[l]``, l < L): gamma (a - h(z))^2 + beta (z - W a_prev)^2."""
        return relu_prox(self.a[l + 1], self.W[l] @ self.a[l], self.beta / self.gamma)

    def z_last_step(self) -> Array:
        m = self.W[-1] @ self.a[-1]
        return (self.Y - self.lam_mult + self.beta * m) / (1 + self.beta)

    def step(self) -> None:
        L = len(self.W) - 1
        for l in range(L):
            self.W[l] = self.w_step(l)
            self.a[l + 1] = self.a_step(l + 1)
            self.z[l] = self.z_step(l)
        self.W[L] = self.w_step(L)
        self.z[L] = self.z_last_step()
        self.k += 1
        if self.k > self.warm:
            self.lam_mult = self.beta * (self.z[L] - self.W[L] @ self.a[L])

    def objective(self) -> float:
        L = len(self.W) - 1
        r = self.z[L] - self.W[L] @ self.a[L]
        f = (
            0.5 * sqnorm(self.z[L] - self.Y)
            + float(self.xp.sum(self.lam_mult * r))
            + self.beta / 2 * sqnorm(r)
        )
        for l in range(L):
            f += self.gamma / 2 * sqnorm(self.a[l + 1] - relu(self.z[l])) + self.beta / 2 * sqnorm(
                self.z[l] - self.W[l] @ self.a[l]
            )
        return f

    def weights(self) -> list[Array]:
        xp = self.xp
        return [
            xp.concat([W, xp.zeros((W.shape[0], 1), dtype=W.dtype, device=device(W))], axis=1)
            for W in self.W
        ]
