"""A round's pre-activations U_l = A_l(W_l, X_l) + b_l, kept in one place, with one rule.

Every block of Algorithms 1 and 2 and every figure of the certificate needs some layer's
pre-activation (dense: U_l = W_l X~_l; the paper's X_l^0 of eqs. (14)-(20)): X_l's block its
U_{l-1} (the divergence B_{l-1}(Z, U_{l-1})) and, for its start, U_l; W_l's block, for its
start, U_l; the objectives F and J of eqs. (7)-(8) all of them. Each is a product as large as
its layer's block, so a round forms each once per change of W_l or X_l and keeps it here, for
all of them.

**The rule.** U_l is stale as soon as W_l or X_l changes: a block of layer l (X_l's or W_l's)
hands in the new U_l (:meth:`PreActivations.put`; None: it formed none, and the layer holds
nothing until a product forms it). Each image says who formed it, by ``steps``: 0 where a
product formed it (the driver's feed-forward pass, a block's check, an X-solver's last step),
else the number of a W-solver's steps that updated it in place (``U + t dU``) since a product
did. A checked round takes only images with ``steps == 0`` (the certificate trusts no solver's
update); an unchecked round also a solver's, updated by fewer than :data:`RESYNC` steps (the
fast W-solvers form their image again as often).

**Between rounds** the run keeps U_0 alone (:meth:`PreActivations.carried`), where every round
sees the same data and no momentum moves W_0 between them (Algorithm 1; Algorithm 2 with one
batch of all the data): forming W_0 X~_0 costs as much as W_0's block, and the W-sweep that ends
a round has it at hand. ``BCDState.carried`` holds it and a checkpoint stores it (the image and
its ``steps``), so a resumed run takes it where the uninterrupted run did.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .arrays import Array

__all__ = ["RESYNC", "Image", "PreActivations"]

#: the most steps that may update an image of W X~ in place before a product forms it again
RESYNC = 16


@dataclass(frozen=True)
class Image:
    """U_l at the current W_l and X_l, and ``steps``: the solver steps that updated it in place
    since a product formed it (0: the product's own)."""

    U: Array
    steps: int = 0

    def serves(self, check: bool) -> bool:
        """Whether a round (``check``: a checked one) may take it (the module's rule)."""
        return self.steps == 0 if check else self.steps < RESYNC


class PreActivations:
    """The pre-activations of one round at its current W and X (the module's rule).

    ``net``: the ``LiftedNetwork`` (its maps form what is not kept); ``check``: the round is
    checked; ``carried``: the U_0 the round before left (:meth:`carried`), taken where the
    rule lets this round take it.

    >>> import numpy as np
    >>> from fenchel_cvx import LiftedNetwork
    >>> net = LiftedNetwork([3, 4, 2], seed=0)
    >>> X0 = np.ones((3, 5))
    >>> pre = PreActivations(net, check=True)
    >>> Xs = pre.feed_forward(X0)
    >>> [pre.get(l).shape for l in range(2)], pre.on_pass() == [pre.get(0), pre.get(1)]
    ([(4, 5), (2, 5)], True)
    >>> pre.put(1, None)                    # X_1 or W_1 changed, no image handed in
    >>> pre.get(1) is None, len(pre.on_pass())
    (True, 1)
    """

    def __init__(
        self, net: Any, check: bool, carried: Image | None = None, threads: int = 1
    ) -> None:
        # (``net``: a LiftedNetwork, whose module reaches this one through ``io``; ``threads``:
        # the pass's activations on as many, ``LiftedNetwork.feed_forward``)
        self.net, self.check, self.threads = net, check, threads
        self._images: dict[int, Image] = {}
        self._on_pass = 0  # layers 0 .. _on_pass - 1 lie on the feed-forward pass at these W
        if carried is not None:
            self.put(0, carried.U, carried.steps)

    def get(self, l: int) -> Array | None:
        """U_l where this round may take a kept one, else None."""
        image = self._images.get(l)
        return None if image is None else image.U

    def steps(self, l: int) -> int:
        """The steps that updated the kept U_l since a product formed it (0 where none is kept)."""
        image = self._images.get(l)
        return 0 if image is None else image.steps

    def form(self, l: int, Xl: Array) -> Array:
        """U_l at ``Xl`` = the current X_l: the kept one, else formed here (and kept)."""
        U = self.get(l)
        if U is None:
            U = self.net.pre_activation(l, Xl)
            self.put(l, U)
        return U

    def put(self, l: int, U: Array | None, steps: int = 0) -> None:
        """W_l or X_l changed: ``U`` is the new U_l, updated by ``steps`` solver steps since a
        product formed it (None, or one this round may not take: none kept)."""
        image = None if U is None else Image(U, steps)
        if image is not None and image.serves(self.check):
            self._images[l] = image
        else:
            self._images.pop(l, None)
        # U_0 lies on the pass whenever kept (X_0 is the data); a later layer ends the pass there
        self._on_pass = min(self._on_pass, l) if l else int(0 in self._images)

    def feed_forward(self, X0: Array, Xt0: Array | None = None) -> list[Array]:
        """X_1, ..., X_L <- the feed-forward pass on the batch ``X0`` (patches ``Xt0`` where at
        hand) from the kept U_0 where there is one; keeps every U_l of the pass."""
        U0 = self.get(0)
        steps = self.steps(0)
        known = () if U0 is None else [U0]
        Xs, Us = self.net.feed_forward(X0, Xt0, known=known, threads=self.threads)
        for l, U in enumerate(Us):
            self._images[l] = Image(U, steps if l == 0 else 0)
        self._on_pass = len(Us)
        return Xs

    def on_pass(self) -> list[Array]:
        """The kept ``[U_0, U_1, ...]`` that lie on the feed-forward pass at the current W (all of
        them right after :meth:`feed_forward`; U_0 alone once an X_l has moved)."""
        return [self._images[l].U for l in range(self._on_pass)]

    def carried(self) -> Image | None:
        """U_0 for the next round, which sees the same data at the same W_0 (the module doc)."""
        return self._images.get(0)
