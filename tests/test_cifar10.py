"""CIFAR-10 on small generated files in the official python-pickle and binary formats: the
loader, its errors, and the LeNet-5 benchmark's CIFAR-10 path end to end (CIFAR-10 itself cannot be had here)."""
import subprocess
import sys
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
    assert d.image_shape == (3, 32, 32) and d.X_train.shape == (3072, 11) and d.X_test.dtype == np.float32
    raw = batches["test_batch"][b"data"][3]              # (1024 red, 1024 green, 1024 blue)
    img = d.X_test[:, 3].reshape(d.image_shape)         # the network's (C, H, W) order
    for c, i, j in [(0, 0, 0), (1, 5, 31), (2, 31, 7)]:
        assert img[c, i, j] == np.float32(raw[c * 1024 + i * 32 + j] / 255)
    net = lenet5(input_shape=d.image_shape, loss="cross_entropy", dtype="float32")
    assert net.forward(d.X_test)[1].shape == (10, 4)


def test_a_truncated_batch_is_named(tmp_path, write_cifar10):
    write_cifar10(tmp_path / "c", [4] * 6, np.random.default_rng(1))
    path = tmp_path / "c" / "data_batch_2"
    path.write_bytes(path.read_bytes()[:5000])
    with pytest.raises(FileFormatError, match=f"{path}: pickle: expected a complete CIFAR-10 "
                                              f"python batch, found a truncated or foreign "
                                              f"pickle of 5000 bytes"):
        load_cifar10(tmp_path / "c")
    path.write_bytes(b"")
    with pytest.raises(FileFormatError, match=f"{path}: expected a CIFAR-10 python batch file, "
                                              f"found an empty file"):
        load_cifar10(tmp_path / "c")


def test_missing_batches_are_named_before_any_is_read(tmp_path, write_cifar10):
    write_cifar10(tmp_path / "c", [4] * 6, np.random.default_rng(2))
    (tmp_path / "c" / "data_batch_1").write_bytes(b"not a pickle")   # would fail if it were read
    (tmp_path / "c" / "data_batch_4").unlink()
    (tmp_path / "c" / "test_batch").unlink()
    with pytest.raises(FileNotFoundError, match=f"{tmp_path / 'c' / 'data_batch_4'}, "
                                                f"{tmp_path / 'c' / 'test_batch'} not found"):
        load_cifar10(tmp_path / "c")


def test_cifar_images_do_not_fit_an_mnist_network(tmp_path, write_cifar10):
    write_cifar10(tmp_path / "c", [2] * 6, np.random.default_rng(3))
    d = load_cifar10(tmp_path / "c")
    with pytest.raises(ValueError, match=r"X0 must have 784 rows \(an input of shape \(1, 28, 28\), "
                                         r"flattened\), got shape \(3072, 10\)"):
        lenet5(input_shape=(1, 28, 28)).check_inputs(d.X_train)


@pytest.mark.slow
def test_benchmark_cifar10_path_end_to_end(tmp_path, write_cifar10):
    """``--dataset cifar10 --data-dir DIR``: LeNet-5 on (3, 32, 32), all three methods."""
    pytest.importorskip("torch", reason="the backprop baselines need PyTorch (fenchel_cvx[bench])")
    write_cifar10(tmp_path / "data" / "cifar-10-batches-py", [20] * 5 + [30], np.random.default_rng(4))
    out = tmp_path / "out"
    run = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "mnist_lenet5.py"), "--dataset",
                          "cifar10", "--data-dir", str(tmp_path / "data"), "--epochs", "2",
                          "--batch-size", "25", "--threads", "1", "--eval-every", "3",
                          "--check-every", "4", "--no-progress", "--out", str(out)],
                         capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    summary = check_report(out, ["fln", "adam", "sgd"], [1, 3, 4, 5, 6, 8])   # 4 batches an epoch
    assert summary["data"] == "CIFAR-10, 100 train / 30 test" and summary["settings"]["epochs"] == 2
    assert all(len(r["test_accuracy"]) == 2 for r in summary["methods"].values())


def test_benchmark_names_a_truncated_batch_before_training(tmp_path, write_cifar10):
    write_cifar10(tmp_path / "data", [2] * 6, np.random.default_rng(5))
    (tmp_path / "data" / "test_batch").write_bytes(b"\x80\x02}q")
    run = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "mnist_lenet5.py"), "--dataset",
                          "cifar10", "--data-dir", str(tmp_path / "data"), "--out", str(tmp_path / "o")],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode != 0 and "test_batch: pickle: expected a complete CIFAR-10" in run.stderr
    assert not (tmp_path / "o").exists()
