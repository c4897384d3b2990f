"""History: what the BCD driver records at every iteration, as plain JSON-ready data.

A :class:`History` is a ``config`` dict (the run's settings: the network's, the schedule's,
``gamma``, ``momentum``, the ``backend``'s name and its ``backend_settings``, e.g. a
``FastBackend``'s step caps and Gram reuse or the oracle's solver) and a list of ``records``,
one per *round* (one X-sweep then one W-sweep): one per iteration in Algorithm 1, one per
alternation of each batch in Algorithm 2. A record holds

- ``iteration`` (1, 2, ... over the run), ``epoch``, ``batch``, ``alternation`` (Algorithm 2;
  ``None`` in Algorithm 1) and ``m`` (data points the round's objectives are summed over);
- ``lifted_x`` = F(W, X) after the X-sweep and ``network_x`` = J(W) at the same weights (before
  the W-sweep); ``lifted_w`` = F(W', X) and ``network_w`` = J(W') after the W-sweep; ``prox`` the
  proximal term sum_l gamma_l ||W'_l - W0_l||^2 (Algorithm 2; not part of F or J; ``None`` on
  the unchecked rounds of arrays whose reads are not cheap, ``arrays.cheap_reads``: a GPU's);
- ``divergence_x`` / ``divergence_w``: each layer's summed B_l after the X- and the W-sweep;
- ``train_accuracy``, ``test_accuracy`` (classification: argmax of the feed-forward output vs
  argmax of Y; ``None`` otherwise or without test data) and ``train_loss``, ``test_loss`` (the
  network loss per data point, no penalty), on the whole train and test sets;
- ``blocks``: per block solve, its name (``"X_2"``, ``"W_0"``), kind, layer, value before and
  after, wall seconds, solver seconds, status, KKT residual, iterations, converged;
- ``restarted``: the X-sweep started from the feed-forward point (see ``bcd.py``);
- ``halted``: the block whose failure ended a recorded (non-strict) run after this round, else
  ``None``;
- ``checked``: the whole certificate ran this round (``fit_bcd(check_every=k)`` checks every
  k-th round; the others record None for the objectives and divergences);
- ``certificate``: the outcome of the four checks (``certificate.Certificate.outcome``);
- ``seconds``: wall time of the round.

``save(path)`` writes JSON (format ``"fenchel_cvx.History/1"``) atomically: to a temporary file
then renamed (``io.atomic_write``); ``History.load(path)`` reads it back through the checked
reader (``files.read_json``: the JSON within the read budget) and the schema of its fields
(``schemas.HISTORY``), and the round trip is exact. A history without ``format`` (as the
earliest releases wrote it) loads as version 1.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

#: the format and version of what ``to_dict`` and ``save`` write
FORMAT = "fenchel_cvx.History/1"


def _plain(x: Any) -> Any:
    """numpy scalars / arrays / tuples -> JSON-ready Python objects."""
    if isinstance(x, dict):
        return {str(k): _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    if isinstance(x, np.ndarray):
        return _plain(x.tolist())
    if isinstance(x, (np.bool_, bool)):
        return bool(x)
    if isinstance(x, np.integer):
        return int(x)
    if isinstance(x, (np.floating, float)):
        return float(x)
    return x


class History:
    """The record of a BCD run: ``config`` and one dict per round (see the module docstring)."""

    def __init__(
        self,
        config: Mapping[str, Any] | None = None,
        records: Iterable[Mapping[str, Any]] | None = None,
    ) -> None:
        self.config: dict[str, Any] = _plain(dict(config or {}))
        self.records: list[dict[str, Any]] = [_plain(r) for r in (records or [])]

    def append(self, record: Mapping[str, Any]) -> None:
        self.records.append(_plain(record))

    def __len__(self) -> int:
        return len(self.records)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return iter(self.records)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return self.records[i]

    def __repr__(self) -> str:
        return f"History({len(self)} rounds, certificate held: {self.verdict})"

    def series(self, key: str) -> np.ndarray:
        """The values of ``key`` over the rounds as a float array (``None`` -> NaN)."""
        return np.array(
            [math.nan if r.get(key) is None else r[key] for r in self.records], dtype=float
        )

    @property
    def certificate_held(self) -> bool:
        """True iff every check that ran held at every round (with ``fit_bcd(check_every=k)``
        the rounds in between ran block_optimality only: see :attr:`checked_rounds`)."""
        return all(r["certificate"]["held"] for r in self.records)

    @property
    def held_but_capped(self) -> bool:
        """True iff every check held at every round but the block optimality of blocks that
        stopped at the step cap they were given (``FastBackend(w_steps=..., x_steps=...)``:
        inexact by design, each recorded as a ``capped`` violation): so the Fenchel-Young,
        descent and lower-bound checks held, and every argmin was usable."""
        return all(v.get("capped", False) for v in self.violations)

    @property
    def verdict(self) -> str:
        """Whether the certificate held, in words: ``"yes"``; ``"yes, but for ..."`` the block
        optimality of capped blocks (``held_but_capped``); else ``"no (...)"``, counted."""
        capped = sum(bool(v.get("capped")) for v in self.violations)
        if self.certificate_held:
            return "yes"
        if self.held_but_capped:
            return (
                f"yes, but for the block optimality of {capped} capped block solves "
                f"(inexact by design)"
            )
        return f"no ({len(self.violations)} violations, {capped} of them capped block solves)"

    @property
    def checked_rounds(self) -> int:
        """The number of rounds on which the whole certificate ran."""
        return sum(bool(r["certificate"].get("checked", True)) for r in self.records)

    @property
    def violations(self) -> list[dict[str, Any]]:
        """All recorded certificate violations (non-strict runs), in order."""
        return [v for r in self.records for v in r["certificate"]["violations"]]

    @property
    def last(self) -> dict[str, Any] | None:
        return self.records[-1] if self.records else None

    # --- JSON ---------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {"format": FORMAT, "config": self.config, "records": self.records}

    @classmethod
    def from_dict(cls, d: object, source: str | os.PathLike[str] = "history") -> History:
        """The history of ``to_dict``'s dict ``d``; ``source``: the file it came from (named
        by a ``FileFormatError`` when ``d`` is not one, or a field of it fails its schema,
        ``schemas.HISTORY``: e.g. ``records[2].certificate.held: expected true or false``)."""
        from .errors import FileFormatError
        from .files import check_format
        from .schemas import HISTORY

        if not isinstance(d, dict) or not isinstance(d.get("records"), list):
            found = "not a History: " + (
                f"the keys {sorted(d)}" if isinstance(d, dict) else type(d).__name__
            )
            raise FileFormatError(
                source, "", "a History: an object with 'config' and 'records'", found
            )
        if "format" in d:
            check_format(source, d, FORMAT, "format")
        if not isinstance(d.get("config", {}), dict) or not all(
            isinstance(r, dict) for r in d["records"]
        ):
            raise FileFormatError(
                source, "records", "an object per round and a config object", "other JSON values"
            )
        HISTORY.check(source, "", d)  # every record's fields: their types, ranges and meaning
        return cls(d.get("config"), d["records"])

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write the history as JSON to ``path`` atomically; returns the path."""
        from .io import write_json

        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        return write_json(path, self.to_dict())

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> History:
        """Read a history written by :meth:`save` (``files.read_json``: a named
        ``FileFormatError`` for anything else)."""
        from .files import read_json

        return cls.from_dict(read_json(path, "history (History.save)"), source=path)
