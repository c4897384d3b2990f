"""One entry point, one history format and the shared closed forms of the lifted baselines.

``fit_lifted(method, X, Y, X_test, Y_test, iterations=..., **hyper)`` builds the network
``LiftedNetwork((p_0, *hidden, p_out), "relu", "mse", seed=seed)`` (Xavier-uniform weights,
zero biases: every method starts from the same point), runs ``iterations`` iterations of the
method (epochs for SGD) and after each one records the training seconds (evaluation excluded),
the method's own objective and the test accuracy of the feed-forward network its weights
define. Columns are data points; ``Y`` and ``Y_test`` are one-hot.

Two closed forms serve several peers (so each is written once):

- :func:`ridge`: ``argmin_W ||T - W A||_F^2 + reg ||W - W0||_F^2``, which is
  ``(T A^T + reg W0)(A A^T + reg I)^{-1}`` (``reg = 0``: the least-squares solution ``T A^+``
  through the pseudo-inverse);
- :func:`relu_prox`: the entrywise ``argmin_u (v - max(u, 0))^2 + c (u - m)^2``, the best of the
  two pieces ``u >= 0`` and ``u <= 0`` (Taylor et al.'s z-step, Lau et al.'s U-step).
"""

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from array_api_compat import array_namespace, device

from ...arrays import Array
from ...history import _plain
from ...network import LiftedNetwork
from ...validation import CALLABLE, ROUNDS, SEED, Sizes, check_dtype, check_matrix, validate

METHODS: dict[str, type["LiftedMethod"]] = {}

#: ``record(k, seconds, objective, weights=..., accuracy=...)``: what ``LiftedMethod.run`` calls
#: after each iteration; True stops the run
Record = Callable[..., object]


def register(cls: type["LiftedMethod"]) -> type["LiftedMethod"]:
    """Class decorator: add a :class:`LiftedMethod` to ``METHODS`` under ``cls.name``."""
    METHODS[cls.name] = cls
    return cls


# --- closed forms -------------------------------------------------------------------------------
def ridge(T: Array, A: Array, reg: float = 0.0, W0: Array | None = None) -> Array:
    """``argmin_W ||T - W A||^2 + reg ||W - W0||^2`` (``W0 = 0`` if None); ``reg = 0``: ``T A^+``.

    The Gram matrix ``A A^T`` is formed and solved in float64 (MNIST's Gram is rank deficient: a
    pseudo-inverse with a relative cut-off of 100 machine epsilons of the data's dtype).

    >>> A, W = np.array([[1.0, 2.0, 3.0], [0.0, 1.0, 1.0]]), np.array([[2.0, -1.0]])
    >>> np.round(ridge(W @ A, A), 6)  # an exact fit is found again
    array([[ 2., -1.]])
    >>> np.round(ridge(W @ A, A, reg=1e6, W0=np.array([[0.5, 0.5]])), 4)  # pulled to W0
    array([[0.5, 0.5]])
    """
    xp = array_namespace(T, A)
    G = xp.astype(A @ A.T, xp.float64)
    R = xp.astype(T @ A.T, xp.float64)
    if reg > 0:
        if W0 is not None:
            R = R + reg * xp.astype(W0, xp.float64)
        eye = xp.eye(G.shape[0], dtype=xp.float64, device=device(G))
        W = xp.linalg.solve(G + reg * eye, R.T).T
    else:
        W = R @ xp.linalg.pinv(G, rtol=100 * float(np.finfo(check_dtype(A.dtype)).eps))
    return xp.astype(W, A.dtype)


def relu_prox(v: Array, m: Array, c: float) -> Array:
    """Entrywise ``argmin_u (v - max(u, 0))^2 + c (u - m)^2`` for ``c > 0`` (exact: best piece).

    >>> relu_prox(np.array([1.0, 0.0]), np.array([0.5, -1.0]), 1.0)  # pieces u >= 0, u <= 0
    array([ 0.75, -1.  ])
    """
    xp = array_namespace(v, m)
    u_pos = xp.clip((v + c * m) / (1 + c), min=0.0)  # the piece u >= 0
    u_neg = xp.clip(m, max=0.0)  # the piece u <= 0
    f = lambda u: (v - xp.clip(u, min=0.0)) ** 2 + c * (u - m) ** 2  # noqa: E731
    return xp.where(f(u_pos) <= f(u_neg), u_pos, u_neg)


def sqnorm(A: Array) -> float:
    xp = array_namespace(A)
    return float(xp.sum(A * A))


# --- the method interface ---------------------------------------------------------------------
class LiftedMethod:
    """One training method: hyperparameters in, iterations out.

    Subclasses set ``name``, ``defaults`` (hyperparameter -> default), ``constraints``
    (hyperparameter -> what it must be: a constraint of ``validation.py``) and ``losses`` (the
    losses the method defines), and implement ``start(net, X, Y)``, ``step()``, ``weights()`` (the
    network's ``[W_l]``, bias last column) and ``objective()``; or override :meth:`run` entirely.
    """

    name: str = ""
    defaults: dict[str, Any] = {}
    constraints: dict[str, Any] = {}
    losses: tuple[str, ...] = ("mse",)

    def __init__(self, loss: str = "mse", **hyper: Any) -> None:
        if loss not in self.losses:
            raise ValueError(
                f"loss must be one of {', '.join(map(repr, self.losses))} for "
                f"{self.name}, got {loss!r}"
            )
        unknown = set(hyper) - set(self.defaults)
        if unknown:
            raise ValueError(
                f"{self.name} takes the hyperparameters {sorted(self.defaults)}, got "
                f"unknown {sorted(unknown)}"
            )
        self.loss = loss
        self.hyper = {**self.defaults, **hyper}
        validate(self.constraints, self.hyper)  # checked; kept as given
        for k, v in self.hyper.items():
            setattr(self, k, v)

    def run(
        self,
        net: LiftedNetwork,
        X: Array,
        Y: Array,
        iterations: int,
        record: Record,
        test: tuple[Array, Array] | None = None,
    ) -> None:
        """Train ``net`` for ``iterations`` steps; ``record(k, seconds, objective, weights=...)``
        after each (its time is not counted); stop early when it returns True. ``test`` =
        ``(X_test, Y_test)`` for methods that score the test set themselves."""
        self.start(net, X, Y)
        for k in range(1, iterations + 1):
            t = time.perf_counter()
            self.step()
            dt = time.perf_counter() - t
            if record(k, dt, self.objective(), weights=self.weights()) is True:
                return

    # what a subclass that keeps ``run`` implements
    def start(self, net: LiftedNetwork, X: Array, Y: Array) -> None:
        """Set up the method's variables from ``net``'s weights and the data."""
        raise NotImplementedError(f"{type(self).__name__} has no start")

    def step(self) -> None:
        """One iteration of the method."""
        raise NotImplementedError(f"{type(self).__name__} has no step")

    def objective(self) -> float | None:
        """The method's own objective at its current variables (None where it has none)."""
        raise NotImplementedError(f"{type(self).__name__} has no objective")

    def weights(self) -> list[Array]:
        """The network's ``[W_l]`` (bias last column) that the current variables define."""
        raise NotImplementedError(f"{type(self).__name__} has no weights")


# --- the history ------------------------------------------------------------------------------
@dataclass
class LiftedRun:
    """The curves of one run: ``config`` and one record per iteration (epoch for SGD).

    A record holds ``iteration``, ``seconds`` (cumulative training time, evaluation excluded),
    ``step_seconds``, ``objective`` (the method's own; None where it has none) and
    ``test_accuracy`` (the feed-forward network's). ``initial_test_accuracy`` is that of the
    common starting point.

    >>> run = LiftedRun("lau", {"seed": 0}, 0.25)
    >>> run.records += [dict(iteration=k, step_seconds=0.5, objective=None) for k in (1, 2)]
    >>> run.series("objective"), run.seconds_per_iteration
    (array([nan, nan]), 0.5)
    >>> LiftedRun.from_dict(run.to_dict()).records == run.records
    True
    """

    method: str
    config: dict
    initial_test_accuracy: float | None = None
    records: list[dict[str, Any]] = field(default_factory=list)
    net: LiftedNetwork | None = None

    def series(self, key: str) -> np.ndarray:
        return np.array([np.nan if r[key] is None else r[key] for r in self.records], dtype=float)

    @property
    def final_test_accuracy(self) -> float | None:
        return self.records[-1]["test_accuracy"] if self.records else self.initial_test_accuracy

    @property
    def seconds_per_iteration(self) -> float | None:
        return float(np.mean(self.series("step_seconds"))) if self.records else None

    def to_dict(self) -> dict[str, Any]:
        return _plain(
            dict(
                format="fenchel_cvx.LiftedRun/1",
                method=self.method,
                config=self.config,
                initial_test_accuracy=self.initial_test_accuracy,
                records=self.records,
            )
        )

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "LiftedRun":
        return cls(d["method"], d["config"], d["initial_test_accuracy"], d["records"])


def _accuracy(net, X, Y):
    xp = array_namespace(X)
    Yhat = net.forward(X)[1]
    return float(xp.mean(xp.astype(xp.argmax(Yhat, axis=0) == xp.argmax(Y, axis=0), xp.float64)))


def fit_lifted(
    method: str,
    X: Array,
    Y: Array,
    X_test: Array,
    Y_test: Array,
    *,
    hidden: Sequence[int] = (300,),
    iterations: int = 10,
    seed: int = 0,
    callback: Callable[[LiftedRun], object] | None = None,
    **hyper: Any,
) -> LiftedRun:
    """Train the 784-``hidden``-10 ReLU network with ``method``; return a :class:`LiftedRun`.

    ``method``: a name of ``METHODS`` (``taylor``, ``lau``, ``askari``, ``fln``, ``sgd``).
    ``hyper``: the method's hyperparameters (see its class's ``defaults``); ``loss`` other than
    ``"mse"`` is refused by the peers, which define MSE only. ``callback(run)`` after each record.
    All arguments are checked before any work.

    A 5-4-3 network on 40 points, three iterations of Lau et al.'s method:

    >>> rng = np.random.default_rng(0)
    >>> X, Y = rng.random((5, 40)), np.eye(3)[:, rng.integers(0, 3, 40)]
    >>> run = fit_lifted("lau", X, Y, X, Y, hidden=(4,), iterations=3, seed=0)
    >>> run.config["layer_sizes"], [r["iteration"] for r in run.records]
    ((5, 4, 3), [1, 2, 3])
    >>> run.series("objective").round(2)
    array([13.77,  7.91,  4.42])
    >>> fit_lifted("lau", X, Y, X, Y, beta=1.0)
    Traceback (most recent call last):
    ...
    ValueError: lau takes the hyperparameters ['alpha', 'gamma', 'rho'], got unknown ['beta']
    """
    if method not in METHODS:
        raise ValueError(f"method must be one of {sorted(METHODS)}, got {method!r}")
    algo = METHODS[method](**hyper)
    args = validate(
        dict(iterations=ROUNDS, seed=SEED, hidden=Sizes(1), callback=[CALLABLE, None]),
        dict(iterations=iterations, seed=seed, hidden=hidden, callback=callback),
    )
    iterations, seed = args["iterations"], args["seed"]
    X = check_matrix("X", X)
    Y = check_matrix("Y", Y, cols=X.shape[1])
    X_test = check_matrix("X_test", X_test, rows=X.shape[0], rows_what="the rows of X")
    Y_test = check_matrix(
        "Y_test", Y_test, rows=Y.shape[0], cols=X_test.shape[1], rows_what="the rows of Y"
    )
    xp = array_namespace(X)
    sizes = (X.shape[0], *args["hidden"], Y.shape[0])
    net = LiftedNetwork(sizes, "relu", algo.loss, seed=seed, dtype=check_dtype(X.dtype))
    net.W = [xp.asarray(W, device=device(X)) for W in net.W]
    run = LiftedRun(
        method,
        dict(
            hyper=algo.hyper,
            loss=algo.loss,
            layer_sizes=sizes,
            seed=seed,
            iterations=iterations,
            m=X.shape[1],
            m_test=X_test.shape[1],
        ),
        _accuracy(net, X_test, Y_test),
        net=net,
    )
    total = [0.0]

    def record(k, seconds, objective, weights=None, accuracy=None):
        total[0] += seconds
        if weights is not None:
            net.W = list(weights)
        acc = _accuracy(net, X_test, Y_test) if accuracy is None else accuracy
        run.records.append(
            _plain(
                dict(
                    iteration=k,
                    seconds=total[0],
                    step_seconds=seconds,
                    objective=objective,
                    test_accuracy=acc,
                )
            )
        )
        if callback is not None:
            return callback(run)

    algo.run(net, X, Y, iterations, record, (X_test, Y_test))
    return run
