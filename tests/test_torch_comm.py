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
rank that reduces other figures than the others is named.
"""

import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from threadpoolctl import threadpool_limits

pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

from fenchel_cvx import reduce  # noqa: E402
from fenchel_cvx.fast import host_memory  # noqa: E402

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


@pytest.mark.skipif(not dist.is_available(), reason="torch.distributed is not available")
@pytest.mark.parametrize("via", ["host", "gloo"])
def test_two_gloo_ranks_are_the_simulated_shards_bit_for_bit(tmp_path, via):
    import _comm_ranks

    got = ranks([str(HERE / "_comm_ranks.py"), via], tmp_path)
    for rank in (0, 1):  # shared memory wherever this host has it, when asked for
        assert got[rank].pop("via-host-memory") == (via == "host" and host_memory.supported())
    with threadpool_limits(1):  # the ranks' BLAS: one thread each (OMP_NUM_THREADS=1)
        want = reduce.SimulatedComm(2).run(_comm_ranks.solve_all)
    assert got[0].keys() == want[0].keys() and len(want[0]) == 2 * (5 + 8)
    for rank in (0, 1):
        for key, value in want[rank].items():
            if key == "lenet5-W_3-300":  # tested, Newton rows: rounds apart by a process
                assert np.max(np.abs(got[rank][key] - value)) <= 1e-14 * np.max(np.abs(value))
            else:
                assert np.array_equal(got[rank][key], value), (rank, key)
    for key in want[0]:
        if "-W_" in key and not key.endswith("steps"):
            assert np.array_equal(got[0][key], got[1][key])  # W whole and equal on both ranks


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
