"""LiftedNetwork: a dense feed-forward network and its two objectives.

Notation of the paper (columns are data points). Layer ``l = 0..L`` has weights
``W[l]`` of shape ``(p_{l+1}, p_l + 1)`` whose last column is the bias, acting on
``X~_l = [X_l; 1^T]``. Pre-activations ``U_l = W_l X~_l``; ``X_{l+1} = phi_l(U_l)`` for ``l < L``;
output ``Yhat = W_L X~_L``.

- network objective   J(W)    = L(Y, W_L X~_L^ff) + sum_l rho_l ||W_l||_F^2           (eq. (1))
- lifted objective    F(W, X) = L(Y, W_L X~_L) + sum_l rho_l ||W_l||_F^2
                                + sum_{l<L} lam_l B_l(X_{l+1}, W_l X~_l)               (eq. (5))

In the API, ``Xs`` is the list of the lifted variables ``[X_1, ..., X_L]`` (``X_0`` is data);
inside, ``X = [X0, *Xs]`` so that ``X[l]`` is the paper's ``X_l``. At the feed-forward point
every B_l is 0 and F = J.
"""
import math
import numbers

import numpy as np
from array_api_compat import array_namespace

from .activations import activation as _activation
from .losses import loss as _loss


def augment(X):
    """X~ = [X; 1^T]: append a row of ones (the bias input)."""
    xp = array_namespace(X)
    return xp.concat([X, xp.ones((1, X.shape[1]), dtype=X.dtype)], axis=0)


def _per_layer(value, n, name, positive=False):
    """A scalar or a length-n sequence of nonnegative (positive) finite numbers -> n floats."""
    vals = [value] * n if isinstance(value, numbers.Real) else list(value)
    if len(vals) != n:
        raise ValueError(f"{name} must be a number or a sequence of {n} numbers, got {value!r}")
    for v in vals:
        if not isinstance(v, numbers.Real) or not math.isfinite(v) or v < 0 or (positive and v == 0):
            raise ValueError(f"{name} must be {'>' if positive else '>='} 0 and finite, got {v!r}")
    return [float(v) for v in vals]


def check_data(name, A, rows=None, cols=None):
    """Validate a finite 2-D data matrix; return it as a float array."""
    if isinstance(A, (list, tuple)) or (isinstance(A, np.ndarray) and A.dtype.kind in "biu"):
        A = np.asarray(A, dtype=float)  # integer pixels become float64; float32 stays float32
    if A.ndim != 2:
        raise ValueError(f"{name} must be a 2-D array (features x data points), got shape {A.shape}")
    if rows is not None and A.shape[0] != rows:
        raise ValueError(f"{name} must have {rows} rows, got shape {A.shape}")
    if cols is not None and A.shape[1] != cols:
        raise ValueError(f"{name} must have {cols} columns (data points), got shape {A.shape}")
    if A.shape[1] == 0:
        raise ValueError(f"{name} must hold at least one data point, got shape {A.shape}")
    xp = array_namespace(A)
    if not bool(xp.all(xp.isfinite(A))):
        raise ValueError(f"{name} must be finite, got NaN or inf entries")
    return A


class LiftedNetwork:
    """A dense network ``layer_sizes = (p_0, ..., p_{L+1})`` with its lifted relaxation.

    Parameters
    ----------
    layer_sizes : sequence of int, at least (input, output).
    activation : name, ``Activation`` or a sequence of L of them (one per hidden layer).
    loss : ``"mse"`` or ``"cross_entropy"``.
    lam : lambda_l > 0 weighting B_l; a number or one per hidden layer (Appendix A: a single
        lambda loses no generality for ReLU).
    rho : rho_l >= 0, the Frobenius penalty of W_l; a number or one per layer (L + 1).
    seed : seed of the Xavier-uniform initialisation (biases start at 0).
    dtype : NumPy dtype of the weights.
    """

    def __init__(self, layer_sizes, activation="relu", loss="mse", lam=1.0, rho=0.0, seed=0,
                 dtype=np.float64):
        sizes = list(layer_sizes)
        if len(sizes) < 2 or not all(isinstance(p, numbers.Integral) and p > 0 for p in sizes):
            raise ValueError(f"layer_sizes must be >= 2 positive integers, got {layer_sizes!r}")
        self.layer_sizes = tuple(int(p) for p in sizes)
        L = self.n_hidden
        acts = activation if isinstance(activation, (list, tuple)) else [activation] * L
        if len(acts) != L:
            raise ValueError(f"activation must be one or a sequence of {L}, got {activation!r}")
        self.activations = [_activation(a) for a in acts]
        self.loss = _loss(loss)
        self.lam = _per_layer(lam, L, "lam", positive=True)
        self.rho = _per_layer(rho, L + 1, "rho")
        self.seed = seed
        rng = np.random.default_rng(seed)
        self.W = []
        for p_in, p_out in zip(self.layer_sizes[:-1], self.layer_sizes[1:]):
            a = math.sqrt(6.0 / (p_in + p_out))
            Wl = np.zeros((p_out, p_in + 1), dtype=dtype)
            Wl[:, :p_in] = rng.uniform(-a, a, size=(p_out, p_in))
            self.W.append(Wl)

    @property
    def n_hidden(self):
        """L: the number of activation layers (lifted variables X_1..X_L)."""
        return len(self.layer_sizes) - 2

    def __repr__(self):
        sizes = "-".join(map(str, self.layer_sizes))
        return (f"LiftedNetwork({sizes}, activation={[a.name for a in self.activations]}, "
                f"loss={self.loss.name!r}, lam={self.lam}, rho={self.rho})")

    # --- validation -------------------------------------------------------------------------
    def check_inputs(self, X0, Y=None):
        X0 = check_data("X0", X0, rows=self.layer_sizes[0])
        if Y is not None:
            Y = check_data("Y", Y, rows=self.layer_sizes[-1], cols=X0.shape[1])
        return X0, Y

    def check_lifted(self, X0, Xs):
        if len(Xs) != self.n_hidden:
            raise ValueError(f"Xs must hold {self.n_hidden} matrices X_1..X_L, got {len(Xs)}")
        return [check_data(f"Xs[{l}] (X_{l + 1})", Xl, rows=self.layer_sizes[l + 1],
                           cols=X0.shape[1]) for l, Xl in enumerate(Xs)]

    # --- the map ----------------------------------------------------------------------------
    def pre_activation(self, l, Xl):
        """U_l = W_l [X_l; 1]."""
        return self.W[l] @ augment(Xl)

    def forward(self, X0):
        """Feed-forward pass: returns ``(Xs, Yhat)`` with ``Xs = [X_1, ..., X_L]``."""
        Xs, Xl = [], X0
        for l, act in enumerate(self.activations):
            Xl = act.phi(self.pre_activation(l, Xl))
            Xs.append(Xl)
        return Xs, self.pre_activation(self.n_hidden, Xl)

    def predict(self, X0):
        """The network output Yhat = W_L X~_L^ff (logits for cross-entropy)."""
        X0, _ = self.check_inputs(X0)
        return self.forward(X0)[1]

    # --- objectives -------------------------------------------------------------------------
    def penalty(self):
        """sum_l rho_l ||W_l||_F^2."""
        return float(sum(r * float(array_namespace(Wl).sum(Wl * Wl)) for r, Wl in zip(self.rho, self.W)))

    def divergences(self, X0, Xs):
        """[sum B_l(X_{l+1}, W_l X~_l) for l < L] (unweighted; +inf off an activation's range)."""
        X = [X0, *Xs]
        xp = array_namespace(X0)
        return [float(xp.sum(act.divergence(X[l + 1], self.pre_activation(l, X[l]))))
                for l, act in enumerate(self.activations)]

    def network_objective(self, X0, Y):
        """J(W) = L(Y, Yhat^ff) + sum_l rho_l ||W_l||_F^2."""
        X0, Y = self.check_inputs(X0, Y)
        return float(self.loss.value(Y, self.forward(X0)[1])) + self.penalty()

    def lifted_objective(self, X0, Y, Xs):
        """F(W, X) = L(Y, W_L X~_L) + sum_l rho_l ||W_l||_F^2 + sum_{l<L} lam_l B_l."""
        X0, Y = self.check_inputs(X0, Y)
        Xs = self.check_lifted(X0, Xs)
        out = self.pre_activation(self.n_hidden, Xs[-1] if Xs else X0)
        B = self.divergences(X0, Xs)
        return float(self.loss.value(Y, out)) + self.penalty() + sum(
            lam * b for lam, b in zip(self.lam, B))
