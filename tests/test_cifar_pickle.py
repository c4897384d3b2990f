"""The CIFAR-10 python batches against hostile pickles: each is refused by a ``FileFormatError``
naming the file, with no crash, no hang, no memory out of proportion, no raw exception and no
call of anything the file names; and legitimate batches of every pickle protocol still load.

Each hostile file is read by ``load_cifar10`` in a child forked from this process under
``RLIMIT_AS`` (this process's address space and :data:`MEMORY` more) and ``RLIMIT_CPU``
(:data:`CPU_LIMIT`): a crash, a hang or a memory bomb is the child's death and this test's
failure, never the test run's. The files are built byte by byte (``pickle.dumps`` of a deeply
nested tuple would itself recurse). Only public loaders are imported, so that the same file
runs against an older tree.
"""

import copyreg
import faulthandler
import json
import os
import pickle
import resource
import signal

import numpy as np
import pytest

from fenchel_cvx.datasets import _unpickle_batch, load_cifar10
from fenchel_cvx.errors import FileFormatError
from test_cifar10 import _ndarray_py2, _py2_pickle

#: what a child may allocate beyond this process's address space, and its limit of CPU seconds:
#: a batch of at most 128 MB is read well within both
MEMORY, CPU_LIMIT = 3 << 30, 10
#: the most a hostile file's read may grow the child's resident memory
GROWTH = 512 << 20
NAMES = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]


def _folder(tmp_path, hostile):
    """A CIFAR-10 folder of small valid batches whose data_batch_1 holds the bytes ``hostile``
    (the loader reads it first)."""
    folder = tmp_path / "c"
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for name in NAMES:
        d = {b"data": rng.integers(0, 256, (2, 3072), dtype=np.uint8), b"labels": [1, 2]}
        (folder / name).write_bytes(pickle.dumps(d, protocol=2))
    (folder / "data_batch_1").write_bytes(hostile)
    return folder


def _kib(field):
    """``field`` of /proc/self/status (VmSize, VmRSS, VmHWM), in bytes."""
    with open("/proc/self/status") as f:
        line = next(line for line in f if line.startswith(field + ":"))
    return int(line.split()[1]) << 10


def _child(folder, before, out):
    faulthandler.disable()  # a crash is the child's death alone
    size = _kib("VmSize")
    resource.setrlimit(resource.RLIMIT_AS, (size + MEMORY, size + MEMORY))
    resource.setrlimit(resource.RLIMIT_CPU, (CPU_LIMIT, CPU_LIMIT + 1))
    start = _kib("VmRSS")
    try:
        before()
        load_cifar10(folder)
        outcome = dict(kind="loaded")
    except FileFormatError as err:
        outcome = dict(kind="FileFormatError", error=str(err)[:2000])
    except BaseException as err:  # noqa: BLE001 -- the outcome to report: any other exception
        outcome = dict(kind=type(err).__name__, error=str(err)[:2000])
    growth = _kib("VmHWM") - start
    os.write(out, (json.dumps(dict(outcome, growth=growth)) + "\n").encode())
    os._exit(0)


def refusal(tmp_path, hostile, before=lambda: None):
    """The message of the ``FileFormatError`` that ``load_cifar10`` raises, in a child under
    the limits, on a folder whose data_batch_1 holds ``hostile`` (``before()`` runs first in
    the child); the test fails on anything else: a load, another exception, the child's death
    (a crash, the CPU limit), a resident memory growth over :data:`GROWTH`."""
    folder = _folder(tmp_path, hostile)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        _child(folder, before, w)
    os.close(w)
    with os.fdopen(r) as pipe:
        line = pipe.read()
    _, status = os.waitpid(pid, 0)
    if not line:
        sig = os.WTERMSIG(status) if os.WIFSIGNALED(status) else None
        name = signal.Signals(sig).name if sig else f"status {status}"
        pytest.fail(f"the child reading {folder / 'data_batch_1'} died: {name}")
    outcome = json.loads(line)
    assert outcome["kind"] == "FileFormatError", outcome
    assert f"{folder / 'data_batch_1'}: " in outcome["error"], outcome
    assert outcome["growth"] < GROWTH, outcome
    return outcome["error"]


def _dict_of(key, value=b"K\x00"):
    """A protocol-2 pickle of ``{key: value}``, both given as opcodes."""
    return b"\x80\x02}(" + key + value + b"u."


@pytest.mark.parametrize("depth", [10**5, 10**6])
def test_a_deeply_nested_tuple_key_is_refused(tmp_path, depth):
    """A dict key of a tuple nested ``depth`` deep (EMPTY_TUPLE, then TUPLE1 ``depth`` times):
    hashing it recursed in C (10**6: SIGSEGV; 10**5: RecursionError)."""
    message = refusal(tmp_path, _dict_of(b")" + b"\x85" * depth))
    assert "refused tuples nested more than" in message and "TUPLE1" in message


def test_a_pickle_of_millions_of_opcodes_is_refused(tmp_path):
    """40 MB of NONE, POP (2 * 10**7 opcodes, each ~1 us to pre-scan), 20 MB of NONE in a list,
    and 2 MB of BINPUT: POP is no opcode of a batch; the list passes the stack's limit (each
    NONE a stack item), the BINPUTs the opcode limit."""
    message = refusal(tmp_path, b"\x80\x02" + b"N0" * (20 << 20) + b"N.")
    assert "at byte 3, POP: an opcode no CIFAR-10 batch uses" in message
    message = refusal(tmp_path / "list", b"\x80\x02(" + b"N" * (20 << 20) + b"l.")
    assert "refused a stack of more than" in message and "items" in message
    message = refusal(tmp_path / "memo", b"\x80\x02]" + b"q\x00" * (1 << 20) + b".")
    assert "refused a pickle of more than" in message and "opcodes" in message


def _shape_pickle(dim):
    """A batch whose pixels' state declares the shape ``(dim, dim)`` (``dim``: its opcode)."""
    reconstruct = b"cnumpy.core.multiarray\n_reconstruct\ncnumpy\nndarray\nK\x00\x85U\x01b\x87R"
    minus_1 = b"J" + (-1).to_bytes(4, "little", signed=True)
    dtype = b"cnumpy\ndtype\nU\x02u1K\x00K\x01\x87R(K\x03U\x01|NNN" + minus_1 * 2 + b"K\x00tb"
    state = b"(K\x01" + dim + dim + b"\x86" + dtype + b"\x89U\x00tb"
    return b"\x80\x02}(U\x04data" + reconstruct + state + b"U\x06labels]K\x00au."


def test_a_shape_of_huge_integers_is_refused(tmp_path):
    """Two 8 MB integers (LONG4) as a shape: their product ran for hours. LONG4 is no opcode
    of a batch; two 9-byte integers (LONG1) are costed within the read budget instead."""
    huge = b"\x8b" + (8 << 20).to_bytes(4, "little") + b"\xff" * ((8 << 20) - 1) + b"\x01"
    assert "LONG4: an opcode no CIFAR-10 batch uses" in refusal(tmp_path, _shape_pickle(huge))
    big = b"\x8a\x09" + (2**64).to_bytes(9, "little")
    message = refusal(tmp_path / "long1", _shape_pickle(big))
    assert "within the read budget" in message and "pickle at byte" in message


def test_millions_of_empty_containers_are_refused(tmp_path):
    """12 MB of EMPTY_SET in a list (2.9 GB for the unpickler): no set is built; 12 MB of
    EMPTY_LIST: refused at the stack's limit, within the memory this test allows."""
    message = refusal(tmp_path, b"\x80\x04(" + b"\x8f" * (12 << 20) + b"l.")
    assert "at byte 3, EMPTY_SET: an opcode no CIFAR-10 batch uses" in message
    message = refusal(tmp_path / "lists", b"\x80\x04(" + b"]" * (12 << 20) + b"l.")
    assert "refused a stack of more than" in message


@pytest.mark.parametrize("as_array", [False, True], ids=["list", "uint64 array"])
def test_a_label_of_2_to_the_63_is_named(tmp_path, as_array):
    labels = np.array([2**63], np.uint64) if as_array else [2**63]
    data = pickle.dumps({b"data": np.zeros((1, 3072), np.uint8), b"labels": labels}, protocol=2)
    assert "labels: expected classes 0..9, found the label 9223372036854775808" in refusal(
        tmp_path, data
    )


def mark(path):
    """What a hostile batch would call: leaves the file ``path``."""
    with open(path, "w") as f:
        f.write("called")


class _Call:
    def __init__(self, fn, *args):
        self.fn, self.args = fn, args

    def __reduce__(self):
        return self.fn, self.args


def test_an_extension_code_is_refused_without_any_call(tmp_path):
    """A copyreg extension code registered and used once in the process (the unpickler caches
    its callable, process-wide): a batch naming it by that code is refused by name, and
    nothing is called (in the child only: the registry is global)."""
    marker, code = tmp_path / "called", 0x7FF0
    copyreg.add_extension(__name__, "mark", code)
    try:
        hostile = pickle.dumps({b"data": _Call(mark, str(marker)), b"labels": [0]}, protocol=2)
        once = pickle.dumps(_Call(mark, str(tmp_path / "legitimate use")), protocol=2)
    finally:
        copyreg.remove_extension(__name__, "mark", code)
    assert b"\x83" + code.to_bytes(2, "little") in hostile  # EXT2, not the global's name

    def register_and_use():
        copyreg.add_extension(__name__, "mark", code)
        pickle.loads(once)

    message = refusal(tmp_path, hostile, before=register_and_use)
    assert f"refused the extension code {code} (opcode EXT2" in message
    assert "nothing from the file was run" in message and not marker.exists()


# --- legitimate batches ----------------------------------------------------------------------
def _batch(n, rng):
    return {
        b"batch_label": b"training batch 1 of 5",
        b"labels": [int(v) for v in rng.integers(0, 10, n)],
        b"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8),
        b"filenames": [f"img_{i}.png".encode() for i in range(n)],
    }


def _same(got, d):
    keys = {k.decode() if isinstance(k, bytes) else k for k in got}
    assert keys == {"batch_label", "labels", "data", "filenames"}
    got = {k.encode() if isinstance(k, str) else k: v for k, v in got.items()}
    assert got[b"labels"] == d[b"labels"] and got[b"filenames"] == d[b"filenames"]
    np.testing.assert_array_equal(got[b"data"], d[b"data"])


@pytest.mark.parametrize("protocol", range(6))
def test_batches_of_every_protocol_load(tmp_path, protocol):
    """NumPy 2 batches pickled by Python 3 in protocols 0 to 5 (bytes through _codecs.encode
    below 3, in-band buffers in 5), big-endian labels and Fortran-ordered pixels among them;
    and, in protocols 0 and 2, as NumPy 1 named its reconstructor (numpy.core)."""
    d = _batch(5, np.random.default_rng(protocol))
    path = tmp_path / "b"
    path.write_bytes(pickle.dumps(d, protocol=protocol))
    _same(_unpickle_batch(path), d)
    y, X = np.array(d[b"labels"], ">i8"), np.asfortranarray(d[b"data"])
    path.write_bytes(pickle.dumps({"data": X, "labels": y}, protocol=protocol))
    got = _unpickle_batch(path)
    assert got["labels"].dtype == np.dtype(">i8") and got["labels"].tolist() == d[b"labels"]
    np.testing.assert_array_equal(got["data"], X)
    if protocol in (0, 2):  # GLOBAL opcodes: the module's name on a line of its own
        path.write_bytes(pickle.dumps(d, protocol=protocol).replace(b"numpy._core", b"numpy.core"))
        _same(_unpickle_batch(path), d)


@pytest.mark.parametrize("python", [2, 3])
def test_a_full_size_batch_loads(tmp_path, python):
    """10,000 images, labels and file names, as the official release pickles them (Python 2,
    protocol 2) and as Python 3 does in protocol 2 (each file name through _codecs.encode: the
    most opcodes an image)."""
    d = _batch(10000, np.random.default_rng(python))
    path = tmp_path / "data_batch_1"
    if python == 2:
        path.write_bytes(_py2_pickle({**d, b"data": _ndarray_py2(d[b"data"])}, 2))
    else:
        path.write_bytes(pickle.dumps(d, protocol=2))
    _same(_unpickle_batch(path), d)


def test_the_read_budget_bounds_what_a_batch_builds(tmp_path, monkeypatch):
    """The file and each string a batch holds are charged against FENCHEL_READ_BUDGET before
    they are read or built: a batch of 31 KB (30 KB of pixels) loads within 96 KB, and is
    refused by name, at its pixels' opcode, within 48 KB."""
    d = _batch(10, np.random.default_rng(7))
    path = tmp_path / "b"
    path.write_bytes(pickle.dumps(d, protocol=4))
    monkeypatch.setenv("FENCHEL_READ_BUDGET", "96K")
    _same(_unpickle_batch(path), d)
    monkeypatch.setenv("FENCHEL_READ_BUDGET", "48K")
    with pytest.raises(FileFormatError, match=rf"{path}: pickle at byte \d+: expected .* within "):
        _unpickle_batch(path)
