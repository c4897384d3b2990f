"""Shared test configuration: hypothesis profiles, the ``slow`` marker and small-problem fixtures.

``slow`` marks the docs build, the notebooks, the full-size runs and every test that takes
about 15 seconds or more on 2 busy cores (the benchmarks' quick runs, spawned ranks, compiled
runs): ``pytest -m "not slow"`` is the quick loop; plain ``pytest`` (what CI runs) runs
everything, the ``slow`` tests first (``pytest_collection_modifyitems``).

The tests run on this machine's cores, a worker process each (pytest-xdist's ``-n auto``, set in
``setup.cfg``), at most ``MAX_WORKERS`` of them: every worker holds its own PyTorch and data.
A worker that runs out of tests takes half of another's queue (``--dist worksteal``), so that a
few minute-long tests near the end of one worker's share do not leave the other idle.
``pytest -n 0`` runs them in this process (a debugger, a profile).

Hypothesis profiles (select with ``--hypothesis-profile NAME`` or ``HYPOTHESIS_PROFILE=NAME``):

- ``ci`` (default): few examples, no deadline, so the whole suite stays fast on 2 cores;
- ``dev``: more examples for local work;
- ``thorough``: many examples, for a nightly run or after touching the mathematics.

PyTorch's compiler builds each kernel in the process that asks for it
(``TORCHINDUCTOR_COMPILE_THREADS=1``, unless set already), in the workers and in every process
they start: each core already runs a worker, so a pool of compile processes would only add
their start-up.

BLAS runs on one thread during the tests (``FENCHEL_TEST_BLAS_THREADS`` overrides): every
problem here is tiny, and OpenBLAS's spinning worker threads make scipy's L-BFGS-B twenty times
slower on a busy 2-core machine.

The full MNIST (``mnist_dir``) is looked for in ``$FENCHEL_DATA/mnist``, then in the development
data folder beside the checkout; the tests that need it skip, naming both places, where neither
holds it.
"""

import os
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, settings

import registry_params
from fenchel_cvx.activations import activation
from fenchel_cvx.network import LiftedNetwork

os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")  # read as PyTorch's compiler loads

#: the most worker processes ``-n auto`` starts
MAX_WORKERS = 4


def pytest_xdist_auto_num_workers(config):
    """``-n auto``: this machine's cores (those this process may use), at most ``MAX_WORKERS``."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, min(MAX_WORKERS, cores or 1))


def pytest_collection_modifyitems(config, items):
    """The ``slow`` tests first, each group in its collected order (the same on every worker).
    ``--dist worksteal`` gives each worker a contiguous share of this list, which it runs from
    the front, and a worker that runs out takes from the end of another's: the slow tests run
    first, on the first worker, and the suite ends on short ones, with no worker left idle
    while another runs a minute-long test."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


_COMMON = dict(
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.differing_executors],
)
settings.register_profile("ci", max_examples=20, **_COMMON)
settings.register_profile("dev", max_examples=100, **_COMMON)
settings.register_profile("thorough", max_examples=1000, **_COMMON)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

#: the four IDX files of MNIST, each gzipped or raw
MNIST_FILES = (
    "train-images-idx3-ubyte",
    "train-labels-idx1-ubyte",
    "t10k-images-idx3-ubyte",
    "t10k-labels-idx1-ubyte",
)


def mnist_places():
    """Where the tests look for the full MNIST: ``$FENCHEL_DATA/mnist``, then the development
    data folder beside the checkout."""
    places = [Path(os.environ["FENCHEL_DATA"]) / "mnist"] if os.environ.get("FENCHEL_DATA") else []
    return [*places, Path(__file__).resolve().parents[2] / "shared" / "data" / "mnist"]


@pytest.fixture(scope="session")
def mnist_dir():
    """The folder of the full MNIST (``mnist_places``, the first that holds every file); the test
    skips, naming each place looked in, where none does."""
    places = mnist_places()
    for place in places:
        if all((place / f"{n}.gz").is_file() or (place / n).is_file() for n in MNIST_FILES):
            return place
    pytest.skip(f"the full MNIST is in none of {', '.join(map(str, places))}")


@pytest.fixture(scope="session", autouse=True)
def _single_threaded_blas():
    """Limit BLAS threads once every test module is imported, every BLAS library's pool:
    ``threads.controller`` loads SciPy's own OpenBLAS first (a pool loaded after the limit
    keeps its threads, and the W-blocks' solves then round apart from one thread's by up to
    2e-13: ``test_torch_comm.py`` run alone)."""
    from fenchel_cvx.threads import controller

    with controller().limit(
        limits=int(os.environ.get("FENCHEL_TEST_BLAS_THREADS", "1")), user_api="blas"
    ):
        yield


#: every registered activation that ``activation(name)`` builds without a parameter, and every
#: registered loss, read from the registries (``registry_params.activations()`` / ``losses()``)
#: when the tests are collected: a class registered with ``@register_activation`` or
#: ``@register_loss`` reaches tests/test_network.py and tests/test_blocks.py with no test
#: changed (tests/test_network.py then asks for its hand-written formula, by class)
ACTIVATION_NAMES = tuple(registry_params.activations())
LOSS_NAMES = tuple(registry_params.losses())


def interior_sample(act, shape, rng, margin=0.05, scale=1.5):
    """Random points strictly inside the range of ``act`` (a margin away from its ends)."""
    act = activation(act)
    lo, hi = act.v_range
    lo = -scale if np.isinf(lo) else lo + margin
    hi = scale if np.isinf(hi) else hi - margin
    return rng.uniform(lo, hi, size=shape)


def labels(loss_name, n_out, m, rng):
    """Targets: one-hot columns for a loss that serves classification only (cross-entropy),
    Gaussian for the others (``registry_params.targets``)."""
    return registry_params.targets(loss_name, n_out, m, rng)


def random_classification(n=4, k=3, m=24, seed=0):
    """Standard-normal inputs ``X`` (n x m) and one-hot labels ``Y`` (k x m) of random classes."""
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, m))
    Y = np.eye(k)[:, rng.integers(0, k, m)]
    return X, Y


def fd_grad(f, A, h=1e-6):
    """The central-difference gradient of the scalar function ``f`` at the array ``A``."""
    G = np.zeros_like(A)
    for idx in np.ndindex(A.shape):
        E = np.zeros_like(A)
        E[idx] = h
        G[idx] = (f(A + E) - f(A - E)) / (2 * h)
    return G


def make_problem(
    sizes=(3, 4, 3, 2), act="relu", loss="mse", m=5, lam=1.0, rho=0.1, seed=0, lifted="interior"
):
    """A small network and data: ``(net, X0, Y, Xs)``.

    ``lifted="interior"`` draws each X_l strictly inside its activation's range (off the
    feed-forward point); ``lifted="ff"`` uses the feed-forward pass.
    """
    rng = np.random.default_rng(seed)
    net = LiftedNetwork(sizes, activation=act, loss=loss, lam=lam, rho=rho, seed=seed)
    # random nonzero biases, so that the bias column is exercised everywhere
    for W in net.W:
        W[:, -1] = rng.normal(scale=0.5, size=W.shape[0])
    X0 = rng.normal(size=(sizes[0], m))
    Y = labels(net.loss.name, sizes[-1], m, rng)
    if lifted == "ff":
        Xs = net.forward(X0)[0]
    else:
        Xs = [interior_sample(a, (p, m), rng) for a, p in zip(net.activations, sizes[1:-1])]
    return net, X0, Y, Xs


@pytest.fixture
def rng():
    return np.random.default_rng(20200826)


@pytest.fixture
def problem_factory():
    """``make_problem`` as a fixture (see its docstring)."""
    return make_problem


@pytest.fixture
def interior():
    """``interior_sample(act, shape, rng)`` as a fixture."""
    return interior_sample


@pytest.fixture
def calls(monkeypatch):
    """``calls(owner, *names)``: the calls of each of ``owner``'s methods ``names`` for the
    test's duration, counted in one ``collections.Counter`` that every call shares (a name's
    count under its name)."""
    import collections

    counts = collections.Counter()

    def watch(owner, *names):
        for name in names:
            fn = getattr(owner, name)

            def run(*args, _fn=fn, _name=name, **kwargs):
                counts[_name] += 1
                return _fn(*args, **kwargs)

            monkeypatch.setattr(owner, name, run)
        return counts

    return watch


@pytest.fixture(scope="session")
def built_site(tmp_path_factory):
    """The documentation built once for the worker by ``mkdocs build --strict``
    (``_docs.build_site``): ``(its folder, the build's completed process)``, which the docs tests
    read (``test_docs``, ``test_docs_offline``)."""
    from _docs import build_site

    site = tmp_path_factory.mktemp("docs") / "site"
    return site, build_site(site)


@pytest.fixture(scope="session")
def random_data():
    """``random_classification(n, k, m, seed)`` as a fixture (see its docstring)."""
    return random_classification


@pytest.fixture(name="fd_grad", scope="session")
def fd_grad_fixture():
    """``fd_grad(f, A, h)`` as a fixture (scoped to the whole test run, so hypothesis tests may use
    it)."""
    return fd_grad


@pytest.fixture
def write_cifar10():
    """``write(folder, sizes, rng)``: CIFAR-10 python batches (data_batch_1..5, test_batch) of
    ``sizes`` random images each, in the official pickle format; returns the written dicts."""
    import pickle

    def write(folder, sizes, rng):
        folder.mkdir(parents=True)
        names = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
        batches = {}
        for name, n in zip(names, sizes):
            d = {
                b"batch_label": name.encode(),
                b"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8),
                b"labels": [int(v) for v in rng.integers(0, 10, n)],
                b"filenames": [f"img_{i}.png".encode() for i in range(n)],
            }
            with open(folder / name, "wb") as f:
                pickle.dump(d, f, protocol=2)
            batches[name] = d
        return batches

    return write
