"""The one checked reader of every file the package reads: containers, headers and sizes are checked
before any array is allocated, and every refusal is a :class:`~fenchel_cvx.errors.FileFormatError`
naming the file, the field and what was expected against what was found.

No equation of the paper is implemented here; the files hold the weights ``W_l`` of eq. (2)
and the lifted variables ``X_l`` (the format is in ``io.py``).

- :func:`check_file`: an existing regular file, not empty, within a size bound (default: the
  read budget of ``budget.py``, ``FENCHEL_READ_BUDGET``).
- :func:`read_json`, :func:`parse_json`: a UTF-8 JSON file (``run.json``, ``history.json``) or
  text of a given top-level type, pre-scanned before ``json.loads`` (``json_scan.py``: its
  decoded size within the read budget, its nesting and numbers' digits bounded); its fields:
  ``schemas.py``.
- :class:`NpzFile`: a ``.npz`` (a zip of ``.npy`` arrays, as ``numpy.savez`` writes it). Opening
  walks the zip's directory before ``zipfile`` does and reads every member's ``.npy`` header
  by hand (``npy_zip.py``: at most :data:`MAX_MEMBERS` entries, headers of at most
  :data:`MAX_NPY_HEADER` bytes, never evaluated), checks that every member is a stored or
  deflated ``.npy`` file, and checks its declared bytes (``budget.bounded_product``) against the
  read budget, against the bytes the zip declares for the member and, deflated, against its
  stored bytes (``budget.check_ratio``), and the arrays together against the read budget;
  :meth:`NpzFile.array` then checks the expected shape and dtype before reading and finiteness
  after, :meth:`NpzFile.meta` the JSON object and its format name and version. Object arrays
  are refused from the header (nothing is ever unpickled); no array is allocated before its
  header's bytes passed the budget.
- :func:`read_points`: the ``.npy`` or ``.csv`` input of ``fenchel-cvx predict`` (the CSV read
  in two streaming passes, ``csv_text.py``).
- :func:`check_format`: a format string ``"fenchel_cvx.<Kind>/<version>"``: a newer version
  is refused with how to proceed, another kind by name.

Files the package writes carry their format and version (``io.py``; ``History.to_dict``;
``run.json``), so a later release can read or convert them.
"""

from __future__ import annotations

import os
import zipfile
import zlib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import DTypeLike

from . import budget
from .csv_text import _read_csv
from .errors import FileFormatError
from .json_scan import MAX_JSON_DEPTH as MAX_JSON_DEPTH
from .json_scan import MAX_JSON_DIGITS as MAX_JSON_DIGITS
from .json_scan import _parse_json
from .npy_zip import MAX_MEMBERS as MAX_MEMBERS
from .npy_zip import MAX_NPY_HEADER as MAX_NPY_HEADER
from .npy_zip import (
    _check_zip_directory,
    _declared_bytes,
    _member_header,
    _npy_header,
    _read_data,
    _shape_text,
)
from .validation import scale_problem

#: the largest JSON file read (a run's history of 10^6 rounds is far below it)
MAX_JSON_BYTES = 1 << 30
#: the largest ``meta`` string of an ``.npz`` (it holds a checkpoint's history)
MAX_META_BYTES = 1 << 30


def _size(nbytes):
    return f"{nbytes / 2**30:.3g} GiB" if nbytes >= 2**30 else f"{nbytes} bytes"


def check_file(path: str | os.PathLike[str], what: str, max_bytes: int | None = None) -> Path:
    """``path`` as a Path, once it is an existing, non-empty regular file of at most
    ``max_bytes`` (default: the read budget, ``budget.read_budget``); ``what``: the file's
    kind, in words.

    >>> import tempfile
    >>> tmp = tempfile.TemporaryDirectory()
    >>> _ = (Path(tmp.name) / "run.json").write_text("{}")
    >>> check_file(Path(tmp.name) / "run.json", "run").name
    'run.json'
    >>> check_file(Path(tmp.name) / "run.json", "run", max_bytes=1)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    fenchel_cvx.errors.FileFormatError: ...run.json: size: expected at most 1 bytes, found 2 bytes
    >>> check_file(Path(tmp.name) / "history.json", "history")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    fenchel_cvx.errors.FileFormatError: ...history.json: expected an existing history file, found
    nothing there
    >>> tmp.cleanup()
    """
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


def read_json(
    path: str | os.PathLike[str], what: str, want: type = dict, max_bytes: int = MAX_JSON_BYTES
) -> Any:
    """The JSON value of the UTF-8 file ``path``, which must be a ``want`` (dict or list): the
    file within ``max_bytes`` and the read budget, its text within the budget rules of
    :func:`_check_json_text` before ``json.loads`` sees it.

    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     path = Path(tmp) / "history.json"
    ...     _ = path.write_text('[{"iteration": 1, "objective": 2.5}]')
    ...     read_json(path, "history", want=list)
    [{'iteration': 1, 'objective': 2.5}]
    """
    path = check_file(path, what, min(max_bytes, budget.read_budget()))
    return _parse_json(path, "", path.read_bytes(), None, want)


def parse_json(path: str | os.PathLike[str], field: str, text: str, want: type = dict) -> Any:
    """``text`` parsed as JSON that must be a ``want``, after :func:`_check_json_text`; errors
    name ``path`` and ``field``.

    >>> parse_json("weights.npz", "meta", '{"format": "fenchel_cvx.Network/1"}')
    {'format': 'fenchel_cvx.Network/1'}
    >>> parse_json("weights.npz", "meta", "[1, 2]")
    Traceback (most recent call last):
    ...
    fenchel_cvx.errors.FileFormatError: weights.npz: meta: expected a JSON object, found a JSON
    array
    >>> parse_json("weights.npz", "meta", "[" * 65 + "]" * 65, want=list)
    Traceback (most recent call last):
    ...
    fenchel_cvx.errors.FileFormatError: weights.npz: meta byte 64: expected arrays and objects
    nested at most 64 deep, found one nested 65 deep
    """
    return _parse_json(path, field, text.encode("utf-8", "surrogatepass"), text, want)


def check_format(
    path: str | os.PathLike[str],
    meta: Mapping[str, Any],
    expected: str,
    field: str = "meta.format",
) -> int:
    """Check ``meta["format"]`` (``field``: its name in the file) against ``expected``
    (``"fenchel_cvx.<Kind>/<version>"``): the same kind at the same or an older version passes
    (returns the version); a newer version is refused with what to do; anything else, a version
    of other than ASCII digits (a superscript one too) or of more than 9, is refused by name.

    >>> check_format("run.json", {"format": "fenchel_cvx.Run/1"}, "fenchel_cvx.Run/2")
    1
    >>> check_format("run.json", {"format": "fenchel_cvx.Run/3"}, "fenchel_cvx.Run/2")
    Traceback (most recent call last):
    ...
    fenchel_cvx.errors.FileFormatError: run.json: meta.format: expected version 2 or older of
    fenchel_cvx.Run, found version 3; it was written by a newer fenchel_cvx: read it with that
    release, or upgrade
    """
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


class NpzFile:
    """A ``.npz`` file checked as the module docstring says; ``what``: its kind, in words.

    ``headers``: the arrays' names (without ``.npy``) -> ``(shape, dtype)``, read from the
    headers only. Use as a context manager, or call :meth:`close`.

    >>> import tempfile
    >>> tmp = tempfile.TemporaryDirectory()
    >>> np.savez(Path(tmp.name) / "weights.npz", W=np.eye(2), b=np.zeros(3, np.float32))
    >>> f = NpzFile(Path(tmp.name) / "weights.npz", "weights")
    >>> f.headers["W"], float(f.array("W", (2, None), np.float64).sum())
    (((2, 2), dtype('float64')), 2.0)
    >>> f.array("b", (3,), np.float64)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    fenchel_cvx.errors.FileFormatError: ...weights.npz: b: expected dtype float64, found dtype
    float32
    >>> f.close(); tmp.cleanup()
    """

    def __init__(self, path: str | os.PathLike[str], what: str) -> None:
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

    def __enter__(self) -> NpzFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.zip.close()

    def require(self, names: Iterable[str]) -> None:
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
                        f"missing {', '.join(missing)}" if missing else None,
                        f"unexpected {', '.join(extra)}" if extra else None,
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

    def check_array(self, name: str, shape: tuple[int | None, ...], dtype: DTypeLike) -> None:
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

    def array(self, name: str, shape: tuple[int | None, ...], dtype: DTypeLike) -> np.ndarray:
        """The array ``name``, once its header shows ``shape`` (a tuple; ``None`` entries take
        any size) and ``dtype`` (a NumPy dtype) (:meth:`check_array`); it must be finite and
        within the dtype's scale (``validation.scale_problem``)."""
        self.check_array(name, shape, dtype)
        A = self._read(name)
        problem = scale_problem(A)
        if problem is not None:
            raise FileFormatError(self.path, name, "finite values of a usable scale", problem)
        return A

    def meta(self, expected_format: str) -> dict[str, Any]:
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


def read_points(path: str | os.PathLike[str], features: int) -> np.ndarray:
    """The rows (data points) of a ``.npy`` or ``.csv`` file of ``features`` numbers each, as
    float64: the input of ``fenchel-cvx predict``. ``.npy``: its header is checked first
    (:func:`_npy_header`; a bool, int, uint or float dtype; a 2-D or 1-D shape of ``features``
    columns; its bytes and their float64 copy within the read budget; the bytes it announces);
    ``.csv``: numbers only, counted before they are parsed (:func:`_read_csv`).

    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     np.savetxt(Path(tmp) / "x.csv", [[1, 2, 3], [4, 5, 6]], delimiter=",", fmt="%d")
    ...     np.save(Path(tmp) / "x.npy", np.array([1, 0, 1], np.uint8))
    ...     read_points(Path(tmp) / "x.csv", features=3), read_points(Path(tmp) / "x.npy", 3)
    (array([[1., 2., 3.],
           [4., 5., 6.]]), array([[1., 0., 1.]]))
    """
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
