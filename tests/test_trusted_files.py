"""Trusted files: no code runs from a data file, and every damaged or hostile file the package
reads (network, checkpoint, history, run.json, CIFAR-10 and MNIST files, the input of
``predict``) is refused with the package's ``FileFormatError`` (or a ``ValueError`` that names
the argument), before any work; bad in-memory inputs are refused by name too."""

import gzip
import io as _io
import json
import os
import pickle
import zipfile

import numpy as np
import pytest

from fenchel_cvx import cli
from fenchel_cvx.bcd import fit_bcd
from fenchel_cvx.datasets import load_cifar10, load_mnist
from fenchel_cvx.errors import FileFormatError
from fenchel_cvx.files import read_points
from fenchel_cvx.history import History
from fenchel_cvx.io import remove_temporaries
from fenchel_cvx.network import LiftedNetwork

RAW = (EOFError, zipfile.BadZipFile, KeyError, AttributeError, MemoryError, TypeError, IndexError)


# --- builders -------------------------------------------------------------------------------
def _npz(path, arrays, meta=None):
    """Write ``arrays`` (and ``meta``: a dict, or a raw string) as an .npz, as np.savez does."""
    payload = dict(arrays)
    if meta is not None:
        payload["meta"] = np.array(meta if isinstance(meta, str) else json.dumps(meta))
    with open(path, "wb") as f:
        np.savez(f, **payload)
    return path


def _parts(path):
    with np.load(path, allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    return arrays, json.loads(str(arrays.pop("meta")))


def _network_file(tmp):
    return LiftedNetwork([3, 4, 2], seed=1).save(tmp / "net.npz")


def _edit_network(change):
    """A network file with ``change(arrays, meta)`` applied (in place, or returning new parts)."""

    def make(tmp):
        arrays, meta = _parts(_network_file(tmp))
        out = change(arrays, meta) or (arrays, meta)
        return _npz(tmp / "edited.npz", *out)

    return make


def _cut(make, keep):
    """The file of ``make`` cut to ``keep(size)`` bytes."""

    def cut(tmp):
        path = make(tmp)
        data = path.read_bytes()
        path.write_bytes(data[: keep(len(data))])
        return path

    return cut


def _npy_member(header_dict, data=b"", version=b"\x01\x00"):
    """An .npz whose member W_0.npy has the given header dict and data bytes."""

    def make(tmp):
        header = repr(header_dict).encode()
        header += b" " * (63 - (10 + len(header)) % 64) + b"\n"
        npy = b"\x93NUMPY" + version + len(header).to_bytes(2, "little") + header + data
        path = tmp / "crafted.npz"
        meta = _io.BytesIO()
        np.lib.format.write_array(
            meta,
            np.array(
                json.dumps(
                    {
                        "format": "fenchel_cvx.LiftedNetwork/1",
                        "config": LiftedNetwork([3, 2]).get_config(),
                    }
                )
            ),
        )
        with zipfile.ZipFile(path, "w") as z:
            z.writestr("W_0.npy", npy)
            z.writestr("meta.npy", meta.getvalue())
        return path

    return make


def _drop(where, key):
    """A change removing ``key`` from the arrays ("a") or the meta ("m", "m.config") of a file."""

    def change(arrays, meta):
        target = arrays if where == "a" else meta
        for k in where.split(".")[1:]:
            target = target[k]
        del target[key]

    return change


def _set(key, value):
    def change(arrays, meta):
        meta[key] = value

    return change


def _config(key, value):
    def change(arrays, meta):
        meta["config"][key] = value

    return change


def _weight(l, value):
    def change(arrays, meta):
        arrays[f"W_{l}"] = value(arrays[f"W_{l}"])

    return change


def _flip_byte(make, where):
    """A byte of the file's data flipped (the zip's CRC no longer matches)."""

    def flip(tmp):
        path = make(tmp)
        data = bytearray(path.read_bytes())
        data[where(data)] ^= 0xFF
        path.write_bytes(bytes(data))
        return path

    return flip


def _u32(data, at):
    return int.from_bytes(data[at : at + 4], "little")


def _set_u32(data, at, value):
    data[at : at + 4] = value.to_bytes(4, "little")


def _set_u16(data, at, value):
    data[at : at + 2] = value.to_bytes(2, "little")


def _patch(make, edit):
    """The file of ``make`` with ``edit(bytearray)`` applied to its bytes."""

    def patch(tmp):
        path = make(tmp)
        data = bytearray(path.read_bytes())
        edit(data)
        path.write_bytes(bytes(data))
        return path

    return patch


def _raw_npy(header, data):
    """A .npy of version 1.0 whose header is the text ``header``, padded as NumPy pads it."""
    header += b" " * (63 - (10 + len(header)) % 64) + b"\n"
    return b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header + data


def _short_deflated_member(tmp):
    """A network file, deflated, whose W_0.npy lacks its last 16 bytes: the CRC is the short
    data's, and the uncompressed sizes (local and central) are patched to the full length, so
    the zip's checks pass and the data ends early."""
    with zipfile.ZipFile(_network_file(tmp)) as z:
        members = {i.filename: z.read(i) for i in z.infolist()}
    path = tmp / "short.npz"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in members.items():
            z.writestr(name, data[:-16] if name == "W_0.npy" else data)
    data = bytearray(path.read_bytes())
    for signature, name_at, size_at in ((b"PK\x03\x04", 30, 22), (b"PK\x01\x02", 46, 24)):
        at = next(
            i
            for i in range(len(data))
            if data.startswith(signature, i) and data.startswith(b"W_0.npy", i + name_at)
        )
        _set_u32(data, at + size_at, len(members["W_0.npy"]))
    path.write_bytes(bytes(data))
    return path


_MINUS_HEADER = b"{'descr': '<f8', 'fortran_order': False, 'shape': (" + b"-" * 5000 + b"1, 3), }"


def _end_record(data):
    """The offset of the zip's end-of-central-directory record in ``data``."""
    return bytes(data).rindex(b"PK\x05\x06")


def _utf8_flagged_0xff(data):
    """The directory's first name flagged UTF-8, its first byte 0xFF."""
    at = bytes(data).index(b"PK\x01\x02")
    _set_u16(data, at + 8, 0x800)
    data[at + 46] = 0xFF


NETWORK = [  # (id, make(tmp) -> path, a phrase of the refusal)
    (
        "empty file",
        lambda t: (t / "e.npz").write_bytes(b"") and t / "e.npz" or t / "e.npz",
        "empty file (0 bytes)",
    ),
    ("missing", lambda t: t / "missing.npz", "found nothing there"),
    ("a folder", lambda t: t, "found a folder"),
    ("half", _cut(_network_file, lambda n: n // 2), "no zip directory"),
    ("100 bytes", _cut(_network_file, lambda n: 100), "no zip directory"),
    ("one byte short", _cut(_network_file, lambda n: n - 1), "no zip directory"),
    ("plain npy", lambda t: (np.save(t / "w.npy", np.ones((4, 4))), t / "w.npy")[1], "no zip"),
    ("text", lambda t: (t / "x.npz").write_text("hello") and t / "x.npz", "no zip directory"),
    (
        "meta a JSON list",
        _edit_network(lambda a, m: (a, json.dumps([1, 2]))),
        "meta: expected a JSON object, found a JSON array",
    ),
    ("meta not JSON", _edit_network(lambda a, m: (a, "{not json")), "meta line 1"),
    ("meta missing", _edit_network(lambda a, m: (a, None)), "meta: expected the array meta"),
    (
        "meta of numbers",
        _edit_network(lambda a, m: ({**a, "meta": np.ones(3)}, None)),
        "expected a 0-d text array",
    ),
    (
        "no format",
        _edit_network(lambda a, m: (a, {k: v for k, v in m.items() if k != "format"})),
        "no format string",
    ),
    (
        "another format",
        _edit_network(_set("format", "fenchel_cvx.BCDCheckpoint/1")),
        "expected the format 'fenchel_cvx.LiftedNetwork/1'",
    ),
    (
        "a newer version",
        _edit_network(_set("format", "fenchel_cvx.LiftedNetwork/7")),
        "written by a newer fenchel_cvx",
    ),
    (
        "version not a number",
        _edit_network(_set("format", "fenchel_cvx.LiftedNetwork/x")),
        "a version number",
    ),
    ("no config", _edit_network(_drop("m", "config")), "meta.config"),
    ("config a list", _edit_network(_set("config", [1])), "meta.config"),
    (
        "config no layers",
        _edit_network(_drop("m.config", "layers")),
        "meta.config.layers: expected a list, found nothing",
    ),
    (
        "config 1e12 units",
        _edit_network(
            _config("layers", [{"kind": "dense", "units": 10**12}, {"kind": "dense", "units": 2}])
        ),
        "GiB for the float64 weights",
    ),
    ("config 1e12 inputs", _edit_network(_config("input_shape", [10**12])), "GiB"),
    ("config unknown layer", _edit_network(_config("layers", [{"kind": "lstm"}])), "lstm"),
    (
        "config unknown activation",
        _edit_network(_config("activations", [{"name": "gelu"}])),
        "gelu",
    ),
    (
        "config activation parameter",
        _edit_network(_config("activations", [{"name": "relu", "x": 1}])),
        "meta.config",
    ),
    ("config bad loss", _edit_network(_config("loss", "hinge")), "hinge"),
    ("config negative lam", _edit_network(_config("lam", [-1.0])), "lam must be > 0"),
    (
        "config float16",
        _edit_network(_config("dtype", "float16")),
        "meta.config.dtype: expected one of 'float32', 'float64', found 'float16'",
    ),
    ("config seed text", _edit_network(_config("seed", "0")), "meta.config.seed"),
    ("weight missing", _edit_network(_drop("a", "W_1")), "missing W_1"),
    ("extra array", _edit_network(lambda a, m: a.update(W_9=np.ones(2))), "unexpected W_9"),
    ("NaN weight", _edit_network(_weight(0, lambda W: W * np.nan)), "NaN or inf"),
    ("inf weight", _edit_network(_weight(1, lambda W: W + np.inf)), "NaN or inf"),
    ("1e300 weight", _edit_network(_weight(0, lambda W: W + 1e300)), "overflows float64"),
    ("complex weight", _edit_network(_weight(0, lambda W: W + 1j)), "expected dtype float64"),
    ("string weight", _edit_network(_weight(0, lambda W: W.astype(str))), "expected dtype float64"),
    ("int64 weight", _edit_network(_weight(0, lambda W: W.astype(np.int64))), "found dtype int64"),
    (
        "float32 weight",
        _edit_network(_weight(1, lambda W: W.astype(np.float32))),
        "found dtype float32",
    ),
    ("wrong shape", _edit_network(_weight(0, lambda W: W[:, :-1])), "expected shape (4, 4)"),
    ("transposed", _edit_network(_weight(1, lambda W: W.T)), "expected shape (2, 5)"),
    (
        "header 1e6 x 1e6",
        _npy_member({"descr": "<f8", "fortran_order": False, "shape": (10**6, 10**6)}),
        "bytes (its header",
    ),
    (
        "object member",
        _npy_member({"descr": "|O", "fortran_order": False, "shape": (2,)}),
        "Python objects are never unpickled",
    ),
    ("npy bad magic", lambda t: _zip_member(t, b"JUNKJUNKJUNK"), "the .npy magic string"),
    (
        "npy version 3",
        _npy_member(
            {"descr": "<f8", "fortran_order": False, "shape": (2, 4)}, b"\0" * 64, b"\x03\x00"
        ),
        "version 1.0 or 2.0",
    ),
    (
        "npy member cut",
        _npy_member({"descr": "<f8", "fortran_order": False, "shape": (2, 4)}, b"\0" * 40),
        "found 168 bytes",
    ),
    ("non-npy member", lambda t: _zip_member(t, b"x", name="README.txt"), "only .npy members"),
    ("bad CRC", _flip_byte(_network_file, lambda d: 200), "CRC"),
    (
        "bzip2 member",
        lambda t: _zip_member(t, b"x" * 100, method=zipfile.ZIP_BZIP2),
        "compression method 12",
    ),
    (
        "encrypted flag",
        _flip_byte(
            lambda t: _zip_member(t, b"x" * 100), lambda d: bytes(d).index(b"PK\x01\x02") + 8
        ),
        "flags 0xff",
    ),
    (
        "deflated member cut, sizes patched",
        _short_deflated_member,
        "W_0: expected the bytes its .npy header announces, found EOF: reading array data, "
        "expected 128 bytes got 112",
    ),
    (
        "zip version 17.5",
        _patch(_network_file, lambda d: _set_u16(d, d.index(b"PK\x01\x02") + 6, 175)),
        "zip directory: expected a readable zip directory, found NotImplementedError: zip file "
        "version 17.5",
    ),
    (
        "strong encryption flag",
        _patch(_network_file, lambda d: _set_u16(d, d.index(b"PK\x01\x02") + 8, 0x40)),
        "NotImplementedError: strong encryption",
    ),
    (
        "directory offset past itself",
        _patch(
            _network_file,
            lambda d: _set_u32(
                d, d.rindex(b"PK\x05\x06") + 16, _u32(d, d.rindex(b"PK\x05\x06") + 16) + 100
            ),
        ),
        "W_0.npy: expected a member inside the file, found a member at the offset -100",
    ),
    (
        "npy header left open",
        lambda t: _zip_member(
            t, _raw_npy(b"{'descr': '<f8', 'fortran_order': False, 'shape': (2, 4), ", b"\0" * 64)
        ),
        "W_0.npy: expected a .npy header (the dict NumPy writes: "
        "{'descr': '<dtype>', 'fortran_order': False, 'shape': (<integers>,)}), found a dict "
        "left open (no closing '}')",
    ),
    (
        "npy header of 5,000 minus signs",
        lambda t: _zip_member(t, _raw_npy(_MINUS_HEADER, b"\0" * 24)),
        "(not a non-negative integer)",
    ),
    (
        "npy dimension of 30,000 digits",
        lambda t: _zip_member(
            t,
            _raw_npy(
                b"{'descr': '<f8', 'fortran_order': False, 'shape': (" + b"9" * 30000 + b",), }",
                b"",
            ),
        ),
        "W_0.npy: expected a .npy header (the dict NumPy writes",
    ),
    (
        "npy header of 1 MiB",
        lambda t: _zip_member(
            t, b"\x93NUMPY\x02\x00" + (1 << 20).to_bytes(4, "little") + b" " * (1 << 20)
        ),
        "expected a .npy header of at most 65,536 bytes (NumPy writes a few hundred), found a "
        "header length of 1,048,576 bytes",
    ),
    (
        "npy header 1e12 x 1e12 float64",
        _npy_member({"descr": "<f8", "fortran_order": False, "shape": (10**12, 10**12)}),
        "within the read budget",
    ),
    (
        "zip end record of 5,000 entries",
        _patch(
            _network_file,
            lambda d: [_set_u16(d, _end_record(d) + at, 5000) for at in (8, 10)],
        ),
        "zip directory: expected at most 4,096 members",
    ),
    (
        "zip name flagged UTF-8 with a 0xff byte",
        _patch(_network_file, _utf8_flagged_0xff),
        "zip directory entry 1: expected a member name in UTF-8 (its UTF-8 flag is set)",
    ),
    (
        "deflated member of 8 MB of zeros",
        lambda t: _zip_member(
            t,
            _raw_npy(
                b"{'descr': '<f8', 'fortran_order': False, 'shape': (1000, 1000), }",
                bytes(8_000_000),
            ),
            method=zipfile.ZIP_DEFLATED,
        ),
        "W_0.npy: expected at most 1000 declared bytes per stored byte",
    ),
]


def _zip_member(tmp, data, name="W_0.npy", method=zipfile.ZIP_STORED):
    path = tmp / "z.npz"
    with zipfile.ZipFile(path, "w", compression=method) as z:
        z.writestr(name, data)
    return path


@pytest.mark.parametrize("make, phrase", [c[1:] for c in NETWORK], ids=[c[0] for c in NETWORK])
def test_damaged_network_files_are_refused_by_name(tmp_path, make, phrase):
    path = make(tmp_path)
    with pytest.raises(FileFormatError) as err:
        LiftedNetwork.load(path)
    assert phrase in str(err.value) and str(path) in str(err.value)


# --- checkpoints ----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A checkpoint of round 3 of 8 of a batched run with momentum (W, X, W0 and W_prev)."""
    folder = tmp_path_factory.mktemp("ckpt")
    rng = np.random.default_rng(0)
    X, Y = rng.normal(size=(3, 16)), np.eye(2)[:, rng.integers(0, 2, 16)]
    kw = dict(batch_size=8, epochs=2, alternations=2, momentum=0.5, backend="fast")
    fit_bcd(
        LiftedNetwork([3, 4, 2], seed=1),
        X,
        Y,
        checkpoint=folder,
        checkpoint_every=1,
        callback=lambda net, rec: rec["iteration"] >= 3,
        **kw,
    )
    return folder / "checkpoint.npz", X, Y, kw


class _NoSolve:
    """A backend that fails the test if any block reaches it."""

    name = "fast"

    def solve(self, block, start=None):
        raise AssertionError("a refused input reached a block solve")


def _edit_checkpoint(change):
    def make(tmp, src):
        arrays, meta = _parts(src)
        out = change(arrays, meta) or (arrays, meta)
        return _npz(tmp / "edited.npz", *out)

    return make


def _arr(name, value):
    def change(arrays, meta):
        arrays[name] = value(arrays[name])

    return change


def _hist(change_records):
    def change(arrays, meta):
        meta["history"]["records"] = change_records(meta["history"]["records"])

    return change


def _x1_declaring_2_3_gb(tmp, src):
    """The checkpoint ``src`` whose X_1.npy declares (4, 72,000,000) float64 (2.3 GB) in its
    header and in the zip's sizes, in a deflated file of a few dozen KB."""
    with zipfile.ZipFile(src) as z:
        members = {i.filename: z.read(i) for i in z.infolist()}
    x = _raw_npy(b"{'descr': '<f8', 'fortran_order': False, 'shape': (4, 72000000), }", b"")
    members["X_1.npy"] = x + bytes(1024)
    path = tmp / "declared.npz"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in members.items():
            z.writestr(name, data)
    data = bytearray(path.read_bytes())
    for signature, name_at, size_at in ((b"PK\x03\x04", 30, 22), (b"PK\x01\x02", 46, 24)):
        at = next(
            i
            for i in range(len(data))
            if data.startswith(signature, i) and data.startswith(b"X_1.npy", i + name_at)
        )
        _set_u32(data, at + size_at, len(x) + 4 * 72_000_000 * 8)
    path.write_bytes(bytes(data))
    return path


CHECKPOINT = [
    (
        "empty",
        lambda t, s: (t / "c.npz").write_bytes(b"") and t / "c.npz" or t / "c.npz",
        "empty file",
    ),
    (
        "half",
        lambda t, s: (
            (t / "c.npz").write_bytes(s.read_bytes()[: s.stat().st_size // 2]) and t / "c.npz"
        ),
        "no zip directory",
    ),
    (
        "one byte short",
        lambda t, s: (t / "c.npz").write_bytes(s.read_bytes()[:-1]) and t / "c.npz",
        "no zip directory",
    ),
    (
        "a network file",
        lambda t, s: LiftedNetwork([3, 4, 2]).save(t / "n.npz"),
        "expected the format 'fenchel_cvx.BCDCheckpoint/1'",
    ),
    ("no settings", _edit_checkpoint(_drop("m", "settings")), "meta.settings"),
    ("no data digest", _edit_checkpoint(_drop("m.settings", "data")), "meta.settings.data"),
    ("no history", _edit_checkpoint(_drop("m", "history")), "meta.history"),
    ("no iteration", _edit_checkpoint(_drop("m", "iteration")), "meta.iteration"),
    (
        "iteration -5",
        _edit_checkpoint(_set("iteration", -5)),
        "meta.iteration: expected an integer",
    ),
    ("iteration 2.7", _edit_checkpoint(_set("iteration", 2.7)), "found 2.7"),
    ("iteration text", _edit_checkpoint(_set("iteration", "3")), "found '3'"),
    ("iteration true", _edit_checkpoint(_set("iteration", True)), "found True"),
    ("iteration 1e12", _edit_checkpoint(_set("iteration", 10**12)), "rounds 1..1000000000000"),
    ("empty history", _edit_checkpoint(_hist(lambda r: [])), "0 records"),
    ("history one short", _edit_checkpoint(_hist(lambda r: r[:-1])), "2 records"),
    ("history of numbers", _edit_checkpoint(_hist(lambda r: [1, 2, 3])), "meta.history.records"),
    ("history no config", _edit_checkpoint(_drop("m.history", "config")), "meta.history"),
    ("has_Xs text", _edit_checkpoint(_set("has_Xs", "yes")), "meta.has_Xs"),
    ("no config", _edit_checkpoint(_drop("m", "config")), "meta.config"),
    (
        "config 1e12 units",
        _edit_checkpoint(
            lambda a, m: m["config"].update(
                layers=[{"kind": "dense", "units": 10**12}, {"kind": "dense", "units": 2}]
            )
        ),
        "GiB",
    ),
    ("NaN W", _edit_checkpoint(_arr("W_0", lambda W: W * np.nan)), "W_0: expected finite"),
    ("inf X", _edit_checkpoint(_arr("X_1", lambda X: X + np.inf)), "X_1: expected finite"),
    ("NaN W0", _edit_checkpoint(_arr("W0_1", lambda W: W * np.nan)), "W0_1"),
    ("NaN W_prev", _edit_checkpoint(_arr("W_prev_0", lambda W: W * np.nan)), "W_prev_0"),
    (
        "W wrong shape",
        _edit_checkpoint(_arr("W_1", lambda W: np.ones((3, 3)))),
        "W_1: expected shape (2, 5)",
    ),
    ("W int64", _edit_checkpoint(_arr("W_0", lambda W: W.astype(np.int64))), "dtype int64"),
    ("W float32", _edit_checkpoint(_arr("W_0", lambda W: W.astype(np.float32))), "dtype float32"),
    (
        "X wrong rows",
        _edit_checkpoint(_arr("X_1", lambda X: X[:2])),
        "X_1: expected shape (4, any)",
    ),
    ("X missing", _edit_checkpoint(_drop("a", "X_1")), "missing X_1"),
    ("W_prev partial", _edit_checkpoint(_drop("a", "W_prev_1")), "missing W_prev_1"),
    (
        "newer version",
        _edit_checkpoint(_set("format", "fenchel_cvx.BCDCheckpoint/2")),
        "newer fenchel_cvx",
    ),
    (
        "X_1 declares 2.3 GB",
        _x1_declaring_2_3_gb,
        "X_1.npy: expected declared bytes (its header: float64 of shape (4, 72000000)) within "
        "the read budget",
    ),
]


@pytest.mark.parametrize(
    "make, phrase", [c[1:] for c in CHECKPOINT], ids=[c[0] for c in CHECKPOINT]
)
def test_tampered_checkpoints_are_refused_before_any_solve(tmp_path, run, make, phrase):
    src, X, Y, kw = run
    path = make(tmp_path, src)
    with pytest.raises(FileFormatError) as err:
        fit_bcd(
            LiftedNetwork([3, 4, 2], seed=1), X, Y, resume=path, **{**kw, "backend": _NoSolve()}
        )
    assert phrase in str(err.value) and str(path) in str(err.value)


@pytest.mark.parametrize(
    "change, phrase",
    [
        (
            lambda a, m: (
                m.update(iteration=9)
                or m["history"]["records"].extend(
                    dict(m["history"]["records"][-1], iteration=i) for i in range(4, 10)
                )
            ),
            "round counter (meta.iteration) is 9, past the 8 rounds",
        ),
        (
            lambda a, m: a.update(X_1=np.ones((4, 5))),
            "X_1 has 5 columns, the batch of its round 3 8",
        ),
    ],
)
def test_a_checkpoint_outside_the_runs_schedule_is_refused(tmp_path, run, change, phrase):
    src, X, Y, kw = run
    path = _edit_checkpoint(change)(tmp_path, src)
    with pytest.raises(ValueError, match="resume: ") as err:
        fit_bcd(
            LiftedNetwork([3, 4, 2], seed=1), X, Y, resume=path, **{**kw, "backend": _NoSolve()}
        )
    assert phrase in str(err.value)


def test_resume_removes_a_killed_writes_temporaries(tmp_path, run):
    src, X, Y, kw = run
    (tmp_path / "checkpoint.npz").write_bytes(src.read_bytes())
    stale = [tmp_path / ".checkpoint.npz.abc123.tmp", tmp_path / ".history.json.x.tmp"]
    for p in stale:
        p.write_bytes(b"half")
    (tmp_path / "keep.tmp").write_bytes(b"not ours")
    res = fit_bcd(
        LiftedNetwork([3, 4, 2], seed=1), X, Y, resume=tmp_path, checkpoint=tmp_path, **kw
    )
    assert len(res.history) == 8
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint.npz", "keep.tmp"]
    assert remove_temporaries(tmp_path / "nowhere") == []


# --- JSON files -----------------------------------------------------------------------------
JSON = [
    ("empty", b"", "empty file"),
    ("not JSON", b"{", "line 1 column 2"),
    ("a list", b"[1]", "expected a JSON object, found a JSON array"),
    ("records not a list", b'{"records": 3}', "expected a History"),
    ("records of numbers", b'{"config": {}, "records": [1]}', "records: expected an object"),
    ("config a list", b'{"config": [], "records": []}', "records: expected an object"),
    ("invalid UTF-8", b'{"records": ["\xff"]}', "UTF-8"),
    ("newer format", b'{"format": "fenchel_cvx.History/9", "records": []}', "newer fenchel_cvx"),
    ("another format", b'{"format": "x/1", "records": []}', "fenchel_cvx.History/1"),
]


@pytest.mark.parametrize("data, phrase", [c[1:] for c in JSON], ids=[c[0] for c in JSON])
def test_damaged_histories_are_refused_by_name(tmp_path, data, phrase):
    (tmp_path / "history.json").write_bytes(data)
    with pytest.raises(FileFormatError, match=phrase):
        History.load(tmp_path / "history.json")


def test_history_save_is_atomic_and_round_trips(tmp_path):
    h = History({"a": 1}, [{"iteration": 1, "x": 0.5}])
    h.save(tmp_path / "h.json")
    assert History.load(tmp_path / "h.json").records == h.records
    assert [p.name for p in tmp_path.iterdir()] == ["h.json"]
    old = json.loads((tmp_path / "h.json").read_text())
    old.pop("format")  # as the earliest releases wrote it
    (tmp_path / "h.json").write_text(json.dumps(old))
    assert History.load(tmp_path / "h.json").config == {"a": 1}


@pytest.mark.parametrize(
    "edit, phrase",
    [
        ({"lam": "abc"}, "run.json: lam: expected a value --lam takes"),
        ({"batch_size": -1}, "run.json: batch_size"),
        ({"dataset": "imagenet"}, "run.json: dataset"),
        ({"backend": ["fast"]}, "run.json: backend"),
        ({"format": "fenchel_cvx.Run/3"}, "newer fenchel_cvx"),
    ],
)
def test_an_edited_run_json_is_refused_by_its_entry(tmp_path, capsys, edit, phrase):
    (tmp_path / "run.json").write_text(json.dumps({"dataset": "digits", **edit}))
    (tmp_path / "checkpoint.npz").write_bytes(b"x")
    with pytest.raises(SystemExit):
        cli.main(["resume", str(tmp_path)])
    err = capsys.readouterr().err
    assert phrase in err and "Traceback" not in err


# --- CIFAR-10: the restricted unpickler and the binary version -------------------------------
class _Call:
    """Pickles as a call of ``fn(*args)``: what a hostile batch holds."""

    def __init__(self, fn, *args):
        self.fn, self.args = fn, args

    def __reduce__(self):
        return self.fn, self.args


def _hostile(tmp, payload, protocol=2, as_value=False):
    """A CIFAR-10 folder whose data_batch_1 pickles ``payload`` (alone, or as its 'data')."""
    folder = tmp / "c"
    rng = np.random.default_rng(0)
    _write_batches(folder, rng)
    obj = {b"data": payload, b"labels": [0]} if as_value else payload
    (folder / "data_batch_1").write_bytes(pickle.dumps(obj, protocol=protocol))
    return folder


def _write_batches(folder, rng, n=2):
    folder.mkdir(parents=True, exist_ok=True)
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        d = {
            b"batch_label": name.encode(),
            b"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8),
            b"labels": [int(v) for v in rng.integers(0, 10, n)],
        }
        (folder / name).write_bytes(pickle.dumps(d, protocol=2))


def _marker_calls(marker):
    return [
        ("os.system", _Call(os.system, f"touch {marker}"), 2, "posix.system"),
        ("os.system as data", _Call(os.system, f"touch {marker}"), 4, "posix.system"),
        ("builtins.exec", _Call(exec, f"open({str(marker)!r}, 'w')"), 2, "__builtin__.exec"),
        ("builtins.eval", _Call(eval, f"open({str(marker)!r}, 'w')"), 4, "builtins.eval"),
        (
            "subprocess",
            _Call(__import__("subprocess").call, ["touch", str(marker)]),
            4,
            "subprocess.call",
        ),
        ("io.open", _Call(open, str(marker), "w"), 2, "io.open"),
        ("numpy.save", _Call(np.save, str(marker), np.ones(1)), 3, "numpy.save"),
    ]


@pytest.mark.parametrize("case", range(7), ids=[c[0] for c in _marker_calls("m")])
def test_a_crafted_pickles_side_effect_never_happens(tmp_path, case):
    marker = tmp_path / "ran"
    name, payload, protocol, refused = _marker_calls(marker)[case]
    folder = _hostile(tmp_path, payload, protocol, as_value="data" in name)
    with pytest.raises(FileFormatError) as err:
        load_cifar10(folder)
    assert f"refused the global {refused}" in str(
        err.value
    ) and "nothing from the file was run" in str(err.value)
    assert not marker.exists()


def test_a_crafted_pickle_runs_nothing_through_train_or_resume(tmp_path, capsys):
    marker = tmp_path / "ran"
    folder = _hostile(tmp_path, _Call(os.system, f"touch {marker}"))
    with pytest.raises(SystemExit):
        cli.main(
            [
                "train",
                "--dataset",
                "cifar10",
                "--data-dir",
                str(folder),
                "--out",
                str(tmp_path / "out"),
                "--quiet",
            ]
        )
    assert "refused the global posix.system" in capsys.readouterr().err
    assert not marker.exists() and not (tmp_path / "out").exists()  # nothing left behind
    run = tmp_path / "edited_run"  # a digits run.json edited to name it
    run.mkdir()
    (run / "run.json").write_text(
        json.dumps(
            {"dataset": "cifar10", "data_dir": str(folder), "batch_size": None, "backend": "cvxpy"}
        )
    )
    LiftedNetwork([3072, 2, 10]).save(run / "checkpoint.npz")
    with pytest.raises(SystemExit):
        cli.main(["resume", str(run), "--quiet"])
    assert "refused the global posix.system" in capsys.readouterr().err and not marker.exists()


CIFAR = [  # (id, the object pickled as data_batch_1, a phrase)
    ("a list", [1, 2], "expected a dict"),
    ("no labels", {b"data": np.zeros((1, 3072), np.uint8)}, "keys"),
    ("an extra key", {b"data": np.zeros((1, 3072), np.uint8), b"labels": [0], b"x": 1}, "keys"),
    ("float pixels", {b"data": np.zeros((1, 3072)), b"labels": [0]}, "refused the dtype"),
    (
        "object pixels",
        {b"data": np.array([None] * 3072, dtype=object).reshape(1, 3072), b"labels": [0]},
        "refused the dtype",
    ),
    (
        "short images",
        {b"data": np.zeros((1, 1000), np.uint8), b"labels": [0]},
        "data: expected uint8 images of shape (N, 3072)",
    ),
    ("label 10", {b"data": np.zeros((1, 3072), np.uint8), b"labels": [10]}, "the label 10"),
    ("label -1", {b"data": np.zeros((1, 3072), np.uint8), b"labels": [-1]}, "the label -1"),
    (
        "text labels",
        {b"data": np.zeros((1, 3072), np.uint8), b"labels": ["1"]},
        "labels: expected a list of 1 integers",
    ),
    (
        "too few labels",
        {b"data": np.zeros((2, 3072), np.uint8), b"labels": [1]},
        "a list of 2 integers",
    ),
    (
        "a matrix subclass",
        {b"data": np.zeros((1, 3072), np.uint8).view(np.matrix), b"labels": [0]},
        "refused the global numpy.matrix",
    ),
]


@pytest.mark.parametrize("obj, phrase", [c[1:] for c in CIFAR], ids=[c[0] for c in CIFAR])
def test_malformed_python_batches_are_refused(tmp_path, obj, phrase):
    folder = tmp_path / "c"
    _write_batches(folder, np.random.default_rng(1))
    (folder / "data_batch_1").write_bytes(pickle.dumps(obj, protocol=2))
    with pytest.raises(FileFormatError) as err:
        load_cifar10(folder)
    assert phrase in str(err.value) and "data_batch_1" in str(err.value)


def _raw_pickle(tmp, data):
    folder = tmp / "c"
    _write_batches(folder, np.random.default_rng(1))
    (folder / "test_batch").write_bytes(data)
    return folder


class _Built(_Call):
    """Pickles as ``fn(*args)``, then BUILD with ``state``."""

    def __init__(self, fn, args, state):
        super().__init__(fn, *args)
        self.state = state

    def __reduce__(self):
        return self.fn, self.args, self.state


def _strided(shape):
    """``numpy.ndarray(shape, uint8, 8 zero bytes, 0, 0-strides)``: terabytes from 8 bytes."""
    return _Call(np.ndarray, shape, np.dtype("u1"), b"\0" * 8, 0, (0,) * len(shape))


def _flagged_u1_batch():
    """A batch whose uint8 dtype's state sets the flags of a dtype holding Python objects, its
    pixels given as a list: on a copy of the dtype, NumPy would build a broken uint8 array."""
    from numpy._core.multiarray import _reconstruct

    dtype = _Built(np.dtype, ("u1", False, True), (3, "|", None, None, None, -1, -1, 63))
    data = _Built(_reconstruct, (np.ndarray, (0,), b"b"), (1, (1, 3072), dtype, False, [7] * 3072))
    return pickle.dumps({b"data": data, b"labels": [0]}, protocol=2)


BROKEN_PICKLES = [  # (id, the bytes of test_batch, a phrase)
    ("empty", b"", "empty file"),
    ("cut in a dict", b"\x80\x02}q", "a truncated or foreign pickle"),
    ("persistent id", b"\x80\x02P0\n.", "a truncated or foreign pickle"),
    ("no STOP", pickle.dumps(b"x")[:-1], "a truncated or foreign pickle"),
    # NumPy's _reconstruct asked for a terabyte: refused before any allocation
    (
        "reconstruct 1 TB",
        b"\x80\x02cnumpy.core.multiarray\n_reconstruct\ncnumpy\nndarray\n"
        b"J\x00\x00\x00\x01\x85C\x01b\x87R.",
        "refused reconstructing",
    ),
    (
        "bytes of 1 TB",
        b"\x80\x04\x8e" + (2**40).to_bytes(8, "little") + b"x",
        "a length of 1099511627776 bytes, 1 remain",
    ),
    ("frame of 1 TB", b"\x80\x04\x95" + (2**40).to_bytes(8, "little") + b"}.", "a frame of"),
    ("memo index 2**31", b"\x80\x02}r\xff\xff\xff\x7f.", "the memo index 2147483647"),
    ("append to a dict", b"\x80\x02}K\x01a.", "at byte 5, APPEND: a list to add to, and <dict"),
    (
        "ndarray of 0 strides",
        pickle.dumps({b"data": _strided((10**9, 3072)), b"labels": _strided((10**9,))}, protocol=2),
        "refused calling numpy.ndarray directly",
    ),
    (
        "ndarray of 3 PB",
        pickle.dumps(
            {b"data": _Call(np.ndarray, (10**12, 3072), np.dtype("u1")), b"labels": []}, protocol=2
        ),
        "refused calling numpy.ndarray directly",
    ),
    (
        "dtype flagged as objects",
        _flagged_u1_batch(),
        "refused the dtype state (3, '|', None, None, None, -1, -1, 63)",
    ),
    (
        "STACK_GLOBAL os.system",
        b"\x80\x04\x8c\x02os\x94\x8c\x06system\x94\x93.",
        "refused the global os.system",
    ),
]


@pytest.mark.parametrize(
    "data, phrase", [c[1:] for c in BROKEN_PICKLES], ids=[c[0] for c in BROKEN_PICKLES]
)
def test_broken_pickles_are_refused(tmp_path, data, phrase):
    with pytest.raises(FileFormatError, match="test_batch: ") as err:
        load_cifar10(_raw_pickle(tmp_path, data))
    assert phrase in str(err.value)


def test_arrays_of_any_byte_order_and_layout_keep_their_values(tmp_path):
    """The unpickler builds each array from its pickled state: big-endian labels and
    Fortran-ordered pixels, in protocols 2 and 5, read as written."""
    rng = np.random.default_rng(9)
    X, y = rng.integers(0, 256, (3, 3072), dtype=np.uint8), np.array([9, 0, 4], ">i8")
    for protocol in (2, 5):
        folder = _raw_pickle(
            tmp_path / str(protocol),
            pickle.dumps({b"data": np.asfortranarray(X), b"labels": y}, protocol=protocol),
        )
        ds = load_cifar10(folder)
        np.testing.assert_array_equal(ds.y_test, [9, 0, 4])
        np.testing.assert_array_equal(ds.X_test * 255, X.T)


def test_an_array_larger_than_its_file_is_refused(tmp_path, monkeypatch):
    """However it was built: an array of 0 strides, or of more bytes than the file holds."""
    from fenchel_cvx import datasets

    folder = _raw_pickle(tmp_path, b"\x80\x02N.")
    X, y = (
        np.lib.stride_tricks.as_strided(np.zeros(8, np.uint8), shape, (0,) * len(shape))
        for shape in [(10**9, 3072), (10**9,)]
    )
    monkeypatch.setattr(datasets, "_unpickle_batch", lambda path: {b"data": X, b"labels": y})
    with pytest.raises(
        FileFormatError,
        match=r"data_batch_1: data: expected a contiguous array "
        r"of at most the file's \d+ bytes, found "
        r"3072000000000 bytes .* strides \(0, 0\)",
    ):
        load_cifar10(folder)


def test_mutated_batches_load_or_are_refused_by_name(tmp_path):
    """Seeded mutations (flipped, inserted and deleted bytes, most in the pickle's opcodes
    before the pixels) of a batch in protocols 0, 2 and 4: each one loads as a valid data set
    or is refused with a FileFormatError naming the file; nothing else escapes."""
    folder = tmp_path / "c"
    _write_batches(folder, np.random.default_rng(7))
    rng, refused = np.random.default_rng(8), 0
    d = {
        b"batch_label": b"b",
        b"data": rng.integers(0, 256, (2, 3072), dtype=np.uint8),
        b"labels": [3, 7],
        b"filenames": [b"a.png", b"b.png"],
    }
    for protocol in (0, 2, 4):
        valid = pickle.dumps(d, protocol=protocol)
        for _ in range(100):
            raw = bytearray(valid)
            for _ in range(rng.integers(1, 4)):
                i = int(rng.integers(0, 300 if rng.random() < 0.8 else len(raw)))
                edit = rng.random()
                if edit < 0.6:
                    raw[i] ^= int(rng.integers(1, 256))
                elif edit < 0.8:
                    raw[i:i] = bytes([int(rng.integers(0, 256))])
                else:
                    del raw[i]
            (folder / "data_batch_1").write_bytes(bytes(raw))
            try:
                ds = load_cifar10(folder)
            except FileFormatError as err:
                assert "data_batch_1" in str(err)
                refused += 1
                continue
            assert ds.X_train.shape[0] == 3072 and 0 <= ds.X_train.min() <= ds.X_train.max() <= 1
            assert ds.y_train.dtype == np.int64 and set(ds.y_train) <= set(range(10))
    assert refused > 150


def _bin_folder(tmp, n=3, rng=None):
    rng = rng or np.random.default_rng(2)
    folder = tmp / "cifar-10-batches-bin"
    folder.mkdir(parents=True)
    batches = {}
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        rec = np.concatenate([rng.integers(0, 10, (n, 1)), rng.integers(0, 256, (n, 3072))], axis=1)
        (folder / f"{name}.bin").write_bytes(rec.astype(np.uint8).tobytes())
        batches[name] = rec
    return folder, batches


def test_the_binary_version_is_read_and_preferred(tmp_path, write_cifar10):
    write_cifar10(tmp_path / "cifar-10-batches-py", [2] * 6, np.random.default_rng(0))
    folder, batches = _bin_folder(tmp_path)
    d = load_cifar10(tmp_path)
    assert d.X_train.shape == (3072, 15) and d.X_test.shape == (3072, 3)
    np.testing.assert_array_equal(d.y_test, batches["test_batch"][:, 0])
    np.testing.assert_array_equal(d.X_test * 255, batches["test_batch"][:, 1:].T)
    (folder / "data_batch_2.bin").unlink()  # incomplete: the python version
    assert load_cifar10(tmp_path).X_train.shape == (3072, 10)


@pytest.mark.parametrize(
    "damage, phrase",
    [
        (lambda p: p.write_bytes(p.read_bytes()[:-1]), "a multiple of 3073 bytes"),
        (lambda p: p.write_bytes(b"\x0c" + p.read_bytes()[1:]), "the label 12"),
        (lambda p: p.write_bytes(b""), "empty file"),
        (lambda p: os.truncate(p, 200 << 20), "size: expected at most"),
    ],
)
def test_damaged_binary_batches_are_refused(tmp_path, damage, phrase):
    folder, _ = _bin_folder(tmp_path)
    damage(folder / "test_batch.bin")
    with pytest.raises(FileFormatError, match=phrase):
        load_cifar10(tmp_path)


def test_verify_names_a_folder_that_is_not_the_release(tmp_path, write_cifar10):
    from fenchel_cvx.datasets import ChecksumError

    write_cifar10(tmp_path / "py", [2] * 6, np.random.default_rng(0))
    assert load_cifar10(tmp_path / "py").X_test.shape == (3072, 2)  # small files: no verify
    with pytest.raises(ChecksumError, match="data_batch_1: md5 is .* expected c99cafc1"):
        load_cifar10(tmp_path / "py", verify=True)
    _bin_folder(tmp_path / "b")
    with pytest.raises(ChecksumError, match="data_batch_1.bin: 3 images, expected the official"):
        load_cifar10(tmp_path / "b", verify=True)


# --- MNIST: --verify ------------------------------------------------------------------------
def _idx(a):
    return (
        bytes([0, 0, 8, a.ndim]) + np.array(a.shape, ">u4").tobytes() + a.astype(np.uint8).tobytes()
    )


def _mnist_folder(tmp):
    folder = tmp / "mnist"
    folder.mkdir()
    for split, m in (("train", 60000), ("t10k", 10000)):
        (folder / f"{split}-images-idx3-ubyte").write_bytes(_idx(np.zeros((m, 28, 28))))
        (folder / f"{split}-labels-idx1-ubyte").write_bytes(_idx(np.arange(m) % 10))
    return folder


def test_cli_verify_refuses_a_changed_mnist_file(tmp_path, capsys):
    folder = _mnist_folder(tmp_path)
    assert load_mnist(folder).X_train.shape == (784, 60000)  # well-formed: loads
    with pytest.raises(SystemExit):
        cli.main(
            [
                "train",
                "--dataset",
                "mnist",
                "--data-dir",
                str(folder),
                "--verify",
                "--out",
                str(tmp_path / "o"),
                "--quiet",
            ]
        )
    err = capsys.readouterr().err
    assert "train-images-idx3-ubyte: sha256 of the uncompressed content is" in err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize(
    "name, data, phrase",
    [
        ("train-images-idx3-ubyte", b"\x08\x03\x00\x00", "magic"),
        ("train-images-idx3-ubyte", b"\x00\x00\x07\x03" + bytes(12), "unknown IDX dtype code 0x07"),
        ("train-labels-idx1-ubyte", b"\x00\x00\x08\x01\x00\x00", "header"),
        ("t10k-labels-idx1-ubyte", _idx(np.zeros(9999)), "labels: expected 10000 uint8 labels"),
        ("t10k-labels-idx1-ubyte", _idx(np.full(10000, 11)), "with max 11"),
        ("t10k-images-idx3-ubyte", _idx(np.zeros((10000, 28, 28)))[:-5], "size: expected"),
        ("t10k-images-idx3-ubyte.gz", b"\x1f\x8b\x08\x00garbage", "gzip"),
        (
            "train-images-idx3-ubyte",
            b"\x00\x00\x08\x03" + np.array([60000, 28, 28000], ">u4").tobytes() + bytes(16),
            "dimensions: expected bytes .* within the read budget",
        ),
        (
            "train-images-idx3-ubyte.gz",
            gzip.compress(b"\x00\x00\x08\x03" + np.array([1000] * 3, ">u4").tobytes(), mtime=0),
            "gzip: expected at most 1000 declared bytes per stored byte",
        ),
        (
            "t10k-labels-idx1-ubyte.gz",
            gzip.compress(_idx(np.zeros(10000)), mtime=0)[:-4] + (7).to_bytes(4, "little"),
            "gzip ISIZE: expected 10008",
        ),
        (
            "t10k-labels-idx1-ubyte.gz",
            gzip.compress(_idx(np.zeros(10000)) + bytes(5000), mtime=0)[:-4]
            + (10008).to_bytes(4, "little"),
            "found more: the stream runs past them",
        ),
    ],
)
def test_damaged_idx_files_are_refused(tmp_path, name, data, phrase):
    folder = _mnist_folder(tmp_path)
    (folder / name.removesuffix(".gz")).unlink()
    (folder / name).write_bytes(data)
    with pytest.raises(FileFormatError, match=phrase):
        load_mnist(folder)


# --- the input of predict -------------------------------------------------------------------
def _save(name, a, **kw):
    def make(tmp):
        np.save(tmp / name, a, **kw)
        return tmp / name

    return make


def _text(name, data):
    def make(tmp):
        (tmp / name).write_bytes(data)
        return tmp / name

    return make


POINTS = [
    (
        "object npy",
        _save("o.npy", np.array([[1, "a", None]], dtype=object), allow_pickle=True),
        "expected real numbers",
    ),
    ("string npy", _save("s.npy", np.array([["1", "2", "3"]])), "expected real numbers"),
    ("complex npy", _save("c.npy", np.ones((2, 3)) + 1j), "expected real numbers"),
    (
        "npy cut",
        lambda t: _cut(_save("k.npy", np.ones((50, 3))), lambda n: n - 8)(t),
        "size: expected",
    ),
    ("npy bad header", _text("h.npy", b"\x93NUMPY\x01\x00\x04\x00{}\n\n"), "header"),
    (
        "npy header left open",
        _text("o.npy", _raw_npy(b"{'descr': '<f8', 'shape': (1, 3), ", b"\0" * 24)),
        "expected a .npy header",
    ),
    ("npy wrong columns", _save("w.npy", np.ones((2, 4))), "rows of 3 numbers"),
    ("npy NaN", _save("n.npy", np.array([[1.0, np.nan, 2.0]])), "NaN or inf"),
    ("npy 1e300", _save("b.npy", np.full((1, 3), 1e300)), "overflows float64"),
    ("csv text", _text("t.csv", b"1,2,3\n4,x,6\n"), "row 2: expected comma-separated numbers"),
    ("csv ragged", _text("r.csv", b"1,2,3\n4,5\n"), "row 2: expected 3 numbers"),
    ("csv invalid UTF-8", _text("u.csv", b"1,2,\xff\n"), "UTF-8"),
    ("csv empty", _text("e.csv", b""), "empty file"),
    ("csv only comments", _text("c.csv", b"# nothing\n"), "no rows"),
    ("csv inf", _text("i.csv", b"1,inf,3\n"), "NaN or inf"),
    ("timedelta npy", _save("td.npy", np.array([[1, 2, 3]], "m8[s]")), "dtype timedelta64"),
    (
        "npy header of 5,000 minus signs",
        _text("m.npy", _raw_npy(_MINUS_HEADER, b"\0" * 24)),
        "not a non-negative integer",
    ),
    (
        "npy header 1e6 x 1e6 float64",
        _text(
            "g.npy",
            _raw_npy(
                b"{'descr': '<f8', 'fortran_order': False, 'shape': (1000000, 1000000), }", b""
            ),
        ),
        "within the read budget",
    ),
]


@pytest.mark.parametrize("make, phrase", [c[1:] for c in POINTS], ids=[c[0] for c in POINTS])
def test_bad_inputs_of_predict_are_refused(tmp_path, make, phrase):
    with pytest.raises(FileFormatError, match=phrase):
        read_points(make(tmp_path), 3)


def test_the_table_covers_every_category():
    sizes = dict(
        network=len(NETWORK),
        checkpoint=len(CHECKPOINT) + 2,
        json=len(JSON) + 5,
        cifar=7 + len(CIFAR) + len(BROKEN_PICKLES) + 4,
        idx=7,
        points=len(POINTS),
    )
    assert min(sizes.values()) >= 5 and sum(sizes.values()) >= 80, sizes


# --- in-memory inputs -----------------------------------------------------------------------
@pytest.mark.parametrize(
    "X, phrase",
    [
        (
            np.array([["1.5", "2"], ["3", "4"], ["5", "6"]], dtype=object),
            "X0 must be an array of numbers, got an object array holding str '1.5'",
        ),
        (np.array([[1.0, None], [2.0, 3.0], [1.0, 1.0]], dtype=object), "holding NoneType None"),
        (
            np.ma.masked_array(np.ones((3, 2)), mask=[[0, 1], [0, 0], [0, 0]]),
            "X0 must be a plain array, got a masked array with 1 masked entries",
        ),
        (np.ones((3, 2)) * 1e150, "X0 has a scale that overflows float64"),
    ],
)
def test_bad_arrays_are_refused_by_name_before_any_solve(X, phrase):
    Y = np.eye(2)
    with pytest.raises(ValueError) as err:
        fit_bcd(LiftedNetwork([3, 2]), X, Y, backend=_NoSolve(), iterations=1)
    assert phrase in str(err.value)


def test_float32_runs_check_the_scale_in_float32():
    X = np.ones((3, 2)) * 1e10  # fine in float64, not in float32
    fit_bcd(LiftedNetwork([3, 2]), X, np.eye(2), backend="fast", iterations=1)
    with pytest.raises(ValueError, match="X0 has a scale that overflows float32"):
        fit_bcd(
            LiftedNetwork([3, 2], dtype="float32"), X, np.eye(2), backend=_NoSolve(), iterations=1
        )


def test_layer_sizes_beyond_memory_name_the_gib():
    with pytest.raises(
        ValueError,
        match=r"layer_sizes needs 3\.73e\+03 GiB for the float32 "
        r"weights, more than this machine's",
    ):
        LiftedNetwork([10**6, 10**6, 2], dtype="float32")


def test_save_checks_its_destination_before_writing(tmp_path):
    net = LiftedNetwork([3, 2])
    (tmp_path / "afile").write_text("x")
    for path, phrase in (
        (tmp_path / "no" / "n.npz", "does not exist"),
        (tmp_path, "which is a folder"),
        (tmp_path / "afile" / "n.npz", "is a file"),
    ):
        with pytest.raises(ValueError, match=f"path must be .*{phrase}"):
            net.save(path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]


@pytest.mark.parametrize(
    "X, phrase",
    [
        (
            np.array([["1.5", "2"]] * 6, dtype=object),
            "X must be an array of numbers, got an object",
        ),
        (
            np.ma.masked_array(np.ones((6, 2)), mask=[[1, 0]] + [[0, 0]] * 5),
            "X must be a plain array, got a masked array with 1 masked entries",
        ),
    ],
)
def test_the_estimators_refuse_object_and_masked_inputs(X, phrase):
    from fenchel_cvx.estimator import FenchelClassifier

    with pytest.raises(ValueError, match=phrase):
        FenchelClassifier(backend="fast").fit(X, np.arange(6) % 2)


# --- files written before the checked reader -------------------------------------------------
@pytest.mark.parametrize("name", ["model.npz", "checkpoint.npz"])
def test_byte_flips_of_format1_files_load_or_are_refused_by_name(tmp_path, name):
    """300 seeded mutations (1 to 3 bytes changed, half of them in the zip's headers and
    directory) of a file in tests/data/format1, through the package's loader of that file:
    each one loads or is refused with a FileFormatError naming the file; nothing else escapes."""
    from pathlib import Path

    from fenchel_cvx.checkpoints import load_checkpoint

    load = LiftedNetwork.load if name == "model.npz" else load_checkpoint
    valid = (Path(__file__).parent / "data" / "format1" / name).read_bytes()
    starts = [i for i in range(len(valid)) if valid.startswith(b"PK\x03\x04", i)]
    headers = sorted(
        {i for s in starts for i in range(s, s + 200)}
        | set(range(valid.index(b"PK\x01\x02"), len(valid)))
    )
    rng, path, refused = np.random.default_rng(10), tmp_path / name, 0
    for _ in range(300):
        data = bytearray(valid)
        for _ in range(rng.integers(1, 4)):
            at = int(rng.choice(headers)) if rng.random() < 0.5 else int(rng.integers(len(data)))
            data[at] ^= int(rng.integers(1, 256))
        path.write_bytes(bytes(data))
        try:
            load(path)
        except FileFormatError as err:
            assert str(path) in str(err)
            refused += 1
    assert refused > 200


def test_files_of_format_version_1_still_load_and_resume(tmp_path):
    """tests/data/format1: a network, a checkpoint (round 3 of 8 of the ``run`` fixture's
    settings), a history and a run.json written by the release before the checked reader."""
    from pathlib import Path

    folder = Path(__file__).parent / "data" / "format1"
    net = LiftedNetwork.load(folder / "model.npz")
    assert net.layer_sizes == (3, 4, 2) and all(np.all(np.isfinite(W)) for W in net.W)
    assert len(History.load(folder / "history.json")) == 3
    saved = cli._run_args(folder)
    assert saved["arch"] == [64, 4, 10] and "format" not in saved  # no format field: version 1
    rng = np.random.default_rng(0)
    X, Y = rng.normal(size=(3, 16)), np.eye(2)[:, rng.integers(0, 2, 16)]
    res = fit_bcd(
        LiftedNetwork([3, 4, 2], seed=1),
        X,
        Y,
        resume=folder / "checkpoint.npz",
        batch_size=8,
        epochs=2,
        alternations=2,
        momentum=0.5,
        backend="fast",
    )
    assert len(res.history) == 8 and res.history.records[2]["iteration"] == 3
