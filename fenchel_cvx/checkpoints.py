"""Checkpoints and resume of a BCD run (Algorithms 1 and 2 of the paper, Sec. 4.5).

A checkpoint (``fit_bcd(checkpoint=DIR)``) is ``DIR/checkpoint.npz``, written atomically by
``io.write_npz``: the network's arrays ``W_0 .. W_L``, the run's state (``X_1 .. X_L`` of the
current batch, the proximal centre ``W0_l`` of eq. (13), with ``momentum`` the weights before
the last extrapolation ``W_prev_l``, and where the next round takes it the first layer's
pre-activation ``U_0`` with ``meta.carried_steps``, ``pre_activations.py``) and ``meta`` (format
``"fenchel_cvx.BCDCheckpoint/1"``): the network's config, the position in the schedule (rounds
done), the history so far, a digest of the training data and the settings of the run
(``schedule.BCDState``).

``fit_bcd(resume=DIR)`` reads it through the checked reader (``files.py``: every array's shape
and dtype against the config, finiteness, a round counter matched by a history of as many
rounds) and refuses a checkpoint of another run: other data, network or settings (the
history's config, the backend's ``settings()`` among them; a checkpoint written before those
were recorded is taken as this run's). The schedule being a pure function of the network's
seed, the resumed run ends bit-identical to the same run uninterrupted.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from .errors import FileFormatError
from .files import NpzFile
from .history import History
from .io import network_config, network_from_config, same_network, write_npz
from .network import LiftedNetwork
from .pre_activations import Image
from .schedule import BCDState, Step
from .schemas import CHECKPOINT_META

CHECKPOINT_FORMAT = "fenchel_cvx.BCDCheckpoint/1"
CHECKPOINT_FILE = "checkpoint.npz"


def checkpoint_path(directory: str | os.PathLike[str]) -> Path:
    """The checkpoint file of the folder ``directory``."""
    return Path(directory) / CHECKPOINT_FILE


def save_checkpoint(
    directory: str | os.PathLike[str], net: LiftedNetwork, state: BCDState, settings: dict[str, Any]
) -> Path:
    """Write the state of a run (``schedule.BCDState``) to ``directory/checkpoint.npz``."""
    from . import __version__

    arrays = {f"W_{l}": W for l, W in enumerate(state.W)}
    arrays.update({f"X_{l + 1}": X for l, X in enumerate(state.Xs or [])})
    arrays.update({f"W0_{l}": W for l, W in enumerate(state.W0 or []) if W is not None})
    arrays.update({f"W_prev_{l}": W for l, W in enumerate(state.W_prev or [])})
    if state.carried is not None:
        arrays["U_0"] = state.carried.U
    meta = dict(
        format=CHECKPOINT_FORMAT,
        version=__version__,
        config=network_config(net),
        iteration=state.iteration,
        has_Xs=state.Xs is not None,
        carried_steps=None if state.carried is None else state.carried.steps,
        history=state.history.to_dict(),
        settings=settings,
    )
    return write_npz(checkpoint_path(directory), arrays, meta)


def load_checkpoint(
    path: str | os.PathLike[str],
) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """``(arrays, meta)`` of a checkpoint: ``path`` is its folder or its ``.npz`` file. Checked
    before use: the meta's fields, their types and ranges (``schemas.CHECKPOINT_META``: every
    record of its history with its certificate), the network config (``network_from_config``),
    every array's shape and dtype against it and its finiteness, and a round counter
    ``iteration``, an integer >= 0 matched by a history of as many rounds. (That the counter is
    within the run's schedule, and the data and settings those of the run, ``restore`` checks.)"""
    path = Path(path)
    with NpzFile(checkpoint_path(path) if path.is_dir() else path, "checkpoint (fit_bcd)") as f:
        meta = f.meta(CHECKPOINT_FORMAT)
        _check_checkpoint_meta(f.path, meta)
        net = network_from_config(meta["config"], LiftedNetwork, f.path, "meta.config")
        names = _checkpoint_arrays(f, net, meta["has_Xs"], meta.get("carried_steps"))
        f.require(names | {"meta"})
        shapes = _checkpoint_shapes(f, net, names)
        arrays = {name: f.array(name, shape, net.W[0].dtype) for name, shape in shapes.items()}
    return arrays, meta


def _checkpoint_shapes(f, net, names) -> dict:
    """``{name: expected shape}`` of the arrays ``names`` of the checkpoint ``f``, once every
    one's header shows that shape and ``net``'s dtype (``NpzFile.check_array``) and the lifted
    variables (``X_l``, ``U_0``) show the same number of columns (one batch), before any of them
    is read: the headers' bytes passed the read budget when the file was opened."""
    shapes: dict = {}
    columns = None
    for name in sorted(names):
        prefix, _, l = name.rpartition("_")
        if prefix in ("X", "U"):  # X_l, U_0: a layer's size by the batch's columns
            shape = (net.layer_sizes[int(l) + (prefix == "U")], columns)
            f.check_array(name, shape, net.W[0].dtype)
            columns = f.headers[name][0][1] if columns is None else columns
        else:
            shape = net.W[int(l)].shape
            f.check_array(name, shape, net.W[0].dtype)
        shapes[name] = shape
    return shapes


def checkpoint_meta(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The checked meta of a checkpoint (``path``: its folder or its ``.npz`` file) without
    reading its arrays: its fields and their types, and a history of ``iteration`` rounds."""
    path = Path(path)
    with NpzFile(checkpoint_path(path) if path.is_dir() else path, "checkpoint (fit_bcd)") as f:
        meta = f.meta(CHECKPOINT_FORMAT)
        _check_checkpoint_meta(f.path, meta)
    return meta


def _checkpoint_arrays(f, net, has_Xs, carried_steps) -> set:
    """The arrays a checkpoint of ``net`` holds: ``W_l``; ``X_1 .. X_L`` where it says it has
    them, ``U_0`` where it says it carries it (``meta.carried_steps``); ``W0_l`` and
    ``W_prev_l`` of the layers (all or none) the file has them for."""
    L = len(net.W)
    names = {f"W_{l}" for l in range(L)}
    names |= {f"X_{l}" for l in range(1, net.n_hidden + 1)} if has_Xs else set()
    names |= {"U_0"} if carried_steps is not None else set()
    names |= {f"W0_{l}" for l in range(L) if f"W0_{l}" in f.headers}
    if any(f"W_prev_{l}" in f.headers for l in range(L)):
        names |= {f"W_prev_{l}" for l in range(L)}
    return names


def _check_checkpoint_meta(path, meta) -> None:
    """The fields of a checkpoint's meta (``schemas.CHECKPOINT_META``: their types and ranges,
    and a history whose every record holds the certificate that a resumed run's summary and
    plots read), and a history of ``iteration`` rounds."""
    CHECKPOINT_META.check(path, "meta", meta)
    records = meta["history"]["records"]
    rounds = [r.get("iteration") if isinstance(r, dict) else None for r in records]
    if len(rounds) != meta["iteration"] or rounds != list(range(1, len(rounds) + 1)):
        raise FileFormatError(
            path,
            "meta.history.records",
            f"rounds 1..{meta['iteration']} (meta.iteration)",
            f"{len(records)} records, rounds {rounds[:3]}{'...' if len(rounds) > 3 else ''}",
        )


def resume_file(resume: str | os.PathLike[str]) -> Path:
    """``fit_bcd``'s ``resume``: a checkpoint file, or a folder holding ``checkpoint.npz``; a
    ValueError naming ``resume`` where it is neither."""
    path = Path(resume)
    file = checkpoint_path(path) if path.is_dir() else path
    if not file.is_file():
        raise ValueError(
            f"resume must be a checkpoint file or a folder holding "
            f"checkpoint.npz, got {str(resume)!r}"
        )
    return file


def _differences(old, new, prefix=""):
    """``[(name, new value, old value)]`` where two configs differ, entry by entry of the
    entries that are dicts on both sides (``backend_settings.w_steps``)."""
    out = []
    for k in sorted(set(old) | set(new)):
        o, n = old.get(k), new.get(k)
        if isinstance(o, dict) and isinstance(n, dict):
            out += _differences(o, n, f"{prefix}{k}.")
        elif o != n:
            out.append((prefix + k, n, o))
    return out


def restore(
    net: LiftedNetwork,
    saved: tuple[dict[str, np.ndarray], dict[str, Any]],
    config: dict[str, Any],
    digest: str | None,
    xp: ModuleType,
    steps: Sequence[Step],
    dev: object = None,
) -> BCDState:
    """The ``BCDState`` of a checkpoint (``load_checkpoint`` checked its structure), after
    checking it belongs to this run: same data, settings and network, a round counter within
    the run's schedule ``steps`` and lifted variables of the last round's batch size; its
    arrays in the data's library ``xp``, on the data's device ``dev``."""
    arrays, meta = saved
    if meta["settings"]["data"] != digest:
        raise ValueError("resume: the checkpoint was written for other training data (X0, Y)")
    done = meta["iteration"]
    if done > len(steps):
        raise ValueError(
            f"resume: the checkpoint's round counter (meta.iteration) is {done}, "
            f"past the {len(steps)} rounds of this run's schedule"
        )
    last = steps[done - 1].columns if done else None
    m = config["m"] if last is None else len(last)
    bad = [k for k, A in arrays.items() if k[:2] in ("X_", "U_") and A.shape[1] != m]
    if bad:
        raise ValueError(
            f"resume: the checkpoint's {bad[0]} has {arrays[bad[0]].shape[1]} "
            f"columns, the batch of its round {done} {m}"
        )
    # a run given W_prev (momentum_carried) is resumed without it: the checkpoint holds its own
    old = {
        k: v
        for k, v in meta["history"]["config"].items()
        if k not in ("initial", "momentum_carried")
    }
    new = {k: v for k, v in History(config).config.items() if k != "momentum_carried"}
    old.setdefault("momentum", [0.0] * len(new["momentum"]))  # written before momentum existed
    # a checkpoint whose history records no backend settings: taken as this run's
    old.setdefault("backend_settings", new["backend_settings"])
    old.setdefault("x_sweep", "backward")  # written before the X-sweep's order was an option
    diff = _differences(old, new)
    if diff or not same_network(meta["config"], network_config(net)):
        what = ", ".join(f"{k}={n!r} (checkpoint: {o!r})" for k, n, o in diff)
        raise ValueError(
            f"resume: the checkpoint was written by another run: {what or 'the network differs'}"
        )

    def put(A):  # a saved NumPy array, in the data's library and on its device
        return xp.asarray(A, device=dev)

    L = len(net.W)
    Xs = [put(arrays[f"X_{l}"]) for l in range(1, net.n_hidden + 1)] if meta["has_Xs"] else None
    W0 = [put(arrays[f"W0_{l}"]) if f"W0_{l}" in arrays else None for l in range(L)]
    W_prev = [put(arrays[f"W_prev_{l}"]) for l in range(L)] if "W_prev_0" in arrays else None
    U_0 = arrays.get("U_0")
    carried = None if U_0 is None else Image(put(U_0), meta["carried_steps"])
    return BCDState(
        [put(arrays[f"W_{l}"]) for l in range(L)],
        History.from_dict(meta["history"]),
        Xs,
        W0,
        meta["iteration"],
        W_prev,
        carried,
    )
