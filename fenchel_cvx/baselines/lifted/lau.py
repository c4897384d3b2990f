"""Lau et al. 2018 / Zeng et al. 2019, "A proximal block coordinate descent algorithm for deep
neural network training" (the three-splitting BCD, ``V_l = sigma(U_l)``,
``U_l = W_{l-1} V_{l-1} + b``).

Objective (``V_0`` the data, ``sigma`` = ReLU on the hidden layers, identity on the output)

    1/2 ||V_{L+1} - Y||^2 + sum_{l=1..L+1} gamma/2 ||V_l - sigma(U_l)||^2
                          + rho/2 ||U_l - W_{l-1} V_{l-1} - b_{l-1}||^2

One iteration, from the output back to the input, as in the authors' released MATLAB code
for the MNIST MLP; ``alpha`` marks a proximal term ``alpha/2 ||. - previous||^2``:

    V_{L+1} <- (Y + gamma U_{L+1} + alpha V_{L+1}) / (1 + gamma + alpha)            (alpha)
    U_{L+1} <- (gamma V_{L+1} + rho (W_L V_L + b_L)) / (gamma + rho)                (no prox)
    W_l     <- (alpha W_l + rho (U_{l+1} - b_l) V_l^T)(alpha I + rho V_l V_l^T)^{-1} (alpha)
    b_l     <- (alpha b_l + rho sum_cols(U_{l+1} - W_l^old V_l)) / (rho N + alpha)  (alpha)
    V_l     <- (rho W_l^T W_l + gamma I)^{-1} (rho W_l^T (U_{l+1} - b_l) + gamma sigma(U_l))
                                                                                    (no prox)
    U_l     <- argmin_u gamma/2 (V_l - relu(u))^2 + rho/2 (u - W_{l-1}V_{l-1} - b_{l-1})^2
                        + alpha/2 (u - U_l)^2                                       (``relu_prox``)

Defaults from that code: ``gamma = rho = 1``, ``alpha = 1e-2``. Paper/code differences, code
followed: the U_{L+1} and V_l steps have no proximal term (the paper's Algorithm has one on every
block); ``b_l`` is updated with the *previous* ``W_l`` (a Jacobi step, not the joint (W, b)
minimiser). Unlike the code (``W = 0.01 randn``, ``b = 0.1``) we start from the common Xavier
weights and zero biases; U and V start at the feed-forward values, as in the code.
"""

from array_api_compat import array_namespace, device

from ...arrays import Array
from ...network import LiftedNetwork
from ...validation import WEIGHT
from .common import LiftedMethod, register, relu_prox, ridge, sqnorm


@register
class Lau(LiftedMethod):
    name = "lau"
    defaults = dict(gamma=1.0, rho=1.0, alpha=1e-2)
    constraints = dict(gamma=WEIGHT, rho=WEIGHT, alpha=WEIGHT)
    # the hyperparameters (set from ``defaults`` and the arguments by ``LiftedMethod``)
    gamma: float
    rho: float
    alpha: float

    def start(self, net: LiftedNetwork, X: Array, Y: Array) -> None:
        xp = self.xp = array_namespace(X)
        self.Y = Y
        self.W = [W[:, :-1] for W in net.W]
        self.b = [W[:, -1:] for W in net.W]
        self.V: list[Array] = [X]
        self.U: list[Array] = [None]  # U_0 is not a variable
        for l, (W, b) in enumerate(zip(self.W, self.b)):
            self.U.append(W @ self.V[-1] + b)
            self.V.append(xp.clip(self.U[-1], min=0.0) if l < len(self.W) - 1 else self.U[-1])

    def sigma(self, l: int) -> Array:
        """sigma(U_l): ReLU on the hidden layers, identity on the output."""
        return self.U[l] if l == len(self.W) else self.xp.clip(self.U[l], min=0.0)

    def affine(self, l: int) -> Array:
        """W_{l-1} V_{l-1} + b_{l-1}: what U_l is tied to."""
        return self.W[l - 1] @ self.V[l - 1] + self.b[l - 1]

    # the closed-form steps (each the exact minimiser of its (proximal) subproblem)
    def v_last_step(self) -> Array:
        a, g = self.alpha, self.gamma
        return (self.Y + g * self.U[-1] + a * self.V[-1]) / (1 + g + a)

    def u_last_step(self) -> Array:
        return (self.gamma * self.V[-1] + self.rho * self.affine(len(self.W))) / (
            self.gamma + self.rho
        )

    def wb_step(self, l: int) -> tuple[Array, Array]:
        """(W_l, b_l) from U_{l+1}, V_l; both against the previous (W_l, b_l) (the code's Jacobi
        step)."""
        xp, W, b = self.xp, self.W[l], self.b[l]
        T, V = self.U[l + 1], self.V[l]
        W_new = ridge(T - b, V, self.alpha / self.rho, W0=W)
        b_new = (self.alpha * b + self.rho * xp.sum(T - W @ V, axis=1, keepdims=True)) / (
            self.rho * V.shape[1] + self.alpha
        )
        return W_new, b_new

    def v_step(self, l: int) -> Array:
        """Hidden V_l, l >= 1: gamma/2 ||V - sigma(U_l)||^2 + rho/2 ||U_{l+1} - W_l V - b_l||^2."""
        xp, W = self.xp, self.W[l]
        G = self.rho * (W.T @ W) + self.gamma * xp.eye(W.shape[1], dtype=W.dtype, device=device(W))
        return xp.linalg.solve(
            G, self.rho * (W.T @ (self.U[l + 1] - self.b[l])) + self.gamma * self.sigma(l)
        )

    def u_step(self, l: int) -> Array:
        """Hidden U_l: the relu prox of V_l at the weighted mean of W V + b and the old U_l."""
        r, a = self.rho, self.alpha
        m = (r * self.affine(l) + a * self.U[l]) / (r + a)
        return relu_prox(self.V[l], m, (r + a) / self.gamma)

    def step(self) -> None:
        L = len(self.W) - 1
        self.V[L + 1] = self.v_last_step()
        self.U[L + 1] = self.u_last_step()
        self.W[L], self.b[L] = self.wb_step(L)
        for l in range(L, 0, -1):
            self.V[l] = self.v_step(l)
            self.U[l] = self.u_step(l)
            self.W[l - 1], self.b[l - 1] = self.wb_step(l - 1)

    def objective(self) -> float:
        f = 0.5 * sqnorm(self.V[-1] - self.Y)
        for l in range(1, len(self.W) + 1):
            f += self.gamma / 2 * sqnorm(self.V[l] - self.sigma(l)) + self.rho / 2 * sqnorm(
                self.U[l] - self.affine(l)
            )
        return f

    def weights(self) -> list[Array]:
        return [self.xp.concat([W, b], axis=1) for W, b in zip(self.W, self.b)]
