"""``benchmarks/mnist_deep.py`` (FLN against Adam and SGD at several depths) and
``benchmarks/deep_screen.py`` (a screen of FLN's settings at one depth).

The figures are measured, never asserted (the targets live in the benchmarks' reports). What is
asserted: bad flags are refused by name; the quick run (the embedded 5k MNIST, depths 1 and 2;
FLN, Adam and the ``lau`` peer) writes a report in which every depth has every method run, the
baseline's learning rate is the best of its grid on the validation split, every method starts
from the same weights, and FLN's relaxation log has one divergence per hidden layer and a gap
J - F >= 0 (F is a lower bound).
The screen's hypotheses each change what their description says of the dense setting and keep
one value per layer; the He and orthogonal initialisations have ReLU's gain; the quick screen
reports every hypothesis on the validation split; and the dense setting at depth 1 is the MNIST
MLP's tuned one, whatever rule deeper layers follow.
"""

import dataclasses
import json
import re
import subprocess
import sys

import numpy as np
import pytest

from _benchmarks import ROOT, load_benchmark
from fenchel_cvx import LiftedNetwork, defaults


def _load():
    return load_benchmark("mnist_deep")


@pytest.mark.parametrize(
    "script, flags, flag",
    [
        ("mnist_deep", ["--depths", "0,2"], "--depths"),
        ("mnist_deep", ["--depths", "two"], "--depths"),
        ("mnist_deep", ["--width", "0"], "--width"),
        ("mnist_deep", ["--methods", "fln,rmsprop"], "--methods"),
        ("mnist_deep", ["--adam-lrs", "1e-3,-1"], "--adam-lrs"),
        ("mnist_deep", ["--tune-epochs", "0"], "--tune-epochs"),
        ("mnist_deep", ["--activation", "softplus"], "--activation"),
        ("deep_screen", ["--hypotheses", "baseline,deeper"], "--hypotheses"),
        ("deep_screen", ["--depth", "0"], "--depth"),
        ("deep_screen", ["--epochs", "0"], "--epochs"),
        ("deep_screen", ["--check-every", "0"], "--check-every"),
    ],
)
def test_bad_flags_are_refused_by_name(script, flags, flag, capsys):
    with pytest.raises(SystemExit) as exc:
        load_benchmark(script).parse_args(flags)
    assert exc.value.code == 2 and flag in capsys.readouterr().err


def _run(script, tmp_path, *flags):
    """``benchmarks/<script>.py --out tmp_path flags...`` in a fresh process, its exit checked:
    its stdout."""
    command = [sys.executable, str(ROOT / "benchmarks" / f"{script}.py"), "--out", str(tmp_path)]
    run = subprocess.run([*command, *flags], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    return run.stdout


def test_quick_mode_shrinks_the_run():
    args = _load().parse_args(["--quick"])
    assert args.depths == (1, 2) and args.width == 32 and args.epochs == 2
    assert args.tune_epochs == 1 and len(args.adam_lrs) == 2 and len(args.sgd_lrs) == 2


#: the quick run's methods: FLN, a tuned backprop baseline and a lifted peer, one of each kind of
#: run the benchmark reports (the others of each kind: ``test_bench_lenet``, ``test_bench_lifted``)
METHODS = ("fln", "adam", "lau")


@pytest.mark.slow
def test_quick_run_reports_every_depth_and_method_and_resume_reads_them(tmp_path):
    pytest.importorskip("torch", reason="the baselines need PyTorch (the bench extra)")
    flags = ("--quick", "--epochs", "1", "--check-every", "4", "--methods", ",".join(METHODS),
             "--no-compile")  # fmt: skip
    _run("mnist_deep", tmp_path, *flags, "--jobs", "2")
    summary = json.loads((tmp_path / "results.json").read_text())
    _check_quick_report(tmp_path, summary)
    _check_resume(tmp_path, flags, summary)


def _check_quick_report(tmp_path, summary):
    table = (tmp_path / "results.md").read_text()
    assert (tmp_path / "accuracy_vs_depth.png").stat().st_size > 0
    assert set(summary["methods"]) == {"1", "2"}
    peer_its = summary["settings"]["peer_iterations"]
    for depth, by in summary["methods"].items():
        assert set(by) == set(METHODS)
        tuned = summary["tuning"][depth]["adam"]  # (the one tuned baseline of ``METHODS``)
        assert len(tuned["grid"]) == 2
        assert tuned["grid"][str(tuned["lr"])] == max(tuned["grid"].values())
        assert by["adam"]["lr"] == tuned["lr"]
        raw = summary["raw"][depth]
        inits = {raw[m][0]["initial_test_accuracy"] for m in raw}
        assert max(inits) - min(inits) <= 0.002  # one start: the lifted network's weights
        for method, row in by.items():
            assert f"| {depth} | {method} | {row['final_test_accuracy']:.4f}" in table
            if method in peer_its:  # full-batch: one accuracy after each iteration
                assert len(raw[method][0]["test_accuracy"]) == peer_its[method]
            else:
                assert 0.2 < row["final_test_accuracy"] <= 1  # above chance after one epoch
        log = raw["fln"][0]["relaxation"]
        assert log and all(len(entry["divergences"]) == int(depth) for entry in log)
        assert all(entry["gap"] >= -1e-6 * (1 + abs(entry["gap"])) for entry in log)


def _check_resume(tmp_path, flags, first):
    """``--resume`` reads every kept run and starts none, reporting what the run did; with a
    second seed planned, ``--kept-only`` starts nothing and reports 1 of 2 seeds run."""
    out = _run("mnist_deep", tmp_path, *flags, "--resume")
    read = re.search(r"--resume: (\d+) of (\d+) runs read", out)
    assert read is not None and read[1] == read[2] and int(read[1]) > 0, out[-2000:]
    assert "started" not in out
    again = json.loads((tmp_path / "results.json").read_text())
    assert again["methods"] == first["methods"]
    out = _run("mnist_deep", tmp_path, *flags, "--methods", "fln", "--seeds", "2", "--kept-only")
    assert "started" not in out  # no run: seed 1 is reported as not kept
    partial = json.loads((tmp_path / "results.json").read_text())["methods"]["1"]["fln"]
    assert partial["seeds_run"] == 1 and partial["seeds_planned"] == 2
    assert partial["final_test_accuracy"] == first["methods"]["1"]["fln"]["final_test_accuracy"]
    assert "(1 of 2 seeds)" in (tmp_path / "results.md").read_text()


@pytest.mark.parametrize(
    "flags, flag",
    [
        (["--methods", "fln,lau", "--activation", "tanh"], "--activation tanh"),
        (["--peer-iterations", "lau=0"], "--peer-iterations"),
        (["--peer-iterations", "sgd=3"], "--peer-iterations"),
    ],
)
def test_bad_peer_flags_are_refused_by_name(flags, flag, capsys):
    with pytest.raises(SystemExit):
        _load().parse_args(flags)
    assert flag in capsys.readouterr().err


def test_kept_run_is_read_only_with_the_same_settings(tmp_path):
    bench = _load()
    from common.kept import read_kept

    args = bench.task(bench.parse_args(["--quick"]), "lau", 2, seed=1)[1]
    key = bench.run_key("lau", args)
    path = tmp_path / "run.json"
    path.write_text(json.dumps(dict(key=key, result=dict(test_accuracy=[0.5], seconds=[1.0]))))
    assert read_kept(path, key)["test_accuracy"] == [0.5]
    other = bench.task(bench.parse_args(["--quick", "--peer-iterations", "lau=3"]), "lau", 2)
    assert bench.run_key("lau", other[1]) != key  # another iteration count: another run
    assert read_kept(path, bench.run_key("lau", other[1])) is None
    path.write_text("{not json")
    assert read_kept(path, key) is None
    assert read_kept(tmp_path / "absent.json", key) is None


def test_a_kept_fln_run_names_its_setting(monkeypatch):
    """FLN's key holds the dense setting it trains with: a changed default is another run."""
    from fenchel_cvx import defaults

    bench = _load()
    args = bench.task(bench.parse_args(["--quick"]), "fln", 8, seed=0)[1]
    key = bench.run_key("fln", args)
    assert '"setting"' in key and '"setting"' not in bench.run_key("adam", args)
    monkeypatch.setattr(defaults.Dense, "ratios", ((4, 3.0),))
    assert bench.run_key("fln", args) != key


def _screen():
    return load_benchmark("deep_screen")


@pytest.mark.parametrize("ratio", [None, 1.0, 2.0, 4.0])
def test_dense_setting_at_depth_1_is_the_mlp_tuned_one(ratio):
    d = defaults.Dense
    setting = (
        defaults.training("dense", 1, batched=True)
        if ratio is None
        else defaults.SETTINGS["dense"].for_layers(1, ratio)
    )
    assert setting == defaults.Setting(
        lam=(d.lam,),
        rho=(d.rho, d.rho),
        gamma=tuple(d.gamma),
        momentum=tuple(d.momentum),
        w_steps=tuple(d.w_steps),
        x_steps=(d.x_steps,),
    )


@pytest.mark.parametrize("depth", [1, 2, 8])
def test_dense_setting_has_one_value_per_layer(depth):
    s = defaults.training("dense", depth, batched=True)
    assert len(s.lam) == len(s.x_steps) == depth
    assert len(s.rho) == len(s.gamma) == len(s.momentum) == len(s.w_steps) == depth + 1
    assert s.gamma[-1] == defaults.Dense.gamma[1] and s.momentum[-1] == defaults.Dense.momentum[1]
    assert min(s.lam) > 0 and min(s.gamma) > 0


@pytest.mark.parametrize("depth", [1, 2, 3, 4, 8, 9, 12, 16])
def test_dense_setting_scales_from_deep_networks_on(depth):
    """The package's rule: equal hidden layers below 4 hidden layers (the depths where the
    screen found no gain), x2 a layer from 4 on and x4 from 9 (the best ratio of the
    screens at 9 to 12 and at 16 hidden layers; at 8 a tie)."""
    d = defaults.Dense
    lam = np.array(defaults.training("dense", depth, batched=True).lam)
    ratio = {1: 1.0, 2: 1.0, 3: 1.0, 4: 2.0, 8: 2.0, 9: 4.0, 12: 4.0, 16: 4.0}[depth]
    assert d().ratio_of(depth) == ratio
    assert np.allclose(lam[1:] / lam[:-1], ratio)
    assert lam[-1] == d.lam


@pytest.mark.parametrize("ratio", [1.0, 2.0])
def test_dense_lam_and_gamma_scale_by_the_ratio_toward_the_output(ratio):
    s = defaults.SETTINGS["dense"].for_layers(8, ratio)
    lam, gamma = np.array(s.lam), np.array(s.gamma[:-1])
    assert lam[-1] == defaults.Dense.lam and gamma[-1] == defaults.Dense.gamma[0]
    assert np.allclose(lam[1:] / lam[:-1], ratio) and np.allclose(gamma / lam, gamma[-1] / lam[-1])


@pytest.mark.parametrize("depth", [2, 8])
def test_each_hypothesis_changes_what_it_names(depth):
    screen = _screen()
    base = screen.scaled_plan(depth)
    assert screen.HYPOTHESES["baseline"](depth) == base
    for name, make in screen.HYPOTHESES.items():
        plan = make(depth)
        s = plan.setting
        assert len(s.lam) == depth and len(s.gamma) == len(s.momentum) == depth + 1, name
        changed = {
            f.name
            for f in dataclasses.fields(s)
            if getattr(s, f.name) != getattr(base.setting, f.name)
        }
        words = screen.describe(plan, base)
        assert all(field in words for field in changed), (name, words)
        assert (plan == base) == (words == "the baseline"), name
    lam = screen.HYPOTHESES["lam_to_output"](depth).setting.lam
    assert lam[-1] == base.setting.lam[-1] and np.allclose(np.diff(np.log2(lam)), 1.0)
    gamma = screen.HYPOTHESES["appendix_a"](depth).setting.gamma
    lam0, gamma0 = base.setting.lam[0], base.setting.gamma[0]
    assert gamma[0] == gamma0 and set(gamma[1:-1]) == {gamma0 / lam0}
    scaled = screen.HYPOTHESES["lam_gamma_to_output"](depth).setting
    assert scaled.lam == lam and np.allclose(np.divide(scaled.gamma[:-1], lam), gamma0 / lam0)


def test_appendix_a_scaling_leaves_depth_1_unchanged():
    screen = _screen()
    assert screen.HYPOTHESES["appendix_a"](1) == screen.scaled_plan(1)


def test_lam_schedule_ends_at_equal_lam():
    screen = _screen()
    plan = screen.HYPOTHESES["lam_schedule"](8)
    uniform = screen.scaled_plan(8).setting.lam
    assert len(set(uniform)) == 1
    second = plan.lam_schedule(1, plan.setting.lam)
    assert plan.setting.lam[0] < second[0] < uniform[0]  # lam rises toward equal over epochs
    assert plan.lam_schedule(2, second) == uniform


@pytest.mark.parametrize("init", ["he", "orthogonal"])
def test_initialisations_have_relu_gain(init):
    deep = _load()
    net = LiftedNetwork([400, 200, 200, 10], "relu", "cross_entropy", seed=3)
    output = net.W[-1].copy()
    deep.initialise(net, init, seed=3)
    assert np.array_equal(net.W[-1], output)  # the output layer keeps Xavier's weights
    for W in net.W[:-1]:
        A = W[:, :-1]
        assert np.all(W[:, -1] == 0)
        assert np.mean(A**2) * A.shape[1] == pytest.approx(2.0, rel=0.05)  # Var = 2 / fan_in
    square = net.W[1][:, :-1]
    if init == "orthogonal":
        assert np.allclose(square @ square.T, 2.0 * np.eye(200), atol=1e-5)


def test_unknown_initialisation_is_refused_by_name():
    with pytest.raises(ValueError, match="init.*'lecun'"):
        _load().initialise(LiftedNetwork([3, 4, 2]), "lecun", seed=0)


def test_keep_adds_to_a_report_of_the_same_screen_only(tmp_path):
    screen = _screen()
    path = tmp_path / "deep_screen.json"
    args = screen.parse_args(["--depth", "4", "--epochs", "2", "--keep"])
    assert screen.earlier(args, path) == ({}, None)  # nothing yet
    adam = dict(grid={1e-3: 0.9, 3e-3: 0.8}, lr=1e-3)
    report = dict(settings=dict(depth=4, epochs=2, quick=False), runs={"he": {}}, adam=adam)
    path.write_text(json.dumps(report))
    assert screen.earlier(args, path) == ({"he": {}}, adam)  # the grid's rates numbers again
    args.epochs = 3
    with pytest.raises(SystemExit, match="--keep.*'epochs': 2"):
        screen.earlier(args, path)
    path.write_text("[1, 2]")
    with pytest.raises(SystemExit, match="--keep.*not a screen's report"):
        screen.earlier(args, path)


def test_per_epoch_means_the_checked_rounds():
    log = [
        dict(epoch=1, divergences=[1.0, 0.0], gap=2.0),
        dict(epoch=1, divergences=[3.0, 2.0], gap=4.0),
        dict(epoch=2, divergences=[5.0, 1.0], gap=1.0),
    ]
    assert _screen().per_epoch(log, 2) == ([[2.0, 1.0], [5.0, 1.0]], [3.0, 1.0])


def test_quick_screen_reports_every_hypothesis(tmp_path):
    names = ["baseline", "lam_schedule", "alternations_2", "x_carried"]
    flags = ["--quick", "--depth", "2", "--epochs", "2", "--check-every", "2"]
    _run("deep_screen", tmp_path, *flags, "--hypotheses", ",".join(names))
    summary = json.loads((tmp_path / "deep_screen.json").read_text())
    table = (tmp_path / "deep_screen.md").read_text()
    assert "validation: the last 1,000 training images" in summary["data"]
    assert list(summary["runs"]) == names
    for name, r in summary["runs"].items():
        assert len(r["validation_accuracy"]) == len(r["seconds"]) == 2
        assert 0.2 < r["validation_accuracy"][-1] <= 1  # above chance
        assert all(len(d) == 2 for d in r["divergences"]) and len(r["gap"]) == 2
        assert min(r["gap"]) >= 0 and r["certificate"]["violations"] == 0
        assert f"| {name} | {r['setting']} | " in table
    lam = summary["runs"]["lam_schedule"]["plan"]["lam_per_epoch"]
    assert lam[0] != lam[1] and lam[0][-1] == lam[1][-1]  # the last hidden layer's lam kept
    assert summary["runs"]["alternations_2"]["plan"]["alternations"] == 2
    carried = summary["runs"]["x_carried"]
    per_epoch = carried["certificate"]["rounds"] // 2
    assert carried["carried_x"]["tried"] == per_epoch * 2  # both X-blocks of every epoch-2 batch
    assert 0 <= carried["carried_x"]["kept"] <= carried["carried_x"]["tried"]
