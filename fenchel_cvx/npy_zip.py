"""The ``.npy`` headers and zip directories of the package's files, read by hand within the
read budget before NumPy or ``zipfile`` read them (``files.NpzFile`` and ``files.read_points``
are the entry points):

- :func:`_npy_header`: a ``.npy`` header's magic string, version and length (at most
  :data:`MAX_NPY_HEADER` bytes), and its text read with a pattern of the dict NumPy writes
  (:func:`_npy_dict`; never evaluated, NumPy's own header parser never handed it);
- :func:`_declared_bytes`: the bytes a header declares, checked against the read budget
  (``budget.bounded_product``, ``budget.check_declared``) before any array is allocated;
- :func:`_read_data`: an array of exactly the declared size, filled in chunks from the stream;
- :func:`_check_zip_directory`: the zip's end record (and ZIP64 record) found as ``zipfile``
  finds it (:func:`_end_record`), the entries it declares and those its directory holds (at
  most :data:`MAX_MEMBERS`), the directory's bytes within the read budget, and every name
  flagged UTF-8 valid UTF-8.

Every refusal is a :class:`~fenchel_cvx.errors.FileFormatError` naming the file and the member.
No equation of the paper is implemented here.
"""

from __future__ import annotations

import math
import re
import struct

import numpy as np

from . import budget
from .errors import FileFormatError

#: the most members a network's or checkpoint's ``.npz`` may list (theirs: a few hundred at most)
MAX_MEMBERS = 4096
#: the longest ``.npy`` header read (NumPy writes a few hundred bytes at most)
MAX_NPY_HEADER = 1 << 16
#: the most digits of a dimension in a ``.npy`` header (2**64 has 20)
_MAX_DIGITS = 20
#: the most dimensions of a ``.npy`` array (NumPy's own limit)
_MAX_DIMS = 64
#: the bytes of an array read at a time
_CHUNK = 1 << 24
_NPY_MAGIC = b"\x93NUMPY"
_NPY_KEYS = ("descr", "fortran_order", "shape")
#: one entry of a ``.npy`` header's dict: a key, a quoted text, True/False or a tuple
_NPY_ENTRY = re.compile(
    r"\s*'(\w{1,32})'\s*:\s*('[^']{0,64}'|True|False|\([^()]*\))\s*(?:,|(?=\}))"
)
#: a plain dtype's code as NumPy writes it: '<f8', '|u1', '<U12', '<m8[ns]'
_NPY_DESCR = re.compile(r"[<>|=]?[A-Za-z][0-9]{0,10}(\[[A-Za-z0-9]{1,8}\])?")
_NPY_EXPECTED_ITEM = "'key': value"
_NPY_EXPECTED = (
    "a .npy header (the dict NumPy writes: {'descr': '<dtype>', 'fortran_order': False, "
    "'shape': (<integers>,)})"
)
_EOCD = struct.Struct("<4s4H2LH")  # a zip's end of central directory record
_LOCATOR64 = struct.Struct("<4sLQL")  # the ZIP64 end of central directory locator
_EOCD64 = struct.Struct("<4sQ2H2L4Q")  # the ZIP64 end of central directory record
_CENTRAL = struct.Struct("<4s4B4HL2L5H2L")  # a central directory entry's fixed part


def _shape_text(shape) -> str:
    """``shape`` as NumPy prints it: ``(2, 4)``, ``(5,)``, ``()``."""
    return str(tuple(shape))


def _npy_dict(text: str):
    """``(dtype, fortran, shape)`` of the text of a ``.npy`` header, or why it is not the dict
    NumPy writes (in words). Read with a pattern, never evaluated: a dimension has at most
    :data:`_MAX_DIGITS` digits and is converted only then, so nothing costs more than the
    header's length (itself at most :data:`MAX_NPY_HEADER`)."""
    body = text.rstrip(" \t\r\n\x00")
    if not body.startswith("{"):
        return f"text that is not a dict: {body[:40]!r}"
    if not body.endswith("}"):
        return "a dict left open (no closing '}')"
    items: dict[str, str] = {}
    pos = 1
    while (m := _NPY_ENTRY.match(body, pos)) is not None:
        key = m.group(1)
        if key not in _NPY_KEYS or key in items:
            return f"the key {key!r}{' twice' if key in items else ''}"
        items[key], pos = m.group(2), m.end()
    if body[pos:].strip() != "}":
        return f"{body[pos : pos + 40]!r} at character {pos} (not an entry {_NPY_EXPECTED_ITEM})"
    missing = [k for k in _NPY_KEYS if k not in items]
    if missing:
        return f"no {missing[0]!r} entry"
    descr, fortran, shape_text = items["descr"], items["fortran_order"], items["shape"]
    if not (descr[0] == "'" and _NPY_DESCR.fullmatch(descr[1:-1])):
        return f"the descr {descr[:40]} (not a plain dtype's code, e.g. '<f8')"
    try:
        dtype = np.dtype(descr[1:-1])
    except (TypeError, ValueError):
        return f"the descr {descr} (no NumPy dtype)"
    if fortran not in ("True", "False"):
        return f"the fortran_order {fortran[:40]} (not True or False)"
    if not shape_text.startswith("("):
        return f"the shape {shape_text[:40]} (not a tuple)"
    cells = shape_text[1:-1].split(",")
    if cells[-1].strip() == "":  # a trailing comma: (5,), (2, 4,); or no entry: ()
        cells.pop()
    elif len(cells) == 1:
        return f"the shape {shape_text[:40]} (not a tuple: a 1-d shape is written (n,))"
    if len(cells) > _MAX_DIMS:
        return f"a shape of {len(cells)} dimensions (NumPy's limit: {_MAX_DIMS})"
    dims = []
    for cell in cells:
        cell = cell.strip()
        if not (cell.isascii() and cell.isdigit()):
            return f"the dimension {cell[:40]!r} (not a non-negative integer)"
        if len(cell) > _MAX_DIGITS:
            return f"a dimension of {len(cell):,} digits (at most {_MAX_DIGITS})"
        dims.append(int(cell))
    return dtype, fortran == "True", tuple(dims)


def _npy_header(f, path, field):
    """``(shape, dtype, fortran, header_bytes)`` of the ``.npy`` at the start of the binary
    stream ``f``, which is left at the start of the data. The magic string, the version (1.0
    or 2.0), the header's length (at most :data:`MAX_NPY_HEADER`) and its text (the dict NumPy
    writes, :func:`_npy_dict`) are checked here, by reading at most that many bytes; NumPy's
    own header parser is never handed the text."""
    start = f.read(8)
    if len(start) < 8 or start[:6] != _NPY_MAGIC:
        raise FileFormatError(path, field, "the .npy magic string", repr(start[:6]))
    version = (start[6], start[7])
    if version not in ((1, 0), (2, 0)):
        raise FileFormatError(
            path, field, ".npy format version 1.0 or 2.0", f"version {version[0]}.{version[1]}"
        )
    width = 2 if version == (1, 0) else 4
    length = f.read(width)
    if len(length) < width:
        raise FileFormatError(path, field, "a .npy header length", "the file ends first")
    size = int.from_bytes(length, "little")
    if size > MAX_NPY_HEADER:
        raise FileFormatError(
            path,
            field,
            f"a .npy header of at most {MAX_NPY_HEADER:,} bytes (NumPy writes a few hundred)",
            f"a header length of {size:,} bytes",
        )
    text = f.read(size)
    if len(text) < size:
        raise FileFormatError(
            path, field, f"a .npy header of {size} bytes", f"{len(text)} bytes (cut short)"
        )
    parsed = _npy_dict(text.decode("latin-1"))
    if isinstance(parsed, str):
        raise FileFormatError(path, field, _NPY_EXPECTED, parsed)
    dtype, fortran, shape = parsed
    return shape, dtype, fortran, 8 + width + size


def _declared_bytes(path, field, shape, dtype) -> int:
    """The bytes of the array a ``.npy`` header declares (``shape`` of ``dtype``), once within
    the read budget (``budget.check_declared``); the product stops past the budget
    (``budget.bounded_product``), so a shape of huge integers costs a few comparisons."""
    if dtype.itemsize == 0:
        raise FileFormatError(
            path, field, "a dtype of at least one byte per entry", f"dtype {dtype} (0 bytes)"
        )
    limit = budget.read_budget()
    nbytes = budget.bounded_product([*shape, dtype.itemsize], limit)
    return budget.check_declared(
        path, field, nbytes, f"declared bytes (its header: {dtype} of shape {_shape_text(shape)})"
    )


def _read_data(f, path, field, shape, dtype, fortran):
    """The array of ``shape`` and ``dtype`` (``fortran``: in Fortran order) whose bytes follow in
    the binary stream ``f``, read into an array of exactly that size (its header's bytes
    already passed :func:`_declared_bytes`), in chunks; a stream that ends first is refused."""
    A = np.empty(math.prod(shape), dtype)
    view = A.view(np.uint8).data  # a writable memoryview of its bytes
    done = 0
    while done < len(view):
        n = f.readinto(view[done : done + _CHUNK])
        if not n:
            raise FileFormatError(
                path,
                field,
                "the bytes its .npy header announces",
                f"EOF: reading array data, expected {len(view)} bytes got {done}",
            )
        done += n
    return A.reshape(shape[::-1]).T if fortran else A.reshape(shape)


def _end_record(f, size):
    """``(entries, directory size, directory start)`` from the zip's end-of-central-directory
    record (and its ZIP64 record, where there is one), found and read as ``zipfile`` finds and
    reads them; None where there is no such record."""
    if size < _EOCD.size:
        return None
    f.seek(size - _EOCD.size)
    data = f.read(_EOCD.size)
    if data[:4] == b"PK\x05\x06" and data[-2:] == b"\x00\x00":
        at = size - _EOCD.size
    else:  # a comment follows the record: the last signature in the last 64 KiB
        low = max(size - (1 << 16) - _EOCD.size, 0)
        f.seek(low)
        data = f.read()
        i = data.rfind(b"PK\x05\x06")
        if i < 0 or len(data) - i < _EOCD.size:
            return None
        at, data = low + i, data[i : i + _EOCD.size]
    fields = _EOCD.unpack(data)
    entries, cd_size = fields[4], fields[5]
    start = at - cd_size  # zipfile looks for the directory just before this record, whatever
    # the record's offset field says (it takes the difference for data prepended to the zip)
    if at >= _LOCATOR64.size:
        f.seek(at - _LOCATOR64.size)
        locator = f.read(_LOCATOR64.size)
        if locator[:4] == b"PK\x06\x07" and at >= _LOCATOR64.size + _EOCD64.size:
            f.seek(at - _LOCATOR64.size - _EOCD64.size)
            record = f.read(_EOCD64.size)
            if record[:4] == b"PK\x06\x06":
                zip64 = _EOCD64.unpack(record)
                entries, cd_size = zip64[7], zip64[8]
                start = at - _LOCATOR64.size - _EOCD64.size - cd_size
    return entries, cd_size, start


def _check_zip_directory(path, what):
    """Before ``zipfile`` reads the directory of the zip ``path`` (all of it, an object per
    entry): the entry count its end record declares and the entries its directory holds (read
    one by one, at most :data:`MAX_MEMBERS` + 1 of them) within :data:`MAX_MEMBERS`, the
    directory's bytes within the read budget, and every name flagged UTF-8 valid UTF-8."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        record = _end_record(f, size)
        if record is None:
            raise FileFormatError(
                path,
                "",
                f"a {what} (.npz: a zip of .npy arrays)",
                "no zip directory: the file is cut short or not an .npz",
            )
        entries, cd_size, start = record
        limit = f"at most {MAX_MEMBERS:,} members (a {what} has a few hundred at most)"
        if entries > MAX_MEMBERS:
            raise FileFormatError(path, "zip directory", limit, f"{entries:,} entries declared")
        budget.check_declared(path, "zip directory", cd_size, "a zip directory")
        if start < 0:
            return  # zipfile refuses it by name ("Bad offset for central directory")
        f.seek(start)
        total = count = 0
        while total < cd_size:
            entry = f.read(_CENTRAL.size)
            if len(entry) < _CENTRAL.size or entry[:4] != b"PK\x01\x02":
                return  # zipfile refuses it by name (a truncated or damaged directory)
            count += 1
            if count > MAX_MEMBERS:
                raise FileFormatError(
                    path, "zip directory", limit, f"more than {MAX_MEMBERS:,} entries"
                )
            fields = _CENTRAL.unpack(entry)
            flags, name_len, extra_len, comment_len = fields[5], fields[12], fields[13], fields[14]
            name = f.read(name_len)
            if flags & 0x800:  # the name is flagged UTF-8
                try:
                    name.decode("utf-8")
                except UnicodeDecodeError as err:
                    raise FileFormatError(
                        path,
                        f"zip directory entry {count}",
                        "a member name in UTF-8 (its UTF-8 flag is set)",
                        f"the byte {name[err.start : err.start + 1]!r} at {err.start} of the "
                        f"name {name[:60]!r}",
                    ) from None
            f.seek(extra_len + comment_len, 1)
            total += _CENTRAL.size + name_len + extra_len + comment_len


def _member_header(zf, info, path):
    """``(shape, dtype, fortran, header_bytes)`` of the ``.npy`` member ``info`` (its header only:
    :func:`_npy_header`)."""
    with zf.open(info) as f:
        return _npy_header(f, path, info.filename)
