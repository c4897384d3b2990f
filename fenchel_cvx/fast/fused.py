"""The fast solvers' elementwise chains, run eagerly (the reference) or compiled into fused kernels.

Between its matrix products a block solve spends most of its time in chains of elementwise
operations and reductions over arrays of the block's size (300 x 500 for the MNIST MLP's
hidden layer, 6 x 392,000 for LeNet-5's first convolution's W-block): the exact line search of
the W-blocks along ``U + t dU`` and the FISTA step of the X-blocks. Eager NumPy runs each
operation as its own pass over memory, with a temporary array each. Each chain here is one
array-API function, and a ``Kernels`` object runs it one of two ways:

- ``EAGER``: as written, in the arrays' own library (NumPy, CuPy, array-api-strict): the
  readable reference, and the path where PyTorch is absent;
- ``Compiled()``: through ``torch.compile`` (inductor) on zero-copy torch views of the NumPy
  arrays (``torch.from_numpy``), so that each chain becomes one fused loop, C++ with OpenMP on
  the CPU; the results come back as NumPy arrays over the same memory. The matrix products
  stay in NumPy's BLAS. The same function is traced from its array-API code (PyTorch's
  namespace through array_api_compat), so both ways compute the same formulas;
- ``Auto()``, the fast backend's default (``compile="auto"``): compiled where PyTorch and a C++
  compiler are present and the chain's NumPy arrays are large enough to gain (``MIN_SIZE``),
  eagerly otherwise (small chains, other array libraries, no compiler). PyTorch is imported
  only when a chain first compiles.

(``whole.Blocks``, ``compile="blocks"``, compiles each block solve whole instead, the chains
traced into its graph as written, for PyTorch tensors on a GPU.)

Each chain compiles for the first shape it meets; a second shape (another layer, or fewer rows
in a W solve to tolerance) compiles it once more with symbolic sizes (dynamo's automatic
dynamic shapes), which then serves the shapes that follow: in a training run, all in its
first batch (``Compiled.compiles`` counts them; tests/test_compiled.py checks it). Python
floats that change from call to call (a step length) enter as 0-d tensors, so they never
trigger a recompilation; pass numbers as Python floats (a NumPy scalar or a 0-d array would
promote as NumPy does in the eager form, not as PyTorch does). Inductor's on-disk cache keeps
the compiled kernels between processes. A chain that fails to compile runs eagerly from then on,
with a warning that says why. ``Kernels.on_compile`` tells a listener (the progress bar) which
chain dynamo is compiling, from its compile callbacks, while it compiles.

The chains (the paper's Sec. 4.5 blocks, as ``fast.wblocks`` and ``fast.xblocks`` solve them):

- ``row_derivs``, ``row_curv``, ``row_change``: a WHidden row's divergence term
  ``lam sum_j B(v_j, u_j)`` along a direction: its first and second derivatives and its change;
  ``row_derivs_change`` the first and the last at one length;
- ``fista_step``: the X-blocks' proximal-gradient step from FISTA's extrapolated point and the
  figures that FISTA's tests need;
- ``scaled_grad_u``: the gradient ``lam (phi(U) - V)`` of a hidden X-block's smooth term.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import shutil
import sys
import threading
import warnings
from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from array_api_compat import array_namespace, device

from ..arrays import Array, vecdot

if TYPE_CHECKING:
    from ..activations import Activation
    from ..blocks import Block

__all__ = [
    "EAGER",
    "MIN_SIZE",
    "Auto",
    "Compiled",
    "Kernels",
    "compiled_graphs",
    "compiler_available",
    "compiler_problem",
    "kernels",
    "require_compiler",
    "watch",
]

#: chains whose largest array has fewer entries run eagerly also where compiled: a compiled
#: call costs 50-100 us of dispatch, which NumPy's passes over such arrays, held in cache, do not
#: (one core, float32: the MNIST MLP's 300 x 500 chains took as long either way over whole
#: batches, LeNet-5's dense layers' 120 x 500 and 84 x 500 longer compiled, its convolutions'
#: 4,704 x 500 and 6 x 392,000 4-15x less: docs page "Results", the compiled path)
MIN_SIZE = 2**18

_F = TypeVar("_F", bound=Callable[..., Any])


class _Caps(Protocol):
    """The fast backend's settings that a way of running checks and hands its solvers
    (``FastBackend``, which imports this module)."""

    @property
    def w_steps(self) -> int | tuple[int, ...] | None: ...

    @property
    def x_steps(self) -> int | tuple[int, ...] | None: ...

    @property
    def max_iter(self) -> int: ...

    @property
    def capped_residual(self) -> bool: ...

    @property
    def capped_value(self) -> bool: ...


# --- the chains ----------------------------------------------------------------------------------
def row_derivs(
    act: Activation, lam: float, V: Array, U: Array, dU: Array, t: float
) -> tuple[Array, Array]:
    """``(d1, d2)``, columns: ``lam sum_j (phi(u_j) - v_j) du_j`` and ``lam sum_j phi'(u_j)
    du_j^2`` per row at ``U + t dU`` (the first and second derivatives in t of the rows'
    divergence term ``lam sum_j B(v_j, u_j)``; row dots by ``vecdot``: no product array)."""
    xp = array_namespace(U)
    Ut = t * dU
    Ut += U
    d1 = vecdot(act.grad_u(V, Ut), dU)
    d2 = vecdot(act.dphi(Ut) * dU, dU)
    return lam * xp.reshape(d1, (-1, 1)), lam * xp.reshape(d2, (-1, 1))


def row_curv(act: Activation, lam: float, U: Array, dU: Array) -> Array:
    """``row_derivs``'s second part at ``t = 0``: ``lam sum_j phi'(u_j) du_j^2`` per row."""
    xp = array_namespace(U)
    return lam * xp.reshape(vecdot(act.dphi(U) * dU, dU), (-1, 1))


def row_change(
    act: Activation, lam: float, V: Array, U: Array, dU: Array, t: float
) -> tuple[Array, Array]:
    """``(change, size)``, columns: the rows' divergence term's change from U to ``U + t dU``,
    ``lam sum_j [F*(u_j + t du_j) - F*(u_j) - v_j t du_j]``, and the size of the terms it sums,
    ``lam sum_j |F*(u_j)|`` (its rounding scale). F*(u) of a fresh array is itself fresh: the
    difference is formed in it in place."""
    xp = array_namespace(U)
    step = t * dU
    base = act.Fstar(U)
    diff = act.Fstar(U + step)
    diff -= base
    step *= V
    diff -= step
    return (
        lam * xp.sum(diff, axis=1, keepdims=True),
        lam * xp.sum(xp.abs(base), axis=1, keepdims=True),
    )


def row_derivs_change(
    act: Activation, lam: float, V: Array, U: Array, dU: Array, t: float
) -> tuple[Array, Array, Array, Array]:
    """``row_derivs`` and ``row_change`` at the same ``t``, ``(d1, d2, change, size)``: a line
    search's trial and its descent safeguard in one chain (compiled: one pass over U and dU)."""
    return (*row_derivs(act, lam, V, U, dU, t), *row_change(act, lam, V, U, dU, t))


def fista_step(
    prox: Callable[..., tuple[Array, Array | None]],
    act: Activation,
    Gy: Array,
    point: tuple[Array, Array | None, float | Array],
    lengths: tuple[float | Array, float | Array],
    tauU: Array,
    state: Array | None = None,
    momentum: bool = True,
) -> tuple[Array, Array | None, Array, Array, Array]:
    """One proximal-gradient step of an X-block from FISTA's point ``y = z + beta (z - z_prev)``
    (``point = (z, z_prev, beta)``, ``beta`` one number or one per column; ``z_prev`` None: y is
    z), formed here, inside the chain: ``(zn, state, max D, min D, D . dz)`` with
    ``zn = prox(y - Gy / L + tau U_prev)`` (``lengths = (1 / L, tau)``, ``tauU = tau U_prev``),
    ``D = zn - y`` and ``dz = zn - z``; y, D and dz are not kept (a pass each less to write,
    and compiled, the extrapolation's passes fuse with the step's). ``D . dz``, one per column
    (0 where no next step takes ``momentum``), decides each column's restart; max D and min D
    are the stopping proxy's.
    ``prox(xp, act, r, tau, state) -> (z, state)`` may scale its fresh argument ``r`` in place
    (``fast.xblocks``)."""
    (z, z_prev, beta), (inv_L, tau) = point, lengths
    xp = array_namespace(z)
    y = extrapolated(z, z_prev, beta)
    r = Gy * (-inv_L)
    r += y
    r += tauU
    zn, state = prox(xp, act, r, tau, state)
    D = zn - y
    dz = D if z_prev is None else zn - z
    Ddz = vecdot(D, dz, axis=-2) if momentum else xp.zeros((), dtype=D.dtype, device=device(D))
    return zn, state, xp.max(D), xp.min(D), Ddz


def extrapolated(z: Array, z_prev: Array | None, beta: float | Array) -> Array:
    """FISTA's momentum point ``z + beta (z - z_prev)`` (``beta`` one number or one per
    column), in a fresh array; z itself where ``z_prev`` is None (no momentum: the first step,
    or a restart of every column)."""
    if z_prev is None:
        return z
    y = z - z_prev
    y *= beta
    y += z
    return y


def scaled_grad_u(act: Activation, lam: float, V: Array, U: Array) -> Array:
    """``lam (phi(U) - V)``: ``lam dB/du``, the smooth term's gradient of a hidden X-block in
    ``U = A(W, Z)``."""
    G = act.grad_u(V, U)
    G *= lam
    return G


# --- how they run ---------------------------------------------------------------------------------
class Kernels:
    """Runs the chains: ``kernels(chain)(*args)`` gives what ``chain(*args)`` gives."""

    name = "eager"
    compiled = False

    def __call__(self, chain):
        return chain

    def fuses(self, *arrays: Array) -> bool:
        """Whether a chain on these arrays runs as one compiled kernel (one pass over them)."""
        return False

    def region(self, step: _F) -> _F:
        """Runs a solver's loop body: ``kernels.region(step)(*args)`` gives what ``step(*args)``
        gives (``whole.Blocks`` compiles it once for all its calls in a block's graph)."""
        return step

    def on_compile(self, callback: Callable[[str | None], object]) -> Callable[[], None]:
        """Call ``callback(name)`` when dynamo starts compiling the chain ``name`` and
        ``callback(None)`` when it is done (the progress bar shows the compile step by it), where
        this way compiles (``compiled``; ``watch``). -> the function that stops the calls."""
        return watch(callback) if self.compiled else _nothing

    def check_arrays(self, xp: ModuleType) -> None:
        """Refuse, before any work, arrays of a library this way of running cannot take."""

    def check_backend(self, backend: _Caps) -> None:
        """Refuse, when the backend is built, settings this way of running cannot take."""

    def solve(
        self,
        solver: Callable[..., tuple[Array, int, dict[str, Any]]],
        block: Block,
        backend: _Caps,
        xp: ModuleType,
        Z: Array,
        tol: float,
    ) -> tuple[Array, int, dict[str, Any]]:
        """``solver(block, backend, xp, Z, tol)``: a block solve of ``fast`` (``whole.Blocks``
        compiles the whole solve instead)."""
        return solver(block, backend, xp, Z, tol)

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"

    def __reduce__(self):
        """A copy for another process (a rank) is made as this one was, with none of the
        kernels compiled here: each process compiles its own."""
        return type(self), ()


#: the reference: each chain as written, in the arrays' own library
EAGER = Kernels()


def _nothing() -> None:
    return None


#: who hears of the chains' compiles in this process (``watch``): its compiled kernels serve
#: every backend, and so do the notices
_WATCHERS: list[Callable[[str | None], object]] = []
#: the chain whose compiled call runs in this thread (``Compiled``), which dynamo's compile
#: callbacks name
_RUNNING = threading.local()


def watch(callback: Callable[[str | None], object]) -> Callable[[], None]:
    """``Kernels.on_compile`` of the compiled ways: ``callback`` hears of every chain that
    compiles in this process from now on. -> the function that stops it."""
    _WATCHERS.append(callback)

    def stop() -> None:
        if callback in _WATCHERS:
            _WATCHERS.remove(callback)

    return stop


def _compile_started(args):
    """Dynamo's compile-start callback (``Compiled``): the chain running in this thread, told."""
    if (chain := getattr(_RUNNING, "chain", None)) is not None:
        _tell(chain)


def _compile_ended(args):
    if getattr(_RUNNING, "chain", None) is not None:
        _tell(None)


def _hear_dynamo():
    """Register the two callbacks above with dynamo where they are not (``torch._dynamo.reset``
    clears them). Dynamo runs them at every compile: a first call; a new dtype, shape or
    constant; a kernel loaded from the disk cache."""
    from torch._dynamo.callback import callback_handler as handler

    if _compile_started not in handler.start_callbacks:
        handler.register_start_callback(_compile_started)
        handler.register_end_callback(_compile_ended)


def _tell(name):
    for callback in list(_WATCHERS):
        callback(name)


@contextlib.contextmanager
def _running(name):
    """While the body runs, dynamo's compiles in this thread are told as compiles of ``name``
    (``_hear_dynamo``)."""
    _hear_dynamo()
    _RUNNING.chain = name
    try:
        yield
    finally:
        _RUNNING.chain = None


def room_for_variants(torch: ModuleType) -> None:
    """Room for every dtype, activation and kind of block a process compiles a function for,
    beyond dynamo's default of 8 compiled variants per function."""
    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)


#: the C++ compilers inductor's CPU kernels can use, any one on the PATH
CXX = ("c++", "g++", "clang++")


def compiler_available() -> bool:
    """Whether PyTorch is installed and a C++ compiler is on the PATH, found without importing
    PyTorch (``Auto``; ``compiler_problem`` imports it and says what is missing)."""
    return importlib.util.find_spec("torch") is not None and any(shutil.which(cc) for cc in CXX)


def compiler_problem() -> str | None:
    """Why ``torch.compile`` cannot run here (what to install), or None where it can: PyTorch
    importable, and a C++ compiler on the PATH for inductor's CPU kernels."""
    try:
        import torch  # noqa: F401
    except ImportError:
        return (
            "PyTorch is not installed: pip install torch (the CPU build: "
            "pip install torch==2.13.0; or the extra: pip install 'fenchel_cvx[bench]')"
        )
    if not any(shutil.which(cc) for cc in CXX):
        return (
            "no C++ compiler on the PATH (c++, g++ or clang++), which torch.compile needs for "
            "its CPU kernels: install one (Debian / Ubuntu: apt-get install g++)"
        )
    return None


def require_compiler() -> None:
    """Refuse ``compile=True``, naming what to install, where ``compiler_problem`` finds one."""
    problem = compiler_problem()
    if problem is not None:
        raise ValueError(f"compile=True needs torch.compile: {problem}")


class Compiled(Kernels):
    """Each chain through ``torch.compile(fullgraph=True)`` on torch views of NumPy arrays (or
    on torch tensors as given), once per dtype and set of constant arguments (an activation's
    class and parameters, a prox) and for the shapes met (module doc). ``mode``: torch.compile's
    (None: its default). ``min_size``: chains whose largest NumPy array has fewer entries run
    eagerly (``MIN_SIZE``; 0: every chain compiled).

    Arguments: arrays become tensors (no copy), Python floats 0-d tensors of the first
    array's dtype (so that a new step length is no new kernel), and anything else (activation
    objects, functions, ints, bools, None) a constant of the trace. Results: tensors come back
    as NumPy arrays (no copy) where the arguments were NumPy arrays.
    """

    name = "compiled"
    compiled = True

    def __init__(self, mode=None, min_size=MIN_SIZE):
        require_compiler()
        import torch

        self.torch, self.mode = torch, mode
        room_for_variants(torch)
        self._compiled, self._failed = {}, {}
        self.min_size = min_size
        # dynamo notes each of array_api_compat's lru_cache helpers that it traces through
        # (harmless: they only map a type to its namespace); not repeated at every compile
        warnings.filterwarnings(
            "ignore", message="Dynamo detected a call to a", category=UserWarning
        )

    def __repr__(self) -> str:
        return f"Compiled(mode={self.mode!r}, min_size={self.min_size!r})"

    def __reduce__(self):
        return type(self), (self.mode, self.min_size)

    def check_arrays(self, xp: ModuleType) -> None:
        from array_api_compat import is_numpy_namespace, is_torch_namespace

        if not (is_numpy_namespace(xp) or is_torch_namespace(xp)):
            name = getattr(xp, "__name__", str(xp))
            raise ValueError(
                f"compile=True runs on NumPy arrays or PyTorch tensors, got arrays "
                f"of {name}: use compile=False for them"
            )

    @property
    def compiles(self) -> int:
        """How many kernels dynamo has compiled in this process (recompilations included)."""
        return compiled_graphs()

    def fuses(self, *arrays: Array) -> bool:
        return not self.min_size or _largest(arrays, _numpy(), self.torch) >= self.min_size

    def __call__(self, chain):
        run = self._compiled.get(chain)
        if run is None:
            run = self._compiled[chain] = self._wrap(chain)
        return run

    def _wrap(self, chain):
        torch, np_ = self.torch, _numpy()
        fn = torch.compile(chain, fullgraph=True, mode=self.mode)

        @functools.wraps(chain)
        def run(*args, **kwargs):
            if self.min_size and _largest(args, np_, torch) < self.min_size:
                return chain(*args, **kwargs)
            # a failure is kept by chain and by the classes of its constant arguments (an
            # activation, a prox): another activation may still compile
            key = (
                chain,
                tuple(
                    type(a)
                    for a in args
                    if not (type(a) in (np_.ndarray, float) or hasattr(a, "shape"))
                ),
            )
            if key in self._failed:
                return chain(*args, **kwargs)
            conv, numpy_in = _for_trace(torch, np_, args)
            kwargs = {
                k: _from_numpy(torch, v) if type(v) is np_.ndarray else v for k, v in kwargs.items()
            }
            try:
                with _running(chain.__name__):  # told as compiles of chain
                    out = fn(*conv, **kwargs)
            except Exception as err:  # noqa: BLE001 - any compiler failure: run eagerly
                self._failed[key] = f"{type(err).__name__}: {err}"
                warnings.warn(
                    f"torch.compile failed on {chain.__module__}.{chain.__qualname__} "
                    f"({self._failed[key].splitlines()[0][:300]}); it runs eagerly "
                    f"from now on for these arguments",
                    RuntimeWarning,
                    stacklevel=2,
                )
                return chain(*args, **kwargs)
            return _to_numpy(out) if numpy_in else out

        return run


class Auto(Kernels):
    """``compile="auto"``: each chain through the process's shared ``Compiled()`` where PyTorch
    and a C++ compiler are present (``compiler_available``) and the chain's largest NumPy array
    has at least ``MIN_SIZE`` entries, eagerly otherwise: chains too small to gain, arrays of
    other libraries (CuPy, array-api-strict), a machine without the compiler. PyTorch is
    imported at the first chain that compiles: a run that meets none never loads it. A chain
    that fails to compile runs eagerly, with ``Compiled``'s warning."""

    name = "auto"

    def __init__(self):
        self.compiled = compiler_available()  # may compile: the chains' fixed-shape forms
        self._runs = {}

    def fuses(self, *arrays: Array) -> bool:
        return self.compiled and _largest(arrays, _numpy()) >= MIN_SIZE

    def __call__(self, chain):
        if not self.compiled:
            return chain
        run = self._runs.get(chain)
        if run is None:
            run = self._runs[chain] = self._wrap(chain)
        return run

    @staticmethod
    def _wrap(chain):
        np_ = _numpy()

        @functools.wraps(chain)
        def run(*args, **kwargs):
            if _largest(args, np_) < MIN_SIZE:
                return chain(*args, **kwargs)
            return _compiled_default()(chain)(*args, **kwargs)

        return run


def _largest(args, np_, torch=None):
    """The most entries of any NumPy array among ``args`` (and of any torch tensor, given
    ``torch``): what decides whether a chain is large enough to compile (``MIN_SIZE``)."""
    flat = _flat(args) if any(type(a) is tuple for a in args) else args
    sizes = [a.size for a in flat if type(a) is np_.ndarray]
    if torch is not None:
        sizes += [a.numel() for a in flat if isinstance(a, torch.Tensor)]
    return max(sizes, default=0)


def _for_trace(torch, np_, args):
    """``(args, numpy_in)``: a chain's arguments as ``Compiled`` traces them (NumPy arrays as
    tensors, no copy; Python floats as 0-d tensors of the first floating array's dtype; the
    entries of tuple arguments alike; anything else as it is), and whether any was a NumPy
    array (the results then come back as NumPy arrays). Called at every chain's call: one pass
    for the arrays, one for the floats, no tensor made twice."""
    dtype, numpy_in = None, False

    def arrays(a):
        nonlocal dtype, numpy_in
        if type(a) is np_.ndarray:
            t, numpy_in = _from_numpy(torch, a), True
            if dtype is None and a.dtype.kind == "f":
                dtype = t.dtype
            return t
        return tuple(arrays(b) for b in a) if type(a) is tuple else a

    def floats(a):
        if type(a) is float:
            return torch.tensor(a, dtype=dtype or torch.float64)
        return tuple(floats(b) for b in a) if type(a) is tuple else a

    conv = [arrays(a) for a in args]
    return [floats(a) for a in conv], numpy_in


def _flat(args):
    """``args`` with the entries of its tuples in their place (one level: a chain's arguments
    are arrays, numbers, constants and tuples of those)."""
    return [b for a in args for b in (a if type(a) is tuple else (a,))]


def compiled_graphs() -> int:
    """How many kernels dynamo has compiled in this process (0 where PyTorch was never loaded:
    ``Auto`` loads it at the first chain it compiles)."""
    torch = sys.modules.get("torch")
    return 0 if torch is None else int(torch._dynamo.utils.counters["stats"]["unique_graphs"])


def _numpy():
    import numpy

    return numpy


def _from_numpy(torch, a):
    """A torch view of the NumPy array ``a`` (no copy; a read-only array is viewed all the same:
    the chains never write into their arguments)."""
    if not a.flags.writeable:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            return torch.from_numpy(a)
    return torch.from_numpy(a)


def _to_numpy(out):
    if isinstance(out, tuple):
        return tuple(_to_numpy(o) for o in out)
    return out.numpy() if hasattr(out, "numpy") else out


@functools.cache
def _compiled_default():
    return Compiled()


#: the ``Kernels`` classes of the named ``compile`` settings other than "auto", by name
#: (``whole`` adds "blocks")
NAMED: dict[str, type[Kernels]] = {}


def kernels(compile: bool | str | Kernels) -> Kernels:
    """The ``Kernels`` of a ``compile`` setting: ``"auto"`` an ``Auto()`` (compiled where that
    is possible and gains), False the reference ``EAGER``, True the process's shared
    ``Compiled()`` (its kernels serve every backend; refused without PyTorch and a C++
    compiler), ``"blocks"`` a ``whole.Blocks()`` (each block solve compiled whole, on PyTorch
    tensors), or a ``Kernels``."""
    if isinstance(compile, Kernels):
        return compile
    if isinstance(compile, str) and compile == "auto":
        return Auto()
    if isinstance(compile, str) and compile in NAMED:
        return NAMED[compile]()
    if compile is True:
        require_compiler()  # checked at every request: the shared runner may exist already
        return _compiled_default()
    if compile is False:
        return EAGER
    raise ValueError(
        f"compile must be 'auto', 'blocks', True, False or a fenchel_cvx.fast.fused.Kernels, "
        f"got {compile!r}"
    )
