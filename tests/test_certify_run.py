"""``certify_run`` and ``fenchel-cvx certify``: every block of a run's saved iterate re-solved by
the oracle, its figures recomputed from the saved point.

What is checked: the saved point is the run's own (its weights, its lifted variables, the last
round's batch); blocks the run's oracle solved certify with a gap at round-off; a planted change
of a saved weight shows as that block's gap and nothing else's; other data is refused before any
solve; the command prints and writes the same figures and names its flags in its errors; blocks
recorded during a run (``RecordingBackend``) certify the solver's own accuracy, and a damaged
record is refused by name.
"""

import json

import numpy as np
import pytest

from fenchel_cvx.bcd import fit_bcd
from fenchel_cvx.blocks import w_block, x_block
from fenchel_cvx.checkpoints import load_checkpoint
from fenchel_cvx.cli import main
from fenchel_cvx.errors import FileFormatError, SolverError
from fenchel_cvx.io import read_npz, write_npz
from fenchel_cvx.network import LiftedNetwork
from fenchel_cvx.recorded_blocks import FILE, FORMAT, RecordingBackend, load_recorded
from fenchel_cvx.run_certificate import RECORDED, certify_run, saved_blocks, saved_point


def data(m=40, seed=0):
    rng = np.random.default_rng(seed)
    return rng.random((5, m)), np.eye(3)[:, rng.integers(0, 3, m)]


def run(folder, backend="cvxpy", **kw):
    X0, Y = data()
    net = LiftedNetwork([5, 6, 4, 3], "relu", "mse", lam=0.5, rho=0.1, seed=0)
    res = fit_bcd(net, X0, Y, backend=backend, checkpoint=folder, progress=False, **kw)
    return X0, Y, res


def test_saved_point_is_the_runs_last_round(tmp_path):
    """Algorithm 2: the rebuilt point is the returned one, on the last batch's columns, and
    the W-blocks carry the proximal centres of eq. (13)."""
    X0, Y, res = run(tmp_path, "fast", batch_size=16, epochs=2, gamma=[1.0, 2.0, 3.0])
    point = saved_point(tmp_path, X0, Y)
    assert np.array_equal(point.X0, X0[:, res.batch]) and np.array_equal(point.Y, Y[:, res.batch])
    assert all(np.array_equal(a, b) for a, b in zip(point.Xs, res.Xs))
    assert all(np.array_equal(a, b) for a, b in zip(point.net.W, res.net.W))
    assert point.gamma == [1.0, 2.0, 3.0] and all(W is not None for W in point.W0)
    names = [name for name, _, _ in saved_blocks(point)]
    assert names == ["X_2", "X_1", "W_2", "W_1", "W_0"]
    for name, block, Z in saved_blocks(point):
        l = int(name[2:])
        same = (
            x_block(res.net, point.X0, point.Y, res.Xs, l)
            if name[0] == "X"
            else w_block(res.net, point.X0, point.Y, res.Xs, l, point.gamma[l], point.W0[l])
        )
        assert float(block.value(Z)) == pytest.approx(float(same.value(Z)), rel=1e-12)


def test_the_oracles_run_certifies_its_w_blocks(tmp_path):
    """A run of the oracle leaves every W-block at its minimiser: gap and residual at
    round-off; bounds ordered lower <= optimum <= value on every block."""
    X0, Y, _ = run(tmp_path, iterations=2)
    cert = certify_run(tmp_path, X0, Y)
    assert (cert.algorithm, cert.round, cert.points) == (1, 2, 40)
    for b in cert.blocks:
        assert b.lower_bound <= b.optimum + 1e-9 <= b.value + 2e-9, b
        if b.block.startswith("W"):
            assert b.gap <= 1e-7 and b.kkt_residual <= 1e-8, b
    assert any(b.gap > 1e-3 for b in cert.blocks if b.block.startswith("X"))  # see NOTE


def test_a_changed_weight_shows_in_its_block_alone(tmp_path):
    """The figures come from the saved point: W_1 moved in the checkpoint, W_1's gap grows
    while W_0's and W_2's stay at round-off."""
    X0, Y, _ = run(tmp_path, iterations=1)
    arrays, meta = load_checkpoint(tmp_path)
    arrays["W_1"] = arrays["W_1"] + 0.05
    write_npz(tmp_path / "checkpoint.npz", arrays, meta)
    gaps = {b.block: b.gap for b in certify_run(tmp_path, X0, Y, blocks="W").blocks}
    assert gaps["W_1"] > 1e-3 and gaps["W_0"] <= 1e-7 and gaps["W_2"] <= 1e-7, gaps


def test_other_data_is_refused_before_any_solve(tmp_path):
    X0, Y, _ = run(tmp_path, iterations=1)
    with pytest.raises(ValueError, match="X0, Y are not the training data"):
        certify_run(tmp_path, X0 * 1.001, Y)
    with pytest.raises(ValueError, match="blocks must be one of all, X, W, got 'Z'"):
        certify_run(tmp_path, X0, Y, blocks="Z")
    with pytest.raises(ValueError, match="workers"):
        certify_run(tmp_path, X0, Y, workers=0)
    with pytest.raises(ValueError, match="X0 and Y go together"):
        certify_run(tmp_path, X0)


def test_the_command_prints_and_writes_the_same_figures(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", "--iterations", "1", "--out", str(out), "--quiet"]) == 0
    capsys.readouterr()
    assert main(["certify", str(out), "--json", str(tmp_path / "c.json"), "--quiet"]) == 0
    text = capsys.readouterr().out
    saved = json.loads((tmp_path / "c.json").read_text())
    assert [b["block"] for b in saved["blocks"]] == ["X_1", "W_1", "W_0"]
    for b in saved["blocks"]:
        assert f"| {b['block']} | {b['value']:.8g} | {b['optimum']:.8g} |" in text
    assert "not the X-solver's accuracy" in text and saved["algorithm"] == 1
    assert main(["certify", str(out), "--blocks", "W", "--quiet"]) == 0
    assert "| X_1 |" not in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv, flag",
    [
        (["certify", "{tmp}/none"], "argument run"),
        (["certify", "{run}", "--workers", "0"], "--workers"),
        (["certify", "{run}", "--tol", "-1"], "--tol"),
        (["certify", "{run}", "--json", "{tmp}/no/such/c.json"], "--json"),
        (["certify", "{run}", "--blocks", "Y"], "--blocks"),
    ],
)
def test_the_command_names_a_bad_flag(tmp_path, capsys, argv, flag):
    out = tmp_path / "run"
    assert main(["train", "--iterations", "1", "--out", str(out), "--quiet"]) == 0
    argv = [a.format(tmp=tmp_path, run=out) for a in argv]
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2 and flag in capsys.readouterr().err


def test_a_fit_bcd_folder_needs_its_data(tmp_path):
    run(tmp_path, iterations=1)
    with pytest.raises(ValueError, match="for a fit_bcd checkpoint give its training data"):
        certify_run(tmp_path)


def test_recorded_blocks_certify_the_solvers_own_accuracy(tmp_path):
    """Recorded at the inputs each solver saw, every block of an oracle run is at its minimiser
    (the saved point's X-blocks are not: ``test_the_oracles_run_certifies_its_w_blocks``), and
    the recording leaves the run bit-identical."""
    X0, Y = data()
    nets = [LiftedNetwork([5, 6, 4, 3], "relu", "mse", lam=0.5, rho=0.1, seed=0) for _ in "ab"]
    plain = fit_bcd(nets[0], X0, Y, iterations=2, progress=False)
    backend = RecordingBackend("cvxpy", nets[1])
    rec = fit_bcd(
        nets[1], X0, Y, backend=backend, iterations=2, checkpoint=tmp_path, progress=False
    )
    assert all(np.array_equal(a, b) for a, b in zip(plain.net.W, rec.net.W))
    backend.save(tmp_path / FILE)
    cert = certify_run(tmp_path, recorded=True)
    assert [b.block for b in cert.blocks] == ["X_2", "X_1", "W_2", "W_1", "W_0"]
    assert all(b.gap <= 1e-7 and b.kkt_residual <= 1e-8 for b in cert.blocks), cert.blocks
    assert cert.points == 40 and cert.note == RECORDED


def test_the_command_records_and_certifies_a_fast_run(tmp_path, capsys):
    out = tmp_path / "run"
    argv = ["train", "--backend", "fast", "--batch-size", "300", "--epochs", "1"]
    assert main([*argv, "--out", str(out), "--quiet", "--record-blocks"]) == 0
    assert "blocks.npz" in capsys.readouterr().out.splitlines()[-1]
    assert (
        main(
            [
                "certify",
                str(out),
                "--recorded",
                "--blocks",
                "X",
                "--json",
                str(tmp_path / "c.json"),
                "--quiet",
            ]
        )
        == 0
    )
    saved = json.loads((tmp_path / "c.json").read_text())
    assert [b["block"] for b in saved["blocks"]] == ["X_1"] and saved["note"] == RECORDED
    assert 0 < saved["blocks"][0]["gap"] < 1  # 20 FISTA steps: near, not at, the minimiser


@pytest.mark.parametrize(
    "damage, field",
    [
        (lambda a, m: m["blocks"][0].update(cls="Foo"), "meta.blocks"),
        (lambda a, m: a.pop("W_0.Xt"), "arrays"),
        (lambda a, m: a.update({"W_0.Xt": a["W_0.Xt"][:, :3]}), "W_0"),
        (lambda a, m: m["blocks"][1]["refs"].update(act_in=["activation", 9]), "act_in"),
        (lambda a, m: m["blocks"][1]["refs"].update(act_in=["layer", 0]), "act_in"),
        (lambda a, m: m["blocks"][1]["refs"].update(act_in=[[1], 0]), "act_in"),
        (lambda a, m: m["blocks"][0].update(cls=[]), "meta.blocks"),
        (lambda a, m: m["blocks"][0]["scalars"].update(rho=-5.0), "W_0.rho"),
        (lambda a, m: m["blocks"][0]["scalars"].update(layer="0"), "W_0.layer"),
        (lambda a, m: m["blocks"][0]["scalars"].update(layer=1), "W_0"),
        (lambda a, m: m["blocks"].append(dict(m["blocks"][0])), "one entry a block"),
    ],
)
def test_a_damaged_record_is_refused_by_name(tmp_path, damage, field):
    X0, Y = data()
    net = LiftedNetwork([5, 6, 3], "relu", "mse", lam=0.5, rho=0.1, seed=0)
    backend = RecordingBackend("fast", net)
    fit_bcd(net, X0, Y, backend=backend, iterations=1, progress=False)
    backend.save(tmp_path / FILE)
    arrays, meta = read_npz(tmp_path / FILE, FORMAT)
    damage(arrays, meta)
    write_npz(tmp_path / FILE, arrays, meta)
    with pytest.raises(FileFormatError, match=field):
        load_recorded(tmp_path / FILE)


def test_a_block_beyond_the_oracles_reach_is_refused_before_any_solve(tmp_path, monkeypatch):
    """An X-block without an exact method whose one column's template exceeds
    ``MAX_COLUMN_COEFFICIENTS`` (LeNet-5's X_1: 7.5M, whose compile asks for 528 GiB) is named
    before any block is solved; X_2 = X_L (MSE + ReLU) has an exact method and is not."""
    from fenchel_cvx.oracle import backend as oracle_backend

    X0, Y, _ = run(tmp_path, iterations=1)
    monkeypatch.setattr(oracle_backend, "MAX_COLUMN_COEFFICIENTS", 10)  # X_1 feeds W_1: 4 x 6
    solved = []
    monkeypatch.setattr(oracle_backend.OracleBackend, "solve", lambda *a, **k: solved.append(a))
    with pytest.raises(ValueError, match=r"X_1: one column.s problem has 4 x 6 = 24") as err:
        certify_run(tmp_path, X0, Y)
    assert "X_2" not in str(err.value) and not solved
    monkeypatch.undo()
    monkeypatch.setattr(oracle_backend, "MAX_COLUMN_COEFFICIENTS", 10)
    point = saved_point(tmp_path, X0, Y)
    block = x_block(point.net, point.X0, point.Y, point.Xs, 1)
    with pytest.raises(ValueError, match=r"x_hidden \(layer 1\) is beyond the oracle"):
        oracle_backend.OracleBackend().solve(block)  # the oracle's own check, in training too
    last = x_block(point.net, point.X0, point.Y, point.Xs, 2)  # X_L: an exact method takes it
    oracle_backend.OracleBackend().solve(last)
    with pytest.raises(SolverError, match="beyond_reach"):  # ... but not the template behind it
        oracle_backend.OracleBackend(exact=False, nnls=False).solve(last)
    monkeypatch.undo()
    assert [b.block for b in certify_run(tmp_path, X0, Y, blocks="W").blocks] == [
        "W_2",
        "W_1",
        "W_0",
    ]


def test_a_checkpoint_without_its_proximal_centre_is_refused(tmp_path):
    """gamma_l > 0 needs W0_l (eq. (13)): a checkpoint without it is refused, never certified
    as another block."""
    X0, Y, _ = run(tmp_path, "fast", batch_size=16, epochs=1, gamma=[1.0, 2.0, 3.0])
    arrays, meta = load_checkpoint(tmp_path)
    del arrays["W0_1"]
    write_npz(tmp_path / "checkpoint.npz", arrays, meta)
    with pytest.raises(ValueError, match="holds no proximal centre W0_1 for its gamma 2.0"):
        certify_run(tmp_path, X0, Y)


def test_a_float32_run_is_certified_on_the_values_it_saw(tmp_path):
    """The digest is of the data in the run's dtype, and so are the blocks: float64 data given
    for a float32 run is rounded as the run rounded it."""
    X0, Y = data()
    net = LiftedNetwork([5, 6, 4, 3], "relu", "mse", lam=0.5, rho=0.1, seed=0, dtype="float32")
    fit_bcd(
        net,
        X0.astype("float32"),
        Y,
        backend="fast",
        iterations=1,
        checkpoint=tmp_path,
        progress=False,
    )
    point = saved_point(tmp_path, X0, Y)
    assert np.array_equal(point.X0, X0.astype("float32").astype("float64"))


def test_recording_leaves_the_commands_run_as_it_was(tmp_path, capsys):
    """``--record-blocks`` builds the oracle with ``--tol`` as ``fit_bcd`` does: the history
    records the same backend settings and figures as the run without it."""
    runs = {}
    for name, extra in (("plain", []), ("recorded", ["--record-blocks"])):
        out = tmp_path / name
        argv = ["train", "--iterations", "1", "--tol", "1e-8", "--out", str(out), "--quiet"]
        assert main(argv + extra) == 0
        runs[name] = json.loads((out / "history.json").read_text())
    plain, recorded = runs["plain"], runs["recorded"]
    assert recorded["config"]["backend_settings"] == plain["config"]["backend_settings"]
    assert recorded["records"][0]["lifted_w"] == plain["records"][0]["lifted_w"]
