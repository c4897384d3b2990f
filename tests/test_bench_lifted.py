"""Smoke test of benchmarks/mnist_lifted.py: its --quick run (embedded 5k MNIST) finishes and
writes one entry per method, a table that agrees with it and the plot; bad flags are refused."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "mnist_lifted.py"


@pytest.mark.slow
def test_quick_run_writes_one_entry_per_method(tmp_path):
    pytest.importorskip("torch", reason="the SGD baseline needs PyTorch (fenchel_cvx[bench])")
    run = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            "--quick",
            "--out",
            str(tmp_path),
            "--iterations",
            "taylor=2,lau=2,askari=2,sgd=2,fln=2",
            "--train-size",
            "1000",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    summary = json.loads((tmp_path / "results.json").read_text())
    table = (tmp_path / "results.md").read_text()
    assert (tmp_path / "accuracy.png").stat().st_size > 0
    assert set(summary["methods"]) == {"taylor", "lau", "askari", "sgd", "fln"}
    assert summary["data"].endswith("1,000 train / 1,000 test")  # --train-size 1000
    # the machine record of every MNIST benchmark (common.devices.machine): these run on the CPU
    assert summary["machine"]["device"] == "CPU" and summary["machine"]["threads"] == 1
    assert summary["machine"]["cpus"] >= 1 and summary["machine"]["processor"]
    for name, row in summary["methods"].items():
        records = summary["raw"][name]["records"]
        assert [r["iteration"] for r in records] == [1, 2]
        assert row["final_test_accuracy"] == records[-1]["test_accuracy"]
        assert 0 <= row["final_test_accuracy"] <= 1
        assert isinstance(row["seconds_per_iteration"], float)  # recorded (speed: not a test's)
        assert np.isfinite(row["seconds_per_iteration"])
        assert f"| {name} | {row['final_test_accuracy']:.4f} | {row['paper']:.3f} |" in table


@pytest.mark.parametrize(
    "flags, word",
    [
        (["--methods", "lau,admm"], "--methods"),
        (["--set", "lau.rho=0"], "rho"),
        (["--set", "taylor.beta=-1", "--methods", "taylor"], "beta"),
        (["--set", "lau.loss='cross_entropy'"], "loss"),
        (["--iterations", "lau=0"], "--iterations"),
        (["--set", "norho"], "--set"),
        (["--train-size", "-1"], "--train-size must be >= 0"),
        (["--validation", "-1"], "--validation must be >= 0"),
    ],
)
def test_bad_flags_are_refused_before_any_work(flags, word, tmp_path, capsys):
    spec = importlib.util.spec_from_file_location("mnist_lifted", SCRIPT)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    with pytest.raises(SystemExit) as err:
        bench.parse_args([*flags, "--out", str(tmp_path / "o")])
    assert err.value.code == 2 and word in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def _bench():
    spec = importlib.util.spec_from_file_location("mnist_lifted", SCRIPT)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench


def test_validation_and_train_size_split_the_training_images():
    """--validation N scores on the last N training images; --train-size K trains on the first K."""
    from fenchel_cvx.datasets import load_mnist5k

    bench, full = _bench(), load_mnist5k()
    (X, Y, Xv, Yv), desc = bench.load(
        bench.parse_args(["--quick", "--validation", "1000", "--train-size", "1500"])
    )
    assert X.shape[1] == 1500 and Xv.shape[1] == 1000 and "test set unused" in desc
    np.testing.assert_array_equal(Xv, full.X_train[:, -1000:].astype(np.float32))
    np.testing.assert_array_equal(X, full.X_train[:, :1500].astype(np.float32))
    np.testing.assert_array_equal(Yv.argmax(0), full.y_train[-1000:])
    with pytest.raises(SystemExit, match="--train-size must be <= the 3000"):
        bench.load(bench.parse_args(["--quick", "--validation", "1000", "--train-size", "3001"]))
