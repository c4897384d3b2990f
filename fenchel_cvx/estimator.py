"""scikit-learn estimators: ``FenchelClassifier`` and ``FenchelRegressor``.

A Fenchel lifted network (the paper's eq. (7)) trained by block coordinate descent
(``bcd.fit_bcd``: Algorithm 1 on all the data, or Algorithm 2 on mini-batches), wrapped in
scikit-learn's contract:

- rows are samples: ``X`` is ``(n_samples, n_features)``. The package's mathematics has data
  points as *columns*; the estimators transpose at this boundary and nowhere else;
- ``__init__`` only stores its arguments; ``fit`` validates them and the data and returns
  ``self``; learned attributes end with ``_`` (``coefs_``, ``network_``, ``history_``,
  ``n_iter_``, ``classes_``, ``n_features_in_``);
- randomness (the Xavier initialisation and the order of the mini-batches) comes from
  ``random_state``.

**Hyperparameter scales.** The loss and the divergences of the lifted objective are *sums over
the data points* (as in the paper), not means; ``lam``, ``rho`` and ``gamma`` are weights on those
sums. In Algorithm 2 every round sees one mini-batch, so the loss and the B-terms are summed over
``batch_size`` points while ``rho ||W||^2`` and ``gamma ||W - W0||^2`` are not: a larger batch
weighs the data more against the penalty and the proximal term.

**Feature scale.** The defaults (the package's training settings, ``defaults.training``, tuned
on MNIST pixels in [0, 1]) suit features of order one, such as pixels / 16 or the output of
``StandardScaler``; as for any neural network,
put the estimator after a scaler in a ``Pipeline`` when the raw features are large (on the raw
0..16 digits pixels the defaults train slower and less accurately than on pixels / 16).

``predict`` uses the feed-forward network ``W_L X~_L^ff`` (the lifted variables are a training
device); the classifier's ``predict_proba`` is the softmax of those logits.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from typing import Any, TypeAlias

import numpy as np
from scipy.special import log_softmax
from sklearn.base import BaseEstimator, ClassifierMixin, RegressorMixin, is_classifier
from sklearn.metrics import r2_score
from sklearn.model_selection import train_test_split
from sklearn.utils import check_random_state
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import check_is_fitted, validate_data

from . import defaults
from .activations import Activation, activation_names
from .arrays import Array
from .backends import check_backend, get_backend
from .bcd import fit_bcd
from .history import History
from .losses import LOSSES, loss_names, softmax
from .network import LiftedNetwork
from .validation import (
    BOOL,
    COUNT,
    FRACTION,
    GAMMA,
    LAM,
    MOMENTUM,
    RHO,
    ROUNDS,
    TOL,
    InstanceOf,
    Interval,
    Options,
    PerLayer,
    Sizes,
    check,
    check_dtype,
    check_plain,
    check_real,
    check_scale,
    validate,
)

LayerValues: TypeAlias = "float | Sequence[float] | None"  # a number, one per layer, or the default
Steps: TypeAlias = "int | Sequence[int] | str | None"  # a cap, one per block, "tol" or default

#: activations an estimator accepts by name (``monotone`` needs a function: pass an Activation)
ESTIMATOR_ACTIVATIONS = tuple(activation_names())


# --- parameter checks (validation.py) ---------------------------------------------------------
def _constraints(n_hidden, losses):
    """The constraints of the hyperparameters, for ``n_hidden`` hidden layers."""
    L = n_hidden
    return dict(
        activation=[Options(ESTIMATOR_ACTIVATIONS), InstanceOf(Activation, "an Activation")],
        loss=Options(losses),
        lam=[None, PerLayer(LAM, max(L, 1))],
        rho=[None, PerLayer(RHO, L + 1)],
        gamma=[None, PerLayer(GAMMA, L + 1)],
        momentum=[None, PerLayer(MOMENTUM, L + 1)],
        threads=[None, COUNT],
        compile=[Options(("auto",)), BOOL],
        w_steps=[None, Options(("tol",)), PerLayer(COUNT, L + 1)],
        x_steps=[None, Options(("tol",))] + ([PerLayer(COUNT, L)] if L else []),
        batch_size=[None, Options(("auto",)), COUNT],
        epochs=ROUNDS,
        alternations=ROUNDS,
        iterations=ROUNDS,
        tol=TOL,
        check_every=COUNT,
        strict=[BOOL, None],
        verbose=[BOOL, Interval(numbers.Integral, 0, None)],
        warm_start=BOOL,
        early_stopping=BOOL,
        validation_fraction=FRACTION,
        n_iter_no_change=COUNT,
        random_state=[
            Interval(numbers.Integral, 0, 2**32 - 1),
            InstanceOf(np.random.RandomState, "a numpy RandomState"),
            None,
        ],
    )


def _real(name, A):
    """Refuse complex entries by name (scikit-learn refuses them naming neither X nor y)."""
    A = A if hasattr(A, "dtype") else np.asarray(A)
    if np.iscomplexobj(A):
        check_real(name, A)


class _EpochMonitor:
    """``fit_bcd``'s callback at the end of every epoch (``rounds`` rounds), as in scikit-learn's
    ``MLPClassifier``: ``n_iter_`` (epochs), ``loss_curve_`` (the training loss per data point,
    feed-forward, no penalty), ``validation_scores_`` and early stopping after
    ``n_iter_no_change`` epochs without an improvement of more than ``IMPROVEMENT`` (then the
    best weights are restored), and with ``verbose`` a line per epoch."""

    IMPROVEMENT = 1e-4  # MLPClassifier's default tol (our ``tol`` is the block solvers')

    def __init__(self, est, rounds, X_val, Y_val):
        self.est, self.rounds, self.X_val, self.Y_val = est, rounds, X_val, Y_val
        self.seen, self.stale, self.best_W, self.best_epoch = 0, 0, None, 0

    def __call__(self, net, record):
        self.seen += 1
        if self.seen % self.rounds:
            return None
        est = self.est
        est.n_iter_ += 1
        est.loss_curve_.append(record["train_loss"])
        line = f"Iteration {est.n_iter_}, loss = {record['train_loss']:.8f}"
        stop = False
        if self.X_val is not None:
            score = est._validation_score(net, self.X_val, self.Y_val)
            est.validation_scores_.append(score)
            line += f", validation score = {score:.6f}"
            best = est.best_validation_score_
            if best is None or score > best + self.IMPROVEMENT:
                est.best_validation_score_, self.stale = score, 0
                self.best_W, self.best_epoch = [W.copy() for W in net.W], est.n_iter_
            else:
                self.stale += 1
                stop = self.stale >= est.n_iter_no_change
        if est.verbose:
            print(line)
        if stop and est.verbose:
            print(
                f"Validation score did not improve more than tol={self.IMPROVEMENT} for "
                f"{est.n_iter_no_change} consecutive epochs. Stopping."
            )
        return stop

    def finish(self):
        """The end of a run: early stopping keeps the best epoch's weights. Returns whether that
        rewound the network to an earlier epoch than its last."""
        est = self.est
        if self.best_W is not None:
            est.network_.W = self.best_W
        est.best_loss_ = None if est.early_stopping or not est.loss_curve_ else min(est.loss_curve_)
        return self.best_W is not None and self.best_epoch != est.n_iter_


class _FenchelBase(BaseEstimator):
    """Shared machinery of the two estimators (not part of the public API)."""

    _losses = tuple(LOSSES)

    # the learned attributes (set by ``fit`` and ``partial_fit``; the estimators' docstrings)
    network_: LiftedNetwork
    coefs_: list[np.ndarray]
    history_: History | None
    n_iter_: int
    loss_curve_: list[float]
    validation_scores_: list[float] | None
    best_validation_score_: float | None
    best_loss_: float | None

    # --- validation -----------------------------------------------------------------------
    def _checked_params(self, partial=False):
        """Validate every hyperparameter (``_constraints``); return them normalised in a dict,
        those left None filled in from the training setting (``defaults.training``: a dense
        network's for mini-batches and ``partial_fit``, Algorithm 1's for ``batch_size=None``;
        the steps only for the fast backend by name)."""
        sizes = self.hidden_layer_sizes
        sizes = check("hidden_layer_sizes", (sizes,) if COUNT.applies(sizes) else sizes, Sizes(0))
        constraints = _constraints(len(sizes), self._losses)
        values = {k: getattr(self, k) for k in constraints}
        check_backend(self.backend)
        by_name = isinstance(self.backend, str) and self.backend == "fast"
        for name, what in (
            ("w_steps", "steps"),
            ("x_steps", "steps"),
            ("threads", "threads"),
            ("compile", "kernels"),
        ):
            if values[name] not in (None, False, "auto") and not by_name:
                raise ValueError(
                    f"{name}={values[name]!r} sets the {what} of the fast backend by "
                    f"name: it needs backend='fast' (a backend object keeps its "
                    f"own), got backend={self.backend!r}"
                )
        if by_name and values["compile"] is True:  # refused before any work, with what to install
            from .fast.fused import require_compiler

            require_compiler()
        # strict: every block must pass the certificate, so no step caps unless given
        strict = isinstance(self.strict, (bool, np.bool_)) and bool(self.strict)
        steps = ("w_steps", "x_steps") if by_name and not strict else ()
        defaults.training(
            "dense", len(sizes), batched=partial or values["batch_size"] is not None
        ).fill(values, ("lam", "rho", "gamma", "momentum") + steps)
        p = validate(constraints, values)
        to_tol = {k: None if p[k] == "tol" else p[k] for k in ("w_steps", "x_steps")}
        return dict(
            p,
            **to_tol,
            sizes=sizes,
            lam=p["lam"][: len(sizes)] or 1.0,
            dtype=check_dtype(self.dtype),
        )

    def _make_backend(self, params):
        if not isinstance(self.backend, str):
            return self.backend
        if self.backend == "fast":
            threads = {} if params["threads"] is None else dict(threads=params["threads"])
            return get_backend(
                "fast",
                tol=self.tol,
                dtype=params["dtype"].name,
                w_steps=params["w_steps"],
                x_steps=params["x_steps"],
                compile=params["compile"],
                **threads,
            )
        return get_backend(self.backend, tol=self.tol)

    def _seed(self):
        return int(check_random_state(self.random_state).randint(np.iinfo(np.int32).max))

    # --- training ---------------------------------------------------------------------------
    def _new_network(self, params, n_in, n_out):
        return LiftedNetwork(
            (n_in, *params["sizes"], n_out),
            activation=self.activation,
            loss=self.loss,
            lam=params["lam"],
            rho=params["rho"],
            seed=self._seed(),
            dtype=params["dtype"],
        )

    def _train(self, params, X, Y, partial):
        """Run the BCD driver on rows-are-samples ``X`` and ``Y``; set the learned attributes."""
        X_val = Y_val = None
        if self.early_stopping and not partial:
            stratify = Y.argmax(axis=1) if is_classifier(self) else None
            X, X_val, Y, Y_val = train_test_split(
                X,
                Y,
                test_size=self.validation_fraction,
                random_state=self._seed(),
                stratify=stratify,
            )
        X0, Yc = X.T, Y.T  # the boundary: columns are data points from here on
        m = X0.shape[1]
        if partial:
            kwargs = dict(batch_size=m, epochs=1, alternations=params["alternations"])
        elif params["batch_size"] is None:
            kwargs = dict(iterations=params["iterations"])
        else:
            bs = min(200, m) if params["batch_size"] == "auto" else min(params["batch_size"], m)
            kwargs = dict(
                batch_size=bs, epochs=params["epochs"], alternations=params["alternations"]
            )
        rounds = (
            1 if "iterations" in kwargs else -(-m // kwargs["batch_size"]) * kwargs["alternations"]
        )
        monitor = _EpochMonitor(self, rounds, X_val, Y_val)
        # momentum's last change (None while fit_bcd runs: Ctrl-C or an error leaves none stale)
        W_prev, self._W_prev = getattr(self, "_W_prev", None), None
        try:
            result = fit_bcd(
                self.network_,
                X0,
                Yc,
                gamma=params["gamma"],
                momentum=params["momentum"],
                W_prev=W_prev,
                backend=self._make_backend(params),
                strict=self.strict,
                progress=int(self.verbose) >= 2,
                callback=monitor,
                eval_every=rounds,
                check_every=params["check_every"],
                **kwargs,
            )
        finally:
            self.coefs_ = self.network_.W  # after Ctrl-C too: the last finished round's
        history = getattr(self, "history_", None)
        if history is not None:  # partial_fit or warm_start
            offset = len(history)
            for rec in result.history:
                rec["iteration"] += offset
                history.append(rec)
        else:
            self.history_ = result.history
        rewound = monitor.finish()
        self.coefs_ = self.network_.W
        # momentum goes on in the next partial_fit / warm start, unless early stopping rewound
        # the network to an earlier epoch (then there is no last change to go on along)
        self._W_prev = None if rewound else result.W_prev
        return self

    def _fit(self, X, Y, reset, partial):
        """Validate the hyperparameters, (re)build the network if ``reset``, train.

        ``partial``: one Algorithm-2 update on the batch ``(X, Y)`` (``partial_fit``), else a
        whole training run (``fit``).
        """
        params = self._checked_params(partial)
        if reset:
            self.network_ = self._new_network(params, X.shape[1], Y.shape[1])
            self.history_ = None
            self.n_iter_, self.loss_curve_ = 0, []
            self.validation_scores_ = [] if self.early_stopping else None
            self.best_validation_score_ = None
            self._W_prev = None
        else:  # a warm start or a later partial_fit: the same network, this call's objective
            fitted = tuple(self.network_.layer_sizes[1:-1])
            if fitted != tuple(params["sizes"]):
                raise ValueError(
                    f"hidden_layer_sizes={tuple(params['sizes'])} differs from the "
                    f"fitted network's {fitted}: warm_start and partial_fit go on "
                    f"with the same network (warm_start=False fits a new one)"
                )
            if params["sizes"]:
                self.network_.lam = list(params["lam"])
            self.network_.rho = list(params["rho"])
        return self._train(params, X, Y, partial=partial)

    def _reset(self):
        """``fit`` starts afresh unless ``warm_start`` and fitted (then it continues)."""
        return not (self.warm_start and hasattr(self, "network_"))

    def _data(self, X, y="no_validation", *, reset, dtype=None, **kwargs):
        """scikit-learn's ``validate_data``, with the package's own checks (``validation.py``)
        around it: complex entries and a scale that overflows the working dtype are refused by
        the name of ``X`` or ``y``."""
        _real("X", check_plain("X", X))  # no mask dropped, no numeric string parsed
        if y is not None and not isinstance(y, str):
            _real("y", y)
            if isinstance(y, np.ma.MaskedArray):  # (labels may be strings: y's objects pass)
                check_plain("y", y)
        dtype = check_dtype(self.dtype) if dtype is None else dtype
        if isinstance(y, str) and y == "no_validation":
            return check_scale("X", validate_data(self, X, reset=reset, dtype=dtype, **kwargs))
        X, y = validate_data(self, X, y, reset=reset, dtype=dtype, **kwargs)
        return check_scale("X", X), y

    def _forward(self, X):
        """The feed-forward output, rows are samples: ``(n_samples, n_outputs)``."""
        check_is_fitted(self, "network_")
        X = self._data(X, reset=False, dtype=self.network_.W[0].dtype)
        return np.asarray(self.network_.forward(X.T)[1]).T

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.sparse = False
        tags.input_tags.allow_nan = False
        return tags


class FenchelClassifier(ClassifierMixin, _FenchelBase):
    """A Fenchel lifted network classifier, trained by block coordinate descent.

    The network is ``n_features -> hidden_layer_sizes -> n_classes``: ``activation`` between the
    layers, the loss on the output logits. Training minimises the lifted objective

        F(W, X) = L(Y, W_L X~_L) + sum_l rho_l ||W_l||_F^2 + sum_{l<L} lam_l B_l(X_{l+1}, W_l X~_l)

    one convex block at a time (``bcd.fit_bcd``), ``Y`` the one-hot labels.

    Every hyperparameter left None takes the training setting (``defaults.training``): with
    mini-batches and in ``partial_fit`` the MNIST MLP benchmark's tuned setting (lam 0.2, rho 0,
    gamma 1 for the hidden layers and 30 for the output layer, momentum (0.7, 0), 10 W-steps
    for the hidden layers and one for the output layer, 20 X-steps); with ``batch_size=None``
    (Algorithm 1) lam 10, rho 1, no proximal term, no momentum, every block solved to ``tol``.
    Each call trains with its own: a warm-start ``fit`` or a ``partial_fit`` after another
    algorithm's run sets the network's lam and rho to the call's. ``FenchelRegressor`` takes the
    same setting, which was tuned for classification.

    Parameters
    ----------
    hidden_layer_sizes : tuple of int, default (100,)
        Widths of the hidden layers (an empty tuple gives multinomial logistic regression).
    activation : {"relu", "leaky_relu", "sigmoid", "tanh"} or Activation, default "relu"
        The activation of every hidden layer (Theorem 1 gives its divergence B).
    loss : {"cross_entropy", "mse"}, default "cross_entropy"
        The output loss, a **sum** over the data points (softmax cross-entropy on the logits, or
        the squared error against the one-hot labels).
    lam : float > 0 or sequence of one per hidden layer, default None (0.2; Algorithm 1: 10)
        lambda_l, the weight of the divergence B_l of layer l (a sum over data points and units).
    rho : float >= 0 or sequence of L + 1, default None (0; Algorithm 1: 1)
        The Frobenius penalty rho_l ||W_l||^2 of every weight matrix (not scaled by the number of
        data points: compare it with sums over the data or the batch).
    gamma : float >= 0 or sequence of L + 1, default None (1 per hidden layer, 30 for the output)
        The proximal weight gamma_l ||W_l - W0_l||^2 of Algorithm 2 (W0: the weights before the
        current batch); it keeps what earlier batches taught. Used by mini-batch training and
        ``partial_fit``; 0 turns it off (then keep ``rho > 0``: with neither term a W-block
        on a batch need not be strictly convex, and for cross-entropy often has no minimiser).
    momentum : float in [0, 1) or sequence of L + 1, default None (0.7 per hidden layer, 0 for
        the output; Algorithm 1: 0)
        beta_l: each mini-batch (Algorithm 1: each iteration) starts from ``W + beta_l (W -
        W_prev)``, the weights moved on along their last change (``bcd.fit_bcd``); 0 is the
        paper's algorithms. It goes on across ``partial_fit`` calls and into a ``warm_start``
        fit as within one ``fit`` (the last change is kept with the fitted network; not where
        ``early_stopping`` rewound the network to an earlier epoch).
    w_steps, x_steps : int, sequence (L + 1 W-blocks; one per hidden layer's X-block), "tol"
        or None, default None (10 per hidden layer's W-block, 1 for the output layer's, 20 per
        X-block; Algorithm 1 and ``strict=True``: every block solved to ``tol``)
        Warm-started steps per W-block and FISTA steps per X-block in each round, on the fast
        backend by name (``FastBackend(w_steps=..., x_steps=...)``); a block stops earlier where
        it reaches ``tol``. ``"tol"``: no cap, every block solved to ``tol``. A capped block is
        inexact by design: ``history_.held_but_capped`` says whether the rest of the
        certificate held.
    batch_size : int, "auto" or None, default "auto"
        Mini-batch size of Algorithm 2 (``"auto"``: ``min(200, n_samples)``); ``None`` trains on
        all the data at once (Algorithm 1, ``iterations`` rounds).
    epochs : int, default 10
        Passes over the mini-batches (Algorithm 2).
    alternations : int, default 1
        Rounds (X-sweep then W-sweep) per mini-batch: the paper's K (Algorithm 2).
    iterations : int, default 10
        Rounds on all the data (Algorithm 1, ``batch_size=None``).
    backend : {"fast", "cvxpy"} or a backend object, default "fast"
        Block solver: the array backend (``fast.FastBackend``) or the CVXPY correctness oracle
        (``oracle.OracleBackend``; slow, for small data). A backend object is used as given.
    tol : float > 0, default 1e-3
        The scaled KKT residual (``blocks.kkt_residual``) a block solve stops at (the fast
        backend, unless its step cap comes first: ``w_steps``, ``x_steps``) or must reach (the
        oracle). Not used with a backend object.
    dtype : {"float64", "float32"}, default "float64"
        Floating type of the weights and the data.
    check_every : int, default 1
        Run the whole certificate every that many rounds and on the last round of each
        ``fit`` / ``partial_fit`` call (``fit_bcd``'s ``check_every``; 1: every round, its
        objectives and divergences about 40 % of a capped fast round's time); the rounds
        between check that every argmin is usable and every status optimal. A run that early
        stopping ends is certified on its last round only where that is a multiple of it.
    strict : bool or None, default None
        Raise on a certificate violation (None: the backend's default; see ``bcd.fit_bcd``).
        ``True`` also solves every block to ``tol`` where ``w_steps`` and ``x_steps`` are left
        None: a capped block fails the certificate's block optimality by design.
    threads : int or None, default None
        Cores of the fast backend by name (``FastBackend(threads=...)``, through threadpoolctl
        around the run and every block solve: NumPy's BLAS gets them, SciPy's one;
        ``fenchel_cvx.threads.plan``). None: the backend's default, one core (a backend with
        the pools left as they are: ``backend=FastBackend(threads=None)``). A backend object
        keeps its own.
    compile : "auto" or bool, default "auto"
        The fast backend by name with its elementwise chains compiled into fused kernels by
        ``torch.compile`` (``FastBackend(compile=...)``): "auto" where PyTorch and a C++
        compiler are present and the arrays are large enough to gain, True always (refused
        before any work without them), False never. The same solves up to rounding; the
        first batch that compiles pays the compile (seconds, cached on disk for later runs).
    verbose : bool or int, default False
        Print ``Iteration n, loss = ...`` after every epoch, as ``MLPClassifier`` does; 2 or
        more also shows a progress bar over the rounds.
    random_state : int, RandomState or None, default None
        Seeds the initialisation, the order of the mini-batches and the validation split.
    warm_start : bool, default False
        ``fit`` continues from the current network (and its ``history_``, ``n_iter_`` and
        ``loss_curve_``) instead of starting afresh.
    early_stopping : bool, default False
        Hold out ``validation_fraction`` of the training data (stratified), score it after every
        epoch, stop after ``n_iter_no_change`` epochs without an improvement of more than 1e-4,
        and keep the weights of the best epoch. Without it every epoch runs.
    validation_fraction : float in (0, 1), default 0.1
        The held-out share for ``early_stopping``.
    n_iter_no_change : int, default 10
        Epochs without improvement before ``early_stopping`` stops.

    Attributes
    ----------
    classes_ : ndarray of shape (n_classes,)
    coefs_ : list of ndarray
        ``W_l`` of shape ``(p_{l+1}, p_l + 1)``; the last column is the bias.
    network_ : LiftedNetwork
        The trained network (columns-are-data-points convention).
    history_ : History
        One record per BCD round: the certificate, and the objectives on its checked rounds
        (``check_every``); the training loss and accuracy after every epoch (the records
        between hold None). Its ``config`` is the first run's: a warm start or a
        ``partial_fit`` appends records.
    n_iter_ : int
        Number of epochs run (passes over the training data; Algorithm 1: iterations; one per
        ``partial_fit`` call). ``len(history_)`` counts the rounds.
    loss_curve_ : list of float
        The training loss per data point (feed-forward, without the penalty) after each epoch.
    best_loss_ : float or None
        The smallest entry of ``loss_curve_`` (None with ``early_stopping``).
    validation_scores_ : list of float or None
        Accuracy (regressor: R^2) on the held-out data after each epoch (``early_stopping``).
    best_validation_score_ : float or None
        The best of ``validation_scores_``; its weights are kept.
    n_features_in_ : int

    Examples
    --------
    Two Gaussian blobs in the plane, trained on all the data at once (Algorithm 1) and by
    mini-batches (Algorithm 2):

    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> X = np.vstack([rng.normal(-1, 0.5, (20, 2)), rng.normal(1, 0.5, (20, 2))])
    >>> y = np.repeat(["a", "b"], 20)
    >>> clf = FenchelClassifier(hidden_layer_sizes=(8,), batch_size=None, iterations=5,
    ...                         random_state=0).fit(X, y)
    >>> clf.classes_, [W.shape for W in clf.coefs_], clf.n_iter_, len(clf.history_)
    (array(['a', 'b'], dtype='<U1'), [(8, 3), (2, 9)], 5, 5)
    >>> float(clf.score(X, y)), clf.predict([[-1.0, -1.0], [1.0, 1.0]]).tolist()
    (1.0, ['a', 'b'])
    >>> print(clf.predict_proba([[-1.0, -1.0]]).round(2))
    [[0.87 0.13]]
    >>> clf = FenchelClassifier(hidden_layer_sizes=(8,), batch_size=10, epochs=3,
    ...                         random_state=0).fit(X, y)
    >>> float(clf.score(X, y)), clf.n_iter_, len(clf.history_)    # 3 epochs of 4 batches
    (1.0, 3, 12)
    """

    _losses = tuple(loss_names("classification"))
    classes_: np.ndarray  # set by fit (a fitted attribute: no class-level value)

    def __init__(
        self,
        hidden_layer_sizes: Sequence[int] = (100,),
        activation: str | Activation = "relu",
        loss: str = "cross_entropy",
        lam: LayerValues = None,
        rho: LayerValues = None,
        gamma: LayerValues = None,
        batch_size: int | str | None = "auto",
        epochs: int = 10,
        alternations: int = defaults.ALTERNATIONS,
        iterations: int = defaults.ITERATIONS,
        backend: Any = "fast",
        tol: float = 1e-3,
        dtype: str = "float64",
        strict: bool | None = None,
        verbose: bool | int = False,
        random_state: Any = None,
        warm_start: bool = False,
        early_stopping: bool = False,
        validation_fraction: float = 0.1,
        n_iter_no_change: int = 10,
        momentum: LayerValues = None,
        w_steps: Steps = None,
        x_steps: Steps = None,
        check_every: int = 1,
        threads: int | dict[str, int] | None = None,
        compile: bool | str = "auto",
    ) -> None:
        self.hidden_layer_sizes = hidden_layer_sizes
        self.activation = activation
        self.loss = loss
        self.lam = lam
        self.rho = rho
        self.gamma = gamma
        self.momentum = momentum
        self.w_steps = w_steps
        self.x_steps = x_steps
        self.check_every = check_every
        self.threads = threads
        self.compile = compile
        self.batch_size = batch_size
        self.epochs = epochs
        self.alternations = alternations
        self.iterations = iterations
        self.backend = backend
        self.tol = tol
        self.dtype = dtype
        self.strict = strict
        self.verbose = verbose
        self.random_state = random_state
        self.warm_start = warm_start
        self.early_stopping = early_stopping
        self.validation_fraction = validation_fraction
        self.n_iter_no_change = n_iter_no_change

    def _one_hot(self, y):
        idx = np.searchsorted(self.classes_, y)
        Y = np.zeros((y.shape[0], len(self.classes_)), dtype=check_dtype(self.dtype))
        Y[np.arange(y.shape[0]), idx] = 1
        return Y

    def fit(self, X: Array, y: Array) -> FenchelClassifier:
        """Train on ``X`` (n_samples, n_features) and labels ``y``; returns ``self``."""
        self._checked_params()
        X, y = self._data(X, y, reset=self._reset())
        check_classification_targets(y)
        classes, reset = np.unique(y), self._reset()
        if len(classes) < 2:
            raise ValueError(
                f"FenchelClassifier needs samples of at least 2 classes, got 1 class "
                f"({classes[0]!r})"
            )
        if not reset and not np.isin(classes, self.classes_).all():
            raise ValueError(
                f"warm_start can only continue on the classes of the first fit "
                f"({self.classes_!r}), got {classes!r}"
            )
        if reset:
            self.classes_ = classes
        return self._fit(X, self._one_hot(y), reset=reset, partial=False)

    def partial_fit(self, X: Array, y: Array, classes: Array | None = None) -> FenchelClassifier:
        """One update of the batched model (Algorithm 2) on the batch ``(X, y)``; returns ``self``.

        The batch is one mini-batch: X starts at its feed-forward point and ``alternations``
        rounds run with the proximal term ``gamma ||W - W0||^2``, W0 the weights before the call
        (the paper's online setting). ``classes`` (all the labels that will ever occur) is
        required on the first call.
        """
        first = not hasattr(self, "network_")
        self._checked_params(partial=True)
        X, y = self._data(X, y, reset=first)
        check_classification_targets(y)
        if first:
            if classes is None:
                raise ValueError("classes must be passed on the first call to partial_fit")
            classes = np.unique(np.asarray(classes))
            if len(classes) < 2:
                raise ValueError(f"classes must hold at least 2 classes, got {classes!r}")
            self.classes_ = classes
        elif classes is not None and not np.array_equal(np.unique(classes), self.classes_):
            raise ValueError(
                f"classes must be the same as on the first call to partial_fit "
                f"({self.classes_!r}), got {classes!r}"
            )
        unknown = np.setdiff1d(y, self.classes_)
        if unknown.size:
            raise ValueError(
                f"y holds labels that are not in classes ({self.classes_!r}): {unknown!r}"
            )
        return self._fit(X, self._one_hot(y), reset=first, partial=True)

    def predict_proba(self, X: Array) -> np.ndarray:
        """Softmax of the feed-forward logits: ``(n_samples, n_classes)``, rows sum to 1."""
        return np.asarray(softmax(self._forward(X).T)).T

    def predict_log_proba(self, X: Array) -> np.ndarray:
        """Log of :meth:`predict_proba` (the log-softmax of the logits, computed stably)."""
        return log_softmax(self._forward(X), axis=1)

    def _validation_score(self, net, X_val, Y_val):
        """Accuracy on the held-out part (early stopping), as MLPClassifier scores it."""
        logits = np.asarray(net.forward(X_val.T)[1])
        return float(np.mean(logits.argmax(axis=0) == Y_val.argmax(axis=1)))

    def predict(self, X: Array) -> np.ndarray:
        """The class with the largest logit."""
        scores = self._forward(X)
        return self.classes_[np.argmax(scores, axis=1)]

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.classifier_tags.multi_class = True
        return tags


class FenchelRegressor(RegressorMixin, _FenchelBase):
    """A Fenchel lifted network regressor, trained by block coordinate descent.

    The network is ``n_features -> hidden_layer_sizes -> n_outputs`` with a linear output layer
    and the squared error ``||Y - Yhat||_F^2`` summed over the data points (no 1/2, no mean).
    Parameters and attributes are those of :class:`FenchelClassifier` (no ``classes_``; the
    loss is ``"mse"``), plus ``n_outputs_``. A 1-D ``y`` gives 1-D predictions.

    Examples
    --------
    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> X = rng.normal(size=(30, 3))
    >>> y = X @ np.array([1.0, -2.0, 0.5])
    >>> reg = FenchelRegressor(hidden_layer_sizes=(16,), batch_size=None, iterations=20,
    ...                        random_state=0).fit(X, y)
    >>> round(float(reg.score(X, y)), 2), reg.predict(X[:2]).shape, reg.n_outputs_
    (0.99, (2,), 1)
    """

    _losses = tuple(loss_names("regression"))

    def __init__(
        self,
        hidden_layer_sizes: Sequence[int] = (100,),
        activation: str | Activation = "relu",
        loss: str = "mse",
        lam: LayerValues = None,
        rho: LayerValues = None,
        gamma: LayerValues = None,
        batch_size: int | str | None = "auto",
        epochs: int = 10,
        alternations: int = defaults.ALTERNATIONS,
        iterations: int = defaults.ITERATIONS,
        backend: Any = "fast",
        tol: float = 1e-3,
        dtype: str = "float64",
        strict: bool | None = None,
        verbose: bool | int = False,
        random_state: Any = None,
        warm_start: bool = False,
        early_stopping: bool = False,
        validation_fraction: float = 0.1,
        n_iter_no_change: int = 10,
        momentum: LayerValues = None,
        w_steps: Steps = None,
        x_steps: Steps = None,
        check_every: int = 1,
        threads: int | dict[str, int] | None = None,
        compile: bool | str = "auto",
    ) -> None:
        self.hidden_layer_sizes = hidden_layer_sizes
        self.activation = activation
        self.loss = loss
        self.lam = lam
        self.rho = rho
        self.gamma = gamma
        self.momentum = momentum
        self.w_steps = w_steps
        self.x_steps = x_steps
        self.check_every = check_every
        self.threads = threads
        self.compile = compile
        self.batch_size = batch_size
        self.epochs = epochs
        self.alternations = alternations
        self.iterations = iterations
        self.backend = backend
        self.tol = tol
        self.dtype = dtype
        self.strict = strict
        self.verbose = verbose
        self.random_state = random_state
        self.warm_start = warm_start
        self.early_stopping = early_stopping
        self.validation_fraction = validation_fraction
        self.n_iter_no_change = n_iter_no_change

    def _targets(self, y, first):
        y = np.asarray(y)
        if first:
            self._y_1d = y.ndim == 1
        Y = y.reshape(-1, 1) if y.ndim == 1 else y
        if first:
            self.n_outputs_ = Y.shape[1]
        elif Y.shape[1] != self.n_outputs_:
            raise ValueError(
                f"y must have {self.n_outputs_} outputs as on the first call, got shape {y.shape}"
            )
        return Y

    def fit(self, X: Array, y: Array) -> FenchelRegressor:
        """Train on ``X`` (n_samples, n_features) and targets ``y``; returns ``self``."""
        self._checked_params()
        reset = self._reset()
        X, y = self._data(X, y, reset=reset, multi_output=True, y_numeric=True)
        Y = check_scale("y", self._targets(y, reset).astype(X.dtype))
        return self._fit(X, Y, reset=reset, partial=False)

    def _validation_score(self, net, X_val, Y_val):
        """R^2 on the held-out part (early stopping), as MLPRegressor scores it."""
        return float(r2_score(Y_val, np.asarray(net.forward(X_val.T)[1]).T))

    def partial_fit(self, X: Array, y: Array) -> FenchelRegressor:
        """One update of the batched model (Algorithm 2) on the batch ``(X, y)``; returns ``self``.

        See :meth:`FenchelClassifier.partial_fit` (no ``classes``).
        """
        first = not hasattr(self, "network_")
        self._checked_params(partial=True)
        X, y = self._data(X, y, reset=first, multi_output=True, y_numeric=True)
        Y = check_scale("y", self._targets(y, first).astype(X.dtype))
        return self._fit(X, Y, reset=first, partial=True)

    def predict(self, X: Array) -> np.ndarray:
        """The feed-forward output: ``(n_samples,)`` if fitted on 1-D y, else
        ``(n_samples, n_outputs)``."""
        out = self._forward(X)
        return out.ravel() if self._y_1d else out

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.target_tags.multi_output = True
        tags.target_tags.single_output = True
        return tags
