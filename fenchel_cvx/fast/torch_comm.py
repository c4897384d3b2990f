"""The reduction seam on ``torch.distributed``: a block's shards as the ranks of a process group.

``TorchComm`` is the communicator of ``reduce.py`` (``reduce``, ``all_gather``, ``to_rows``,
the ``columns`` and ``rows`` roles) for P processes, one shard each: the X-blocks of the paper
(eqs. (14)-(16)) split by data point, each rank its columns, and the W-blocks (eqs. (17)-(20))
by data point or by row, as ``SimulatedComm`` splits them in one process. Its figures are those
of ``SimulatedComm(P)``, bit for bit: a reduction gathers every rank's part and combines the
parts in rank order, in their own dtype, so the sum of P parts does not depend on the order in
which a library's all-reduce adds them.

One collective per decision: a ``reduce`` packs all its values (each rank's figures have the
same shapes and dtypes) into one byte buffer with a header naming the figures, and gathers
them in one ``all_gather``; ranks that reduce different figures at once fail by name. The
buffers travel on the CPU, or on the current CUDA device where the group is NCCL's (which
moves CUDA tensors alone); arrays of NumPy, or torch tensors, whose results come back in the
library they came from. Where every rank runs on this host, a gather of up to
``host_memory.SLOT`` bytes goes through shared memory (``host_memory.py``: some microseconds,
where gloo's TCP takes 0.4-5 ms on a busy machine); else, and for larger ones, through the
process group (gloo).

``CLOCK`` counts, in each process, the gathers its communicators made and the seconds spent in
them: the transport and the wait for the slowest rank, which a rank's batch pays besides its
own work (``benchmarks/parallel_model.py`` prints rank 0's share of a batch).
"""

from __future__ import annotations

import copy
import hashlib
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..arrays import Array
from ..reduce import OPS, CollectiveError, _check_split, _Moves, _ops
from . import host_memory

__all__ = ["CLOCK", "Clock", "CollectiveError", "TorchComm"]

#: the header of a reduction's buffer: a digest of its ops, dtypes and shapes
HEADER = 16
#: the most axes of an array that ``all_gather`` moves
MAX_NDIM = 8


@dataclass
class Clock:
    """The gathers of this process's communicators and the seconds spent in them (waits for
    the other ranks included)."""

    gathers: int = 0
    seconds: float = 0.0


#: this process's ``Clock``
CLOCK = Clock()


class TorchComm(_Moves):
    """The ranks of a ``torch.distributed`` process group (None: the default group, which the
    caller has initialised) as the shards of a block, split by ``split`` (``"columns"`` or
    ``"rows"``). ``shared_memory``: where every rank runs on this host, gather through host
    memory (module doc); False: through the process group alone. Made by every rank of the
    group at once (its first gathers agree on the path: ``host``, None for the group's)."""

    def __init__(
        self, group: Any = None, split: str = "columns", shared_memory: bool = True
    ) -> None:
        import torch
        import torch.distributed as dist

        if not dist.is_available() or not dist.is_initialized():
            raise ValueError(
                "TorchComm needs an initialised torch.distributed process group "
                "(torch.distributed.init_process_group, or a launch by torchrun)"
            )
        self.torch, self.dist, self.group = torch, dist, group
        self.split = _check_split(split)
        self.P, self.rank = dist.get_world_size(group), dist.get_rank(group)
        # the buffers' device: NCCL moves CUDA tensors alone (gloo, and a "cpu:gloo,..." pair: host)
        nccl = dist.get_backend(group) == dist.Backend.NCCL
        self.device = torch.device("cuda", torch.cuda.current_device()) if nccl else None
        self.host: host_memory.HostMemory | None = None
        if shared_memory and self.P > 1:
            self.host = host_memory.join(self._gather_bytes, self.P, self.rank)

    def with_split(self, split: str) -> TorchComm:
        """These ranks split by ``split``, on the same path."""
        other = copy.copy(self)
        other.split = _check_split(split)
        return other

    def reduce(self, values: Sequence[Any], op: str | Sequence[str]) -> list:
        """Each of ``values`` reduced over the ranks by its op, the parts combined in rank
        order in their own dtype: ``SimulatedComm``'s figures. One ``all_gather``."""
        ops = _ops(values, op)
        arrays = [self._host(v) for v in values]
        header = _digest(ops, arrays)
        payload = b"".join(a.tobytes() for a in arrays)
        parts = self._gather_bytes(header + payload)
        if any(part[:HEADER] != header for part in parts):
            raise RuntimeError(
                f"the ranks reduce different figures at once (rank {self.rank}: {ops}, "
                f"shapes {[a.shape for a in arrays]})"
            )
        per_rank = [_unpack(part[HEADER:], arrays) for part in parts]
        out = []
        for i, name in enumerate(ops):
            total = per_rank[0][i]
            for mine in per_rank[1:]:
                total = OPS[name](total, mine[i])
            out.append(self._back(total, values[i]))
        return out

    def all_gather(self, value: Array) -> list:
        """Every rank's array ``value``, in rank order (their shapes may differ)."""
        array = self._host(value)
        if array.ndim > MAX_NDIM:
            raise ValueError(f"all_gather takes arrays of up to {MAX_NDIM} axes, got {array.shape}")
        meta = np.zeros(MAX_NDIM + 1, np.int64)
        meta[0], meta[1 : 1 + array.ndim] = array.ndim, array.shape
        metas = [np.frombuffer(m, np.int64) for m in self._gather_bytes(meta.tobytes())]
        shapes = [tuple(int(d) for d in m[1 : 1 + int(m[0])]) for m in metas]
        parts = self._gather_bytes(array.tobytes(), max(_nbytes(s, array) for s in shapes))
        return [
            self._back(
                np.frombuffer(part[: _nbytes(s, array)], array.dtype).reshape(s).copy(), value
            )
            for part, s in zip(parts, shapes)
        ]

    # --- transport ------------------------------------------------------------------------------
    def _gather_bytes(self, data: bytes, size: int | None = None) -> list[bytes]:
        """Every rank's ``data``, in rank order, by one ``all_gather`` of equal-sized buffers
        (``size``: the largest rank's; None: this rank's, the same on every rank). Through
        host memory where it holds ``size`` bytes (each part then of its rank's length)."""
        t0 = time.perf_counter()
        try:
            return self._gather(data, len(data) if size is None else size)
        finally:
            CLOCK.gathers += 1
            CLOCK.seconds += time.perf_counter() - t0

    def _gather(self, data: bytes, size: int) -> list[bytes]:
        torch = self.torch
        if self.host is not None and size <= self.host.slot:  # (size: every rank's alike)
            return self.host.gather(data)
        buf = torch.zeros(size, dtype=torch.uint8, device=self.device)
        if data:
            buf[: len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        out = [torch.empty(size, dtype=torch.uint8, device=self.device) for _ in range(self.P)]
        try:
            self.dist.all_gather(out, buf, group=self.group)
        except RuntimeError as err:
            raise CollectiveError(
                f"rank {self.rank}: a collective of {self.P} ranks did not complete ({err})"
            ) from err
        return [bytes(t.cpu().numpy()) for t in out]

    def _host(self, value: Any) -> np.ndarray:
        """``value`` as a NumPy array on the host (a number: a 0-d array of its type)."""
        if isinstance(value, self.torch.Tensor):
            return value.detach().cpu().numpy()
        return np.asarray(value)

    def _back(self, total: np.ndarray, like: Any) -> Any:
        """A combined figure in the form of the value it came from: a Python number, a NumPy
        array, or a tensor on the value's device; an array of the value's shape in the value's
        memory layout (a transposed gradient stays transposed: the products it enters, and so
        their round-off, are those of the one-process run)."""
        same = tuple(total.shape) == tuple(getattr(like, "shape", ()))
        if isinstance(like, self.torch.Tensor):
            host = self.torch.from_numpy(np.ascontiguousarray(total).reshape(total.shape))
            if not same:  # (another rank's part of an all_gather)
                return host.to(like.device)
            return self.torch.empty_like(like, dtype=host.dtype).copy_(host)
        if isinstance(like, (bool, int, float)):
            return type(like)(total)
        if isinstance(like, np.generic):
            return total[()]
        if not same or total.ndim == 0:
            return total
        out = np.empty_like(like, dtype=total.dtype)  # (order "K": the value's layout)
        out[...] = total
        return out


def _digest(ops: list[str], arrays: list[np.ndarray]) -> bytes:
    """The figures a reduction combines: its ops, dtypes and shapes, hashed to ``HEADER`` bytes."""
    text = repr([(o, a.dtype.str, a.shape) for o, a in zip(ops, arrays)]).encode()
    return hashlib.blake2b(text, digest_size=HEADER).digest()


def _unpack(data: bytes, like: list[np.ndarray]) -> list[np.ndarray]:
    """The arrays of one rank's buffer, shaped and typed as ``like``."""
    out, at = [], 0
    for a in like:
        out.append(np.frombuffer(data, a.dtype, a.size, at).reshape(a.shape).copy())
        at += a.nbytes
    return out


def _nbytes(shape: tuple, like: np.ndarray) -> int:
    return int(np.prod(shape, dtype=np.int64)) * like.itemsize
