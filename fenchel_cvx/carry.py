"""The first layer's pre-activation U_0 = W_0 X~_0, carried from one round to the next.

In Algorithm 1, and in Algorithm 2 with one batch of all the data (``batch_size >= m``: Figure
1's FLN restarts X from the feed-forward point every round), every round sees the same data and
begins with U_0 = W_0 X~_0 at the weights the round before returned: the feed-forward pass, the
objective J and X_1's block (eq. (14): its divergence ``B_0(X_1, W_0 X~_0)``) need it, and
forming it is a product as large as W_0's block. The W-sweep that ends the round before has it
at hand: W_0's check formed it from the returned W_0 (checked rounds: exact), or W_0's solver
updated it along its steps (``U + t dU``: exact up to rounding; ``BlockResult.U``). The next
round takes it in place of the product,

- a checked round only the check's exact one: the certificate trusts no solver's image;
- an unchecked round also the solver's, while fewer than ``RESYNC`` steps have updated it since
  a product formed it (the fast W solvers form their image again as often);
- never where momentum moved W_0 between the rounds (``bcd._extrapolate``), nor where the rounds
  see different batches.

The run's state holds it (``BCDState.carried``) and a checkpoint stores it, so that a resumed
run takes it where the uninterrupted run did.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

#: the most steps that may update an image of W X~ in place before a product forms it again
RESYNC = 16


@dataclass(frozen=True)
class Carried:
    """U_0 = W_0 X~_0 (the layer's output form) at the weights of the last finished round."""

    U: Any
    steps: int  # the solver steps that updated it since a product formed it (0: exact)

    def usable(self, check: bool) -> bool:
        """Whether a round (``check``: a checked one) may take it for W_0 X~_0 (``after_w0``
        and the checkpoint reader keep ``steps`` below ``RESYNC``)."""
        return not check or self.steps == 0

    @classmethod
    def after_w0(cls, image, solver_U, steps_before, iterations):
        """What W_0's block leaves to the next round: the check's exact ``image``, else the
        solver's ``solver_U``, updated by its ``iterations`` steps from a start updated by
        ``steps_before`` (0 where a product formed it); None where neither is at hand."""
        if image is not None:
            return cls(image, 0)
        if solver_U is None or steps_before + iterations >= RESYNC:
            return None
        return cls(solver_U, steps_before + iterations)
