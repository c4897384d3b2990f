"""The short runs whose histories ``tests/data/bcd_history_before.json`` pins.

``python -m tests._history_cases`` (from the repository root) rewrites the fixture, and
``tests/test_resume.py`` checks that the driver still records the same histories: the same
integers and strings, floats and weights to rounding (``RTOL`` relative, ``ATOL`` absolute).
It was first written by the driver before ``fit_bcd`` was split into a schedule, a state and a
loop, and pinned that restructure. It was written again when the fast solvers' PR+ restarts
came to be decided from dots (``fast._util.pr_plus``), which moves the iterates by rounding
only: every float of the three histories stayed within 1e-12 relative or 1e-14 absolute of
the first recording (those past 1e-12 relative are KKT residuals, divergences and objective
increases near zero). It was written a third time when the X-blocks' FISTA came to restart
each column's momentum on its own inner product (``fast.xblocks._momentum``), which moves the
iterates past rounding: columns restart at other steps. A change that moves them again
rewrites it and says why.

The fixture holds the final weights themselves, compared to rounding, not a digest of their
bits: on another CPU OpenBLAS takes other kernels, where every integer of the histories stays
the same and every float within 1e-12 relative or 1.1e-14 absolute (KKT residuals near 1e-14),
so a bit-for-bit pin would test the CPU, not the driver.
"""

import json
import sys
from pathlib import Path

import numpy as np

from fenchel_cvx.bcd import fit_bcd
from fenchel_cvx.network import LiftedNetwork

FIXTURE = Path(__file__).parent / "data" / "bcd_history_before.json"
TIMINGS = ("seconds", "solver_seconds")
#: floats agree when within RTOL relative or ATOL absolute (KKT residuals and divergences near 0)
RTOL, ATOL = 1e-12, 1e-13
#: the weights agree when within WTOL of each layer's largest entry
WTOL = 1e-10

CASES = {
    "alg1_mse_gamma": dict(
        net=dict(layer_sizes=[6, 5, 4, 3], activation="relu", loss="mse", lam=2.0, rho=0.1, seed=3),
        fit=dict(iterations=4, gamma=0.5, check_every=2),
    ),
    "alg2_ce_alternations": dict(
        net=dict(
            layer_sizes=[6, 5, 3],
            activation="relu",
            loss="cross_entropy",
            lam=1.0,
            rho=0.01,
            seed=1,
        ),
        fit=dict(batch_size=16, epochs=2, alternations=2, gamma=1.0, eval_every=3),
    ),
    "alg2_tanh_test_set": dict(
        net=dict(layer_sizes=[6, 4, 3], activation="tanh", loss="mse", lam=1.0, rho=0.0, seed=2),
        fit=dict(batch_size=20, epochs=2, gamma=0.0, test=True),
    ),
}


def case_data(seed=0, m=40, p=6, k=3):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(p, m))
    Y = np.eye(k)[:, rng.integers(0, k, size=m)]
    return X, Y


def strip_timings(x):
    """A history's dict without wall-clock fields (they differ from run to run)."""
    if isinstance(x, dict):
        return {k: strip_timings(v) for k, v in x.items() if k not in TIMINGS}
    if isinstance(x, list):
        return [strip_timings(v) for v in x]
    return x


def weights_close(now, before):
    """Whether two recorded weight lists agree layer by layer, to ``WTOL`` of the layer's scale."""
    return len(now) == len(before) and all(
        np.shape(a) == np.shape(b)
        and np.max(np.abs(np.subtract(a, b))) <= WTOL * max(np.max(np.abs(b)), 1e-300)
        for a, b in zip(now, before)
    )


def run_case(name, **fit_extra):
    spec = CASES[name]
    X, Y = case_data()
    fit = dict(spec["fit"])
    test = fit.pop("test", False)
    if test:
        fit.update(X_test=X[:, :10] + 0.5, Y_test=Y[:, :10])
    net = LiftedNetwork(**spec["net"])
    res = fit_bcd(net, X, Y, **{"backend": "fast", **fit, **fit_extra})
    return res


def record(res):
    return dict(
        history=strip_timings(res.history.to_dict()),
        weights=[np.asarray(W).tolist() for W in res.net.W],
    )


if __name__ == "__main__":
    out = {name: record(run_case(name)) for name in CASES}
    FIXTURE.write_text(json.dumps(out, indent=1))
    print(f"wrote {FIXTURE}", file=sys.stderr)
