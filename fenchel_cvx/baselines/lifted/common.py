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
from dataclasses import dataclass, field

import numpy as np
from array_api_compat import array_namespace, device

from ...history import _plain
from ...network import LiftedNetwork
from ...validation import CALLABLE, ROUNDS, SEED, Sizes, check_dtype, check_matrix, validate

METHODS: dict[str, type] = {}


def register(cls):
    """Class decorator: add a :class:`LiftedMethod` to ``METHODS`` under ``cls.name``."""
    METHODS[cls.name] = cls
    return cls


# --- closed forms -------------------------------------------------------------------------------
def ridge(T, A, reg=0.0, W0=None):
    """``argmin_W ||T - W A||^2 + reg ||W - W0||^2`` (``W0 = 0`` if None); ``reg = 0``: ``T A^+``.

    The Gram matrix ``A A^T`` is formed and solved in float64 (MNIST's Gram is rank deficient: a
    pseudo-inverse with a relative cut-off of 100 machine epsilons of the data's dtype).
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


def relu_prox(v, m, c):
    """Entrywise ``argmin_u (v - max(u, 0))^2 + c (u - m)^2`` for ``c > 0`` (exact: best piece)."""
    xp = array_namespace(v, m)
    u_pos = xp.clip((v + c * m) / (1 + c), min=0.0)  # the piece u >= 0
    u_neg = xp.clip(m, max=0.0)  # the piece u <= 0
    f = lambda u: (v - xp.clip(u, min=0.0)) ** 2 + c * (u - m) ** 2  # noqa: E731
    return xp.where(f(u_pos) <= f(u_neg), u_pos, u_neg)


def sqnorm(A):
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
    defaults: dict = {}
    constraints: dict = {}
    losses: tuple[str, ...] = ("mse",)

    def __init__(self, loss="mse", **hyper):
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

    def run(self, net, X, Y, iterations, record, test=None):
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


# --- the history ------------------------------------------------------------------------------
@dataclass
class LiftedRun:
    """The curves of one run: ``config`` and one record per iteration (epoch for SGD).

    A record holds ``iteration``, ``seconds`` (cumulative training time, evaluation excluded),
    ``step_seconds``, ``objective`` (the method's own; None where it has none) and
    ``test_accuracy`` (the feed-forward network's). ``initial_test_accuracy`` is that of the
    common starting point.
    """

    method: str
    config: dict
    initial_test_accuracy: float | None = None
    records: list = field(default_factory=list)
    net: object = None

    def series(self, key):
        return np.array([np.nan if r[key] is None else r[key] for r in self.records], dtype=float)

    @property
    def final_test_accuracy(self):
        return self.records[-1]["test_accuracy"] if self.records else self.initial_test_accuracy

    @property
    def seconds_per_iteration(self):
        return float(np.mean(self.series("step_seconds"))) if self.records else None

    def to_dict(self):
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
    def from_dict(cls, d):
        return cls(d["method"], d["config"], d["initial_test_accuracy"], d["records"])


def _accuracy(net, X, Y):
    xp = array_namespace(X)
    Yhat = net.forward(X)[1]
    return float(xp.mean(xp.astype(xp.argmax(Yhat, axis=0) == xp.argmax(Y, axis=0), xp.float64)))


def fit_lifted(
    method, X, Y, X_test, Y_test, *, hidden=(300,), iterations=10, seed=0, callback=None, **hyper
):
    """Train the 784-``hidden``-10 ReLU network with ``method``; return a :class:`LiftedRun`.

    ``method``: a name of ``METHODS`` (``taylor``, ``lau``, ``askari``, ``fln``, ``sgd``).
    ``hyper``: the method's hyperparameters (see its class's ``defaults``); ``loss`` other than
    ``"mse"`` is refused by the peers, which define MSE only. ``callback(run)`` after each record.
    All arguments are checked before any work.
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
