"""The one checked reader of every file the package reads: containers, headers and sizes are checked
before any array is allocated, and every refusal is a :class:`~fenchel_cvx.errors.FileFormatError`
naming the file, the field and what was expected against what was found.

No equation of the paper is implemented here; the files hold the weights ``W_l`` of eq. (2)
and the lifted variables ``X_l`` (the format is in ``io.py``).

- :func:`check_file`: an existing regular file, not empty, within a size bound.
- :func:`read_json`: a UTF-8 JSON file (``run.json``, ``history.json``) of a given top-level type.
- :class:`NpzFile`: a ``.npz`` (a zip of ``.npy`` arrays, as ``numpy.savez`` writes it). Opening
  checks the zip container (its directory, that every member is a ``.npy`` file), reads every
  member's ``.npy`` header with ``numpy.lib.format`` (magic, version, dtype, shape) and checks
  that the member holds exactly the bytes its header announces and that the arrays together fit
  the memory budget; :meth:`NpzFile.array` then checks the expected shape and dtype before
  reading and finiteness after, :meth:`NpzFile.meta` the JSON object and its format name and
  version. Object arrays are refused from the header (nothing is ever unpickled).
- :func:`read_points`: the ``.npy`` or ``.csv`` input of ``fenchel-cvx predict``.
- :func:`check_format`: a format string ``"fenchel_cvx.<Kind>/<version>"``: a newer version
  is refused with how to proceed, another kind by name.

Files the package writes carry their format and version (``io.py``; ``History.to_dict``;
``run.json``), so a later release can read or convert them.
"""

from __future__ import annotations

import json
import math
import tokenize
import zipfile
import zlib
from pathlib import Path

import numpy as np

from .errors import FileFormatError
from .validation import memory_budget, scale_problem

#: the largest JSON file read (a run's history of 10^6 rounds is far below it)
MAX_JSON_BYTES = 1 << 30
#: the largest ``meta`` string of an ``.npz`` (it holds a checkpoint's history)
MAX_META_BYTES = 1 << 30


def _size(nbytes):
    return f"{nbytes / 2**30:.3g} GiB" if nbytes >= 2**30 else f"{nbytes} bytes"


def check_file(path, what, max_bytes=None) -> Path:
    """``path`` as a Path, once it is an existing, non-empty regular file of at most
    ``max_bytes`` (default: the memory budget); ``what``: the file's kind, in words."""
    path = Path(path)
    if not path.is_file():
        found = "a folder" if path.is_dir() else "nothing there"
        raise FileFormatError(path, "", f"an existing {what} file", found)
    size = path.stat().st_size
    if size == 0:
        raise FileFormatError(path, "", f"a {what} file", "an empty file (0 bytes)")
    limit = memory_budget() if max_bytes is None else max_bytes
    if limit is not None and size > limit:
        raise FileFormatError(path, "size", f"at most {_size(limit)}", _size(size))
    return path


def _read_text(path, what):
    """The UTF-8 text of ``path`` (``what``: its content, named by the error)."""
    raw = path.read_bytes()
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise FileFormatError(
            path,
            f"byte {err.start}",
            f"UTF-8 text ({what})",
            f"the byte {raw[err.start : err.start + 1]!r}",
        ) from None


def read_json(path, what, want=dict, max_bytes=MAX_JSON_BYTES):
    """The JSON value of the UTF-8 file ``path``, which must be a ``want`` (dict or list)."""
    path = check_file(path, what, max_bytes)
    return parse_json(path, "", _read_text(path, "JSON"), want)


def parse_json(path, field, text, want=dict):
    """``text`` parsed as JSON that must be a ``want``; errors name ``path`` and ``field``."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        where = f"{field} " if field else ""
        raise FileFormatError(
            path, f"{where}line {err.lineno} column {err.colno}".strip(), "JSON", f"{err.msg}"
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


def check_format(path, meta, expected):
    """Check ``meta["format"]`` against ``expected`` (``"fenchel_cvx.<Kind>/<version>"``): the
    same kind at the same or an older version passes (returns the version); a newer version
    is refused with what to do; anything else is refused by name."""
    family, _, version = expected.rpartition("/")
    found = meta.get("format")
    if not isinstance(found, str):
        raise FileFormatError(
            path,
            "meta.format",
            f"the format {expected!r}",
            "no format string" if found is None else repr(found),
            "the file was not written by fenchel_cvx",
        )
    f_family, _, f_version = found.rpartition("/")
    if f_family != family:
        raise FileFormatError(path, "meta.format", f"the format {expected!r}", repr(found))
    if not f_version.isdigit() or int(f_version) < 1:
        raise FileFormatError(
            path, "meta.format", f"a version number after '{family}/'", repr(found)
        )
    if int(f_version) > int(version):
        raise FileFormatError(
            path,
            "meta.format",
            f"version {version} or older of {family}",
            f"version {f_version}",
            "it was written by a newer fenchel_cvx: read it with that release, or upgrade",
        )
    return int(f_version)


def _member_header(zf, info, path):
    """``(shape, dtype, fortran, header_bytes)`` of the ``.npy`` member ``info``."""
    field = info.filename
    with zf.open(info) as f:
        try:
            version = np.lib.format.read_magic(f)
        except ValueError as err:
            raise FileFormatError(path, field, "the .npy magic string", str(err)) from None
        if version not in ((1, 0), (2, 0)):
            raise FileFormatError(
                path, field, ".npy format version 1.0 or 2.0", f"version {version[0]}.{version[1]}"
            )
        read = (
            np.lib.format.read_array_header_1_0
            if version == (1, 0)
            else np.lib.format.read_array_header_2_0
        )
        try:
            shape, fortran, dtype = read(f)
        except (ValueError, tokenize.TokenError) as err:  # numpy tokenizes the header
            raise FileFormatError(path, field, "a .npy header", str(err)) from None
        return shape, dtype, fortran, f.tell()


class NpzFile:
    """A ``.npz`` file checked as the module docstring says; ``what``: its kind, in words.

    ``headers``: the arrays' names (without ``.npy``) -> ``(shape, dtype)``, read from the
    headers only. Use as a context manager, or call :meth:`close`."""

    def __init__(self, path, what):
        self.path, self.what = check_file(path, what), what
        if not zipfile.is_zipfile(self.path):
            raise FileFormatError(
                self.path,
                "",
                f"a {what} (.npz: a zip of .npy arrays)",
                "no zip directory: the file is cut short or not an .npz",
            )
        try:
            self.zip = zipfile.ZipFile(self.path)
        except (zipfile.BadZipFile, NotImplementedError) as err:  # e.g. "zip file version 17.5"
            raise FileFormatError(
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
        headers, total = {}, 0
        size = self.path.stat().st_size
        for info in self.zip.infolist():
            name = info.filename
            if not name.endswith(".npy") or "/" in name:
                raise FileFormatError(self.path, name, "only .npy members", f"the member {name!r}")
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
            nbytes = math.prod(shape) * dtype.itemsize
            if header + nbytes != info.file_size:
                raise FileFormatError(
                    self.path,
                    name,
                    f"{header + nbytes} bytes (its header: {dtype} of shape {shape})",
                    f"{info.file_size} bytes",
                )
            headers[name[:-4]] = (tuple(shape), dtype)
            total += nbytes
        budget = memory_budget()
        if budget is not None and total > budget:
            raise FileFormatError(
                self.path,
                "arrays",
                f"at most this machine's {_size(budget)}",
                f"{_size(total)} of arrays",
            )
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
        try:
            with self.zip.open(f"{name}.npy") as f:
                return np.lib.format.read_array(f, allow_pickle=False)
        except (zipfile.BadZipFile, zlib.error, EOFError) as err:  # CRC or deflate failure
            raise FileFormatError(
                self.path,
                name,
                "data that passes the zip's CRC check",
                f"{type(err).__name__}: {err}",
            ) from None
        except ValueError as err:  # read_array: the member ends before its header's bytes
            raise FileFormatError(
                self.path, name, "the bytes its .npy header announces", str(err)
            ) from None

    def array(self, name, shape, dtype):
        """The array ``name``, once its header shows ``shape`` (a tuple; ``None`` entries take
        any size) and ``dtype`` (a NumPy dtype); it must be finite and within the dtype's scale
        (``validation.scale_problem``)."""
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
    float64: the input of ``fenchel-cvx predict``. ``.npy``: its header is checked first (no
    object arrays, a 2-D or 1-D shape, the bytes it announces); ``.csv``: numbers only."""
    path = check_file(path, "points (.npy or .csv)")
    if path.suffix == ".npy":
        with open(path, "rb") as f:
            try:
                version = np.lib.format.read_magic(f)
                shape, _, dtype = (
                    np.lib.format.read_array_header_1_0(f)
                    if version == (1, 0)
                    else np.lib.format.read_array_header_2_0(f)
                )
            except (ValueError, tokenize.TokenError) as err:
                raise FileFormatError(path, "header", "a .npy header", str(err)) from None
            header = f.tell()
        if not (
            np.issubdtype(dtype, np.integer)
            or np.issubdtype(dtype, np.floating)
            or np.issubdtype(dtype, np.bool_)
        ):
            raise FileFormatError(path, "dtype", "real numbers", f"dtype {dtype}")
        if path.stat().st_size != header + math.prod(shape) * dtype.itemsize:
            raise FileFormatError(
                path,
                "size",
                f"{header + math.prod(shape) * dtype.itemsize} bytes ({dtype} of shape {shape})",
                f"{path.stat().st_size} bytes",
            )
        A = np.load(path, allow_pickle=False)
    else:
        A = _read_csv(path)
    A = np.atleast_2d(A)
    if A.ndim != 2 or A.shape[1] != features:
        raise FileFormatError(
            path,
            "shape",
            f"rows of {features} numbers (one data point per row)",
            f"shape {A.shape}",
        )
    problem = scale_problem(A.astype(np.float64))
    if problem is not None:
        raise FileFormatError(path, "values", "finite numbers of a usable scale", problem)
    return A.astype(np.float64)


def _read_csv(path):
    text = _read_text(path, "CSV of numbers")
    rows = [line for line in text.splitlines() if line.strip() and not line.startswith("#")]
    if not rows:
        raise FileFormatError(path, "", "at least one row of numbers", "no rows")
    out = []
    for i, line in enumerate(rows, 1):
        cells = line.split(",")
        try:
            out.append([float(c) for c in cells])
        except ValueError:
            bad = next(c for c in cells if not _is_float(c))
            raise FileFormatError(
                path, f"row {i}", "comma-separated numbers", f"{bad.strip()!r}"
            ) from None
        if len(out[-1]) != len(out[0]):
            raise FileFormatError(
                path, f"row {i}", f"{len(out[0])} numbers (as row 1)", f"{len(out[-1])}"
            )
    return np.array(out)


def _is_float(text):
    try:
        float(text)
    except ValueError:
        return False
    return True
