"""Host copies of arrays from any array library (NumPy, CuPy, array-api-strict, DLPack)."""
import numpy as np


def to_numpy(A) -> np.ndarray:
    """A NumPy copy of an array of any array library (CuPy's ``.get()``, DLPack otherwise)."""
    if isinstance(A, np.ndarray):
        return A
    if hasattr(A, "get") and type(A).__module__.startswith("cupy"):
        return A.get()
    try:
        return np.asarray(A)
    except (TypeError, ValueError, RuntimeError):
        return np.from_dlpack(A)
