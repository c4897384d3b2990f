"""Saving and loading networks (``LiftedNetwork.save`` / ``load``) and the file format."""

import io
import json
import zipfile
from pathlib import Path

import numpy as np
import pytest

from fenchel_cvx import __version__
from fenchel_cvx.activations import activation
from fenchel_cvx.bcd import fit_bcd
from fenchel_cvx.checkpoints import load_checkpoint
from fenchel_cvx.io import read_npz, write_npz
from fenchel_cvx.network import LiftedNetwork


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_save_load_round_trip(tmp_path, dtype):
    net = LiftedNetwork(
        [5, 4, 3, 2],
        [activation("leaky_relu", slope=0.2), "tanh"],
        "cross_entropy",
        lam=(2.0, 3.0),
        rho=(0.1, 0.2, 0.3),
        seed=7,
        dtype=dtype,
    )
    rng = np.random.default_rng(0)
    X, Y = rng.normal(size=(5, 12)), np.eye(2)[:, rng.integers(0, 2, 12)]
    fit_bcd(net, X, Y, backend="fast", iterations=2)
    path = net.save(tmp_path / "net.npz")
    back = LiftedNetwork.load(path)
    assert back.layer_sizes == net.layer_sizes and back.lam == net.lam and back.rho == net.rho
    assert [a.name for a in back.activations] == ["leaky_relu", "tanh"]
    assert back.activations[0].slope == 0.2 and back.loss.name == "cross_entropy"
    assert back.seed == 7 and back.W[0].dtype == np.dtype(dtype)
    for a, b in zip(back.W, net.W):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(back.predict(X), net.predict(X))


def test_format_is_npz_plus_json_without_pickle(tmp_path):
    path = LiftedNetwork([3, 2]).save(tmp_path / "n.npz")
    with zipfile.ZipFile(path) as z:
        assert sorted(z.namelist()) == ["W_0.npy", "meta.npy"]
    with np.load(path, allow_pickle=False) as z:
        meta = json.loads(str(z["meta"]))
    assert meta["format"] == "fenchel_cvx.LiftedNetwork/1" and meta["version"] == __version__
    assert meta["config"]["layers"] == [{"kind": "dense", "units": 2}]
    assert meta["config"]["input_shape"] == [3] and meta["config"]["dtype"] == "float64"


def test_atomic_write_leaves_the_old_file_on_failure(tmp_path):
    path = write_npz(tmp_path / "a.npz", {"x": np.ones(2)}, {"format": "t/1"})
    with pytest.raises(ValueError, match="allow_pickle=False"):  # fails after "x" is written
        write_npz(path, {"x": np.ones(3), "y": np.array([None])}, {"format": "t/1"})
    arrays, meta = read_npz(path, "t/1")
    np.testing.assert_array_equal(arrays["x"], np.ones(2))
    assert [p.name for p in tmp_path.iterdir()] == ["a.npz"]


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda p: p / "missing.npz", "expected an existing network"),
        (lambda p: (p / "junk.npz").write_text("not a zip") and p / "junk.npz", "no zip directory"),
        (
            lambda p: write_npz(p / "other.npz", {}, {"format": "x/1"}),
            "expected the format 'fenchel_cvx.Lifted",
        ),
    ],
)
def test_load_bad_files_named(tmp_path, make, match):
    with pytest.raises(ValueError, match=match):
        LiftedNetwork.load(make(tmp_path))


def test_checkpoint_of_a_file_is_refused(tmp_path):
    path = LiftedNetwork([3, 2]).save(tmp_path / "n.npz")
    with pytest.raises(ValueError, match="BCDCheckpoint"):
        load_checkpoint(path)


def test_unwritable_checkpoint_folder_named_before_work(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    net = LiftedNetwork([3, 2])
    with pytest.raises(ValueError, match="checkpoint must be a writable folder"):
        fit_bcd(net, np.ones((3, 4)), np.ones((2, 4)), backend="fast", checkpoint=blocker / "d")


def test_public_api_is_typed():
    import typing
    from pathlib import Path

    import fenchel_cvx
    from fenchel_cvx.io import load_network, save_network

    assert (Path(fenchel_cvx.__file__).parent / "py.typed").is_file()
    for f in (fit_bcd, LiftedNetwork.save, LiftedNetwork.load, save_network, load_network):
        assert typing.get_type_hints(f)["return"] is not None


def test_conv_network_round_trip(tmp_path):
    from fenchel_cvx.layers import AvgPool2d, Conv2d, Dense, Flatten

    net = LiftedNetwork.from_layers(
        (1, 8, 8),
        [Conv2d(2, 3), AvgPool2d(2), Flatten(), Dense(3)],
        loss="cross_entropy",
        lam=2.0,
        seed=4,
        dtype="float32",
    )
    net.W = [W + 0.5 for W in net.W]  # not the initialisation: the file holds the weights
    back = LiftedNetwork.load(net.save(tmp_path / "conv.npz"))
    assert back.get_config() == net.get_config() and back.input_shape == (1, 8, 8)
    X = np.random.default_rng(0).normal(size=(64, 5)).astype(np.float32)
    np.testing.assert_array_equal(back.predict(X), net.predict(X))


def _tiny_run(checkpoint=None):
    rng = np.random.default_rng(0)
    X, Y = rng.normal(size=(3, 8)), np.eye(2)[:, rng.integers(0, 2, 8)]
    net = LiftedNetwork([3, 4, 2], seed=0)
    res = fit_bcd(
        net, X, Y, backend="fast", iterations=2, X_test=X, Y_test=Y, checkpoint=checkpoint
    )
    return net, res.history


def test_checkpoints_networks_histories_and_plots_are_0666_less_the_umask(tmp_path):
    import os

    from fenchel_cvx.plotting import plot_accuracy, plot_objectives

    for umask in (0o022, 0o077):
        folder = tmp_path / f"u{umask:03o}"
        old = os.umask(umask)
        try:
            net, history = _tiny_run(checkpoint=folder)
            net.save(folder / "model.npz")
            history.save(folder / "history.json")
            plot_objectives(history, folder / "objectives.png")
            plot_accuracy(history, folder / "accuracy.png")
        finally:
            os.umask(old)
        modes = {p.name: oct(p.stat().st_mode & 0o777) for p in folder.iterdir()}
        names = ("checkpoint.npz", "model.npz", "history.json", "objectives.png", "accuracy.png")
        assert modes == dict.fromkeys(names, oct(0o666 & ~umask)), oct(umask)


def test_a_plot_that_fails_to_render_leaves_the_old_file(tmp_path, monkeypatch):
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from fenchel_cvx.plotting import plot_accuracy

    _, history = _tiny_run()
    path = tmp_path / "accuracy.png"
    path.write_bytes(b"the last run's plot")

    render = FigureCanvasAgg.print_png

    def render_half(self, target, **kw):  # as a full disk: part of the PNG, then an error
        if isinstance(target, io.BytesIO):  # matplotlib's own draw in memory, for the layout
            return render(self, target, **{k: kw[k] for k in ("metadata", "pil_kwargs") if k in kw})
        if hasattr(target, "write"):
            target.write(b"\x89PNG\r\n\x1a\n")
        else:
            Path(target).write_bytes(b"\x89PNG\r\n\x1a\n")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(FigureCanvasAgg, "print_png", render_half)
    with pytest.raises(OSError, match="No space left"):
        plot_accuracy(history, path)
    assert path.read_bytes() == b"the last run's plot"
    assert [p.name for p in tmp_path.iterdir()] == ["accuracy.png"]


def test_the_data_digest_is_the_c_order_bytes_and_copies_no_array_of_the_datas_size(monkeypatch):
    """``data_digest`` is the SHA-256 of each array's shape, dtype and C-order bytes (the value
    run folders and checkpoints keep) for any layout, read in parts: a transposed array (MNIST's
    images as loaded) costs no copy of its size."""
    import hashlib
    import tracemalloc

    from fenchel_cvx import io as fio

    def c_order_sha(*arrays):
        h = hashlib.sha256()
        for A in arrays:
            A = np.ascontiguousarray(A)
            h.update(f"{A.shape}{A.dtype.str}".encode())
            h.update(A.tobytes())
        return h.hexdigest()

    rng = np.random.default_rng(0)
    X = rng.standard_normal((60, 70))
    days = np.arange(np.datetime64("2020-01-01"), np.datetime64("2020-01-09"))
    cases = [X, X.T, X[::2, 3:], X.T.astype(">f4"), np.arange(7), np.zeros((0, 5)), np.array(3.0)]
    cases += [np.ma.masked_array(X.T, X.T > 0), days[::2], [1.0, 2.0]]
    monkeypatch.setattr(fio, "DIGEST_PART", 100)  # parts of one row
    for A in cases:
        assert fio.data_digest(A) == c_order_sha(A), A
    assert fio.data_digest(X.T, X) == c_order_sha(X.T, X)
    assert fio.data_digest(X.T) != fio.data_digest(X)
    big = rng.standard_normal((2000, 500)).T  # 8 MB, not C-contiguous
    monkeypatch.setattr(fio, "DIGEST_PART", big.nbytes // 50)
    tracemalloc.start()
    try:
        fio.data_digest(big)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < big.nbytes // 10, (peak, big.nbytes)


def test_the_memory_digest_reads_each_array_in_its_own_order_and_is_the_data_digest_in_c_order():
    """``memory_digest`` names each array's memory order and digests its bytes in that order:
    the data digest where every order is C, a Fortran-ordered array read in place (nothing of
    its size allocated), and any changed entry changes it."""
    import tracemalloc

    from fenchel_cvx import io as fio

    rng = np.random.default_rng(0)
    X = rng.standard_normal((60, 70))
    assert fio.memory_digest(X, np.arange(7)) == ("CC", fio.data_digest(X, np.arange(7)))
    assert fio.memory_digest(X[::2], np.array(3.0)) == ("CC", fio.data_digest(X[::2], 3.0))
    orders, digest = fio.memory_digest(np.asfortranarray(X), X)
    assert orders == "FC" and digest != fio.data_digest(X, X)
    assert fio.memory_digest(X.T.copy().T, X) == (orders, digest)  # the same data, same order
    changed = np.asfortranarray(X)
    changed[5, 7] += 1e-12
    assert fio.memory_digest(changed, X)[1] != digest
    big = np.asfortranarray(rng.standard_normal((500, 2000)))  # 8 MB, Fortran order
    tracemalloc.start()
    try:
        assert fio.memory_digest(big)[0] == "F"
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < big.nbytes // 100, (peak, big.nbytes)
