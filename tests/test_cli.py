"""The ``fenchel-cvx`` command, end to end (a subprocess) and its argument checks (in process)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fenchel_cvx import cli
from fenchel_cvx.history import History

REPO = Path(__file__).resolve().parents[1]
PNG = b"\x89PNG\r\n\x1a\n"


def test_train_end_to_end_subprocess(tmp_path):
    out = tmp_path / "run"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(REPO)] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else [])))
    cmd = [sys.executable, "-m", "fenchel_cvx", "train", "--train-size", "150", "--iterations", "2",
           "--lam", "3", "--out", str(out)]
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "certificate held at every iteration: yes" in proc.stdout
    assert "test accuracy" in proc.stdout and "logistic regression" in proc.stdout
    assert "history.json" in proc.stdout
    assert "BCD (cvxpy)" in proc.stderr                    # the tqdm progress bar
    raw = json.loads((out / "history.json").read_text())
    assert len(raw["records"]) == 2 and raw["config"]["dataset"] == "digits"
    h = History.load(out / "history.json")
    assert h.certificate_held and h.config["layer_sizes"] == [64, 32, 10]
    assert 0.5 < h.last["test_accuracy"] <= 1.0
    for name in ("objectives.png", "accuracy.png"):
        data = (out / name).read_bytes()
        assert data[:8] == PNG and len(data) > 5000
    assert (out / "weights.npz").stat().st_size > 0


def test_default_output_folder_is_runs_timestamp(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    code = cli.main(["train", "--train-size", "40", "--iterations", "1", "--quiet", "--no-baseline",
                     "--arch", "64-8-10"])
    assert code == 0
    runs = list((tmp_path / "runs").iterdir())
    assert len(runs) == 1 and (runs[0] / "history.json").is_file()
    out = capsys.readouterr().out
    assert "certificate held at every iteration" in out and "logistic" not in out


@pytest.mark.parametrize("argv,match", [
    (["train", "--arch", "10-5-10"], "input size must be 64"),
    (["train", "--arch", "64-5-3"], "output size 10"),
    (["train", "--arch", "64-x-10"], "--arch must look like 64-32-10"),
    (["train", "--dataset", "cifar"], "invalid choice"),
    (["train", "--batch-size", "-5"], "batch_size must be an integer >= 1, got -5"),
    (["train", "--lam", "-1"], "lam must be"),
    (["train", "--train-size", "0"], "--train-size must be >= 1"),
    ([], "required"),
])
def test_bad_arguments_exit_2_with_a_message(argv, match, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exc:
        cli.main(argv + (["--quiet"] if argv else []))
    assert exc.value.code == 2
    assert match in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()


def test_help_lists_the_options(capsys):
    with pytest.raises(SystemExit):
        cli.main(["train", "--help"])
    text = capsys.readouterr().out
    for opt in ("--dataset", "--arch", "--activation", "--loss", "--lam", "--rho", "--gamma",
                "--batch-size", "--epochs", "--iterations", "--alternations", "--backend",
                "--seed", "--out"):
        assert opt in text
