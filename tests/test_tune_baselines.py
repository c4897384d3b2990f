"""``benchmarks/tune_baselines.py``: the baselines' learning-rate grid on the benchmarks' own
validation split (``--quick``: the embedded 5k MNIST, 2 epochs), its choice and its report."""

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from _benchmarks import load_benchmark

pytest.importorskip("torch", reason="the backprop baselines need PyTorch (fenchel_cvx[bench])")

ROOT = Path(__file__).resolve().parents[1]


def _load():
    return load_benchmark("tune_baselines")  # it imports the benchmarks beside it


@pytest.fixture(scope="module")
def quick_mlp(tmp_path_factory):
    tune, out = _load(), tmp_path_factory.mktemp("tune")
    report = tune.main(
        [
            "--network",
            "mlp",
            "--quick",
            "--sgd-lrs",
            "1,0.001",
            "--sgd-momentum-lrs",
            "0.03",
            "--adam-lrs",
            "0.003,1e-5",
            "--out",
            str(out),
        ]
    )
    return tune, out, report


def test_quick_grid_chooses_the_best_validation_accuracy(quick_mlp):
    tune, out, report = quick_mlp
    saved = json.loads((out / "tune_mlp.json").read_text())
    assert saved == json.loads(json.dumps(report))
    assert (report["epochs"], report["validation"], report["train_images"]) == (2, 1000, 3000)
    assert [(r["setting"], r["lr"]) for r in report["runs"]] == [
        ("sgd", 1.0),
        ("sgd", 0.001),
        ("sgd_momentum", 0.03),
        ("adam", 0.003),
        ("adam", 1e-5),
    ]
    for r in report["runs"]:
        assert len(r["validation_accuracy"]) == 2  # and the training time is recorded:
        assert isinstance(r["training_seconds"], float) and np.isfinite(r["training_seconds"])
        assert r["momentum"] == (0.9 if r["setting"] == "sgd_momentum" else 0.0)
    final = {(r["setting"], r["lr"]): r["validation_accuracy"][-1] for r in report["runs"]}
    for key, lr in report["chosen"].items():
        assert final[key, lr] == max(acc for (k, _), acc in final.items() if k == key)
    # rates three decades apart: the grid separates them (lr 1e-3 / 1e-5 barely move in 12 steps)
    assert final["sgd", 1.0] > final["sgd", 0.001] + 0.2 and report["chosen"]["sgd"] == 1.0
    assert final["adam", 0.003] > final["adam", 1e-5] + 0.2 and report["chosen"]["adam"] == 0.003
    assert report["paper"] == {"sgd": 1e-2, "adam": 1e-3}


def test_quick_grid_trains_on_the_benchmark_s_split(quick_mlp):
    """A grid point is the benchmark's own run: train_backprop on ``mnist_mlp.load``'s split
    (the last 1,000 training images held out, ``common.data``) gives the same validation
    accuracies."""
    from fenchel_cvx.baselines import train_backprop
    from fenchel_cvx.datasets import batch_order

    tune, _, report = quick_mlp
    bench = sys.modules["mnist_mlp"]
    ds, desc = bench.load(bench.parse_args(["--quick", "--validation", "1000"]))
    assert "validation: the last 1,000 training images" in desc and ds.X_test.shape[1] == 1000
    full = bench.load(bench.parse_args(["--quick"]))[0]
    np.testing.assert_array_equal(ds.X_test, full.X_train[:, -1000:])
    r = train_backprop(
        (784, 300, 10),
        ds.X_train,
        ds.y_train,
        ds.X_test,
        ds.y_test,
        batches=batch_order(3000, 500, 2, seed=0),
        optimizer="sgd",
        lr=0.03,
        momentum=0.9,
        threads=1,
    )
    run = next(r for r in report["runs"] if r["setting"] == "sgd_momentum")
    assert run["validation_accuracy"] == r.test_accuracy


def test_quick_grid_writes_its_tables_and_curves(quick_mlp):
    _, out, report = quick_mlp
    table = (out / "tune_mlp.md").read_text()
    assert "| learning rate | ep 1 | ep 2 |" in table
    for r in report["runs"]:
        first, last = (f"{a:.4f}" for a in r["validation_accuracy"])
        row = (
            f"| **{r['lr']:g}** (chosen) | {first} | **{last}** |"
            if report["chosen"][r["setting"]] == r["lr"]
            else f"| {r['lr']:g} | {first} | {last} |"
        )
        assert row in table
    assert "sgd, momentum 0.9:" in table and "Chosen: sgd 1, sgd_momentum 0.03, adam 0.003" in table
    assert (out / "tune_mlp.png").read_bytes()[:4] == b"\x89PNG"


def test_quick_lenet5_grid_on_its_split(tmp_path):
    """LeNet-5's split: the last 1,000 of the 4,000 training images (``Dataset.for_tuning``)."""
    report = _load().main(
        [
            "--network",
            "lenet5",
            "--quick",
            "--settings",
            "adam",
            "--adam-lrs",
            "0.003",
            "--out",
            str(tmp_path),
        ]
    )
    assert report["train_images"] == 3000 and report["chosen"] == {"adam": 0.003}
    acc = report["runs"][0]["validation_accuracy"]
    assert len(acc) == 2 and acc[-1] > 0.5
    assert (tmp_path / "tune_lenet5.json").exists() and not (tmp_path / "tune_mlp.json").exists()


@pytest.mark.parametrize(
    "argv, message",
    [
        (
            ["--network", "mlp", "--sgd-lrs", "0.1,0"],
            "--sgd-lrs must be learning rates > 0, got '0.1,0'",
        ),
        (
            ["--network", "mlp", "--adam-lrs", "x"],
            "--adam-lrs must be comma-separated numbers, got 'x'",
        ),
        (
            ["--network", "mlp", "--settings", "sgd,rmsprop"],
            "--settings must name sgd, sgd_momentum, adam",
        ),
        (["--network", "mlp", "--epochs", "0"], "--epochs must be >= 1, got 0"),
        (["--network", "resnet"], "invalid choice: 'resnet'"),
        ([], "the following arguments are required: --network"),
    ],
)
def test_bad_arguments_are_named(argv, message, capsys):
    with pytest.raises(SystemExit):
        _load().parse_args(argv)
    assert message in capsys.readouterr().err


def test_score_orders_by_the_last_epoch_then_the_mean():
    score = _load().score
    assert score([0.5, 0.9]) > score([0.95, 0.89])
    assert score([0.8, 0.9]) > score([0.7, 0.9]) and np.isclose(score([0.8, 0.9])[1], 0.85)


def test_resume_keeps_the_previous_runs_and_trains_the_new_rates(quick_mlp, tmp_path):
    tune, out, first = quick_mlp
    report = tune.main(
        [
            "--network",
            "mlp",
            "--quick",
            "--settings",
            "adam",
            "--adam-lrs",
            "0.03",
            "--resume",
            str(out / "tune_mlp.json"),
            "--out",
            str(tmp_path),
        ]
    )
    adam = [r for r in report["runs"] if r["setting"] == "adam"]
    assert [r["lr"] for r in adam] == [0.03, 0.003, 1e-5]  # the union, largest first
    kept = {r["lr"]: r for r in first["runs"] if r["setting"] == "adam"}
    assert adam[1] == kept[0.003] and adam[2] == kept[1e-5]  # not trained again
    best = max(adam, key=lambda r: tune.score(r["validation_accuracy"]))
    assert report["chosen"] == {"adam": best["lr"]}
    with pytest.raises(SystemExit, match="--resume .* is of another run"):
        tune.main(
            [
                "--network",
                "mlp",
                "--quick",
                "--epochs",
                "1",
                "--resume",
                str(out / "tune_mlp.json"),
                "--out",
                str(tmp_path),
            ]
        )
    (tmp_path / "bad.json").write_text('{"runs": 3}')
    with pytest.raises(SystemExit, match="--resume must be a tune_<network>.json report"):
        tune.main(
            [
                "--network",
                "mlp",
                "--quick",
                "--resume",
                str(tmp_path / "bad.json"),
                "--out",
                str(tmp_path),
            ]
        )


@pytest.mark.parametrize("network, name", [("mlp", "mnist_mlp"), ("lenet5", "mnist_lenet5")])
def test_benchmark_defaults_are_the_grid_s_choice(network, name):
    """The benchmarks' TUNED_LR are the rates the committed grid report chose: each setting's
    best validation accuracy after the last epoch, on the benchmark's validation split."""
    report = json.loads(
        (ROOT / "benchmarks" / "results" / f"tune_baselines_{network}.json").read_text()
    )
    tune = _load()
    bench = sys.modules[name]
    assert report["network"] == network and report["validation"] == 10000
    assert "test set" in report["data"] and report["train_images"] == (
        50000 if network == "mlp" else 20000
    )
    assert report["chosen"] == bench.TUNED_LR
    for key, lr in report["chosen"].items():
        runs = [r for r in report["runs"] if r["setting"] == key]
        assert len(runs) >= 5 and len({len(r["validation_accuracy"]) for r in runs}) == 1
        assert max(runs, key=lambda r: tune.score(r["validation_accuracy"]))["lr"] == lr
        assert (
            min(r["lr"] for r in runs) < lr < max(r["lr"] for r in runs)
        )  # not on the grid's edge
