"""Certify a run's saved iterate, block by block, against the oracle: :func:`certify_run`.

A run's checkpoint holds the weights ``W_0 .. W_L``, the lifted variables ``X_1 .. X_L`` of its
last round (on that round's batch in Algorithm 2, on all the data in Algorithm 1) and the
proximal centres ``W0_l`` of the batched model (eq. (13)). At that point every block of the
lifted objective (eq. (7); the X- and W-subproblems of Sec. 4.5, ``blocks.py``) is built again
and handed to ``oracle.certify``, which re-solves it exactly and recomputes, from the saved
variable itself: the block's value there (the value the run reached), the oracle's optimum, a
certified lower bound on the block's optimal value, the gap between the two, and the KKT residual
of the run's point. This tells a method developer how far a solver's few steps leave each block
from its minimiser, at the run's own size (Algorithm 1: all the data; Algorithm 2: the batch).

What the gaps measure: a round solves the X-blocks first and the W-blocks after them, so at the
saved point each W-block was solved at the saved X (its gap is the W-solver's accuracy), while the
X-blocks were solved at the weights before the W-sweep: their gaps measure how far the saved
iterate is from each X-block's optimum at the new weights, not the X-solver's accuracy in its own
round (:data:`NOTE`). A run that recorded its blocks (``recorded_blocks.RecordingBackend``,
``fenchel-cvx train --record-blocks``) is certified with ``recorded=True`` at the inputs each
block's solver saw in the last round: every gap is then the solver's own accuracy
(:data:`RECORDED`).

The data is checked to be the run's (the checkpoint records its digest) before any solve, and
every solve runs in float64, whatever the run's dtype.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .arrays import Array

BLOCKS = ("all", "X", "W")
NOTE = (
    "X-blocks: at the saved point they are taken at the weights of the saved W-sweep, while the "
    "run solved them at the weights before it: their gap measures how far the saved iterate is "
    "from each X-block's optimum, not the X-solver's accuracy in its round. W-blocks: solved by "
    "the run at the saved X, their gap is the W-solver's accuracy."
)

RECORDED = (
    "Every block at the inputs its solver saw in the run's last round (recorded by "
    "--record-blocks): each gap is the solver's own accuracy."
)


@dataclass
class BlockFigures:
    """One block's line of a run's certificate (``oracle.certify`` at the saved point)."""

    block: str  # "X_2", "W_0", ...
    value: float  # the block objective at the run's point
    optimum: float  # at the oracle's argmin
    lower_bound: float | None  # certified: no point does better (None: no bound available)
    gap: float | None  # value - lower_bound: how far the run's point is from optimal, at most
    relative_gap: float | None  # gap / (1 + |lower_bound|)
    kkt_residual: float  # of the run's point (``blocks.kkt_residual``; 0 at the minimiser)
    bound: str  # how the lower bound was found: "strong convexity", "duality gap", "none"
    seconds: float  # the oracle's solve and the certificate's checks


@dataclass
class RunCertificate:
    """What :func:`certify_run` returns: one :class:`BlockFigures` a block, in the order of a
    round's sweeps (X_L .. X_1, then W_L .. W_0), and where they were taken."""

    run: str
    algorithm: int  # 1 or 2
    round: int  # the checkpoint's rounds done (the saved point is after this round)
    points: int  # the block's data points: all the data (Algorithm 1) or the batch
    blocks: list[BlockFigures] = field(default_factory=list)
    seconds: float = 0.0
    note: str = NOTE

    def to_dict(self) -> dict[str, Any]:
        """The certificate as JSON data."""
        return asdict(self)

    def table(self) -> str:
        """The certificate as a markdown table, with where it was taken and the note."""
        head = (
            f"{self.run}: Algorithm {self.algorithm}, after round {self.round}, "
            f"{self.points} points, {self.seconds:.2f} s"
        )
        rows = [
            "| block | run's value | oracle's optimum | lower bound | gap | relative gap | "
            "KKT residual | s |",
            "| --- | --- | --- | --- | --- | --- | --- | --- |",
        ]
        for b in self.blocks:
            rows.append(
                f"| {b.block} | {b.value:.8g} | {b.optimum:.8g} | {_g(b.lower_bound, '.8g')} | "
                f"{_g(b.gap, '.3g')} | {_g(b.relative_gap, '.3g')} | {b.kkt_residual:.3g} | "
                f"{b.seconds:.2f} |"
            )
        return "\n".join([head, "", *rows, "", self.note])


def _g(x: float | None, spec: str) -> str:
    return "none" if x is None else format(x, spec)


@dataclass
class SavedPoint:
    """A run's saved iterate in float64: the network at the saved weights, the data of its last
    round (``X0``, ``Y``), the lifted variables ``Xs`` and the proximal term (``gamma``, ``W0``)."""

    net: Any
    X0: np.ndarray
    Y: np.ndarray
    Xs: list[np.ndarray]
    gamma: list[float]
    W0: list[np.ndarray | None]
    algorithm: int
    round: int


def saved_point(checkpoint: str | Path, X0: Array, Y: Array) -> SavedPoint:
    """The saved iterate of the checkpoint ``checkpoint`` (a folder or its ``checkpoint.npz``)
    of a run on the data ``(X0, Y)``, as the run gave them to ``fit_bcd``: refused (ValueError)
    where the data is not the run's or the checkpoint holds no finished round."""
    from .checkpoints import load_checkpoint
    from .io import data_digest, network_from_config
    from .network import LiftedNetwork
    from .schedule import schedule

    arrays, meta = load_checkpoint(checkpoint)
    dtype = meta["config"]["dtype"]  # fit_bcd took the data in the network's dtype
    X0, Y = np.asarray(X0, dtype), np.asarray(Y, dtype)  # the values the run saw, no others
    if meta["settings"]["data"] != data_digest(X0, Y):
        raise ValueError(
            f"X0, Y are not the training data of the run of {str(checkpoint)!r} (its checkpoint "
            "records another digest): give the run's data, in the run's dtype"
        )
    done, cfg = meta["iteration"], meta["history"]["config"]
    if done == 0 or not meta["has_Xs"]:
        raise ValueError(f"checkpoint {str(checkpoint)!r} holds no finished round to certify")
    net = network_from_config(dict(meta["config"], dtype="float64"), LiftedNetwork, checkpoint)
    L = len(net.W)
    net.W = [np.asarray(arrays[f"W_{l}"], np.float64) for l in range(L)]
    steps = schedule(
        cfg["m"],
        cfg["batch_size"],
        cfg["epochs"],
        cfg["iterations"],
        cfg["alternations"],
        seed=cfg.get("batch_seed", net.seed),  # a history of before batch_seed: the net's seed
    )
    columns = steps[done - 1].columns
    X0, Y = np.asarray(X0, np.float64), np.asarray(Y, np.float64)
    if columns is not None:
        X0, Y = X0[:, columns], Y[:, columns]
    gamma = cfg["gamma"] if isinstance(cfg["gamma"], list) else [cfg["gamma"]] * L
    missing = [l for l in range(L) if gamma[l] and f"W0_{l}" not in arrays]
    if missing:
        raise ValueError(
            f"checkpoint {str(checkpoint)!r} holds no proximal centre W0_{missing[0]} for its "
            f"gamma {gamma[missing[0]]!r}: the W-block of eq. (13) cannot be built"
        )
    W0 = [np.asarray(arrays[f"W0_{l}"], np.float64) if gamma[l] else None for l in range(L)]
    Xs = [np.asarray(arrays[f"X_{l}"], np.float64) for l in range(1, L)]
    algorithm = 1 if cfg["batch_size"] is None else 2
    return SavedPoint(net, X0, Y, Xs, [float(g) for g in gamma], W0, algorithm, done)


def saved_blocks(point: SavedPoint, blocks: str = "all") -> list[tuple[str, Any, np.ndarray]]:
    """``[(name, block, the run's variable)]`` at the saved point, in a round's order: the
    X-blocks X_L .. X_1 (``blocks`` "all" or "X"), then the W-blocks W_L .. W_0 ("all", "W")."""
    from .blocks import w_block, x_block

    if blocks not in BLOCKS:
        raise ValueError(f"blocks must be one of {', '.join(BLOCKS)}, got {blocks!r}")
    net, L, X0, Y, Xs = point.net, len(point.net.W), point.X0, point.Y, point.Xs
    out: list[tuple[str, Any, np.ndarray]] = []
    if blocks != "W":  # each block built only where asked: an X-block forms its U_{l-1}
        out += [(f"X_{l}", x_block(net, X0, Y, Xs, l), Xs[l - 1]) for l in range(L - 1, 0, -1)]
    if blocks != "X":
        for l in range(L - 1, -1, -1):
            block = w_block(net, X0, Y, Xs, l, point.gamma[l], point.W0[l])
            out.append((f"W_{l}", block, net.W[l]))
    return out


def chosen(triples: list[tuple[str, Any, np.ndarray]], blocks: str) -> list:
    """The ``(name, block, Z)`` of ``triples`` that ``blocks`` ("all", "X", "W") names, in a
    round's order (X_L .. X_1, then W_L .. W_0)."""
    if blocks not in BLOCKS:
        raise ValueError(f"blocks must be one of {', '.join(BLOCKS)}, got {blocks!r}")

    def order(t):
        return (t[0][0] == "W", -int(t[0][2:]))

    return sorted([t for t in triples if blocks in ("all", t[0][0])], key=order)


def certify_blocks(
    triples: list[tuple[str, Any, np.ndarray]], backend: Any = None, progress: Any = None
) -> list[BlockFigures]:
    """``oracle.certify`` of every ``(name, block, Z)`` of ``triples`` by the oracle ``backend``
    (default ``OracleBackend(tol=1e-9)``); ``progress(name)``, where given, is called before
    each block."""
    from .oracle import OracleBackend, certify
    from .oracle.backend import beyond_reach

    far = [f"{name}: {why}" for name, block, _ in triples if (why := beyond_reach(block))]
    if far:
        raise ValueError(
            "blocks beyond the oracle's reach (certify the others: --blocks, blocks= W or X): "
            + "; ".join(far)
        )
    backend = OracleBackend(tol=1e-9) if backend is None else backend
    out = []
    for name, block, Z in triples:
        if progress is not None:
            progress(name)
        t0 = time.perf_counter()
        cert = certify(block, Z, backend)
        out.append(
            BlockFigures(
                name,
                cert.objective,
                cert.optimum,
                cert.lower_bound,
                cert.gap,
                cert.relative_gap,
                cert.kkt_residual,
                cert.bound,
                time.perf_counter() - t0,
            )
        )
    return out


def certify_run(
    run: str | Path,
    X0: Array | None = None,
    Y: Array | None = None,
    *,
    blocks: str = "all",
    workers: int = 1,
    tol: float = 1e-9,
    data_dir: str | Path | None = None,
    progress: Any = None,
    recorded: bool = False,
) -> RunCertificate:
    """Certify every block of a run at its saved iterate (see the module docstring).

    ``run``: the folder of a ``fenchel-cvx train`` run (its data is read as the run read it,
    from ``data_dir`` or the run's folder of files) or any ``fit_bcd(checkpoint=...)`` folder,
    then with the run's training data ``X0``, ``Y`` as given to ``fit_bcd``. ``blocks``: "all",
    "X" or "W"; ``workers``: Dask workers for the oracle's independent pieces (1: in this
    process); ``tol``: the oracle's KKT tolerance; ``recorded``: the blocks the run recorded
    (``run/blocks.npz``, :data:`RECORDED`) instead of those of its saved point (no data read).

    >>> import numpy as np, tempfile
    >>> from fenchel_cvx import LiftedNetwork, fit_bcd
    >>> rng = np.random.default_rng(0)
    >>> X0, Y = rng.random((4, 30)), np.eye(2)[:, rng.integers(0, 2, 30)]
    >>> folder = tempfile.mkdtemp()
    >>> net = LiftedNetwork([4, 5, 2], seed=0)
    >>> _ = fit_bcd(net, X0, Y, backend="fast", iterations=2, checkpoint=folder)
    >>> cert = certify_run(folder, X0, Y)
    >>> [b.block for b in cert.blocks], cert.algorithm, cert.round, cert.points
    (['X_1', 'W_1', 'W_0'], 1, 2, 30)
    >>> all(b.gap >= -1e-9 and b.lower_bound <= b.optimum + 1e-12 for b in cert.blocks)
    True
    """
    from .oracle import OracleBackend
    from .validation import COUNT, TOL, check

    workers, tol = check("workers", workers, COUNT), check("tol", tol, TOL)
    if blocks not in BLOCKS:
        raise ValueError(f"blocks must be one of {', '.join(BLOCKS)}, got {blocks!r}")
    run = Path(run)
    if (X0 is None) != (Y is None):
        raise ValueError("X0 and Y go together: give both (the run's data) or neither")
    t0 = time.perf_counter()
    if recorded:
        triples, algorithm, done, points = _recorded(run, blocks)
    else:
        if X0 is None:
            X0, Y = run_data(run, data_dir)
        point = saved_point(run, X0, Y)
        triples, algorithm, done = saved_blocks(point, blocks), point.algorithm, point.round
        points = point.X0.shape[1]
    backend = OracleBackend(tol=tol, n_jobs=workers)
    try:
        figures = certify_blocks(triples, backend, progress)
    finally:
        backend.close()
    return RunCertificate(
        str(run),
        algorithm,
        done,
        int(points),
        figures,
        time.perf_counter() - t0,
        RECORDED if recorded else NOTE,
    )


def _recorded(run: Path, blocks: str) -> tuple[list, int, int, int]:
    """The recorded blocks of the run in the folder ``run`` (``blocks.npz``) that ``blocks``
    names, the run's algorithm and rounds done (its checkpoint's meta) and the blocks' data
    points (the columns of an X-block's variable)."""
    from .checkpoints import checkpoint_meta
    from .recorded_blocks import FILE, load_recorded

    if not (run / FILE).is_file():
        raise ValueError(
            f"run {str(run)!r} holds no {FILE}: record a run's blocks with "
            "'fenchel-cvx train --record-blocks' (RecordingBackend)"
        )
    meta = checkpoint_meta(run)
    triples = load_recorded(run / FILE)
    points = max(Z.shape[1] if name[0] == "X" else block.Xt.shape[1] for name, block, Z in triples)
    algorithm = 1 if meta["history"]["config"].get("batch_size") is None else 2
    return chosen(triples, blocks), algorithm, meta["iteration"], points


def run_data(run: Path, data_dir: str | Path | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The training data ``(X0, Y)`` of the ``fenchel-cvx train`` run in the folder ``run``, read
    as the run read it (its ``run.json``: data set, ``--train-size``, dtype, seed), from
    ``data_dir`` where given, else the run's folder of files."""
    import argparse

    from .cli.data_flags import load
    from .cli.run_folder import _run_args
    from .datasets import one_hot

    saved = _run_args(run) if run.is_dir() else None
    if saved is None:
        raise ValueError(
            f"run must be the folder of a 'fenchel-cvx train' run (holding its run.json), got "
            f"{str(run)!r}; for a fit_bcd checkpoint give its training data X0, Y"
        )
    args = argparse.Namespace(**saved)
    args.data_dir = Path(data_dir) if data_dir is not None else saved.get("data_dir")
    args.download = args.verify = False
    data = load(args)
    n = saved.get("train_size")
    X, y = data.X_train[:, :n], data.y_train[:n]
    return X.astype(saved.get("dtype", "float64"), copy=False), one_hot(y, data.n_classes)


def write_certificate(path: str | Path, cert: RunCertificate) -> Path:
    """``cert`` as JSON at ``path``, written atomically (``io.write_json``)."""
    from .io import write_json

    return write_json(Path(path), json.loads(json.dumps(cert.to_dict())))


__all__ = [
    "certify_run",
    "certify_blocks",
    "RunCertificate",
    "BlockFigures",
    "saved_point",
    "saved_blocks",
]
