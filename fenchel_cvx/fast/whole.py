"""Each block solve compiled whole, as one graph: ``FastBackend(compile="blocks")``.

In the batched training setting (capped steps, no residual or value reported at the cap) the
fast solvers read nothing back to the host during a block solve (``fast.reads``), so each
solve of the paper's Sec. 4.5 blocks (eqs. (14)-(20), as ``fast.wblocks`` and
``fast.xblocks`` solve them) traces into one ``torch.compile`` graph with no graph break
(tests/test_host_reads.py). ``Blocks`` runs every solve that way, on PyTorch tensors; the
backend's settings are checked for it when it is built (``Blocks.check_backend``).

- On a GPU each block's graph runs with ``mode="reduce-overhead"``: its Triton kernels replayed
  as one CUDA graph, one launch in place of the thousands of kernel launches of its eager
  operations (the docs page "Results", "On a GPU"). Nothing in a read-free solve waits for the
  device: the W-blocks factor by ``cholesky_ex``, and the X-blocks' Lipschitz bound is formed
  by matrix products alone (``layers._trace_bound``; ``eigvalsh`` checks its result on the
  host, which a capture cannot hold). It needs PyTorch 2.13 or newer (``MIN_TORCH``), and is
  refused by name before any work otherwise: PyTorch 2.11's compiler cannot build the
  solvers' settings objects inside a graph (docs page "Results", "On a GPU"). This GPU path
  has not yet run on a GPU with PyTorch 2.13.
- On the CPU the same graphs run as inductor's C++ kernels; the tests check them against the
  eager solves.

A graph holds its solve's loops unrolled: the MLP's W_0 block takes 10 span steps, each with a
line search of 10 Newton iterations. The Newton iteration (``_util.newton_step``) is a nested
compile region (``REGIONS``, ``Blocks.region``): dynamo traces each call and finds it the same,
and the graph calls a subgraph, compiled once, for the iterations of a line search at least (as
a rule for all of a block's). A convolution's adjoint sums its
columns by ``torch.nn.functional.fold`` in a graph (``layers.Conv2d.adjoint_x``). The compile
times are on the docs page "Results", "On a GPU".

One compiled function serves each kind of block (its class and layer) at a fixed shape
(``dynamic=False``: a new shape, such as a smaller last batch, compiles once more; symbolic
sizes would turn the solvers' Python arithmetic on shapes into graph code). Its Python settings
(the block's lam, rho and gamma, its activation or loss; the backend's step counts) are
constants of the graph: dynamo compiles again where one changes. Each solve starts with an
empty Gram cache: a factorisation made inside a graph is not kept across solves (``gram_reuse``
is not used). A CUDA graph's results are copied out of its memory, which its next replay
overwrites. A solve that fails to compile runs eagerly from then on, with a warning that says
why.
"""

from __future__ import annotations

import dataclasses
import warnings
from types import ModuleType

from ._util import NEWTON_START, block_arrays, newton_step
from .fused import _F, NAMED, Kernels, _Caps, _running, require_compiler, room_for_variants

#: the oldest PyTorch tested to trace every block solve into one graph (the ``bench`` extra's
#: pin; PyTorch 2.11's compiler cannot build a solver's settings objects in a graph)
MIN_TORCH = "2.13"

#: the solvers' loop bodies that a block's graph calls many times with arrays of one shape, each
#: one subgraph compiled once (``region``; the solvers call them through ``Kernels.region``)
REGIONS = (newton_step,)


def too_old(torch: ModuleType) -> str | None:
    """Why ``torch`` cannot compile a block solve whole (a release older than ``MIN_TORCH``; a
    pre-release of it counts as older, untested), or None where it can."""
    from torch.torch_version import TorchVersion

    if TorchVersion(torch.__version__) >= MIN_TORCH:
        return None
    return (
        f"PyTorch {MIN_TORCH} or newer, whose compiler traces a block solve whole (older "
        f"releases stop at the solvers' settings objects), got PyTorch {torch.__version__}: "
        f"install torch>={MIN_TORCH}, or use compile='auto'"
    )


class Blocks(Kernels):
    """``compile="blocks"``: each block solve one ``torch.compile(fullgraph=True,
    dynamic=False)`` graph on PyTorch tensors (module doc); the elementwise chains are traced
    into it as written. Refused, before any work, without PyTorch and a C++ compiler, and on
    arrays of other libraries."""

    name = "blocks"
    compiled = True  # its first solves compile (the chains inside them, as written)

    def __init__(self):
        require_compiler()
        import torch

        problem = too_old(torch)
        if problem is not None:
            raise ValueError(f"compile='blocks' needs {problem}")
        self.torch = torch
        room_for_variants(torch)  # a compiled variant per kind of block, dtype and device
        self._solves, self._failed = {}, {}  # compiled solves, and failures, by kind of block
        # marked before any tracing (dynamo does not trace the marking itself)
        self._regions = {step: torch.compiler.nested_compile_region(step) for step in REGIONS}

    def region(self, step: _F) -> _F:
        """``step`` as a nested compile region (``torch.compiler.nested_compile_region``) where
        it is one of ``REGIONS``: in a graph, every call with inputs of the same shapes, dtypes
        and devices calls one subgraph, compiled once (a W-block's unrolled line-search
        iterations, ``_util.newton_step``); any other function as it is, inlined."""
        return self._regions.get(step, step)

    def check_arrays(self, xp: ModuleType) -> None:
        from array_api_compat import is_torch_namespace

        if not is_torch_namespace(xp):
            name = getattr(xp, "__name__", str(xp))
            raise ValueError(
                f"compile='blocks' compiles whole block solves on PyTorch tensors, got arrays "
                f"of {name}: use compile='auto' (or False) for them"
            )

    def check_backend(self, backend: _Caps) -> None:
        """A whole solve is one graph only where it reads nothing back to the host: capped
        steps (W-blocks at most ``NEWTON_START``, where no semismooth-Newton row starts) and no
        residual or value reported at the cap."""
        w, x = backend.w_steps, backend.x_steps
        capped = all(
            steps is not None and max(steps if isinstance(steps, tuple) else (steps,)) <= cap
            for steps, cap in ((w, NEWTON_START), (x, backend.max_iter))
        )
        if not capped or backend.capped_residual or backend.capped_value:
            raise ValueError(
                "compile='blocks' needs solves that read nothing back to the host: w_steps "
                f"at most {NEWTON_START} and x_steps set, capped_residual=False and "
                f"capped_value=False; got w_steps={w!r}, x_steps={x!r}, "
                f"capped_residual={backend.capped_residual}, capped_value={backend.capped_value}"
            )

    def solve(self, solver, block, backend, xp, Z, tol):
        # (untyped: ``dataclasses.replace`` empties the block's array fields for its template,
        # which the block classes' field types do not allow)
        arrays = block_arrays(block)
        names = tuple(arrays)
        cuda = Z.device.type == "cuda"
        key = (solver, type(block), block.layer, names, cuda)
        if key in self._failed:
            return solver(block, backend, xp, Z, tol)
        run = self._solves.get(key)
        if run is None:  # on a GPU, a CUDA graph
            run = self._solves[key] = self._compile(solver, names, cuda)
        template = dataclasses.replace(block, **{k: None for k in names})
        what = f"the {block.kind} block of layer {block.layer}"
        try:
            with _running(what):
                out = run(template, backend, xp, tol, Z, *arrays.values())
        except Exception as err:  # noqa: BLE001 - any compiler or capture failure: run eagerly
            self._failed[key] = f"{type(err).__name__}: {err}"
            warnings.warn(
                f"compile='blocks' failed on {what} ({self._failed[key].splitlines()[0][:300]}); "
                f"it runs eagerly from now on",
                RuntimeWarning,
                stacklevel=3,
            )
            return solver(block, backend, xp, Z, tol)
        return self.torch.utils._pytree.tree_map(_copy, out) if cuda else out

    def _compile(self, solver, names, graph):
        def solve(template, backend, xp, tol, Z, *arrays):
            block = dataclasses.replace(template, **dict(zip(names, arrays)))
            return solver(block, backend, xp, Z, tol, cache={})

        mode = "reduce-overhead" if graph else None
        return self.torch.compile(solve, fullgraph=True, dynamic=False, mode=mode)


def _copy(x):
    """A tensor out of a CUDA graph's memory, copied; anything else as it is."""
    return x.clone() if hasattr(x, "clone") else x


NAMED["blocks"] = Blocks
