"""Block coordinate descent on the lifted objective: the paper's Algorithms 1 and 2.

``fit_bcd(net, X0, Y)`` minimises the lifted objective (DESIGN.md, eq. (5) of the paper)

    F(W, X) = L(Y, W_L X~_L) + sum_l rho_l ||W_l||^2 + sum_{l<L} lam_l B_l(X_{l+1}, W_l X~_l)

one convex block at a time (``blocks.py``), each block solved by a *backend*: ``"cvxpy"`` (the
oracle: every block to certified optimality) or ``"fast"`` (array solvers), or any object with
``.solve(block, start) -> BlockResult``. The driver is the same for every backend.

A *round* is one X-sweep then one W-sweep:

- X-sweep: the blocks X_L, X_{L-1}, ..., X_1 (backwards), each ``min_Z`` with the rest fixed;
- W-sweep: the blocks W_L, W_{L-1}, ..., W_0 (given X they are independent of each other).

**Algorithm 1** (``batch_size=None``): X starts at the feed-forward point; ``iterations`` rounds
on all the data. **Algorithm 2** (integer ``batch_size``): ``epochs`` passes over the batches of
``datasets.batch_order(m, batch_size, epochs, seed=net.seed)`` (the schedule the backprop
baselines share); per batch ``W0 <- W``, X <- the feed-forward pass on the batch, then
``alternations`` (K) rounds on the batch with the proximal term ``gamma_l ||W_l - W0_l||^2`` in
each W-block. A ``batch_size >= m`` is allowed: every epoch is then one batch of all the data.
``iterations`` is used by Algorithm 1 only, ``epochs`` and ``alternations`` by Algorithm 2 only.
A ``gamma > 0`` in Algorithm 1 makes it proximal: W0 is the W at the start of each iteration.

**Restart rule.** Before each X-sweep on carried-over X (every round but the first of a run or a
batch) the driver compares F(W, X) with J(W) = F(W, X^ff): after the W-sweep the old X may be
worse than the feed-forward point of the new weights; then X restarts from the feed-forward
point (recorded as ``restarted``). Restarting lowers F, so the run stays a descent method, and
the exact X-sweep from the feed-forward point keeps the lower bound F(W, X) <= J(W) (check 3).

Every round runs the four checks of ``certificate.py`` (``check_every=k``: every k-th round and
the last; the rounds between check block optimality only); ``strict`` (default: True for the
``"cvxpy"`` oracle, False otherwise) raises ``CertificateError`` at the first violation. Block
optimality trusts no backend: the driver checks that every returned argmin has the block's
shape, is finite and lies in the block's domain, and recomputes its KKT residual
(``blocks.kkt_residual``, against ``tol``) from the point itself. A backend's ``SolverError``
propagates in strict mode; otherwise it is recorded as a ``block_optimality`` violation and the
block keeps its current value. In recorded mode (``strict=False``) an unusable argmin (NaN, inf,
outside the domain) is recorded against its own block, which keeps its value, and the run stops
after that round (its record has ``halted`` = the block's name) with its history kept; an
oracle built by name is then non-strict too, so inaccurate solves are recorded, not thrown away.

The driver works in the array library of ``X0`` (NumPy; CuPy on a GPU with ``backend="fast"``:
any array-API library, ``array_api_strict`` in the tests); the network's weights move there
(``net.W`` becomes arrays of that library) once every argument is validated. The oracle takes
NumPy only. It returns ``BCDResult(net, Xs, history)``: the trained
network (the same object, updated in place), the final lifted variables and the
:class:`~fenchel_cvx.history.History`. After the last W-sweep every W-block is optimal at the
returned ``(net.W, Xs)`` (W-blocks depend on X only), so anyone can re-check them with
``blocks.w_block(net, X0, Y, Xs, l)``; in Algorithm 2, ``Xs`` belong to the last batch
(``result.batch`` holds its column indices).
"""
import importlib
import math
import numbers
import time
from dataclasses import dataclass

import numpy as np
from array_api_compat import array_namespace

from .blocks import kkt_residual, w_block, x_block
from .certificate import Certificate
from .datasets import batch_order, check_dtype
from .errors import SolverError
from .history import History


# --- backends -------------------------------------------------------------------------------
def _lazy(module, cls):
    def make(**kwargs):
        return getattr(importlib.import_module(module, __package__), cls)(**kwargs)
    make.__name__ = cls
    return make


BACKENDS = {"cvxpy": _lazy(".oracle", "OracleBackend"), "fast": _lazy(".fast", "FastBackend")}
STRICT_AWARE = {"cvxpy"}   # registry backends whose constructor takes ``strict``


def get_backend(backend="cvxpy", **kwargs):
    """A backend object from a registry name (``BACKENDS``) or an object with ``.solve``."""
    if isinstance(backend, str):
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {sorted(BACKENDS)} or an object with a "
                             f"solve(block, start) method, got {backend!r}")
        return BACKENDS[backend](**kwargs)
    if callable(getattr(backend, "solve", None)):
        return backend
    raise ValueError(f"backend must be one of {sorted(BACKENDS)} or an object with a "
                     f"solve(block, start) method, got {backend!r}")


# Algorithm 2's default proximal weight: the paper's batched model has gamma > 0 ("introduced to
# moderate the change of the W-variables between subsequent batches"); with gamma = 0 and a small
# batch the W-blocks lose strict convexity (and, for cross-entropy, often their minimiser).
DEFAULT_GAMMA = 1.0


# --- result ---------------------------------------------------------------------------------
@dataclass
class BCDResult:
    """What ``fit_bcd`` returns (see the module docstring)."""

    net: object
    Xs: list
    history: History
    batch: object = None     # Algorithm 2: the column indices of the last batch (Xs's columns)


# --- validation -----------------------------------------------------------------------------
def _check_int(name, value, minimum=1):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def _namespace(A):
    """The array library of the data: that of an array-API array (CuPy, ...), else NumPy."""
    if isinstance(A, np.ndarray) or not hasattr(A, "__array_namespace__"):
        return np
    return array_namespace(A)


def _as_matrix(name, A, dtype, xp):
    try:
        A = np.asarray(A, dtype=dtype) if xp is np else xp.astype(xp.asarray(A), getattr(xp, check_dtype(dtype).name))
    except (TypeError, ValueError, AttributeError):
        raise ValueError(f"{name} must be a 2-D array of numbers from the library of X0 "
                         f"({xp.__name__}), got {type(A).__module__}.{type(A).__name__}") from None
    if A.ndim != 2:
        raise ValueError(f"{name} must be a 2-D array (features x data points), got shape {A.shape}")
    return A


def _weights_in(xp, net):
    """The network's weights as arrays of ``xp`` (the data's library), without changing net."""
    try:
        return [W if _namespace(W) is xp else xp.asarray(W) for W in net.W]
    except (TypeError, ValueError):
        raise ValueError(f"net.W must be arrays the data's library ({xp.__name__}) can take, got "
                         f"{type(net.W[0]).__module__}.{type(net.W[0]).__name__}") from None


def _check_data(net, X0, Y, xname="X0", yname="Y", xp=None):
    xp = _namespace(X0) if xp is None else xp
    dtype = net.W[0].dtype  # data take the network's float type: no silent upcast of float32
    X0, Y = _as_matrix(xname, X0, dtype, xp), _as_matrix(yname, Y, dtype, xp)
    p_in, p_out = net.layer_sizes[0], net.layer_sizes[-1]
    if X0.shape[1] == 0 or X0.shape[0] == 0:
        raise ValueError(f"{xname} is empty (shape {X0.shape}): at least one data point is needed")
    if X0.shape[0] != p_in:
        raise ValueError(f"{xname} must have {p_in} rows (the network's input size; columns are "
                         f"data points), got shape {X0.shape}")
    if Y.shape[0] != p_out:
        raise ValueError(f"{yname} must have {p_out} rows (the network's output size), got shape "
                         f"{Y.shape}")
    if Y.shape[1] != X0.shape[1]:
        raise ValueError(f"{yname} must have one column per data point of {xname} "
                         f"({X0.shape[1]}), got shape {Y.shape}")
    for name, A in ((xname, X0), (yname, Y)):
        if not bool(xp.all(xp.isfinite(A))):
            raise ValueError(f"{name} must be finite, got NaN or inf entries")
    return X0, Y


def _check_gamma(gamma, n):
    vals = [gamma] * n if isinstance(gamma, numbers.Real) else list(gamma)
    if len(vals) != n:
        raise ValueError(f"gamma must be a number or a sequence of {n} numbers, got {gamma!r}")
    for g in vals:
        if isinstance(g, bool) or not isinstance(g, numbers.Real) or not math.isfinite(g) or g < 0:
            raise ValueError(f"gamma must be >= 0 and finite, got {g!r}")
    return [float(g) for g in vals]


def is_one_hot(Y):
    """True iff every column of Y is a standard basis vector (a classification target)."""
    xp = _namespace(Y)
    Y = xp.asarray(Y)
    return (math.prod(Y.shape) > 0 and bool(xp.all((Y == 0) | (Y == 1)))
            and bool(xp.all(xp.sum(Y, axis=0) == 1)))


# --- evaluation -----------------------------------------------------------------------------
def evaluate(net, X0, Y, classification=None):
    """Feed-forward ``(loss per data point, accuracy or None)`` of ``net`` on ``(X0, Y)``."""
    if classification is None:
        classification = is_one_hot(Y)
    Yhat = net.forward(X0)[1]
    loss = float(net.loss.value(Y, Yhat)) / Y.shape[1]
    xp = _namespace(Yhat)
    hit = xp.argmax(Yhat, axis=0) == xp.argmax(Y, axis=0)
    acc = float(xp.mean(xp.astype(hit, Yhat.dtype))) if classification else None
    return loss, acc


# --- one round ------------------------------------------------------------------------------
class _Halt(Exception):
    """Recorded mode: a block returned a point that cannot be used (NaN, outside its domain)."""

    def __init__(self, block):
        super().__init__(block)
        self.block = block


class _Round:
    """The X-sweep, the W-sweep and the checks of one round on data (X0, Y).

    With ``check=False`` the objective-based checks (descent, lower bound, Fenchel-Young) and
    the objective values they need are skipped; block statuses are still checked.
    """

    def __init__(self, backend, net, cert, gamma, W0, check=True):
        self.backend, self.net, self.cert, self.gamma, self.W0 = backend, net, cert, gamma, W0
        self.check = check
        self.blocks = []

    def prox(self):
        return float(sum(g * array_namespace(W).sum((W - W0) ** 2)
                         for g, W, W0 in zip(self.gamma, self.net.W, self.W0) if g))

    def _solve(self, name, block, current, scale):
        before = float(block.value(current)) if self.check else None
        t0 = time.perf_counter()
        try:
            res = self.backend.solve(block, start=current)
        except SolverError as err:
            if self.cert.strict:
                raise
            self.cert._fail("block_optimality", name, math.nan, 0.0, self.cert.tol, str(err))
            self.blocks.append(dict(block=name, kind=block.kind, layer=block.layer,
                                    value_before=before, value_after=before,
                                    seconds=time.perf_counter() - t0, solver_seconds=None,
                                    status=f"error: {err.status}", residual=None, iterations=None,
                                    converged=False))
            return current, 0.0
        wall = time.perf_counter() - t0
        Z = res.argmin
        # the certificate trusts no report: the argmin must be usable, and its KKT residual is
        # recomputed here, on every round, from the point itself
        usable = self.cert.check_argmin(name, block, Z, current.shape)
        residual = kkt_residual(block, Z) if usable else None
        record = dict(block=name, kind=block.kind, layer=block.layer, value_before=before,
                      value_after=before, seconds=wall, solver_seconds=float(res.seconds),
                      status=res.status, residual=residual, reported_residual=float(res.residual),
                      iterations=int(res.iterations), converged=bool(res.converged))
        if not usable:          # recorded mode (strict raised): the block keeps its value, stop
            self.blocks.append(record)
            raise _Halt(name)
        self.cert.check_block(name, res, residual)
        after = float(res.value)  # the backend's value; the descent check recomputes it
        if self.check:
            after = float(block.value(Z))
            self.cert.check_descent(name, before, after, scale)
        record["value_after"] = after
        self.blocks.append(record)
        return Z, (after - before) if self.check else 0.0

    def x_sweep(self, X0, Y, Xs, F):
        """The X-blocks X_L, ..., X_1; updates the list ``Xs`` in place (kept if a block halts)."""
        for l in range(self.net.n_hidden, 0, -1):
            block = x_block(self.net, X0, Y, Xs, l)
            Xs[l - 1], delta = self._solve(f"X_{l}", block, Xs[l - 1], F)
            F = None if F is None else F + delta
        return Xs

    def w_sweep(self, X0, Y, Xs, F):
        net = self.net
        for l in range(net.n_hidden, -1, -1):
            g = self.gamma[l]
            block = w_block(net, X0, Y, Xs, l, gamma=g, W0=self.W0[l] if g else None)
            net.W[l], delta = self._solve(f"W_{l}", block, net.W[l], F)
            F = None if F is None else F + delta


def _round(backend, net, cert, X0, Y, Xs, gamma, W0, fresh, check=True):
    """One round on (X0, Y) from lifted variables Xs; returns (Xs, record).

    ``check=False``: no objective values and no objective-based checks (see ``fit_bcd``'s
    ``check_every``); the restart rule on carried-over X still runs.
    """
    t0 = time.perf_counter()
    r = _Round(backend, net, cert, gamma, W0, check)
    J = F0 = None
    if check or not fresh:
        J = net.network_objective(X0, Y)
        F0 = J if fresh else net.lifted_objective(X0, Y, Xs)
        if F0 > J:  # the restart rule (carried-over X only: fresh X have F0 == J)
            Xs, F0 = list(net.forward(X0)[0]), J
            cert.restarted = True
    Xs, halted = list(Xs), None
    F_x = B_x = None
    after_w = dict(lifted_w=None, network_w=None, divergence_w=None)
    try:
        r.x_sweep(X0, Y, Xs, None if F0 is None else F0 + r.prox())
        if check:
            F_x, B_x = net.lifted_objective(X0, Y, Xs), net.divergences(X0, Xs)
            cert.check_lower_bound(F_x, J)
        r.w_sweep(X0, Y, Xs, None if F_x is None else F_x + r.prox())
        if check:
            cert.check_fenchel_young(net, X0, Xs)
            after_w = dict(lifted_w=net.lifted_objective(X0, Y, Xs),
                           network_w=net.network_objective(X0, Y),
                           divergence_w=net.divergences(X0, Xs))
    except _Halt as stop:     # recorded mode: the run ends after this round, its history kept
        halted = stop.block
    record = dict(m=int(X0.shape[1]), lifted_x=F_x, network_x=J if check else None, **after_w,
                  prox=r.prox(), divergence_x=B_x, restarted=bool(cert.restarted),
                  checked=check, blocks=r.blocks, halted=halted)
    record["seconds"] = time.perf_counter() - t0
    return Xs, record


# --- the driver -----------------------------------------------------------------------------
def fit_bcd(net, X0, Y, *, batch_size=None, epochs=1, iterations=10, alternations=1, gamma=None,
            backend="cvxpy", strict=None, tol=1e-6, callback=None, X_test=None, Y_test=None,
            progress=False, eval_every=1, check_every=1):
    """Train ``net`` (a ``LiftedNetwork``) by block coordinate descent on the lifted objective.

    Parameters
    ----------
    X0, Y : data (features x m) and targets (outputs x m); one-hot Y is classification.
    batch_size : None for Algorithm 1 (all data), an integer >= 1 for Algorithm 2.
    epochs, alternations : Algorithm 2's passes over the batches and rounds per batch (K).
    iterations : Algorithm 1's number of rounds.
    gamma : gamma_l >= 0 of the proximal term, a number or one per layer (L + 1); None (the
        default): ``DEFAULT_GAMMA`` (> 0, as in the paper's batched model) for Algorithm 2, 0
        for Algorithm 1.
    backend : ``"cvxpy"``, ``"fast"`` or a backend object.
    strict : raise on a certificate violation; None = True for the oracle (``backend.name ==
        "cvxpy"``), False otherwise. ``False`` with ``backend="cvxpy"`` builds a non-strict
        oracle (inaccurate solves are recorded as violations and the run goes on).
    tol : tolerance of the certificate (``certificate.Certificate``) and, for a backend given
        by name, the largest accepted KKT residual of its block solves (its ``tol``).
    callback : ``callback(net, record)`` after every round; returning True stops the run.
    X_test, Y_test : held-out data, evaluated (feed-forward) after every round.
    progress : show a tqdm progress bar with the current objectives and accuracy.
    eval_every : evaluate train/test loss and accuracy (feed-forward, on all the data) every
        that many rounds and after the last round of every epoch; None never (the records
        and ``history.config["initial"]`` then hold None: a caller timing training evaluates
        in its callback instead).
    check_every : run the whole certificate every that many rounds and on the last round of
        the schedule (default 1: every round, as DESIGN.md asks; a run its callback stops
        ends on whatever round it stopped). The other rounds check block optimality
        only and record None for the objectives: descent, the lower bound and Fenchel-Young
        need about eight extra forward passes, a large share of a fast-backend round.

    Returns ``BCDResult(net, Xs, history)``. Every argument is validated before any solve; bad
    input raises ``ValueError`` naming the parameter and the value.
    """
    # --- validate everything first ---
    if not (hasattr(net, "layer_sizes") and hasattr(net, "W") and hasattr(net, "forward")):
        raise ValueError(f"net must be a LiftedNetwork, got {type(net).__name__}")
    xp = _namespace(X0)
    X0, Y = _check_data(net, X0, Y, xp=xp)
    m = X0.shape[1]
    if (X_test is None) != (Y_test is None):
        raise ValueError("X_test and Y_test must be given together, got only "
                         + ("X_test" if Y_test is None else "Y_test"))
    if X_test is not None:
        X_test, Y_test = _check_data(net, X_test, Y_test, "X_test", "Y_test", xp=xp)
    if batch_size is not None:
        batch_size = _check_int("batch_size", batch_size)
    epochs = _check_int("epochs", epochs)
    iterations = _check_int("iterations", iterations)
    alternations = _check_int("alternations", alternations)
    if gamma is None:
        gamma = 0.0 if batch_size is None else DEFAULT_GAMMA
    gamma = _check_gamma(gamma, net.n_hidden + 1)
    if eval_every is not None:
        eval_every = _check_int("eval_every", eval_every)
    check_every = _check_int("check_every", check_every)
    if callback is not None and not callable(callback):
        raise ValueError(f"callback must be callable or None, got {callback!r}")
    if strict is not None and not isinstance(strict, bool):
        raise ValueError(f"strict must be True, False or None, got {strict!r}")
    if not (isinstance(tol, numbers.Real) and math.isfinite(tol) and tol > 0):
        raise ValueError(f"tol must be > 0 and finite, got {tol!r}")
    if isinstance(backend, str):   # recorded mode: an oracle that records inaccurate solves
        opts = dict(strict=False) if strict is False and backend in STRICT_AWARE else {}
        backend = get_backend(backend, tol=tol, **opts)
    else:
        backend = get_backend(backend)
    name = getattr(backend, "name", type(backend).__name__)
    weights = _weights_in(xp, net)
    if xp is not np and name == "cvxpy":
        raise ValueError(f"backend 'cvxpy' (the oracle) takes NumPy data, got X0 from {xp.__name__}")
    net.W = weights   # validation done: the weights live where the data live
    strict = (name == "cvxpy") if strict is None else strict
    cert = Certificate(strict=strict, tol=tol, residual_tol=tol)
    classification = is_one_hot(Y)
    seed = net.seed if isinstance(net.seed, numbers.Integral) and net.seed >= 0 else 0
    if batch_size is None:
        schedule = [[None] * iterations]
        total = iterations
    else:
        schedule = batch_order(m, batch_size, epochs, seed=seed)
        total = sum(len(e) for e in schedule) * alternations

    # --- the run ---
    config = dict(layer_sizes=list(net.layer_sizes), activations=[a.name for a in net.activations],
                  loss=net.loss.name, lam=net.lam, rho=net.rho, gamma=gamma, batch_size=batch_size,
                  epochs=epochs, iterations=iterations, alternations=alternations, backend=name,
                  strict=strict, tol=tol, check_every=check_every,
                  seed=net.seed if isinstance(net.seed, int) else None,
                  batch_seed=seed, m=m, m_test=None if X_test is None else X_test.shape[1],
                  task="classification" if classification else "regression",
                  algorithm=1 if batch_size is None else 2)
    config["initial"] = None  # eval_every=None: no pass over all the data inside a timed run
    if eval_every is not None:
        tr_loss, tr_acc = evaluate(net, X0, Y, classification)
        te_loss, te_acc = (evaluate(net, X_test, Y_test, classification) if X_test is not None
                           else (None, None))
        config["initial"] = dict(network_objective=net.network_objective(X0, Y),
                                 train_loss=tr_loss, train_accuracy=tr_acc, test_loss=te_loss,
                                 test_accuracy=te_acc)
    history = History(config)

    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=total, desc=f"BCD ({name})", unit="round")
    it, Xs, batch, stop = 0, None, None, False
    # batches are column gathers: from a column-major copy each is one contiguous block per
    # point (MNIST, 784 x 60,000 float32: 0.1 ms a batch instead of 3 ms)
    X0_cols = X0 if batch_size is None or batch_size >= m or xp is not np else np.asfortranarray(X0)

    def gather(idx):
        if xp is np:
            return np.ascontiguousarray(X0_cols[:, idx]), Y[:, idx]
        j = xp.asarray(idx)
        return xp.take(X0, j, axis=1), xp.take(Y, j, axis=1)

    try:
        for epoch, batches in enumerate(schedule, start=1):
            for b, idx in enumerate(batches, start=1):
                Xb, Yb = (X0, Y) if idx is None else gather(idx)
                if idx is not None or Xs is None:
                    Xs, fresh = list(net.forward(Xb)[0]), True
                W0 = [xp.asarray(W, copy=True) for W in net.W] if any(gamma) else [None] * len(net.W)
                for k in range(1, (1 if idx is None else alternations) + 1):
                    it += 1
                    if idx is None and any(gamma):
                        W0 = [xp.asarray(W, copy=True) for W in net.W]
                    last = b == len(batches) and k == (1 if idx is None else alternations)
                    check = it % check_every == 0 or (last and epoch == len(schedule))
                    cert.begin(it, full=check)
                    Xs, rec = _round(backend, net, cert, Xb, Yb, Xs, gamma, W0, fresh, check)
                    fresh = False
                    due = eval_every is not None and (it % eval_every == 0 or last)
                    rec["train_loss"], rec["train_accuracy"] = (
                        evaluate(net, X0, Y, classification) if due else (None, None))
                    rec["test_loss"], rec["test_accuracy"] = (
                        evaluate(net, X_test, Y_test, classification)
                        if due and X_test is not None else (None, None))
                    rec["certificate"] = cert.outcome()
                    rec = dict(iteration=it, epoch=None if idx is None else epoch,
                               batch=None if idx is None else b,
                               alternation=None if idx is None else k, **rec)
                    history.append(rec)
                    batch = idx
                    if bar is not None:
                        post = (dict(F=f"{rec['lifted_x']:.4g}", J=f"{rec['network_x']:.4g}")
                                if check else {})
                        if rec["test_accuracy"] is not None:
                            post["test_acc"] = f"{rec['test_accuracy']:.3f}"
                        elif rec["train_accuracy"] is not None:
                            post["train_acc"] = f"{rec['train_accuracy']:.3f}"
                        bar.set_postfix(post, refresh=False)
                        bar.update(1)
                    if rec["halted"] is not None:   # recorded mode: an unusable argmin
                        stop = True
                        break
                    if callback is not None and callback(net, history.records[-1]) is True:
                        stop = True
                        break
                if stop:
                    break
            if stop:
                break
    finally:
        if bar is not None:
            bar.close()
    return BCDResult(net, Xs, history, batch)
