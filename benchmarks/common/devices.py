"""Where the benchmarks' methods run (``--device``), and the machine a run ran on.

One class per ``--device``: ``Cpu`` (FLN in NumPy, the baselines in PyTorch on the CPU),
``CuPyGpu`` (FLN in CuPy, the baselines in PyTorch on CUDA) and ``TorchGpu`` (every method in
PyTorch on CUDA tensors). ``machine`` records the platform, the CPU's model, the threads, the
BLAS libraries with their kernels and the CPU's GEMM rates, which every report prints
(``machine_text``).
"""

import importlib.util
import itertools
import os
import platform
import time

import numpy as np

from fenchel_cvx.heap import keep_freed_memory
from fenchel_cvx.threads import limit_threads


class Cpu:
    """``--device cpu``: FLN in NumPy, the baselines in PyTorch on the CPU."""

    torch = "cpu"  # PyTorch's device for the baselines

    def missing(self, methods):
        """Why ``methods`` cannot run here (checked before any work), or None."""
        return None

    def lib(self):
        """``(xp, sync)``: FLN's array library, and a wait for its queued work before a clock
        read."""
        return np, (lambda: None)

    def describe(self):
        return "CPU"

    def gpu_peak_mib(self, method):
        return None


class CuPyGpu(Cpu):
    """``--device cupy``: FLN in CuPy, the baselines in PyTorch on CUDA, on the current GPU (its
    work is asynchronous: a clock read without ``sync`` counts the launches only)."""

    torch = "cuda"

    def missing(self, methods):
        if importlib.util.find_spec("cupy") is None:
            return (
                "--device cupy needs CuPy and a GPU (pip install -e '.[gpu]'), got no cupy module"
            )
        import cupy

        try:
            gpus = cupy.cuda.runtime.getDeviceCount()
        except Exception as exc:  # CuPy without a driver
            return f"--device cupy needs a CUDA GPU: {type(exc).__name__}: {exc}"
        if gpus == 0:
            return "--device cupy needs a CUDA GPU, got none"
        if not {"adam", "sgd"} & set(methods) or importlib.util.find_spec("torch") is None:
            return None
        import torch

        from fenchel_cvx.baselines.backprop import DEVICES

        need = DEVICES["cuda"][0](torch)
        return need and (
            f"--device cupy trains the baselines in PyTorch on CUDA, which needs "
            f"{need}; or --methods fln"
        )

    def lib(self):
        import cupy

        return cupy, cupy.cuda.Device().synchronize

    def describe(self):
        import cupy

        gpu = cupy.cuda.Device()
        name = cupy.cuda.runtime.getDeviceProperties(gpu.id)["name"].decode()
        return f"GPU {gpu.id}: {name}, FLN in CuPy {cupy.__version__}, baselines in PyTorch on CUDA"

    def gpu_peak_mib(self, method):
        """The GPU memory the run held at its peak: CuPy's pool (it keeps what it allocated) for
        FLN, PyTorch's peak reservation for the baselines."""
        if method == "fln":
            import cupy

            return cupy.get_default_memory_pool().total_bytes() / 2**20
        import torch

        return torch.cuda.max_memory_reserved() / 2**20


class TorchGpu(Cpu):
    """``--device torch``: FLN and the baselines in PyTorch, on CUDA tensors (``device``): the
    fast backend's same array-API path as CuPy's, for a GPU without CuPy."""

    def __init__(self, device="cuda"):
        self.torch = device

    def missing(self, methods):
        if importlib.util.find_spec("torch") is None:
            return "--device torch needs PyTorch built for CUDA, got no torch module"
        import torch

        if self.torch == "cuda" and not torch.cuda.is_available():
            return "--device torch needs a CUDA GPU for PyTorch, got none"
        return None

    def lib(self):
        import torch
        from array_api_compat import torch as xp

        def sync():
            if self.torch == "cuda":
                torch.cuda.synchronize()

        return OnDevice(xp, self.torch), sync

    def describe(self):
        import torch

        if self.torch != "cuda":
            return f"PyTorch {torch.__version__} on {self.torch}"
        gpu = torch.cuda.current_device()
        return f"GPU {gpu}: {torch.cuda.get_device_name(gpu)}, every method in PyTorch"

    def gpu_peak_mib(self, method):
        import torch

        return torch.cuda.max_memory_reserved() / 2**20 if self.torch == "cuda" else None


class OnDevice:
    """An array namespace whose ``asarray`` puts new arrays on ``device`` (the rest: ``xp``'s)."""

    def __init__(self, xp, device):
        self.xp, self.device = xp, device

    def asarray(self, A, **kw):
        return self.xp.asarray(A, device=self.device, **kw)

    def __getattr__(self, name):
        return getattr(self.xp, name)


#: --device -> where and how each method runs
DEVICES = {"cpu": Cpu(), "cupy": CuPyGpu(), "torch": TorchGpu()}


def gemm_rate(dtype, repeats=20, device="cpu", library=None):
    """Measured GEMM FLOP/s of a 300 x 785 x 500 product (FLN's W_0 size) on ``device``, best
    of ``repeats`` (after one untimed product: a GPU loads its kernel on the first), in FLN's
    array library there, or in ``library`` (a function from NumPy arrays to its arrays, as
    ``torch.from_numpy``)."""
    xp, sync = DEVICES[device].lib()
    to = xp.asarray if library is None else library
    rng = np.random.default_rng(0)
    A, B = (to(rng.standard_normal(s).astype(dtype)) for s in ((300, 785), (785, 500)))
    A @ B
    best = float("inf")
    for _ in range(repeats):
        sync()
        t = time.perf_counter()
        A @ B
        sync()
        best = min(best, time.perf_counter() - t)
    return 2 * 300 * 785 * 500 / best


def machine(args):
    """The machine a run ran on, and its threads (the MNIST benchmarks' summaries; one without
    ``--device`` runs on the CPU), with its BLAS (``blas_record``)."""
    return dict(
        platform=platform.platform(),
        processor=cpu_model(),
        cpus=os.cpu_count(),
        python=platform.python_version(),
        device=DEVICES[getattr(args, "device", "cpu")].describe(),
        freed_memory_kept=keep_freed_memory(),
        fln_ranks=getattr(args, "nproc", 1),
        **blas_record(args.threads),
    )


#: lines of ``/proc/cpuinfo`` that ``cpu_model`` reads at most (its first processor's block)
CPUINFO_LINES = 64


def cpu_model(cpuinfo="/proc/cpuinfo"):
    """The CPU's model as the kernel names it (``/proc/cpuinfo``'s first ``model name``, among
    its first ``CPUINFO_LINES`` lines), else ``platform.processor()`` or the architecture: a
    benchmark run on a cloud VM names the machine it actually got."""
    try:
        with open(cpuinfo, encoding="ascii", errors="replace") as f:
            for line in itertools.islice(f, CPUINFO_LINES):
                key, _, value = line.partition(":")
                if key.strip() == "model name" and value.strip():
                    return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def blas_record(threads):
    """``threads``, the BLAS libraries loaded and their kernels (``blas_kernels``), and the
    CPU's float32 GEMM rates of NumPy and PyTorch on that many cores (``cpu_gemm_rates``): the
    part of ``machine`` that ``machine_text`` reports."""
    return dict(threads=threads, blas=blas_kernels(), cpu_gemm_gflops=cpu_gemm_rates(threads))


def blas_kernels():
    """The BLAS libraries loaded, each by the package that ships it (``threads.owner``), with
    its version and the kernels it runs, as threadpoolctl reports them (``"numpy: openblas
    0.3.31, SkylakeX kernels; scipy: ..."``; the machine's ``OPENBLAS_CORETYPE`` chooses
    OpenBLAS's)."""
    from threadpoolctl import threadpool_info

    from fenchel_cvx.threads import owner

    found = [
        f"{owner(i.get('filepath'))}: {i.get('internal_api')} {i.get('version')}, "
        f"{i.get('architecture') or 'unknown'} kernels"
        for i in threadpool_info()
        if i.get("user_api") == "blas"
    ]
    return "; ".join(sorted(set(found))) or "unknown"


def cpu_gemm_rates(threads):
    """The CPU's float32 GEMM rate (GFLOP/s, ``gemm_rate``) of NumPy and of PyTorch on
    ``threads`` cores: ``{"numpy": ..., "torch": ...}`` (no ``torch`` where PyTorch is not
    installed). PyTorch's thread count is put back afterwards."""
    rates = {}
    with limit_threads(threads):
        rates["numpy"] = gemm_rate(np.float32) / 1e9
    if importlib.util.find_spec("torch") is not None:
        import torch

        before = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            rates["torch"] = gemm_rate(np.float32, library=torch.from_numpy) / 1e9
        finally:
            torch.set_num_threads(before)
    return rates


def machine_text(machine):
    """The report's line on the BLAS libraries and the CPU's GEMM rates of ``machine``'s
    record."""
    rates = machine.get("cpu_gemm_gflops") or {}
    per = ", ".join(f"{'NumPy' if k == 'numpy' else 'PyTorch'} {v:.0f}" for k, v in rates.items())
    return (
        f"CPU: {machine.get('processor', 'unknown')}, {machine.get('cpus', '?')} cores; "
        f"BLAS: {machine.get('blas', 'unknown')}; float32 GEMM 300 x 785 x 500 on the CPU, "
        f"{machine['threads']} thread(s), GFLOP/s: {per or 'not measured'}"
    )
