"""The oracle's robustness sweep: every run certified at its tolerance, or refused by name.

Seeds x 3 shapes x every registered activation and loss the oracle has CVXPY forms of
(``oracle.atoms.has_forms``) x {batched, full}, with rho = 0 (the hard case: no strong
convexity from the penalty) and fit_bcd's default gamma (> 0 batched, 0 full), one round on 12
Gaussian points (docs page "The CVXPY oracle", "Robustness"). A run passes when it ends with the
strict certificate held and every block's recomputed KKT residual within ``tol``, or stops with
``NoMinimiser`` (a cross-entropy W_L-block without rho and gamma on separable data) before
that block is solved; anything else fails, and the script prints it and exits 1.

    python benchmarks/oracle_sweep.py                 # 50 seeds: 4,500 runs, about 6 min
    python benchmarks/oracle_sweep.py --seeds 5 --tol 1e-8

It prints the count of each outcome and each failed run. The test suite runs one seed
(tests/test_robustness.py).
"""

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fenchel_cvx.activations import ACTIVATIONS, activation_names  # noqa: E402
from fenchel_cvx.bcd import fit_bcd  # noqa: E402
from fenchel_cvx.losses import LOSSES, loss_names  # noqa: E402
from fenchel_cvx.network import LiftedNetwork  # noqa: E402
from fenchel_cvx.oracle import OracleBackend  # noqa: E402
from fenchel_cvx.oracle.atoms import has_forms  # noqa: E402
from fenchel_cvx.oracle.wellposed import NoMinimiser  # noqa: E402

SHAPES = [(3, 4, 2), (4, 3, 3, 2), (2, 5, 3)]
#: each mode's batch size (None: all the points, Algorithm 1)
MODES = {"batched": 6, "full": None}


def activations():
    """The registered activations the oracle can solve, built without a parameter."""
    return [n for n in activation_names() if has_forms(ACTIVATIONS[n])]


def losses():
    """The registered losses the oracle can solve."""
    return [n for n in loss_names() if has_forms(LOSSES[n])]


def data(shape, seed, m=12):
    """``m`` Gaussian points and one-hot labels for a network of ``shape``."""
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((shape[0], m))
    return X, np.eye(shape[-1])[:, rng.integers(0, shape[-1], m)]


def run_one(oracle, shape, act, loss, mode, seed, tol):
    """One round with rho = 0 and the default gamma: ``"certified"`` or ``"no minimiser"``;
    anything else raises."""
    X, Y = data(shape, seed)
    net = LiftedNetwork(list(shape), act, loss, rho=0.0, seed=seed)
    kw = dict(batch_size=MODES[mode], iterations=1, epochs=1, eval_every=None)
    try:
        res = fit_bcd(net, X, Y, backend=oracle, tol=tol, **kw)
    except NoMinimiser as err:
        # only the last W-block of a loss that may lack a minimiser (cross-entropy), without
        # rho and gamma, can lack one
        if not (net.loss.may_lack_minimiser and mode == "full" and err.block == "w_last"):
            raise
        if "rho > 0 or gamma > 0" not in str(err):
            raise AssertionError(f"NoMinimiser without its remedy: {err}") from err
        return "no minimiser"
    h = res.history
    if not (h.config["strict"] and h.certificate_held):
        raise AssertionError("the strict certificate did not hold")
    for r in h:
        if r["halted"] is not None or r["certificate"]["max_residual"] > tol:
            raise AssertionError(f"halted {r['halted']}, {r['certificate']['max_residual']}")
        if any(b["residual"] > tol for b in r["blocks"]):
            raise AssertionError(f"a block's residual above {tol}: {r['blocks']}")
    return "certified"


def sweep(oracle, seeds, tol, acts=None, loss_names=None):
    """``(counts, failures)``: each outcome's count over the sweep, and ``(case, error)`` for
    each run that failed (``acts``, ``loss_names``: None for every one the oracle solves)."""
    counts, failures = {}, []
    for shape in SHAPES:
        for act in acts or activations():
            for loss in loss_names or losses():
                for mode in MODES:
                    for seed in seeds:
                        case = (shape, act, loss, mode, seed)
                        try:
                            k = run_one(oracle, *case, tol)
                        except Exception as err:  # noqa: BLE001 - every failure is reported
                            k = "failed"
                            failures.append((case, repr(err)))
                        counts[k] = counts.get(k, 0) + 1
    return counts, failures


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=50, help="seeds per case (default 50)")
    ap.add_argument("--tol", type=float, default=1e-6, help="the certificate's tol")
    args = ap.parse_args(argv)
    if args.seeds < 1:
        ap.error(f"--seeds must be >= 1, got {args.seeds}")
    if not 0 < args.tol < 1:
        ap.error(f"--tol must be in (0, 1), got {args.tol}")
    t = time.perf_counter()
    counts, failures = sweep(OracleBackend(tol=args.tol), range(args.seeds), args.tol)
    print(f"oracle sweep: {args.seeds} seeds x {len(SHAPES)} shapes x {activations()} x "
          f"{losses()} x {list(MODES)}, tol {args.tol}: {counts} "
          f"in {time.perf_counter() - t:.0f} s")  # fmt: skip
    for case, err in failures:
        print("failed:", case, err)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
