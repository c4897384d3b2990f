"""LiftedNetwork: a feed-forward network as a sequence of linear maps, and its two objectives.

Notation of the paper (columns are data points). Layer ``l = 0..L`` has weights ``W[l]`` whose
last column is the bias, and a linear map ``net.layers[l]`` (``layers.py``): dense,
``U_l = W_l [X_l; 1^T]`` with ``W_l`` of shape ``(p_{l+1}, p_l + 1)``, or a 2-D convolution of the
(pooled) image ``X_l``, ``U_l = conv(W_l, pool(X_l)) + b_l``. Pre-activations ``U_l``;
``X_{l+1} = phi_l(U_l)`` for ``l < L``; output ``Yhat = U_L``.

- network objective   J(W)    = L(Y, U_L^ff) + sum_l rho_l ||W_l||_F^2                 (eq. (3))
- lifted objective    F(W, X) = L(Y, U_L) + sum_l rho_l ||W_l||_F^2
                                + sum_{l<L} lam_l B_l(X_{l+1}, U_l(W_l, X_l))          (eq. (7))

In the API, ``Xs`` is the list of the lifted variables ``[X_1, ..., X_L]`` (``X_0`` is data), each
2-D (features x m; an image's features in (C, H, W) order); inside, ``X = [X0, *Xs]`` so that
``X[l]`` is the paper's ``X_l``. At the feed-forward point every B_l is 0 and F = J.
``LiftedNetwork(layer_sizes)`` builds a dense network, ``LiftedNetwork.from_layers(input_shape,
specs)`` any sequence of layer specs, and ``lenet5`` the paper's LeNet-5.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
from array_api_compat import array_namespace, device, to_device
from numpy.typing import DTypeLike

from . import defaults
from .activations import Activation
from .activations import activation as _activation
from .arrays import Array, by_points, namespace
from .io import load_network, save_network
from .layers import AvgPool2d, Conv2d, Dense, Flatten, Spec, build_maps
from .losses import Loss
from .losses import loss as _loss
from .reduce import LOCAL, Comm
from .validation import (
    COUNT,
    LAM,
    RHO,
    SEED,
    PerLayer,
    Sizes,
    check,
    check_dtype,
    check_matrix,
    check_memory,
    validate,
)


def augment(X: Array) -> Array:
    """X~ = [X; 1^T]: append a row of ones (the bias input)."""
    xp = array_namespace(X)
    return xp.concat([X, xp.ones((1, X.shape[1]), dtype=X.dtype, device=device(X))], axis=0)


class LiftedNetwork:
    """A network of linear maps (dense: ``layer_sizes = (p_0, ..., p_{L+1})``) and its relaxation.

    Parameters
    ----------
    layer_sizes : sequence of int, at least (input, output): a dense network. (Any other
        architecture: ``LiftedNetwork.from_layers(input_shape, specs, ...)``.)
    activation : name, ``Activation`` or a sequence of L of them (one per hidden layer).
    loss : ``"mse"`` or ``"cross_entropy"``.
    lam : lambda_l > 0 weighting B_l; a number or one per hidden layer (Appendix A: a single
        lambda loses no generality for ReLU). Default ``defaults.LAM`` (1).
    rho : rho_l >= 0, the Frobenius penalty of W_l; a number or one per layer (L + 1). Default
        ``defaults.RHO`` (1e-3).
    seed : an integer >= 0, the seed of the Xavier-uniform initialisation (biases start at 0).
    dtype : NumPy dtype (or its name) of the weights: float32 or float64.

    Every argument is checked (``validation.py``) before the weights are drawn.

    Examples
    --------
    A 3-4-2 network, its feed-forward pass on 4 data points (columns), and its two objectives:
    at the feed-forward point every divergence B_l is 0, so F(W, X) equals J(W).

    >>> import numpy as np
    >>> net = LiftedNetwork([3, 4, 2], activation="relu", loss="mse", seed=0)
    >>> net
    LiftedNetwork(3-4-2, activation=['relu'], loss='mse', lam=[1.0], rho=[0.001, 0.001])
    >>> [W.shape for W in net.W]            # W_l is (p_{l+1}, p_l + 1): the bias last
    [(4, 4), (2, 5)]
    >>> X0, Y = np.arange(12.0).reshape(3, 4) / 10, np.ones((2, 4))
    >>> Xs, Yhat = net.forward(X0)
    >>> print(Yhat.round(3))
    [[-0.679 -0.689 -0.698 -0.708]
     [-0.024 -0.048 -0.073 -0.097]]
    >>> round(net.network_objective(X0, Y), 4), round(net.lifted_objective(X0, Y, Xs), 4)
    (15.9821, 15.9821)
    >>> net.divergences(X0, [X + 1.0 for X in Xs])[0] > 0   # X_1 off phi(W_0 X~_0)
    True
    """

    def __init__(
        self,
        layer_sizes: Sequence[int],
        activation: str | Activation | Sequence[str | Activation] = "relu",
        loss: str | Loss = "mse",
        lam: float | Sequence[float] = defaults.LAM,
        rho: float | Sequence[float] = defaults.RHO,
        seed: int = 0,
        dtype: DTypeLike = np.float64,
    ) -> None:
        sizes = check("layer_sizes", layer_sizes, Sizes(2))
        self._build(
            (sizes[0],),
            [Dense(p) for p in sizes[1:]],
            activation,
            loss,
            lam,
            rho,
            seed,
            dtype,
            name="layer_sizes",
        )

    @classmethod
    def from_layers(
        cls,
        input_shape: Sequence[int],
        layers: Sequence[Spec | dict[str, Any]],
        activation: str | Activation | Sequence[str | Activation] = "relu",
        loss: str | Loss = "mse",
        lam: float | Sequence[float] = defaults.LAM,
        rho: float | Sequence[float] = defaults.RHO,
        seed: int = 0,
        dtype: DTypeLike = np.float64,
    ) -> LiftedNetwork:
        """A network from layer specs (``layers.py``): ``Dense``, ``Conv2d``, ``AvgPool2d``,
        ``Flatten`` or their dicts, on inputs of ``input_shape`` ((features,) or (C, H, W)).

        >>> from fenchel_cvx.layers import AvgPool2d, Conv2d, Dense, Flatten
        >>> net = LiftedNetwork.from_layers((1, 6, 6), [Conv2d(2, 3), AvgPool2d(2), Flatten(),
        ...                                             Dense(3)], loss="cross_entropy")
        >>> net.layer_sizes, [W.shape for W in net.W]   # (2, 4, 4) = 32 hidden units
        ((36, 32, 3), [(2, 10), (3, 9)])
        >>> import numpy as np
        >>> net.predict(np.ones((36, 5))).shape          # a flattened image per column
        (3, 5)
        """
        net = cls.__new__(cls)
        net._build(input_shape, layers, activation, loss, lam, rho, seed, dtype)
        return net

    def _build(self, input_shape, specs, activation, loss, lam, rho, seed, dtype, name="layers"):
        dtype, seed = check_dtype(dtype), check("seed", seed, SEED)
        self.layers = build_maps(input_shape, list(specs))
        check_memory(
            name,
            sum(math.prod(m.weight_shape) for m in self.layers) * dtype.itemsize,
            f"the {dtype.name} weights",
        )
        self.specs = [s for m in self.layers for s in m.specs]
        self.input_shape = self.layers[0].in_shape
        self.layer_sizes = (self.layers[0].n_in, *(m.n_out for m in self.layers))
        L = self.n_hidden
        acts = activation if isinstance(activation, (list, tuple)) else [activation] * L
        if len(acts) != L:
            raise ValueError(f"activation must be one or a sequence of {L}, got {activation!r}")
        self.activations = [_activation(a) for a in acts]
        self.loss = _loss(loss)
        hyper = validate(
            dict(lam=PerLayer(LAM, L), rho=PerLayer(RHO, L + 1)), dict(lam=lam, rho=rho)
        )
        self.lam, self.rho = hyper["lam"], hyper["rho"]
        self.seed = seed
        rng = np.random.default_rng(seed)
        self.W = [m.init(rng, dtype) for m in self.layers]

    def get_config(self) -> dict[str, Any]:
        """The architecture and hyperparameters as a JSON-ready dict (``from_config`` inverts it).

        >>> net = LiftedNetwork([3, 4, 2], activation="tanh", lam=0.5, seed=1)
        >>> config = net.get_config()
        >>> config["activations"], config["lam"], config["rho"]
        ([{'name': 'tanh'}], [0.5], [0.001, 0.001])
        >>> again = LiftedNetwork.from_config(config)      # the same seed: the same weights
        >>> again.get_config() == config, all((a == b).all() for a, b in zip(again.W, net.W))
        (True, True)
        """
        return {
            "input_shape": list(self.input_shape),
            "layers": [s.to_dict() for s in self.specs],
            "activations": [_recordable(a, "activation") for a in self.activations],
            "loss": _recordable(self.loss, "loss"),
            "lam": list(self.lam),
            "rho": list(self.rho),
            "seed": self.seed,
            "dtype": check_dtype(self.W[0].dtype).name,  # any library's float dtype
        }

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> LiftedNetwork:
        """A freshly initialised network with the architecture of ``config`` (``get_config``)."""
        acts = [
            _activation(a["name"], **{k: v for k, v in a.items() if k != "name"})
            for a in config["activations"]
        ]
        return cls.from_layers(
            config["input_shape"],
            config["layers"],
            activation=acts,
            loss=_loss_of(config["loss"]),
            lam=config["lam"],
            rho=config["rho"],
            seed=config["seed"],
            dtype=config["dtype"],
        )

    @property
    def n_hidden(self) -> int:
        """L: the number of activation layers (lifted variables X_1..X_L)."""
        return len(self.layer_sizes) - 2

    def __repr__(self):
        sizes = "-".join(map(str, self.layer_sizes))
        lines = [
            f"LiftedNetwork({sizes}, activation={[a.name for a in self.activations]}, "
            f"loss={self.loss.name!r}, lam={self.lam}, rho={self.rho})"
        ]
        if len(self.input_shape) > 1:  # an image network: one line per map, with its shapes
            acts = [a.name for a in self.activations] + ["output"]
            lines += [
                f"  W_{l}: {m.describe()}, {a}" for l, (m, a) in enumerate(zip(self.layers, acts))
            ]
        return "\n".join(lines)

    # --- persistence (``io.py``: one .npz of the weights and a JSON config, no pickle) -------
    def save(self, path: str | os.PathLike) -> Path:
        """Write the weights, architecture, activations, loss, hyperparameters and dtype
        (``io.save_network``)."""
        return save_network(self, path)

    @classmethod
    def load(cls, path: str | os.PathLike) -> LiftedNetwork:
        """The network written by :meth:`save` at ``path`` (``io.load_network``)."""
        return load_network(path, cls)

    # --- validation (``validation.check_matrix``) ---------------------------------------------
    def check_inputs(
        self,
        X0: Array,
        Y: Array | None = None,
        *,
        dtype: DTypeLike | None = None,
        xp: ModuleType | None = None,
        on: Array | None = None,
        names: tuple[str, str] = ("X0", "Y"),
    ) -> tuple[Array, Array | None]:
        """``(X0, Y)`` checked against the network's input and output sizes (``dtype``, ``xp``:
        the working dtype and array library, see ``validation.check_matrix``), both on the
        device of the array ``on``. ``xp`` None: the library and the device of the network's
        weights, so that a tensor meets NumPy weights as a NumPy array and NumPy data meets GPU
        weights on their GPU. ``on`` None, ``xp`` given: X0's own device (the targets follow the
        data)."""
        if xp is None:
            xp, on = namespace(self.W[0]), self.W[0] if on is None else on
        shape = self.input_shape
        what = (
            "the network's input size"
            if len(shape) == 1
            else f"an input of shape {tuple(shape)}, flattened"
        )
        X0 = check_matrix(
            names[0], X0, dtype=dtype, xp=xp, rows=self.layer_sizes[0], rows_what=what
        )
        if Y is not None:
            Y = check_matrix(
                names[1],
                Y,
                dtype=dtype,
                xp=xp,
                rows=self.layer_sizes[-1],
                cols=X0.shape[1],
                rows_what="the network's output size",
            )
        if xp is not np:  # a library alone makes arrays on its default device
            dev = device(X0 if on is None else on)
            X0 = to_device(X0, dev)
            Y = None if Y is None else to_device(Y, dev)
        return X0, Y

    def check_lifted(self, X0: Array, Xs: Sequence[Array]) -> list[Array]:
        if len(Xs) != self.n_hidden:
            raise ValueError(f"Xs must hold {self.n_hidden} matrices X_1..X_L, got {len(Xs)}")
        return [
            check_matrix(
                f"Xs[{l}] (X_{l + 1})",
                Xl,
                rows=self.layer_sizes[l + 1],
                cols=X0.shape[1],
                rows_what=f"the size of layer {l + 1}",
            )
            for l, Xl in enumerate(Xs)
        ]

    # --- the map ----------------------------------------------------------------------------
    def pre_activation(self, l: int, Xl: Array) -> Array:
        """U_l = A_l(W_l, X_l) + b_l (dense: W_l [X_l; 1])."""
        return self.layers[l].forward(self.W[l], Xl)

    def forward(self, X0: Array) -> tuple[list[Array], Array]:
        """Feed-forward pass: returns ``(Xs, Yhat)`` with ``Xs = [X_1, ..., X_L]``."""
        Xs, Us = self.feed_forward(X0)
        return Xs, Us[-1]

    def feed_forward(
        self,
        X0: Array,
        Xt0: Array | None = None,
        known: Sequence[Array] = (),
        threads: int = 1,
    ) -> tuple[list[Array], list[Array]]:
        """Feed-forward pass keeping the pre-activations: ``(Xs, Us)``, ``Us = [U_0, ..., U_L]``
        (``U_L = Yhat``); the BCD driver hands ``U_{l-1}`` to the X-block of ``X_l``. ``Xt0``:
        X0's patches ``layers[0].patches(X0)`` if at hand (W_0's block needs them too), from
        which U_0 = W_0 X~_0. ``known``: the pass's first pre-activations ``[U_0, ...]`` at
        these weights, where the caller formed them already (the checks of a round).
        ``threads``: each X_l = phi(U_{l-1}) formed by as many threads on chunks of the data
        points (``arrays.by_points``; NumPy)."""
        Xs, Us, Xl = [], [], X0
        for l in range(self.n_hidden + 1):
            if l < len(known):
                U = known[l]
            elif l == 0 and Xt0 is not None:
                U = self.layers[0].from_rows(self.W[0] @ Xt0, X0.shape[1])
            else:
                U = self.pre_activation(l, Xl)
            Us.append(U)
            if l < self.n_hidden:
                Xl = by_points(self.activations[l].phi, U, threads)
                Xs.append(Xl)
        return Xs, Us

    def predict(self, X0: Array) -> Array:
        """The network output Yhat = W_L X~_L^ff (logits for cross-entropy)."""
        X0, _ = self.check_inputs(X0)
        return self.forward(X0)[1]

    # --- objectives -------------------------------------------------------------------------
    def penalty(self) -> float:
        """sum_l rho_l ||W_l||_F^2."""
        return float(
            sum(r * float(array_namespace(Wl).sum(Wl * Wl)) for r, Wl in zip(self.rho, self.W))
        )

    def divergences(
        self,
        X0: Array,
        Xs: Sequence[Array],
        Us: Sequence[Array] | None = None,
        comm: Comm = LOCAL,
    ) -> list[float]:
        """[sum B_l(X_{l+1}, W_l X~_l) for l < L] (unweighted; +inf off an activation's range).
        ``Us``: the pre-activations ``W_l X~_l`` at these W and X, or the first of them, where
        they are at hand (the others are formed here). ``comm``: the ranks that hold shares of
        the data points (``reduce.py``): the sums over all of them, in one reduction."""
        X = [X0, *Xs]
        xp = array_namespace(X0)
        Us = list(Us or ())
        Us += [self.pre_activation(l, X[l]) for l in range(len(Us), self.n_hidden)]
        sums = [
            xp.sum(act.divergence(X[l + 1], U))
            for l, (act, U) in enumerate(zip(self.activations, Us))
        ]
        return [float(s) for s in (comm.reduce(sums, "sum") if sums else sums)]

    def network_objective(
        self,
        X0: Array,
        Y: Array,
        *,
        checked: bool = True,
        known: Sequence[Array] = (),
        comm: Comm = LOCAL,
    ) -> float:
        """J(W) = L(Y, Yhat^ff) + sum_l rho_l ||W_l||_F^2. ``checked=False``: X0 and Y were
        checked already (``fit_bcd`` checks its data once per run); ``known``: the feed-forward
        pass's first pre-activations at these weights, where at hand (``feed_forward``);
        ``comm``: the ranks that hold shares of the data points (the loss over all of them)."""
        if checked:
            X0, Y = self.check_inputs(X0, Y)
        Yhat = self.feed_forward(X0, known=known)[1][-1]
        (loss,) = comm.reduce([self.loss.value(Y, Yhat)], "sum")
        return float(loss) + self.penalty()

    def lifted_objective(
        self,
        X0: Array,
        Y: Array,
        Xs: Sequence[Array],
        *,
        checked: bool = True,
        B: Sequence[float] | None = None,
        comm: Comm = LOCAL,
    ) -> float:
        """F(W, X) = L(Y, W_L X~_L) + sum_l rho_l ||W_l||_F^2 + sum_{l<L} lam_l B_l.
        ``checked=False``: X0, Y and Xs were checked already (the BCD driver's own); ``B``: the
        ``divergences`` at these W and X (over every rank's points), where they are at hand;
        ``comm``: the ranks that hold shares of the data points."""
        if checked:
            X0, Y = self.check_inputs(X0, Y)
            Xs = self.check_lifted(X0, Xs)
        out = self.pre_activation(self.n_hidden, Xs[-1] if Xs else X0)
        B = self.divergences(X0, Xs, comm=comm) if B is None else B
        (loss,) = comm.reduce([self.loss.value(Y, out)], "sum")
        return float(loss) + self.penalty() + sum(lam * b for lam, b in zip(self.lam, B))


def _loss_of(config):
    """The loss of a config's ``"loss"``: ``{"name": ..., **params}`` (``Loss.config``), or the
    name alone (files written before losses took parameters)."""
    if isinstance(config, str):
        return _loss(config)
    return _loss(config["name"], **{k: v for k, v in config.items() if k != "name"})


def _recordable(named, what):
    """``named.config()`` (an activation's or a loss's), or a ValueError naming the first
    parameter that is no JSON data, which a saved network or a checkpoint cannot record (a
    ``monotone`` activation's function ``phi``)."""
    for key, value in named.params().items():
        try:
            json.dumps(value)
        except (TypeError, ValueError):
            raise ValueError(
                f"the {what} {named!r} cannot be saved or checkpointed: its parameter {key!r} "
                f"is a {type(value).__name__}, which a network's file cannot record"
            ) from None
    return named.config()


def lenet5(
    input_shape: Sequence[int] = (1, 28, 28), n_classes: int = 10, **kwargs: Any
) -> LiftedNetwork:
    """LeNet-5 as in the paper: conv 6@5x5, avg-pool 2, conv 16@5x5, avg-pool 2, fc 120, fc 84,
    fc ``n_classes``, ReLU. A 28 x 28 input is zero-padded to 32 x 32 by the first convolution
    (padding 2); a 32 x 32 input (CIFAR-10's (3, 32, 32)) is not. ``kwargs`` go to
    ``LiftedNetwork.from_layers`` (activation, loss, lam, rho, seed, dtype).

    >>> net = lenet5()
    >>> net.layer_sizes, net.n_hidden       # 6@28x28 -> 16@10x10 -> 120 -> 84 -> 10
    ((784, 4704, 1600, 120, 84, 10), 4)
    >>> [W.shape for W in net.W]            # conv W: (out channels, in channels x 5 x 5 + 1)
    [(6, 26), (16, 151), (120, 401), (84, 121), (10, 85)]
    >>> lenet5((3, 32, 32)).layer_sizes[:2]   # CIFAR-10: unpadded, 32 - 4 = 28 again
    (3072, 4704)
    """
    n_classes = check("n_classes", n_classes, COUNT)
    shape = tuple(input_shape)
    if len(shape) != 3 or shape[1:] not in ((28, 28), (32, 32)):
        raise ValueError(
            f"input_shape must be (channels, 28, 28) or (channels, 32, 32) for "
            f"LeNet-5, got {input_shape!r}"
        )
    pad = 2 if shape[1] == 28 else 0
    specs = [
        Conv2d(6, 5, padding=pad),
        AvgPool2d(2),
        Conv2d(16, 5),
        AvgPool2d(2),
        Flatten(),
        Dense(120),
        Dense(84),
        Dense(n_classes),
    ]
    return LiftedNetwork.from_layers(shape, specs, **kwargs)
