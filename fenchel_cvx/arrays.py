"""Arrays of any array library (NumPy, CuPy, PyTorch, array-api-strict, DLPack): their library,
host copies; a NumPy array of data points formed by threads (:func:`by_points`), and any work
on slices of columns on threads (:func:`by_slices`)."""

import functools
import weakref
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from types import ModuleType
from typing import Any, TypeAlias, TypeVar

import numpy as np
from array_api_compat import array_namespace, is_cupy_array, is_numpy_namespace, is_torch_array

# An array of any array library (NumPy, CuPy, array-api-strict, a PyTorch tensor): the array API
# has no static type that all of them share, so type hints name it for the reader only.
Array: TypeAlias = Any

#: the data points a thread of :func:`by_points` forms at a time, and the fewest a thread takes
POINTS_CHUNK = 2048


def namespace(A: object) -> ModuleType:
    """The array library of ``A``: that of a CuPy array or a PyTorch tensor (which have no
    ``__array_namespace__`` of their own; array_api_compat's wrappers) or of an array-API array,
    else NumPy (NumPy arrays and scalars, and anything NumPy converts: lists, numbers, pandas
    frames). A tensor keeps its library and its device: the fast backend trains on it there.

    >>> import array_api_strict
    >>> namespace([1.0, 2.0]) is np, namespace(array_api_strict.asarray([1.0])).__name__
    (True, 'array_api_strict')
    """
    if (
        is_cupy_array(A)
        or is_torch_array(A)
        or (not isinstance(A, (np.ndarray, np.generic)) and hasattr(A, "__array_namespace__"))
    ):
        return array_namespace(A)
    return np


def cheap_reads(xp: ModuleType) -> bool:
    """Whether reading a value of ``xp``'s arrays back to the host (``float(x)``, ``bool(x)``)
    costs nothing worth avoiding: NumPy, whose arrays are on the host. Elsewhere (CuPy on a GPU;
    array_api_strict, which stands in for one in the tests) each read waits for the device and
    keeps a batch from running as one captured graph, so the fast solvers take their decisions
    there on the device (``fast.reads`` counts the reads that remain).

    >>> import array_api_strict
    >>> cheap_reads(np), cheap_reads(array_api_strict)
    (True, False)
    """
    return is_numpy_namespace(xp)


def host_if_cheap(
    xp: ModuleType, x: Array, cast: Callable[[Array], float] = float
) -> float | Array:
    """The 0-d array ``x`` as a Python number (``cast``) where reads are cheap
    (``cheap_reads``), else ``x`` itself, left on the device: a figure that decides nothing on
    the host (a bound, a counter) is read back only where that costs nothing.

    >>> import array_api_strict as xps
    >>> host_if_cheap(np, np.sum(np.ones(3)))  # a Python float
    3.0
    >>> host_if_cheap(xps, xps.sum(xps.ones(3)))  # left where it is
    Array(3., dtype=array_api_strict.float64)
    """
    return cast(x) if cheap_reads(xp) else x


def clip(x: Array, min: float | Array | None = None, max: float | Array | None = None) -> Array:
    """``x`` clipped to ``[min, max]`` (either or both may be None; bounds are numbers or arrays
    of x's dtype) in its own library. For CuPy arrays, CuPy's own elementwise kernel:
    array_api_compat's portable ``clip`` compares, masks and assigns there, several kernels and a
    host sync per call (0.3 ms; measured on an H100). For NumPy arrays, NumPy's own functions:
    the portable ``clip`` broadcasts its bounds first, twice the time of ``np.maximum`` on a
    300 x 500 float32 array (a hot path of the X- and W-blocks). A one-sided number bound of a
    floating array runs as ``np.clip`` with an infinite other bound, whose loop is vectorised
    where ``np.maximum``'s with a number is not (float32, 4,704 x 500, one core of the 2-core
    VM, 2026-11-28: 0.23 against 0.74 ms). The same values, NaN and infinities; a zero keeps
    its sign (``np.maximum(-0.0, 0.0)`` is +0.0). An array bound keeps ``np.maximum``, faster
    there.

    >>> x = np.array([-1.0, 0.5, 2.0])
    >>> clip(x, min=0.0), clip(x, max=np.array([0.0, 0.0, 1.0])), clip(x) is x
    (array([0. , 0.5, 2. ]), array([-1.,  0.,  1.]), True)
    """
    if min is None and max is None:  # CuPy 13 refuses clip(x, None, None)
        return x
    if isinstance(x, np.ndarray):
        one_sided = max if min is None else min if max is None else None
        if one_sided is not None and np.ndim(one_sided) == 0 and x.dtype.kind == "f":
            return np.clip(x, -np.inf if min is None else min, np.inf if max is None else max)
        if max is None and min is not None:
            return np.maximum(x, min)
        if min is None and max is not None:
            return np.minimum(x, max)
        return np.clip(x, min, max)
    if is_cupy_array(x):
        import cupy

        return cupy.clip(x, min, max)
    return array_namespace(x).clip(x, min, max)


def exact_in_place(a: Array, b: Array | float | None = None) -> bool:
    """Whether ``a op= b`` (``a`` a fresh array the caller owns) gives what ``a op b`` gives:
    ``a`` of a real floating dtype, and ``b`` None, a Python number, or an array of a's shape
    and of no wider dtype. (On LeNet-5's 2.35 M-entry arrays a chain of fresh results takes
    twice the time of the same passes in place; an integer ``a`` or a wider or broadcast ``b``
    must be promoted instead.)

    >>> a = np.zeros((2, 3), np.float32)  # then: a wider b, a broadcast b, an integer a
    >>> exact_in_place(a, 2.0), exact_in_place(a, np.ones((2, 3), np.float32))
    (True, True)
    >>> exact_in_place(a, np.ones((2, 3))), exact_in_place(a, np.ones(3, np.float32))
    (False, False)
    >>> exact_in_place(np.zeros(3, np.int64))
    False
    """
    xp = array_namespace(a)
    if not xp.isdtype(a.dtype, "real floating"):
        return False
    if b is None or isinstance(b, (int, float)):
        return True
    return (
        hasattr(b, "shape") and tuple(b.shape) == tuple(a.shape) and xp.result_type(a, b) == a.dtype
    )


def vecdot(x1: Array, x2: Array, axis: int = -1) -> Array:
    """``sum(x1 * x2, axis)`` of two real arrays of one library, in it: NumPy's ``vecdot`` (one
    pass, no product array; down the columns of two matrices of one shape, ``einsum``, which
    adds each column's terms row after row (a column's sum came out the same, bit for bit, in
    matrices of 2 to 500 columns; a single column takes another path): 0.25 ms against
    ``vecdot``'s 2.4 ms for 4,704 x 250 in float32 on one core) and, for CuPy arrays, one fused
    reduction kernel in their common dtype; other libraries' own ``vecdot``. array_api_compat's
    portable ``vecdot``, which CuPy gets, moves the axis last and runs a batched matrix product
    of 1 x n by n x 1: 58 us of host time a call where the kernel's launch takes a few
    (measured on an H200; the fast backend calls it 124 times an MLP batch, 43 times a LeNet-5
    batch).

    >>> x1, x2 = np.array([[1.0, 2.0], [3.0, 4.0]]), np.array([[1.0, 1.0], [0.0, 1.0]])
    >>> vecdot(x1, x2), vecdot(x1, x2, axis=0)
    (array([3., 4.]), array([1., 6.]))
    """
    if isinstance(x1, np.ndarray) and isinstance(x2, np.ndarray):
        if x1.ndim == 2 and x1.shape == x2.shape and axis in (0, -2):  # down the columns
            return np.einsum("ij,ij->j", x1, x2)
        # NumPy's stubs give its gufuncs no ``axis``, which every gufunc takes (NumPy 2.4)
        return np.vecdot(x1, x2, axis=axis)  # type: ignore[call-overload]
    if is_cupy_array(x1) and is_cupy_array(x2):
        if x1.shape[axis] != x2.shape[axis]:  # the kernel would broadcast along the sum
            raise ValueError(
                f"vecdot needs x1 and x2 of one size along axis {axis}, got shapes "
                f"{tuple(x1.shape)} and {tuple(x2.shape)}"
            )
        dtype = np.result_type(x1.dtype, x2.dtype)
        return _cupy_vecdot()(x1.astype(dtype, copy=False), x2.astype(dtype, copy=False), axis=axis)
    if is_torch_array(x1) and is_torch_array(x2):  # torch's own: array_api_compat's costs 21 us
        import torch

        return torch.linalg.vecdot(x1, x2, dim=axis)
    return array_namespace(x1, x2).vecdot(x1, x2, axis=axis)


#: ``in_blocks`` pays for NumPy products whose shared length is at least ``NT_MIN_K`` and whose
#: result has at most ``NT_MAX_OUT`` entries, each block of both operands within about
#: ``NT_BLOCK_BYTES`` (at least 512 columns; one core, float32: 256 KiB blocks took LeNet-5's
#: W_0 gradient, 6 x 26 over 392,000, from 7.3 ms to 3.8, the Gram of its patches, 26 x 26,
#: from 15.3 to 9.6; 1 MiB blocks were slower than none; a 16 x 151 result over 50,000,
#: LeNet-5's W_1 gradient, was slower in blocks at any size)
NT_MIN_K, NT_MAX_OUT, NT_BLOCK_BYTES = 2**16, 2**10, 2**18


def in_blocks(A: Array, B: Array) -> int:
    """The width of the column blocks in which ``matmul_nt`` forms ``A @ B.T`` (A m x k, B
    n x k), or 0 where one product serves: other libraries' arrays, a short shared length, a
    large or empty result. Long, flat NumPy operands with a small result (LeNet-5's W_0
    gradient, 6 x 392,000 times 392,000 x 26) are summed over blocks of columns of both that
    stay in the core's cache together: OpenBLAS runs such a product whole at half the rate it
    reaches block by block.

    >>> long = np.empty((6, 2**17), np.float32), np.empty((26, 2**17), np.float32)
    >>> in_blocks(*long), in_blocks(np.ones((2, 3)), np.ones((4, 3)))
    (2048, 0)
    """
    (m, k), n = A.shape, B.shape[0]
    numpy = isinstance(A, np.ndarray) and isinstance(B, np.ndarray)
    if not numpy or k < NT_MIN_K or not 0 < m * n <= NT_MAX_OUT:
        return 0
    per_column = (m + n) * max(A.itemsize, B.itemsize)
    return 1 << max(9, (NT_BLOCK_BYTES // per_column).bit_length() - 1)


def matmul_nt(A: Array, B: Array) -> Array:
    """``A @ B.T`` for ``A`` (m x k) and ``B`` (n x k): summed over column blocks where that
    pays (``in_blocks``), else formed as ``(B @ A.T).T`` (13-20 % faster than ``A @ B.T`` where
    B is long and flat, as the patches of a convolution; one core).

    >>> A, B = np.arange(6.0).reshape(2, 3), np.ones((4, 3))
    >>> matmul_nt(A, B)
    array([[ 3.,  3.,  3.,  3.],
           [12., 12., 12., 12.]])
    """
    width = in_blocks(A, B)
    if not width:
        return (B @ A.T).T
    out = A[:, :width] @ B[:, :width].T
    for start in range(width, A.shape[1], width):
        out += A[:, start : start + width] @ B[:, start : start + width].T
    return out


#: columns of ``A`` a tile of :func:`transposed` copies at once
TRANSPOSE_TILE = 128


def transposed(A: np.ndarray, rows: np.ndarray | None = None, dtype: Any = None) -> np.ndarray:
    """``A[rows].T`` (all rows where ``rows`` is None) as a new C-ordered NumPy array of
    ``dtype`` (A's by default), copied by ``transposed_tiles``. NumPy's own copy of a transposed
    view reads one row in a stride of the whole matrix per element: MNIST's 718 x 60,000
    float64 inputs took 2.8-7.7 s that way and 0.18 s by tiles (one core of the 2-core Intel
    Xeon VM, 2026-12-04).

    >>> A = np.arange(6.0).reshape(2, 3)
    >>> transposed(A), transposed(A, np.array([1]), dtype=np.float32)
    (array([[0., 3.],
           [1., 4.],
           [2., 5.]]), array([[3.],
           [4.],
           [5.]], dtype=float32))
    """
    A = np.asarray(A)
    n = A.shape[0] if rows is None else len(rows)
    out = np.empty((A.shape[1], n), dtype=A.dtype if dtype is None else dtype)
    for j, tile in enumerate(transposed_tiles(A, rows, dtype)):
        out[j * TRANSPOSE_TILE : (j + 1) * TRANSPOSE_TILE] = tile
    return out


def transposed_tiles(
    A: np.ndarray, rows: np.ndarray | None = None, dtype: Any = None
) -> Iterator[np.ndarray]:
    """The rows of ``A[rows].T`` (of ``dtype``), ``TRANSPOSE_TILE`` at a time, each a C-ordered
    array copied from a tile of ``A``'s columns small enough to stay in cache (to write them
    one after the other, to a file say)."""
    A = np.asarray(A)
    for j in range(0, A.shape[1], TRANSPOSE_TILE):
        tile = A[:, j : j + TRANSPOSE_TILE]
        yield np.ascontiguousarray((tile if rows is None else tile[rows]).T, dtype=dtype)


@functools.cache
def _cupy_vecdot() -> Any:
    import cupy

    return cupy.ReductionKernel("T x, T y", "T z", "x * y", "a + b", "z = a", "0", "fenchel_vecdot")


def to_numpy(A: Array) -> np.ndarray:
    """A NumPy copy of an array of any array library (CuPy's ``.get()``, a tensor's ``.cpu()``,
    DLPack otherwise).

    >>> import array_api_strict
    >>> to_numpy(array_api_strict.asarray([1.0, 2.0])), to_numpy([1, 2])
    (array([1., 2.]), array([1, 2]))
    """
    if isinstance(A, np.ndarray):
        return A
    if hasattr(A, "get") and type(A).__module__.startswith("cupy"):
        return A.get()
    if is_torch_array(A):
        return A.detach().cpu().numpy()
    try:
        return np.asarray(A)
    except (TypeError, ValueError, RuntimeError):
        return np.from_dlpack(A)


#: ``id -> (a weak reference, its memo)`` of the arrays :func:`freeze` made read-only
_FROZEN: dict[int, tuple[Any, dict[str, Any]]] = {}


def freeze(A: Array) -> Array:
    """``A`` itself, read-only where it is a NumPy array that owns its bytes, and registered
    with a memo (:func:`frozen_memo`) for what is formed once from its bytes while it lives
    (``schedule.Batches``' X~_0, whose digest the oracle keeps: ``dask_rows.digest``). Other
    arrays come back as they are.

    >>> A = freeze(np.ones(3))
    >>> frozen_memo(A), frozen_memo(np.ones(3)), A.flags.writeable
    ({}, None, False)
    """
    if isinstance(A, np.ndarray) and A.base is None:
        A.flags.writeable = False
        ident = id(A)
        _FROZEN[ident] = (weakref.ref(A, lambda _: _FROZEN.pop(ident, None)), {})
    return A


def frozen_memo(A: Any) -> dict[str, Any] | None:
    """The memo of an array :func:`freeze` made read-only, while it is read-only still (a dict,
    released with the array); None for any other array."""
    ref, memo = _FROZEN.get(id(A), (None, None))
    return memo if ref is not None and ref() is A and not A.flags.writeable else None


def by_points(
    f: Callable[[Any], Any], X: Array, threads: int = 1, min_points: int | None = None
) -> Array:
    """``f(X)`` for an ``f`` that takes each data point (a column of ``X``) alone and lays out a
    point's result in its own columns, the points the last axis of the columns (a layer's
    patches, ``LinearMap.patches``, which ``testing.layer_faults`` checks; an activation,
    elementwise), on ``threads`` threads, at most one a ``min_points`` points (None:
    :data:`POINTS_CHUNK`). Each thread forms chunks of :data:`POINTS_CHUNK` points into their
    columns of the one array, whose pages the threads are the first to write (the data's patches,
    once a run where it is not batched: Figure 1's X~_0, 785 x 60,000, 377 MB; the feed-forward
    pass's activations). ``f`` runs no BLAS product (its pool is not limited here). NumPy arrays
    only (others: ``f(X)``).

    >>> X = np.arange(12.0).reshape(3, 4)
    >>> ones_below = lambda A: np.concatenate([A, np.ones((1, A.shape[1]))])
    >>> bool(np.array_equal(by_points(ones_below, X, threads=2, min_points=1), ones_below(X)))
    True
    """
    m = X.shape[1]
    running = max(1, min(threads, m // (min_points or POINTS_CHUNK)))
    if running == 1 or not isinstance(X, np.ndarray):
        return f(X)
    one = f(X[:, :1])
    out = np.empty((one.shape[0], one.shape[1] * m), dtype=one.dtype)
    points = out.reshape(one.shape[0], one.shape[1], m)  # (rows, a point's columns, points)

    def work(index: slice) -> None:
        points[:, :, index] = f(X[:, index]).reshape(one.shape[0], one.shape[1], -1)

    by_slices(work, m, min(POINTS_CHUNK, -(-m // running)), running)
    return out


T = TypeVar("T")


def by_slices(work: Callable[[slice], T], m: int, chunk: int, threads: int = 1) -> list[T]:
    """``work`` on each slice of ``chunk`` of ``m`` columns, on ``threads`` threads (at most
    one a slice; BLAS's pool as it is) -> the results in the slices' order.

    >>> by_slices(lambda k: (k.start, k.stop), 5, 2, threads=2)
    [(0, 2), (2, 4), (4, 6)]
    """
    slices = [slice(a, a + chunk) for a in range(0, m, chunk)]
    if threads <= 1 or len(slices) <= 1:
        return [work(k) for k in slices]
    with ThreadPoolExecutor(min(threads, len(slices))) as pool:
        return list(pool.map(work, slices))
