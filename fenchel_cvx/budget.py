"""The read budget: what a file declares is costed before anything is allocated.

Every reader of the package (``files``, ``datasets``, ``io``, ``checkpoints``, the CLI) judges a
file by what it *declares* (shapes, element counts, directory entries, string lengths, nesting,
pickle opcodes) in the stored dtype, uncompressed, before it reads or allocates it, and refuses
it by name (a :class:`~fenchel_cvx.errors.FileFormatError` naming the file and the field) where

- the declared bytes exceed the read budget: ``FENCHEL_READ_BUDGET`` bytes (an integer, or with
  a suffix K, M, G: ``512M``), default 2 GiB; MNIST's 47 MB of IDX bytes are 376 MB as
  float64, well within it;
- a compressed member declares more than :data:`MAX_RATIO` times its stored bytes.

Products of declared sizes are taken with :func:`bounded_product`, which stops as soon as the
running product passes the budget: a shape of two 8 MB integers costs two comparisons, not
hours of big-integer arithmetic. No equation of the paper is implemented here.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from .errors import FileFormatError

#: the read budget without ``FENCHEL_READ_BUDGET``: 2 GiB
DEFAULT_BUDGET = 2 << 30
#: the largest declared size a compressed member may have per stored byte
MAX_RATIO = 1000
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def read_budget() -> int:
    """The bytes a single file may declare: ``FENCHEL_READ_BUDGET`` (an integer of bytes, or
    with a suffix K, M, G or T), default :data:`DEFAULT_BUDGET`. A malformed value is refused
    naming the variable."""
    text = os.environ.get("FENCHEL_READ_BUDGET", "").strip()
    if not text:
        return DEFAULT_BUDGET
    digits, unit = (text[:-1], text[-1].upper()) if text[-1].isalpha() else (text, "")
    if unit not in _UNITS or not digits.isascii() or not digits.isdigit() or len(digits) > 18:
        raise ValueError(
            f"FENCHEL_READ_BUDGET must be a number of bytes (optionally with K, M, G or T), "
            f"got {text!r}"
        )
    return int(digits) * _UNITS[unit]


def bounded_product(factors: Iterable[int], limit: int) -> int | None:
    """The product of the non-negative integers ``factors``, or None as soon as it passes
    ``limit`` (a zero factor anywhere still gives 0). Each factor is compared with ``limit``
    before it is multiplied, so no intermediate exceeds ``limit ** 2``."""
    product, over = 1, False
    for f in factors:
        if f == 0:
            return 0
        if over or f > limit:
            over = True
            continue
        product *= f
        over = product > limit
    return None if over else product


def check_declared(path: str | os.PathLike[str], field: str, nbytes: int | None, what: str) -> int:
    """``nbytes`` (None: beyond any product :func:`bounded_product` takes) once it is within
    the read budget; else a ``FileFormatError`` naming ``path``, ``field`` and ``what`` the file
    declares."""
    budget = read_budget()
    if nbytes is None or nbytes > budget:
        found = "more than that" if nbytes is None else f"{nbytes:,} bytes"
        raise FileFormatError(
            path,
            field,
            f"{what} within the read budget of {budget:,} bytes",
            found,
            "FENCHEL_READ_BUDGET raises the budget",
        )
    return nbytes


def check_ratio(path: str | os.PathLike[str], field: str, declared: int, stored: int) -> None:
    """Refuse a compressed member that declares more than :data:`MAX_RATIO` times its stored
    bytes (a decompression bomb), naming ``path`` and ``field``."""
    if declared > MAX_RATIO * max(stored, 1):
        raise FileFormatError(
            path,
            field,
            f"at most {MAX_RATIO} declared bytes per stored byte",
            f"{declared:,} declared from {stored:,} stored",
        )
