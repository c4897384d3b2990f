"""Pinned iterates of Algorithm 2 and of the oracle, recorded on main before issue 52's refactor.

Issue 52 refactors Algorithm 2's driver (``fenchel_cvx/bcd.py`` and the modules it runs), the
fast solvers (``fenchel_cvx/fast/``) and the oracle's polish under the rule "no change in
results". Its first step, before any other change, recorded what today's main computes, as the
fixtures ``tests/data/pinned/<case>.npz`` (float64 arrays, compressed) and ``<case>.json`` (the
settings, the versions, whether the compiled path compiled, and each round's integers, flags
and strings), which ``tests/test_pinned_iterates.py`` re-runs these recipes against:

- ``mlp_eager``, ``mlp_auto``: the MNIST MLP benchmark's FLN (``benchmarks/mnist_mlp.py``):
  784-300-10, ReLU, cross-entropy, the tuned setting ``defaults.training("dense", 1,
  batched=True)`` (lam 0.2, rho 0, gamma (1, 30), momentum (0.7, 0), W-steps (10, 1), 20
  X-steps) on the benchmarks' fast backend (``benchmarks/common/fln.py``: capped solves that
  report no residual and no value, ``gram_reuse`` 1, one thread), in float64, seed 0, batch
  500 of the embedded 5k MNIST (the benchmarks' ``--quick`` data: 4,000 training images,
  pixels / 255) in the benchmarks' order (``datasets.batch_order``): its first three batches
  (rounds of Algorithm 2, K = 1), eagerly (``compile=False``) and with ``compile="auto"``
  (which compiles none of this network's chains: all are below ``fast.fused.MIN_SIZE``; the
  JSON's ``compiled_graphs`` says so);
- ``lenet5_eager``, ``lenet5_auto``: the LeNet-5 benchmark's FLN
  (``benchmarks/mnist_lenet5.py``: ``fenchel_cvx.lenet5`` on 1 x 28 x 28 images, ReLU,
  cross-entropy, ``defaults.training("lenet5", 4, batched=True)``, the backend in float64 with
  the setting's ``x_steps`` and ``gram_reuse``), the same three full batches of 500; with
  ``compile="auto"`` its convolution blocks' chains compile;
- ``oracle_relu_mse``, ``oracle_relu_ce``, ``oracle_tanh_ce``: two rounds of Algorithm 1 on the
  CVXPY oracle with its certificate (``fit_bcd(backend="cvxpy")``, strict), a 20-8-6-3 network
  (seed 0, ``defaults.training("dense", 2, batched=False)``: lam 10, rho 1, no proximal term)
  on 40 random points (``np.random.default_rng(52)``; classes for cross-entropy): the ReLU
  runs take the exact methods and the nnls path, the tanh run CLARABEL's templates and the
  polish.

The three batches' rounds 1 and 2 run the benchmarks' unchecked path; round 3 is a checked
round (``check_every=3``): the objectives and the certificate's figures. Recorded per round:
the weights (biases in their last column) of every layer after it, and before the first; the
history record's floats (objectives, divergences, the proximal term, each block's values and
KKT residual, the certificate's figures; no timings) and its integers, flags and strings (each
block's iterations and status, the certificate's verdict and violations); after the last
round the lifted variables X_1 .. X_L (for the oracle after each round: a run of one round
gives the first). An array of at most ``FULL_MAX`` entries is kept whole; a larger one
(MNIST's W_0, LeNet-5's fc 120 and the X's) by its *probes*: its products with two fixed
vectors from either side (``probe_vectors``: all ones, and a deterministic quasi-random one)
and ``PROBE_ENTRIES`` of its entries at fixed places: a change of any row or column moves
them, unless it is orthogonal to both vectors and misses every kept entry.

    python tests/pinned/record.py                 # writes the fixtures that are missing
    python tests/pinned/record.py --force NAME    # rewrites NAME (not in a refactor: see below)

**The fixtures are never rewritten by a refactor.** They hold today's results, and issue 52
changes code, not results: a refactor that fails ``tests/test_pinned_iterates.py`` has changed
what the code computes, and is fixed, not re-recorded. This script refuses to overwrite a
fixture without ``--force``, which is for a deliberate change of results in another issue,
said in its commit.
"""

from __future__ import annotations

import argparse
import json
import numbers
import platform
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

FIXTURES = Path(__file__).resolve().parents[1] / "data" / "pinned"
#: Algorithm 2's recorded batches (one round each: K = 1) and their size (the benchmarks')
BATCHES, BATCH_SIZE = 3, 500
#: the seed of the networks' weights and of the batch order (the benchmarks' default)
SEED = 0
#: rounds 1 .. BATCHES - 1 unchecked (the benchmarks' path), the last one checked
CHECK_EVERY = BATCHES
#: Algorithm 1's recorded rounds on the oracle
ORACLE_ROUNDS = 2
#: the oracle's network and data
ORACLE_SIZES, ORACLE_POINTS, ORACLE_DATA_SEED = (20, 8, 6, 3), 40, 52
#: arrays of at most this many entries are recorded whole; larger ones by their probes
FULL_MAX = 16384
#: the entries a larger array's probes keep (at fixed places: ``probe_places``)
PROBE_ENTRIES = 1024
#: history fields that are wall-clock times (never recorded)
TIMINGS = ("seconds", "solver_seconds")

#: the recorded cases: a recipe and its options
CASES = {
    "mlp_eager": dict(recipe="mlp", compile=False),
    "mlp_auto": dict(recipe="mlp", compile="auto"),
    "lenet5_eager": dict(recipe="lenet5", compile=False),
    "lenet5_auto": dict(recipe="lenet5", compile="auto"),
    "oracle_relu_mse": dict(recipe="oracle", activation="relu", loss="mse", classes=False),
    "oracle_relu_ce": dict(recipe="oracle", activation="relu", loss="cross_entropy", classes=True),
    "oracle_tanh_ce": dict(recipe="oracle", activation="tanh", loss="cross_entropy", classes=True),
}


@dataclass
class Run:
    """What a recipe ran: ``snapshots`` ``(label, arrays)`` in order (``"W.b0"`` the initial
    weights, ``"W.b1"`` after the first round, ..., ``"X.b3"`` the lifted variables after it),
    the history ``records``, the ``data`` arrays that identify the inputs, the run's
    ``settings`` and ``compiled_graphs`` (kernels dynamo compiled during the run)."""

    snapshots: list = field(default_factory=list)
    records: list = field(default_factory=list)
    data: dict = field(default_factory=dict)
    settings: dict = field(default_factory=dict)
    compiled_graphs: int = 0


# --- the data -----------------------------------------------------------------------------------
def mnist():
    """The embedded 5k MNIST as the benchmarks' ``--quick`` loads it (``common.data.load``):
    ``(X, Y, image_shape)``, the 4,000 training images as columns (pixels / 255, float64) and
    their one-hot labels."""
    from fenchel_cvx.datasets import load_mnist5k, one_hot

    ds = load_mnist5k()
    return ds.X_train, one_hot(ds.y_train, ds.n_classes), ds.image_shape


def oracle_data(classes):
    """The oracle's 40 points: X standard normal, Y standard normal or one-hot classes."""
    rng = np.random.default_rng(ORACLE_DATA_SEED)
    X = rng.standard_normal((ORACLE_SIZES[0], ORACLE_POINTS))
    k = ORACLE_SIZES[-1]
    Y = (
        np.eye(k)[:, rng.integers(0, k, ORACLE_POINTS)]
        if classes
        else rng.standard_normal((k, ORACLE_POINTS))
    )
    return X, Y


# --- the recipes --------------------------------------------------------------------------------
def mlp_setting():
    from fenchel_cvx import defaults

    return defaults.training("dense", 1, batched=True)


def lenet5_setting():
    from fenchel_cvx import defaults

    return defaults.training("lenet5", 4, batched=True)


def mlp_network(X, image_shape, setting):
    from fenchel_cvx import LiftedNetwork

    return LiftedNetwork(
        [X.shape[0], 300, 10],
        "relu",
        "cross_entropy",
        lam=setting.lam[0],
        rho=setting.rho[0],
        seed=SEED,
        dtype="float64",
    )


def lenet5_network(X, image_shape, setting):
    from fenchel_cvx import lenet5

    return lenet5(
        input_shape=image_shape,
        n_classes=10,
        activation="relu",
        loss="cross_entropy",
        lam=setting.lam,
        rho=setting.rho,
        seed=SEED,
        dtype="float64",
    )


def mlp_backend(setting, compile, threads):
    """``benchmarks/mnist_mlp.py``'s ``fln.fln_backend(args, newton_cap=None)``."""
    from fenchel_cvx.fast import FastBackend

    return FastBackend(
        w_steps=setting.w_steps,
        x_steps=setting.x_steps[0],
        gram_reuse=1,
        capped_residual=False,
        capped_value=False,
        threads=threads,
        newton_cap=None,
        compile=compile,
    )


def lenet5_backend(setting, compile, threads):
    """``benchmarks/mnist_lenet5.py``'s ``fln.fln_backend(args, dtype=args.dtype)``."""
    from fenchel_cvx.fast import FastBackend

    return FastBackend(
        w_steps=setting.w_steps,
        x_steps=setting.x_steps,
        gram_reuse=setting.gram_reuse,
        capped_residual=False,
        capped_value=False,
        threads=threads,
        dtype="float64",
        compile=compile,
    )


RECIPES = {
    "mlp": (mlp_setting, mlp_network, mlp_backend),
    "lenet5": (lenet5_setting, lenet5_network, lenet5_backend),
}


def weights(net):
    """A copy of every layer's weights, as float64 NumPy arrays."""
    return [np.array(W, dtype=np.float64, copy=True) for W in net.W]


def run_batches(recipe, compile, data=None, threads=1, lam_factor=1.0, fit=None, **ranks):
    """Algorithm 2 as the benchmark of ``recipe`` (``"mlp"``, ``"lenet5"``) trains, for its
    first ``BATCHES`` batches (``fit_bcd``'s schedule of one epoch, stopped by the callback).
    ``data``: ``mnist()``'s result (loaded where None); ``threads``: the backend's budget (the
    benchmarks' default, 1); ``lam_factor``: scales the setting's lam (a planted fault);
    ``fit``: what trains (None: ``fit_bcd``; ``parallel.fit_on_ranks``), ``ranks`` its
    keywords (``comm=``, ``nproc=``)."""
    from fenchel_cvx.bcd import fit_bcd
    from fenchel_cvx.datasets import batch_order
    from fenchel_cvx.fast.fused import compiled_graphs

    X, Y, image_shape = mnist() if data is None else data
    make_setting, make_net, make_backend = RECIPES[recipe]
    setting = make_setting()
    net = make_net(X, image_shape, setting)
    if lam_factor != 1:
        net.lam = [v * lam_factor for v in net.lam]
    backend = make_backend(setting, compile, threads)
    run = Run(snapshots=[("W.b0", weights(net))])

    def after_round(net_, rec):
        run.snapshots.append((f"W.b{rec['batch']}", weights(net_)))
        return rec["batch"] >= BATCHES

    graphs = compiled_graphs()
    result = (fit or fit_bcd)(
        net,
        X,
        Y,
        batch_size=BATCH_SIZE,
        epochs=1,
        alternations=1,
        backend=backend,
        strict=False,
        eval_every=None,
        check_every=CHECK_EVERY,
        gamma=list(setting.gamma),
        momentum=list(setting.momentum),
        x_sweep="backward",
        callback=after_round,
        **ranks,
    )
    run.compiled_graphs = compiled_graphs() - graphs
    run.records = list(result.history)
    run.snapshots.append((f"X.b{BATCHES}", [np.asarray(A, dtype=np.float64) for A in result.Xs]))
    batches = np.stack(batch_order(X.shape[1], BATCH_SIZE, 1, seed=SEED)[0][:BATCHES])
    if not np.array_equal(result.batch, batches[-1]):
        raise AssertionError("the run's last batch is not the schedule's third")
    run.data = {
        "data.batches": batches.astype(np.int64),
        "data.labels": np.argmax(Y[:, batches], axis=0).astype(np.int64),
        "data.column_sums": X[:, batches].sum(axis=0),
    }
    run.settings = dict(
        recipe=recipe,
        compile=compile,
        kernels=type(backend.kernels).__name__,
        kernels_may_compile=bool(backend.kernels.compiled),
        backend=backend.options(),
        lam=[float(v) for v in net.lam],
        rho=[float(v) for v in net.rho],
        gamma=list(setting.gamma),
        momentum=list(setting.momentum),
        layer_sizes=list(net.layer_sizes),
        batch_size=BATCH_SIZE,
        batches=BATCHES,
        check_every=CHECK_EVERY,
        seed=SEED,
        threads=threads,
        dtype="float64",
    )
    return run


def run_oracle(activation, loss, classes, threads=1, lam_factor=1.0, rounds=ORACLE_ROUNDS):
    """Algorithm 1 on the CVXPY oracle (strict: its certificate holds every round or raises),
    ``rounds`` rounds; the X's after each round from a run of that many rounds (the driver
    hands its callback the weights, not the X's). ``lam_factor``: scales the setting's lam."""
    from fenchel_cvx import LiftedNetwork, defaults
    from fenchel_cvx.bcd import fit_bcd
    from fenchel_cvx.oracle import OracleBackend
    from fenchel_cvx.threads import limit_threads

    setting = defaults.training("dense", len(ORACLE_SIZES) - 2, batched=False)
    X, Y = oracle_data(classes)

    def network():
        net = LiftedNetwork(
            list(ORACLE_SIZES),
            activation,
            loss,
            lam=list(setting.lam),
            rho=list(setting.rho),
            seed=SEED,
        )
        if lam_factor != 1:
            net.lam = [v * lam_factor for v in net.lam]
        return net

    net = network()
    run = Run(snapshots=[("W.b0", weights(net))])

    def after_round(net_, rec):
        run.snapshots.append((f"W.b{rec['iteration']}", weights(net_)))

    backend = OracleBackend(tol=defaults.TOL)
    with limit_threads(threads):
        lifted = []
        for k in range(1, rounds):  # the X's after round k < rounds: a run of k rounds
            res = fit_bcd(network(), X, Y, iterations=k, backend=backend, strict=True)
            lifted.append((f"X.b{k}", [np.array(A, dtype=np.float64) for A in res.Xs]))
        result = fit_bcd(
            net, X, Y, iterations=rounds, backend=backend, strict=True, callback=after_round
        )
    lifted.append((f"X.b{rounds}", [np.array(A, dtype=np.float64) for A in result.Xs]))
    run.snapshots += lifted
    run.records = list(result.history)
    run.data = {"data.X": X, "data.Y": Y}
    run.settings = dict(
        recipe="oracle",
        activation=activation,
        loss=loss,
        backend=backend.settings(),
        lam=[float(v) for v in net.lam],
        rho=[float(v) for v in net.rho],
        gamma=None,
        layer_sizes=list(ORACLE_SIZES),
        points=ORACLE_POINTS,
        data_seed=ORACLE_DATA_SEED,
        rounds=rounds,
        seed=SEED,
        threads=threads,
        strict=True,
    )
    return run


def run_case(name, data=None, threads=1, lam_factor=1.0):
    """The run of the case ``name`` (``CASES``): ``data`` the MNIST recipes' (``mnist()``),
    loaded where None; ``threads`` the BLAS budget; ``lam_factor`` scales the setting's lam."""
    case = dict(CASES[name])
    recipe = case.pop("recipe")
    if recipe == "oracle":
        return run_oracle(**case, threads=threads, lam_factor=lam_factor)
    return run_batches(recipe, case["compile"], data, threads, lam_factor)


# --- what a run is compared by ------------------------------------------------------------------
def probe_vectors(n):
    """Two fixed vectors of length ``n``: all ones, and ``cos(2 pi phi j)`` (phi the golden
    ratio: spread over [-1, 1] without a pattern that a weight matrix's structure shares)."""
    j = np.arange(n, dtype=np.float64)
    return np.stack([np.ones(n), np.cos(2 * np.pi * 0.6180339887498949 * j)], axis=1)


def probe_places(size):
    """``PROBE_ENTRIES`` fixed places in an array of ``size`` entries (a multiplicative stride,
    prime to any size here, so the places spread over rows and columns)."""
    k = np.arange(min(PROBE_ENTRIES, size), dtype=np.int64)
    return (k * 7919 + 13) % size


def summary(label, arrays):
    """The float64 arrays that stand for one snapshot: each array whole (``label.i``) where it
    has at most ``FULL_MAX`` entries, else its probes (``label.i.rows``: A times the probe
    vectors, ``label.i.cols``: their transpose times A, ``label.i.entries``)."""
    out = {}
    for i, A in enumerate(arrays):
        A = np.asarray(A, dtype=np.float64)
        if A.size <= FULL_MAX:
            out[f"{label}.{i}"] = A
            continue
        out[f"{label}.{i}.rows"] = A @ probe_vectors(A.shape[1])
        out[f"{label}.{i}.cols"] = probe_vectors(A.shape[0]).T @ A
        out[f"{label}.{i}.entries"] = A.ravel()[probe_places(A.size)]
    return out


def flatten(record):
    """``(floats, discrete)`` of a history record: each float by its path (``prox``,
    ``blocks.W_0.value_after``, ``certificate.bound_gap``, ``divergence_x.0``), and each
    integer, flag, string and None by its path; timings left out."""
    floats, discrete = {}, {}

    def walk(value, path):
        if isinstance(value, dict):
            for key, v in value.items():
                if key not in TIMINGS:
                    walk(v, f"{path}.{key}" if path else str(key))
        elif isinstance(value, (list, tuple)):
            for i, v in enumerate(value):
                named = isinstance(v, dict) and "block" in v
                walk(v, f"{path}.{v['block'] if named else i}")
        elif value is None or isinstance(value, (bool, np.bool_, str)):
            discrete[path] = value if value is None or isinstance(value, str) else bool(value)
        elif isinstance(value, numbers.Integral):
            discrete[path] = int(value)
        elif isinstance(value, numbers.Real):
            floats[path] = float(value)
        else:
            raise TypeError(f"{path}: {type(value).__name__} is not recordable")

    walk(record, "")
    return floats, discrete


def arrays_of(run):
    """Every float64 array of a run that the fixture holds: the snapshots' summaries, each
    round's floats (``round<k>.figures``, in the order of the JSON's ``float_names``) and the
    data's arrays."""
    out = {}
    for label, arrays in run.snapshots:
        out.update(summary(label, arrays))
    for k, rec in enumerate(run.records, 1):
        floats, _ = flatten(rec)
        out[f"round{k}.figures"] = np.array(list(floats.values()), dtype=np.float64)
    out.update(run.data)
    return out


def rounds_of(run):
    """Per round: its discrete values and the names of its floats (JSON)."""
    out = []
    for rec in run.records:
        floats, discrete = flatten(rec)
        out.append(dict(discrete=discrete, float_names=list(floats)))
    return out


def versions():
    """The versions of what computed the fixture, and the BLAS it ran on."""
    import cvxpy
    import scipy

    out = dict(
        python=platform.python_version(),
        machine=platform.machine(),
        numpy=np.__version__,
        scipy=scipy.__version__,
        cvxpy=cvxpy.__version__,
    )
    try:
        import clarabel

        out["clarabel"] = getattr(clarabel, "__version__", None)
    except ImportError:
        pass
    torch = sys.modules.get("torch")
    if torch is not None:
        out["torch"] = torch.__version__
    try:
        from threadpoolctl import threadpool_info

        out["blas"] = [
            {k: pool.get(k) for k in ("internal_api", "version", "architecture", "prefix")}
            for pool in threadpool_info()
            if pool.get("user_api") == "blas"
        ]
    except ImportError:
        pass
    return out


def meta_of(name, run):
    from fenchel_cvx.fast.fused import compiler_problem

    return dict(
        case=name,
        settings=run.settings,
        compiled_graphs=run.compiled_graphs,
        compiler_problem=compiler_problem(),
        full_max=FULL_MAX,
        probe_entries=PROBE_ENTRIES,
        versions=versions(),
        rounds=rounds_of(run),
    )


def jsonable(x):
    """``json.dumps``'s ``default``: tuples as lists, NumPy scalars as Python's."""
    if isinstance(x, tuple):
        return list(x)
    if isinstance(x, (np.integer, np.floating, np.bool_)):
        return x.item()
    raise TypeError(f"{type(x).__name__} is not JSON")


def as_json(obj):
    """``obj`` as the fixture's JSON reads back (tuples as lists, NumPy scalars as Python's)."""
    return json.loads(json.dumps(obj, default=jsonable))


def paths(name):
    return FIXTURES / f"{name}.npz", FIXTURES / f"{name}.json"


def write(name, run):
    """Write the fixture of ``name``: ``<name>.npz`` (compressed) and ``<name>.json``."""
    npz, meta = paths(name)
    FIXTURES.mkdir(parents=True, exist_ok=True)
    arrays = arrays_of(run)
    for key, A in arrays.items():
        if A.dtype.kind == "f" and A.dtype != np.float64:
            raise TypeError(f"{key}: {A.dtype}, not float64")
    np.savez_compressed(npz, **arrays)
    text = json.dumps(meta_of(name, run), indent=1, default=jsonable, allow_nan=False)
    meta.write_text(text + "\n")


def load(name):
    """``(arrays, meta)`` of the fixture of ``name``."""
    npz, meta = paths(name)
    with np.load(npz, allow_pickle=False) as f:
        arrays = {k: f[k] for k in f.files}
    return arrays, json.loads(meta.read_text())


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("names", nargs="*", help=f"cases to record (default: all): {', '.join(CASES)}")
    p.add_argument(
        "--force",
        action="store_true",
        help="rewrite existing fixtures (never in a refactor: the module doc)",
    )
    args = p.parse_args(argv)
    unknown = sorted(set(args.names) - set(CASES))
    if unknown:
        p.error(f"unknown cases {unknown}; the cases: {', '.join(CASES)}")
    data = None
    for name in args.names or list(CASES):
        if paths(name)[0].exists() and not args.force:
            print(f"{name}: kept (pinned; --force rewrites it)")
            continue
        if data is None and CASES[name]["recipe"] != "oracle":
            data = mnist()
        run = run_case(name, data=data)
        write(name, run)
        size = sum(path.stat().st_size for path in paths(name))
        print(
            f"{name}: {len(run.records)} rounds, {run.compiled_graphs} kernels compiled, "
            f"{size / 1024:.0f} KiB"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
