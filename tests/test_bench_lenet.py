"""Smoke test of ``benchmarks/mnist_lenet5.py --quick``: it finishes and writes what it promises.

The figures are measured, never asserted (the targets live in the benchmark's report); what is
asserted is that every method ran on the same schedule from the same start, the report files
exist and agree with each other, and FLN's certificate ran on the rounds it checked.
"""

import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from _benchmarks import load_benchmark

ROOT = Path(__file__).resolve().parents[1]


def _load():
    return load_benchmark("mnist_lenet5")


def check_report(out, methods, batches):
    """The report in ``out``: the same checkpoints for every method, the table and the JSON
    agree."""
    summary = json.loads((out / "results.json").read_text())
    table = (out / "results.md").read_text()
    assert (out / "accuracy.png").stat().st_size > 0
    assert set(summary["methods"]) == set(methods)
    inits = {summary["raw"][m][0]["initial_test_accuracy"] for m in methods}
    assert max(inits) - min(inits) <= 0.002  # one start: the lifted network's weights
    for name, row in summary["methods"].items():
        assert 0 <= row["final_test_accuracy"] <= 1
        assert isinstance(row["seconds_per_epoch"], float)  # recorded (speed: not a test's)
        assert math.isfinite(row["seconds_per_epoch"])
        assert f"| {row['final_test_accuracy']:.4f} | {row['seconds_per_epoch']:.2f} |" in table
        assert [c[0] for c in summary["raw"][name][0]["checkpoints"]] == batches
        assert row["accuracy_at_batches"]["1"] == summary["raw"][name][0]["checkpoints"][0][2]
    if "adam" in methods and "fln" in methods:
        assert summary["ratios"]["seconds_per_epoch_fln_over_adam"] == pytest.approx(
            summary["methods"]["fln"]["seconds_per_epoch"]
            / summary["methods"]["adam"]["seconds_per_epoch"]
        )
    return summary


@pytest.mark.slow
def test_quick_run_writes_its_report(tmp_path):
    """As users run it (a script: each method in a spawned process), on 1,500 images: 3 batches
    (FLN's chains eager: what is tested is the report; the compiled chains have their own
    tests)."""
    pytest.importorskip("torch", reason="the backprop baselines need PyTorch (fenchel_cvx[bench])")
    run = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "mnist_lenet5.py"),
            "--quick",
            "--epochs",
            "1",
            "--train-size",
            "1500",
            "--threads",
            "1",
            "--eval-every",
            "2",
            "--check-every",
            "2",
            "--train-eval",
            "500",
            "--no-progress",
            "--sgd-momentum",
            "0.9",
            "--no-compile",
            "--out",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    summary = check_report(tmp_path, ["fln", "adam", "sgd"], [1, 2, 3])
    assert summary["settings"]["gamma"] == [1e-4, 1e-2, 0.3, 0.3, 1] and summary["settings"][
        "lam"
    ] == [10, 10, 2, 2]
    # three batches: FLN's host reads per unchecked batch are counted (array_api_strict), one
    fln = summary["methods"]["fln"]
    assert fln["host_reads_per_batch"] == 1
    assert fln["host_reads_by_source"] == {"fenchel_cvx.block_checks.CheckedSolves.settle": 1}
    assert "fln: 1 host read per unchecked batch" in (tmp_path / "results.md").read_text()
    machine = summary["machine"]
    assert machine["cpu_gemm_gflops"]["numpy"] > 0 and "numpy: " in machine["blas"]
    cert = summary["raw"]["fln"][0]["certificate"]
    assert (cert["rounds"], cert["checked"]) == (3, 2)  # round 2 and the last
    assert cert["min_bound_gap"] > 0  # F < J after every checked X-sweep
    (report,) = summary["methods"]["fln"]["epoch_reports"]  # --train-eval: one per epoch
    assert 0.5 < report["train_accuracy"] <= 1
    assert len(report["weight_change"]) == 5 and all(c > 0 for c in report["weight_change"])
    assert "epoch_reports" not in summary["methods"]["adam"]
    tuned = _load().TUNED_LR  # SGD with momentum at its own tuned rate, recorded beside the paper's
    rates = summary["settings"]["learning_rates"]
    assert rates["used"] == dict(sgd=tuned["sgd_momentum"], sgd_momentum=0.9, adam=tuned["adam"])
    assert rates["paper"] == {"sgd": 1e-2, "adam": 1e-3}
    assert (
        f"Baselines: SGD lr {tuned['sgd_momentum']:g} (momentum 0.9), Adam lr {tuned['adam']:g}; "
        "paper's: SGD 0.01, Adam 0.001"
    ) in (tmp_path / "results.md").read_text()


@pytest.mark.slow
def test_seeds_report_their_mean_and_spread(tmp_path):
    """--seeds 2: each method runs seeds 3 and 4 (its own start and batch order); the figures
    are their means, the final accuracy's spread is max - min, and the table says so (FLN's
    chains eager: what is tested is the report)."""
    run = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "mnist_lenet5.py"),
            "--quick",
            "--methods",
            "fln",
            "--epochs",
            "1",
            "--train-size",
            "1000",
            "--threads",
            "1",
            "--jobs",
            "2",
            "--seed",
            "3",
            "--seeds",
            "2",
            "--eval-every",
            "2",
            "--check-every",
            "2",
            "--no-progress",
            "--w-steps",
            "2,1,1,1,1",
            "--no-compile",  # (the report's figures, not the kernels: eager NumPy)
            "--out",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    summary = json.loads((tmp_path / "results.json").read_text())
    runs, row = summary["raw"]["fln"], summary["methods"]["fln"]
    assert [r["seed"] for r in runs] == [3, 4]
    assert runs[0]["initial_test_accuracy"] != runs[1]["initial_test_accuracy"]  # two starts
    finals = [r["test_accuracy"][-1] for r in runs]
    assert row["final_test_accuracy_per_seed"] == finals
    assert row["final_test_accuracy"] == pytest.approx(sum(finals) / 2)
    assert row["final_test_accuracy_spread"] == pytest.approx(max(finals) - min(finals))
    at1 = [r["checkpoints"][0][2] for r in runs]
    assert row["accuracy_at_batches"]["1"] == pytest.approx(sum(at1) / 2)
    table = (tmp_path / "results.md").read_text()
    assert "seeds 3..4: means" in table
    assert summary["settings"]["w_steps"] == [2, 1, 1, 1, 1] and "W-steps (2, 1, 1, 1, 1)," in table
    assert (
        f"| {row['final_test_accuracy']:.4f} +- {row['final_test_accuracy_spread']:.4f} |" in table
    )


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--lam", "5,5,1"], "--lam must be 1 or 4 finite numbers"),
        (["--gamma", "1,x"], "--gamma must be 5 comma-separated numbers"),
        (["--lam", "0"], "--lam must be > 0"),
        (["--x-steps", "0"], "--x-steps must be 1 or 4 integers >= 1"),
        (["--x-steps", "1,2,3"], "--x-steps must be 1 or 4 integers >= 1"),
        (["--x-steps", "1,a"], "--x-steps must be 4 comma-separated integers"),
        (["--w-steps", "0"], "--w-steps must be 1 or 5 integers >= 1"),
        (["--w-steps", "2,2"], "--w-steps must be 1 or 5 integers >= 1"),
        (["--adam-lr", "0"], "--adam-lr must be > 0"),
        (["--sgd-momentum", "0.95"], "--sgd-momentum 0.95 has no tuned learning rate"),
        (["--rho", "-1"], "--rho must be 1 or 5 finite numbers >= 0"),
        (["--rho", "0,1"], "--rho must be 1 or 5 finite numbers >= 0"),
        (["--methods", "fln,lbfgs"], "--methods must name fln, adam, sgd"),
        (["--methods", "adam:x2"], "NAME:rPtT; got 'adam:x2'"),
        (["--methods", "adam:"], "NAME:rPtT; got 'adam:'"),
        (["--methods", "adam:t0"], "--methods 'adam:t0': ranks and threads must be >= 1"),
        (["--methods", "adam:r2,adam:r2"], "--methods names 'adam:r2' twice"),
        (["--methods", "fln:r2", "--device", "torch"], "--methods fln:r2: ranks run on the CPU"),
        (["--dataset", "cifar10", "--quick"], "--quick runs the embedded 5k MNIST"),
        (["--dataset", "svhn"], "invalid choice: 'svhn'"),
        (["--validation", "-5"], "--validation must be >= 0"),
        (["--train-eval", "-1"], "--train-eval must be >= 0, got -1"),
        (["--jobs", "0"], "--jobs must be >= 1, got 0"),
        (["--seeds", "0"], "--seeds must be >= 1, got 0"),
        (["--gram-reuse", "0"], "--gram-reuse must be 1 or 5 integers >= 1"),
        (["--momentum", "0.9,0.9"], "--momentum must be 1 or 5 finite numbers >= 0"),
        (["--momentum", "0.5,1,0,0,0"], "--momentum must be in [0, 1), got 0.5,1.0,0.0,0.0,0.0"),
        (["--gram-reuse", "8,8"], "--gram-reuse must be 1 or 5 integers >= 1"),
        (["--device", "tpu"], "invalid choice: 'tpu'"),
    ]
    + (
        [(["--device", "cupy"], "--device cupy needs CuPy and a GPU")]
        if importlib.util.find_spec("cupy") is None
        else []
    ),
)
def test_bad_arguments_are_named(argv, message, capsys):
    with pytest.raises(SystemExit):
        _load().parse_args(argv)
    assert message in capsys.readouterr().err


def test_defaults_are_the_papers_but_the_dense_gammas_momentum_and_the_output_penalty():
    """The appendix's lam (5, 5, 1, 1) and rho (1e-4, 1e-2, 1, 1, 1) in this package's units;
    the defaults change the dense layers' gamma, add momentum and a Frobenius penalty on the
    output layer (tuned on validation)."""
    bench = _load()
    assert bench.PAPER_GAMMA == (1e-4, 1e-2, 1.0, 1.0, 1.0) and bench.PAPER_LAM == (
        10.0,
        10.0,
        2.0,
        2.0,
    )
    args = bench.parse_args([])
    assert (args.epochs, args.batch_size, args.alternations) == (20, 500, 1)
    assert args.gamma == (1e-4, 1e-2, 0.3, 0.3, 1.0) and args.lam == bench.PAPER_LAM
    assert args.rho == (0.0, 0.0, 0.0, 0.0, 0.3)
    assert (args.adam_lr, args.sgd_lr) == (bench.TUNED_LR["adam"], bench.TUNED_LR["sgd"])
    assert bench.parse_args(["--rho", "0,0,0,0,0.01"]).rho == (0.0, 0.0, 0.0, 0.0, 0.01)
    assert args.momentum == (0.98, 0.98, 0.3, 0.3, 0.0)
    assert args.w_steps == (1,) * 5 and bench.parse_args(["--w-steps", "2"]).w_steps == (2,) * 5
    from common.fln import fln_backend

    assert fln_backend(bench.parse_args(["--w-steps", "2,3,1,1,1"])).w_steps == (
        2,
        3,
        1,
        1,
        1,
    )
    assert bench.parse_args(["--momentum", "0"]).momentum == (0.0,) * 5
    assert bench.parse_args(["--dataset", "cifar10"]).epochs == 80
    assert bench.parse_args(["--quick", "--epochs", "7"]).epochs == 2
    assert bench.parse_args(["--lam", "3"]).lam == (3.0,) * 4
    # the conv layers' patch Grams serve 40 batches, the dense layers' one
    assert (
        args.gram_reuse == (40, 40, 1, 1, 1)
        and bench.parse_args(["--gram-reuse", "2"]).gram_reuse == (2,) * 5
    )


def test_validation_split_replaces_the_test_set():
    """--validation N: the last N training images become the evaluation set, never the test set."""
    bench = _load()
    full, _ = bench.load(bench.parse_args(["--quick"]))
    ds, desc = bench.load(
        bench.parse_args(["--quick", "--validation", "1000", "--train-size", "2000"])
    )
    assert ds.X_train.shape[1] == 2000 and ds.X_test.shape[1] == 1000 and "test set unused" in desc
    assert (ds.X_test == full.X_train[:, -1000:]).all() and (
        ds.y_test == full.y_train[-1000:]
    ).all()
    assert (ds.X_train == full.X_train[:, :2000]).all()
    with pytest.raises(SystemExit, match="--validation must be < the 4000"):
        bench.load(bench.parse_args(["--quick", "--validation", "4000"]))
    with pytest.raises(
        SystemExit, match="--train-size must be <= the 3000 training images, got 3001"
    ):
        bench.load(bench.parse_args(["--quick", "--validation", "1000", "--train-size", "3001"]))
    with pytest.raises(
        SystemExit, match="--train-eval must be at most the 2,000 training images, got 2001"
    ):
        bench.load(
            bench.parse_args(
                ["--quick", "--validation", "1000", "--train-size", "2000", "--train-eval", "2001"]
            )
        )


@pytest.mark.slow
def test_fln_on_two_ranks_reaches_the_one_process_accuracy(tmp_path):
    """``--nproc 2``: FLN trains on two ranks (``parallel.Ranks``, started before the clock),
    the report says so, and its accuracies are the one-process run's (the same iterates to
    round-off). Both runs eager (``--no-compile``): ranks that compile their kernels before the
    clock are ``figure1_ranks.py``'s (``test_benchmarks``)."""
    pytest.importorskip("torch", reason="ranks need PyTorch (fenchel_cvx[bench])")
    reports = {}
    for nproc in (1, 2):
        out = tmp_path / f"nproc{nproc}"
        run = subprocess.run(
            [
                sys.executable, str(ROOT / "benchmarks" / "mnist_lenet5.py"), "--quick",
                "--methods", "fln", "--epochs", "1", "--train-size", "1000", "--threads", "1",
                "--nproc", str(nproc), "--eval-every", "1", "--no-progress", "--no-compile",
                "--out", str(out),
            ],
            capture_output=True, text=True, timeout=900,
        )  # fmt: skip
        assert run.returncode == 0, run.stderr[-3000:]
        reports[nproc] = json.loads((out / "results.json").read_text())
    assert [reports[n]["machine"]["fln_ranks"] for n in (1, 2)] == [1, 2]
    assert "ranks x threads: fln 2 x 1;" in (tmp_path / "nproc2" / "results.md").read_text()
    one, two = (reports[n]["raw"]["fln"][0] for n in (1, 2))
    assert [c[0] for c in two["checkpoints"]] == [c[0] for c in one["checkpoints"]] == [1, 2]
    for (_, _, a), (_, _, b) in zip(one["checkpoints"], two["checkpoints"]):
        assert abs(a - b) <= 0.002  # (1,000 test images: at most 2 predictions apart)
