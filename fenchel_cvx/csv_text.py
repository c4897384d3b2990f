"""The CSV input of ``fenchel-cvx predict`` (``files.read_points`` is the entry point), read
within the read budget in two streaming passes: the first counts the rows and the first row's
numbers, whose float64 bytes are charged against the read budget before any array is
allocated; the second fills an array of exactly that size a block at a time. Blank lines and lines
that start with '#' are skipped; a byte that is not UTF-8, a cell that is not a number or a row
of another length is refused by name (a :class:`~fenchel_cvx.errors.FileFormatError`). No
equation of the paper is implemented here.
"""

from __future__ import annotations

import numpy as np

from . import budget
from .errors import FileFormatError

#: the bytes read, decoded and split at once (cut after the block's last newline)
_BLOCK_BYTES = 1 << 18
#: rows converted to float64 at once in the second pass
_ROWS_AT_ONCE = 1 << 14


def _csv_blocks(path):
    """The rows of numbers of the CSV file ``path`` (its lines less blank lines and lines that
    start with '#'), a list for each block of about ``_BLOCK_BYTES`` read (cut after a newline);
    a byte that is not UTF-8 is refused by its offset in the file."""
    offset, rest = 0, b""
    with open(path, "rb") as f:
        while True:
            data = f.read(_BLOCK_BYTES)
            buf = rest + data
            cut = buf.rfind(b"\n") + 1 if data else len(buf)
            part, rest = buf[:cut], buf[cut:]
            try:
                text = part.decode("utf-8")
            except UnicodeDecodeError as err:
                raise FileFormatError(
                    path,
                    f"byte {offset + err.start}",
                    "UTF-8 text (CSV of numbers)",
                    f"the byte {part[err.start : err.start + 1]!r}",
                ) from None
            offset += cut
            yield [line for line in text.splitlines() if line.strip() and line[0] != "#"]
            if not data:
                return


def _read_csv(path):
    """The numbers of the CSV file ``path`` as a float64 array, in two streaming passes: the
    first counts the rows and row 1's numbers, whose float64 bytes are charged against the read
    budget; the second fills an array of exactly that size block by block. Memory: the array and
    one block."""
    rows = columns = 0
    for block in _csv_blocks(path):
        if block and not rows:
            columns = block[0].count(",") + 1
        rows += len(block)
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
    for block in _csv_blocks(path):
        if len(block) > rows - i:  # the file grew since it was counted
            i = rows + 1
            break
        for j in range(0, len(block), _ROWS_AT_ONCE):
            lines = block[j : j + _ROWS_AT_ONCE]
            out[i : i + len(lines)] = _rows(path, lines, i, columns)
            i += len(lines)
    if i != rows:
        raise FileFormatError(
            path, "rows", f"{rows} rows (as when counted)", f"{i}: the file changed while read"
        )
    return out


def _rows(path, lines, before, columns):
    """The numbers of ``lines`` (rows ``before + 1, ...`` of ``path``) as a float64 array of
    ``columns`` a row: converted at once by ``float`` into one array, and where any row is not
    ``columns`` numbers, row by row to name the first that is not."""
    if all(line.count(",") == columns - 1 for line in lines):
        cells = ",".join(lines).split(",")
        try:
            return np.fromiter(map(float, cells), np.float64, len(cells)).reshape(-1, columns)
        except ValueError:
            pass
    for i, line in enumerate(lines, before + 1):
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
    raise AssertionError("a block that NumPy refused and float accepted")  # pragma: no cover


def _is_float(text):
    try:
        float(text)
    except ValueError:
        return False
    return True
