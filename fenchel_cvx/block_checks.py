"""A round's block solves under check 4 of the certificate (Algorithms 1 and 2, Sec. 4.5).

Each block of a round (eqs. (14)-(20)) is solved by the backend and its outcome checked before
the next block sees it: the argmin must have the block's shape, be finite and lie in the
block's domain, its KKT residual is recomputed from the point itself (``blocks.kkt_residual``)
on checked rounds, and its value change feeds the descent check (``certificate.py``). The check
forms the argmin's image (``Block.forward``: a W-block's ``W X~``, an X-block's ``A(W, Z)``)
once, for its value and its residual both, and hands it back: the round reuses it for its own
figures (``rounds.py``, ``pre_activations.py``). No image a solver reports enters a check. Where
reads are not cheap (a GPU) an unchecked round defers the argmin checks to one read at its end
(:meth:`CheckedSolves.settle`). A record per block goes to the round's history.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from array_api_compat import array_namespace

from .arrays import Array, cheap_reads
from .backends import check_threads
from .blocks import Block, BlockResult
from .certificate import Certificate, argmin_usable
from .column_threads import figures, over_columns
from .errors import SolverError
from .reduce import LOCAL, Comm

if TYPE_CHECKING:
    from .backends import Backend
    from .network import LiftedNetwork


class Halt(Exception):
    """Recorded mode: a block returned a point that cannot be used (NaN, outside its domain)."""

    def __init__(self, block: str) -> None:
        super().__init__(block)
        self.block = block


class CheckedSolves:
    """The block solves of one round, each checked as it returns (check 4) and recorded.

    With ``check=False`` the objective values (the descent check's) and the KKT residual are
    skipped; the argmin and the block statuses are still checked. ``comm``: the ranks that
    hold shares of the batch's data points (``reduce.py``): every figure is the whole block's.
    """

    def __init__(
        self,
        backend: Backend,
        net: LiftedNetwork,
        cert: Certificate,
        check: bool = True,
        comm: Comm = LOCAL,
    ) -> None:
        self.backend, self.net, self.cert, self.check = backend, net, cert, check
        self.comm, self.threads = comm, check_threads(backend)
        self.blocks: list[dict[str, Any]] = []
        # an unchecked round where reads are not cheap (a GPU) reads its blocks' argmin checks
        # at once, at its end (``settle``): (name, block, argmin, start, its slot, the check's
        # 0-d flag, the records and violations before it); on ranks too, where the checks of
        # the round's blocks are agreed in one reduction
        self.cheap = cheap_reads(array_namespace(net.W[0]))
        self.defer = not check and (comm.P > 1 or not self.cheap)
        self.pending: list[tuple[Any, ...]] = []

    def solve(
        self,
        name: str,
        block: Block,
        current: Array,
        scale: float | None,
        slot: tuple[list[Any], int],
        image: Array | None = None,
        return_image: bool = False,
    ) -> tuple[Array, float, Array | None, Array | None]:
        """Solve ``block`` from ``current`` (``slot[0][slot[1]]``, where the caller puts the
        result): ``(argmin, value change or 0, the solver's A(W, X) + b or None, the argmin's
        image)``. ``image``: ``block.forward(current)`` where the round holds it (on checked
        rounds one a product formed: the value before; a backend that takes images starts from
        it); ``return_image``: the round takes the solver's image of the argmin back. The
        returned image is the check's own ``block.forward(argmin)`` on checked rounds, else
        None (and where the solver failed)."""
        images = dict(image=image, return_image=return_image) if self.backend.images else {}
        before: float | None
        if self.check:
            at_start = figures(block, current, image, self.threads, residual=False, comm=self.comm)
            image, before = at_start.image, at_start.value
        else:
            before = image = None
        t0 = time.perf_counter()
        try:
            res: BlockResult | SolverError = self.backend.solve(block, start=current, **images)
        except SolverError as err:
            if self.cert.strict:
                raise
            res = err
        wall = time.perf_counter() - t0
        return self.account(res, wall, name, block, current, slot, scale, before)

    def account(
        self,
        res: BlockResult | SolverError,
        wall: float,
        name: str,
        block: Block,
        current: Array,
        slot: tuple[list[Any], int],
        scale: float | None = None,
        before: float | None = None,
    ) -> tuple[Array, float, Array | None, Array | None]:
        """Check and record ``res``, the backend's result of a solve of ``block`` from
        ``current`` (or the ``SolverError`` it raised, recorded mode), ``wall`` its seconds;
        ``scale`` and ``before`` the descent check's scale and the block's value at the start
        (checked rounds). -> as :meth:`solve`. A block solved whole
        on another rank (``layer_split``) is checked here too, from the result it sent."""
        if isinstance(res, SolverError):
            self.cert.solver_failed(name, res)
            self.blocks.append(
                dict(
                    block=name,
                    kind=block.kind,
                    layer=block.layer,
                    value_before=before,
                    value_after=before,
                    seconds=wall,
                    solver_seconds=None,
                    status=f"error: {res.status}",
                    residual=None,
                    iterations=None,
                    converged=False,
                )
            )
            return current, 0.0, None, None  # (an image handed in may be a solver's hint too)
        Z = res.argmin
        # the certificate trusts no report: the argmin must be usable (every round), and on every
        # checked round (check_every) its KKT residual is recomputed here from the point itself;
        # the rounds between check the point and the status only, and their records say so
        usable = self._argmin_check(name, block, Z, current, slot)
        found = (
            figures(block, Z, None, self.threads, comm=self.comm) if usable and self.check else None
        )
        image_Z = None if found is None else found.image
        residual = None if found is None else found.residual
        record = dict(
            block=name,
            kind=block.kind,
            layer=block.layer,
            value_before=before,
            value_after=before,
            seconds=wall,
            solver_seconds=float(res.seconds),
            status=res.status,
            residual=residual,
            reported_residual=float(res.residual),
            iterations=int(res.iterations),
            converged=bool(res.converged),
        )
        if not usable:  # recorded mode (strict raised): the block keeps its value, stop
            self.blocks.append(record)
            raise Halt(name)
        self.cert.check_block(name, res, residual, capped=capped(self.backend, block, res))
        after = float(res.value)  # the backend's value; the descent check recomputes it
        if found is not None:
            after = found.value
            self.cert.check_descent(name, before, after, scale)
        record["value_after"] = after
        self.blocks.append(record)
        return Z, 0.0 if before is None else after - before, res.U, image_Z

    def over_columns(self, fn: Callable[..., Any], *arrays: Any) -> Any:
        """``fn(*arrays, comm)``, a figure over the batch's data points, on the backend's
        ``check_threads`` column shares (``column_threads.over_columns``)."""
        return over_columns(fn, *arrays, threads=self.threads, comm=self.comm)

    def _argmin_check(self, name, block, Z, current, slot):
        """The certificate's argmin check (finite, in the block's domain), read at once, or
        deferred to ``settle`` (``defer``): then True, unless Z is no array of the block's
        shape."""
        flag = argmin_usable(block, Z, current.shape) if self.defer else None
        if flag is None or flag is False:  # not deferred, or not even an array of the shape
            return self.cert.check_argmin(name, block, Z, current.shape, self.comm)
        self.pending.append(
            (name, block, Z, current, slot, flag, len(self.blocks), len(self.cert.violations))
        )
        return True

    def settle(self) -> None:
        """The deferred argmin checks, in one read (on ranks after one reduction: a block whose
        argmin is unusable on one rank fails on all), once the ranks' agreement on the round's
        reductions is read (``comm.verify``). Where one fails, the round goes back to where
        that block began (every block from it on keeps its start: the later ones were solved
        from an unusable point) and the block fails by name (strict: raises; recorded: the run
        halts after the round)."""
        pending, self.pending = self.pending, []
        if pending:
            xp = array_namespace(pending[0][2])
            usable = xp.stack([flag for *_, flag, _, _ in pending])
            if self.comm.P > 1:
                (usable,) = self.comm.reduce([usable], "min")
        self.comm.verify()
        if not pending or bool(xp.all(usable)):
            return
        first = next(i for i in range(len(pending)) if not bool(usable[i]))
        for _, _, _, current, (seq, i), *_ in reversed(pending[first:]):
            seq[i] = current
        name, block, Z, current, _, _, n_blocks, n_violations = pending[first]
        del self.blocks[n_blocks + 1 :]
        if n_blocks < len(self.blocks):  # (strict: its status may have raised before it)
            self.blocks[n_blocks]["value_after"] = self.blocks[n_blocks]["value_before"]
        del self.cert.violations[n_violations:]
        self.cert.check_argmin(name, block, Z, current.shape, self.comm)
        raise Halt(name)


def capped(backend: Backend, block: Block, res: BlockResult) -> bool:
    """Whether ``block`` stopped at the step cap its backend was configured with
    (``FastBackend(w_steps=..., x_steps=...)``: ``step_setting``), status ``"max_iter"``."""
    cap = backend.step_setting(block)[1]
    return cap is not None and res.status == "max_iter" and res.iterations == cap
