"""The one checked reader of every file the package reads: containers, headers and sizes are checked
before any array is allocated, and every refusal is a :class:`~fenchel_cvx.errors.FileFormatError`
naming the file, the field and what was expected against what was found.

No equation of the paper is implemented here; the files hold the weights ``W_l`` of eq. (2)
and the lifted variables ``X_l`` (the format is in ``io.py``).

- :func:`check_file`: an existing regular file, not empty, within a size bound (default: the
  read budget of ``budget.py``, ``FENCHEL_READ_BUDGET``).
- :func:`read_json`: a UTF-8 JSON file (``run.json``, ``history.json``) of a given top-level type,
  its text pre-scanned before ``json.loads`` (:func:`_check_json_text`: its decoded size within
  the read budget, its nesting and numbers' digits bounded); its fields: ``schemas.py``.
- :class:`NpzFile`: a ``.npz`` (a zip of ``.npy`` arrays, as ``numpy.savez`` writes it). Opening
  reads the zip's end record and walks its directory itself before ``zipfile`` does (at most
  :data:`MAX_MEMBERS` entries, names flagged UTF-8 in UTF-8), checks that every member is a
  stored or deflated ``.npy`` file, reads every member's ``.npy`` header with a pattern of the
  dict NumPy writes (at most :data:`MAX_NPY_HEADER` bytes; never evaluated) and checks its
  declared bytes (``budget.bounded_product``) against the read budget, against the bytes the
  zip declares for the member and, deflated, against its stored bytes (``budget.check_ratio``),
  and the arrays together against the read budget; :meth:`NpzFile.array` then checks the
  expected shape and dtype before reading and finiteness after, :meth:`NpzFile.meta` the JSON
  object and its format name and version. Object arrays are refused from the header (nothing
  is ever unpickled); no array is allocated before its header's bytes passed the budget.
- :func:`read_points`: the ``.npy`` or ``.csv`` input of ``fenchel-cvx predict``.
- :func:`check_format`: a format string ``"fenchel_cvx.<Kind>/<version>"``: a newer version
  is refused with how to proceed, another kind by name.

Files the package writes carry their format and version (``io.py``; ``History.to_dict``;
``run.json``), so a later release can read or convert them.
"""

from __future__ import annotations

import json
import math
import re
import struct
import zipfile
import zlib
from pathlib import Path

import numpy as np

from . import budget
from .errors import FileFormatError
from .validation import scale_problem

#: the largest JSON file read (a run's history of 10^6 rounds is far below it)
MAX_JSON_BYTES = 1 << 30
#: the largest ``meta`` string of an ``.npz`` (it holds a checkpoint's history)
MAX_META_BYTES = 1 << 30
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


def _size(nbytes):
    return f"{nbytes / 2**30:.3g} GiB" if nbytes >= 2**30 else f"{nbytes} bytes"


def check_file(path, what, max_bytes=None) -> Path:
    """``path`` as a Path, once it is an existing, non-empty regular file of at most
    ``max_bytes`` (default: the read budget, ``budget.read_budget``); ``what``: the file's
    kind, in words."""
    path = Path(path)
    if not path.is_file():
        found = "a folder" if path.is_dir() else "nothing there"
        raise FileFormatError(path, "", f"an existing {what} file", found)
    size = path.stat().st_size
    if size == 0:
        raise FileFormatError(path, "", f"a {what} file", "an empty file (0 bytes)")
    limit = budget.read_budget() if max_bytes is None else max_bytes
    if size > limit:
        hint = "FENCHEL_READ_BUDGET raises the budget" if max_bytes is None else ""
        raise FileFormatError(path, "size", f"at most {_size(limit)}", _size(size), hint)
    return path


def _decode(path, raw, what):
    """``raw`` decoded as UTF-8 (``what``: its content, named by the error with the byte)."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise FileFormatError(
            path,
            f"byte {err.start}",
            f"UTF-8 text ({what})",
            f"the byte {raw[err.start : err.start + 1]!r}",
        ) from None


def _read_text(path, what):
    """The UTF-8 text of ``path`` (``what``: its content, named by the error)."""
    return _decode(path, path.read_bytes(), what)


def read_json(path, what, want=dict, max_bytes=MAX_JSON_BYTES):
    """The JSON value of the UTF-8 file ``path``, which must be a ``want`` (dict or list): the
    file within ``max_bytes`` and the read budget, its text within the budget rules of
    :func:`_check_json_text` before ``json.loads`` sees it."""
    path = check_file(path, what, min(max_bytes, budget.read_budget()))
    return _parse_json(path, "", path.read_bytes(), None, want)


def parse_json(path, field, text, want=dict):
    """``text`` parsed as JSON that must be a ``want``, after :func:`_check_json_text`; errors
    name ``path`` and ``field``."""
    return _parse_json(path, field, text.encode("utf-8", "surrogatepass"), text, want)


#: the deepest nesting of arrays and objects read (the package's files: 6 at most)
MAX_JSON_DEPTH = 64
#: the most digits of a number read (Python writes a float in at most 17)
MAX_JSON_DIGITS = 100
#: the bytes a decoded JSON value is charged: per object, per array, and per other value or
#: key (each comma and colon, plus one), above what CPython's json takes (measured: an empty
#: object with its list slot 72 bytes, a one-entry object 240, a key and a float 140)
_JSON_OBJECT, _JSON_ARRAY, _JSON_VALUE = 240, 64, 80
#: a JSON string, its escapes included
_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
#: digits -> "0", any other byte -> " ": a number of too many digits is a run of "0"
_JSON_DIGITS = bytes(48 if 48 <= b <= 57 else 32 for b in range(256))
_JSON_NUMBER = re.compile(rb"[0-9]+")
#: each byte's step of the nesting: +1 opens an array or an object, -1 closes one
_JSON_STEP = np.zeros(256, np.int64)
_JSON_STEP[[ord("["), ord("{")]], _JSON_STEP[[ord("]"), ord("}")]] = 1, -1


def _check_json_text(path, field, raw):
    """The pre-scan of the JSON text ``raw`` (bytes), linear and before ``json.loads``:

    - its decoded value within the read budget (``budget.check_declared``): the text's bytes
      twice (five times where it holds non-ASCII: decoded at up to 4 bytes a character), and
      240 bytes per object, 64 per array and 80 per other value (each ``,`` and ``:``, plus
      one), counted over the whole text (strings too: an over-count, never an under-count);
    - outside strings, numbers of at most :data:`MAX_JSON_DIGITS` digits (Python refuses to
      read an integer of more than 4,300) and arrays and objects nested at most
      :data:`MAX_JSON_DEPTH` deep (``json.loads`` recurses once per level), each refusal naming
      the byte of the text where it starts."""
    objects, arrays = raw.count(b"{"), raw.count(b"[")
    values = raw.count(b",") + raw.count(b":") + 1
    cost = len(raw) * (2 if raw.isascii() else 5)
    cost += _JSON_OBJECT * objects + _JSON_ARRAY * arrays + _JSON_VALUE * values
    what = f"JSON of {objects:,} objects, {arrays:,} arrays and {values:,} values, decoded"
    budget.check_declared(path, field or "JSON", cost, what)
    where = f"{field} " if field else ""
    text = _JSON_STRING.sub(b'""', raw)  # strings out: what is left is numbers and brackets
    at = text.translate(_JSON_DIGITS).find(b"0" * (MAX_JSON_DIGITS + 1))
    if at >= 0:
        digits = len(_JSON_NUMBER.match(text, at)[0])
        raise FileFormatError(
            path,
            f"{where}byte {_raw_offset(raw, at)}",
            f"numbers of at most {MAX_JSON_DIGITS} digits",
            f"a number of {digits:,} digits",
        )
    at = _too_deep(text)
    if at is not None:
        raise FileFormatError(
            path,
            f"{where}byte {_raw_offset(raw, at)}",
            f"arrays and objects nested at most {MAX_JSON_DEPTH} deep",
            f"one nested {MAX_JSON_DEPTH + 1} deep",
        )


def _too_deep(text):
    """The offset in ``text`` (JSON without strings) of the first bracket nested deeper than
    :data:`MAX_JSON_DEPTH`, else None; the running depth in chunks of 1 MiB."""
    steps, depth = np.frombuffer(text, np.uint8), 0
    for start in range(0, len(steps), 1 << 20):
        running = np.cumsum(_JSON_STEP[steps[start : start + (1 << 20)]]) + depth
        if running.max() > MAX_JSON_DEPTH:
            return start + int(np.argmax(running > MAX_JSON_DEPTH))
        depth = int(running[-1])
    return None


def _raw_offset(raw, at):
    """The offset in ``raw`` of the offset ``at`` in ``raw`` with its strings cut to ``""``."""
    shift = 0
    for m in _JSON_STRING.finditer(raw):
        if m.start() - shift >= at:
            break
        shift += m.end() - m.start() - 2
    return at + shift


def _parse_json(path, field, raw, text, want):
    """``raw`` (its decoded ``text``, or None: decoded here) parsed as JSON that must be a
    ``want``, after :func:`_check_json_text`; every error of ``json.loads`` named."""
    _check_json_text(path, field, raw)
    text = _decode(path, raw, "JSON") if text is None else text
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        where = f"{field} " if field else ""
        raise FileFormatError(
            path, f"{where}line {err.lineno} column {err.colno}".strip(), "JSON", f"{err.msg}"
        ) from None
    except (ValueError, RecursionError) as err:  # past the pre-scan: still named
        raise FileFormatError(
            path, field or "JSON", "JSON that Python reads", f"{type(err).__name__}: {err}"
        ) from None
    if not isinstance(value, want):
        raise FileFormatError(
            path, field, f"a JSON {_json_type(want)}", f"a JSON {_json_type(type(value))}"
        )
    return value


def _json_type(cls):
    return {
        dict: "object",
        list: "array",
        str: "string",
        int: "number",
        float: "number",
        bool: "boolean",
        type(None): "null",
    }.get(cls, cls.__name__)


def check_format(path, meta, expected, field="meta.format"):
    """Check ``meta["format"]`` (``field``: its name in the file) against ``expected``
    (``"fenchel_cvx.<Kind>/<version>"``): the same kind at the same or an older version passes
    (returns the version); a newer version is refused with what to do; anything else, a version
    of other than ASCII digits (a superscript one too) or of more than 9, is refused by name."""
    family, _, version = expected.rpartition("/")
    found = meta.get("format")
    if not isinstance(found, str):
        raise FileFormatError(
            path,
            field,
            f"the format {expected!r}",
            "no format string" if found is None else repr(found)[:200],
            "the file was not written by fenchel_cvx",
        )
    shown = repr(found[:200])
    f_family, _, f_version = found.rpartition("/")
    if f_family != family:
        raise FileFormatError(path, field, f"the format {expected!r}", shown)
    if not (f_version.isascii() and f_version.isdigit()) or len(f_version) > 9:
        raise FileFormatError(path, field, f"a version number after '{family}/'", shown)
    if int(f_version) < 1:
        raise FileFormatError(path, field, f"a version number after '{family}/'", shown)
    if int(f_version) > int(version):
        raise FileFormatError(
            path,
            field,
            f"version {version} or older of {family}",
            f"version {f_version}",
            "it was written by a newer fenchel_cvx: read it with that release, or upgrade",
        )
    return int(f_version)


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
    view = memoryview(A.view(np.uint8))
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


class NpzFile:
    """A ``.npz`` file checked as the module docstring says; ``what``: its kind, in words.

    ``headers``: the arrays' names (without ``.npy``) -> ``(shape, dtype)``, read from the
    headers only. Use as a context manager, or call :meth:`close`."""

    def __init__(self, path, what):
        self.path, self.what = check_file(path, what), what
        _check_zip_directory(self.path, what)
        try:
            self.zip = zipfile.ZipFile(self.path)
        except (zipfile.BadZipFile, NotImplementedError, ValueError) as err:
            raise FileFormatError(  # e.g. "zip file version 17.5"
                self.path,
                "zip directory",
                "a readable zip directory",
                f"{type(err).__name__}: {err}",
            ) from None
        try:
            self.headers = self._read_headers()
        except BaseException:
            self.zip.close()
            raise

    def _read_headers(self):
        """Every member's checks, from the zip's directory and the member's ``.npy`` header,
        before any array is read: a ``.npy`` name, met once; a stored or deflated member inside
        the file; its header's declared bytes within the read budget, equal to the bytes the
        zip declares for it, and (deflated) at most ``budget.MAX_RATIO`` times its stored
        bytes; the arrays together within the read budget."""
        headers, total, size = {}, 0, self.path.stat().st_size
        self._members = {}
        for info in self.zip.infolist():
            name = info.filename
            if not name.endswith(".npy") or "/" in name:
                raise FileFormatError(self.path, name, "only .npy members", f"the member {name!r}")
            if name[:-4] in headers:
                raise FileFormatError(self.path, name, "one member of each name", "two")
            if (
                info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED)
                or info.flag_bits & 0x1
            ):
                raise FileFormatError(
                    self.path,
                    name,
                    "a stored or deflated member, as numpy.savez writes",
                    f"compression method {info.compress_type}, flags {info.flag_bits:#x}",
                )
            if info.header_offset + info.compress_size > size:
                raise FileFormatError(
                    self.path,
                    name,
                    "a member inside the file",
                    "a member that runs past the end of the file (cut short)",
                )
            if info.header_offset < 0:  # the directory's offset of itself is damaged
                raise FileFormatError(
                    self.path,
                    name,
                    "a member inside the file",
                    f"a member at the offset {info.header_offset}, before its start",
                )
            if info.compress_type == zipfile.ZIP_STORED and info.compress_size != info.file_size:
                raise FileFormatError(
                    self.path,
                    name,
                    f"{info.file_size} stored bytes (a stored member's size)",
                    f"{info.compress_size} bytes",
                )
            try:
                shape, dtype, fortran, header = _member_header(self.zip, info, self.path)
            except (zipfile.BadZipFile, zlib.error, EOFError, NotImplementedError) as err:
                raise FileFormatError(
                    self.path, name, "a readable zip member", f"{type(err).__name__}: {err}"
                ) from None
            if dtype.hasobject:
                raise FileFormatError(
                    self.path,
                    name,
                    "an array of numbers or text",
                    f"dtype {dtype} (Python objects are never unpickled)",
                )
            nbytes = _declared_bytes(self.path, name, shape, dtype)
            if header + nbytes != info.file_size:
                raise FileFormatError(
                    self.path,
                    name,
                    f"{header + nbytes} bytes (its header: {dtype} of shape {shape})",
                    f"{info.file_size} bytes",
                )
            budget.check_ratio(self.path, name, info.file_size, info.compress_size)
            headers[name[:-4]] = (tuple(shape), dtype)
            self._members[name[:-4]] = (info, header, fortran)
            total += nbytes
            budget.check_declared(self.path, "arrays", total, "the arrays together")
        return headers

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self):
        self.zip.close()

    def require(self, names):
        """Refuse the file unless it holds exactly the arrays ``names`` (a set of names)."""
        missing, extra = (
            sorted(set(names) - set(self.headers)),
            sorted(set(self.headers) - set(names)),
        )
        if missing or extra:
            found = "; ".join(
                filter(
                    None,
                    [
                        missing and f"missing {', '.join(missing)}",
                        extra and f"unexpected {', '.join(extra)}",
                    ],
                )
            )
            raise FileFormatError(
                self.path, "arrays", f"the arrays {', '.join(sorted(names))}", found
            )

    def _read(self, name):
        """The array ``name``, read after its header into an array of the size the header
        declares (checked when the file was opened), then to the member's end (the CRC)."""
        info, header, fortran = self._members[name]
        shape, dtype = self.headers[name]
        try:
            with self.zip.open(info) as f:
                f.read(header)  # at most 12 bytes and MAX_NPY_HEADER, as checked
                A = _read_data(f, self.path, name, shape, dtype, fortran)
                if f.read(1):
                    raise FileFormatError(
                        self.path, name, f"{header + A.nbytes} bytes", "more bytes"
                    )
        except (zipfile.BadZipFile, zlib.error, EOFError) as err:  # CRC or deflate failure
            raise FileFormatError(
                self.path,
                name,
                "data that passes the zip's CRC check",
                f"{type(err).__name__}: {err}",
            ) from None
        return A

    def check_array(self, name, shape, dtype):
        """Refuse the array ``name`` unless its header shows ``shape`` (a tuple; ``None`` entries
        take any size) and ``dtype`` (a NumPy dtype); nothing of it is read."""
        if name not in self.headers:
            raise FileFormatError(self.path, name, f"the array {name}", "no such array")
        got_shape, got_dtype = self.headers[name]
        if got_dtype != np.dtype(dtype):
            raise FileFormatError(
                self.path, name, f"dtype {np.dtype(dtype).name}", f"dtype {got_dtype}"
            )
        if len(got_shape) != len(shape) or any(
            e is not None and e != g for e, g in zip(shape, got_shape)
        ):
            want = tuple("any" if e is None else e for e in shape)
            raise FileFormatError(
                self.path, name, f"shape {want}".replace("'", ""), f"shape {got_shape}"
            )

    def array(self, name, shape, dtype):
        """The array ``name``, once its header shows ``shape`` (a tuple; ``None`` entries take
        any size) and ``dtype`` (a NumPy dtype) (:meth:`check_array`); it must be finite and
        within the dtype's scale (``validation.scale_problem``)."""
        self.check_array(name, shape, dtype)
        A = self._read(name)
        problem = scale_problem(A)
        if problem is not None:
            raise FileFormatError(self.path, name, "finite values of a usable scale", problem)
        return A

    def meta(self, expected_format):
        """The JSON object of the 0-d text array ``meta``, after :func:`check_format`."""
        if "meta" not in self.headers:
            raise FileFormatError(
                self.path,
                "meta",
                "the array meta (the file's JSON header)",
                "no such array",
                "the file was not written by fenchel_cvx",
            )
        shape, dtype = self.headers["meta"]
        if shape != () or dtype.type is not np.str_ or dtype.itemsize > MAX_META_BYTES:
            raise FileFormatError(
                self.path, "meta", "a 0-d text array", f"dtype {dtype} of shape {shape}"
            )
        meta = parse_json(self.path, "meta", str(self._read("meta")))
        check_format(self.path, meta, expected_format)
        return meta


def read_points(path, features):
    """The rows (data points) of a ``.npy`` or ``.csv`` file of ``features`` numbers each, as
    float64: the input of ``fenchel-cvx predict``. ``.npy``: its header is checked first
    (:func:`_npy_header`; a bool, int, uint or float dtype; a 2-D or 1-D shape of ``features``
    columns; its bytes and their float64 copy within the read budget; the bytes it announces);
    ``.csv``: numbers only, counted before they are parsed (:func:`_read_csv`)."""
    path = check_file(path, "points (.npy or .csv)")
    if path.suffix == ".npy":
        with open(path, "rb") as f:
            shape, dtype, fortran, header = _npy_header(f, path, "header")
            real = "?" + np.typecodes["AllInteger"] + np.typecodes["Float"]
            if dtype.char not in real:  # no datetime, timedelta, complex, text, bytes, void
                raise FileFormatError(
                    path,
                    "dtype",
                    "real numbers (a bool, int, uint or float dtype)",
                    f"dtype {dtype}",
                )
            nbytes = _declared_bytes(path, "header", shape, dtype)
            if path.stat().st_size != header + nbytes:
                raise FileFormatError(
                    path,
                    "size",
                    f"{header + nbytes} bytes ({dtype} of shape {_shape_text(shape)})",
                    f"{path.stat().st_size} bytes",
                )
            _check_points_shape(path, (1,) * (2 - len(shape)) + tuple(shape), features)
            budget.check_declared(
                path,
                "header",
                budget.bounded_product([*shape, 8], budget.read_budget()),
                f"bytes of its float64 copy (shape {_shape_text(shape)})",
            )
            A = _read_data(f, path, "data", shape, dtype, fortran)
    else:
        A = _read_csv(path)
    A = np.atleast_2d(A)
    _check_points_shape(path, A.shape, features)
    A = A.astype(np.float64, copy=False)
    problem = scale_problem(A)
    if problem is not None:
        raise FileFormatError(path, "values", "finite numbers of a usable scale", problem)
    return A


def _check_points_shape(path, shape, features):
    """Refuse ``shape`` (of the input of ``predict``, made 2-D) unless it is rows of
    ``features`` numbers."""
    if len(shape) != 2 or shape[1] != features:
        raise FileFormatError(
            path,
            "shape",
            f"rows of {features} numbers (one data point per row)",
            f"shape {_shape_text(shape)}",
        )


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
