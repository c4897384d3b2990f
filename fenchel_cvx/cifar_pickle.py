"""The CIFAR-10 python batches' pickles, read without :mod:`pickle`: a small stack machine in pure
Python over the file's bytes that knows exactly what a legitimate batch uses and refuses
everything else by name.

A batch is a dict of ``batch_label``, ``data``, ``labels`` and ``filenames`` (keys as bytes or
str) of names, lists of integers or names and NumPy integer arrays, pickled by Python 2 (the
official release: protocol 2, byte strings as Python 2 str) or by Python 3 in protocols 0 to 5
(bytes through ``_codecs.encode`` below protocol 3, arrays through ``_frombuffer`` in-band in
protocol 5). The machine builds only those: the globals it admits (:data:`ADMITTED`) are names
mapped to this module's functions, which build each dtype and array from its checked state;
nothing is imported or called by a name from the file. Extension codes (EXT1, EXT2, EXT4) are
refused always, as is every opcode not in its table, so no state of the process (``copyreg``'s
extension cache) reaches it. It runs no Python recursion and bounds what it holds: opcodes
(:data:`MAX_OPCODES`), stack items (:data:`MAX_STACK`), tuple and MARK nesting
(:data:`MAX_DEPTH`, checked before a tuple is built), memo indices (:data:`MAX_MEMO`), list,
tuple and dict sizes, integer widths; every string, container and array is charged against the
read budget (:mod:`fenchel_cvx.budget`) before it is built, an array's shape through
:func:`~fenchel_cvx.budget.bounded_product`.

Every refusal is a :class:`~fenchel_cvx.errors.FileFormatError` naming the file, and the byte
and the name of the opcode. No equation of the paper is implemented here.
"""

from __future__ import annotations

import codecs
import pickletools
from pathlib import Path
from typing import Any

import numpy as np

from .budget import bounded_product, check_declared, read_budget
from .errors import FileFormatError

#: the most opcodes a batch may have: a legitimate one has at most 12 an image (protocol 0: its
#: label, its file name through ``_codecs.encode``), and a file of at most 128 MB holds at most
#: 43,690 images of 3,072 bytes: 524,280 opcodes
MAX_OPCODES = 1 << 19
#: memo indices stay below this (a legitimate batch stores at most 3 objects an image)
MAX_MEMO = 1 << 18
#: the deepest nesting of tuples, and of open MARKs (a legitimate batch's is 3)
MAX_DEPTH = 32
#: the most items of a list (labels, file names), of a tuple, and keys of the dict
MAX_ITEMS, MAX_TUPLE, MAX_KEYS = 1 << 16, 64, 64
#: the most items on the stack: a list of ``MAX_ITEMS`` in one APPENDS, twice over (Python's
#: pickle appends by 1,000, and its stack stays near 1,000)
MAX_STACK = 2 * MAX_ITEMS
#: the widest integer: 9 bytes (LONG1) or 24 characters (INT, LONG) hold any 64-bit one
MAX_INT_BYTES, MAX_INT_CHARS = 9, 24
#: the bytes charged for each object built, besides its characters
OBJECT_BYTES = 64
#: the dtypes an array may have: integers (uint8 pixels, integer labels)
INTEGER_DTYPES = frozenset(
    f"{e}{k}{n}" for e in ("", "<", ">", "|", "=") for k in "iu" for n in (1, 2, 4, 8)
)
_SCALARS = frozenset({type(None), bool, int, bytes, bytearray, str})
_ONLY = "a CIFAR-10 batch holds only NumPy integer arrays, lists and text"


class _Bad(Exception):
    """A pickle cut short, malformed or of an opcode no batch uses; or, its message starting
    with "refused", what a CIFAR-10 batch never holds (a global, a dtype, a call)."""


class _Global(str):
    """An admitted global, by the name the pickle gives it."""


class _Made:
    """A dtype or an array (``value``; an array None until its state, BUILD, builds it), and
    whether its state is set (``built``)."""

    def __init__(self, value=None):
        self.value, self.built = value, value is not None and not isinstance(value, np.dtype)


_IN_TUPLE = _SCALARS | {tuple, _Global, _Made}


def _scalar(x) -> str:
    """``x`` in a few characters, without recursion: a container is only counted."""
    if type(x) in (bytes, bytearray, str, _Global):
        return repr(x) if len(x) <= 32 else f"<{type(x).__name__} of {len(x)}>"
    if type(x) is int and x.bit_length() > 64:
        return f"<an integer of {x.bit_length()} bits>"
    if x is None or type(x) in (bool, int):
        return repr(x)
    if type(x) is _Made:
        return f"<{'dtype' if isinstance(x.value, np.dtype) else 'array'}>"
    return f"<{type(x).__name__}" + (f" of {len(x)}>" if type(x) in (tuple, list, dict) else ">")


def _brief(v) -> str:
    """``v`` as a repr one level deep (a tuple's items by :func:`_scalar`)."""
    if type(v) is not tuple:
        return _scalar(v)
    items = [_scalar(x) for x in v[:8]] + (["..."] if len(v) > 8 else [])
    return "(" + ", ".join(items) + ("," if len(v) == 1 else "") + ")"


def _fits(args, *tests) -> bool:
    """Whether the tuple ``args`` has one item per test, each passing it: a set of types, or a
    predicate."""
    return (
        type(args) is tuple
        and len(args) == len(tests)
        and all(type(a) in t if type(t) is set else t(a) for a, t in zip(args, tests))
    )


_shape = lambda s: (  # noqa: E731 -- at most 32 dimensions, NumPy 1's most
    type(s) is tuple and len(s) <= 32 and all(type(n) is int and n >= 0 for n in s)
)
_flag = lambda f: type(f) in (int, bool) and f in (0, 1)  # noqa: E731
_dtype = lambda d: type(d) is _Made and isinstance(d.value, np.dtype)  # noqa: E731


def _array(m, data, dtype, shape, fortran):
    """The array of ``shape`` and ``dtype`` on the bytes ``data``: its size is costed against
    the budget (bounded_product, then the itemsize), then against the bytes present."""
    count = None if any(n > m.budget for n in shape) else bounded_product(shape, m.budget)
    nbytes = None if count is None else count * dtype.itemsize
    check_declared(m.path, f"pickle at byte {m.pos}", nbytes, f"an array of shape {_brief(shape)}")
    if nbytes != len(data):
        raise _Bad(f"refused an array of shape {_brief(shape)} ({dtype}) from {len(data)} bytes")
    m.charge(OBJECT_BYTES)
    return _Made(np.frombuffer(data, dtype).reshape(shape, order="F" if fortran else "C"))


# --- what REDUCE and BUILD run for the admitted globals: NumPy's reconstructors, checked ------
def _call_reconstruct(m, args):
    """``_reconstruct(ndarray, (0,), typecode)``: an array its state (BUILD) builds."""
    ndarray = lambda c: type(c) is _Global and c == "numpy.ndarray"  # noqa: E731
    if not _fits(args, ndarray, lambda s: s == (0,), lambda t: t in (b"b", "b")):
        raise _Bad(f"refused reconstructing {_brief(args)} (NumPy's is (ndarray, (0,), b'b'))")
    return _Made()


def _call_dtype(m, args):
    """``numpy.dtype(name, align, copy)`` of an integer dtype (Python 2 names it in bytes)."""
    name = args[0] if args else None
    name = name.decode("latin1") if type(name) is bytes else name
    if type(name) is not str or name not in INTEGER_DTYPES:
        raise _Bad(f"refused the dtype {_scalar(name)} (a CIFAR-10 batch holds integers only)")
    if not _fits(args, {bytes, str}, _flag, _flag):
        raise _Bad(f"refused numpy.dtype's arguments {_brief(args)}")
    return _Made(np.dtype(name))


def _call_frombuffer(m, args):
    """``_frombuffer(bytes, dtype, shape, order)``: protocol 5's array, in-band."""
    order = lambda o: type(o) is str and o in ("C", "F")  # noqa: E731
    if not _fits(args, {bytes, bytearray}, _dtype, _shape, order):
        raise _Bad(f"refused _frombuffer of {_brief(args)}")
    return _array(m, args[0], args[1].value, args[2], args[3] == "F")


def _call_encode(m, args):
    """``_codecs.encode(text, 'latin1')``: bytes as Python 3 pickles them below protocol 3."""
    if not _fits(args, {str}, lambda e: type(e) is str and e == "latin1"):
        raise _Bad(f"refused _codecs.encode of {_brief(args)}")
    m.charge(len(args[0]) + OBJECT_BYTES)
    try:
        return args[0].encode("latin1")
    except UnicodeEncodeError:
        raise _Bad("_codecs.encode of a text beyond latin1") from None


def _call_ndarray(m, args):  # ndarray(shape, dtype, buffer, offset, strides): any size
    raise _Bad("refused calling numpy.ndarray directly (a batch's arrays are _reconstruct's)")


#: the globals a batch may name, and what REDUCE of each runs
ADMITTED = {
    "numpy.ndarray": _call_ndarray,  # _reconstruct's argument
    "numpy.core.multiarray._reconstruct": _call_reconstruct,
    "numpy._core.multiarray._reconstruct": _call_reconstruct,
    "numpy.dtype": _call_dtype,
    "numpy.core.numeric._frombuffer": _call_frombuffer,
    "numpy._core.numeric._frombuffer": _call_frombuffer,
    "_codecs.encode": _call_encode,
}


def _set_state(m, obj, state):
    """BUILD: a dtype's state ``(3, byteorder, None, None, None, -1, -1, 0)`` (its byte order,
    set once), an array's ``(1, shape, dtype, is_fortran, raw bytes)``; any other is refused."""
    if type(obj) is not _Made or obj.built:
        raise _Bad(f"refused setting a state on {_scalar(obj)} ({_ONLY})")
    if obj.value is None:  # an array of _reconstruct
        if not _fits(state, lambda v: v == 1, _shape, _dtype, _flag, {bytes, bytearray}):
            raise _Bad(
                f"refused the array state {_brief(state)} (NumPy's is (1, shape, dtype, "
                "is_fortran, bytes))"
            )
        made = _array(m, state[4], state[2].value, state[1], bool(state[3]))
        obj.value, obj.built = made.value, True
        return
    order = state[1] if type(state) is tuple and len(state) == 8 else None
    order = order.decode("latin1") if type(order) is bytes else order
    if (
        type(order) is not str
        or order not in ("<", ">", "|", "=")
        or state[0] != 3
        or state[2:] != (None, None, None, -1, -1, 0)
    ):
        raise _Bad(
            f"refused the dtype state {_brief(state)} (a plain integer dtype's is "
            "(3, byteorder, None, None, None, -1, -1, 0), set once)"
        )
    obj.value, obj.built = obj.value.newbyteorder(order) if order in "<>" else obj.value, True


class _Machine:
    """The stack machine over the bytes ``data`` of ``path``: :meth:`run` gives the object.
    Each opcode's handler is a method ``op_*`` of one argument, from :data:`_HANDLERS`."""

    def __init__(self, path, data) -> None:
        self.path, self.data, self.end, self.budget = path, data, len(data), read_budget()
        self.p = self.pos = self.used = 0  # the next byte, the opcode's, the bytes charged
        self.stack: list = []
        self.depths: list[int] = []  # each stack item's tuple nesting
        self.marks: list[int] = []
        self.memo: dict = {}
        self.charge(len(data))

    def charge(self, n):
        """Count ``n`` more bytes against the read budget, before they are allocated."""
        self.used += n
        if self.used > self.budget:
            check_declared(
                self.path, f"pickle at byte {self.pos}", self.used, "the pickle's objects"
            )

    def run(self):
        data, end = self.data, self.end
        for _ in range(MAX_OPCODES):
            self.pos = p = self.p
            if p >= end:
                raise _Bad("no STOP opcode")
            self.p = p + 1
            if data[p] == 46:  # STOP
                if self.marks or len(self.stack) != 1:
                    raise _Bad("STOP with a MARK open or not one object on the stack")
                return self.stack[0].value if type(self.stack[0]) is _Made else self.stack[0]
            entry = _TABLE.get(data[p])
            if entry is None:
                known = chr(data[p]) in _CODE2OP  # named by load_batch
                raise _Bad("an opcode no CIFAR-10 batch uses" if known else "an unknown opcode")
            entry[0](self, entry[1])
        raise _Bad(f"refused a pickle of more than {MAX_OPCODES:,} opcodes (a batch's are few)")

    def take(self, n):
        """The next ``n`` bytes."""
        if n > self.end - self.p:
            raise _Bad(f"a length of {n} bytes, {self.end - self.p} remain")
        self.p += n
        return self.data[self.p - n : self.p]

    def number(self, width, signed=False):
        return int.from_bytes(self.take(width), "little", signed=signed)

    def line(self, limit=None):
        """The bytes up to the next newline (within ``limit`` bytes, where given)."""
        stop = self.end if limit is None else min(self.end, self.p + limit + 1)
        q = self.data.find(b"\n", self.p, stop)
        if q < 0:
            raise _Bad("a line without its end" + (f" within {limit} bytes" if limit else ""))
        self.charge(q - self.p)
        text, self.p = self.data[self.p : q], q + 1
        return text

    def integer(self, text, what="an integer"):
        digits = text[1:] if text[:1] in (b"-", b"+") else text
        if not (digits.isdigit() and len(text) <= MAX_INT_CHARS):
            raise _Bad(f"{what} {_scalar(text)}")
        return int(text)

    def push(self, value, depth=0):
        if len(self.stack) >= MAX_STACK:
            raise _Bad(f"refused a stack of more than {MAX_STACK:,} items (a batch's are few)")
        self.stack.append(value)
        self.depths.append(depth)

    def pop(self, n=1):
        """The top ``n`` items (above the last MARK; None: all, and the MARK), and depths."""
        if n is None and not self.marks:
            raise _Bad("the items since a MARK, and no MARK")
        n = len(self.stack) - self.marks.pop() if n is None else n
        if len(self.stack) - (self.marks[-1] if self.marks else 0) < n:
            raise _Bad(f"{n} items to take, and fewer on the stack")
        k = len(self.stack) - n
        items, depths = self.stack[k:], self.depths[k:]
        del self.stack[k:], self.depths[k:]
        return items, depths

    def top(self, cls=None):
        if len(self.stack) <= (self.marks[-1] if self.marks else 0):
            raise _Bad("an object to work on, and none on the stack")
        if cls is not None and type(self.stack[-1]) is not cls:
            raise _Bad(f"a {cls.__name__} to add to, and {_scalar(self.stack[-1])}")
        return self.stack[-1]

    # --- the opcodes ---------------------------------------------------------------------------
    def op_mark(self, _):
        if len(self.marks) >= MAX_DEPTH:
            raise _Bad(f"refused MARKs nested more than {MAX_DEPTH} deep")
        self.marks.append(len(self.stack))

    def op_header(self, width):
        """PROTO (``width`` 1: the protocol, at most 5), FRAME (8: its length, in the file)."""
        n = self.number(width)
        if width == 1 and n > 5:
            raise _Bad(f"a pickle protocol above 5 ({n})")
        if width == 8 and n > self.end - self.p:
            raise _Bad(f"a frame of {n} bytes, {self.end - self.p} remain")

    def op_const(self, value):
        """NONE, NEWTRUE, NEWFALSE (``value``); EMPTY_LIST, EMPTY_DICT, EMPTY_TUPLE (a type)."""
        if value in (list, dict, tuple):
            self.charge(OBJECT_BYTES)
            return self.push(value(), 1 if value is tuple else 0)
        self.push(value)

    def op_integer(self, width):
        """INT, LONG (``width`` "I", "L": a line), BININT1, 2, 4 (1, 2, -4: signed), LONG1 (0)."""
        if width in ("I", "L"):
            text = self.line(MAX_INT_CHARS + 1)
            if width == "I" and text in (b"00", b"01"):  # protocol 0's False and True
                return self.push(text == b"01")
            text = text[:-1] if width == "L" and text.endswith(b"L") else text
            return self.push(self.integer(text))
        n = self.number(1) if width == 0 else abs(width)
        if n > MAX_INT_BYTES:
            raise _Bad(f"refused an integer of {n} bytes (at most {MAX_INT_BYTES})")
        self.push(self.number(n, signed=width <= 0))

    def op_counted(self, arg):
        """A length of ``width`` bytes, then that many bytes made ``into`` bytes, str or
        bytearray (charged first: UTF-8 of n bytes is at most 4 n bytes as a str)."""
        width, into = arg
        n = self.number(width)
        if n > self.end - self.p:
            raise _Bad(f"a length of {n} bytes, {self.end - self.p} remain")
        self.charge((4 * n if into is str else 2 * n if into is bytearray else n) + OBJECT_BYTES)
        raw = self.take(n)
        try:
            self.push(raw.decode("utf-8", "surrogatepass") if into is str else into(raw))
        except UnicodeDecodeError as err:
            raise _Bad(f"text that is not UTF-8 ({err.reason})") from None

    def op_text_line(self, quoted):
        """STRING (``quoted``: Python's repr of bytes) or UNICODE (raw-unicode-escape)."""
        text = self.line()
        self.charge(4 * len(text) + OBJECT_BYTES)
        if quoted and (len(text) < 2 or text[:1] not in (b"'", b'"') or text[-1:] != text[:1]):
            raise _Bad("a STRING that is not quoted")
        try:
            text = (
                codecs.escape_decode(text[1:-1])[0] if quoted else text.decode("raw-unicode-escape")
            )
        except (UnicodeDecodeError, ValueError) as err:
            raise _Bad(f"a string of a bad escape ({err})") from None
        self.push(text)

    def op_add(self, arg):
        """LIST, DICT ("new": one of the items since the MARK); APPEND, SETITEM (1, 2: an item,
        a key and a value); APPENDS, SETITEMS ("mark": the items since the MARK). A list holds
        scalars only (labels, file names); the dict, names as keys, and scalars, lists or
        arrays as values."""
        cls, take = arg
        items = self.pop(take if type(take) is int else None)[0]
        into = cls() if take == "new" else self.top(cls)
        self.charge(OBJECT_BYTES * (len(items) + (take == "new")))
        if cls is list:
            if len(into) + len(items) > MAX_ITEMS:
                raise _Bad(f"refused a list of more than {MAX_ITEMS:,} items")
            bad = [x for x in items if type(x) not in _SCALARS]
            if bad:
                raise _Bad(f"refused a list item {_scalar(bad[0])} ({_ONLY})")
            into.extend(items)
        elif len(items) % 2 or len(into) + len(items) // 2 > MAX_KEYS:
            raise _Bad(f"a dict of an odd number of items or more than {MAX_KEYS} keys")
        for k, v in zip(items[::2], items[1::2]) if cls is dict else ():
            if type(k) not in (bytes, str):
                raise _Bad(f"refused the dict key {_scalar(k)} (a batch's keys are names)")
            array = type(v) is _Made and v.built and not isinstance(v.value, np.dtype)
            if not (type(v) in _SCALARS or type(v) is list or array):
                raise _Bad(f"refused the value {_scalar(v)} of the key {_scalar(k)} ({_ONLY})")
            into[k] = v.value if array else v
        if take == "new":
            self.push(into)

    def op_tuple(self, n):
        """TUPLE (``n`` None: the items since the MARK), TUPLE1..3: nesting checked first."""
        items, depths = self.pop(n)
        depth = 1 + max(depths, default=0)
        if depth > MAX_DEPTH:
            raise _Bad(f"refused tuples nested more than {MAX_DEPTH} deep")
        if len(items) > MAX_TUPLE:
            raise _Bad(f"refused a tuple of {len(items):,} items (at most {MAX_TUPLE})")
        bad = [x for x in items if type(x) not in _IN_TUPLE]
        if bad:
            raise _Bad(f"refused a tuple holding {_scalar(bad[0])} ({_ONLY})")
        self.charge(OBJECT_BYTES + 8 * len(items))
        self.push(tuple(items), depth)

    def op_memo(self, arg):
        """PUT, GET (``width`` 0: the index on a line), BINPUT, BINGET (1), LONG_BINPUT,
        LONG_BINGET (4), MEMOIZE (None: the next index)."""
        put, width = arg
        if width == 0:
            i = self.integer(self.line(12), "a memo index")
        else:
            i = len(self.memo) if width is None else self.number(width)
        if put and not 0 <= i < MAX_MEMO:
            raise _Bad(f"refused the memo index {i} (at most {MAX_MEMO - 1:,})")
        if not put and i not in self.memo:
            raise _Bad(f"the memo index {i}, never stored")
        if not put:
            return self.push(*self.memo[i])
        self.charge(0 if i in self.memo else OBJECT_BYTES)
        self.memo[i] = (self.top(), self.depths[-1])

    def op_global(self, stacked):
        """GLOBAL (a module and a name on two lines), STACK_GLOBAL (both from the stack)."""
        if stacked:
            module, name = self.pop(2)[0]
            if type(module) is not str or type(name) is not str:
                raise _Bad("STACK_GLOBAL of a module and a name that are not str")
        else:
            try:
                module, name = self.line(256).decode("utf-8"), self.line(256).decode("utf-8")
            except UnicodeDecodeError:
                raise _Bad("a global whose name is not UTF-8") from None
        full = f"{module}.{name}"
        if full not in ADMITTED:
            raise _Bad(f"refused the global {full[:200]} ({_ONLY})")
        self.push(_Global(full))

    def op_reduce(self, _):
        (fn, args), _ = self.pop(2)
        if type(fn) is not _Global or type(args) is not tuple:
            raise _Bad(f"refused calling {_scalar(fn)} with {_scalar(args)} ({_ONLY})")
        self.push(ADMITTED[fn](self, args))

    def op_build(self, _):
        (state,), _ = self.pop(1)
        _set_state(self, self.top(), state)

    def op_extension(self, width):
        raise _Bad(
            f"refused the extension code {self.number(width)} (opcode EXT{width}: a global "
            "registered with copyreg); a CIFAR-10 batch names each global it uses"
        )


#: each opcode's handler (a method ``op_*``) and its argument, by pickletools' names
_SPEC: list[tuple[str, str, list]] = [
    ("header", "PROTO FRAME", [1, 8]),
    ("mark", "MARK", [None]),
    ("const", "NONE NEWTRUE NEWFALSE", [None, True, False]),
    ("const", "EMPTY_LIST EMPTY_DICT EMPTY_TUPLE", [list, dict, tuple]),
    ("integer", "INT LONG BININT BININT1 BININT2 LONG1", ["I", "L", -4, 1, 2, 0]),
    ("text_line", "STRING UNICODE", [True, False]),
    ("counted", "BINSTRING BINBYTES BINUNICODE", [(4, bytes), (4, bytes), (4, str)]),
    ("counted", "SHORT_BINSTRING SHORT_BINBYTES", [(1, bytes), (1, bytes)]),
    ("counted", "SHORT_BINUNICODE BINUNICODE8", [(1, str), (8, str)]),
    ("counted", "BINBYTES8 BYTEARRAY8", [(8, bytes), (8, bytearray)]),
    ("add", "LIST APPEND APPENDS", [(list, "new"), (list, 1), (list, None)]),
    ("add", "DICT SETITEM SETITEMS", [(dict, "new"), (dict, 2), (dict, None)]),
    ("tuple", "TUPLE TUPLE1 TUPLE2 TUPLE3", [None, 1, 2, 3]),
    ("memo", "PUT BINPUT LONG_BINPUT MEMOIZE", [(True, 0), (True, 1), (True, 4), (True, None)]),
    ("memo", "GET BINGET LONG_BINGET", [(False, 0), (False, 1), (False, 4)]),
    ("global", "GLOBAL STACK_GLOBAL", [False, True]),
    ("reduce", "REDUCE", [None]),
    ("build", "BUILD", [None]),
    ("extension", "EXT1 EXT2 EXT4", [1, 2, 4]),  # refused, always
]
#: any opcode not here is refused
_HANDLERS = {
    name: (getattr(_Machine, "op_" + handler), arg)
    for handler, names, args in _SPEC
    for name, arg in zip(names.split(), args)
}
_TABLE = {ord(op.code): _HANDLERS[op.name] for op in pickletools.opcodes if op.name in _HANDLERS}
#: every opcode of the pickle protocols, by its code (``pickletools.code2op``, which the module
#: keeps but does not export)
_CODE2OP = {op.code: op for op in pickletools.opcodes}


def load_batch(path: Path) -> Any:
    """The object pickled in the CIFAR-10 python batch ``path`` (a dict of names, lists and
    NumPy integer arrays where the file is a batch), read by the stack machine; a
    ``FileFormatError`` naming the file, the opcode and its byte for anything else.

    >>> import pickle, tempfile
    >>> tmp = tempfile.TemporaryDirectory()
    >>> batch = {b"data": np.zeros((2, 3072), np.uint8), b"labels": [3, 7]}
    >>> _ = (Path(tmp.name) / "data_batch_1").write_bytes(pickle.dumps(batch, protocol=2))
    >>> d = load_batch(Path(tmp.name) / "data_batch_1")
    >>> d[b"data"].shape, d[b"data"].dtype, d[b"labels"]
    ((2, 3072), dtype('uint8'), [3, 7])
    >>> class Payload:  # a pickle that would call eval("1 + 1") if unpickled
    ...     def __reduce__(self):
    ...         return (eval, ("1 + 1",))
    >>> _ = (Path(tmp.name) / "bad").write_bytes(pickle.dumps({b"data": Payload()}, protocol=2))
    >>> load_batch(Path(tmp.name) / "bad")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    fenchel_cvx.errors.FileFormatError: ...bad: pickle: expected a CIFAR-10 python batch, found
    refused the global __builtin__.eval (a CIFAR-10 batch holds only NumPy integer arrays, lists
    and text), at byte ..., GLOBAL; nothing from the file was run
    >>> tmp.cleanup()
    """
    check_declared(path, "size", path.stat().st_size, "a CIFAR-10 python batch")
    m = _Machine(path, path.read_bytes())
    try:
        return m.run()
    except _Bad as err:
        code = m.data[m.pos : m.pos + 1]  # the opcode, by its name (or byte), if any
        op = _CODE2OP.get(code.decode("latin1"))
        where = f"at byte {m.pos}" + (f", {op.name if op else repr(code)}" if code else "")
        if str(err).startswith("refused"):
            expected, found, hint = "a", f"{err}, {where}", "nothing from the file was run"
        else:
            found = f"a truncated or foreign pickle of {m.end} bytes ({where}: {err})"
            expected, hint = "a complete", ""
        raise FileFormatError(
            path, "pickle", f"{expected} CIFAR-10 python batch", found, hint
        ) from None
