"""The benchmarks' shared harness (``benchmarks/common``): one data loader with one validation
rule, one flag vocabulary, and scripts short enough to read."""

import argparse
import ast
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from _benchmarks import BENCHMARKS, load_benchmark

load_benchmark("mnist_mlp")  # puts benchmarks/ on the path: the harness imports as ``common``
from common import data  # noqa: E402

SCRIPTS = sorted(p for p in BENCHMARKS.glob("*.py"))
#: the runnable scripts that read no data set: the report generators (they read JSON), the
#: fuzzing harness and the hostile-file battery (they write their own files to test the package's
#: readers)
NO_DATA = (
    "results_tables.py", "results_figures.py", "fuzz_readers.py", "hostile_battery.py",
    "rank_faults.py",  # (the embedded digits, through the command)
    "scaling_plot.py",  # (the copied JSON of docs/results)
    "oracle_sweep.py",  # (Gaussian points drawn from its seeds)
    "kill_writes.py",  # (the embedded digits, through the command)
    "conv_kernels.py",  # (Gaussian arrays of LeNet-5's shapes)
)  # fmt: skip
#: the scripts that read MNIST
READERS = [p for p in SCRIPTS if "__main__" in p.read_text() and p.name not in NO_DATA]


def _quick(**flags):
    return argparse.Namespace(quick=True, data_dir=None, dtype="float64", **flags)


def test_validation_holds_out_the_last_training_images():
    """``--validation N`` scores on the last N training images and ``--train-size M`` trains on
    the first M of the others, the same for every network (docs page "Tuning")."""
    full, _ = data.load(_quick(validation=0, train_size=None))
    ds, desc = data.load(_quick(validation=1000, train_size=2500))
    np.testing.assert_array_equal(ds.X_test, full.X_train[:, -1000:])
    np.testing.assert_array_equal(ds.y_test, full.y_train[-1000:])
    np.testing.assert_array_equal(ds.X_train, full.X_train[:, :2500])
    assert "validation: the last 1,000 training images" in desc and "2,500 train" in desc


@pytest.mark.parametrize(
    "flags, message",
    [
        (dict(validation=4000), "--validation must be < the 4000 training images, got 4000"),
        (dict(validation=1000, train_size=3001), "--train-size must be <= the 3000"),
    ],
)
def test_a_split_that_does_not_fit_is_refused_by_flag(flags, message):
    with pytest.raises(SystemExit, match=message):
        data.load(_quick(**{"validation": 0, "train_size": None, **flags}))


def test_missing_data_is_refused_naming_the_flag(tmp_path):
    """The loader's error, worded for the benchmarks: their flag, never a Python keyword."""
    args = argparse.Namespace(quick=False, data_dir=str(tmp_path), dtype="float32")
    with pytest.raises(SystemExit) as err:
        data.load(args)
    text = str(err.value)
    assert text.startswith("--data-dir: ") and str(tmp_path) in text
    assert "download=True" not in text and "data_dir " not in text


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: p.name)
def test_every_benchmark_file_is_at_most_400_lines(path):
    assert len(path.read_text().splitlines()) <= 400


def test_every_harness_module_is_at_most_400_lines():
    for path in (BENCHMARKS / "common").glob("*.py"):
        assert len(path.read_text().splitlines()) <= 400, path.name


@pytest.mark.parametrize("path", READERS, ids=lambda p: p.name)
def test_every_data_reading_script_takes_data_dir_and_no_data_flag(path):
    """One flag vocabulary: ``--data-dir`` in every script that reads MNIST, ``--data`` in
    none (its help, run in a child process, lists the flags)."""
    run = subprocess.run(
        [sys.executable, str(path), "--help"], capture_output=True, text=True, timeout=600
    )  # the timeout only catches a hang
    assert run.returncode == 0, run.stderr
    assert "--data-dir" in run.stdout and "--data " not in run.stdout.replace("--data-dir", "")


@pytest.mark.parametrize("path", READERS, ids=lambda p: p.name)
def test_no_script_loads_data_but_through_the_harness(path):
    """One data loader: no benchmark calls the package's loaders (``load_mnist``,
    ``load_mnist5k``, ``load_cifar10``) itself; ``common.data.load`` does."""
    tree = ast.parse(path.read_text())
    called = {
        node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", None)
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
    }
    assert not called & {"load_mnist", "load_mnist5k", "load_cifar10"}


@pytest.mark.parametrize("name", ["mnist_mlp", "mnist_lenet5"])
def test_a_run_writes_under_runs_unless_told_and_refuses_an_unwritable_out(name, tmp_path):
    """Without ``--out`` a run's report goes to ``runs/<benchmark>``; an ``--out`` that cannot
    be a folder is refused by name before any run starts."""
    bench = load_benchmark(name)
    assert Path(bench.parse_args(["--quick"]).out).parent == BENCHMARKS.parent / "runs"
    blocker = tmp_path / "a file"
    blocker.write_text("")
    with pytest.raises(SystemExit, match="--out must be a writable folder"):
        bench.main(["--quick", "--out", str(blocker / "report")])


def _row(method, nproc, threads, per_epoch, seconds_to):
    from common import reports

    return dict(
        launch=dict(method=method, nproc=nproc, threads=threads),
        seconds_per_epoch=per_epoch,
        seconds_to=dict(zip(reports.LEVELS, seconds_to)),
    )


def test_launches_parse_and_each_fln_launch_is_set_against_the_fastest_adam():
    """``--methods fln:r2t1,adam:t1,adam:t2,adam:r2t1``: each launch its own ranks and threads
    (the run's ``--nproc``, ``--threads`` where not given), each task its launch; the ratios and
    the seconds-to table set each FLN launch against the fastest Adam launch, level by level;
    the seeds' seconds to an accuracy are their median."""
    from common import flags, reports, runner

    p = argparse.ArgumentParser()
    flags.add_run_flags(p, out=None)
    args = p.parse_args(["--methods", "fln:r2t1,adam:t1,adam:t2,adam:r2t1,sgd", "--threads", "3"])
    args.quick, args.device, args.compile_blocks = False, "cpu", False
    flags.check_run_flags(p, args)
    assert args.launches == {
        "fln:r2t1": ("fln", 2, 1),
        "adam:t1": ("adam", 1, 1),
        "adam:t2": ("adam", 1, 2),
        "adam:r2t1": ("adam", 2, 1),
        "sgd": ("sgd", 1, 3),
    }
    tasks = runner.method_tasks(args)
    assert [(label, a.method, a.nproc, a.threads) for label, a in tasks][:2] == [
        ("fln:r2t1", "fln", 2, 1),
        ("adam:t1", "adam", 1, 1),
    ]
    rows = {
        "fln:r2t1": _row("fln", 2, 1, 10.0, (2.0, 3.0, 6.0, 11.0)),
        "adam:t1": _row("adam", 1, 1, 6.4, (4.0, 5.0, 9.0, None)),
        "adam:t2": _row("adam", 1, 2, 3.5, (2.5, 3.0, 5.0, 7.0)),
        "adam:r2t1": _row("adam", 2, 1, 4.0, (2.0, 3.5, 4.0, 8.0)),
    }
    assert reports.ratios_over_adam(rows) == {
        "seconds_per_epoch_fln:r2t1_over_adam:t2": pytest.approx(10 / 3.5)
    }
    summary = dict(methods=rows, machine=dict(threads=1, blas="-", cpu_gemm_gflops={}))
    line = next(t for t in reports.level_table(summary) if t.startswith("| fln:r2t1 / fastest"))
    assert line == "| fln:r2t1 / fastest adam | 1.00 | 1.00 | 1.50 | 1.57 |"
    assert reports.launch_text(rows).startswith("fln:r2t1 2 x 1, adam:t1 1 x 1")
    assert reports.median([3.0, 30.0, 4.0]) == 4.0 and reports.median([3.0, None]) is None


def test_shares_sum_over_p_shards_like_this_one_and_keep_its_maxima():
    """``common.counting.Shares``: a solve timed as one of P ranks takes the P-rank paths (the
    batch's point count, its sums' scale) at one shard's cost, each reduction counted."""
    from common.counting import Shares

    comm = Shares(2)
    out = comm.reduce([np.array([1.5, -1.0]), 250, 3.0], ("sum", "sum", "max"))
    assert [np.asarray(v).tolist() for v in out] == [[3.0, -2.0], 500, 3.0]
    assert comm.reduce([4.0], "min") == [4.0] and comm.calls == 2 and comm.columns is comm


def test_the_cost_model_waits_for_the_rank_that_solves_the_most_blocks_by_layer():
    """``common.rank_model.model``: the W-blocks solved by layer count at their one-rank seconds,
    and the batch at the largest of the ranks' loads (W_2 on rank 1 against W_3 and W_4 on rank
    0), with the split's three collectives; the other blocks at their shares."""
    from common.latency import latency
    from common.rank_model import model

    table = {1024: 1e-4, 1 << 20: 2e-3}

    def block(compute, collectives=2.0):
        return dict(compute_s=compute, moved=0.0, collectives=collectives, bytes=800.0,
                    column_bytes=4e5, w_bytes=2e5)  # fmt: skip

    def figures():
        return {"X_1": block(0.040), "W_2": block(0.010), "W_3": block(0.003), "W_4": block(0.002)}

    share = {k: dict(compute_s=f["compute_s"] / 2, as_on_ranks=0.0) for k, f in figures().items()}
    by_layer = figures()
    m = model(by_layer, 0.070, share, 0.040, table, 2, {2: 1, 3: 0, 4: 0})
    assert m["layer_loads_s"] == [0.005, 0.010]  # rank 0: W_3 + W_4; rank 1: W_2
    assert m["rank_blocks_s"] == pytest.approx(0.020 + 0.010)  # X_1's share + the most
    assert by_layer["W_2"]["layer_rank"] == 1 and by_layer["W_2"]["rank_s"] == 0.010
    # rank 1 sends its share of W_3's and W_4's columns (2 x 400 KB / 2), rank 0 of W_2's; the
    # W's: rank 0's two (2 x 200 KB); the reports
    split = latency(table, 4e5) + latency(table, 4e5) + latency(table, 1024)
    assert m["layer_split_comm_s"] == pytest.approx(split)
    assert m["comm_s"] == pytest.approx(2 * latency(table, 400) + m["layer_split_comm_s"])
    by_columns = model(figures(), 0.070, share, 0.040, table, 2, {})
    assert (
        by_columns["rank_blocks_s"] == pytest.approx(0.0275)
        and by_columns["layer_split_comm_s"] == 0
    )
