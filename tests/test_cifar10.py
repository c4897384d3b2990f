"""CIFAR-10 on small generated files in the official python-pickle and binary formats: the loader,
its errors, and the LeNet-5 benchmark's CIFAR-10 path end to end (CIFAR-10 itself cannot be had
here)."""

import pickle
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

from fenchel_cvx import lenet5
from fenchel_cvx.datasets import load_cifar10
from fenchel_cvx.errors import FileFormatError
from test_bench_lenet import check_report

ROOT = Path(__file__).resolve().parents[1]


def test_images_keep_their_channels_rows_and_columns(tmp_path, write_cifar10):
    batches = write_cifar10(tmp_path / "c", [3, 2, 2, 2, 2, 4], np.random.default_rng(0))
    d = load_cifar10(tmp_path / "c", dtype="float32")
    assert (
        d.image_shape == (3, 32, 32)
        and d.X_train.shape == (3072, 11)
        and d.X_test.dtype == np.float32
    )
    raw = batches["test_batch"][b"data"][3]  # (1024 red, 1024 green, 1024 blue)
    img = d.X_test[:, 3].reshape(d.image_shape)  # the network's (C, H, W) order
    for c, i, j in [(0, 0, 0), (1, 5, 31), (2, 31, 7)]:
        assert img[c, i, j] == np.float32(raw[c * 1024 + i * 32 + j] / 255)
    net = lenet5(input_shape=d.image_shape, loss="cross_entropy", dtype="float32")
    assert net.forward(d.X_test)[1].shape == (10, 4)


def test_a_truncated_batch_is_named(tmp_path, write_cifar10):
    write_cifar10(tmp_path / "c", [4] * 6, np.random.default_rng(1))
    path = tmp_path / "c" / "data_batch_2"
    path.write_bytes(path.read_bytes()[:5000])
    with pytest.raises(
        FileFormatError,
        match=f"{path}: pickle: expected a complete CIFAR-10 "
        f"python batch, found a truncated or foreign "
        f"pickle of 5000 bytes",
    ):
        load_cifar10(tmp_path / "c")
    path.write_bytes(b"")
    with pytest.raises(
        FileFormatError, match=f"{path}: expected a CIFAR-10 python batch file, found an empty file"
    ):
        load_cifar10(tmp_path / "c")


def test_missing_batches_are_named_before_any_is_read(tmp_path, write_cifar10):
    write_cifar10(tmp_path / "c", [4] * 6, np.random.default_rng(2))
    (tmp_path / "c" / "data_batch_1").write_bytes(b"not a pickle")  # would fail if it were read
    (tmp_path / "c" / "data_batch_4").unlink()
    (tmp_path / "c" / "test_batch").unlink()
    with pytest.raises(
        FileNotFoundError,
        match=f"{tmp_path / 'c' / 'data_batch_4'}, {tmp_path / 'c' / 'test_batch'} not found",
    ):
        load_cifar10(tmp_path / "c")


def test_cifar_images_do_not_fit_an_mnist_network(tmp_path, write_cifar10):
    write_cifar10(tmp_path / "c", [2] * 6, np.random.default_rng(3))
    d = load_cifar10(tmp_path / "c")
    with pytest.raises(
        ValueError,
        match=r"X0 must have 784 rows \(an input of shape \(1, 28, 28\), "
        r"flattened\), got shape \(3072, 10\)",
    ):
        lenet5(input_shape=(1, 28, 28)).check_inputs(d.X_train)


@pytest.mark.slow
def test_benchmark_cifar10_path_end_to_end(tmp_path, write_cifar10):
    """``--dataset cifar10 --data-dir DIR``: LeNet-5 on (3, 32, 32), all three methods."""
    pytest.importorskip("torch", reason="the backprop baselines need PyTorch (fenchel_cvx[bench])")
    write_cifar10(
        tmp_path / "data" / "cifar-10-batches-py", [20] * 5 + [30], np.random.default_rng(4)
    )
    out = tmp_path / "out"
    run = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "mnist_lenet5.py"),
            "--dataset",
            "cifar10",
            "--data-dir",
            str(tmp_path / "data"),
            "--epochs",
            "2",
            "--batch-size",
            "25",
            "--threads",
            "1",
            "--eval-every",
            "3",
            "--check-every",
            "4",
            "--no-progress",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    summary = check_report(out, ["fln", "adam", "sgd"], [1, 3, 4, 5, 6, 8])  # 4 batches an epoch
    assert summary["data"] == "CIFAR-10, 100 train / 30 test" and summary["settings"]["epochs"] == 2
    assert all(len(r["test_accuracy"]) == 2 for r in summary["methods"].values())


def test_benchmark_names_a_truncated_batch_before_training(tmp_path, write_cifar10):
    write_cifar10(tmp_path / "data", [2] * 6, np.random.default_rng(5))
    (tmp_path / "data" / "test_batch").write_bytes(b"\x80\x02}q")
    run = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "mnist_lenet5.py"),
            "--dataset",
            "cifar10",
            "--data-dir",
            str(tmp_path / "data"),
            "--out",
            str(tmp_path / "o"),
        ],
        capture_output=True,
        text=True,
        timeout=600,  # a hang guard only: the benchmark stops before training, in seconds
    )
    assert run.returncode != 0 and "test_batch: pickle: expected a complete CIFAR-10" in run.stderr
    assert not (tmp_path / "o").exists()


# --- the official release's format: Python 2 pickles ----------------------------------------
class _Global(tuple):
    """``module.name`` as a Python 2 pickle names it."""


class _Reduce(tuple):
    """``(callable, args)``: a REDUCE; ``_Build((obj, state))``: obj, then its state set."""


class _Build(tuple):
    pass


def _ndarray_py2(a):
    """A uint8 array as Python 2's NumPy pickled it: ``_reconstruct(ndarray, (0,), 'b')``,
    then the state ``(1, shape, dtype, is_fortran, raw bytes)``; the dtype is
    ``dtype('u1', 0, 1)`` with the state ``(3, '|', None, None, None, -1, -1, 0)``."""
    dtype = _Build(
        (
            _Reduce((_Global((b"numpy", b"dtype")), (b"u1", 0, 1))),
            (3, b"|", None, None, None, -1, -1, 0),
        )
    )
    array = _Reduce(
        (
            _Global((b"numpy.core.multiarray", b"_reconstruct")),
            (_Global((b"numpy", b"ndarray")), (0,), b"b"),
        )
    )
    return _Build((array, (1, a.shape, dtype, False, a.tobytes())))


def _py2_pickle(obj, protocol):
    """The bytes Python 2's cPickle writes for ``obj`` (bytes are Python 2 str) with protocol
    0 (text opcodes) or 2 (binary opcodes, the official CIFAR-10 batches')."""
    out, memo = [b"\x80\x02" if protocol == 2 else b""], iter(range(1, 1 << 30))

    def put():
        n = next(memo)
        out.append(
            b"p%d\n" % n
            if protocol == 0
            else b"q" + bytes([n])
            if n < 256
            else b"r" + n.to_bytes(4, "little")
        )

    def emit(x):
        if isinstance(x, _Global):
            out.append(b"c" + x[0] + b"\n" + x[1] + b"\n")
        elif isinstance(x, (_Reduce, _Build)):
            emit(x[0]), emit(x[1])
            out.append(b"R" if isinstance(x, _Reduce) else b"b")
            return
        elif x is None or isinstance(x, bool):
            out.append({None: b"N", False: b"I00\n" if protocol == 0 else b"\x89"}[x])
            return
        elif isinstance(x, int):
            out.append(
                b"I%d\n" % x
                if protocol == 0
                else b"K" + bytes([x])
                if 0 <= x < 256
                else b"J" + x.to_bytes(4, "little", signed=True)
            )
            return
        elif isinstance(x, bytes):
            out.append(
                b"S'"
                + b"".join(
                    bytes([c]) if 32 <= c < 127 and c not in b"'\\" else b"\\x%02x" % c for c in x
                )
                + b"'\n"
                if protocol == 0
                else b"U" + bytes([len(x)]) + x
                if len(x) < 256
                else b"T" + len(x).to_bytes(4, "little") + x
            )
        elif isinstance(x, tuple):  # protocol 2: TUPLE1..3 for short ones, as cPickle does
            short = protocol == 2 and 1 <= len(x) <= 3
            out.append(b"" if short else b"(")
            for v in x:
                emit(v)
            out.append(b"\x85\x86\x87"[len(x) - 1 : len(x)] if short else b"t")
        else:  # a dict or a list: empty, then its items after a mark
            out.append(
                {(dict, 0): b"(d", (dict, 2): b"}", (list, 0): b"(l", (list, 2): b"]"}[
                    type(x), protocol
                ]
            )
            put()
            items = [kv for k, v in x.items() for kv in (k, v)] if isinstance(x, dict) else x
            out.append(b"" if protocol == 0 else b"(")
            for i, v in enumerate(items):
                emit(v)
                if protocol == 0 and (isinstance(x, list) or i % 2):
                    out.append(b"a" if isinstance(x, list) else b"s")
            out.append(b"" if protocol == 0 else b"e" if isinstance(x, list) else b"u")
            return
        put()

    emit(obj)
    return b"".join(out) + b"."


@pytest.mark.parametrize("protocol", [0, 2])
def test_python2_batches_of_the_official_release_load(tmp_path, protocol):
    """Batches as the official python version holds them: Python 2 pickles (bytes keys,
    Python 2 str for text and pixels, the dtype named b'u1' with the ints 0 and 1 for align and
    copy). ``pickle.load(encoding="bytes")`` reads them as written; so must load_cifar10, with
    no warning."""
    rng, folder = np.random.default_rng(6), tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    names = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
    batches = {}
    for name, n in zip(names, [3, 2, 2, 2, 2, 4]):
        d = {
            b"batch_label": f"{name} of 5".encode(),
            b"labels": [int(v) for v in rng.integers(0, 10, n)],
            b"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8),
            b"filenames": [f"img_{i}.png".encode() for i in range(n)],
        }
        d[b"data"][0, :4] = [0x27, 0x5C, 0x0A, 0x80]  # a quote, a backslash, a newline
        blob = _py2_pickle(
            {k: _ndarray_py2(v) if k == b"data" else v for k, v in d.items()}, protocol
        )
        (folder / name).write_bytes(blob)
        plain = pickle.loads(blob, encoding="bytes")  # the fixture is a valid pickle
        assert plain[b"labels"] == d[b"labels"] and np.array_equal(plain[b"data"], d[b"data"])
        batches[name] = d
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ds = load_cifar10(tmp_path)
    np.testing.assert_array_equal(ds.X_test * 255, batches["test_batch"][b"data"].T)
    np.testing.assert_array_equal(ds.y_train, sum((batches[n][b"labels"] for n in names[:5]), []))
    assert ds.X_train.shape == (3072, 11)
