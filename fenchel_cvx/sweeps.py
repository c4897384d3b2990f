"""One round of block coordinate descent: the X-sweep, the W-sweep and the certificate's checks.

The blocks of eqs. (14)-(20) of the paper, in the order of Algorithms 1 and 2 (``bcd.py``): the
X-sweep X_L, ..., X_1 (backwards), then the W-sweep W_L, ..., W_0, each block solved by the
backend and checked as it returns (``block_checks.py``); on checked rounds the objectives before
and after each sweep and the lower bound, eq. (8), F(W, X) <= J(W) (``certificate.py``). Each
layer's pre-activation W_l X~_l is formed once per change of its weights or its input and serves
every block and figure that needs it (the driver's feed-forward pass, the X-solvers' images, the
checks' images; ``carry.py``: W_0 X~_0 from the round before).
"""

from __future__ import annotations

import time

from array_api_compat import array_namespace

from .block_checks import CheckedSolves, Halt
from .blocks import w_block, x_block
from .carry import Carried


# --- one round ------------------------------------------------------------------------------
class _Round(CheckedSolves):
    """The X-sweep, the W-sweep and the checks of one round on data (X0, Y) (``check=False``:
    no objective values, no objective-based checks; block statuses are still checked)."""

    def __init__(self, backend, net, cert, gamma, W0, check=True):
        super().__init__(backend, net, cert, check)
        self.gamma, self.W0 = gamma, W0
        # layer l -> W_l X~_l at the current W_l, X_l, where a pass computed it; U_0 updated by
        # ``steps0`` solver steps since a product formed it (``carry``); W_0's for the next round
        self.pre_activations, self.steps0, self.carried = {}, 0, None
        self.carry = False  # whether the next round may take W_0 X~_0 (``sweeps``' ``carry``)

    def proximal_term(self):
        """The proximal term's value, sum_l gamma_l ||W_l - W0_l||^2 (eq. (13))."""
        return float(
            sum(
                g * array_namespace(W).sum((W - W0) ** 2)
                for g, W, W0 in zip(self.gamma, self.net.W, self.W0)
                if g
            )
        )

    def x_sweep(self, X0, Y, Xs, F, Us=None, order="backward"):
        """The X-blocks X_L, ..., X_1 (``order="forward"``: X_1, ..., X_L); updates the list
        ``Xs`` in place (kept if a block halts).

        ``Us``: the pre-activations of the feed-forward pass that gave ``Xs`` at the current
        weights (new X, ``new_x``): X_l's block takes, for its start, U_l from it, and U_{l-1}
        where X_{l-1} is not solved yet (``below``). Kept for the W-blocks
        (``pre_activations``), whose weights do not change before them: U_0, and each solver's
        ``A(W_l, X_l) + b`` at its returned X_l (``BlockResult.U``)."""
        L, solved = self.net.n_hidden, set()
        for l in range(L, 0, -1) if order == "backward" else range(1, L + 1):
            U = None if Us is None else Us[l]
            block = x_block(self.net, X0, Y, Xs, l, U_prev=self.below(l, Us, solved), U=U)
            Xs[l - 1], delta, self.pre_activations[l], image = self.solve(
                f"X_{l}", block, Xs[l - 1], F, (Xs, l - 1), self.images.get(l)
            )
            self.keep(l, image)
            solved.add(l)
            F = None if F is None else F + delta
        return Xs

    def below(self, l, Us, solved):
        """U_{l-1} = A(W_{l-1}, X_{l-1}) + b at the current X_{l-1}, where at hand (None: the
        block forms it): where this sweep solved X_{l-1}, its check's image (checked rounds:
        never a solver's) or its solver's; else the feed-forward pass's, or the round's U_0."""
        if l - 1 in solved:
            return self.images.get(l - 1) if self.check else self.pre_activations.get(l - 1)
        if Us is not None:
            return Us[l - 1]
        return self.pre_activations.get(0) if l == 1 else None

    def w_sweep(self, X0, Y, Xs, F, Xt0=None):
        """The W-blocks W_L, ..., W_0, each from the W_l X~_l the X-sweep kept (W_0 and the
        data as the feed-forward pass saw them; W_l as X_l's solver did); ``Xt0``: the data's
        patches X~_0, if at hand (the feed-forward pass formed U_0 from them)."""
        net, m = self.net, X0.shape[1]
        for l in range(net.n_hidden, -1, -1):
            g, U, Xt = self.gamma[l], self.pre_activations.get(l), Xt0 if l == 0 else None
            W0, A, known = self.W0[l] if g else None, net.layers[l], self.images.get(l)
            carry = self.carry and l == 0  # W_0 X~_0 at the new W_0, the next round's
            block = w_block(net, X0, Y, Xs, l, gamma=g, W0=W0, U=U, Xt=Xt, return_U=carry)
            known = None if known is None else A.to_rows(known)
            net.W[l], delta, U, image = self.solve(f"W_{l}", block, net.W[l], F, (net.W, l), known)
            image = None if image is None else A.from_rows(image, m)
            self.keep(l, image)
            if carry:
                U = None if U is None else A.from_rows(U, m)
                steps = self.blocks[-1]["iterations"]
                self.carried = Carried.after_w0(image, U, self.steps0, steps)
            F = None if F is None else F + delta


def sweeps(
    backend,
    net,
    cert,
    X0,
    Y,
    Xs,
    gamma,
    W0,
    new_x,
    *,
    iteration=None,
    check=True,
    Us=None,
    Xt0=None,
    carried=None,
    carry=False,
    order="backward",
):
    """One round's sweeps and checks on (X0, Y) from lifted variables Xs; returns (Xs, record,
    W_0 X~_0 at the returned weights where at hand: a ``carry.Carried`` or None).

    ``new_x``: Xs is the feed-forward point of the current weights (a new batch), whose
    pre-activations ``Us`` are at hand (``x_sweep``); else the restart rule runs first.
    ``carried``: the ``carry.Carried`` this round takes for W_0 X~_0 (``Us[0]`` where given);
    ``carry``: the next round may take one (the same data, no momentum), so W_0's is returned.
    ``order``: the X-sweep's (``fit_bcd``'s ``x_sweep``).
    ``check=False``: no objective values and no objective-based checks (``fit_bcd``'s
    ``check_every``). ``cert`` begins the checks of round ``iteration`` here.
    """
    t0 = time.perf_counter()
    r = _Round(backend, net, cert, gamma, W0, check)
    r.carry = carry
    U0 = Us[0] if Us is not None else None if carried is None else carried.U
    r.steps0 = 0 if carried is None else carried.steps
    J = F0 = None
    restarted = False
    if check or not new_x:  # J from the driver's own pass where it made one (new X)
        U0 = net.pre_activation(0, X0) if U0 is None else U0  # (X_1's and W_0's blocks' too)
        known = [U0] if Us is None else Us
        J = net.network_objective(X0, Y, checked=False, known=known)
        if new_x:
            F0 = J
        else:
            B0 = net.divergences(X0, Xs, [U0])
            F0 = net.lifted_objective(X0, Y, Xs, checked=False, B=B0)
        if F0 > J:  # the restart rule (carried-over X only: new X have F0 == J)
            (Xs, Us), F0, restarted = net.feed_forward(X0, known=known[:1]), J, True
    if U0 is not None:
        r.pre_activations[0] = U0
    if check:  # the feed-forward point's pre-activations, the driver's (or a check's: carry)
        r.images = dict(enumerate(Us)) if Us is not None else {0: U0}
    cert.begin(iteration, full=check, restarted=restarted)
    Xs, halted = list(Xs), None
    F_x = B_x = None
    after_w = dict(lifted_w=None, network_w=None, divergence_w=None)
    try:
        try:
            r.x_sweep(X0, Y, Xs, None if F0 is None else F0 + r.proximal_term(), Us, order)
            X = [X0, *Xs]
            if check:  # the pre-activations at the new X: U_0 the driver's, U_l X_l's check's
                B_x = net.divergences(X0, Xs, [r.image(l, X[l]) for l in range(net.n_hidden)])
                F_x = net.lifted_objective(X0, Y, Xs, checked=False, B=B_x)
                cert.check_lower_bound(F_x, J)
            r.w_sweep(X0, Y, Xs, None if F_x is None else F_x + r.proximal_term(), Xt0)
            if check:  # the pre-activations at the new W (the W-blocks' checks formed them)
                Us_w = [r.image(l, X[l]) for l in range(net.n_hidden)]
                cert.check_fenchel_young(net.activations, Xs, Us_w)
                B_w = net.divergences(X0, Xs, Us_w)
                after_w = dict(
                    lifted_w=net.lifted_objective(X0, Y, Xs, checked=False, B=B_w),
                    network_w=net.network_objective(X0, Y, checked=False, known=Us_w[:1]),
                    divergence_w=B_w,
                )
        except Exception:
            r.settle()  # an unusable argmin earlier in the round fails by name instead
            raise
        r.settle()
    except Halt as stop:  # recorded mode: the run ends after this round, its history kept
        halted, r.carried = stop.block, None
    # the proximal term's value (a read: where reads are not cheap, on checked rounds only)
    record = dict(
        m=int(X0.shape[1]),
        lifted_x=F_x,
        network_x=J if check else None,
        **after_w,
        prox=None if r.defer else r.proximal_term(),
        divergence_x=B_x,
        restarted=restarted,
        checked=check,
        blocks=r.blocks,
        halted=halted,
    )
    record["seconds"] = time.perf_counter() - t0
    return Xs, record, r.carried
