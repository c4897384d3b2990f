"""The package's default hyperparameters: the network's and the driver's, and the tuned
training settings that the estimators and the command line start from.

The lifted objective (eq. (7) of the paper; docs/mathematics.md)

    F(W, X) = L(Y, W_L X~_L) + sum_l rho_l ||W_l||^2 + sum_{l<L} lam_l B_l(X_{l+1}, W_l X~_l)

and, in the batched model (Algorithm 2), the proximal term ``gamma_l ||W_l - W0_l||^2`` of each
W-block. Losses and penalties are sums over the data points (of the batch, in Algorithm 2), so
these values are on the scale of a few hundred points per round.

Two kinds of default live here:

- **The network's and the driver's** (``LAM``, ``RHO``, ``GAMMA``, ``ITERATIONS``,
  ``ALTERNATIONS``, ``TOL``): ``LiftedNetwork(lam=LAM, rho=RHO)`` and ``fit_bcd(gamma=None)``
  (``gamma_for``). They keep every block well posed for any network, loss and algorithm
  (``rho > 0``: every W-block strictly convex, with or without a proximal term).
- **The training settings** (``training``): what the estimators ``FenchelClassifier`` /
  ``FenchelRegressor`` and the ``fenchel-cvx`` command train with unless told otherwise, per
  kind of network (``SETTINGS``: ``"dense"``, ``"lenet5"``) for Algorithm 2, and ``FULL_BATCH``
  for Algorithm 1. The batched ones are the benchmarks' tuned settings (docs/results.md),
  which ``benchmarks/mnist_mlp.py`` and ``benchmarks/mnist_lenet5.py`` read from here:

  - dense (784-300-10 on MNIST, cross-entropy, batch 500): the paper's lam 0.1 (0.2 here,
    ``paper_hyperparameters.from_reference``) and rho 0; gamma 1 for the hidden layers (the
    paper's) and 30 for the output layer (the paper's 100); 10 W-steps for the hidden layers (in
    the span of the batch, ``fast.span``) and one for the output layer; 20 FISTA X-steps;
    momentum (0.7, 0) across batches. Validation accuracy after 10 epochs, trained on the first
    50,000 training images and scored on the last 10,000 (docs/tuning.md): 0.9807 with these
    values; gamma (1, 100) 0.9791, (1, 10) 0.9782; W-steps (10, 3) 0.9772; 10 X-steps 0.9788,
    30 0.9802; momentum (0.5, 0) 0.9774, (0.8, 0) 0.9798. Test accuracy 0.9790 over 3 seeds
    (``LAM``, ``RHO`` and ``GAMMA`` below with one W-step and 10 X-steps: 0.9720 on one seed).
  - LeNet-5: the paper's appendix setting with gamma 0.3 for fc 120 and fc 84 (validation
    0.9797 against 0.9763), one FISTA step for the conv layers' X-blocks and 10 for the dense
    ones, the conv Grams reused for 40 batches, momentum (0.98, 0.98, 0.3, 0.3, 0), and a
    Frobenius penalty rho 0.3 on the output layer fc 10 alone (validation after 20 epochs
    0.9896 against 0.9863 without: its weights no longer grow once the training images are
    fit).

Change a value here and every consumer follows.
"""

from __future__ import annotations

from collections.abc import MutableMapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

#: lambda_l, the weight of the divergence B_l of every hidden layer (> 0)
LAM = 1.0
#: rho_l, the Frobenius penalty of every W_l (>= 0)
RHO = 1e-3
#: gamma_l of Algorithm 2's proximal term in ``fit_bcd(gamma=None)`` (> 0, as in the paper's
#: batched model: with gamma = 0 and a small batch the W-blocks lose strict convexity, and for
#: cross-entropy often their minimiser)
GAMMA = 3.0
#: gamma_l of Algorithm 1 (all the data in every round: no proximal term)
GAMMA_FULL_BATCH = 0.0
#: Algorithm 1's rounds on all the data
ITERATIONS = 10
#: Algorithm 2's rounds per batch (the paper's K)
ALTERNATIONS = 1
#: the certificate's tolerance (and that of a backend built by name): KKT residual of a block
TOL = 1e-6


def gamma_for(batch_size: int | None) -> float:
    """``fit_bcd``'s gamma where none is given: ``GAMMA`` for Algorithm 2 (an integer
    ``batch_size``), ``GAMMA_FULL_BATCH`` for Algorithm 1 (``batch_size=None``).

    >>> gamma_for(500), gamma_for(None)
    (3.0, 0.0)
    """
    return GAMMA_FULL_BATCH if batch_size is None else GAMMA


# --- training settings ------------------------------------------------------------------------
@dataclass(frozen=True)
class Setting:
    """The hyperparameters of a training run, one value per layer: ``lam`` per hidden layer (a
    number where there is none: no divergence uses it); ``rho``, ``gamma``, ``momentum`` and
    ``w_steps`` per layer, W_0 first; ``x_steps`` per hidden layer, X_1 first; ``gram_reuse``
    per layer. Steps None: every block solved to the tolerance; ``gram_reuse`` None: the
    backend's (a fresh Gram every solve)."""

    lam: tuple | float
    rho: tuple
    gamma: tuple
    momentum: tuple
    w_steps: tuple | None = None
    x_steps: tuple | None = None
    gram_reuse: tuple | None = None

    def fill(
        self, values: MutableMapping[str, Any], names: Sequence[str]
    ) -> MutableMapping[str, Any]:
        """Set every entry of the dict ``values`` named in ``names`` that is None to this
        setting's (a list per layer, as JSON keeps it); entries the setting leaves None stay
        None. -> ``values``.

        >>> values = {"lam": None, "rho": [0.5, 0.5]}  # rho given, lam left to the setting
        >>> training("dense", 1, batched=False).fill(values, ("lam", "rho", "gamma"))
        {'lam': [10.0], 'rho': [0.5, 0.5], 'gamma': [0.0, 0.0]}
        """
        for name in names:
            mine = getattr(self, name)
            if values.get(name) is None and mine is not None:
                values[name] = list(mine) if isinstance(mine, tuple) else mine
        return values


class Dense:
    """Algorithm 2 on a dense network of any depth: the hidden layers take the first value of a
    pair (lam and gamma scaled with depth: ``for_layers``), the output layer the second (the
    MNIST MLP benchmark's tuned setting)."""

    lam, rho = 0.2, 0.0
    gamma, momentum, w_steps = (1.0, 30.0), (0.7, 0.0), (10, 1)
    x_steps = 20
    #: lam and gamma grow by a ratio a hidden layer toward the output: (depth, ratio) pairs,
    #: each ratio from that many hidden layers on; equal values below the first (``for_layers``)
    ratios = ((4, 2.0), (9, 4.0))

    def ratio_of(self, n_hidden: int) -> float:
        """The ratio of a network of ``n_hidden`` hidden layers (``ratios``; 1 below them all)."""
        ratio = 1.0
        for depth, r in self.ratios:
            if n_hidden >= depth:
                ratio = r
        return ratio

    def for_layers(self, n_hidden: int, ratio: float | None = None) -> Setting:
        """The setting of ``n_hidden`` (L) hidden layers: hidden layer l (0, ..., L - 1) takes
        ``lam`` and the hidden layers' ``gamma`` times ``ratio^(l - (L - 1))``, the other values
        of the pairs as they are; ``ratio`` None: ``ratio_of(n_hidden)``. The last hidden layer
        takes the MNIST MLP's values, so one hidden layer is its tuned setting whatever the
        ratio.

        X_l's block weighs the divergence B_l above it against B_{l-1} by lam_l / lam_{l-1} =
        ``ratio``: with equal lam (``ratio=1``: every hidden layer repeats the first one's
        values) the loss's pull on X_l falls about 3.6-fold in B a layer toward the input at
        depth 8, and the first layers stay near their initial weights. gamma_l scales with
        lam_l, so each W-block (Hessian lam_l X~_l X~_l^T + gamma_l I) steps as far as in the
        MLP. Depth 8, width 300, ReLU, batch 500, validation accuracy after 3 epochs (50,000
        training images; docs/deep.md): ratio 2 0.9229, ratio 4 0.9240, ratio 1 0.9052 (lam
        alone x2 a layer, gamma equal: 0.8597); Adam 0.9688. Depths 9, 10, 11 and 12: ratio 4
        0.9170, 0.9104, 0.8999 and 0.8836, ratio 2 0.9065, 0.8841, 0.8590 and 0.8243. Depth 16:
        ratio 4 0.8028, ratio 2 and 8 far below (the best ratio grows with depth). Depth 4:
        ratio 2 0.9617, ratio 1 0.9614, ratio 4 0.9470; depth 2: 0.9689 and 0.9705, so
        shallower networks keep equal values.

        >>> deep = Dense().for_layers(4)  # depth 4: ratio 2
        >>> deep.lam, deep.gamma
        ((0.025, 0.05, 0.1, 0.2), (0.125, 0.25, 0.5, 1.0, 30.0))
        >>> Dense().for_layers(4, ratio=1.0).lam
        (0.2, 0.2, 0.2, 0.2)
        """
        if ratio is None:
            ratio = self.ratio_of(n_hidden)

        def pair(values: tuple[Any, Any]) -> tuple[Any, ...]:
            return (values[0],) * n_hidden + (values[1],)

        scale = [ratio ** (l - (n_hidden - 1)) for l in range(n_hidden)]
        return Setting(
            lam=tuple(self.lam * s for s in scale) if n_hidden else self.lam,
            rho=(self.rho,) * (n_hidden + 1),
            gamma=tuple(self.gamma[0] * s for s in scale) + (self.gamma[1],),
            momentum=pair(self.momentum),
            w_steps=pair(self.w_steps),
            x_steps=(self.x_steps,) * n_hidden if n_hidden else None,
        )


class LeNet5:
    """Algorithm 2 on LeNet-5 (conv, conv, fc 120, fc 84, fc 10: ``network.lenet5``), the LeNet-5
    benchmark's tuned setting; lam and the conv layers' gamma are the paper's appendix
    setting (``paper_hyperparameters.from_reference([5, 5, 1, 1], [1e-4, 1e-2, 1, 1, 1])``)."""

    n_hidden = 4
    setting = Setting(
        lam=(10.0, 10.0, 2.0, 2.0),
        rho=(0.0, 0.0, 0.0, 0.0, 0.3),
        gamma=(1e-4, 1e-2, 0.3, 0.3, 1.0),
        momentum=(0.98, 0.98, 0.3, 0.3, 0.0),
        w_steps=(1,) * 5,
        x_steps=(1, 1, 10, 10),
        gram_reuse=(40, 40, 1, 1, 1),
    )

    def for_layers(self, n_hidden: int) -> Setting:
        if n_hidden != self.n_hidden:
            raise ValueError(
                f"the lenet5 setting is for {self.n_hidden} hidden layers, got {n_hidden}"
            )
        return self.setting


class FullBatch:
    """Algorithm 1, all the data in every round: lam 10 and rho 1 (on the digits quick start,
    lam 1 and rho 1e-3 fell below logistic regression, 0.9489 against 0.9689; lam 10 and rho 1
    beat it, 0.9711), no proximal term, no momentum, every block solved to the tolerance."""

    lam, rho = 10.0, 1.0

    def for_layers(self, n_hidden: int) -> Setting:
        return Setting(
            lam=_per_hidden(self.lam, n_hidden),
            rho=(self.rho,) * (n_hidden + 1),
            gamma=(GAMMA_FULL_BATCH,) * (n_hidden + 1),
            momentum=(0.0,) * (n_hidden + 1),
        )


def _per_hidden(value: float, n_hidden: int) -> tuple[float, ...] | float:
    """One ``value`` per hidden layer; the number itself where there is none."""
    return (value,) * n_hidden if n_hidden else value


class Kind(Protocol):
    """A kind of network's training setting: ``for_layers(n_hidden)``, the :class:`Setting` of
    a network of that kind with ``n_hidden`` hidden layers."""

    def for_layers(self, n_hidden: int) -> Setting: ...


#: Algorithm 2's training setting of each kind of network, by name
SETTINGS: dict[str, Kind] = {"dense": Dense(), "lenet5": LeNet5()}
FULL_BATCH = FullBatch()


def training(network: str, n_hidden: int, batched: bool) -> Setting:
    """The ``Setting`` the estimators and the command line train a ``network`` (a name in
    ``SETTINGS``: ``"dense"``, ``"lenet5"``) with ``n_hidden`` hidden layers by: the network's
    for Algorithm 2 (``batched``), ``FULL_BATCH`` for Algorithm 1.

    >>> training("dense", 1, batched=True)
    Setting(lam=(0.2,), rho=(0.0, 0.0), gamma=(1.0, 30.0), momentum=(0.7, 0.0), w_steps=(10, 1),
            x_steps=(20,), gram_reuse=None)
    >>> training("lenet5", 4, batched=True).x_steps
    (1, 1, 10, 10)
    >>> training("dense", 2, batched=False).lam
    (10.0, 10.0)
    """
    if network not in SETTINGS:
        raise ValueError(f"network must be one of {sorted(SETTINGS)}, got {network!r}")
    return (SETTINGS[network] if batched else FULL_BATCH).for_layers(n_hidden)
