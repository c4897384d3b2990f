"""Count the host reads of a run on ``array_api_strict`` arrays or PyTorch tensors, by where
they come from.

On a GPU every read of a value back to the host (``float(x)``, ``bool(x)``, ``int(x)``,
``np.asarray(x)``, an array as an index, ``x.item()``, ``x.cpu()``, ...) waits for the device,
and a batch that reads back cannot be captured as one graph (CUDA graphs, ``torch.compile``).
The fast solvers are written once against the array API standard, so the same code run on
``array_api_strict`` arrays or on PyTorch tensors (on any device) shows every such read that
Python makes: ``HostReads`` wraps the array class's conversions to host values (``CONVERSIONS``;
a tensor's ``cpu`` and ``numpy`` too) and counts each call by the function that made it (the
first frame outside the array library, NumPy and array_api_compat). A read made inside a
library's compiled code (a CUDA error check of a factorisation) is not a Python call and is not
counted: on a GPU, ``torch.cuda.set_sync_debug_mode`` shows those.

    with HostReads() as reads:          # HostReads("torch") for tensors
        backend.solve(block)
    print(reads.total, reads.table())

``count(fn, *args)`` does the same for one call, and ``unchecked_batch(net, X0, Y, ...)`` counts
one whole unchecked round of Algorithm 2 (``fit_bcd``), the steady state of a training run.
``ProductFlops`` counts the same way the floating-point operations of the matrix products of
``array_api_strict`` arrays, the part of a batch that BLAS (or a GPU's GEMM) runs: the floor of
its time at the GEMM rate.
"""

import collections
import math
import os
import sys

#: the conversions of an array to a host value (those the array class has are counted)
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
#: a tensor's copies to the host, beside the conversions
TENSOR_COPIES = ("cpu", "numpy")
#: the array libraries whose arrays are counted
LIBRARIES = ("array_api_strict", "torch")


def _array_class(library):
    """The array class of ``library`` (one of ``LIBRARIES``) and the folder of its code."""
    if library == "torch":
        import torch

        return torch.Tensor, os.path.dirname(torch.__file__) + os.sep
    if library == "array_api_strict":
        import array_api_strict
        from array_api_strict._array_object import Array

        return Array, os.path.dirname(array_api_strict.__file__) + os.sep
    raise ValueError(f"library must be one of {LIBRARIES}, got {library!r}")


def _skipped_roots(own):
    """The folders of the libraries whose frames are not a read's source (they relay it): the
    array library's ``own`` folder, NumPy's and array_api_compat's."""
    import array_api_compat
    import numpy

    return (own,) + tuple(
        os.path.dirname(str(m.__file__)) + os.sep for m in (numpy, array_api_compat)
    )


class _Tally:
    """A tally by source of calls to some methods of the Array class while active (a context
    manager; ``counting`` pauses and resumes it within). ``sources``: a ``Counter`` of
    ``(module, function, line)`` -> amount; each call adds ``amount(result, *args)``."""

    METHODS: tuple[str, ...] = ()

    def __init__(self, library="array_api_strict"):
        self.cls, own = _array_class(library)
        self.library, self.skipped = library, _skipped_roots(own)
        self.sources: collections.Counter = collections.Counter()
        self.counting = True
        self._saved = {}

    def methods(self):
        """The names of the array class's methods counted (those it has)."""
        return [name for name in self.METHODS if hasattr(self.cls, name)]

    @staticmethod
    def amount(out, *args):
        """What one call adds, from its result and arguments: 1 (a call)."""
        return 1

    @property
    def total(self):
        return sum(self.sources.values())

    def by_function(self):
        """``{"module.function": amount}``, most first."""
        out: collections.Counter = collections.Counter()
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
        for name in self.methods():
            self._saved[name] = vars(self.cls).get(name)  # None: inherited (a base class's)
            setattr(self.cls, name, self._wrap(getattr(self.cls, name), self.skipped))
        return self

    def __exit__(self, *exc):
        for name, method in self._saved.items():
            if method is None:
                delattr(self.cls, name)
            else:
                setattr(self.cls, name, method)
        self._saved.clear()
        return False

    def _wrap(self, method, skipped):
        tally = self

        def counted(*args, **kwargs):
            out = method(*args, **kwargs)
            if tally.counting:
                tally.sources[_source(sys._getframe(1), skipped)] += tally.amount(out, *args)
            return out

        counted.__name__, counted.__doc__ = getattr(method, "__name__", "?"), method.__doc__
        return counted


class HostReads(_Tally):
    """Counts reads of ``library``'s arrays (``"array_api_strict"``, ``"torch"``) back to the
    host while active, one per conversion (``CONVERSIONS``, and a tensor's ``TENSOR_COPIES``),
    by the function that made it."""

    METHODS = CONVERSIONS + TENSOR_COPIES


class ProductFlops(_Tally):
    """Counts the floating-point operations of the matrix products (``A @ B``) of ``library``'s
    arrays while active, by the function that made them: ``2 k`` per entry
    of the result, k the contracted length (a product's multiply-adds; the blocks' other work,
    elementwise, is not counted)."""

    METHODS = ("__matmul__",)

    @staticmethod
    def amount(out, a, b):
        return 2 * a.shape[-1] * math.prod(out.shape)


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


def flops_by_round(net, X0, Y, **fit_args):
    """The matrix-product FLOPs of each round of ``fit_bcd(net, X0, Y, **fit_args)`` on
    ``array_api_strict`` arrays, by function: ``[(record, Counter({"module.function":
    amount})), ...]``, each round's own products (from the end of the round before; the first
    round's from the start of the run, its setup included). ``net`` is trained."""
    from ..bcd import fit_bcd

    seen = []
    with ProductFlops() as flops:
        fit_bcd(
            net,
            X0,
            Y,
            eval_every=None,
            callback=lambda net_, record: seen.append(
                (record, collections.Counter(flops.by_function()))
            ),
            **fit_args,
        )
    before: list[collections.Counter] = [collections.Counter()] + [counts for _, counts in seen]
    return [(record, counts - earlier) for (record, counts), earlier in zip(seen, before)]


def unchecked_batch(net, X0, Y, backend, batch_size, flops=None, **fit_args):
    """The reads of one unchecked round of Algorithm 2: ``fit_bcd`` on ``X0``, ``Y``
    (``array_api_strict`` arrays or PyTorch tensors, of at least three batches; the reads of
    that library are counted) with ``check_every`` past the run,
    counting the second round only, from the end of the first round's record to the end of its
    own: the batch's gather, the momentum step, the feed-forward pass, both sweeps with the
    certificate's checks of every round (argmin, status) and the record. The first round is
    left out (an empty Gram cache, no momentum yet), and the run stops after the second (the
    last round of a run is always checked). ``flops``: a ``ProductFlops`` that counts the same
    round's products. ``fit_args`` go to ``fit_bcd`` (``gamma``, ``momentum``, ...).
    -> ``HostReads``; ``net`` is trained by the two rounds."""
    from array_api_compat import is_torch_array

    from ..bcd import fit_bcd

    if X0.shape[1] < 3 * batch_size:
        raise ValueError(
            f"X0 must hold at least 3 batches of {batch_size} points, got {X0.shape[1]}"
        )

    def callback(net_, record):
        reads.counting = flops.counting = record["iteration"] == 1  # round 1's end to round 2's
        return record["iteration"] == 2

    library = "torch" if is_torch_array(X0) else "array_api_strict"
    flops = ProductFlops(library) if flops is None else flops
    with HostReads(library) as reads, flops:
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
