"""Fenchel lifted networks, non-batched (the paper's Algorithm 1), as a ``fit_lifted`` method.

``fenchel_cvx.fit_bcd(net, X, Y, batch_size=None, iterations=n, backend=FastBackend(...))`` on
the lifted objective (eq. (7) of the paper)

    F(W, X) = L(Y, W_L X~_L) + sum_l rho_l ||W_l||^2 + lam sum_{l<L} B_l(X_{l+1}, W_l X~_l)

with the paper's non-batched hyperparameters (Appendix, "Hyperparameters for Experiments"):
``pi_l(W) = ||W||_F^2``, ``rho = (1e-2, 10)``, ``lam = 0.1``, losses summed over the data.
``w_steps`` / ``x_steps`` cap each block's warm-started inner iterations (None: to ``tol``).
A record is one BCD round (X-sweep then W-sweep); ``objective`` is F after the round.

``restart=True`` starts every round's X-sweep from the feed-forward point of the current weights
instead of the last round's X (Algorithm 1 keeps X and restarts only when the feed-forward point
is better, ``bcd.py``). That is Algorithm 2 with one batch of all the data, no proximal term
(gamma = 0) and K = 1: ``fit_bcd(batch_size=m, epochs=iterations, gamma=0)``. Each round is
still a descent step on F from its feed-forward start, and it keeps the lifted X from drifting
away from the network that is scored (docs/lifted.md, "Tuning FLN"). That one batch is the data
in their own order, so W_0's Gram matrix (of X~_0, the data with a row of ones) is factorised
once per run and reused by every round (the fast backend's cache).

``capped_reports=False`` (the default) has a block that stops at its step cap (``w_steps``,
``x_steps``, ``max_iter``) report neither its KKT residual nor its value at the returned point
(``FastBackend(capped_residual=False, capped_value=False)``): ``fit_bcd`` recomputes both on its
checked rounds (``check_every``) and reads neither on the others, and each capped block saves a
gradient and a value (on W_0, products of 300 x 785 x m). Such a block also takes all its
steps, with no early stop at ``tol`` (``FastBackend``'s ``capped_residual``): where a block
would have reached ``tol`` before its cap, its iterates differ.

``nproc=P`` trains on P ranks of this machine (``parallel.Ranks``, one thread each on a 2-core
machine: docs page "Training in parallel"): each rank holds its share of the data's columns,
and the rounds are the one-process rounds to round-off. The ranks start before the first round;
its seconds include sending them the data.
"""

import time
from collections.abc import Sequence
from typing import Any

from ...arrays import Array
from ...bcd import fit_bcd
from ...fast import FastBackend
from ...losses import LOSSES
from ...network import LiftedNetwork
from ...parallel import ranks_for
from ...validation import BOOL, COUNT, LAM, RHO, TOL, PerLayer, validate
from .common import LiftedMethod, Record, register


@register
class FLN(LiftedMethod):
    name = "fln"
    defaults = dict(
        lam=0.1,
        rho=(1e-2, 10.0),
        w_steps=None,
        x_steps=None,
        tol=1e-6,
        max_iter=500,
        check_every=1,
        restart=False,
        capped_reports=False,
        nproc=1,
    )
    constraints = dict(
        lam=PerLayer(LAM),
        rho=PerLayer(RHO),
        w_steps=[COUNT, None],
        x_steps=[COUNT, None],
        tol=TOL,
        max_iter=COUNT,
        check_every=COUNT,
        restart=BOOL,
        capped_reports=BOOL,
        nproc=COUNT,
    )
    losses = tuple(LOSSES)
    # the hyperparameters (set from ``defaults`` and the arguments by ``LiftedMethod``)
    lam: float | Sequence[float]
    rho: float | Sequence[float]
    w_steps: int | None
    x_steps: int | None
    tol: float
    max_iter: int
    check_every: int
    restart: bool
    capped_reports: bool
    nproc: int

    def run(
        self,
        net: LiftedNetwork,
        X: Array,
        Y: Array,
        iterations: int,
        record: Record,
        test: tuple[Array, Array] | None = None,
    ) -> None:
        settings = self.fit_settings(net, X.shape[1], iterations)

        def callback(net_, rec):
            dt = time.perf_counter() - clock["t"]
            stop = record(rec["iteration"], dt, rec["lifted_w"], weights=net_.W)
            clock["t"] = time.perf_counter()
            return stop

        with ranks_for(self.nproc) as ranks:
            clock = dict(t=time.perf_counter())
            (fit_bcd if ranks is None else ranks.fit)(net, X, Y, callback=callback, **settings)

    def fit_settings(self, net: LiftedNetwork, m: int, iterations: int) -> dict[str, Any]:
        """``fit_bcd``'s settings of this method for ``net`` (its lam and rho set here) on ``m``
        data points, ``iterations`` rounds: the backend, the schedule and the checks."""
        hyper = validate(
            dict(lam=PerLayer(LAM, net.n_hidden), rho=PerLayer(RHO, net.n_hidden + 1)),
            dict(lam=self.lam, rho=self.rho),
        )
        net.lam, net.rho = hyper["lam"], hyper["rho"]
        backend = FastBackend(
            tol=self.tol,
            max_iter=self.max_iter,
            w_steps=self.w_steps,
            x_steps=self.x_steps,
            capped_residual=self.capped_reports,
            capped_value=self.capped_reports,
        )
        schedule = (
            dict(batch_size=m, epochs=iterations, gamma=0.0)
            if self.restart
            else dict(batch_size=None, iterations=iterations)
        )
        return dict(
            backend=backend,
            strict=False,
            eval_every=None,
            check_every=self.check_every,
            **schedule,
        )
