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

With ``on_device`` (NCCL's default) a reduction of tensors on the buffers' device, and a
gather whose shapes the caller knows, stay there (``_DeviceReduce``): no read to the host, the
same figures; the ranks' agreement on what they reduced is read once a round (``verify``; a
caller of the solvers outside ``fit_bcd`` calls it itself). On a GPU such a collective runs
asynchronously, and ``CLOCK`` counts the seconds of its launch alone.

``CLOCK`` counts, in each process, the gathers its communicators made and the seconds spent in
them: the transport and the wait for the slowest rank, which a rank's batch pays besides its
own work (``benchmarks/parallel_model.py`` prints rank 0's share of a batch).
"""

from __future__ import annotations

import copy
import functools
import hashlib
import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..arrays import Array
from ..reduce import OPS, CollectiveError, _check_split, _Moves, _ops, check_shapes
from . import heartbeat, host_memory

__all__ = ["CLOCK", "Clock", "CollectiveError", "TorchComm"]

#: the header of a reduction's buffer: a digest of its ops, dtypes and shapes
HEADER = 16
#: the most axes of an array that ``all_gather`` moves
MAX_NDIM = 8
#: the figures of a reduction on the device start a multiple of this many bytes apart (any
#: dtype's view of them is aligned)
ALIGN = 16


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
    group at once (its first gathers agree on the path: ``host``, None for the group's).
    :meth:`close` stops this rank's heartbeat, before the group is destroyed. ``copies``: the
    ranks run on copies of rank 0's arguments (:meth:`on_copies`)."""

    def __init__(
        self,
        group: Any = None,
        split: str = "columns",
        shared_memory: bool = True,
        on_device: bool | None = None,
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
        self.beats: heartbeat.Beats | None = None  # (None while the host path is agreed)
        if shared_memory and self.P > 1:
            self.host = host_memory.join(self._gather_bytes, self.P, self.rank)
        if self.P > 1 and self.device is None:
            self.beats = (  # (the ranks' heartbeats: in host memory, or in the group's store)
                self.host.beats
                if self.host is not None
                else heartbeat.store_beats(group, self.P, self.rank)
            )
        # a reduction of tensors on the buffers' device gathers them there (``_DeviceReduce``):
        # NCCL's default; on gloo host memory is faster, and on_device=True takes CPU tensors
        self.on_device = nccl if on_device is None else bool(on_device)
        self._device = _DeviceReduce(self)

    def on_copies(self) -> TorchComm:
        """These ranks, each running on a copy of rank 0's arguments (``parallel.Ranks.fit``):
        they hold the same data by construction, which a run's agreement then does not digest
        (``run_settings.agreed``: 0.1 s a rank for MNIST's 188 MB)."""
        other = copy.copy(self)
        other.copies = True
        return other

    def with_split(self, split: str) -> TorchComm:
        """These ranks split by ``split``, on the same path."""
        other = copy.copy(self)
        other.split = _check_split(split)
        return other

    def close(self) -> None:
        """This rank's heartbeat stops (its copies' by :meth:`with_split` too): the last use
        of these ranks, before ``torch.distributed.destroy_process_group``."""
        if self.beats is not None:
            self.beats.heartbeat.stop()

    def reduce(self, values: Sequence[Any], op: str | Sequence[str]) -> list:
        """Each of ``values`` reduced over the ranks by its op, the parts combined in rank
        order in their own dtype: ``SimulatedComm``'s figures. One ``all_gather``."""
        ops = _ops(values, op)
        if self.on_device and self._device.takes(values):
            return self._device.reduce(values, ops)
        arrays = [self._host(v) for v in values]
        header = _digest(ops, [(a.dtype.str, a.shape) for a in arrays])
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
            total = functools.reduce(OPS[name], [mine[i] for mine in per_rank])
            out.append(self._back(total, values[i]))
        return out

    def verify(self) -> None:
        """Raises where a reduction on the device since the last call met other figures on
        another rank (``_DeviceReduce``: their agreement is read here, once)."""
        self._device.verify()

    def all_gather(self, value: Array, shapes: Sequence[tuple] | None = None) -> list:
        """Every rank's array ``value``, in rank order (their shapes may differ; ``shapes``:
        theirs, where the caller knows them, which a gather on the device needs: it then
        reads nothing back)."""
        if shapes is not None and self.on_device and self._device.takes([value]):
            return self._device.gather(value, shapes)
        array = self._host(value)
        if array.ndim > MAX_NDIM:
            raise ValueError(f"all_gather takes arrays of up to {MAX_NDIM} axes, got {array.shape}")
        meta = np.zeros(MAX_NDIM + 1, np.int64)
        meta[0], meta[1 : 1 + array.ndim] = array.ndim, array.shape
        metas = [np.frombuffer(m, np.int64) for m in self._gather_bytes(meta.tobytes())]
        found = [tuple(int(d) for d in m[1 : 1 + int(m[0])]) for m in metas]
        parts = self._gather_bytes(array.tobytes(), max(_nbytes(s, array) for s in found))
        return check_shapes(
            shapes,
            [
                self._back(
                    np.frombuffer(part[: _nbytes(s, array)], array.dtype).reshape(s).copy(), value
                )
                for part, s in zip(parts, found)
            ],
        )

    # --- transport ------------------------------------------------------------------------------
    def _gather_bytes(self, data: bytes, size: int | None = None) -> list[bytes]:
        """Every rank's ``data``, in rank order, by one ``all_gather`` of equal-sized buffers
        (``size``: the largest rank's; None: this rank's, the same on every rank). Through
        host memory where it holds ``size`` bytes (each part then of its rank's length)."""
        return _counted(self._gather, data, len(data) if size is None else size)

    def _gather_tensor(self, buf: Any) -> list[Any]:
        """Every rank's tensor ``buf`` (of one size on every rank), in rank order, on its
        device: one ``all_gather`` of the process group."""
        return _counted(self._all_gather, buf)

    def _gather(self, data: bytes, size: int) -> list[bytes]:
        torch = self.torch
        if self.host is not None and size <= self.host.slot:  # (size: every rank's alike)
            return self.host.gather(data)
        buf = torch.zeros(size, dtype=torch.uint8, device=self.device)
        if data:
            buf[: len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        return [bytes(t.cpu().numpy()) for t in self._all_gather(buf)]

    def _all_gather(self, buf: Any) -> list[Any]:
        """The process group's ``all_gather`` of ``buf``; a ``CollectiveError`` naming this
        rank where it does not complete. On the CPU (gloo) a rank that hangs is named within
        its heartbeat's ``hang`` seconds (``heartbeat.py``): where the ranks share host memory
        they meet there first, and the transfer runs in the background while this rank looks
        at the others' heartbeats (on a GPU the transfer is the device's: NCCL's watchdog and
        the group's timeout)."""
        out = [self.torch.empty_like(buf) for _ in range(self.P)]
        try:
            if self.beats is None:
                self.dist.all_gather(out, buf, group=self.group)
                return out
            if self.host is not None:
                self.host.gather(b"")
            work = self.dist.all_gather(out, buf, group=self.group, async_op=True)
            _await(work, self.beats, self.P)
        except CollectiveError:
            raise
        except RuntimeError as err:
            raise CollectiveError(
                f"rank {self.rank}: a collective of {self.P} ranks did not complete ({err})"
            ) from err
        return out

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


def _await(work: Any, beats: heartbeat.Beats, P: int) -> None:
    """Until ``work`` (a collective in the background) completes, looking at the others'
    heartbeats every ``host_memory.LOOK`` seconds meanwhile (a rank that hangs is named)."""
    done = threading.Event()
    work.get_future().add_done_callback(lambda _: done.set())
    while not done.wait(host_memory.LOOK):
        heartbeat.check(beats, f"during a collective of {P} ranks")
    work.wait()  # (its error, where it failed)


def _counted(gather: Callable[..., list], *args: Any) -> list:
    """``gather(*args)``, one gather of ``CLOCK``'s, its seconds counted (waits included)."""
    t0 = time.perf_counter()
    try:
        return gather(*args)
    finally:
        CLOCK.gathers += 1
        CLOCK.seconds += time.perf_counter() - t0


def _digest(ops: list[str], figures: list[tuple[str, tuple]]) -> bytes:
    """The figures a reduction combines: its ops and each figure's ``(dtype, shape)``, hashed
    to ``HEADER`` bytes."""
    text = repr([(o, *f) for o, f in zip(ops, figures)]).encode()
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


class _DeviceReduce:
    """A ``TorchComm``'s reductions of tensors on its buffers' device (``on_device``), with no
    read to the host: each figure's bytes (a multiple of ``ALIGN`` apart) after the header, in
    one ``uint8`` tensor, gathered by one ``all_gather`` of the group; each rank's figures
    viewed back in their dtypes and combined in rank order by ``OPS``' ops on tensors, as the
    host path combines them (the same figures, bit for bit). The ranks' headers are compared on the
    device, and the comparison is read by ``verify`` (``block_checks``: at the end of every
    round), which names ranks that reduced other figures since the last one, where their
    buffers had one size (else the gather itself fails). A gather takes every rank's shape
    from its caller (``TorchComm.all_gather``), checked against this rank's own."""

    def __init__(self, comm: TorchComm) -> None:
        torch = comm.torch
        self.comm = comm
        self.ops = {"sum": torch.add, "max": torch.maximum, "min": torch.minimum}  # (OPS')
        self._headers: dict[tuple[bytes, Any], Any] = {}  # (header, device) -> its tensor
        self._disagree: Any = None  # a 0-d bool tensor: some header differed, not yet read

    def takes(self, values: Sequence[Any]) -> bool:
        """Whether ``values`` are all tensors on the device that the group moves (the current
        CUDA device for NCCL, the CPU for gloo). Every rank passes such tensors, or none: a
        rank's path follows its own values."""
        torch, device = self.comm.torch, self.comm.device
        return bool(values) and all(
            isinstance(v, torch.Tensor)
            and (v.device.type == "cpu" if device is None else v.device == device)
            for v in values
        )

    def reduce(self, values: Sequence[Any], ops: list[str]) -> list:
        torch = self.comm.torch
        header = _digest(ops, [(str(v.dtype), tuple(v.shape)) for v in values])
        pieces, sizes = [self._header(header, values[0].device)], []
        for v in values:
            flat = v.detach().contiguous().reshape(-1).view(torch.uint8)
            sizes.append(flat.numel())
            pieces.append(flat)
            if flat.numel() % ALIGN:
                pieces.append(flat.new_zeros(ALIGN - flat.numel() % ALIGN))
        parts = self.comm._gather_tensor(torch.cat(pieces))
        differs = (torch.stack([part[:HEADER] for part in parts]) != pieces[0]).any()
        self._disagree = differs if self._disagree is None else self._disagree | differs
        out = []
        at = HEADER
        for v, size, name in zip(values, sizes, ops):
            figures = [part[at : at + size].view(v.dtype).reshape(v.shape) for part in parts]
            out.append(torch.empty_like(v).copy_(functools.reduce(self.ops[name], figures)))
            at += size + (-size % ALIGN)
        return out

    def gather(self, value: Any, shapes: Sequence[tuple]) -> list:
        """Every rank's tensor ``value`` of ``shapes`` (each rank's, in rank order), gathered
        on the device in buffers of the largest's size, as C-ordered tensors."""
        comm = self.comm
        if len(shapes) != comm.P or tuple(value.shape) != tuple(shapes[comm.rank]):
            raise ValueError(
                f"shapes must be the {comm.P} ranks' shapes, rank {comm.rank}'s "
                f"{tuple(value.shape)}, got {list(shapes)!r}"
            )
        sizes = [math.prod(shape) for shape in shapes]
        flat = value.detach().contiguous().reshape(-1)
        buf = flat.new_zeros(max(sizes))
        buf[: flat.numel()] = flat
        parts = comm._gather_tensor(buf)
        return [part[:n].reshape(shape) for part, n, shape in zip(parts, sizes, shapes)]

    def _header(self, header: bytes, device: Any) -> Any:
        """The header as a ``uint8`` tensor on ``device``, made once (a copy to a GPU from
        pageable memory would wait for the device)."""
        key = (header, device)
        if key not in self._headers:
            raw = np.frombuffer(header, np.uint8).copy()
            self._headers[key] = self.comm.torch.from_numpy(raw).to(device)
        return self._headers[key]

    def verify(self) -> None:
        if self._disagree is None:
            return
        differs, self._disagree = bool(self._disagree), None  # (the one read)
        if differs:
            raise RuntimeError(
                f"the ranks reduce different figures at once (rank {self.comm.rank}: a "
                f"reduction on the device since the last check met other figures)"
            )
