"""One round of Algorithms 1 and 2: its blocks, each solved and checked, and its record.

A round (``bcd.py``) is the X-sweep X_L, ..., X_1 then the W-sweep W_L, ..., W_0 on one batch
(all the data in Algorithm 1), the blocks of eqs. (14)-(20) of the paper. :class:`Round` holds
what the round works on, explicitly: the batch (X_0, Y), the weights W (the network's), the
lifted variables X (the run state's), the proximal centre W0 of eq. (13) and the
pre-activations (``pre_activations.py``: one rule for when they are stale). Its methods are
the algorithm's steps: :meth:`Round.centre` (W0 <- W), :meth:`Round.feed_forward`
(X <- the feed-forward pass), :meth:`Round.x_block` and :meth:`Round.w_block` (one block,
solved by the backend and checked as it returns: ``block_checks.py``), and, on checked rounds,
the certificate's figures before and after each sweep (``certificate.py``): the restart rule
and J at :meth:`Round.begin`, the lower bound of eq. (8), F(W, X) <= J(W), at
:meth:`Round.x_swept`, Fenchel-Young at :meth:`Round.w_swept`. :meth:`Round.end` records the
round and hands the run state its results.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import replace
from types import ModuleType
from typing import TYPE_CHECKING, Any

from array_api_compat import array_namespace

from .arrays import Array, by_points
from .block_checks import CheckedSolves, Halt
from .blocks import w_block, x_block
from .certificate import fenchel_young_figures
from .layer_split import LayerSplit, shared_norms
from .pre_activations import PreActivations

if TYPE_CHECKING:
    from .network import LiftedNetwork
    from .run_settings import RunSettings
    from .schedule import BCDState, Step


class Round(CheckedSolves):
    """The round ``step`` (a ``schedule.Step``) of the run ``run`` (a ``RunSettings``) from
    the run state ``state`` (a ``BCDState``, which takes the round's results at :meth:`end`)."""

    #: X_1, ..., X_L of the batch: the state's, then the feed-forward pass's (None before it)
    Xs: Any
    #: J(W) and F(W, X) (with the proximal term) as the checks start from them, F(W, X) and
    #: the divergences after the X-sweep (None where not formed)
    J: float | None
    F: Any  # a float on checked rounds (each block's descent scale), else None
    F_x: float | None
    B_x: list[float] | None
    W_prev: list[Array] | None  # the weights before momentum's extrapolation
    halted: str | None  # the block whose unusable argmin halted the round
    after_w: dict[str, Any]  # the figures after the W-sweep

    def __init__(self, net: LiftedNetwork, state: BCDState, step: Step, run: RunSettings) -> None:
        check = step.iteration % run.check_every == 0 or step.last
        super().__init__(run.backend, net, run.cert, check, run.comm)
        self.state, self.step, self.run, self.t0 = state, step, run, time.perf_counter()
        self.X0, self.Y = run.data.batch(step.columns)  # (on ranks: this rank's share)
        self.Xt0 = run.data.patches(net.layers[0], self.X0)  # X~_0: the pass's and W_0's block's
        carried = state.carried if run.carries_U0 else None
        self.pre = PreActivations(net, check, carried, self.threads)
        self.Xs = None if state.Xs is None else list(state.Xs)  # the state's at the round's end
        self.W_prev = self.J = self.F = self.F_x = self.B_x = self.halted = None
        self.was_restarted = False
        self.after_w = dict(lifted_w=None, network_w=None, divergence_w=None)
        # the small top W-blocks by layer on ranks (unchecked rounds: ``layer_split``)
        self.split = LayerSplit(run.owners, run.comm) if run.owners and not check else None
        self.norms: dict | None = None  # the X-sweep's maps with their norms (``layer_split``)

    @property
    def X(self) -> list[Array]:
        """[X_0, X_1, ..., X_L] of the batch."""
        return [self.X0, *self._lifted()]

    # --- the batch: W0 <- W, X <- the feed-forward pass ---------------------------------------
    def centre(self) -> None:
        """W0 <- W, after momentum's extrapolation ``W <- W + beta (W - W_prev)`` where it is
        set (``bcd``'s module doc). The centre is the weights themselves: no block writes into
        its start, and each W-block starts at its centre by identity."""
        if any(self.run.momentum):
            W_prev, xp = self.state.W_prev, self.run.data.xp
            self.W_prev = _extrapolate(self.net, W_prev, self.run.momentum, xp)
        self.state.W0 = list(self.net.W) if any(self.run.gamma) else [None] * len(self.net.W)

    def feed_forward(self) -> None:
        """X_1, ..., X_L <- the feed-forward pass on the batch (its pre-activations kept). The
        run state lets the last batch's X go (a resumed round makes its own pass again)."""
        self.Xs = self.pre.feed_forward(self.X0, self.Xt0)
        self.state.Xs = list(self.Xs)

    def alternations(self, steps: Sequence[Step]) -> Iterator[Round]:
        """This round (of ``steps[0]``), then a round of each later step of ``steps``, each
        made once the one before has ended (the run state holds its results)."""
        yield self
        for step in steps[1:]:
            yield Round(self.net, self.state, step, self.run)

    # --- the round's start: J, the restart rule ----------------------------------------------
    def begin(self) -> None:
        """The objectives the checks start from: J(W) (where checked, or where the X are carried
        over) and F(W, X). On carried-over X the restart rule first: where F(W, X) > J(W), X
        restarts from the feed-forward point (``bcd``'s module doc)."""
        net, X0, Y, pre = self.net, self.X0, self.Y, self.pre
        new_x = self.step.new_x
        if self.check or not new_x:  # J from the driver's own pass where it made one (new X)
            pre.form(0, X0)  # (X_1's and W_0's blocks' too)
            self.J = self.over_columns(self._network_objective, X0, Y, pre.on_pass())
            if new_x:
                self.F = self.J
            else:
                B0 = self.over_columns(self._divergences, X0, self.Xs, pre.on_pass()[:1])
                self.F = net.lifted_objective(X0, Y, self.Xs, checked=False, B=B0, comm=self.comm)
            if self.F > self.J:  # the restart rule (carried-over X only: new X have F == J)
                self.feed_forward()
                self.F, self.was_restarted = self.J, True
        self.cert.begin(self.step.iteration, full=self.check, restarted=self.was_restarted)
        # the X-sweep's descent scale: checked rounds only (elsewhere F decided the restart alone,
        # and the proximal term's value is a read)
        self.F = self.F + self.proximal_term() if self.check else None

    # --- the blocks ---------------------------------------------------------------------------
    def x_block(self, l: int) -> None:
        """X_l <- the argmin of its block (eqs. (14)-(16)), from the current X_l, with U_{l-1}
        and, for its start, U_l at hand where the round holds them. On ranks the bounds of the
        sweep's map norms are computed once, each by one rank (``layer_split.shared_norms``)."""
        pre, Xs = self.pre, self._lifted()
        if self.norms is None:  # the sweep's first block: its maps' norms, shared by the ranks
            self.norms = shared_norms(self.net, self.backend, self.comm)
        block = x_block(self.net, self.X0, self.Y, Xs, l, U_prev=pre.get(l - 1))
        if l in self.norms:
            block = replace(block, map=self.norms[l])
        Xs[l - 1], delta, U, image = self.solve(
            f"X_{l}", block, Xs[l - 1], self.F, (Xs, l - 1), pre.get(l)
        )
        pre.put(l, U if image is None else image)
        self._add(delta)

    def w_block(self, l: int) -> None:
        """W_l <- the argmin of its block (eqs. (17)-(20); eq. (13)'s proximal term where
        gamma_l > 0), from the current W_l, with U_l = W_l X~_l at hand for its start. W_0's
        block hands back its image where the next round takes it (``pre_activations``). On
        ranks, an unchecked round solves the small top blocks by layer (``layer_split``)."""
        split = self.split
        if split is not None and l in split.plan:
            if not split.shares:  # the first of them in the sweep: their columns, gathered
                split.gather({k: (*self._w_block_of(k), self.net.W[k]) for k in split.plan})
            split.solve(self, l)
            if l == min(split.plan):  # the last of them: every rank's W and report, checked
                split.exchange(self)
            return
        net, pre, m = self.net, self.pre, self.X0.shape[1]
        A, carry = net.layers[l], l == 0 and self.run.carries_U0  # (W_0 X~_0: the next round's)
        block, rows = self._w_block_of(l)
        steps = pre.steps(l)
        net.W[l], delta, U, image = self.solve(
            f"W_{l}", block, net.W[l], self.F, (net.W, l), rows, carry
        )
        if image is not None:
            pre.put(l, A.from_rows(image, m))
        elif carry and U is not None:
            pre.put(l, A.from_rows(U, m), steps + self.blocks[-1]["iterations"])
        else:
            pre.put(l, None)
        self._add(delta)

    def _w_block_of(self, l: int) -> tuple[Any, Array | None]:
        """W_l's block on this round's data points and the rows of U_l = W_l X~_l where at
        hand (its start's image): X~_l the data's (the batch's, once) or the round's X_l's,
        formed on the threads."""
        net, g, A, U = self.net, self.run.gamma[l], self.net.layers[l], self.pre.get(l)
        W0 = self.state.W0[l] if g else None
        Xt = self.Xt0 if l == 0 else by_points(A.patches, self._lifted()[l - 1], self.threads)
        block = w_block(net, self.X0, self.Y, self._lifted(), l, gamma=g, W0=W0, Xt=Xt)
        return block, None if U is None else A.to_rows(U)

    def _lifted(self) -> list:
        """X_1, ..., X_L: the run state's, or the batch's feed-forward pass."""
        if self.Xs is None:
            raise RuntimeError("a round's blocks need its X: the feed-forward pass comes first")
        return self.Xs

    def _add(self, delta: float) -> None:
        self.F = None if self.F is None else self.F + delta

    def proximal_term(self) -> float:
        """The proximal term's value, sum_l gamma_l ||W_l - W0_l||^2 (eq. (13))."""
        return float(
            sum(
                g * array_namespace(W).sum((W - W0) ** 2)
                for g, W, W0 in zip(self.run.gamma, self.net.W, self.state.W0)
                if g
            )
        )

    # --- the checks between and after the sweeps ----------------------------------------------
    def x_swept(self) -> None:
        """Checked rounds: F(W, X) at the new X and the lower bound F(W, X) <= J(W) (eq. (8)).
        Every round: the X-sweep's maps let go of the W their norms were computed for."""
        self.norms = {}
        if not self.check:
            return
        X0, Xs, X = self.X0, self.Xs, self.X
        Us = [self.pre.form(l, X[l]) for l in range(self.net.n_hidden)]
        self.B_x = self.over_columns(self._divergences, X0, Xs, Us)
        F_x = self.net.lifted_objective(X0, self.Y, Xs, checked=False, B=self.B_x, comm=self.comm)
        self.cert.check_lower_bound(F_x, self.J)
        self.F_x, self.F = F_x, F_x + self.proximal_term()

    def w_swept(self) -> None:
        """Checked rounds: Fenchel-Young at the new W, and F and J there."""
        if not self.check:
            return
        net, X0, Xs, X = self.net, self.X0, self.Xs, self.X
        Us_w = [self.pre.form(l, X[l]) for l in range(net.n_hidden)]
        young = self.over_columns(self._fenchel_young_figures, Xs, Us_w)
        self.cert.check_fenchel_young_figures(net.activations, young)
        B_w = self.over_columns(self._divergences, X0, Xs, Us_w)
        self.after_w = dict(
            lifted_w=net.lifted_objective(X0, self.Y, Xs, checked=False, B=B_w, comm=self.comm),
            network_w=self.over_columns(self._network_objective, X0, self.Y, Us_w[:1]),
            divergence_w=B_w,
        )

    # the figures over the data points that ``over_columns`` splits: J(W) from the known
    # pre-activations, the layers' divergences, the Fenchel-Young check's figures
    def _network_objective(self, X0: Array, Y: Array, known: list, comm: Any) -> float:
        return self.net.network_objective(X0, Y, checked=False, known=known, comm=comm)

    def _divergences(self, X0: Array, Xs: list, Us: list, comm: Any) -> list[float]:
        return self.net.divergences(X0, Xs, Us, comm)

    def _fenchel_young_figures(self, Xs: list[Array], Us: list[Array], comm: Any) -> list:
        return fenchel_young_figures(self.net.activations, Xs, Us, comm)

    @contextlib.contextmanager
    def recorded(self) -> Iterator[None]:
        """The blocks of the round: the deferred argmin checks settled at its end (or where a
        block fails, so that an unusable argmin earlier in the round fails by name); in
        recorded mode an unusable argmin ends the round there (``halted``), and the run after
        it."""
        try:
            try:
                yield
            except Exception:
                self.settle()
                raise
            self.settle()
        except Halt as stop:
            self.halted = stop.block
            self.pre.put(0, None)  # the next round forms its own U_0

    # --- the record ---------------------------------------------------------------------------
    def end(self, observers: Iterable[Callable[[LiftedNetwork, BCDState, Step], object]]) -> bool:
        """The round's record, which the run state takes with the round's weights, X and the
        U_0 the next round may take; then the observers. -> whether the run stops here (an
        observer's True, or a halted block)."""
        step, check = self.step, self.check
        record = dict(
            iteration=step.iteration,
            epoch=step.epoch,
            batch=step.batch,
            alternation=step.alternation,
            m=self.run.data.size(step.columns),
            lifted_x=self.F_x,
            network_x=self.J if check else None,
            **self.after_w,
            # (a read: where reads are not cheap, on checked rounds only)
            prox=None if not (self.check or self.cheap) else self.proximal_term(),
            divergence_x=self.B_x,
            restarted=self.was_restarted,
            checked=check,
            blocks=self.blocks,
            halted=self.halted,
        )
        record["seconds"] = time.perf_counter() - self.t0
        record.update(self.run.evaluate(self.net, step))
        record["certificate"] = self.cert.outcome()
        carried = self.pre.carried() if self.run.carries_U0 else None
        self.state.advance(self.net, self.Xs, record, self.W_prev, carried)
        del self.pre, self.X0, self.Y, self.Xt0  # the next round's arrays need the room
        stop = any([obs(self.net, self.state, step) is True for obs in observers])
        if self.comm.P > 1:  # (the observers run on rank 0: its stop is every rank's)
            (stop,) = self.comm.reduce([float(stop)], "max")
        return bool(stop) or bool(self.halted)


def _extrapolate(
    net: LiftedNetwork, W_prev: Sequence[Array] | None, beta: Sequence[float], xp: ModuleType
) -> list[Array]:
    """Momentum: ``W <- W + beta_l (W - W_prev)`` (none before a first W_prev); returns the W
    before it, the next W_prev."""
    W = [xp.asarray(W, copy=True) for W in net.W]
    if W_prev is not None:
        net.W = [Wl + b * (Wl - Pl) if b else Wl for Wl, Pl, b in zip(W, W_prev, beta)]
    return W
