"""Training through a process group of one rank (``parallel.one_rank_group``): a real
``torch.distributed`` group of world size 1 wrapped in ``TorchComm``, not the no-op of one
process (``comm=None``, ``reduce.LOCAL``).

The pinned recipes (three batches of Algorithm 2 as the MNIST benchmarks train the MLP and
LeNet-5, float64, the certificate's checks on the last: ``pinned/record.py``) run on the fast
backend twice, through the group and without it, on the same arrays: gloo on the CPU (NumPy
arrays, and PyTorch's CPU tensors), NCCL on CUDA tensors (skipped without a GPU and NCCL).
One rank divides every chunk count, so the two runs are equal bit for bit: every snapshot of
the weights, the last batch's X, and every figure of every history record. Communicators
with a planted fault (a reduction one ulp off; a reduction that drops its term) are caught.
"""

import numpy as np
import pytest

from fenchel_cvx.arrays import to_numpy

torch = pytest.importorskip("torch", reason="process groups need PyTorch (torch.distributed)")

#: the checks a capped solve may violate by design (its block is not solved to optimality); the
#: certificate's own checks (descent, the lower bound, Fenchel-Young) must never be violated
INEXACT = {"block_optimality"}


def _arrays(kind):
    """``(asarray, backend)`` of ``kind``: NumPy, PyTorch's CPU tensors, or CUDA tensors (NCCL)."""
    if kind == "numpy":
        return np.asarray, "gloo"
    if kind in ("cpu", "cpu-on-device"):
        return (lambda A: torch.asarray(A, device="cpu")), "gloo"
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device for PyTorch")
    if not torch.distributed.is_nccl_available():
        pytest.skip("this PyTorch has no NCCL")
    return (lambda A: torch.asarray(A, device="cuda")), "nccl"


def _three_batches(recipe, data, asarray, comm=None):
    """``record.run_batches(recipe)`` on ``asarray``'s arrays, through ``comm`` (None: one
    process): ``(snapshots, records)``, the weights after each batch and the last batch's X
    as NumPy arrays, and the history records."""
    from fenchel_cvx.bcd import fit_bcd
    from pinned import record

    X, Y, image_shape = data
    make_setting, make_net, make_backend = record.RECIPES[recipe]
    setting = make_setting()
    net = make_net(X, image_shape, setting)
    snapshots = [[to_numpy(W).copy() for W in net.W]]

    def after_round(net_, rec):
        snapshots.append([to_numpy(W).copy() for W in net_.W])
        return rec["batch"] >= record.BATCHES

    result = fit_bcd(
        net,
        asarray(X),
        asarray(Y),
        batch_size=record.BATCH_SIZE,
        epochs=1,
        alternations=1,
        backend=make_backend(setting, False, 1),
        strict=False,
        eval_every=None,
        check_every=record.CHECK_EVERY,
        gamma=list(setting.gamma),
        momentum=list(setting.momentum),
        x_sweep="backward",
        callback=after_round,
        comm=comm,
    )
    snapshots.append([to_numpy(A).copy() for A in result.Xs])
    return snapshots, list(result.history)


def _differences(one, other):
    """Where two runs (``_three_batches``) differ bit for bit: a list of what differs."""
    from pinned import record

    found = []
    (snaps, recs), (snaps_o, recs_o) = one, other
    if len(snaps) != len(snaps_o) or len(recs) != len(recs_o):
        return [f"{len(snaps)} / {len(snaps_o)} snapshots, {len(recs)} / {len(recs_o)} rounds"]
    for i, (arrays, arrays_o) in enumerate(zip(snaps, snaps_o)):
        for j, (a, b) in enumerate(zip(arrays, arrays_o)):
            if a.shape != b.shape or not np.array_equal(a, b, equal_nan=True):
                gap = np.max(np.abs(a - b)) if a.shape == b.shape else "shapes differ"
                found.append(f"snapshot {i}, array {j}: largest difference {gap}")
    for k, (rec, rec_o) in enumerate(zip(recs, recs_o)):
        (floats, discrete), (floats_o, discrete_o) = record.flatten(rec), record.flatten(rec_o)
        if discrete != discrete_o:
            keys = [key for key in discrete if discrete[key] != discrete_o.get(key)]
            found.append(f"round {k + 1}: {keys[:5]} differ")
        if floats.keys() != floats_o.keys():
            found.append(f"round {k + 1}: the records hold other figures")
            continue
        keys = [
            key for key in floats if not np.array_equal(floats[key], floats_o[key], equal_nan=True)
        ]
        if keys:
            found.append(f"round {k + 1}: {len(keys)} figures differ ({keys[:5]})")
    return found


def _certificate_held(records):
    """The last round was checked, and no checked round violated descent, the lower bound or
    Fenchel-Young (a capped block's ``block_optimality`` aside)."""
    checked = [r["certificate"] for r in records if r["certificate"]["checked"]]
    assert records[-1]["certificate"]["checked"] and checked
    for cert in checked:
        assert {v["check"] for v in cert["violations"]} <= INEXACT, cert["violations"]


@pytest.fixture(scope="module")
def data():
    from pinned import record

    return record.mnist()


@pytest.mark.parametrize("recipe", ["mlp", "lenet5"])
@pytest.mark.parametrize("arrays", ["numpy", "cpu", "cpu-on-device", "cuda"])
def test_a_one_rank_group_trains_bit_for_bit_as_one_process(recipe, arrays, data):
    """The three batches through a group of one rank (gloo; NCCL on CUDA) equal the run
    without one, bit for bit; the group's collectives ran (``torch_comm.CLOCK``); the
    certificate held on every checked round of both runs. ``cpu-on-device``: CPU tensors
    reduced on their device (``TorchComm(on_device=True)``, NCCL's path: no host bytes)."""
    from fenchel_cvx.fast.torch_comm import CLOCK, TorchComm
    from fenchel_cvx.parallel import one_rank_group

    asarray, backend = _arrays(arrays)
    alone = _three_batches(recipe, data, asarray)
    gathers = CLOCK.gathers
    with one_rank_group(backend) as comm:
        assert comm.P == 1 and torch.distributed.get_backend() == backend
        assert comm.on_device == (backend == "nccl")
        if arrays == "cpu-on-device":
            comm = TorchComm(on_device=True)
        grouped = _three_batches(recipe, data, asarray, comm)
    assert CLOCK.gathers > gathers  # every reduction went through the group
    found = _differences(alone, grouped)
    if found:  # is the device itself deterministic? a second run without the group says
        again = _differences(alone, _three_batches(recipe, data, asarray))
        pytest.fail(f"{found[:8]}; two runs without the group differ in {len(again)} places")
    for run in (alone, grouped):
        _certificate_held(run[1])
    assert not torch.distributed.is_initialized()  # the group is destroyed on exit


def _planted(kind):
    """A ``TorchComm`` whose sums are one ulp off (``"ulp"``) or drop their one term (the
    rank's own figure: ``"dropped"``)."""
    from fenchel_cvx.fast.torch_comm import TorchComm

    class Faulty(TorchComm):
        def reduce(self, values, op):
            out = super().reduce(values, op)
            ops = [op] * len(values) if isinstance(op, str) else list(op)
            return [
                (0 * v if kind == "dropped" else np.nextafter(v, np.inf)) if o == "sum" else v
                for v, o in zip(out, ops)
            ]

    return Faulty()


@pytest.mark.parametrize("fault", ["ulp", "dropped"])
def test_a_one_rank_group_whose_reduction_is_off_is_caught(fault, data):
    """A planted fault: the group's sums one ulp off, or with their term dropped. The run then
    differs from the one-process run."""
    from fenchel_cvx.parallel import one_rank_group

    alone = _three_batches("mlp", data, np.asarray)
    with one_rank_group("gloo"):
        faulty = _three_batches("mlp", data, np.asarray, _planted(fault))
    assert _differences(alone, faulty)


def test_a_one_rank_group_is_refused_by_name_where_it_cannot_be_made():
    from fenchel_cvx.parallel import one_rank_group

    with pytest.raises(ValueError, match="backend must be one of"):
        with one_rank_group("mpi"):
            pass
    with one_rank_group("gloo"):
        with pytest.raises(ValueError, match="one is initialised already"):
            with one_rank_group("gloo"):
                pass
    if not (torch.cuda.is_available() and torch.distributed.is_nccl_available()):
        with pytest.raises(ValueError, match="backend 'nccl' needs"):
            with one_rank_group("nccl"):
                pass
    assert not torch.distributed.is_initialized()
