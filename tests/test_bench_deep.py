"""``benchmarks/mnist_deep.py``: FLN against Adam and SGD at several depths.

The figures are measured, never asserted (the targets live in the benchmark's report). What is
asserted: bad flags are refused by name; the quick run (the embedded 5k MNIST, depths 1 and 2)
writes a report in which every depth has every method, each baseline's learning rate is the best
of its grid on the validation split, every method starts from the same weights, and FLN's
relaxation log has one divergence per hidden layer and a gap J - F >= 0 (F is a lower bound).
"""

import json
import subprocess
import sys

import pytest

from _benchmarks import ROOT, load_benchmark


def _load():
    return load_benchmark("mnist_deep")


@pytest.mark.parametrize(
    "flags, flag",
    [
        (["--depths", "0,2"], "--depths"),
        (["--depths", "two"], "--depths"),
        (["--width", "0"], "--width"),
        (["--methods", "fln,rmsprop"], "--methods"),
        (["--adam-lrs", "1e-3,-1"], "--adam-lrs"),
        (["--tune-epochs", "0"], "--tune-epochs"),
        (["--activation", "softplus"], "--activation"),
    ],
)
def test_bad_flags_are_refused_by_name(flags, flag, capsys):
    with pytest.raises(SystemExit) as exc:
        _load().parse_args(flags)
    assert exc.value.code == 2 and flag in capsys.readouterr().err


def test_quick_mode_shrinks_the_run():
    args = _load().parse_args(["--quick"])
    assert args.depths == (1, 2) and args.width == 32 and args.epochs == 2
    assert args.tune_epochs == 1 and len(args.adam_lrs) == 2 and len(args.sgd_lrs) == 2


@pytest.mark.slow
def test_quick_run_reports_every_depth_and_method(tmp_path):
    pytest.importorskip("torch", reason="the baselines need PyTorch (the bench extra)")
    run = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "mnist_deep.py"),
            "--quick",
            "--epochs",
            "1",
            "--check-every",
            "4",
            "--jobs",
            "2",
            "--out",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    summary = json.loads((tmp_path / "results.json").read_text())
    table = (tmp_path / "results.md").read_text()
    assert (tmp_path / "accuracy_vs_depth.png").stat().st_size > 0
    assert set(summary["methods"]) == {"1", "2"}
    for depth, by in summary["methods"].items():
        assert set(by) == {"fln", "adam", "sgd"}
        for method in ("adam", "sgd"):
            tuned = summary["tuning"][depth][method]
            assert len(tuned["grid"]) == 2
            assert tuned["grid"][str(tuned["lr"])] == max(tuned["grid"].values())
            assert by[method]["lr"] == tuned["lr"]
        raw = summary["raw"][depth]
        inits = {raw[m][0]["initial_test_accuracy"] for m in raw}
        assert max(inits) - min(inits) <= 0.002  # one start: the lifted network's weights
        for method, row in by.items():
            assert 0.2 < row["final_test_accuracy"] <= 1  # above chance after one epoch
            assert f"| {depth} | {method} | {row['final_test_accuracy']:.4f}" in table
        log = raw["fln"][0]["relaxation"]
        assert log and all(len(entry["divergences"]) == int(depth) for entry in log)
        assert all(entry["gap"] >= -1e-6 * (1 + abs(entry["gap"])) for entry in log)
