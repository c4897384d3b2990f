"""The ``fenchel-cvx`` command: train, resume, evaluate, predict (subprocesses and in process),
and a table of bad flags and paths, each refused by name before any work, none a traceback."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from fenchel_cvx import cli
from fenchel_cvx.history import History

REPO = Path(__file__).resolve().parents[1]
PNG = b"\x89PNG\r\n\x1a\n"
ENV = dict(
    os.environ,
    OMP_NUM_THREADS="1",
    PYTHONPATH=os.pathsep.join(
        [str(REPO)] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else [])
    ),
)
QUICK = ["--quiet", "--no-baseline"]


def _cli(*args, cwd, **kw):
    return subprocess.run(
        [sys.executable, "-m", "fenchel_cvx", *map(str, args)],
        cwd=cwd,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=600,  # a hang guard only, not a speed limit
        **kw,
    )


def _records(path):
    """A history's records without their wall-clock fields."""

    def strip(x):
        if isinstance(x, dict):
            return {k: strip(v) for k, v in x.items() if k not in ("seconds", "solver_seconds")}
        return [strip(v) for v in x] if isinstance(x, list) else x

    return strip(json.loads(Path(path).read_text())["records"])


@pytest.mark.slow
def test_train_end_to_end_subprocess(tmp_path):
    out = tmp_path / "run"
    proc = _cli(
        "train", "--train-size", 150, "--iterations", 2, "--lam", 3, "--out", out, cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "certificate held at every iteration: yes" in proc.stdout
    assert "test accuracy" in proc.stdout and "logistic regression" in proc.stdout
    assert "history.json" in proc.stdout and "model.npz" in proc.stdout
    assert "BCD (cvxpy)" in proc.stderr  # the tqdm progress bar
    raw = json.loads((out / "history.json").read_text())
    assert len(raw["records"]) == 2 and raw["config"]["dataset"] == "digits"
    h = History.load(out / "history.json")
    assert h.certificate_held and h.config["layer_sizes"] == [64, 32, 10]
    assert 0.5 < h.last["test_accuracy"] <= 1.0
    for name in ("objectives.png", "accuracy.png"):
        data = (out / name).read_bytes()
        assert data[:8] == PNG and len(data) > 5000
    assert json.loads((out / "run.json").read_text())["lam"] == 3.0

    ev = _cli("evaluate", out, cwd=tmp_path)
    assert ev.returncode == 0, ev.stderr
    assert f"accuracy {h.last['test_accuracy']:.4f}" in ev.stdout and "450 points" in ev.stdout

    from sklearn.datasets import load_digits

    from fenchel_cvx.network import LiftedNetwork

    net = LiftedNetwork.load(out / "model.npz")
    expected = net.predict(load_digits().data[:7].T / 16).argmax(0)
    # raw pixels (0..16): predict applies the run's recorded preprocessing, and says so
    assert json.loads((out / "run.json").read_text())["preprocessing"]["divide_by"] == 16
    np.savetxt(tmp_path / "x.csv", load_digits().data[:7], delimiter=",")
    pr = _cli("predict", out, tmp_path / "x.csv", "--out", tmp_path / "y.csv", cwd=tmp_path)
    assert pr.returncode == 0, pr.stderr
    assert "input divided by 16, the run's preprocessing" in pr.stderr
    np.testing.assert_array_equal(np.loadtxt(tmp_path / "y.csv", dtype=int), expected)
    # already scaled: --raw skips it; a model file inside the run folder finds its run
    np.savetxt(tmp_path / "s.csv", load_digits().data[:7] / 16, delimiter=",")
    pr = _cli("predict", out / "model.npz", tmp_path / "s.csv", "--raw", cwd=tmp_path)
    assert pr.returncode == 0 and "divided" not in pr.stderr, pr.stderr
    np.testing.assert_array_equal(np.loadtxt(pr.stdout.splitlines(), dtype=int), expected)
    ev = _cli("evaluate", out / "model.npz", cwd=tmp_path)
    assert ev.returncode == 0 and f"accuracy {h.last['test_accuracy']:.4f}" in ev.stdout, ev.stderr


@pytest.mark.slow
def test_sigint_saves_a_checkpoint_and_resume_finishes_the_same_run(tmp_path):
    args = [
        "train",
        "--backend",
        "fast",
        "--batch-size",
        50,
        "--epochs",
        6,
        "--gamma",
        1,
        "--momentum",
        0.5,
        "--checkpoint-every",
        5,
        "--eval-every",
        5,
        *QUICK,
    ]
    whole = _cli(*args, "--out", tmp_path / "whole", cwd=tmp_path)
    assert whole.returncode == 0, whole.stderr
    out = tmp_path / "cut"
    _ctrl_c_after_the_first_checkpoint(args, out, cwd=tmp_path)
    assert (out / "checkpoint.npz").is_file() and not (out / "history.json").exists()
    res = _cli("resume", out, "--quiet", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert _records(out / "history.json") == _records(tmp_path / "whole" / "history.json")
    np.testing.assert_array_equal(
        np.load(out / "model.npz")["W_0"], np.load(tmp_path / "whole" / "model.npz")["W_0"]
    )


@pytest.mark.slow
def test_ctrl_c_on_two_ranks_names_the_checkpoint_and_leaves_no_process(tmp_path):
    """``train --nproc 2``: the terminal's SIGINT reaches rank 0 and its spawned rank alike."""
    pytest.importorskip("torch")
    args = ["train", "--backend", "fast", "--batch-size", 50, "--epochs", 2, "--nproc", 2,
            "--threads", 1, "--checkpoint-every", 5, "--eval-every", 5, *QUICK]  # fmt: skip
    _ctrl_c_after_the_first_checkpoint(args, tmp_path / "cut", cwd=tmp_path)


def _ctrl_c_after_the_first_checkpoint(args, out, cwd):
    """``fenchel-cvx *args --out out`` given Ctrl-C as a terminal gives it (SIGINT to every
    process of the command) once its first checkpoint is written: it names the checkpoint to
    resume from, without a traceback, exits with 130 and leaves no process of its own behind."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "fenchel_cvx", *map(str, args), "--out", out],
        cwd=cwd,
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,  # as from a terminal: a background job ignores SIGINT
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        start_new_session=True,  # (a process group of its own, as a terminal's foreground job)
    )
    # inside the run: its first checkpoint is written; not a fixed sleep, which a loaded machine
    # can spend before the first round
    deadline = time.time() + 600  # a hang guard only: the wait ends at the checkpoint
    while not (out / "checkpoint.npz").is_file() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    assert proc.poll() is None, "the run ended before it could be interrupted"
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=600)  # a hang guard only: SIGINT ends it at once
    assert proc.returncode == 130, err
    assert f"fenchel-cvx resume {out}" in err and "Traceback" not in err
    deadline = time.time() + 10  # (each process's parent reaps it as it ends)
    while _group_lives(proc.pid) and time.time() < deadline:
        time.sleep(0.05)
    assert not _group_lives(proc.pid), "a process of the command outlived it"


def _group_lives(pgid):
    """Whether a process of process group ``pgid`` is left."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def test_help_lists_the_commands_and_imports_no_solver():
    """``fenchel-cvx --help`` names the commands without importing CVXPY or PyTorch."""
    code = (
        "import sys; from fenchel_cvx import cli\n"
        "try:\n    cli.main(['--help'])\nexcept SystemExit:\n    pass\n"
        "print('cvxpy' in sys.modules, 'torch' in sys.modules, file=sys.stderr)"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], env=ENV, capture_output=True, text=True, timeout=600
    )  # the timeout is a hang guard only
    cvxpy, torch = proc.stderr.split()[-2:]
    assert (cvxpy, torch) == ("False", "False")
    assert "train" in proc.stdout and "resume" in proc.stdout


def test_version(capsys):
    from fenchel_cvx import __version__

    with pytest.raises(SystemExit) as exc:
        cli.main(["--version"])
    assert exc.value.code == 0 and __version__ in capsys.readouterr().out


def test_default_output_folder_is_runs_timestamp(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    code = cli.main(
        ["train", "--train-size", "40", "--iterations", "1", "--arch", "64-8-10", *QUICK]
    )
    assert code == 0
    runs = list((tmp_path / "runs").iterdir())
    assert len(runs) == 1 and (runs[0] / "history.json").is_file()
    out = capsys.readouterr().out
    assert "certificate held at every iteration" in out and "logistic" not in out


def _setup_paths(tmp):
    (tmp / "afile").write_text("x")
    full = tmp / "full"
    full.mkdir()
    (full / "something").write_text("x")
    (tmp / "bad.csv").write_text("1,2\nx,y\n")
    (tmp / "run_no_ckpt").mkdir()
    (tmp / "run_no_ckpt" / "run.json").write_text("{}")
    np.save(tmp / "wrong.npy", np.ones((3, 5)))
    from fenchel_cvx.network import LiftedNetwork

    LiftedNetwork([64, 8, 10]).save(tmp / "model.npz")
    LiftedNetwork([64, 8, 10], loss="mse").save(tmp / "mse.npz")
    np.save(tmp / "ok.npy", np.ones((2, 64)))
    (tmp / "empty.npz").write_bytes(b"")
    for name, edit in (("run_cut", {}), ("run_edited", {"lam": "abc"})):
        (tmp / name).mkdir()
        (tmp / name / "run.json").write_text(json.dumps({"dataset": "digits", **edit}))
        (tmp / name / "checkpoint.npz").write_bytes((tmp / "model.npz").read_bytes()[:300])


BAD = [  # (argv, the flag or argument the message names, a phrase of it)
    ([], "required", "command"),
    (["fly"], "invalid choice", "fly"),
    (["train", "--arch", "10-5-10"], "--arch", "input size must be 64"),
    (["train", "--arch", "64-5-3"], "--arch", "output size 10"),
    (["train", "--arch", "64-x-10"], "--arch", "64-32-10"),
    (["train", "--arch", "64"], "--arch", ">= 2 positive sizes"),
    (["train", "--arch", "64-0-10"], "--arch", ">= 2 positive sizes"),
    (["train", "--arch", "lenet5"], "--arch", "lenet5 takes 28 x 28 or 32 x 32 images"),
    (
        ["train", "--dataset", "mnist5k", "--arch", "lenet5", "--lam", "1,2"],
        "--lam",
        "needs one value or 4",
    ),
    (["train", "--dataset", "cifar"], "--dataset", "invalid choice"),
    (["train", "--batch-size", "-5"], "--batch-size", "integer >= 1, got '-5'"),
    (["train", "--batch-size", "1.5"], "--batch-size", "integer"),
    (["train", "--epochs", "0"], "--epochs", "integer >= 1"),
    (["train", "--iterations", "ten"], "--iterations", "integer"),
    (["train", "--alternations", "0"], "--alternations", "integer >= 1"),
    (["train", "--lam", "-1"], "--lam", "> 0"),
    (["train", "--lam", "0"], "--lam", "> 0"),
    (["train", "--lam", "1,2"], "--lam", "needs one value or 1"),
    (["train", "--lam", "nan"], "--lam", "> 0 and finite"),
    (["train", "--rho", "-0.1"], "--rho", ">= 0"),
    (["train", "--rho", "1,2,3"], "--rho", "needs one value or 2"),
    (["train", "--gamma", "a,b"], "--gamma", "comma-separated"),
    (["train", "--arch", "64-9-9-10", "--gamma", "1,2"], "--gamma", "needs one value or 3"),
    (["train", "--momentum", "1"], "--momentum", "[0, 1), got '1'"),
    (["train", "--momentum", "0.5,0.5,0.5"], "--momentum", "needs one value or 2"),
    (["train", "--tol", "0"], "--tol", "> 0"),
    (["train", "--tol", "inf"], "--tol", "> 0"),
    (["train", "--seed", "-1"], "--seed", "integer >= 0"),
    (["train", "--threads", "0"], "--threads", "integer >= 1"),
    (["train", "--check-every", "0"], "--check-every", "integer >= 1"),
    (["train", "--eval-every", "x"], "--eval-every", "integer"),
    (["train", "--checkpoint-every", "0"], "--checkpoint-every", "integer >= 1"),
    (["train", "--train-size", "0"], "--train-size", "integer >= 1"),
    (["train", "--dtype", "float16"], "--dtype", "invalid choice"),
    (["train", "--activation", "gelu"], "--activation", "invalid choice"),
    (["train", "--loss", "hinge"], "--loss", "invalid choice"),
    (["train", "--backend", "torch"], "--backend", "invalid choice"),
    (["train", "--w-steps", "1"], "--w-steps", "needs --backend fast"),
    (["train", "--backend", "fast", "--x-steps", "0"], "--x-steps", "integer >= 1"),
    (["train", "--backend", "fast", "--x-steps", "1,0"], "--x-steps", "integer >= 1"),
    (["train", "--backend", "fast", "--x-steps", "1,2"], "--x-steps", "needs one value or 1"),
    (["train", "--backend", "fast", "--w-steps", "1,2,3"], "--w-steps", "needs one value or 2"),
    (["train", "--backend", "fast", "--newton-cap", "-1"], "--newton-cap", "integer >= 0"),
    (["train", "--data-dir", "{tmp}"], "--data-dir", "embedded"),
    (["train", "--dataset", "mnist", "--data-dir", "{tmp}/nowhere"], "--data-dir", "not a folder"),
    (["train", "--dataset", "cifar10", "--data-dir", "{tmp}/afile"], "--data-dir", "not a folder"),
    (["train", "--out", "{tmp}/afile/sub"], "--out", "not writable"),
    (["train", "--out", "{tmp}/full"], "--out", "already holds files"),
    (["resume", "{tmp}/nowhere"], "run", "no run.json"),
    (["resume", "{tmp}/run_no_ckpt"], "run", "no checkpoint.npz"),
    (["evaluate", "{tmp}/nowhere.npz"], "model", "neither a model.npz"),
    (["evaluate", "{tmp}/afile"], "model", "no zip directory"),
    (["evaluate", "{tmp}/empty.npz"], "model", "found an empty file (0 bytes)"),
    (["predict", "{tmp}/empty.npz", "{tmp}/ok.npy"], "model", "found an empty file (0 bytes)"),
    (
        ["evaluate", "{tmp}/model.npz", "--dataset", "digits", "--verify"],
        "--verify",
        "no files to verify",
    ),
    (["train", "--verify"], "--verify", "no files to verify"),
    (["train", "--download"], "--download", "fetches no files of digits"),
    (["train", "--dataset", "cifar10", "--download"], "--download", "no files of cifar10"),
    (
        ["train", "--dataset", "mnist", "--download", "--data-dir", "{tmp}/afile/sub"],
        "--data-dir",
        "--download cannot create it in",
    ),
    (
        ["train", "--dataset", "fashion-mnist", "--data-dir", "{tmp}/nowhere"],
        "--data-dir",
        "is not a folder (for fashion-mnist); --download creates it",
    ),
    (
        ["train", "--dataset", "mnist", "--data-dir", "{tmp}/full", "--out", "{tmp}/o"],
        "--data-dir",
        "pass --download to fetch them, or point --data-dir",
    ),
    (["train", "--dataset", "mnist"], "--data-dir", "no data directory: pass --data-dir"),
    (
        ["evaluate", "{tmp}/model.npz", "--dataset", "digits", "--download"],
        "--download",
        "no files of digits",
    ),
    (["resume", "{tmp}/run_cut", "--download"], "--download", "no files of digits"),
    (["resume", "{tmp}/run_cut", "--data-dir", "{tmp}"], "--data-dir", "embedded"),
    (["resume", "{tmp}/run_cut"], "checkpoint.npz", "no zip directory"),
    (["resume", "{tmp}/run_edited"], "run.json: lam", "a value --lam takes"),
    (["evaluate", "{tmp}/model.npz"], "--dataset", "needed"),
    (["evaluate", "{tmp}/model.npz", "--dataset", "mnist5k"], "--dataset", "the model takes 64"),
    (["evaluate", "{tmp}/model.npz", "--split", "val"], "--split", "invalid choice"),
    (["predict", "{tmp}/model.npz", "{tmp}/nothing.csv"], "input", "found nothing there"),
    (["predict", "{tmp}/model.npz", "{tmp}/bad.csv"], "input", "row 2: expected comma-separated"),
    (["predict", "{tmp}/model.npz", "{tmp}/wrong.npy"], "input", "rows of 64 numbers"),
    (
        ["predict", "{tmp}/model.npz", "{tmp}/ok.npy", "--out", "{tmp}/full"],
        "--out",
        "which is a folder",
    ),
    (
        ["predict", "{tmp}/model.npz", "{tmp}/ok.npy", "--out", "{tmp}/nowhere/x.csv"],
        "--out",
        "does not exist",
    ),
    (
        ["predict", "{tmp}/mse.npz", "{tmp}/ok.npy", "--output", "proba"],
        "--output",
        "class probabilities",
    ),
    (
        ["predict", "{tmp}/model.npz", "{tmp}/ok.npy", "--out", "{tmp}/afile/x.csv"],
        "--out",
        "is a file",
    ),
]


@pytest.mark.parametrize("argv, flag, phrase", BAD, ids=[" ".join(a[:3]) for a, _, _ in BAD])
def test_bad_flags_and_paths_exit_2_naming_the_flag(
    argv, flag, phrase, capsys, tmp_path, monkeypatch
):
    assert len(BAD) >= 30
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("FENCHEL_DATA", raising=False)
    _setup_paths(tmp_path)
    before = sorted(p.name for p in tmp_path.iterdir())
    with pytest.raises(SystemExit) as exc:
        cli.main([a.format(tmp=tmp_path) for a in argv])
    err = capsys.readouterr().err
    assert exc.value.code == 2, err
    assert flag in err and phrase in err, err
    assert "Traceback" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # no run folder, no output


def test_help_lists_the_options(capsys):
    with pytest.raises(SystemExit):
        cli.main(["train", "--help"])
    text = capsys.readouterr().out
    for opt in (
        "--dataset",
        "--data-dir",
        "--arch",
        "--activation",
        "--loss",
        "--lam",
        "--rho",
        "--gamma",
        "--momentum",
        "--batch-size",
        "--epochs",
        "--iterations",
        "--alternations",
        "--backend",
        "--seed",
        "--out",
        "--threads",
        "--dtype",
        "--check-every",
        "--w-steps",
        "--x-steps",
        "--newton-cap",
        "--gram-reuse",
        "--max-iter",
        "--strict",
        "--checkpoint-every",
    ):
        assert opt in text


def test_oracle_on_many_points_prints_an_estimate(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(cli.training, "LARGE", 100)  # "many" scaled down: 150 points count as many
    code = cli.main(
        [
            "train",
            "--train-size",
            "150",
            "--iterations",
            "2",
            "--arch",
            "64-8-10",
            "--out",
            str(tmp_path / "o"),
            *QUICK,
        ]
    )
    assert code == 0
    err = capsys.readouterr().err
    assert "the oracle took" in err and "for the 2 rounds" in err and "--backend fast" in err
    capsys.readouterr()
    assert (
        cli.main(
            [
                "train",
                "--train-size",
                "150",
                "--iterations",
                "1",
                "--arch",
                "64-8-10",
                "--backend",
                "fast",
                "--out",
                str(tmp_path / "f"),
                *QUICK,
            ]
        )
        == 0
    )
    assert "the oracle took" not in capsys.readouterr().err


@pytest.mark.slow
def test_lenet5_trains_on_images(tmp_path, capsys):
    code = cli.main(
        [
            "train",
            "--dataset",
            "mnist5k",
            "--arch",
            "lenet5",
            "--backend",
            "fast",
            "--train-size",
            "60",
            "--batch-size",
            "30",
            "--lam",
            "5,5,1,1",
            "--loss",
            "cross_entropy",
            "--w-steps",
            "1",
            "--x-steps",
            "1,1,3,3",
            "--dtype",
            "float32",
            "--out",
            str(tmp_path / "l"),
            *QUICK,
        ]
    )
    assert code == 0
    out = capsys.readouterr().out
    assert "784-4704-1600-120-84-10 (LeNet-5)" in out
    # the capped blocks' block optimality is the only failure, and the summary says so
    assert "certificate held at every iteration: yes, but for the block optimality of" in out
    assert "capped block solves (inexact by design" in out
    from fenchel_cvx.network import LiftedNetwork

    net = LiftedNetwork.load(tmp_path / "l" / "model.npz")
    assert net.input_shape == (1, 28, 28) and net.get_config()["layers"][0]["kind"] == "conv2d"


def test_threads_reach_the_fast_backend_and_limit_each_pool_by_library():
    """``--threads 2``: the fast backend solves on 2 threads (it kept its default of 1 before),
    and around the command NumPy's pool gets 2 while SciPy's stays at 1 (``threads.plan``),
    from pools at 1 (a 2-core machine starts both at 2)."""
    import scipy.linalg  # noqa: F401  (loads SciPy's own BLAS pool)

    from fenchel_cvx.threads import limit_threads, pools

    args = cli.build_parser().parse_args(["train", "--backend", "fast", "--threads", "2"])
    threads = cli._backend(args).threads  # a count, or the plan of compiled kernels' pools
    assert threads == 2 or (threads["numpy"] == 2 and threads["scipy"] == 1)
    sizes = lambda lib: {n for name, _, n, _ in pools() if name == lib}  # noqa: E731
    if not sizes("numpy") or not sizes("scipy"):
        pytest.skip("NumPy and SciPy do not ship separate BLAS libraries in this install")
    with limit_threads(1):
        before = pools()
        with cli._threads(2):
            assert sizes("numpy") == {2} and sizes("scipy") == {1}
        assert pools() == before


@pytest.mark.parametrize("command", ["train", "resume", "evaluate", "predict"])
def test_every_flag_has_a_sentence_and_its_default_once(command, capsys):
    sub = cli.build_parser()._subparsers._group_actions[0].choices[command]
    for action in sub._actions:
        if action.dest == "help":
            continue
        text = sub._get_formatter()._expand_help(action) if action.help else ""
        assert len(text.split()) >= 2, f"{action.dest} has no help sentence"
        assert text.count("default") <= 1, f"{action.dest}: {text}"
        if action.option_strings and action.default not in (None, False):
            assert "default" in text, f"{action.dest} does not show its default"
    with pytest.raises(SystemExit):
        cli.main([command, "--help"])
    out = capsys.readouterr().out
    assert "``" not in out and ".py" not in out and "(default: None)" not in out


def test_a_train_that_fails_on_its_data_leaves_nothing_or_a_reusable_folder(tmp_path, capsys):
    data = tmp_path / "mnist"
    data.mkdir()
    for name in (
        "train-images-idx3-ubyte",
        "train-labels-idx1-ubyte",
        "t10k-images-idx3-ubyte",
        "t10k-labels-idx1-ubyte",
    ):
        (data / name).write_bytes(b"\x00\x00\x08\x01\x00\x00\x00\x05abc")  # cut short
    argv = [
        "train",
        "--dataset",
        "mnist",
        "--data-dir",
        str(data),
        "--out",
        str(tmp_path / "o"),
        "--arch",
        "784-4-10",
        "--iterations",
        "1",
        "--backend",
        "fast",
        *QUICK,
    ]
    with pytest.raises(SystemExit):
        cli.main(argv)
    assert "size: expected 13 bytes" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()
    # a folder a failed run left (run.json, a killed write's temporary) is reused
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "run.json").write_text("{}")
    (tmp_path / "r" / ".checkpoint.npz.x1.tmp").write_bytes(b"half")
    assert cli.main(_quick(tmp_path / "r")) == 0
    assert json.loads((tmp_path / "r" / "run.json").read_text())["format"] == "fenchel_cvx.Run/1"
    assert not list((tmp_path / "r").glob(".*.tmp")) and (tmp_path / "r" / "model.npz").is_file()


# --- the files a run writes, their modes, and resume of a finished run -----------------------
def _quick(out, *extra):
    """The arguments of a train run of about a second on digits: 30 points, one round."""
    return [
        "train",
        "--train-size",
        "30",
        "--iterations",
        "1",
        "--arch",
        "64-4-10",
        "--backend",
        "fast",
        "--out",
        str(out),
        *QUICK,
        *extra,
    ]


def _wrote(stdout):
    """The names and the folder the last line (``wrote A, B to OUT in T s``) gives."""
    import re

    last = stdout.strip().splitlines()[-1]
    match = re.fullmatch(r"wrote (.+) to (\S+)(?:, and (.+))? in [0-9.]+ s", last)
    assert match, last
    return match[1].split(", "), Path(match[2]), (match[3] or None) and match[3].split(", ")


def _files(folder):
    """Every file of ``folder``: its SHA-256, modification time and inode."""
    import hashlib

    return {
        p.name: (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns, p.stat().st_ino)
        for p in folder.iterdir()
    }


def test_train_and_resume_name_every_file_they_wrote(tmp_path, capsys, monkeypatch):
    from fenchel_cvx import observers

    out = tmp_path / "run"
    assert cli.main(_quick(out)) == 0
    names, folder, others = _wrote(capsys.readouterr().out)
    assert folder == out and others is None
    assert sorted(names) == sorted(p.name for p in out.iterdir())
    assert len(names) == 6
    # a run stopped by Ctrl-C after its first round of two, then resumed: the resume names
    # what it wrote, each file it replaced or created, and no other
    write = observers.CheckpointWriter.__call__

    def stop_after_the_first_round(self, net, state, step):
        write(self, net, state, step)
        monkeypatch.setattr(observers.CheckpointWriter, "__call__", write)
        raise KeyboardInterrupt

    monkeypatch.setattr(observers.CheckpointWriter, "__call__", stop_after_the_first_round)
    cut = tmp_path / "cut"
    assert cli.main(_quick(cut, "--iterations", "2", "--checkpoint-every", "1")) == 130
    before = _files(cut)
    assert sorted(before) == ["checkpoint.npz", "run.json"]
    capsys.readouterr()
    assert cli.main(["resume", str(cut), "--quiet"]) == 0
    names, folder, others = _wrote(capsys.readouterr().out)
    after = _files(cut)
    changed = {n for n in after if before.get(n, (None,))[1:] != after[n][1:]}
    assert folder == cut and others is None and set(names) == changed
    assert sorted(names) == [
        "accuracy.png",
        "checkpoint.npz",
        "history.json",
        "model.npz",
        "objectives.png",
    ]


@pytest.mark.parametrize(
    "schedule, said",
    [
        ([], "finished 1 of 1 rounds (Algorithm 1: 1 iterations)"),
        (["--batch-size", "15", "--epochs", "2"], "finished 4 of 4 rounds (Algorithm 2: 2 epochs"),
    ],
    ids=["algorithm-1", "algorithm-2"],
)
def test_resume_of_a_finished_run_says_so_and_leaves_every_file_as_it_was(
    tmp_path, capsys, schedule, said
):
    out = tmp_path / "run"
    assert cli.main(_quick(out, *schedule)) == 0
    capsys.readouterr()
    before = _files(out)
    time.sleep(0.02)  # a file written again would have a later modification time
    assert cli.main(["resume", str(out), "--quiet"]) == 0
    text = capsys.readouterr()
    assert len(text.out.strip().splitlines()) == 1 and not text.err, text
    assert said in text.out and "nothing to do" in text.out, text.out
    assert _files(out) == before


def test_train_creates_every_file_0666_less_the_umask(tmp_path, capsys):
    from fenchel_cvx.io import RUN_FILES

    for umask in (0o022, 0o077):
        out = tmp_path / f"run-{umask:03o}"
        old = os.umask(umask)
        try:
            assert cli.main(_quick(out)) == 0
        finally:
            os.umask(old)
        modes = {p.name: oct(p.stat().st_mode & 0o777) for p in out.iterdir()}
        assert modes == dict.fromkeys(RUN_FILES, oct(0o666 & ~umask)), oct(umask)


def test_a_missing_data_set_is_refused_naming_the_commands_flags(tmp_path, capsys, monkeypatch):
    from fenchel_cvx.network import LiftedNetwork

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("FENCHEL_DATA", raising=False)
    (tmp_path / "data").mkdir()
    LiftedNetwork([784, 4, 10]).save(tmp_path / "m.npz")
    for argv, phrase in (
        (["train", "--dataset", "mnist", "--data-dir", "data", "--out", "o"], "pass --download"),
        (["train", "--dataset", "fashion-mnist", "--data-dir", "data", "--out", "o"], "--download"),
        (["evaluate", "m.npz", "--dataset", "mnist", "--data-dir", "data"], "pass --download"),
        (["train", "--dataset", "mnist", "--out", "o"], "no data directory: pass --data-dir"),
        (["train", "--dataset", "cifar10", "--data-dir", "data", "--out", "o"], "--data-dir or"),
    ):
        with pytest.raises(SystemExit) as exc:
            cli.main(argv + (QUICK if argv[0] == "train" else []))
        err = capsys.readouterr().err
        assert exc.value.code == 2 and "argument --data-dir: " in err and phrase in err, err
        for python in ("download=True", "data_dir", "load_", "../"):
            assert python not in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data", "m.npz"]


def test_download_fetches_the_missing_files_through_the_loader(tmp_path, capsys, monkeypatch):
    """``--download`` reaches the loader: the missing files are fetched (here from memory, the
    fetch function replaced: no network), verified, kept, trained on and named as written."""
    import gzip
    import hashlib

    from fenchel_cvx import datasets

    rng = np.random.default_rng(0)
    raw = {}
    for split, m in (("train", 60000), ("t10k", 10000)):
        images = np.zeros((m, 28, 28), np.uint8)
        images[:100] = rng.integers(0, 256, (100, 28, 28))
        labels = rng.integers(0, 10, m).astype(np.uint8)
        for name, a in (("images-idx3", images), ("labels-idx1", labels)):
            head = bytes([0, 0, 8, a.ndim]) + np.array(a.shape, ">u4").tobytes()
            raw[f"{split}-{name}-ubyte"] = head + a.tobytes()
    served = {f"{n}.gz": gzip.compress(b, 1) for n, b in raw.items()}
    digests = {n: hashlib.sha256(b).hexdigest() for n, b in raw.items()}
    monkeypatch.setitem(datasets._IDX_SOURCES["mnist"], "content", ("sha256", digests))
    fetched = []

    def fetch(url, f):
        fetched.append(url.rsplit("/", 1)[1])
        f.write(served[url.rsplit("/", 1)[1]])

    monkeypatch.setattr(datasets, "_fetch", fetch)
    monkeypatch.chdir(tmp_path)
    data = Path("data") / "mnist"
    argv = ["--dataset", "mnist", "--data-dir", str(data), "--download", "--dtype", "float32"]
    assert cli.main(_quick("run", *argv, "--arch", "784-4-10")) == 0
    names, folder, others = _wrote(capsys.readouterr().out)
    assert sorted(fetched) == sorted(served) == sorted(p.name for p in data.iterdir())
    assert others == [str(data / name) for name in fetched] and len(names) == 6
    assert json.loads(Path("run", "run.json").read_text())["download"] is True
