"""The W-sweep's small blocks split by layer over the ranks, the others by data points.

The paper's Sec. 4.5: with the X fixed, the W-blocks (eqs. (17)-(20)) "can be solved in
parallel across layers and data points". On P ranks every block is split by data points
(``reduce.py``): each rank holds its share of the batch's columns, and every sum over them is
a collective. A W-block whose X~ has one column per data point (a dense layer's; a
convolution's has one per position of its filters) is cheap to gather, and its shares save
little: its steps in parameter space and its Gram factor are every rank's (docs page
"Training in parallel"). Where the top layers of a network (L, L-1, ...) hold two or more such
blocks whose Gram factor serves one solve (``gram_reuse`` 1), an unchecked round on ranks
solves each of them whole on one rank (:func:`owners`: the largest first, each to the rank with
the least work so far, rank 0 last), as one process solves it, from the same arrays in the same
order. The ranks meet twice for them:

- before the first, :meth:`LayerSplit.gather`: every rank sends the columns of X~_l, of the
  block's targets (X_{l+1}, or Y) and of the start's image U_l for each block another rank
  solves (one collective);
- after the last, :meth:`LayerSplit.exchange`: every rank sends the W_l it solved and what its
  solve reported (two collectives); then every rank checks and records each of these blocks,
  in the sweep's order, as its own (``CheckedSolves.account``: the argmin's checks are the
  rank's own, from the W it received). A solve that raised (an error other than a recorded
  ``SolverError``) raises on every rank there, so that the ranks end the round alike.

In between each rank solves its blocks alone, while the others solve theirs. Checked rounds
split every block by data points: the certificate's figures are the whole block's on every
rank.

The X-sweep's blocks (eqs. (14)-(16)) are split by data points, but each one's step size needs
a bound of its map's norm, ``||A(W_l, .)||_2^2``, which depends on W_l alone and would be every
rank's work (an eigenproblem per layer: 0.1-1.8 ms each on LeNet-5). :func:`shared_norms`
gives each rank every P-th of them (of X_L, ..., X_1) and adds them up in one collective (the
others' zeros: exact), before the sweep's first block; each block then takes its bound from
its map (:class:`KnownNorm`), the number one process computes.
"""

from __future__ import annotations

import contextlib
import json
import math
import time
from collections.abc import Iterator
from dataclasses import replace
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import numpy as np
from array_api_compat import array_namespace

from .arrays import Array, cheap_reads
from .blocks import BlockResult
from .errors import SolverError
from .layers import LinearMap
from .reduce import LOCAL, Comm

if TYPE_CHECKING:
    from .network import LiftedNetwork

__all__ = ["MAX_ROWS", "KnownNorm", "LayerSplit", "alone", "owners", "shared_norms"]

#: the most rows of X~ (the columns of W) of a W-block solved by layer: its factor and its
#: columns, gathered, stay small (LeNet-5's W_2: 401)
MAX_ROWS = 512


def owners(net: LiftedNetwork, backend: Any, P: int, xp: Any = np) -> dict[int, int]:
    """``{layer: rank}``: the W-blocks an unchecked round on ``P`` ranks solves whole, each on
    one rank (module doc): the top layers whose X~ has a column per data point and at most
    ``MAX_ROWS`` rows, and whose Gram factor serves one solve, where there are two or more of
    them; the largest (rows times the square of the columns of W: its factor and its steps)
    first, each to the rank with the least work so far (rank 0, which also records and prints,
    last among equals). Empty on one rank, for a backend that does not train on ranks, and
    for arrays off the host (``xp``: the data's library; ``arrays.cheap_reads``): there the
    split by data points reads nothing back, and the reports this split exchanges would.

    >>> from fenchel_cvx import lenet5
    >>> from fenchel_cvx.fast import FastBackend
    >>> net = lenet5((1, 28, 28), 10)
    >>> owners(net, FastBackend(gram_reuse=(40, 40, 1, 1, 1)), 2)   # W_2 120 x 401, W_3, W_4
    {2: 1, 3: 0, 4: 0}
    >>> owners(net, FastBackend(), 3), owners(net, FastBackend(), 1)
    ({2: 2, 3: 1, 4: 0}, {})
    >>> owners(net, FastBackend(gram_reuse=40), 2)   # a factor that serves 40 solves: by columns
    {}
    """
    if P < 2 or not hasattr(backend, "reuse_of") or not cheap_reads(xp):
        return {}
    small = []
    for l in range(net.n_hidden, 0, -1):
        A = net.layers[l]
        rows, per_point = A.weight_shape[1], A.n_out == A.weight_shape[0]  # (else: a conv's)
        if not per_point or rows > MAX_ROWS or backend.reuse_of(SimpleNamespace(layer=l)) != 1:
            break
        small.append(l)
    if len(small) < 2:
        return {}
    cost = {l: math.prod(net.layers[l].weight_shape) * net.layers[l].weight_shape[1] for l in small}
    load, plan = [0] * P, {}
    for l in sorted(small, key=lambda l: (-cost[l], l)):
        r = min(range(P - 1, -1, -1), key=lambda r: load[r])
        plan[l], load[r] = r, load[r] + cost[l]
    return dict(sorted(plan.items()))


@contextlib.contextmanager
def alone(backend: Any) -> Iterator[None]:
    """The backend's solves in this process alone (a block whole on one rank): its ``comm``
    set to ``LOCAL`` for the time being."""
    comm, backend.comm = backend.comm, LOCAL
    try:
        yield
    finally:
        backend.comm = comm


class KnownNorm(LinearMap):
    """The map ``A`` of ``W`` (every attribute ``A``'s) whose ``norm2_bound`` at ``W`` is at
    hand, ``bound`` (another rank computed it: :func:`shared_norms`); at any other W it
    computes its own. (A certified bound bounds at every ``max_dim``.)"""

    def __init__(self, A: LinearMap, W: Array, bound: float) -> None:
        self.__dict__.update(vars(A))
        self.known = (W, bound)

    def norm2_bound(self, W: Array, max_dim: int) -> float | Array | None:
        known, bound = self.known
        return bound if W is known else super().norm2_bound(W, max_dim)


def shared_norms(net: LiftedNetwork, backend: Any, comm: Comm) -> dict[int, KnownNorm]:
    """``{l: X_l's map, its norm bound at hand}`` for the X-sweep of a round on the ranks of
    ``comm`` (module doc): each rank computes the bounds of every P-th block of the sweep
    (``backend.map_norm2``; NaN where the backend takes an estimate instead), and one sum over
    the ranks, of the others' zeros, gives every rank all of them. Empty in one process, with
    fewer than two X-blocks, for a backend that takes no bound and for arrays other than
    NumPy's (``arrays.cheap_reads``: a bound is a 0-d array there, read by nobody). A bound
    that fails to compute (an eigensolver's error on a W that is not finite) is sent as NaN:
    each rank then computes its own in the block, which fails there as in one process.

    >>> from fenchel_cvx import lenet5
    >>> from fenchel_cvx.fast import FastBackend
    >>> from fenchel_cvx.reduce import SimulatedComm
    >>> net, fast = lenet5((1, 28, 28), 10), FastBackend()
    >>> shards = SimulatedComm(2).run(lambda comm: shared_norms(net, fast, comm))
    >>> sorted(shards[0]) == sorted(shards[1]) == [1, 2, 3, 4]
    True
    >>> all(maps[l].known[1] == fast.map_norm2(net.layers[l], net.W[l])
    ...     for maps in shards for l in maps)   # the one process's bounds, on both shards
    True
    """
    bound = getattr(backend, "map_norm2", None)
    L = net.n_hidden
    if comm.P < 2 or L < 2 or bound is None or not cheap_reads(array_namespace(net.W[0])):
        return {}
    sweep = list(range(L, 0, -1))  # X_L, ..., X_1
    mine = [math.nan] * L
    for i, l in enumerate(sweep):
        if i % comm.P != comm.rank:
            mine[i] = 0.0
            continue
        with contextlib.suppress(ValueError, ArithmeticError):  # (LinAlgError is a ValueError)
            b = bound(net.layers[l], net.W[l])
            mine[i] = math.nan if b is None else float(b)
    bounds = [float(b) for b in comm.reduce(mine, "sum")]
    return {
        l: KnownNorm(net.layers[l], net.W[l], b) for l, b in zip(sweep, bounds) if math.isfinite(b)
    }


class LayerSplit:
    """The blocks of ``plan`` (:func:`owners`) in one unchecked round on the ranks of
    ``comm`` (module doc): :meth:`gather` their columns, :meth:`solve` this rank's,
    :meth:`exchange` the results."""

    def __init__(self, plan: dict[int, int], comm: Comm) -> None:
        self.plan, self.comm = plan, comm
        self.shares: dict[int, tuple[Any, Any]] = {}  # every block's share: (block, current W)
        self.whole: dict[int, tuple[Any, Any]] = {}  # this rank's blocks whole: (block, image)
        # this rank's solves: (result or exception, seconds, strict)
        self.done: dict[int, tuple[Any, float, bool]] = {}

    def gather(self, shares: dict[int, tuple[Any, Any, Any]]) -> None:
        """The blocks this rank solves, whole, from this rank's ``shares`` ``{layer: (block,
        the start's image as rows or None, current W)}`` and every other rank's: their
        columns in rank order, the batch's (``reduce.share``)."""
        self.shares = {l: (block, W) for l, (block, _, W) in shares.items()}
        me = self.comm.rank
        parts = {l: _parts(block, rows) for l, (block, rows, _) in shares.items()}
        xp = array_namespace(*parts[max(parts)])
        every = self.comm.all_gather(_packed(xp, parts, self._sent_by(me)))
        for l in sorted(parts):
            if self.plan[l] != me:
                continue
            by_rank = [
                parts[l] if r == me else _unpacked(got, parts, self._sent_by(r), l)
                for r, got in enumerate(every)
            ]
            joined = [xp.concat(columns, axis=1) for columns in zip(*by_rank)]
            block = shares[l][0]
            n = len(block.column_fields)
            whole = replace(block, **dict(zip(block.column_fields, joined[:n])))
            self.whole[l] = (whole, joined[n] if len(joined) > n else None)

    def _raise(self, l: int, report: dict[str, Any]) -> None:
        """What W_l's solve raised on its rank: there the exception itself, on every other rank
        the ``SolverError`` it told (strict mode) or an error naming the rank and the
        exception."""
        owner = self.plan[l]
        if owner == self.comm.rank:
            raise self.done[l][0]
        if report["error"] is not None:
            raise _result(report, None)
        raise RuntimeError(
            f"W_{l}'s block, solved whole on rank {owner}, raised {report['kind']}: "
            f"{report['text']}"
        )

    def _sent_by(self, r: int) -> list[int]:
        return [l for l in sorted(self.plan) if self.plan[l] != r]

    def solve(self, r: Any, l: int) -> None:
        """W_l's block whole, from the current W_l, where this rank solves it (else nothing:
        another rank does); ``r`` the round (``rounds.Round``)."""
        if self.plan[l] != self.comm.rank:
            return
        block, image = self.whole[l]
        images = dict(image=image) if r.backend.images else {}
        t0 = time.perf_counter()
        res: BlockResult | Exception
        try:
            with alone(r.backend):
                res = r.backend.solve(block, start=r.net.W[l], **images)
        except Exception as err:  # (told to every rank, raised on every rank: ``exchange``)
            res = err
        self.done[l] = (res, time.perf_counter() - t0, bool(r.cert.strict))

    def exchange(self, r: Any) -> None:
        """Every rank's solves to every rank; then each block, in the sweep's order, checked
        and recorded from what its rank sent (``CheckedSolves.account``), its W put in place."""
        xp = array_namespace(r.net.W[0])
        done = self.done
        solved = [l for l in sorted(done, reverse=True) if not isinstance(done[l][0], Exception)]
        flat = [xp.reshape(self.done[l][0].argmin, (-1,)) for l in solved]
        Ws = self.comm.all_gather(xp.concat(flat) if flat else xp.zeros(0, dtype=r.net.W[0].dtype))
        reports = json.dumps({str(l): _report(*self.done[l]) for l in self.done}).encode()
        told = self.comm.all_gather(np.frombuffer(reports, np.uint8))
        told = [json.loads(bytes(np.asarray(t))) for t in told]
        for l in sorted(self.plan, reverse=True):  # a solve that raised raises on every rank
            if told[self.plan[l]][str(l)]["raises"]:
                self._raise(l, told[self.plan[l]][str(l)])
        for l in sorted(self.plan, reverse=True):
            owner, (block, current) = self.plan[l], self.shares[l]
            report = told[owner][str(l)]
            res = _result(report, _argmin(Ws[owner], told[owner], self.shares, l))
            slot, wall = (r.net.W, l), report["seconds"]
            r.net.W[l], _, _, _ = r.account(res, wall, f"W_{l}", block, current, slot)
            r.pre.put(l, None)


def _parts(block: Any, rows: Any) -> list:
    """A block's arrays with a column per data point: its column fields, then the start's
    image (as rows) where at hand."""
    return [getattr(block, f) for f in block.column_fields] + ([] if rows is None else [rows])


def _packed(xp: Any, parts: dict[int, list], layers: list[int]) -> Any:
    """The arrays of ``layers`` (``parts``: each layer's), one on top of another."""
    arrays = [a for l in layers for a in parts[l]]
    return xp.concat(arrays, axis=0) if arrays else parts[max(parts)][0][:0]


def _unpacked(got: Any, parts: dict[int, list], layers: list[int], l: int) -> list:
    """Layer ``l``'s arrays in ``got``, a rank's ``_packed`` of ``layers`` (each array's rows as
    in this rank's ``parts``: every rank's share has as many)."""
    at = 0
    for k in layers:
        sizes = [a.shape[0] for a in parts[k]]
        if k == l:
            ends = [at + sum(sizes[: i + 1]) for i in range(len(sizes))]
            return [got[e - n : e] for e, n in zip(ends, sizes)]
        at += sum(sizes)
    raise KeyError(f"layer {l} is not among the layers sent: {layers}")


def _report(res: Any, seconds: float, strict: bool) -> dict[str, Any]:
    """What a rank tells the others of a solve: the result's figures, or the exception's (a
    ``SolverError`` is recorded where the certificate is not strict; anything else raises)."""
    if isinstance(res, SolverError):
        told = dict(error=[res.block, res.layer, res.status, str(res)], raises=strict)
        return dict(status=None, **told, kind="SolverError", text=str(res), seconds=seconds)
    if isinstance(res, Exception):
        told = dict(error=None, raises=True, kind=type(res).__name__, text=str(res))
        return dict(status=None, **told, seconds=seconds)
    return dict(
        status=res.status, value=float(res.value), residual=float(res.residual),
        solver_seconds=float(res.seconds), iterations=int(res.iterations),
        converged=bool(res.converged), seconds=seconds, raises=False,
    )  # fmt: skip


def _argmin(W: Any, told: dict[str, Any], shares: dict[int, tuple[Any, Any]], l: int) -> Any:
    """Layer ``l``'s W in ``W``, a rank's W's flattened one after another in the sweep's order
    (``told``: its reports; none for a failed solve); None where its solve failed."""
    at = 0
    for k in sorted(map(int, told), reverse=True):
        current, failed = shares[k][1], told[str(k)]["status"] is None
        n = math.prod(current.shape)
        if k == l:
            xp = array_namespace(current)
            return None if failed else xp.reshape(W[at : at + n], current.shape)
        at += 0 if failed else n
    raise KeyError(f"no report of layer {l}")


def _result(report: dict[str, Any], argmin: Any) -> Any:
    """The ``BlockResult`` with ``argmin``, or the ``SolverError``, that a rank's ``report``
    tells."""
    if report["status"] is None:
        kind, layer, status, text = report["error"]
        err = SolverError(kind, layer, status)
        err.args = (text,)
        return err
    return BlockResult(
        argmin, report["value"], report["status"], report["residual"],
        seconds=report["solver_seconds"], iterations=report["iterations"],
        converged=report["converged"],
    )  # fmt: skip
