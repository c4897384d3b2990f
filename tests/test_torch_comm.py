"""``TorchComm`` (``fast/torch_comm.py``): the reduction seam on ``torch.distributed``. Two
ranks on gloo (localhost, one process each: ``_comm_ranks.py``) solve every block of the MNIST
MLP and of LeNet-5 as shards, each rank its columns: every capped result (the training's
solves) equals, bit for bit, ``SimulatedComm(2)``'s shard of the same rank (the same parts,
combined in the same order, one BLAS thread each), and so the one-process solve to 1e-12
(``test_reduction_seam.py``). The tested solve with Newton rows (LeNet-5's W_3, 20 steps) rounds
apart in a process of its own from a thread of one process, whatever the communicator (7e-17 of
entries near 0.1 here, the same with ``SimulatedComm`` in a separate process): to 1e-14. The
moves (``all_gather``, ``to_rows``: the MLP's W_0 in data space, LeNet-5's W_3 with Newton
rows) go through it too, through shared memory (``host_memory.py``) and through gloo alone. A
rank that reduces other figures than the others is named, and so is one that hangs in a
transfer of gloo's.
"""

import os
import re
import select
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

from fenchel_cvx import reduce  # noqa: E402
from fenchel_cvx.fast import host_memory  # noqa: E402
from fenchel_cvx.threads import limit_threads  # noqa: E402

HERE = Path(__file__).resolve().parent


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ranks(script_args, tmp_path, world=2, timeout=300):
    """Run ``_comm_ranks.py`` (or ``script_args[0]``) on ``world`` gloo ranks; -> their outputs."""
    port, outs = free_port(), [tmp_path / f"rank{r}.npz" for r in range(world)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    procs = [
        subprocess.Popen(
            [sys.executable, *script_args, str(r), str(world), str(port), str(outs[r])],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for r in range(world)
    ]
    logs = [p.communicate(timeout=timeout)[0] for p in procs]
    for p, log in zip(procs, logs):
        assert p.returncode == 0, log[-3000:]
    return [dict(np.load(out)) for out in outs]


@pytest.mark.slow
@pytest.mark.skipif(not dist.is_available(), reason="torch.distributed is not available")
def test_two_gloo_ranks_are_the_simulated_shards_bit_for_bit(tmp_path):
    """Both gathers' paths, in turn on the same two ranks: shared memory (``host``, every case)
    and gloo alone (``gloo``, ``_comm_ranks.GLOO_CASES``), each against ``SimulatedComm(2)``."""
    import _comm_ranks

    paths = ("host", "gloo")
    both = ranks([str(HERE / "_comm_ranks.py"), ",".join(paths)], tmp_path)
    with limit_threads(1):  # every BLAS on one thread, SciPy's too, as the ranks' (OMP=1)
        want = reduce.SimulatedComm(2).run(_comm_ranks.solve_all)
    for via in paths:
        got = [{k.removeprefix(f"{via}:"): v for k, v in g.items() if k.startswith(f"{via}:")}
               for g in both]  # fmt: skip
        for rank in (0, 1):  # shared memory wherever this host has it, when asked for
            host = got[rank].pop("via-host-memory")
            assert host == (via == "host" and host_memory.supported())
        gloo = {k for k in want[0] if k.removesuffix("-steps") in _comm_ranks.GLOO_CASES}
        assert len(want[0]) == 2 * (5 + 8) and _comm_ranks.GLOO_CASES <= want[0].keys()
        assert got[0].keys() == got[1].keys() == (gloo if via == "gloo" else want[0].keys())
        for rank in (0, 1):
            for key in got[rank]:
                value = want[rank][key]
                if key == "lenet5-W_3-300":  # tested, Newton rows: rounds apart by a process
                    gap = np.max(np.abs(got[rank][key] - value))
                    assert gap <= 1e-14 * np.max(np.abs(value)), (via, rank)
                else:
                    assert np.array_equal(got[rank][key], value), (via, rank, key)
        for key in got[0]:
            if "-W_" in key and not key.endswith("steps"):
                assert np.array_equal(got[0][key], got[1][key])  # W whole, equal on both ranks


BAD_RANK = """
import sys
from datetime import timedelta
import numpy as np
import torch.distributed as dist
from fenchel_cvx.fast.torch_comm import TorchComm

rank, world, port, out = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                        world_size=world, timeout=timedelta(seconds=60))
comm = TorchComm()
try:
    comm.reduce([np.float64(rank)], "sum" if rank == 0 else "max")
    message = ""
except RuntimeError as err:
    message = str(err)
dist.destroy_process_group()
np.savez(out, message=np.array(message), total=np.array(comm.reduce.__name__))
"""


def test_ranks_that_reduce_different_figures_fail_by_name(tmp_path):
    script = tmp_path / "bad_rank.py"
    script.write_text(BAD_RANK)
    got = ranks([str(script)], tmp_path, timeout=120)
    for rank in (0, 1):
        assert "the ranks reduce different figures at once" in str(got[rank]["message"])


DEVICE_RANK = """
import sys
from datetime import timedelta
import numpy as np
import torch
import torch.distributed as dist
from fenchel_cvx.fast.torch_comm import CLOCK, TorchComm

rank, world, port, out = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                        world_size=world, timeout=timedelta(seconds=60))
host, device = TorchComm(), TorchComm(on_device=True)
g = torch.Generator().manual_seed(rank)
values = [
    torch.randn((), generator=g, dtype=torch.float32),
    torch.randn(5, generator=g, dtype=torch.float64),
    torch.randn(3, 4, generator=g, dtype=torch.float64).T,  # a transposed gradient
    torch.tensor([rank, 7 - rank]),
    torch.tensor([True, rank == 0]),
]
ops = ["sum", "max", "sum", "min", "min"]
on_host = host.reduce(values, ops)
gathers = CLOCK.gathers
on_device = device.reduce(values, ops)
one_gather = CLOCK.gathers - gathers == 1
device.verify()  # the ranks agreed
same = all(
    torch.equal(a, b) and a.dtype == b.dtype and a.stride() == b.stride()
    for a, b in zip(on_host, on_device)
)
# ranks that reduce different figures in buffers of one size (8 and 4 bytes, padded to 16):
# the gather completes, verify names it
device.reduce([torch.ones(2, dtype=torch.float32) if rank == 0 else torch.ones(1)], "sum")
try:
    device.verify()
    message = ""
except RuntimeError as err:
    message = str(err)
dist.destroy_process_group()
np.savez(out, same=same, one_gather=one_gather, message=np.array(message),
         **{f"total{i}": v.numpy() for i, v in enumerate(on_device)})
"""


def test_a_reduction_on_the_device_is_the_host_paths_bit_for_bit_and_checks_the_figures(
    tmp_path,
):  # fmt: skip
    """``TorchComm(on_device=True)`` reduces tensors with one gather of the group and no
    host bytes: every figure (float32, float64, a transposed array, integers, booleans; sums,
    maxima, minima) equals the host path's, dtype and layout too, and the sums are the ranks'
    figures added in rank order. Ranks that reduce different figures of the same byte size
    complete the gather, and ``verify`` names the disagreement."""
    script = tmp_path / "device_rank.py"
    script.write_text(DEVICE_RANK)
    got = ranks([str(script)], tmp_path, timeout=120)
    import torch

    mine = []
    for rank in (0, 1):
        g = torch.Generator().manual_seed(rank)
        mine.append(
            [torch.randn((), generator=g, dtype=torch.float32), torch.randn(5, generator=g)]
        )
    for rank in (0, 1):
        assert bool(got[rank]["same"]) and bool(got[rank]["one_gather"])
        assert "the ranks reduce different figures at once" in str(got[rank]["message"])
        assert got[rank]["total0"] == (mine[0][0] + mine[1][0]).numpy()
        np.testing.assert_array_equal(got[rank]["total3"], [0, 6])
        np.testing.assert_array_equal(got[rank]["total4"], [True, False])
    assert np.array_equal(got[0]["total2"], got[1]["total2"])


TRAINING_RANK = """
import sys
from datetime import timedelta
import numpy as np
import torch
import torch.distributed as dist

sys.path.insert(0, sys.argv[1])
from test_host_reads import training
from fenchel_cvx.datasets import load_mnist5k, one_hot
from fenchel_cvx.fast.reads import unchecked_batch
from fenchel_cvx.fast.torch_comm import TorchComm

rank, world, port, out = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                        world_size=world, timeout=timedelta(seconds=120))
ds = load_mnist5k()
X = torch.asarray(ds.X_train[:, :1500].astype(np.float32))
Y = torch.asarray(one_hot(ds.y_train[:1500], 10).astype(np.float32))
got = {}
for name in ("mlp", "lenet5"):
    for path, on_device in (("host", False), ("device", True)):
        net, backend, args = training(name, "float32", compile=False)
        net.W = [torch.asarray(np.asarray(W)) for W in net.W]
        comm = TorchComm(on_device=on_device)
        reads = unchecked_batch(net, X, Y, backend, 500, comm=comm, **args)
        got[f"{name}-{path}-reads"] = np.array(reads.total)
        for l, W in enumerate(net.W):
            got[f"{name}-{path}-W{l}"] = W.numpy()
dist.destroy_process_group()
np.savez(out, **got)
"""


@pytest.mark.slow  # two networks, two batches each, on two ranks, twice
def test_two_ranks_reducing_on_the_device_read_back_twice_a_batch_and_train_as_the_host_path(
    tmp_path,
):  # fmt: skip
    """Two gloo ranks train the MNIST MLP and LeNet-5 (float32, CPU tensors, the benchmarks'
    settings: the MLP's W_0 moves to rows in data space) two batches of 500 through
    ``TorchComm(on_device=True)``, as NCCL's ranks take every reduction and move: an unchecked
    batch reads back twice on rank 0, where the callbacks that count run (the round's argmin
    checks and the ranks' agreement; the host path reads every reduction's figures), and the
    weights are the host path's, bit for bit, on both ranks."""
    script = tmp_path / "training_rank.py"
    script.write_text(TRAINING_RANK)
    got = ranks([str(script), str(HERE)], tmp_path, timeout=300)
    for name in ("mlp", "lenet5"):  # counted on rank 0 (callbacks run there: fit_bcd)
        assert int(got[0][f"{name}-device-reads"]) <= 2
        assert int(got[0][f"{name}-host-reads"]) > 10
    for rank in (0, 1):
        for name in ("mlp", "lenet5"):
            n_layers = sum(key.startswith(f"{name}-host-W") for key in got[rank])
            assert n_layers == (2 if name == "mlp" else 5)
            for l in range(n_layers):
                host, device = got[rank][f"{name}-host-W{l}"], got[rank][f"{name}-device-W{l}"]
                assert np.array_equal(host, device), (rank, name, l)
                assert np.array_equal(device, got[1 - rank][f"{name}-device-W{l}"])


COUNTED_RANK = """
import sys
from datetime import timedelta
import numpy as np
import torch.distributed as dist
from fenchel_cvx.fast.torch_comm import CLOCK, TorchComm

rank, world, port, out = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                        world_size=world, timeout=timedelta(seconds=60))
comm = TorchComm()
before = CLOCK.gathers
for _ in range(3):
    comm.reduce([np.float64(rank), np.ones(4)], ["sum", "max"])
after_reduce = CLOCK.gathers
comm.all_gather(np.arange(rank + 2.0))
dist.destroy_process_group()
np.savez(out, reduces=after_reduce - before, all_gather=CLOCK.gathers - after_reduce)
"""


def test_the_clock_counts_each_gather_of_a_rank(tmp_path):
    """``CLOCK`` counts one gather a ``reduce`` (all its figures in one) and two an
    ``all_gather`` (the shapes, then the data), on every rank."""
    script = tmp_path / "counted_rank.py"
    script.write_text(COUNTED_RANK)
    for got in ranks([str(script)], tmp_path, timeout=120):
        assert int(got["reduces"]) == 3 and int(got["all_gather"]) == 2


def test_a_comm_without_a_process_group_is_refused_by_name():
    from fenchel_cvx.fast.torch_comm import TorchComm

    if dist.is_initialized():
        pytest.skip("a process group is initialised in this process")
    with pytest.raises(ValueError, match="needs an initialised torch.distributed process group"):
        TorchComm()


HUNG_RANK = """
import os
import signal
import sys
import types
from datetime import timedelta
import numpy as np
import torch.distributed as dist
from fenchel_cvx.fast import heartbeat
from fenchel_cvx.fast.torch_comm import TorchComm

rank, world, port, out = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
via = sys.argv[5]
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                        world_size=world, timeout=timedelta(seconds=120))
if rank == 0:  # (rank 1 beats every second, its limit the default)
    os.environ[heartbeat.HANG_VARIABLE] = "2"
comm = TorchComm(shared_memory=via == "host")
assert (comm.host is not None) == (via == "host") and comm.beats is not None
if rank == 1:  # stops in the transfer (after the ranks met in shared memory, where they do)
    def stop_then_gather(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGSTOP)
    comm.dist = types.SimpleNamespace(all_gather=stop_then_gather)
try:
    comm.all_gather(np.zeros(300_000))  # (2.4 MB: more than a slot, through gloo)
    message = ""
except RuntimeError as err:
    message = str(err)
np.savez(out, message=np.array(message))
os._exit(0)  # (the broken group's threads may abort the interpreter's teardown)
"""


@pytest.mark.parametrize("via", ["host", "store"])
def test_a_rank_that_hangs_in_a_transfer_of_the_process_group_is_named(tmp_path, via):
    """Rank 1 stops (SIGSTOP) inside a gather too large for shared memory, where rank 0 waits
    for gloo's transfer: rank 0 looks at rank 1's heartbeat meanwhile (in shared memory, or in
    the group's store: ranks on several hosts) and stops naming rank 1 as hung after
    ``FENCHEL_HANG`` seconds (2 in rank 0), long before gloo's timeout (120 s here)."""
    if via == "host" and not host_memory.supported():
        pytest.skip("no shared memory between ranks here")
    script = tmp_path / "hung_rank.py"
    script.write_text(HUNG_RANK)
    port, outs = free_port(), [tmp_path / f"rank{r}.npz" for r in range(2)]
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), str(r), "2", str(port), str(outs[r]), via],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for r in range(2)
    ]
    try:
        log = procs[0].communicate(timeout=90)[0]
        assert procs[0].returncode == 0, log[-3000:]
        assert procs[1].poll() is None  # (stopped, alive: the run's launcher ends it)
    finally:
        for p in procs:
            p.kill()
            p.communicate()
    message = str(np.load(outs[0])["message"])
    assert re.search(r"rank 0: rank 1('s process \(\d+\))? hangs: no heartbeat for", message)


#: a rank's heartbeat beating into a store (``StoreBeats``, a beat every 0.25 s) that another
#: process serves; then that server ends (SIGKILL: each beat fails) or stops (SIGSTOP: a beat
#: waits for it, and this rank looks at the beats until it is told why). A hook registered
#: before the heartbeat (``atexit`` runs it after the heartbeat's own) prints the heartbeat
#: threads still alive as the interpreter's teardown begins.
STORE_FAULT = """
import atexit, os, signal, sys, threading, time
from datetime import timedelta
import torch.distributed as dist
from fenchel_cvx.fast.heartbeat import RankHangs, StoreBeats, check

def beating_threads():
    alive = [t.name for t in threading.enumerate() if "heartbeat" in t.name]
    print("heartbeat threads at teardown:", len(alive), flush=True)

atexit.register(beating_threads)
server, port, fault = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=60))
beats = StoreBeats(store, 2, 1, hang=1.0)
time.sleep(0.5)
if fault == "ended":
    os.kill(server, signal.SIGKILL)
    time.sleep(1.5)
else:
    os.kill(server, signal.SIGSTOP)
    t0 = time.monotonic()
    try:
        while time.monotonic() - t0 < 20:
            check(beats, "in this test")
            time.sleep(0.05)
    except RankHangs as err:
        print(f"named after {time.monotonic() - t0:.1f} s: {err}", flush=True)
    os.kill(server, signal.SIGKILL)
"""

#: a store's server in a process of its own: prints its port, then serves until killed
STORE_SERVER = """
import time
from datetime import timedelta
import torch.distributed as dist
store = dist.TCPStore("127.0.0.1", 0, is_master=True, timeout=timedelta(seconds=60))
print(store.port, flush=True)
time.sleep(600)
"""


def _line_within(stream, seconds):
    """The next line of ``stream``, read within ``seconds`` (else the test fails)."""
    ready, _, _ = select.select([stream], [], [], seconds)
    assert ready, f"no line within {seconds} s"
    return stream.readline().strip()


def _store_fault(tmp_path, fault):
    """``STORE_FAULT`` run against a server of its own, which meets ``fault``: its output."""
    script = tmp_path / "store_fault.py"
    script.write_text(STORE_FAULT)
    server = subprocess.Popen(
        [sys.executable, "-c", STORE_SERVER], stdout=subprocess.PIPE, text=True
    )
    try:
        port = _line_within(server.stdout, 60)
        out = subprocess.run(
            [sys.executable, str(script), str(server.pid), port, fault],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    finally:
        server.kill()
        server.communicate()
    assert out.returncode == 0, out.stderr[-3000:]
    assert "heartbeat threads at teardown: 0" in out.stdout, out.stdout + out.stderr[-3000:]
    return out.stdout


@pytest.mark.skipif(not dist.is_available(), reason="torch.distributed is not available")
def test_a_heartbeat_into_a_store_that_ended_has_stopped_before_the_interpreter_tears_down(
    tmp_path,
):
    """A heartbeat thread inside a beat into the store when the interpreter tears down aborts
    the process as the beat returns ("terminate called without an active exception"): as a
    rank does that outlives the rank whose process serves the store. The heartbeats stop at
    exit, after their beat in flight: none is alive at teardown, and the process exits 0."""
    _store_fault(tmp_path, "ended")


@pytest.mark.skipif(not dist.is_available(), reason="torch.distributed is not available")
def test_a_store_that_stops_answering_is_named_and_no_look_waits_for_it(tmp_path):
    """The store's server stopped (SIGSTOP: the process that serves it hangs): this rank's
    beats wait for it, its looks at the beats do not (they read what its heartbeat thread
    last read), and a look names the store once ``hang`` (1 s here) and a row of looks a beat
    long have passed."""
    out = _store_fault(tmp_path, "stopped")
    named = re.search(r"named after ([\d.]+) s: rank 1: the process group's store has taken "
                      r"no heartbeat of this rank for \d+ s .*in this test", out)  # fmt: skip
    assert named, out
    assert float(named.group(1)) < 10, out
