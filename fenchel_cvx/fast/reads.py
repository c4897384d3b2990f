"""Count the host reads of a run on ``array_api_strict`` arrays, by where they come from.

On a GPU every read of a value back to the host (``float(x)``, ``bool(x)``, ``int(x)``,
``np.asarray(x)``, an array as an index, ...) waits for the device, and a batch that reads back
cannot be captured as one graph (CUDA graphs, ``torch.compile``). The fast solvers are written
once against the array API standard, so the same code run on ``array_api_strict`` arrays shows
every such read: ``HostReads`` wraps the Array class's conversions to host values
(``__bool__``, ``__int__``, ``__index__``, ``__float__``, ``__complex__``, ``__array__``,
``__dlpack__``, and ``item`` / ``tolist`` where the class has them) and counts each call by the
function that made it (the first frame outside array_api_strict, NumPy and array_api_compat).

    with HostReads() as reads:
        backend.solve(block)
    print(reads.total, reads.table())

``count(fn, *args)`` does the same for one call, and ``unchecked_batch(net, X0, Y, ...)`` counts
one whole unchecked round of Algorithm 2 (``fit_bcd``), the steady state of a training run.
``ProductFlops`` counts the same way the floating-point operations of the matrix products, the
part of a batch that BLAS (or a GPU's GEMM) runs: the floor of its time at the GEMM rate.
"""

import collections
import os
import sys

#: the conversions of an array to a host value (those the Array class has are counted)
CONVERSIONS = (
    "__bool__",
    "__int__",
    "__index__",
    "__float__",
    "__complex__",
    "__array__",
    "__dlpack__",
    "item",
    "tolist",
)


def _array_class():
    from array_api_strict._array_object import Array

    return Array


def _skipped_roots():
    """The folders of the libraries whose frames are not a read's source (they relay it)."""
    import array_api_compat
    import array_api_strict
    import numpy

    return tuple(
        os.path.dirname(m.__file__) + os.sep for m in (array_api_strict, numpy, array_api_compat)
    )


class _Tally:
    """A tally by source of calls to some methods of the Array class while active (a context
    manager; ``counting`` pauses and resumes it within). ``sources``: a ``Counter`` of
    ``(module, function, line)`` -> amount; each call adds ``amount(result, *args)``."""

    METHODS: tuple[str, ...] = ()

    def __init__(self):
        self.sources = collections.Counter()
        self.counting = True
        self._saved = {}

    @staticmethod
    def amount(out, *args):
        """What one call adds, from its result and arguments: 1 (a call)."""
        return 1

    @property
    def total(self):
        return sum(self.sources.values())

    def by_function(self):
        """``{"module.function": amount}``, most first."""
        out = collections.Counter()
        for (module, function, _), n in self.sources.items():
            out[f"{module}.{function}"] += n
        return dict(out.most_common())

    def table(self):
        """One line per source line, most first: ``amount  module.function:line``."""
        return "\n".join(
            f"{n:5d}  {module}.{function}:{line}"
            for (module, function, line), n in self.sources.most_common()
        )

    def __enter__(self):
        cls, skipped = _array_class(), _skipped_roots()
        for name in self.METHODS:
            if name in vars(cls):
                self._saved[name] = vars(cls)[name]
                setattr(cls, name, self._wrap(vars(cls)[name], skipped))
        return self

    def __exit__(self, *exc):
        cls = _array_class()
        for name, method in self._saved.items():
            setattr(cls, name, method)
        self._saved.clear()
        return False

    def _wrap(self, method, skipped):
        tally = self

        def counted(*args, **kwargs):
            out = method(*args, **kwargs)
            if tally.counting:
                tally.sources[_source(sys._getframe(1), skipped)] += tally.amount(out, *args)
            return out

        counted.__name__, counted.__doc__ = method.__name__, method.__doc__
        return counted


class HostReads(_Tally):
    """Counts reads of ``array_api_strict`` arrays back to the host while active, one per
    conversion (``CONVERSIONS``), by the function that made it."""

    METHODS = CONVERSIONS


class ProductFlops(_Tally):
    """Counts the floating-point operations of the matrix products (``A @ B``) of
    ``array_api_strict`` arrays while active, by the function that made them: ``2 k`` per entry
    of the result, k the contracted length (a product's multiply-adds; the blocks' other work,
    elementwise, is not counted)."""

    METHODS = ("__matmul__",)

    @staticmethod
    def amount(out, a, b):
        return 2 * a.shape[-1] * out.size


def _source(frame, skipped):
    """``(module, function, line)`` of the first frame outside the ``skipped`` folders."""
    while frame is not None and frame.f_code.co_filename.startswith(skipped):
        frame = frame.f_back
    if frame is None:
        return ("?", "?", 0)
    code = frame.f_code
    return frame.f_globals.get("__name__", "?"), code.co_qualname, frame.f_lineno


def count(fn, *args, **kwargs):
    """``(fn(*args, **kwargs), HostReads)``: the call's result and the reads it made."""
    with HostReads() as reads:
        out = fn(*args, **kwargs)
    return out, reads


def unchecked_batch(net, X0, Y, backend, batch_size, flops=None, **fit_args):
    """The reads of one unchecked round of Algorithm 2: ``fit_bcd`` on ``X0``, ``Y``
    (``array_api_strict`` arrays of at least three batches) with ``check_every`` past the run,
    counting the second round only, from the end of the first round's record to the end of its
    own: the batch's gather, the momentum step, the feed-forward pass, both sweeps with the
    certificate's checks of every round (argmin, status) and the record. The first round is
    left out (an empty Gram cache, no momentum yet), and the run stops after the second (the
    last round of a run is always checked). ``flops``: a ``ProductFlops`` that counts the same
    round's products. ``fit_args`` go to ``fit_bcd`` (``gamma``, ``momentum``, ...).
    -> ``HostReads``; ``net`` is trained by the two rounds."""
    from ..bcd import fit_bcd

    if X0.shape[1] < 3 * batch_size:
        raise ValueError(
            f"X0 must hold at least 3 batches of {batch_size} points, got {X0.shape[1]}"
        )

    def callback(net_, record):
        reads.counting = flops.counting = record["iteration"] == 1  # round 1's end to round 2's
        return record["iteration"] == 2

    flops = ProductFlops() if flops is None else flops
    with HostReads() as reads, flops:
        reads.counting = flops.counting = False
        fit_bcd(
            net,
            X0,
            Y,
            batch_size=batch_size,
            epochs=1,
            backend=backend,
            strict=False,
            eval_every=None,
            check_every=10**9,
            callback=callback,
            **fit_args,
        )
    return reads
