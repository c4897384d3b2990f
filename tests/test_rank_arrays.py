"""Large arrays reach the spawned ranks through files in shared memory (``rank_arrays``): the
same values and layout, small arrays and other values pickled as they are, a folder that
cannot take the file leaves the array to the pickle, and every file removed after its run."""

import os

import numpy as np
import pytest

from fenchel_cvx import rank_arrays
from fenchel_cvx.rank_arrays import ArrayFile, discard, incoming, outgoing

pytestmark = pytest.mark.skipif(
    not os.path.isdir(rank_arrays.FOLDER), reason="no /dev/shm on this machine"
)


def test_a_large_array_goes_through_a_file_and_comes_back_equal_in_its_layout():
    rng = np.random.default_rng(0)
    X = rng.random((300, 600))  # 1.4 MB: a file
    F = np.asfortranarray(rng.random((600, 300)))
    small = rng.random((10, 10))
    sent, kw, paths = outgoing((X, small, "net"), dict(Y=F, seed=3))
    try:
        assert isinstance(sent[0], ArrayFile) and isinstance(kw["Y"], ArrayFile)
        assert sent[1] is small and sent[2] == "net" and kw["seed"] == 3
        assert len(paths) == 2 and all(os.stat(p).st_mode & 0o777 == 0o600 for p in paths)
        args, kwargs = incoming(sent, kw)
        np.testing.assert_array_equal(args[0], X)
        np.testing.assert_array_equal(kwargs["Y"], F)
        assert kwargs["Y"].flags.f_contiguous and type(args[0]) is np.ndarray
        args[0][0, 0] = -1.0  # copy on write: the rank's own page, not the file's
        np.testing.assert_array_equal(incoming(sent, {})[0][0], X)
    finally:
        discard(paths)
    assert not any(os.path.exists(p) for p in paths)


def test_a_folder_that_cannot_take_the_file_leaves_the_array_to_the_pickle(
    monkeypatch, tmp_path
):  # fmt: skip
    X = np.ones((400, 400))
    monkeypatch.setattr(rank_arrays, "FOLDER", str(tmp_path / "absent"))
    sent, _, paths = outgoing((X,), {})
    assert sent[0] is X and paths == []
    full = tmp_path / "full"
    full.mkdir()
    monkeypatch.setattr(rank_arrays, "FOLDER", str(full))

    def no_space(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(np.lib.format, "write_array", no_space)
    sent, _, paths = outgoing((X,), {})
    assert sent[0] is X
    discard(paths)
    assert list(full.iterdir()) == []  # the half-made file removed too


def test_an_array_written_by_parts_of_rows_loads_whole_and_a_full_folder_gives_none(
    monkeypatch, tmp_path
):  # fmt: skip
    """``write_rows`` writes consecutive blocks of rows (cast to the dtype) to one file whose
    bytes it reserves first: a rank loads the whole array; parts that do not fill the shape
    are refused and leave no file; a folder without room gives None and keeps no file."""
    X = np.arange(35.0).reshape(7, 5)
    handle = rank_arrays.write_rows(X.shape, np.float32, [X[:3], X[3:6], X[6:]])
    assert handle is not None
    try:
        loaded = handle.load()
        assert loaded.dtype == np.float32 and loaded.flags.c_contiguous
        np.testing.assert_array_equal(loaded, X)
    finally:
        discard([handle.path])
    full = tmp_path / "full"
    full.mkdir()
    monkeypatch.setattr(rank_arrays, "FOLDER", str(full))
    with pytest.raises(ValueError, match="hold 30 values, not the 35"):
        rank_arrays.write_rows(X.shape, X.dtype, [X[:6]])
    assert list(full.iterdir()) == []

    def no_space(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", no_space)
    assert rank_arrays.write_rows((1000, 1000), np.float64, []) is None
    assert list(full.iterdir()) == []


def test_a_run_on_ranks_leaves_no_file_behind(monkeypatch):
    """``Ranks.run`` sends the data through files (X: 1.2 MB) and removes them at the run's
    end; the spawned rank trains on the same data (the one-process result)."""
    pytest.importorskip("torch", reason="ranks need PyTorch (fenchel_cvx[bench])")
    from fenchel_cvx.baselines import train_backprop
    from fenchel_cvx.datasets import batch_order
    from fenchel_cvx.parallel import Ranks

    rng = np.random.default_rng(0)
    X, y = rng.standard_normal((300, 500)), rng.integers(0, 3, 500)  # 1.2 MB: a file
    batches = batch_order(500, 100, 1, seed=0)
    settings = dict(batches=batches, optimizer="adam", lr=1e-2, seed=0)
    sent, send = [], rank_arrays.outgoing

    def counted(args, kwargs):
        out = send(args, kwargs)
        sent.append([(path, os.path.exists(path)) for path in out[2]])
        return out

    monkeypatch.setattr(rank_arrays, "outgoing", counted)
    one = train_backprop((300, 8, 3), X, y, X[:, :50], y[:50], **settings)
    with Ranks(2, threads=1) as ranks:
        two = ranks.run(train_backprop, (300, 8, 3), X, y, X[:, :50], y[:50], **settings)
    # this run's own file, written for the run and gone after it (other tests' runs on the
    # same host may hold files of their own in the folder meanwhile)
    assert len(sent) == 1 and len(sent[0]) == 1
    ((path, written),) = sent[0]
    assert written and path.startswith(rank_arrays.FOLDER) and not os.path.exists(path)
    for a, b in zip(one.weights, two.weights):
        assert np.max(np.abs(a - b)) <= 1e-5 * np.max(np.abs(a))
