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
