"""The table of hostile files of ``benchmarks/hostile_battery.py``: every hostile case of the
tests, as a ``Case`` (its category, its name, ``make(folder)`` writing its files, ``read(path)``
reading them as the package does, and its label: what it must do).

The cases are the tests' own, imported (this needs the test extras, pytest among them), never
copied: the parameter tables of tests/test_trusted_files.py, test_read_budget.py,
test_cifar_pickle.py and test_schemas.py (``TABLES``: each row through an adapter, its phrase
left to the tests), the hostile files their single tests build (``SINGLE``: memory bombs, deep
nesting, huge integers, millions of opcodes, by the tests' builders) and the valid seed files of
benchmarks/fuzz_readers.py (``SEEDS``). The tests' fixtures (a checkpoint, a small trained run)
are built once a battery (``start``, then ``fixture``), in the process the children fork from.
"""

import argparse
import contextlib
import copyreg
import gzip
import io
import json
import os
import pickle
import sys
import tempfile
import zipfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE), str(HERE.parent / "tests")]

import fuzz_readers as fuzz  # noqa: E402
import test_cifar_pickle as tcp  # noqa: E402
import test_read_budget as rb  # noqa: E402
import test_schemas as ts  # noqa: E402
import test_trusted_files as tf  # noqa: E402
from fenchel_cvx import bcd, checkpoints, cli, datasets, errors, files, heap, history  # noqa: E402
from fenchel_cvx.network import LiftedNetwork  # noqa: E402

CATEGORIES = ("network", "checkpoint", "json", "cifar", "idx", "points")
#: the tests' fixtures, each built once per battery, before any child forks
FIXTURES = dict(
    checkpoint=lambda factory: tf.run.__wrapped__(factory),  # (path, X, Y, fit_bcd's settings)
    trained=lambda factory: ts.trained.__wrapped__(factory),  # a run of `fenchel-cvx train`
    seeds=lambda factory: factory.mktemp("seeds"),  # the folder of fuzz_readers' seed files
)
_MADE = {}


class Case(fuzz.Reader):
    """A case: ``make(folder)`` writes its files there and returns the one its refusal must name;
    ``read(path)`` reads it as the package does (in the child: at the default read budget or at
    ``env``'s, with the heap of the command line, which keeps freed blocks: ``fenchel_cvx.heap``,
    the same whatever ran before); ``label``: what it must do."""

    def __init__(self, category, name, make, read, label="named", env=None):
        self.category, self.name, self.make, self.label = category, name, make, label
        self._read, self.env = read, env or {}

    def read(self, path):
        os.environ.pop("FENCHEL_READ_BUDGET", None)
        os.environ.update(self.env)
        heap.keep_freed_memory()
        self._read(path)


def start(root):
    """A new battery: its fixtures to be built (again) in the folder ``root``."""
    _MADE.clear()
    _MADE["root"] = root
    root.mkdir(parents=True, exist_ok=True)


def fixture(name):
    """The fixture ``name`` of ``FIXTURES``, built on its first use in this battery."""
    if name not in _MADE:
        root = _MADE["root"]
        factory = argparse.Namespace(mktemp=lambda pre: Path(tempfile.mkdtemp(pre, dir=root)))
        with contextlib.redirect_stdout(io.StringIO()):
            _MADE[name] = FIXTURES[name](factory)
    return _MADE[name]


# --- readers: the package's entry points ------------------------------------------------------
def _resume(path):
    """As the checkpoint table's test reads it: ``fit_bcd(resume=path)``, no solve reached."""
    _, X, Y, settings = fixture("checkpoint")
    net = LiftedNetwork([3, 4, 2], seed=1)
    bcd.fit_bcd(net, X, Y, resume=path, **dict(settings, backend=tf._NoSolve()))


def _cli(argv_of):
    """A read through ``fenchel-cvx`` (its arguments ``argv_of(path)``): exit 0 loads; exit 2
    with a line naming the file, no traceback, is the refusal by name; any other exit, raw."""

    def read(path):
        err = io.StringIO()
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
            try:
                status = cli.main([str(a) for a in argv_of(path)])
            except SystemExit as exc:
                status = exc.code
        said = err.getvalue()
        named = status == 2 and "Traceback" not in said and path.name in said
        if named or status not in (0, None):
            kind = errors.FenchelError if named else AssertionError
            raise kind(f"exit {status}: {said.strip()[-300:]}")

    return read


def _no_call(read):
    """``read``, then a raw error where the file's call left its marker (``ran``, two folders up:
    where the tests' hostile batches point it)."""

    def checked(path):
        try:
            read(path)
        finally:
            if (path.parents[1] / "ran").exists():
                raise AssertionError("the pickle's call ran")

    return checked


def _extension_used(path):
    """test_cifar_pickle's extension case: the code registered and used once in the child."""
    copyreg.add_extension(tcp.__name__, "mark", EXTENSION)
    pickle.loads(_MADE["once"])
    datasets.load_cifar10(path.parent)


READ = dict(
    network=lambda p: LiftedNetwork.load(p),
    checkpoint=lambda p: checkpoints.load_checkpoint(p),
    history=lambda p: history.History.load(p),
    cifar=lambda p: datasets.load_cifar10(p.parent),
    binary=lambda p: datasets.load_cifar10(p.parents[1]),
    mnist=lambda p: datasets.load_mnist(p.parent),
    points=lambda p: files.read_points(p, 3),
    run=lambda command: _cli(lambda p: ts._argv(command, p.parent)),  # p: a file of the run
)


# --- builders: the tests' own, as make(folder) -> the file ------------------------------------
def _then(make, edit):
    """``make``, then ``edit(the file)``: the file."""
    return lambda t: (edit(path := make(t)), path)[1]


def _write(name, data):
    return _then(lambda t: t / name, lambda path: path.write_bytes(data))


def _run_file(name, change=None, text=None):
    """``name`` of a copy of the trained run (test_schemas' ``run``, beside the points of
    ``predict``), its JSON changed by ``change`` or replaced by ``text``."""
    edit = ts._edit_npz if name.endswith(".npz") else ts._edit_json
    return _then(
        lambda t: ts.run.__wrapped__(fixture("trained"), t) / name,
        lambda path: path.write_text(text) if text is not None else edit(path, change),
    )


def _interrupted(path):
    """A run as a killed training leaves it: resume goes on with its checkpoint."""
    for name in ("history.json", "model.npz", "objectives.png", "accuracy.png"):
        (path.parent / name).unlink()


def _batch(data):
    """A CIFAR-10 folder whose data_batch_1 holds ``data`` (bytes, or a function making them)."""
    return lambda t: tcp._folder(t, data() if callable(data) else data) / "data_batch_1"


def _marker_call(case):
    def make(t):
        name, payload, protocol, _ = tf._marker_calls(t / "ran")[case]
        return tf._hostile(t, payload, protocol, as_value="data" in name) / "data_batch_1"

    return make


EXTENSION = 0x7FF0  # test_cifar_pickle's copyreg code


def _extension(t):
    """test_cifar_pickle's batch naming its ``mark`` by a copyreg extension code, and a pickle
    that uses the code once, legitimately (``_MADE["once"]``: the child loads it first)."""
    copyreg.add_extension(tcp.__name__, "mark", EXTENSION)
    try:
        hostile = {b"data": tcp._Call(tcp.mark, str(t / "ran")), b"labels": [0]}
        _MADE["once"] = pickle.dumps(tcp._Call(tcp.mark, str(t / "legitimate use")), protocol=2)
        return _batch(pickle.dumps(hostile, protocol=2))(t)
    finally:
        copyreg.remove_extension(tcp.__name__, "mark", EXTENSION)


def _label_2_63(as_array):
    labels = np.array([2**63], np.uint64) if as_array else [2**63]
    return pickle.dumps({b"data": np.zeros((1, 3072), np.uint8), b"labels": labels}, protocol=2)


def _idx(images, gz=True):
    return lambda t: rb._idx_folder(t, images() if callable(images) else images, gz)[1]


def _npy(shape, data=b""):
    return rb._npy(b"{'descr': '<f8', 'fortran_order': False, 'shape': " + shape + b", }", data)


GARBAGE = ("model.npz", lambda meta: meta["config"].update(dtype="garbage"))
UNCERTIFIED = ("checkpoint.npz", ts._drop_certificates)
LONG4 = b"\x8b" + (8 << 20).to_bytes(4, "little") + b"\xff" * ((8 << 20) - 1) + b"\x01"
BUDGET_100K = {"FENCHEL_READ_BUDGET": "100K"}
SRC = lambda make: lambda t: make(t, fixture("checkpoint")[0])  # noqa: E731
ISIZE = lambda data, size: data[:-4] + size.to_bytes(4, "little")  # noqa: E731
# fmt: off
#: (category, tag, a parametrized test, its row -> (make, read[, label]))
TABLES = [
    ("network", "network", tf.test_damaged_network_files_are_refused_by_name,
     lambda make, _: (make, READ["network"])),
    ("network", "npy header", rb.test_a_headers_dimensions_are_bounded_before_int,
     lambda npy, _: (lambda t: rb._network_with_member(t / "d.npz", npy()), READ["network"])),
    ("network", "model dtype garbage", ts.test_a_models_garbage_dtype_is_refused_by_the_cli,
     lambda command: (_run_file(*GARBAGE), READ["run"](command))),
    ("checkpoint", "resume", tf.test_tampered_checkpoints_are_refused_before_any_solve,
     lambda make, _: (SRC(make), _resume)),
    ("checkpoint", "schedule", tf.test_a_checkpoint_outside_the_runs_schedule_is_refused,
     lambda change, _: (SRC(tf._edit_checkpoint(change)), _resume, "argument")),
    ("checkpoint", "zip end record", rb.test_an_end_record_declaring_too_many_entries_is_refused,
     lambda n, n64, _: (lambda t: rb._zip_of_entries(t / "e.npz", 2, n, n64),
                        READ["checkpoint"])),
    ("json", "history", tf.test_damaged_histories_are_refused_by_name,
     lambda data, _: (_write("history.json", data), READ["history"])),
    ("json", "run.json", tf.test_an_edited_run_json_is_refused_by_its_entry,
     lambda edit, _: (_then(_write("run.json", json.dumps({"dataset": "digits", **edit}).encode()),
                            lambda p: p.with_name("checkpoint.npz").write_bytes(b"x")),
                      _cli(lambda p: ["resume", p.parent]))),
    ("json", "run.json field", ts.test_an_edited_run_json_is_refused_by_its_field,
     lambda command, change, _: (_run_file("run.json", change), READ["run"](command))),
    ("json", "history field", ts.test_a_damaged_history_is_refused_by_its_field,
     lambda text, _: (_write("history.json", text.encode()), READ["history"])),
    ("json", "hostile history", ts.test_hostile_histories_are_refused_by_name_in_bounded_memory,
     lambda write, _: (_then(lambda t: t / "history.json", write), READ["history"])),
    ("json", "hostile run.json", ts.test_hostile_run_json_is_refused_by_the_cli_in_bounded_memory,
     lambda command, text, _: (_run_file("run.json", text=text), READ["run"](command))),
    ("cifar", "side effect", tf.test_a_crafted_pickles_side_effect_never_happens,
     lambda case: (_marker_call(case), _no_call(READ["cifar"]))),
    ("cifar", "batch", tf.test_malformed_python_batches_are_refused,
     lambda obj, _: (_batch(pickle.dumps(obj, protocol=2)), READ["cifar"])),
    ("cifar", "pickle", tf.test_broken_pickles_are_refused,
     lambda data, _: (lambda t: tf._raw_pickle(t, data) / "test_batch", READ["cifar"])),
    ("cifar", "binary", tf.test_damaged_binary_batches_are_refused,
     lambda damage, _: (_then(lambda t: tf._bin_folder(t)[0] / "test_batch.bin", damage),
                        READ["binary"])),
    ("cifar", "nested tuple key", tcp.test_a_deeply_nested_tuple_key_is_refused,
     lambda depth: (_batch(tcp._dict_of(b")" + b"\x85" * depth)), READ["cifar"])),
    ("cifar", "label 2**63", tcp.test_a_label_of_2_to_the_63_is_named,
     lambda as_array: (_batch(_label_2_63(as_array)), READ["cifar"])),
    ("idx", "mnist", tf.test_damaged_idx_files_are_refused,
     lambda name, data, _: (_then(lambda t: tf._mnist_folder(t) / name, lambda p: (
         p.with_name(name.removesuffix(".gz")).unlink(), p.write_bytes(data))), READ["mnist"])),
    ("points", "predict", tf.test_bad_inputs_of_predict_are_refused,
     lambda make, _: (make, READ["points"])),
    ("points", "predict dtype", rb.test_predict_reads_only_real_dtypes,
     lambda a: (_then(lambda t: t / "x.npy", lambda p: np.save(
         p, a, allow_pickle=a.dtype.hasobject)), READ["points"])),
]
#: the hostile files of single tests: (category, name, make, read[, label[, env]])
SINGLE = [
    ("network", "npy shape of 64 dimensions of 20 digits", lambda t: rb._network_with_member(
        t / "w.npz", _npy(b"(" + b", ".join([b"9" * 20] * 64) + b",)")), READ["network"]),
    ("network", "zip directory of 200,000 entries declaring 1",
     lambda t: rb._zip_of_entries(t / "many.npz", 200_000, declared=1), READ["network"]),
    ("network", "two deflated members over a budget of 100K", lambda t: rb._npz(
        t / "two.npz", dict.fromkeys(["W_0.npy", "W_1.npy"], _npy(b"(100, 100)", np.tile(
            np.arange(100.0), 100).tobytes())), zipfile.ZIP_DEFLATED),
     READ["network"], "named", BUDGET_100K),
    ("network", "model dtype garbage: load", _run_file(*GARBAGE), READ["network"]),
    ("checkpoint", "no certificates: load", _run_file(*UNCERTIFIED),
     lambda p: checkpoints.load_checkpoint(p.parent)),
    ("checkpoint", "no certificates: resume", _then(_run_file(*UNCERTIFIED), _interrupted),
     _cli(lambda p: ["resume", p.parent, "--quiet"])),
    ("cifar", "20 M opcodes NONE, POP", _batch(lambda: b"\x80\x02" + b"N0" * (20 << 20) + b"N."),
     READ["cifar"]),
    ("cifar", "20 M NONE in a list", _batch(lambda: b"\x80\x02(" + b"N" * (20 << 20) + b"l."),
     READ["cifar"]),
    ("cifar", "a shape of two 8 MB integers", _batch(lambda: tcp._shape_pickle(LONG4)),
     READ["cifar"]),
    ("cifar", "a shape of two 2**64", _batch(tcp._shape_pickle(
        b"\x8a\x09" + (2**64).to_bytes(9, "little"))), READ["cifar"]),
    ("cifar", "12 M EMPTY_SET", _batch(lambda: b"\x80\x04(" + b"\x8f" * (12 << 20) + b"l."),
     READ["cifar"]),
    ("cifar", "12 M EMPTY_LIST", _batch(lambda: b"\x80\x04(" + b"]" * (12 << 20) + b"l."),
     READ["cifar"]),
    ("cifar", "a copyreg extension code", _extension, _no_call(_extension_used)),
    ("cifar", "os.system through train",
     lambda t: tf._hostile(t, tf._Call(os.system, f"touch {t / 'ran'}")) / "data_batch_1",
     _no_call(_cli(lambda p: ["train", "--dataset", "cifar10", "--data-dir", p.parent,
                              "--out", p.parents[1] / "out", "--quiet"]))),
    ("idx", "a header of 4 x 0xFFFFFFFF",
     _write("huge-idx", rb._idx_header([0xFFFFFFFF] * 4) + bytes(16)), fuzz.Idx().read),
    ("idx", "a raw file short of its header",
     _idx(rb._idx_header([60000, 28, 28000]) + bytes(100), gz=False), READ["mnist"]),
    ("idx", "gzip of 1000 x its size", _idx(gzip.compress(rb._idx_header([1000] * 3))),
     READ["mnist"]),
    ("idx", "gzip ISIZE 99", _idx(ISIZE(gzip.compress(rb._idx_header([10]) + bytes(10)), 99)),
     READ["mnist"]),
    ("idx", "gzip stream past its header",
     _idx(lambda: ISIZE(gzip.compress(rb._idx_header([10]) + bytes(100_010)), 18)),
     READ["mnist"]),
    ("points", "csv of 10,000 rows over a budget of 100K", _write("z.csv", b"0,0,0\n" * 10_000),
     READ["points"], "named", BUDGET_100K),
    ("points", "csv of 2,000,000 rows", _write("big.csv", b"0,0,0\n" * 2_000_000),
     READ["points"], "loaded"),
]
#: fuzz_readers' readers by category: their valid seed files, labelled loaded
SEEDS = dict(run_json="json", history="json", checkpoint="checkpoint", network="network",
             idx="idx", cifar10="cifar", points_npy="points", points_csv="points")
# fmt: on


def _table(test):
    """``(id, row)`` of each case of ``test``'s parametrize table (a ``pytest.param`` unwrapped);
    the id: pytest's, or the row's last text (the phrase), or its first value."""
    (mark,) = [m for m in test.pytestmark if m.name == "parametrize"]
    names, rows = mark.args[:2]
    single = len(names.split(",") if isinstance(names, str) else names) == 1
    for i, row in enumerate(rows):
        param = type(row).__name__ == "ParameterSet"
        given, row = (row.id, row.values) if param else (None, (row,) if single else row)
        texts = [v for v in row if isinstance(v, str)]
        ids = mark.kwargs.get("ids")
        yield given or (ids[i] if ids else texts[-1] if texts else repr(row[0])), row


def collect():
    """Every case: the tables', the single tests', the seeds'; in the order of ``CATEGORIES``."""
    cases = [Case(c, f"{tag}: {name}", *adapt(*row)) for c, tag, test, adapt in TABLES
             for name, row in _table(test)]  # fmt: skip
    cases += [Case(*c) for c in SINGLE]
    for name, category in SEEDS.items():
        seed, read = fuzz.READERS[name].seed, fuzz.READERS[name].read
        make = lambda t, seed=seed: seed(fixture("seeds"))  # noqa: E731
        cases.append(Case(category, f"valid {name}", make, read, "loaded"))
    return sorted(cases, key=lambda c: CATEGORIES.index(c.category))
