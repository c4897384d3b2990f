"""Every file read within a budget (``fenchel_cvx/budget.py``): what a file declares (a ``.npy``
header's shape, a zip's directory, an IDX header's dimensions, a CSV's rows) is costed before it
is allocated or parsed, and a hostile file is refused with a ``FileFormatError`` naming the file
and the field, in time and memory in proportion to the file.

The cases that could exhaust memory or hang on a reader without these checks run in a child
process under ``RLIMIT_AS`` 3 GiB and ``RLIMIT_CPU`` 60 s (:func:`_in_child`)."""

import gzip
import io as _io
import json
import os
import struct
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

import fenchel_cvx
from fenchel_cvx.checkpoints import load_checkpoint
from fenchel_cvx.datasets import load_mnist, parse_idx
from fenchel_cvx.errors import FileFormatError
from fenchel_cvx.files import NpzFile, read_points
from fenchel_cvx.io import load_network
from fenchel_cvx.network import LiftedNetwork

FORMAT1 = Path(__file__).parent / "data" / "format1"
ROOT = Path(fenchel_cvx.__file__).resolve().parents[1]

_CHILD = """
import json, resource, sys
resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))
resource.setrlimit(resource.RLIMIT_CPU, (60, 60))
from fenchel_cvx.errors import FileFormatError
path = sys.argv[1]
try:
    {call}
    out = dict(kind="returned", message="")
except FileFormatError as err:
    out = dict(kind="FileFormatError", message=str(err))
except BaseException as err:  # what the test reports: a raw error of the reader
    out = dict(kind=type(err).__name__, message=str(err)[:300])
# this interpreter's own peak (VmHWM: per address space; ru_maxrss would carry the forking
# parent's peak across exec)
with open("/proc/self/status") as f:
    out["maxrss_kib"] = next(int(l.split()[1]) for l in f if l.startswith("VmHWM:"))
print(json.dumps(out))
"""


def _in_child(call, path):
    """Run ``call`` (Python source; ``path``: the file, a str) in a fresh interpreter under
    RLIMIT_AS 3 GiB and RLIMIT_CPU 60 s; ``(kind, message, max RSS in MiB)`` of the outcome."""
    env = {
        **{k: v for k, v in os.environ.items() if k != "FENCHEL_READ_BUDGET"},
        "PYTHONPATH": str(ROOT),
        "OPENBLAS_NUM_THREADS": "1",
        "OMP_NUM_THREADS": "1",
    }
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD.format(call=call), str(path)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=ROOT,
    )
    lines = proc.stdout.strip().splitlines()
    assert proc.returncode == 0 and lines, (
        f"the child ended with status {proc.returncode} (a signal: over its CPU or memory "
        f"limit): {proc.stderr[-500:]}"
    )
    out = json.loads(lines[-1])
    return out["kind"], out["message"], out["maxrss_kib"] / 1024


def _refused_in_child(call, path, phrase, max_rss_mib=1024):
    kind, message, rss = _in_child(call, path)
    assert kind == "FileFormatError", (kind, message)
    assert str(path) in message and phrase in message, message
    assert rss < max_rss_mib, f"{rss:.0f} MiB"
    return message


@pytest.fixture(autouse=True)
def _default_budget(monkeypatch):
    """Each test starts at the default budget (2 GiB), whatever the environment says."""
    monkeypatch.delenv("FENCHEL_READ_BUDGET", raising=False)


# --- builders ---------------------------------------------------------------------------------
def _npy(header: bytes, data=b"", version=(1, 0)):
    """A .npy of ``version`` whose header is the text ``header`` (padded as NumPy pads it)."""
    width = 2 if version == (1, 0) else 4
    header += b" " * (63 - (8 + width + len(header)) % 64) + b"\n"
    return b"\x93NUMPY" + bytes(version) + len(header).to_bytes(width, "little") + header + data


def _npz(path, members, method=zipfile.ZIP_STORED):
    """A zip of ``members`` ({name: bytes}), as np.savez writes one."""
    with zipfile.ZipFile(path, "w", method) as z:
        for name, data in members.items():
            z.writestr(name, data)
    return path


def _meta_npy(fmt="fenchel_cvx.LiftedNetwork/1"):
    out = _io.BytesIO()
    meta = {"format": fmt, "config": LiftedNetwork([3, 2]).get_config()}
    np.lib.format.write_array(out, np.array(json.dumps(meta)))
    return out.getvalue()


def _network_with_member(path, npy):
    """A network file (of a 3 -> 2 network) whose W_0.npy is ``npy``."""
    return _npz(path, {"W_0.npy": npy, "meta.npy": _meta_npy()})


def _set_sizes(data: bytearray, name: bytes, file_size: int):
    """Patch the uncompressed size of the member ``name`` in its local header and the zip's
    directory."""
    for signature, name_at, size_at in ((b"PK\x03\x04", 30, 22), (b"PK\x01\x02", 46, 24)):
        at = next(
            i
            for i in range(len(data))
            if data.startswith(signature, i) and data.startswith(name, i + name_at)
        )
        data[at + size_at : at + size_at + 4] = file_size.to_bytes(4, "little")


def _zip_of_entries(path, n, declared=None, zip64_declared=None):
    """A zip whose directory lists ``n`` entries (all the same empty member ``W_0.npy``), its end
    record declaring ``declared`` of them (default: n, at most 0xFFFF) and, where given, a ZIP64
    end record declaring ``zip64_declared``."""
    name = b"W_0.npy"
    local = struct.pack("<4s2B4HL2L2H", b"PK\x03\x04", 20, 0, 0, 0, 0, 0, 0, 0, 0, len(name), 0)
    entry = struct.pack(
        "<4s4B4HL2L5H2L",
        b"PK\x01\x02",
        20,
        3,
        20,
        0,
        0,
        0,
        0,
        0,
        0,
        0,
        0,
        len(name),
        0,
        0,
        0,
        0,
        0,
        0,
    )
    directory = (entry + name) * n
    count = min(n, 0xFFFF) if declared is None else declared
    end = b""
    if zip64_declared is not None:
        at = len(local + name) + len(directory)
        end = struct.pack(
            "<4sQ2H2L4Q", b"PK\x06\x06", 44, 45, 45, 0, 0, zip64_declared, zip64_declared,
            len(directory), len(local + name),
        )  # fmt: skip
        end += struct.pack("<4sLQL", b"PK\x06\x07", 0, at, 1)
        count = 0xFFFF
    eocd = struct.pack(
        "<4s4H2LH", b"PK\x05\x06", 0, 0, count, count, len(directory), len(local + name), 0
    )
    path.write_bytes(local + name + directory + end + eocd)
    return path


def _idx_header(dims, code=0x08):
    return bytes([0, 0, code, len(dims)]) + np.array(dims, ">u4").tobytes()


def _idx_folder(tmp, images: bytes, gz=True):
    """A MNIST folder whose training images are ``images`` (the other three files: never read)."""
    folder = tmp / "mnist"
    folder.mkdir()
    name = "train-images-idx3-ubyte" + (".gz" if gz else "")
    (folder / name).write_bytes(images)
    for other in ("train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"):
        (folder / other).write_bytes(b"not read")
    return folder, folder / name


# --- .npy headers -----------------------------------------------------------------------------
MINUS = b"{'descr': '<f8', 'fortran_order': False, 'shape': (" + b"-" * 5000 + b"1, 3), }"


def test_a_header_of_5000_minus_signs_is_refused_not_parsed(tmp_path):
    """NumPy's header parser (``ast.literal_eval``) meets 5,000 unary minus signs with a
    RecursionError or MemoryError; the header is read with a pattern instead."""
    net = _network_with_member(tmp_path / "minus.npz", _npy(MINUS))
    _refused_in_child(
        "from fenchel_cvx.io import load_network\n"
        "    from fenchel_cvx.network import LiftedNetwork\n"
        "    load_network(path, LiftedNetwork)",
        net,
        "W_0.npy: expected a .npy header",
    )
    points = tmp_path / "minus.npy"
    points.write_bytes(_npy(MINUS, b"\0" * 24))
    _refused_in_child(
        "from fenchel_cvx.files import read_points\n    read_points(path, 3)",
        points,
        "header: expected a .npy header",
    )


def _shape_header(shape: bytes, version=(1, 0)):
    return lambda: _npy(
        b"{'descr': '<f8', 'fortran_order': False, 'shape': " + shape + b", }", version=version
    )


@pytest.mark.parametrize(
    "npy, phrase",
    [
        (
            _shape_header(b"(" + b"9" * 30_000 + b", 2)"),
            "a dimension of 30,000 digits (at most 20)",
        ),
        (
            _shape_header(b"(" + b"9" * (8 << 20) + b", " + b"9" * (8 << 20) + b")", (2, 0)),
            "expected a .npy header of at most 65,536 bytes",
        ),
        (
            lambda: _npy(b"{'descr': [('a', '<f8')], 'fortran_order': False, 'shape': (2,), }"),
            "expected a .npy header",
        ),
        (_shape_header(b"(5)"), "not a tuple"),
    ],
    ids=["30,000 digits", "two 8 MB integers", "structured dtype", "shape not a tuple"],
)
def test_a_headers_dimensions_are_bounded_before_int(tmp_path, npy, phrase):
    """Each dimension has at most 20 digits, checked before ``int()``; the header at most
    64 KiB, checked before it is read; and it is the dict NumPy writes, or refused."""
    path = _network_with_member(tmp_path / "digits.npz", npy())
    with pytest.raises(FileFormatError) as err:
        load_network(path, LiftedNetwork)
    assert str(path) in str(err.value) and "W_0.npy" in str(err.value)
    assert phrase in str(err.value)


def test_a_declared_shape_of_huge_integers_costs_a_few_comparisons(tmp_path):
    """A shape of 20-digit dimensions: ``budget.bounded_product`` stops at the budget."""
    shape = b"(" + b", ".join([b"9" * 20] * 64) + b",)"
    npy = _npy(b"{'descr': '<f8', 'fortran_order': False, 'shape': " + shape + b", }")
    path = _network_with_member(tmp_path / "wide.npz", npy)
    with pytest.raises(FileFormatError, match="within the read budget of 2,147,483,648 bytes"):
        NpzFile(path, "network")


# --- .npz members and directories -------------------------------------------------------------
def test_a_checkpoint_declaring_2_3_gb_in_a_small_file_is_refused_before_reading(tmp_path):
    """X_1 declares (4, 72,000,000) float64 (2.3 GB) and the zip declares as many bytes for it,
    in a file of 30 KB: refused from its header, before any byte of it is read or allocated."""
    with zipfile.ZipFile(FORMAT1 / "checkpoint.npz") as z:
        members = {i.filename: z.read(i) for i in z.infolist()}
    header = b"{'descr': '<f8', 'fortran_order': False, 'shape': (4, 72000000), }"
    members["X_1.npy"] = _npy(header, bytes(1024))
    path = _npz(tmp_path / "checkpoint.npz", members, zipfile.ZIP_DEFLATED)
    data = bytearray(path.read_bytes())
    _set_sizes(data, b"X_1.npy", len(members["X_1.npy"]) - 1024 + 4 * 72_000_000 * 8)
    path.write_bytes(bytes(data))
    _refused_in_child(
        "from fenchel_cvx.checkpoints import load_checkpoint\n    load_checkpoint(path)",
        path,
        "X_1.npy: expected declared bytes (its header: float64 of shape (4, 72000000)) within "
        "the read budget of 2,147,483,648 bytes, found more than that",
    )


def test_a_deflated_member_of_more_than_1000_to_1_is_refused(tmp_path):
    """8 MB of zeros deflated to 8 KB: more declared bytes per stored byte than MAX_RATIO."""
    npy = _npy(
        b"{'descr': '<f8', 'fortran_order': False, 'shape': (1000, 1000), }", bytes(8 * 10**6)
    )
    members = {"W_0.npy": npy, "meta.npy": _meta_npy()}
    path = _npz(tmp_path / "bomb.npz", members, zipfile.ZIP_DEFLATED)
    with pytest.raises(FileFormatError) as err:
        load_network(path, LiftedNetwork)
    assert str(path) in str(err.value)
    assert "W_0.npy: expected at most 1000 declared bytes per stored byte" in str(err.value)


def test_a_stored_member_whose_stored_size_differs_from_its_declared_size_is_refused(tmp_path):
    npy = _npy(b"{'descr': '<f8', 'fortran_order': False, 'shape': (2, 4), }", bytes(64))
    path = _network_with_member(tmp_path / "stored.npz", npy)
    data = bytearray(path.read_bytes())
    _set_sizes(data, b"W_0.npy", len(npy) + 128)  # the header's 192 bytes of data, not 64
    header = b"{'descr': '<f8', 'fortran_order': False, 'shape': (2, 12), }"
    at = data.index(b"{'descr'")
    data[at : at + len(header)] = header  # one byte longer: over the first byte of padding
    path.write_bytes(bytes(data))
    with pytest.raises(FileFormatError) as err:
        load_network(path, LiftedNetwork)
    assert (
        f"W_0.npy: expected {len(npy) + 128} stored bytes (a stored member's size), found "
        f"{len(npy)} bytes" in str(err.value)
    )


def test_a_directory_of_200000_entries_is_refused_before_zipfile_reads_it(tmp_path):
    """The directory is walked entry by entry up to MAX_MEMBERS + 1, whatever the end record
    declares (here: 1 entry); zipfile would make an object of each."""
    path = _zip_of_entries(tmp_path / "many.npz", 200_000, declared=1)
    _refused_in_child(
        "from fenchel_cvx.files import NpzFile\n    NpzFile(path, 'network')",
        path,
        "zip directory: expected at most 4,096 members (a network has a few hundred at most), "
        "found more than 4,096 entries",
        max_rss_mib=512,
    )


@pytest.mark.parametrize(
    "declared, zip64, found",
    [(5000, None, "5,000 entries declared"), (None, 4_200_000, "4,200,000 entries declared")],
)
def test_an_end_record_declaring_too_many_entries_is_refused(tmp_path, declared, zip64, found):
    path = _zip_of_entries(tmp_path / "declared.npz", 2, declared=declared, zip64_declared=zip64)
    with pytest.raises(FileFormatError) as err:
        NpzFile(path, "checkpoint")
    assert str(path) in str(err.value) and "zip directory: expected at most 4,096" in str(err.value)
    assert found in str(err.value)


def test_a_member_name_flagged_utf8_that_is_not_is_refused_by_name(tmp_path):
    path = LiftedNetwork([3, 2]).save(tmp_path / "net.npz")
    data = bytearray(path.read_bytes())
    at = data.index(b"PK\x01\x02")
    data[at + 8 : at + 10] = (0x800).to_bytes(2, "little")  # the UTF-8 flag
    data[at + 46] = 0xFF  # the first byte of the name
    path.write_bytes(bytes(data))
    with pytest.raises(FileFormatError) as err:
        load_network(path, LiftedNetwork)
    assert str(path) in str(err.value)
    assert "zip directory entry 1: expected a member name in UTF-8" in str(err.value)
    assert "the byte b'\\xff' at 0" in str(err.value)


# --- the input of predict ---------------------------------------------------------------------
@pytest.mark.parametrize(
    "array",
    [
        np.array([[1, 2, 3]], "m8[s]"),
        np.array([["NaT", "2020-01-01", "2020-01-02"]], "M8[D]"),
        np.ones((1, 3), complex),
        np.array([[b"1", b"2", b"3"]]),
        np.zeros((1, 3), "V8"),
        np.array([[1, 2, 3]], object),
    ],
    ids=["timedelta64", "datetime64", "complex", "bytes", "void", "object"],
)
def test_predict_reads_only_real_dtypes(tmp_path, array):
    """timedelta64 counts as an integer for NumPy (its NaT read as -9.2e18): only the kinds
    bool, int, uint and float are read."""
    path = tmp_path / "x.npy"
    np.save(path, array, allow_pickle=array.dtype.hasobject)
    with pytest.raises(FileFormatError) as err:
        read_points(path, 3)
    assert str(path) in str(err.value)
    assert (
        "dtype: expected real numbers (a bool, int, uint or float dtype), found dtype "
        f"{array.dtype}" in str(err.value)
    )


def test_a_csv_is_charged_against_the_budget_before_it_is_parsed(tmp_path, monkeypatch):
    """10,000 rows of 3 numbers: 240,000 bytes of float64, counted in a streaming pass before
    any row is parsed; refused at a budget of 100 KiB, read at the default."""
    path = tmp_path / "zeros.csv"
    path.write_bytes(b"0,0,0\n" * 10_000)
    monkeypatch.setenv("FENCHEL_READ_BUDGET", "100K")
    with pytest.raises(FileFormatError) as err:
        read_points(path, 3)
    assert str(path) in str(err.value)
    assert (
        "rows: expected float64 bytes (10,000 rows of 3 numbers) within the read budget of "
        "102,400 bytes, found more than that; FENCHEL_READ_BUDGET raises the budget"
        in str(err.value)
    )
    monkeypatch.delenv("FENCHEL_READ_BUDGET")
    A = read_points(path, 3)
    assert A.shape == (10_000, 3) and A.dtype == np.float64 and not A.any()


def test_a_csv_is_read_in_memory_in_proportion_to_it(tmp_path):
    """2,000,000 rows of ``0,0,0`` (12 MB): the array (48 MB) and a line at a time, where the
    rows as Python lists of floats took 20 times the file."""
    path = tmp_path / "big.csv"
    path.write_bytes(b"0,0,0\n" * 2_000_000)
    kind, message, rss = _in_child(
        "from fenchel_cvx.files import read_points\n    assert read_points(path, 3).shape == "
        "(2_000_000, 3)",
        path,
    )
    assert kind == "returned", message
    assert rss < 300, f"{rss:.0f} MiB"


def test_csv_rows_lines_and_comments_read_as_before(tmp_path):
    path = tmp_path / "x.csv"
    path.write_bytes(b"# a comment\r\n1, 2,3\r\n\r\n  \n4,5e0,-6\n7,8,9")
    np.testing.assert_array_equal(read_points(path, 3), [[1, 2, 3], [4, 5, -6], [7, 8, 9]])


# --- IDX --------------------------------------------------------------------------------------
def test_an_idx_header_declaring_more_than_the_budget_is_refused():
    data = _idx_header([0xFFFFFFFF] * 4) + bytes(16)
    with pytest.raises(
        FileFormatError, match="dimensions: expected bytes .* within the read budget"
    ):
        parse_idx(data, source="huge.idx")


def test_a_raw_idx_file_is_checked_against_its_header_before_it_is_read(tmp_path):
    folder, path = _idx_folder(tmp_path, _idx_header([60000, 28, 28000]) + bytes(100), gz=False)
    with pytest.raises(FileFormatError) as err:
        load_mnist(folder)
    assert (
        f"{path}: dimensions: expected bytes (its header: uint8 of shape (60000, 28, 28000))"
        in str(err.value)
    )


def test_a_gzipped_idx_declaring_1000_times_its_bytes_is_refused(tmp_path):
    """1 GB declared (within the budget) by a gzip file of a few dozen bytes."""
    folder, path = _idx_folder(tmp_path, gzip.compress(_idx_header([1000, 1000, 1000])))
    with pytest.raises(FileFormatError) as err:
        load_mnist(folder)
    assert f"{path}: gzip: expected at most 1000 declared bytes per stored byte" in str(err.value)


def test_a_gzip_trailer_that_disagrees_with_the_header_is_refused(tmp_path):
    data = bytearray(gzip.compress(_idx_header([10]) + bytes(10)))
    data[-4:] = (99).to_bytes(4, "little")
    folder, path = _idx_folder(tmp_path, bytes(data))
    with pytest.raises(
        FileFormatError, match=r"gzip ISIZE: expected 18 \(the 18 bytes its IDX header"
    ):
        load_mnist(folder)


def test_a_gzip_stream_longer_than_its_header_declares_stops_one_byte_past(tmp_path):
    """The ISIZE trailer is only mod 2**32 (here forged to agree): the stream is decompressed
    with a cap of the declared bytes + 1."""
    data = bytearray(gzip.compress(_idx_header([10]) + bytes(10 + 100_000)))
    data[-4:] = (18).to_bytes(4, "little")
    folder, path = _idx_folder(tmp_path, bytes(data))
    with pytest.raises(FileFormatError) as err:
        load_mnist(folder)
    assert f"{path}: gzip: expected 18 bytes uncompressed" in str(err.value)
    assert "found more: the stream runs past them" in str(err.value)


def test_mnist_loads_within_a_budget_of_64_mib(mnist_dir, monkeypatch):
    """MNIST's largest file declares 47 MB (9.9 MB of gzip): well within the default budget,
    and within 64 MiB."""
    monkeypatch.setenv("FENCHEL_READ_BUDGET", "64M")
    d = load_mnist(mnist_dir, dtype=np.float32)
    assert d.X_train.shape == (784, 60000) and d.X_test.shape == (784, 10000)


# --- the budget itself ------------------------------------------------------------------------
def test_fenchel_read_budget_lowers_the_budget(tmp_path, monkeypatch):
    """A legitimate small network: refused at a budget of 1 KiB, by name; loaded at the
    default."""
    path = LiftedNetwork([3, 4, 2], seed=1).save(tmp_path / "net.npz")
    monkeypatch.setenv("FENCHEL_READ_BUDGET", "1K")
    with pytest.raises(FileFormatError) as err:
        load_network(path, LiftedNetwork)
    assert str(path) in str(err.value) and "FENCHEL_READ_BUDGET raises the budget" in str(err.value)
    monkeypatch.setenv("FENCHEL_READ_BUDGET", "1M")
    assert load_network(path, LiftedNetwork).layer_sizes == (3, 4, 2)
    monkeypatch.delenv("FENCHEL_READ_BUDGET")
    assert load_network(path, LiftedNetwork).layer_sizes == (3, 4, 2)
    arrays, meta = load_checkpoint(FORMAT1 / "checkpoint.npz")
    assert sorted(arrays)[:3] == ["W0_0", "W0_1", "W_0"] and meta["iteration"] == 3


def test_the_arrays_of_a_file_together_are_within_the_budget(tmp_path, monkeypatch):
    """Each member within the budget, all of them together not: refused as "arrays"."""
    data = np.tile(np.arange(100.0), 100).tobytes()  # 80,000 bytes that deflate 80 to 1
    w = _npy(b"{'descr': '<f8', 'fortran_order': False, 'shape': (100, 100), }", data)
    path = _npz(tmp_path / "two.npz", {"W_0.npy": w, "W_1.npy": w}, zipfile.ZIP_DEFLATED)
    monkeypatch.setenv("FENCHEL_READ_BUDGET", "100K")
    with pytest.raises(
        FileFormatError, match="two.npz: arrays: expected the arrays together within"
    ):
        NpzFile(path, "network")


def test_a_checkpoints_lifted_variables_are_one_batch_before_any_is_read(tmp_path):
    """X_1 and X_2 hold the columns of one batch: their headers must agree before any array of
    the checkpoint is read."""
    from fenchel_cvx.bcd import fit_bcd

    rng = np.random.default_rng(0)
    X, Y = rng.normal(size=(3, 8)), np.eye(2)[:, rng.integers(0, 2, 8)]
    fit_bcd(LiftedNetwork([3, 4, 3, 2], seed=1), X, Y, checkpoint=tmp_path, iterations=1)
    path = tmp_path / "checkpoint.npz"
    with np.load(path, allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    assert arrays["X_1"].shape == (4, 8) and arrays["X_2"].shape == (3, 8)
    arrays["X_2"] = arrays["X_2"][:, :5]
    with open(path, "wb") as f:
        np.savez(f, **arrays)
    with pytest.raises(FileFormatError) as err:
        load_checkpoint(path)
    assert f"{path}: X_2: expected shape (3, 8), found shape (3, 5)" in str(err.value)
