"""Fast array-API solvers for the four blocks (NumPy on a CPU; CuPy or PyTorch on a GPU).

``FastBackend(tol, max_iter, w_steps, x_steps, dtype).solve(block, start)`` solves one block of
``fenchel_cvx.blocks`` (the paper's Sec. 4.5 subproblems) with batched matrix products, written
once against the array API standard: the namespace is that of the block's arrays, so NumPy,
CuPy, PyTorch and ``array_api_strict`` inputs all run the same code, in their own dtype (float32
stays float32) and on their own device.

=============================  ==============================================================
block                          method
=============================  ==============================================================
XHidden, XLast (any loss)      FISTA with adaptive restart; the separable B_in term by its
                               elementwise prox (closed form for ReLU / leaky ReLU, bracketed
                               Newton for sigmoid / tanh), so its unbounded curvature is exact
WLast, MSE                     ridge normal equations through a Cholesky inverse, refined
WHidden, WLast cross-entropy   nonlinear CG (PR+) preconditioned by the shared Gram matrix
                               ``G = c X~ X~^T + 2 (rho + gamma) I`` (by Woodbury in data space
                               where X~ has fewer columns than rows: ``gram``), exact per-row
                               line search;
                               WHidden: batched semismooth-Newton rows for units with a small,
                               settled active set, converged rows frozen (see ``wblocks``);
                               a few capped steps from W0 with rho = 0 and fewer points than
                               inputs: the same CG on W = W0 + Z X~^T, in data space (``span``)
=============================  ==============================================================

Each row is a solver registered for its block class (``functools.singledispatch``).

Measured on a 784-300-10 ReLU / cross-entropy network, 500 MNIST points (benchmarks/fast_blocks.py,
H100, float64): X_1 block 14 iterations, 0.04 s; W_0 (300 x 785) to 1e-6 in 137 iterations,
2.1 s, one warm-started step 0.013 s; W_1 cross-entropy to 1e-6 in 494 iterations, 2.7 s.

Every loop stops when the block's own ``kkt_residual`` (``blocks.kkt_residual``) is ``<= tol``
or after ``max_iter`` iterations; ``w_steps=k`` caps a W-block at ``k`` warm-started steps
and ``x_steps=k`` an X-block at ``k`` FISTA iterations (inexact solves, as in the paper's
Algorithm 2 with K steps; an inexact X-block never ends above its start). ``tol`` below 64 machine
epsilons cannot be reached and is raised to that floor (8e-6 in float32), reported in
``info["tol"]``. ``converged`` is True exactly when the returned point's residual is ``<= tol``;
``status`` is ``"optimal"`` then, else ``"max_iter"`` (the cap or ``w_steps`` was reached) or
``"stalled"`` (the residual stopped decreasing at the working precision's floor, e.g. an
ill-conditioned W-block in float32 asked for 1e-6).
See ``benchmarks/fast_blocks.py`` for timings on MNIST-sized blocks.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import numbers
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from array_api_compat import array_namespace, device

from ..arrays import Array
from ..backends import BackendDefaults
from ..blocks import Block, BlockResult, WBlock, WHidden, WLast, XBlock, kkt_residual
from ..datasets import check_dtype
from ..reduce import LOCAL, Comm
from ..threads import controller, limit_threads, per_library, plan
from ..validation import TOL, check
from . import whole  # noqa: F401  - adds compile="blocks" (``fused.NAMED``)
from ._util import block_arrays as _block_arrays
from ._util import floor_tol, started
from .fused import Kernels, kernels
from .pncg import PncgSettings, solve_pncg
from .wblocks import solve_ridge
from .xblocks import EXACT_EIG_MAX, FistaSettings, default_start, solve_x

if TYPE_CHECKING:
    from ..layers import LinearMap
    from ..network import LiftedNetwork

__all__ = ["FastBackend"]


def _check_steps(name, steps):
    """None, an integer >= 1, or a non-empty sequence of them (one per layer, as a tuple)."""

    def one(v):
        return not isinstance(v, bool) and isinstance(v, numbers.Integral) and int(v) >= 1

    if steps is None or one(steps):
        return steps
    if isinstance(steps, (list, tuple)) and steps and all(one(v) for v in steps):
        return tuple(int(v) for v in steps)
    raise ValueError(
        f"{name} must be None, an integer >= 1 or a sequence of them (one per layer), got {steps!r}"
    )


def _of_layer(name, setting, block, i):
    """A per-layer setting's entry ``i`` for ``block`` where it is a tuple, else the setting."""
    if not isinstance(setting, tuple):
        return setting
    if not 0 <= i < len(setting):
        raise ValueError(
            f"{name} has {len(setting)} entries, none for the block of layer "
            f"{block.layer}: {setting!r}"
        )
    return setting[i]


def _dtype_name(dtype):
    """'float32' / 'float64' from a string, a NumPy / CuPy dtype or type, or an array-API dtype."""
    return None if dtype is None else check_dtype(dtype).name


class FastBackend(BackendDefaults):
    """Batched array-API block solver (``backend="fast"``).

    Parameters
    ----------
    tol : the KKT-residual tolerance of every loop (``blocks.kkt_residual``), > 0.
    max_iter : the iteration cap of every loop, >= 1.
    w_steps : None (W-blocks solved to ``tol``) or a number of warm-started W steps >= 1
        (W-blocks only; the loop still stops early at ``tol``), or one such number per layer,
        ``(steps of W_0, ..., steps of W_L)``.
    dtype : None (follow the block's arrays) or ``"float32"`` / ``"float64"``: the block's
        arrays are cast to it and the solve runs in it.
    newton_cap : WHidden rows whose active set (points with phi' > 0) has at most this many
        points take exact semismooth-Newton steps (cost ~ cap^3 per row); None: the
        cost-balanced default ``(24 (p_in + 1) m)^(1/3)``, growing as converged rows are frozen;
        0: never (pure preconditioned CG). A GPU affords a larger cap.
    x_steps : the same for the X-blocks: None (to ``tol``) or at most that many FISTA steps,
        or one number per X-block, ``(steps of X_1, ..., steps of X_L)``: LeNet-5's conv
        X-blocks, which barely move, need fewer than its dense ones (docs page "Tuning").
    gram_reuse : how many W solves of a layer one Gram factorisation serves (the
        parameter-space preconditioner of the CG W-blocks, not the MSE closed form nor the
        data-space one, which costs less to form again): 1 refactors whenever X~ changes; k > 1
        reuses it across k batches of a run; or one count per W-block, ``(W_0, ..., W_L)``:
        a conv layer's patch Gram sums 100,000s of columns and hardly changes from batch to
        batch, a dense layer's 500 do (docs page "Tuning"). A checkpoint of ``fit_bcd`` starts
        them afresh (``forget``), as a run resumed from it does.
    threads : an integer budget of cores (``fenchel_cvx.threads.plan``: NumPy's BLAS gets them
        all, SciPy's BLAS one, and with ``compile=True`` the compiled kernels one: ``threads``
        is then that plan's dict), a dict ``{"numpy": n, "scipy": k, ...}``, or None (leave the
        native thread pools as they are); applied through threadpoolctl around every solve, and
        by ``fit_bcd`` around its whole run. Default 1, by measurement on a 2-core machine: the
        scikit-learn digits pipeline took 4.7 s with every pool at 1 thread against 19 s with
        the pools as they come, 11 s with NumPy at 2 (docs page "Installation", threads).
    capped_residual : False: a solve that stops at its step cap (``w_steps``, ``x_steps``,
        ``max_iter``) reports ``residual`` NaN instead of evaluating it at the returned point
        (status ``"max_iter"``, ``converged`` False, also if that last step happened to reach
        ``tol``): one gradient less per block, a 300 x 500 x 785 product on MNIST's W_0. The
        certificate never uses the reported residual: it recomputes it on its checked rounds.
        A capped solve (fewer steps than the loops' stall windows) that reports no residual also
        tests none on the way: it takes all its steps, with no early stop at ``tol`` and no
        rows frozen, so that off NumPy it reads nothing back to the host (``fast.reads``); its
        ``info``'s ``restarts``, ``lipschitz`` and ``reverted`` may then be 0-d arrays, and a
        descent guard's value goes unreported with ``capped_value=False``.
    capped_value : False: such a solve reports ``value`` NaN too, unless its descent guard
        formed it (a capped X solve of more than one step compares its last value with its
        start's): ``fit_bcd`` reads the blocks' values only on its checked rounds, and
        recomputes them there (one pass over X_1, 4,704 x 500 on LeNet-5, per block).
    compile : ``"auto"`` (the default): the solvers' elementwise chains (the W line search, the
        FISTA step) run as fused kernels compiled by ``torch.compile`` (``fast.fused``) where
        PyTorch and a C++ compiler are present and the chain's NumPy arrays are large enough to
        gain (``fused.MIN_SIZE``: LeNet-5's convolution blocks, not the MNIST MLP's 300 x 500),
        eagerly otherwise; PyTorch is imported only if a chain compiles. The matrix products
        stay in NumPy's BLAS; the results equal the eager reference's up to rounding. A chain
        compiles in a run's first batch (seconds; cached on disk for later processes).
        True: the same, and refused here, before any work, without PyTorch or a C++ compiler,
        with what to install. False: every chain eagerly, in the arrays' own library (the
        readable reference). ``"blocks"``: each block solve compiled whole, as one graph, on
        PyTorch tensors (``fast.whole``; on a GPU each a CUDA graph, not yet run on one with
        PyTorch 2.13); it needs PyTorch 2.13 or newer and capped solves that read nothing back
        (each refused here otherwise), and each solve forms its Gram factorisation afresh
        (``gram_reuse`` is not used). Refused for arrays other than PyTorch tensors.

    Examples
    --------
    The X-block of X_1 of a 3-4-2 network, solved from the feed-forward point to ``tol``:

    >>> import numpy as np
    >>> from fenchel_cvx import blocks
    >>> from fenchel_cvx.network import LiftedNetwork
    >>> net = LiftedNetwork([3, 4, 2], seed=0)
    >>> X0, Y = np.arange(12.0).reshape(3, 4) / 10, np.ones((2, 4))
    >>> Xs, _ = net.forward(X0)
    >>> block = blocks.x_block(net, X0, Y, Xs, 1)
    >>> round(block.kkt_residual(Xs[0]), 4)          # the feed-forward point is not optimal
    0.6032
    >>> res = FastBackend(tol=1e-8).solve(block, start=Xs[0])
    >>> res.status, res.converged, res.residual <= 1e-8, res.argmin.shape
    ('optimal', True, True, (4, 4))
    >>> bool(res.value < block.value(Xs[0]))
    True
    """

    name = "fast"
    tol: float
    max_iter: int
    w_steps: int | tuple[int, ...] | None
    x_steps: int | tuple[int, ...] | None
    gram_reuse: int | tuple[int, ...]
    dtype: str | None
    newton_cap: int | None
    compile: bool | str
    threads: int | dict[str, int] | None
    capped_residual: bool
    capped_value: bool
    kernels: Kernels  # the elementwise chains' implementation
    _pools: Any  # threadpoolctl's controller, once a solve limits threads
    _pools_torch: bool
    _cache: dict[Any, Any]

    def __init__(
        self,
        tol: float = 1e-6,
        max_iter: int = 500,
        w_steps: int | Sequence[int] | None = None,
        dtype: str | None = None,
        newton_cap: int | None = None,
        x_steps: int | Sequence[int] | None = None,
        gram_reuse: int | Sequence[int] = 1,
        threads: int | dict[str, int] | None = 1,
        capped_residual: bool = True,
        capped_value: bool = True,
        compile: bool | str = "auto",
    ) -> None:
        tol = check("tol", tol, TOL)
        if not (isinstance(max_iter, numbers.Integral) and max_iter >= 1):
            raise ValueError(f"max_iter must be an integer >= 1, got {max_iter!r}")
        self.tol, self.max_iter = float(tol), int(max_iter)
        self.w_steps, self.x_steps = (
            _check_steps("w_steps", w_steps),
            _check_steps("x_steps", x_steps),
        )
        self.dtype = _dtype_name(dtype)
        if newton_cap is not None and not (
            isinstance(newton_cap, numbers.Integral) and newton_cap >= 0
        ):
            raise ValueError(f"newton_cap must be None or an integer >= 0, got {newton_cap!r}")
        self.newton_cap = newton_cap
        if gram_reuse is None:
            raise ValueError(
                "gram_reuse must be an integer >= 1 or a sequence of them (one per layer), got None"
            )
        self.gram_reuse = _check_steps("gram_reuse", gram_reuse)
        self.kernels = kernels(compile)  # refuses compile=True without torch.compile
        self.compile = compile if isinstance(compile, (bool, str)) else self.kernels.compiled
        if threads is not None:
            per_library(threads)  # a bad count fails here, before any work
            if self.kernels.compiled and not isinstance(threads, dict):  # kernels: one thread
                threads = plan(threads, compiled=True)
        self.threads, self._pools, self._pools_torch = threads, None, False
        for name, flag in (("capped_residual", capped_residual), ("capped_value", capped_value)):
            if not isinstance(flag, bool):
                raise ValueError(f"{name} must be True or False, got {flag!r}")
        self.capped_residual, self.capped_value = capped_residual, capped_value
        self._cache = {}  # Gram factorisations, reused while X~ is unchanged
        self.kernels.check_backend(self)  # compile="blocks": capped solves that read nothing

    def check_network(self, net: LiftedNetwork) -> None:
        """Refuse per-layer ``w_steps`` / ``x_steps`` of another length than ``net``'s blocks
        (``fit_bcd`` calls it before any work)."""
        for name, steps, n, first in (
            ("w_steps", self.w_steps, net.n_hidden + 1, "W_0"),
            ("x_steps", self.x_steps, net.n_hidden, "X_1"),
            ("gram_reuse", self.gram_reuse, net.n_hidden + 1, "W_0"),
        ):
            if isinstance(steps, tuple) and len(steps) != n:
                last = f"{first[0]}_{int(first[2:]) + n - 1}"
                raise ValueError(
                    f"{name} must have one entry per block of the network "
                    f"({n}: {first} to {last}), got {len(steps)}: {steps!r}"
                )

    def steps_of(self, block: Block) -> tuple[str, int | None]:
        """Deprecated name of :meth:`step_setting`."""
        warnings.warn(
            "FastBackend.steps_of is deprecated; use FastBackend.step_setting",
            DeprecationWarning,
            stacklevel=2,
        )
        return self.step_setting(block)

    def step_setting(self, block: Block) -> tuple[str, int | None]:
        """``(the setting's name, its cap)``: the block's step setting (``"w_steps"`` /
        ``"x_steps"``) and its cap, per layer where a tuple (X_l: entry l - 1, W_l: entry l),
        or None.

        Examples
        --------
        >>> import numpy as np
        >>> from fenchel_cvx.blocks import w_block, x_block
        >>> from fenchel_cvx.network import LiftedNetwork
        >>> net, X0, Y = LiftedNetwork([3, 4, 2]), np.ones((3, 5)), np.ones((2, 5))
        >>> Xs, _ = net.forward(X0)
        >>> fast = FastBackend(w_steps=(10, 1))
        >>> [fast.step_setting(w_block(net, X0, Y, Xs, l)) for l in (0, 1)]
        [('w_steps', 10), ('w_steps', 1)]
        >>> fast.step_setting(x_block(net, X0, Y, Xs, 1))     # X-blocks: to tol
        ('x_steps', None)
        """
        x = isinstance(block, XBlock)
        name, steps = ("x_steps", self.x_steps) if x else ("w_steps", self.w_steps)
        return name, _of_layer(name, steps, block, block.layer - 1 if x else block.layer)

    def reuse_of(self, block: WBlock) -> int:
        """The W-block's ``gram_reuse`` (its layer's entry where a tuple)."""
        return _of_layer("gram_reuse", self.gram_reuse, block, block.layer)

    def forget(self) -> None:
        """Drop the Gram factorisations kept for reuse (``fit_bcd`` does at the start of a run,
        so that its iterates do not depend on the backend's earlier runs, and at every
        checkpoint, so that a run resumed from it goes on as the uninterrupted one)."""
        self._cache.clear()

    def __getstate__(self) -> dict:
        """A copy for another process (a rank): the settings, without this process's thread
        pools, kept factors, compiled kernels (``fused.Kernels.__reduce__``) or the last run's
        communicator (``fit_bcd`` sets each run's)."""
        state = {**self.__dict__, "_pools": None, "_pools_torch": False, "_cache": {}}
        state.pop("comm", None)
        return state

    def on_compile(self, callback: Callable[[str | None], object]) -> Callable[[], None]:
        """``callback(name)`` when dynamo starts compiling the chain ``name``, ``callback(None)``
        when it is done (``fused.Kernels.on_compile``; never where every chain runs eagerly).
        -> the function that stops the calls."""
        return self.kernels.on_compile(callback)

    def settings(self) -> dict[str, Any]:
        """What decides the iterates of its solves, as a run's history records it
        (``fit_bcd``'s config ``backend_settings``): not the threads (they change the iterates
        only by rounding, the order of BLAS's sums), nor what a capped solve reports."""
        return dict(
            tol=self.tol,
            max_iter=self.max_iter,
            w_steps=self.w_steps,
            x_steps=self.x_steps,
            dtype=self.dtype,
            newton_cap=self.newton_cap,
            gram_reuse=self.gram_reuse,
        )

    def options(self) -> dict[str, Any]:
        """Every argument it was built with (``settings`` and the threads, the capped reports and
        ``compile``): ``FastBackend(**b.options())`` is a backend equal to ``b``, with an empty
        Gram cache; ``FastBackend(**{**b.options(), "compile": False})`` its eager twin."""
        return dict(
            self.settings(),
            threads=self.threads,
            capped_residual=self.capped_residual,
            capped_value=self.capped_value,
            compile=self.compile,
        )

    def __repr__(self):
        fields = self.options()
        return f"FastBackend({', '.join(f'{k}={v!r}' for k, v in fields.items())})"

    #: its solves take the start's image and hand back the argmin's (``backends.Backend``)
    images = True
    #: the ranks that hold shares of every block's data points (``reduce.py``; ``fit_bcd``
    #: sets it for its run): every figure a solve takes is the whole block's
    comm: Comm = LOCAL

    def solve(
        self,
        block: Block,
        start: Array | None = None,
        image: Array | None = None,
        return_image: bool = False,
    ) -> BlockResult:
        """Solve ``block`` from ``start`` (the current iterate; a default when None). ``image``:
        ``block.forward(start)`` where the caller holds it (the solvers start from it where its
        shape fits, else form it); ``return_image``: hand the argmin's image back as
        ``BlockResult.U`` where the solver holds it (a W-block's last step then forms it)."""
        return self._on_threads(self._solve, block, start, image, return_image)

    def map_norm2(self, A: LinearMap, W: Array) -> float | Array | None:
        """The certified bound of ``||A(W, .)||_2^2`` that an X-block on the map ``A`` of ``W``
        takes for its step size (``xblocks``: ``A.norm2_bound`` at ``EXACT_EIG_MAX``), or None
        where it takes an estimate, or where its ``dtype`` casts W (its blocks then bound the
        cast W); on the backend's threads, as its solves. On ranks each rank computes some of
        the X-sweep's and shares them (``layer_split.shared_norms``)."""
        if self.dtype is not None and str(W.dtype) != self.dtype:
            return None
        return self._on_threads(A.norm2_bound, W, EXACT_EIG_MAX)

    def _on_threads(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` with the native pools at ``threads`` threads (None: as they are)."""
        if self.threads is None:
            return fn(*args)
        if self._pools is None or (not self._pools_torch and "torch" in sys.modules):
            # PyTorch's pool (the compiled kernels') is seen from when it is loaded (``fused.Auto``
            # imports PyTorch at the first chain it compiles)
            self._pools, self._pools_torch = controller(), "torch" in sys.modules
        with limit_threads(self.threads, self._pools):
            return fn(*args)

    def _solve(self, block, start, image, return_image):
        t0 = time.perf_counter()
        solve = _solver_of(block)
        block = started(block, image, return_image)
        arrays = _block_arrays(block)
        xp = array_namespace(*arrays.values())
        self.kernels.check_arrays(xp)
        if self.dtype is not None:
            dt = getattr(xp, self.dtype)
            block = dataclasses.replace(
                block, **{k: xp.astype(v, dt, copy=False) for k, v in arrays.items()}
            )
            arrays = _block_arrays(block)
        dtype = xp.result_type(*arrays.values())
        if "U" in arrays and arrays["U"].dtype != dtype:  # a caller's hint of A(W, X) + b,
            # cast as the rest: the solvers update their state in place from it
            block = dataclasses.replace(block, U=xp.astype(arrays["U"], dtype))
        tol = floor_tol(xp, dtype, self.tol)
        Z = self._start(xp, block, start, dtype)
        Z, it, info = self.kernels.solve(solve, block, self, xp, Z, tol)
        converged = bool(info.pop("converged"))
        status = "optimal" if converged else ("stalled" if info.get("stalled") else "max_iter")
        U = info.pop("U", None)  # the solver's image of Z: A(W, Z) + b, or Z X~
        residual = info.pop("residual", None)  # a solver's own (W: from the gradient it holds)
        if residual is None:
            residual = kkt_residual(block, Z, comm=self.comm)
        value = info.pop("value", None)  # the solver's own, from the products it holds
        if value is None:
            value = (
                math.nan
                if status == "max_iter" and not self.capped_value
                else float(block.value_over(Z, block.forward(Z), self.comm))
            )
        name, steps = self.step_setting(block)
        info.update({"tol": tol, "dtype": _dtype_name(dtype), name: steps})
        return BlockResult(
            argmin=Z,
            value=value,
            status=status,
            residual=residual,
            seconds=time.perf_counter() - t0,
            iterations=it,
            converged=converged,
            info=info,
            U=U,
        )

    def _start(self, xp, block, start, dtype):
        if start is None:
            return _default_start(block, xp, dtype)
        # an array of xp stays the same object (a W-block's start may be its centre W0); one of
        # another library moves to the block's library and device
        if not _is_array_of(xp, start):
            start = xp.asarray(start, device=device(next(iter(_block_arrays(block).values()))))
        shape = tuple(block.shape)
        if tuple(start.shape) != shape:
            raise ValueError(f"start must have shape {shape}, got {tuple(start.shape)}")
        return xp.astype(start, dtype, copy=False)  # the solvers never write into it


def _is_array_of(xp, A):
    """Whether ``A`` is already an array of the library ``xp``."""
    try:
        return array_namespace(A) is xp
    except TypeError:
        return False


# --- the solver of each block class --------------------------------------------------------------
def _unknown(block):
    return ValueError(
        f"block must be an XHidden, XLast, WHidden or WLast block, got {type(block).__name__}"
    )


@functools.singledispatch
def _solve_block(block, backend, xp, Z, tol, cache=None):
    """``(Z, iterations, info)``: the block solved from ``Z`` by the solver of its class;
    ``cache``: the Gram factorisations at hand (None: the backend's, kept across solves)."""
    raise _unknown(block)


def _solver_of(block):
    """The solver registered for the block's class; a ``ValueError`` naming it where none is."""
    solve = _solve_block.dispatch(type(block))
    if solve is _solve_block.dispatch(object):
        raise _unknown(block)
    return solve


@_solve_block.register
def _(block: XBlock, backend, xp, Z, tol, cache=None):
    _, steps = backend.step_setting(block)
    cap = backend.max_iter if steps is None else min(backend.max_iter, int(steps))
    settings = FistaSettings(
        capped_residual=backend.capped_residual,
        capped_value=backend.capped_value,
        kernels=backend.kernels,
    )
    return solve_x(xp, block, Z, tol, cap, settings, backend.comm)


def _solve_pncg(block, backend, xp, Z, tol, cache=None):
    _, steps = backend.step_setting(block)
    cap = backend.max_iter if steps is None else int(steps)
    settings = PncgSettings(
        newton_cap=backend.newton_cap,
        gram_reuse=backend.reuse_of(block),
        capped_residual=backend.capped_residual,
        capped_value=backend.capped_value,
        kernels=backend.kernels,
    )
    cache = backend._cache if cache is None else cache
    return solve_pncg(xp, block, Z, tol, cap, cache, settings, backend.comm)


_solve_block.register(WHidden, _solve_pncg)


@_solve_block.register
def _(block: WLast, backend, xp, Z, tol, cache=None):
    cache = backend._cache if cache is None else cache
    # MSE: a ridge regression, the normal equations (it reads its residual back: under
    # compile="blocks" it does not compile whole, and runs eagerly)
    if block.loss.last_w_solver == "ridge":
        return solve_ridge(xp, block, Z, tol, backend.max_iter, cache, backend.comm)
    return _solve_pncg(block, backend, xp, Z, tol, cache)


@functools.singledispatch
def _default_start(block, xp, dtype):
    """The start of a solve given none: X-blocks the feed-forward value, W-blocks ``W0`` or 0."""
    raise _unknown(block)


@_default_start.register
def _(block: XBlock, xp, dtype):
    return xp.astype(default_start(xp, block), dtype)


@_default_start.register
def _(block: WBlock, xp, dtype):
    W0 = block.W0
    if W0 is not None:
        return xp.astype(W0, dtype)
    return xp.zeros(block.shape, dtype=dtype, device=device(block.Xt))
