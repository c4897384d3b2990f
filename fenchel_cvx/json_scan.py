"""JSON text read within the read budget, for every JSON the package reads (``run.json``,
``history.json``, the ``meta`` of a network or a checkpoint; ``files.read_json`` and
``files.parse_json`` are the entry points): the text pre-scanned in linear time before
``json.loads`` sees it (:func:`_check_json_text`: its decoded value charged against the read
budget, numbers of at most :data:`MAX_JSON_DIGITS` digits, nesting at most
:data:`MAX_JSON_DEPTH` deep), then parsed (:func:`_parse_json`: its top-level type checked,
every error of ``json.loads`` named as a :class:`~fenchel_cvx.errors.FileFormatError` with its
line and column or byte). No equation of the paper is implemented here.
"""

from __future__ import annotations

import json
import re

import numpy as np

from . import budget
from .errors import FileFormatError


def _decode(path, raw, what):
    """``raw`` decoded as UTF-8 (``what``: its content, named by the error with the byte)."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise FileFormatError(
            path,
            f"byte {err.start}",
            f"UTF-8 text ({what})",
            f"the byte {raw[err.start : err.start + 1]!r}",
        ) from None


MAX_JSON_DEPTH = 64
#: the most digits of a number read (Python writes a float in at most 17)
MAX_JSON_DIGITS = 100
#: the bytes a decoded JSON value is charged: per object, per array, and per other value or
#: key (each comma and colon, plus one), above what CPython's json takes (measured: an empty
#: object with its list slot 72 bytes, a one-entry object 240, a key and a float 140)
_JSON_OBJECT, _JSON_ARRAY, _JSON_VALUE = 240, 64, 80
#: a JSON string, its escapes included
_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
#: digits -> "0", any other byte -> " ": a number of too many digits is a run of "0"
_JSON_DIGITS = bytes(48 if 48 <= b <= 57 else 32 for b in range(256))
_JSON_NUMBER = re.compile(rb"[0-9]+")
#: each byte's step of the nesting: +1 opens an array or an object, -1 closes one
_JSON_STEP = np.zeros(256, np.int64)
_JSON_STEP[[ord("["), ord("{")]], _JSON_STEP[[ord("]"), ord("}")]] = 1, -1


def _check_json_text(path, field, raw):
    """The pre-scan of the JSON text ``raw`` (bytes), linear and before ``json.loads``:

    - its decoded value within the read budget (``budget.check_declared``): the text's bytes
      twice (five times where it holds non-ASCII: decoded at up to 4 bytes a character), and
      240 bytes per object, 64 per array and 80 per other value (each ``,`` and ``:``, plus
      one), counted over the whole text (strings too: an over-count, never an under-count);
    - outside strings, numbers of at most :data:`MAX_JSON_DIGITS` digits (Python refuses to
      read an integer of more than 4,300) and arrays and objects nested at most
      :data:`MAX_JSON_DEPTH` deep (``json.loads`` recurses once per level), each refusal naming
      the byte of the text where it starts."""
    objects, arrays = raw.count(b"{"), raw.count(b"[")
    values = raw.count(b",") + raw.count(b":") + 1
    cost = len(raw) * (2 if raw.isascii() else 5)
    cost += _JSON_OBJECT * objects + _JSON_ARRAY * arrays + _JSON_VALUE * values
    what = f"JSON of {objects:,} objects, {arrays:,} arrays and {values:,} values, decoded"
    budget.check_declared(path, field or "JSON", cost, what)
    where = f"{field} " if field else ""
    text = _JSON_STRING.sub(b'""', raw)  # strings out: what is left is numbers and brackets
    at = text.translate(_JSON_DIGITS).find(b"0" * (MAX_JSON_DIGITS + 1))
    if at >= 0:
        run = _JSON_NUMBER.match(text, at)
        assert run is not None  # ``at`` starts a run of digits
        digits = len(run[0])
        raise FileFormatError(
            path,
            f"{where}byte {_raw_offset(raw, at)}",
            f"numbers of at most {MAX_JSON_DIGITS} digits",
            f"a number of {digits:,} digits",
        )
    at = _too_deep(text)
    if at is not None:
        raise FileFormatError(
            path,
            f"{where}byte {_raw_offset(raw, at)}",
            f"arrays and objects nested at most {MAX_JSON_DEPTH} deep",
            f"one nested {MAX_JSON_DEPTH + 1} deep",
        )


def _too_deep(text):
    """The offset in ``text`` (JSON without strings) of the first bracket nested deeper than
    :data:`MAX_JSON_DEPTH`, else None; the running depth in chunks of 1 MiB."""
    steps, depth = np.frombuffer(text, np.uint8), 0
    for start in range(0, len(steps), 1 << 20):
        running = np.cumsum(_JSON_STEP[steps[start : start + (1 << 20)]]) + depth
        if running.max() > MAX_JSON_DEPTH:
            return start + int(np.argmax(running > MAX_JSON_DEPTH))
        depth = int(running[-1])
    return None


def _raw_offset(raw, at):
    """The offset in ``raw`` of the offset ``at`` in ``raw`` with its strings cut to ``""``."""
    shift = 0
    for m in _JSON_STRING.finditer(raw):
        if m.start() - shift >= at:
            break
        shift += m.end() - m.start() - 2
    return at + shift


def _parse_json(path, field, raw, text, want):
    """``raw`` (its decoded ``text``, or None: decoded here) parsed as JSON that must be a
    ``want``, after :func:`_check_json_text`; every error of ``json.loads`` named."""
    _check_json_text(path, field, raw)
    text = _decode(path, raw, "JSON") if text is None else text
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        where = f"{field} " if field else ""
        raise FileFormatError(
            path, f"{where}line {err.lineno} column {err.colno}".strip(), "JSON", f"{err.msg}"
        ) from None
    except (ValueError, RecursionError) as err:  # past the pre-scan: still named
        raise FileFormatError(
            path, field or "JSON", "JSON that Python reads", f"{type(err).__name__}: {err}"
        ) from None
    if not isinstance(value, want):
        raise FileFormatError(
            path, field, f"a JSON {_json_type(want)}", f"a JSON {_json_type(type(value))}"
        )
    return value


def _json_type(cls):
    return {
        dict: "object",
        list: "array",
        str: "string",
        int: "number",
        float: "number",
        bool: "boolean",
        type(None): "null",
    }.get(cls, cls.__name__)
