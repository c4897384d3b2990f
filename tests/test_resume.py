"""The driver after its restructure, checkpoints and resume (``fit_bcd(checkpoint=, resume=)``)."""

import json
import os
import signal
import sys
import time

import numpy as np
import pytest

import _history_cases as cases
from fenchel_cvx.bcd import fit_bcd, schedule
from fenchel_cvx.checkpoints import load_checkpoint
from fenchel_cvx.network import LiftedNetwork


def _as_before(x, checked=True):
    """A history as the driver before the restructure recorded it. Since then the certificate
    recomputes each block's KKT residual itself on checked rounds (``residual``) and keeps the
    backend's report as ``reported_residual`` (the old ``residual``); a round records
    ``halted``; an unchecked round's ``max_residual`` (of reports) is no longer kept. A run's
    config records its ``momentum`` (all 0, the paper's algorithms, in these runs) and whether it
    went on from an earlier run's ``W_prev`` (``momentum_carried``, never in these runs); a
    violation whether its block stopped at a step cap (``capped``); a run's config its
    backend's settings (``backend_settings``)."""
    if isinstance(x, dict):
        checked = x.get("checked", checked)
        if x.get("momentum", [0]) != [0] * len(x.get("momentum", [0])):
            raise AssertionError(f"a pinned run with momentum {x['momentum']}")
        if x.get("momentum_carried") or x.get("capped"):
            raise AssertionError("a pinned run given W_prev, or with step caps")
        if x.get("x_sweep", "backward") != "backward":
            raise AssertionError(f"a pinned run with the X-sweep {x['x_sweep']}")
        if "reported_residual" in x:
            x = {**x, "residual": x["reported_residual"]}
        return {
            k: _as_before(v, checked)
            for k, v in x.items()
            if k
            not in (
                "reported_residual",
                "halted",
                "momentum",
                "momentum_carried",
                "capped",
                "backend_settings",
                "x_sweep",
            )
            and not (k == "max_residual" and not checked)
        }
    if isinstance(x, list):
        return [_as_before(v, checked) for v in x]
    return x


def _same(a, b, path="history"):
    """Equal structure, equal integers and strings, floats to rounding (``cases.RTOL``
    relative or ``cases.ATOL`` absolute): ReLU's divergence is now evaluated in its
    cancellation-free form and the fast W-blocks report their value from the product they hold,
    which moves objective values in their last bits; another CPU's BLAS moves them too."""
    if isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), path
        for k in a:
            _same(a[k], b[k], f"{path}/{k}")
    elif isinstance(a, list):
        assert isinstance(b, list) and len(a) == len(b), path
        for i, (u, v) in enumerate(zip(a, b)):
            _same(u, v, f"{path}[{i}]")
    elif isinstance(a, float) and isinstance(b, float):
        assert a == b or abs(a - b) <= max(cases.RTOL * max(abs(a), abs(b)), cases.ATOL), (
            path,
            a,
            b,
        )
    else:
        assert a == b, (path, a, b)


@pytest.mark.parametrize("name", sorted(cases.CASES))
def test_histories_match_the_pinned_runs(name):
    before = json.loads(cases.FIXTURE.read_text())[name]
    now = cases.record(cases.run_case(name))
    assert cases.weights_close(now["weights"], before["weights"])  # the iterates, to rounding
    _same(_as_before(now), _as_before(before))


def test_the_pin_sees_a_change_past_rounding():
    """The weights' and the histories' comparisons reject what is more than rounding."""
    before = json.loads(cases.FIXTURE.read_text())["alg1_mse_gamma"]
    W = [np.asarray(Wl) for Wl in before["weights"]]
    moved = [Wl.copy() for Wl in W]
    moved[1][0, 0] += 1e-8 * np.max(np.abs(moved[1]))
    assert cases.weights_close([Wl.tolist() for Wl in W], before["weights"])
    assert not cases.weights_close([Wl.tolist() for Wl in moved], before["weights"])
    value = before["history"]["records"][0]["train_loss"]
    with pytest.raises(AssertionError):
        _same({"train_loss": value * (1 + 1e-9)}, {"train_loss": value})


def _stop_after(n):
    return lambda net, rec: rec["iteration"] >= n


@pytest.mark.parametrize("name", sorted(cases.CASES))
def test_stop_then_resume_is_bit_identical(tmp_path, name):
    whole = cases.record(cases.run_case(name))
    cases.run_case(name, checkpoint=tmp_path, checkpoint_every=1, callback=_stop_after(3))
    arrays, meta = load_checkpoint(tmp_path)
    assert meta["iteration"] == 3 and len(meta["history"]["records"]) == 3
    resumed = cases.run_case(name, resume=tmp_path, checkpoint=tmp_path)
    assert cases.record(resumed) == whole
    assert load_checkpoint(tmp_path)[1]["iteration"] == len(whole["history"]["records"])


def test_checkpoint_every_k_rounds_and_at_the_end(tmp_path):
    seen = []

    def spy(net, rec):
        seen.append(
            load_checkpoint(tmp_path)[1]["iteration"]
            if (tmp_path / "checkpoint.npz").exists()
            else 0
        )

    res = cases.run_case(
        "alg2_ce_alternations", checkpoint=tmp_path, checkpoint_every=3, callback=spy
    )
    n = len(res.history)
    assert seen == [3 * (i // 3) for i in range(1, n + 1)]
    assert load_checkpoint(tmp_path)[1]["iteration"] == n
    assert not [p for p in tmp_path.iterdir() if p.name != "checkpoint.npz"]  # no temp files


def test_resume_refuses_another_run(tmp_path):
    cases.run_case("alg1_mse_gamma", checkpoint=tmp_path, callback=_stop_after(2))
    X, Y = cases.case_data()
    net = LiftedNetwork(**cases.CASES["alg1_mse_gamma"]["net"])
    with pytest.raises(ValueError, match="iterations=5"):
        fit_bcd(net, X, Y, backend="fast", iterations=5, gamma=0.5, check_every=2, resume=tmp_path)
    with pytest.raises(ValueError, match="other training data"):
        fit_bcd(
            net, X + 1, Y, backend="fast", iterations=4, gamma=0.5, check_every=2, resume=tmp_path
        )
    with pytest.raises(
        ValueError, match="resume must be a checkpoint file or a folder holding checkpoint.npz"
    ):
        fit_bcd(net, X, Y, backend="fast", resume=tmp_path / "nowhere")


def test_history_records_the_backends_settings():
    """The config says what the blocks were solved with: a FastBackend's step caps, Gram reuse,
    dtype and tol (not its threads), the oracle's solver; a backend object without
    ``settings()`` records none."""
    from fenchel_cvx.fast import FastBackend

    X, Y = cases.case_data()
    spec = cases.CASES["alg2_ce_alternations"]
    fast = FastBackend(w_steps=(3, 1), x_steps=2, gram_reuse=2, threads=2)
    cfg = fit_bcd(
        LiftedNetwork(**spec["net"]), X, Y, backend=fast, batch_size=16, epochs=1
    ).history.config
    assert cfg["backend"] == "fast" and cfg["backend_settings"] == dict(
        tol=1e-6, max_iter=500, w_steps=[3, 1], x_steps=2, dtype=None, newton_cap=None, gram_reuse=2
    )
    cfg = fit_bcd(
        LiftedNetwork(**spec["net"]), X[:, :8], Y[:, :8], backend="cvxpy", iterations=1
    ).history.config
    assert cfg["backend_settings"]["solver"] == "CLARABEL" and cfg["backend_settings"]["nnls"]

    class Plain:  # any object with solve(block, start) is a backend
        def __init__(self):
            self.fast = FastBackend()

        def solve(self, block, start=None):
            return self.fast.solve(block, start)

    cfg = fit_bcd(LiftedNetwork(**spec["net"]), X, Y, backend=Plain(), iterations=1).history.config
    assert cfg["backend"] == "Plain" and cfg["backend_settings"] == {}


def test_resume_refuses_other_backend_settings_but_takes_a_checkpoint_without_them(tmp_path):
    """Other step caps would be another run: refused, as another gamma is. A checkpoint
    written before the settings were recorded resumes as before."""
    from fenchel_cvx.checkpoints import checkpoint_path
    from fenchel_cvx.fast import FastBackend
    from fenchel_cvx.io import write_npz

    X, Y = cases.case_data()
    spec = cases.CASES["alg2_ce_alternations"]
    fit = dict(batch_size=16, epochs=2, gamma=1.0)
    full = fit_bcd(LiftedNetwork(**spec["net"]), X, Y, backend=FastBackend(w_steps=2), **fit)
    fit_bcd(
        LiftedNetwork(**spec["net"]),
        X,
        Y,
        backend=FastBackend(w_steps=2),
        **fit,
        checkpoint=tmp_path,
        callback=_stop_after(3),
    )
    with pytest.raises(
        ValueError, match=r"another run: backend_settings\.w_steps=3 \(checkpoint: 2\)$"
    ):
        fit_bcd(
            LiftedNetwork(**spec["net"]),
            X,
            Y,
            backend=FastBackend(w_steps=3),
            **fit,
            resume=tmp_path,
        )

    class Odd(FastBackend):  # a setting JSON cannot hold (a callback): its repr
        def settings(self):
            return {"callback": print}

    res = fit_bcd(
        LiftedNetwork(**spec["net"]), X, Y, backend=Odd(), **fit, checkpoint=tmp_path / "odd"
    )
    assert res.history.config["backend_settings"] == {"callback": repr(print)}
    with pytest.raises(ValueError, match="another run"):  # refused before any work: no folder
        fit_bcd(
            LiftedNetwork(**spec["net"]),
            X,
            Y,
            backend=FastBackend(w_steps=3),
            **fit,
            resume=tmp_path,
            checkpoint=tmp_path / "new",
        )
    assert not (tmp_path / "new").exists()

    class Attribute(FastBackend):  # a settings that is not a method: none recorded
        settings = {"mine": 1}

    cfg = fit_bcd(LiftedNetwork(**spec["net"]), X, Y, backend=Attribute(), **fit).history.config
    assert cfg["backend_settings"] == {}
    arrays, meta = load_checkpoint(tmp_path)
    del meta["history"]["config"]["backend_settings"]
    write_npz(checkpoint_path(tmp_path), arrays, meta)
    res = fit_bcd(
        LiftedNetwork(**spec["net"]), X, Y, backend=FastBackend(w_steps=2), **fit, resume=tmp_path
    )
    assert all(np.array_equal(a, b) for a, b in zip(res.net.W, full.net.W))


def test_resume_with_reused_gram_factors_is_bit_identical(tmp_path):
    """With gram_reuse > 1 the fast backend keeps Gram factorisations across batches, which a
    checkpoint does not hold: every checkpoint drops them, so that the run resumed from it
    (without them) and the uninterrupted run go on alike."""
    from fenchel_cvx.fast import FastBackend

    X, Y = cases.case_data()
    spec = cases.CASES["alg2_ce_alternations"]
    fit = dict(batch_size=16, epochs=3, gamma=1.0, checkpoint_every=2)

    def backend():
        return FastBackend(w_steps=2, gram_reuse=8)

    whole = fit_bcd(
        LiftedNetwork(**spec["net"]), X, Y, backend=backend(), **fit, checkpoint=tmp_path / "whole"
    )
    fit_bcd(
        LiftedNetwork(**spec["net"]),
        X,
        Y,
        backend=backend(),
        **fit,
        checkpoint=tmp_path / "cut",
        callback=_stop_after(4),
    )
    resumed = fit_bcd(
        LiftedNetwork(**spec["net"]),
        X,
        Y,
        backend=backend(),
        **fit,
        resume=tmp_path / "cut",
        checkpoint=tmp_path / "cut",
    )
    assert all(np.array_equal(a, b) for a, b in zip(resumed.net.W, whole.net.W))
    fresh = fit_bcd(
        LiftedNetwork(**spec["net"]),
        X,
        Y,
        backend=FastBackend(w_steps=2),
        **fit,
        checkpoint=tmp_path / "fresh",
    )  # a new factor every batch: other iterates,
    assert not all(np.array_equal(a, b) for a, b in zip(fresh.net.W, whole.net.W))  # reuse counts


def test_a_run_does_not_depend_on_the_backends_earlier_runs():
    """A run starts with none of the Gram factors an earlier run left in its backend: with
    gram_reuse > 1 a run on other data would otherwise start from the earlier run's factor
    (of that other data) and take other iterates than with a new backend."""
    from fenchel_cvx.datasets import load_digits, one_hot
    from fenchel_cvx.fast import FastBackend

    ds = load_digits()  # 64 inputs, batches of 100: W_0's factor in parameter space, reused
    X, Y = ds.X_train, one_hot(ds.y_train, 10)

    def run(backend, cols):
        net = LiftedNetwork([64, 12, 10], seed=0)
        return fit_bcd(net, X[:, cols], Y[:, cols], backend=backend, batch_size=100).net.W

    backend = FastBackend(w_steps=2, gram_reuse=8)
    run(backend, slice(0, 300))
    after = run(backend, slice(300, 600))
    alone = run(FastBackend(w_steps=2, gram_reuse=8), slice(300, 600))
    assert all(np.array_equal(a, b) for a, b in zip(after, alone))


def test_schedule_positions():
    steps = schedule(10, 4, 2, None, 2, seed=0)
    assert len(steps) == 2 * 3 * 2 and [s.iteration for s in steps] == list(range(1, 13))
    assert [s.new_x for s in steps[:4]] == [True, False, True, False]
    assert [s.last for s in steps].count(True) == 1 and steps[-1].last
    assert sum(s.end_of_epoch for s in steps) == 2
    alg1 = schedule(10, None, 1, 3, 1, seed=0)
    assert [s.new_x for s in alg1] == [True, False, False] and all(s.new_w0 for s in alg1)


_CHILD = r"""
import os, signal, sys
signal.signal(signal.SIGINT, signal.default_int_handler)  # a background job starts ignoring it
sys.path.insert(0, sys.argv[1])
import _history_cases as cases
from threadpoolctl import threadpool_limits

def interrupt(net, rec):
    if rec["iteration"] == 5:
        os.kill(os.getpid(), signal.SIGINT)   # a real SIGINT, delivered between two rounds

with threadpool_limits(1):
    try:
        cases.run_case("alg2_ce_alternations", checkpoint=sys.argv[2], checkpoint_every=2,
                       callback=interrupt)
    except KeyboardInterrupt:
        sys.exit(3)
sys.exit(0)
"""


def test_sigint_then_resume_is_bit_identical(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    from threadpoolctl import threadpool_limits

    child = subprocess.run(
        [sys.executable, "-c", _CHILD, str(Path(__file__).parent), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=600,  # a hang guard only: the child takes a few seconds
    )
    assert child.returncode == 3, child.stderr
    assert load_checkpoint(tmp_path)[1]["iteration"] == 5  # checkpoint_every=2 wrote 4; SIGINT 5
    with threadpool_limits(1):
        whole = cases.record(cases.run_case("alg2_ce_alternations"))
        resumed = cases.record(cases.run_case("alg2_ce_alternations", resume=tmp_path))
    assert resumed == whole


@pytest.mark.skipif(sys.platform == "win32", reason="a POSIX signal sent to this process")
def test_a_ctrl_c_during_a_state_change_is_held_until_the_change_ends():
    """The round's state fields change together (``schedule.held_interrupt``): a SIGINT in the
    middle raises its ``KeyboardInterrupt`` only once the body has run, and the handler in place
    before is back."""
    from fenchel_cvx.schedule import held_interrupt

    # Python's own handler, as in a terminal (a background job, as CI may be, ignores SIGINT)
    outer, done = signal.signal(signal.SIGINT, signal.default_int_handler), []
    try:
        with pytest.raises(KeyboardInterrupt):
            with held_interrupt():
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(0.05)  # Python runs signal handlers between bytecodes: here, held
                done.append("the rest of the body")
        assert done == ["the rest of the body"]
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGINT, outer)
