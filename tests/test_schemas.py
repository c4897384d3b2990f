"""Every JSON the package reads (run.json, history.json, a checkpoint's meta, a model's meta) is
read within the read budget and checked against its schema (``fenchel_cvx/schemas.py``): each
hostile or edited file below is refused by a ``FileFormatError`` naming the file and the field
(or the byte), and through the CLI by one error line and exit status 2, never a traceback.

The cases that could crash or exhaust the memory (nesting 10^5 deep, an integer of 5,000
digits, 120 MB of ``{}``) run in a child process under RLIMIT_AS 3 GiB and RLIMIT_CPU 60 s.
Written against public entry points only (``cli.main``, ``History.load``, ``load_checkpoint``,
``LiftedNetwork.load``, ``files.read_json``), so that they run on the tree before the schemas.
"""

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from fenchel_cvx import cli
from fenchel_cvx.checkpoints import load_checkpoint
from fenchel_cvx.errors import FileFormatError
from fenchel_cvx.files import read_json
from fenchel_cvx.history import History
from fenchel_cvx.network import LiftedNetwork

ROOT = Path(__file__).resolve().parents[1]
DEEP = "[" * 100_000 + "]" * 100_000  # json.loads: RecursionError
BIG_INT = '{"records": [], "seed": ' + "7" * 5000 + "}"  # int(): the 4,300-digit limit
SUPERSCRIPT = "\u00b9"  # '¹'.isdigit() is True, int('¹') a ValueError


# --- a run folder of `fenchel-cvx train` (Algorithm 2: two rounds), copied per test ----------
@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    out = tmp_path_factory.mktemp("schemas") / "run"
    code = cli.main(
        [
            "train",
            "--train-size",
            "40",
            "--arch",
            "64-4-10",
            "--batch-size",
            "20",
            "--backend",
            "fast",
            "--checkpoint-every",
            "1",
            "--out",
            str(out),
            "--quiet",
            "--no-baseline",
        ]
    )
    assert code == 0 and (out / "checkpoint.npz").is_file()
    return out


@pytest.fixture
def run(trained, tmp_path):
    folder = tmp_path / "run"
    shutil.copytree(trained, folder)
    np.save(tmp_path / "points.npy", np.full((2, 64), 8.0))
    return folder


def _edit_json(path, change):
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


def _edit_npz(path, change):
    """Rewrite the .npz ``path`` with ``change(meta)`` applied to its JSON meta."""
    with np.load(path, allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    meta = json.loads(str(arrays.pop("meta")))
    change(meta)
    with open(path, "wb") as f:
        np.savez(f, meta=np.array(json.dumps(meta)), **arrays)


def _refused_by_cli(argv, phrase, capsys):
    """``cli.main(argv)`` exits 2 with one error line holding ``phrase``, no traceback."""
    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    err = capsys.readouterr().err
    assert exc.value.code == 2, err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if "error:" in line]
    assert len(lines) == 1 and phrase in lines[0], err


# --- run.json: fields of the wrong type or out of range, through resume, evaluate, predict ----
def _set(key, value):
    return lambda run: run.__setitem__(key, value)


def _divide_by(value):
    return lambda run: run["preprocessing"].__setitem__("divide_by", value)


RUN_JSON = [  # (id, command, change of run.json, the phrase of the refusal)
    (
        "data_dir 123 (resume)",
        "resume",
        _set("data_dir", 123),
        "run.json: data_dir: expected null or a folder's path (text), found 123",
    ),
    (
        "data_dir 123 (evaluate)",
        "evaluate",
        _set("data_dir", 123),
        "run.json: data_dir: expected null or a folder's path (text), found 123",
    ),
    (
        "epochs null",
        "resume",
        _set("epochs", None),
        "run.json: epochs: expected an integer >= 1, found null",
    ),
    (
        "preprocessing a list",
        "predict",
        _set("preprocessing", [1]),
        "run.json: preprocessing: expected an object, found a list of 1 items",
    ),
    (
        "divide_by -16",
        "predict",
        _divide_by(-16),
        "run.json: preprocessing.divide_by: expected a finite number > 0, found -16",
    ),
    (
        "divide_by true",
        "predict",
        _divide_by(True),
        "run.json: preprocessing.divide_by: expected a finite number > 0, found True",
    ),
    (
        "format 1/superscript one",
        "resume",
        _set("format", "fenchel_cvx.Run/1" + SUPERSCRIPT),
        "run.json: format: expected a version number after 'fenchel_cvx.Run/'",
    ),
]


def _argv(command, run):
    return [command, str(run)] + ([str(run.parent / "points.npy")] if command == "predict" else [])


@pytest.mark.parametrize(
    "command, change, phrase", [c[1:] for c in RUN_JSON], ids=[c[0] for c in RUN_JSON]
)
def test_an_edited_run_json_is_refused_by_its_field(run, capsys, command, change, phrase):
    _edit_json(run / "run.json", change)
    _refused_by_cli(_argv(command, run), phrase, capsys)


# --- a model's meta and a checkpoint's meta ------------------------------------------------------
@pytest.mark.parametrize("command", ["evaluate", "predict"])
def test_a_models_garbage_dtype_is_refused_by_the_cli(run, capsys, command):
    _edit_npz(run / "model.npz", lambda m: m["config"].update(dtype="garbage"))
    _refused_by_cli(
        _argv(command, run),
        "model.npz: meta.config.dtype: expected one of 'float32', 'float64', found 'garbage'",
        capsys,
    )


def test_a_models_garbage_dtype_is_refused_by_load(run):
    _edit_npz(run / "model.npz", lambda m: m["config"].update(dtype="garbage"))
    with pytest.raises(FileFormatError, match="meta.config.dtype: expected one of 'float32'"):
        LiftedNetwork.load(run / "model.npz")


def _drop_certificates(meta):
    for record in meta["history"]["records"]:
        del record["certificate"]


CERTIFICATE = (
    "checkpoint.npz: meta.history.records[0].certificate: expected an object, found nothing"
)


def test_a_checkpoint_without_certificates_is_refused_when_read(run):
    _edit_npz(run / "checkpoint.npz", _drop_certificates)
    with pytest.raises(FileFormatError) as err:
        load_checkpoint(run)
    assert CERTIFICATE in str(err.value)


def test_resume_refuses_a_checkpoint_without_certificates_before_training(run, capsys):
    _edit_npz(run / "checkpoint.npz", _drop_certificates)
    for name in ("history.json", "model.npz", "objectives.png", "accuracy.png"):
        (run / name).unlink()  # an interrupted run: resume goes on with its checkpoint
    _refused_by_cli(["resume", str(run), "--quiet"], CERTIFICATE, capsys)
    assert not (run / "model.npz").exists()  # refused before any round or file


# --- history.json: silent accepts and raw errors --------------------------------------------
HISTORY = [  # (id, the text of history.json, the phrase of the refusal)
    (
        "held 'no'",
        json.dumps(
            {"records": [{"iteration": 1, "certificate": {"held": "no", "violations": []}}]}
        ),
        "records[0].certificate.held: expected true or false, found 'no'",
    ),
    (
        "format 1/superscript one",
        json.dumps({"format": "fenchel_cvx.History/1" + SUPERSCRIPT, "records": []}),
        "history.json: format: expected a version number after 'fenchel_cvx.History/'",
    ),
    (
        "accuracy 7",
        json.dumps({"records": [{"iteration": 1, "test_accuracy": 7}]}),
        "records[0].test_accuracy: expected null or a finite number in [0, 1], found 7",
    ),
]


@pytest.mark.parametrize("text, phrase", [c[1:] for c in HISTORY], ids=[c[0] for c in HISTORY])
def test_a_damaged_history_is_refused_by_its_field(tmp_path, text, phrase):
    (tmp_path / "history.json").write_text(text)
    with pytest.raises(FileFormatError) as err:
        History.load(tmp_path / "history.json")
    assert phrase in str(err.value) and str(tmp_path / "history.json") in str(err.value)


def test_from_dict_names_the_field_too():
    d = {"records": [{"iteration": 1, "certificate": {"held": "no", "violations": []}}]}
    with pytest.raises(FileFormatError, match="records.0..certificate.held: expected true"):
        History.from_dict(d)


# --- hostile JSON in a child process (RLIMIT_AS 3 GiB, RLIMIT_CPU 60 s) ------------------------
_LIMITED = """
import resource, sys
resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))
resource.setrlimit(resource.RLIMIT_CPU, (60, 60))
"""
_LOAD = """
from fenchel_cvx.errors import FileFormatError
from fenchel_cvx.history import History
try:
    History.load(sys.argv[1])
except FileFormatError as err:
    print(err)
    sys.exit(3)
print("loaded")
"""
_CLI = """
from fenchel_cvx import cli
sys.exit(cli.main(sys.argv[1:]))
"""


def _child(code, *args):
    env = dict(os.environ, PYTHONPATH=str(ROOT), OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
    env.pop("FENCHEL_READ_BUDGET", None)
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_LIMITED + code), *map(str, args)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )


def _write_braces(path, megabytes):
    """A JSON list of ``{}``: 3 bytes of file each, ~72 bytes of Python objects."""
    n = megabytes * (1 << 20) // 3
    with open(path, "wb") as f:
        f.write(b"[")
        chunk = b"{}," * (1 << 20)
        for _ in range(n // (1 << 20)):
            f.write(chunk)
        f.write(b"{}]")


HOSTILE = [  # (id, write(path), the phrase of the refusal)
    (
        "nested 10^5 deep",
        lambda p: p.write_text(DEEP),
        "history.json: byte 64: expected arrays and objects nested at most 64 deep",
    ),
    (
        "an integer of 5,000 digits",
        lambda p: p.write_text(BIG_INT),
        "history.json: byte 24: expected numbers of at most 100 digits, found a number of 5,000",
    ),
    (
        "120 MB of {}",
        lambda p: _write_braces(p, 120),
        "history.json: JSON: expected JSON of 41,943,041 objects",
    ),
]


@pytest.mark.parametrize("write, phrase", [c[1:] for c in HOSTILE], ids=[c[0] for c in HOSTILE])
def test_hostile_histories_are_refused_by_name_in_bounded_memory(tmp_path, write, phrase):
    path = tmp_path / "history.json"
    write(path)
    child = _child(_LOAD, path)
    assert child.returncode == 3, child.stderr[-2000:]
    assert phrase in child.stdout and str(path) in child.stdout, child.stdout


@pytest.mark.parametrize(
    "command, text, phrase",
    [
        ("evaluate", DEEP, "run.json: byte 64: expected arrays and objects nested at most 64"),
        ("resume", BIG_INT, "run.json: byte 24: expected numbers of at most 100 digits"),
    ],
    ids=["nested 10^5 deep", "an integer of 5,000 digits"],
)
def test_hostile_run_json_is_refused_by_the_cli_in_bounded_memory(run, command, text, phrase):
    (run / "run.json").write_text(text)
    child = _child(_CLI, command, run)
    assert child.returncode == 2, child.stderr[-2000:]
    assert "Traceback" not in child.stderr
    lines = [line for line in child.stderr.splitlines() if "error:" in line]
    assert len(lines) == 1 and phrase in lines[0], child.stderr[-2000:]


def test_read_json_charges_the_decoded_value_against_the_budget(tmp_path, monkeypatch):
    """The same rule at a small budget, in process: 100,000 ``{}`` cost 32 MB decoded."""
    path = tmp_path / "x.json"
    path.write_text("[" + ",".join(["{}"] * 100_000) + "]")
    monkeypatch.setenv("FENCHEL_READ_BUDGET", "16M")
    with pytest.raises(FileFormatError, match="x.json: JSON: expected JSON of 100,000 objects"):
        read_json(path, "test", want=list)
    monkeypatch.setenv("FENCHEL_READ_BUDGET", "64M")
    assert len(read_json(path, "test", want=list)) == 100_000
