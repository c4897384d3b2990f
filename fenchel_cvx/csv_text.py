"""The CSV input of ``fenchel-cvx predict`` (``files.read_points`` is the entry point), read
within the read budget in two streaming passes: the first counts the rows and the first row's
numbers, whose float64 bytes are charged against the read budget before any array is
allocated; the second fills an array of exactly that size row by row. Blank lines and lines
that start with '#' are skipped; a byte that is not UTF-8, a cell that is not a number or a row
of another length is refused by name (a :class:`~fenchel_cvx.errors.FileFormatError`). No
equation of the paper is implemented here.
"""

from __future__ import annotations

import numpy as np

from . import budget
from .errors import FileFormatError


def _csv_lines(path):
    """The rows of numbers of the CSV file ``path`` (its lines less blank lines and lines that
    start with '#'), streamed line by line; a byte that is not UTF-8 is refused by offset."""
    offset = 0
    with open(path, "rb") as f:
        for raw in f:
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as err:
                raise FileFormatError(
                    path,
                    f"byte {offset + err.start}",
                    "UTF-8 text (CSV of numbers)",
                    f"the byte {raw[err.start : err.start + 1]!r}",
                ) from None
            offset += len(raw)
            for line in text.splitlines():
                if line.strip() and not line.startswith("#"):
                    yield line


def _read_csv(path):
    """The numbers of the CSV file ``path`` as a float64 array, in two streaming passes: the
    first counts the rows and row 1's numbers, whose float64 bytes are charged against the read
    budget; the second fills an array of exactly that size row by row. Memory: the array and
    one line."""
    rows = columns = 0
    for line in _csv_lines(path):
        rows += 1
        if rows == 1:
            columns = line.count(",") + 1
    if not rows:
        raise FileFormatError(path, "", "at least one row of numbers", "no rows")
    budget.check_declared(
        path,
        "rows",
        budget.bounded_product([rows, columns, 8], budget.read_budget()),
        f"float64 bytes ({rows:,} rows of {columns:,} numbers)",
    )
    out = np.empty((rows, columns))
    i = 0
    for i, line in enumerate(_csv_lines(path), 1):
        if i > rows:
            break
        cells = line.split(",")
        try:
            values = [float(c) for c in cells]
        except ValueError:
            bad = next(c for c in cells if not _is_float(c))
            raise FileFormatError(
                path, f"row {i}", "comma-separated numbers", f"{bad.strip()[:80]!r}"
            ) from None
        if len(values) != columns:
            raise FileFormatError(
                path, f"row {i}", f"{columns} numbers (as row 1)", f"{len(values)}"
            )
        out[i - 1] = values
    if i != rows:
        raise FileFormatError(
            path, "rows", f"{rows} rows (as when counted)", f"{i}: the file changed while read"
        )
    return out


def _is_float(text):
    try:
        float(text)
    except ValueError:
        return False
    return True
