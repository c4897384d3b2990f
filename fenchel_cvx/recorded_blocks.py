"""Each block a run solves, recorded with the solver's argmin, to certify the solver later.

``RecordingBackend(backend, net)`` solves with ``backend`` and keeps, for every block of the
network (X_1 .. X_L, W_0 .. W_L: the X- and W-subproblems of Sec. 4.5 of the paper), the data
of the last solve of that block and the argmin the solver returned, as float64 NumPy copies;
``save(path)`` writes them (``blocks.npz``, format ``fenchel_cvx.RecordedBlocks/1``) and
:func:`load_recorded` reads them back through the checked reader. Certified there
(``run_certificate.certify_recorded``), each block's gap is the solver's own accuracy in the
round that solved it: unlike a checkpoint's saved point, every block is taken at the inputs
the solver saw. ``fenchel-cvx train --record-blocks`` records a run's last round this way and
``fenchel-cvx certify RUN --recorded`` certifies it.

The backend's name, settings and step caps are the wrapped backend's, so a run's history and
checkpoints are those of the same run without recording.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from . import blocks as _blocks
from .arrays import Array, to_numpy
from .backends import BackendDefaults, get_backend
from .errors import FileFormatError

if TYPE_CHECKING:
    from .network import LiftedNetwork

FORMAT = "fenchel_cvx.RecordedBlocks/1"
FILE = "blocks.npz"
#: the block classes a file may name, by class name
CLASSES = {c.__name__: c for c in (_blocks.XHidden, _blocks.XLast, _blocks.WHidden, _blocks.WLast)}


def block_name(block: _blocks.Block) -> str:
    """``X_l`` or ``W_l``: the block's variable."""
    return f"{'X' if isinstance(block, _blocks.XBlock) else 'W'}_{block.layer}"


class RecordingBackend(BackendDefaults):
    """``backend`` (a name or an object, as ``fit_bcd`` takes it), every solve of which leaves
    the block's data and the returned argmin in :attr:`recorded` (the last solve per block)."""

    def __init__(self, backend: Any, net: Any, **kwargs: Any) -> None:
        self.inner = get_backend(backend, **kwargs)
        self.net = net
        self.recorded: dict[str, tuple[dict, dict]] = {}
        self.name, self.tol, self.threads = self.inner.name, self.inner.tol, self.inner.threads
        self.images = self.inner.images  # the driver's images go through to the solver

    def solve(
        self, block: _blocks.Block, start: Array | None = None, **images: object
    ) -> _blocks.BlockResult:
        res = self.inner.solve(block, start=start, **images)
        entry, arrays = self._entry(block)  # copies: later solves may reuse the arrays
        arrays["argmin"] = to_numpy(res.argmin).astype(np.float64)
        self.recorded[entry["name"]] = (entry, arrays)
        return res

    def check_network(self, net: LiftedNetwork) -> None:
        self.inner.check_network(net)

    def step_setting(self, block: _blocks.Block) -> tuple[str, int | None]:
        return self.inner.step_setting(block)

    def settings(self) -> dict:
        return self.inner.settings()

    def forget(self) -> None:
        self.inner.forget()

    def on_compile(self, callback: Callable[[str | None], object]) -> Callable[[], None]:
        return self.inner.on_compile(callback)

    def save(self, path: str | Path) -> Path:
        """The recorded blocks at ``path`` (written atomically; :func:`load_recorded` reads it)."""
        from .io import network_config, write_npz

        arrays = {
            f"{name}.{k}": A
            for name, (_, block_arrays) in self.recorded.items()
            for k, A in block_arrays.items()
        }
        entries = [entry for _, (entry, _) in sorted(self.recorded.items())]
        meta = dict(format=FORMAT, config=network_config(self.net), blocks=entries)
        return write_npz(Path(path), arrays, meta)

    def _entry(self, block: Any) -> tuple[dict, dict]:
        """The block as a file entry (its class, scalars and references into the network) and
        its arrays (float64 NumPy copies)."""
        entry: dict[str, Any] = dict(name=block_name(block), cls=type(block).__name__)
        entry.update(refs={}, scalars={})
        arrays = {}
        for f in dataclasses.fields(block):
            v = getattr(block, f.name)
            ref = self._reference(v)
            if ref is not None:
                entry["refs"][f.name] = ref
            elif v is None or isinstance(v, (bool, int, float)):
                entry["scalars"][f.name] = v
            else:
                arrays[f.name] = to_numpy(v).astype(np.float64)
        return entry, arrays

    def _reference(self, v: Any) -> list | None:
        """A network's object as a reference into it (its activation, loss or layer map)."""
        net = self.net
        for kind, objects in (("activation", net.activations), ("layer", net.layers)):
            for i, obj in enumerate(objects):
                if v is obj:
                    return [kind, i]
        return ["loss", 0] if v is net.loss else None


def load_recorded(path: str | Path) -> list[tuple[str, Any, np.ndarray]]:
    """``[(name, block, the solver's argmin)]`` of a file that :meth:`RecordingBackend.save`
    wrote, each block rebuilt on the network of its config, float64; checked before use: the
    format, the network config, every entry's class, fields and references, and every array
    finite, float64 and of a shape its block takes."""
    from .files import NpzFile
    from .io import network_from_config
    from .network import LiftedNetwork

    with NpzFile(path, "recorded blocks (RecordingBackend.save)") as f:
        meta = f.meta(FORMAT)
        net = network_from_config(
            dict(meta.get("config") or {}, dtype="float64"), LiftedNetwork, f.path, "meta.config"
        )
        entries = meta.get("blocks")
        if not isinstance(entries, list) or not entries:
            raise FileFormatError(f.path, "meta.blocks", "a list of blocks", repr(entries)[:80])
        fields = [_entry_fields(f.path, e) for e in entries]
        seen = [e["name"] for e in entries]
        if len(set(seen)) != len(seen):
            raise FileFormatError(f.path, "meta.blocks", "one entry a block", ", ".join(seen))
        f.require(
            {f"{e['name']}.{k}" for e, ks in zip(entries, fields) for k in ks | {"argmin"}}
            | {"meta"}
        )
        out = []
        for e, ks in zip(entries, fields):
            kw = {}
            for k in ks:
                key = f"{e['name']}.{k}"
                kw[k] = f.array(key, (None,) * len(f.headers[key][0]), np.float64)
            kw.update(e["scalars"])
            kw.update({k: _resolve(net, f.path, e["name"], k, r) for k, r in e["refs"].items()})
            Z = f.array(f"{e['name']}.argmin", (None, None), np.float64)
            out.append((e["name"], _rebuild(f.path, e, kw, Z), Z))
    return out


#: the network's objects a block's field may refer to, by field
REFERENCES = {
    "act": "activation",
    "act_in": "activation",
    "act_out": "activation",
    "loss": "loss",
    "map": "layer",
}
#: the scalar fields that are weights of the objective: finite and >= 0
WEIGHTS = ("lam", "lam_in", "lam_out", "rho", "gamma")


def _entry_fields(path: Path, e: Any) -> set:
    """The array fields of the entry ``e``: its class's fields less its scalars, references
    and hints; a ``FileFormatError`` naming the entry where it is malformed: its class, name,
    scalars (numbers, the objective's weights finite and >= 0, the layer an integer >= 0) and
    references (each field to its kind of object)."""
    where = f"meta.blocks.{e.get('name')}" if isinstance(e, dict) else "meta.blocks"
    ok = (
        isinstance(e, dict)
        and isinstance(e.get("cls"), str)
        and e["cls"] in CLASSES
        and isinstance(e.get("name"), str)
        and isinstance(e.get("refs"), dict)
        and isinstance(e.get("scalars"), dict)
    )
    if not ok:
        raise FileFormatError(path, where, "an entry of a block class", repr(e)[:120])
    names = {x.name for x in dataclasses.fields(CLASSES[e["cls"]])}
    given = set(e["refs"]) | set(e["scalars"])
    if not given <= names or not set(e["refs"]) <= set(REFERENCES):
        raise FileFormatError(path, where, "the class's fields", ", ".join(sorted(given)))
    for k, v in e["scalars"].items():
        number = v is None or (isinstance(v, (int, float)) and math.isfinite(v))
        if not number or (k in WEIGHTS and v is not None and v < 0):
            raise FileFormatError(path, f"{where}.{k}", "a finite number (>= 0 a weight)", repr(v))
    layer = e["scalars"].get("layer")
    if not isinstance(layer, int) or isinstance(layer, bool) or layer < 0:
        raise FileFormatError(path, f"{where}.layer", "an integer >= 0", repr(layer))
    return names - given


def _resolve(net: Any, path: Path, name: str, field: str, ref: Any) -> Any:
    """The network's object that the field ``field`` refers to: of the field's kind
    (``REFERENCES``), by its index."""
    objects = {"activation": net.activations, "layer": net.layers, "loss": [net.loss]}
    of = REFERENCES[field]
    ok = isinstance(ref, list) and len(ref) == 2 and ref[0] == of and isinstance(ref[1], int)
    if not ok or not 0 <= ref[1] < len(objects[of]):
        raise FileFormatError(path, f"meta.blocks.{name}.{field}", f"a network's {of}", repr(ref))
    return objects[of][ref[1]]


def _rebuild(path: Path, e: dict, kw: dict, Z: np.ndarray) -> Any:
    """The block of the entry ``e``, named as its variable, its value at ``Z`` computed once to
    check its shapes."""
    try:
        block = CLASSES[e["cls"]](**kw)
        if block_name(block) != e["name"]:
            raise ValueError(f"a {type(block).__name__} of layer {block.layer} is not {e['name']}")
        if tuple(block.shape) != Z.shape:
            raise ValueError(f"argmin of shape {Z.shape}, the block's variable {block.shape}")
        block.value(Z)
    except (TypeError, ValueError, IndexError, AttributeError) as err:
        raise FileFormatError(path, e["name"], "a block of the network", str(err)[:200]) from None
    return block


__all__ = ["RecordingBackend", "load_recorded", "FILE", "FORMAT"]
