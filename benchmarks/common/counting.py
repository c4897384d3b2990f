"""A communicator of one process that counts the collectives a P-rank solve would take.

Every block solve of the fast backend takes its sums and maxima through a communicator
(``fenchel_cvx.reduce``). In one process these count the reductions a split solve would make,
and their bytes, without changing a figure (each reduction returns its values): the inputs of
the cost model in ``parallel_model.py``.
"""

import numpy as np


class Counter:
    """A communicator of one process that counts the reductions through it and their bytes."""

    P, rank, split = 1, 0, "columns"

    def __init__(self):
        self.calls = self.bytes = 0

    def reduce(self, values, op):
        self.calls += 1
        self.bytes += sum(np.asarray(v).nbytes for v in values)
        return list(values)

    def with_split(self, split):
        return self

    def verify(self):
        pass

    @property
    def columns(self):
        return self

    @property
    def rows(self):
        return self


class Roles(Counter):
    """The two roles counted apart: ``columns`` (the collectives of a column split) and
    ``rows`` (those of a row split)."""

    def __init__(self):
        super().__init__()
        self._rows = Counter()

    @property
    def rows(self):
        return self._rows


class Shares(Roles):
    """``P`` equal column shards seen from one: the communicator of a solve timed as one of
    ``P`` ranks takes it. A sum over the points is P times this shard's (the others' points
    taken as like its own), a maximum or minimum this shard's: the solve takes the paths of
    the batch's P x m points (a W-block's factor in parameter space where P x m points, and
    not m, reach the rows of X~) at the cost of this shard's m."""

    def __init__(self, P):
        super().__init__()
        self.P = P

    def reduce(self, values, op):
        ops = [op] * len(values) if isinstance(op, str) else list(op)
        return [v * self.P if o == "sum" else v for v, o in zip(super().reduce(values, op), ops)]


def parameter_space_on_ranks(block, P):
    """Whether a W-block on one of ``P`` ranks' shares has fewer points than rows of X~ (alone
    on them it solves in data space) and the batch's ``P`` shares have not (on the ranks it
    solves in parameter space, its Gram summed over them): LeNet-5's W_2 and the MLP's W_1 on
    two ranks."""
    from fenchel_cvx.blocks import WBlock

    rows, m = block.Xt.shape
    return P > 1 and isinstance(block, WBlock) and m < rows <= P * m
