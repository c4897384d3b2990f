"""The hostile-file battery (``benchmarks/hostile_battery.py``, its table in
``benchmarks/hostile_cases.py``): every hostile case of the tests' tables, with a label saying
what it must do, read in a child with its outcome, its seconds and its peak memory. Here: the
table is whole and labelled, one category reads as its labels say, and planted faults (a silent
accept, a read of 200 MB) are reported as breaches with exit status 1. The long run is the
script itself, over every category."""

import numpy as np

import test_read_budget
import test_trusted_files as tf
from _benchmarks import load_benchmark

battery = load_benchmark("hostile_battery")


def test_the_table_holds_every_parameter_table_with_a_label():
    """Each of the tests' tables of hostile files is in, row for row, and each case has a
    category, a unique name and a label."""
    cases = battery.collect()
    by = {}
    for c in cases:
        by.setdefault(c.category, []).append(c)
    assert sorted(by) == sorted(battery.CATEGORIES)
    assert {c.label for c in cases} == {"named", "argument", "loaded"}
    assert len({(c.category, c.name) for c in cases}) == len(cases)
    for table, category in [
        (tf.NETWORK, "network"),
        (tf.CHECKPOINT, "checkpoint"),
        (tf.JSON, "json"),
        (tf.CIFAR + tf.BROKEN_PICKLES, "cifar"),
        (tf.POINTS, "points"),
    ]:
        names = {c.name.partition(": ")[2] for c in by[category]}
        assert {row[0] for row in table} <= names, category
    dtypes = test_read_budget.test_predict_reads_only_real_dtypes.pytestmark[0].kwargs["ids"]
    assert {f"predict dtype: {i}" for i in dtypes} <= {c.name for c in by["points"]}


def test_a_category_reads_as_its_labels_say(tmp_path):
    """The points of ``predict`` (27 cases; the CSV of 2,000,000 rows left to the script): each
    outcome is its label (refused by name, or loaded), no read over its memory bound, and the
    counts add up."""
    cases = [c for c in battery.collect() if c.category == "points" and "2,000,000" not in c.name]
    outcomes = battery.battery(cases, tmp_path)
    assert [(o["name"], o["kind"]) for o in outcomes] == [(c.name, c.label) for c in cases]
    s = battery.summary(outcomes)
    assert sorted(s) == ["points", "total"]
    for group in s.values():
        assert group["cases"] == len(cases) == sum(group["kinds"].values())
        assert group["kinds"] == {"named": 25, "loaded": 2}
        assert group["wrong"] == group["silent"] == group["over_bound"] == 0
    assert all("memory" not in o["breach"] for o in outcomes)
    assert not list(tmp_path.glob("case*"))  # each case's folder removed after its read


def test_planted_faults_are_breaches_and_exit_1(tmp_path, capsys):
    """A reader that returns where a refusal is required (a silent accept) and one that takes
    200 MB on a file that declares 1 KB: each a breach by name, and the battery exits 1; the
    case that keeps its label is no breach."""
    kept = next(c for c in battery.collect() if c.name == "predict: csv empty")
    silent = battery.Case("points", "planted silent accept", kept.make, lambda path: None)
    bomb = battery.Case(
        "points",
        "planted 200 MB read",
        lambda t: (t / "small.csv").write_bytes(b"0,0,0\n" * 170) and t / "small.csv",
        lambda path: np.full(200 << 20, 7, np.uint8),
        "loaded",
    )
    assert battery.main(["--only", "points"], cases=[kept, silent, bomb]) == 1
    out = capsys.readouterr().out
    breaches = [line for line in out.splitlines() if line.startswith("BREACH")]
    assert len(breaches) == 2, out
    assert breaches[0].startswith("BREACH (silent accept) points / planted silent accept: loaded")
    assert breaches[1].startswith("BREACH (memory) points / planted 200 MB read: loaded")
    assert "points: 3 cases, {'named': 1, 'loaded': 2}, 1 not as labelled (1 silent accepts)" in out
    assert "1 over the memory bound" in out


def test_damaged_idx_files_are_refused_within_their_memory_bound(tmp_path):
    """MNIST's four files are checked before any is converted: the damaged test-set labels are
    refused without the 376 MB of float64 training images (each read within max(64 MB, 4 x the
    folder's 55 MB), where converting first took 450 MB); and the 12 MB pickle of empty lists,
    refused at the parser's stack limit, within 64 MB."""
    cases = [
        c
        for c in battery.collect()
        if c.name in ("mnist: labels: expected 10000 uint8 labels", "mnist: with max 11")
        or c.name.endswith("12 M EMPTY_LIST")
    ]
    assert len(cases) == 3, [c.name for c in cases]
    outcomes = battery.battery(cases, tmp_path)
    assert [o["kind"] for o in outcomes] == ["named"] * len(cases)
    assert [o["name"] for o in outcomes if "memory" in o["breach"]] == []
