"""One rank of the gloo test of ``TorchComm`` (``test_torch_comm.py``), run as a script:
``python tests/_comm_ranks.py PATHS RANK WORLD PORT OUT``, ``PATHS`` the gathers' paths taken in
turn, comma-separated (``host``: shared memory; ``gloo``: the process group alone). Every block
of the MNIST MLP and of LeNet-5 (``test_reduction_seam``'s states) solved on the ranks as
shards once per path (gloo alone: ``GLOO_CASES``), this rank's part of each result written to
``OUT`` (an ``.npz``, each key prefixed ``PATH:``); :func:`solve_all` is also what the test runs
on ``SimulatedComm``'s shards."""

import sys
from datetime import timedelta
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import test_reduction_seam as seam  # noqa: E402
from fenchel_cvx.blocks import x_block  # noqa: E402
from fenchel_cvx.fast.pncg import solve_pncg  # noqa: E402

#: the X-blocks (the benchmarks' capped solve), then the W-blocks (capped; LeNet-5's W_3 tested
#: with Newton rows: moved to rows, its rows frozen as they converge)
X_CASES = seam.CASES
W_CASES = [(n, l, seam.W_SOLVES["capped"]) for n, l in [("mlp", 0), *seam.W_CASES]] + [
    ("lenet5", 3, (300, 1e-9, seam.NEWTON))
]

#: the cases of the pass through gloo alone: a reduction adds the same two numbers through either
#: transport, and the gathers differ: the MLP's blocks (its W_0 moved to rows in data space) and
#: LeNet-5's W_3 with Newton rows (moved to rows, frozen as they converge)
GLOO_CASES = {"mlp-X_1", "mlp-W_0-10", "mlp-W_1-10", "lenet5-W_3-300"}


def solve_all(comm, states=None, cases=None):
    """``{case: this shard's result}``: each X-block's columns of its argmin, each W-block's W
    (whole on every shard), and their step counts; ``cases``: those cases alone (default all)."""
    states = seam.make_states() if states is None else states
    out = {}
    for name, l in X_CASES:
        key = f"{name}-X_{l}"
        if cases is not None and key not in cases:
            continue
        net, X0, Y, Xs = states[name]
        block, Z = x_block(net, X0, Y, Xs, l), Xs[l - 1]
        cols = np.array_split(np.arange(Z.shape[1]), comm.P)[comm.rank]
        z, it, _ = seam._solve(block.restrict(cols), Z[:, cols], seam.SOLVES["capped"], comm)
        out[key], out[f"{key}-steps"] = z, np.array(it)
    for name, l, (max_iter, tol, settings) in W_CASES:
        key = f"{name}-W_{l}-{max_iter}"
        if cases is not None and key not in cases:
            continue
        block = seam._w_block(states, name, l)
        cols = np.array_split(np.arange(block.Xt.shape[1]), comm.P)[comm.rank]
        part = seam.columns(block, cols)
        W, it, _ = solve_pncg(np, part, block.W0, tol, max_iter, settings=settings, comm=comm)
        out[key], out[f"{key}-steps"] = W, np.array(it)
    return out


def main(paths, rank, world, port, path):
    import torch.distributed as dist

    from fenchel_cvx.fast.torch_comm import TorchComm

    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=120),
    )
    out, states = {}, seam.make_states()
    try:
        for via in paths.split(","):
            comm = TorchComm(shared_memory=via == "host")
            cases = GLOO_CASES if via == "gloo" else None
            out |= {f"{via}:{k}": v for k, v in solve_all(comm, states, cases).items()}
            out[f"{via}:via-host-memory"] = np.array(comm.host is not None)
    finally:
        dist.destroy_process_group()
    np.savez(path, **out)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5])
