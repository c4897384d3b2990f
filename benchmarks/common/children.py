"""A file read in a child forked from the warm process, under limits, and what the read cost.

``run_case`` writes a reader's file and reads it in a child (``os.fork``) under ``RLIMIT_AS``
(the parent's address space plus a margin) and ``RLIMIT_CPU``: a crash, a hang or a memory bomb
is the child's death, never the parent's. The child reports its outcome (loaded; refused by the
package's error naming the file; a raw exception), its wall seconds and its *peak*: how far its
resident set rose during the read (``VmHWM`` reset before it, Linux's ``clear_refs``). Call
``trim`` after the parent frees much (a seed run trained, a case built): the parent's freed
heap handed back, a child's read faults in its own pages and its peak shows them. Used by
``fuzz_readers.py`` (mutated files) and ``hostile_battery.py`` (the tests' hostile files).
"""

import contextlib
import ctypes
import ctypes.util
import faulthandler
import gc
import json
import os
import resource
import signal
import time

from fenchel_cvx.errors import FenchelError

SLOW = 10.0  # seconds: a read slower than this is counted as slow
#: bytes of memory any read may take above its process's resident set, whatever it declares
#: (the bound is max(64 MB, 4 x the declared size): a read under this floor keeps it)
MEMORY_FLOOR = 64 << 20


def _status_bytes(field):
    """``field`` (VmRSS, VmHWM) of this process's /proc status, in bytes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) << 10
    raise LookupError(field)


def _reset_peak():
    """This process's resident set now, with its peak (VmHWM) reset to it (Linux's
    ``clear_refs`` 5), so that the peak read after a call is the call's own."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    return _status_bytes("VmRSS")


def _child(reader, path, memory_bytes, cpu_seconds, out):
    """In the forked child: the limits, the read, its outcome as one JSON line on ``out``
    (``peak``: the bytes the read's resident set rose above where it started; a crash is the
    child's death alone: no traceback dump inherited from the parent)."""
    faulthandler.disable()
    resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_seconds, cpu_seconds + 1))
    start = _reset_peak()
    try:
        reader.read(path)
        outcome = dict(kind="loaded")
    except FenchelError as err:
        named = path.name in str(err)
        text = str(err)[:300]
        outcome = (
            dict(kind="named", error=text) if named else dict(kind="raw", error=f"unnamed: {text}")
        )
    except MemoryError:
        outcome = dict(kind="memory", error="MemoryError")
    except BaseException as err:  # the contract's breach: any other exception
        outcome = dict(kind="raw", error=f"{type(err).__name__}: {str(err)[:300]}")
    outcome["peak"] = _status_bytes("VmHWM") - start
    os.write(out, (json.dumps(outcome) + "\n").encode())
    os._exit(0)


def trim():
    """This process's freed memory handed back to the system (glibc's ``malloc_trim``): a
    child forked from it then faults in the pages its read takes, and its peak shows them, where
    it would otherwise reuse the freed heap this process keeps (the command line keeps it:
    ``fenchel_cvx.heap``; training a seed run frees hundreds of MB)."""
    gc.collect()
    with contextlib.suppress(OSError, AttributeError, TypeError):
        ctypes.CDLL(ctypes.util.find_library("c")).malloc_trim(0)


def _address_space():
    """This process's virtual memory in bytes (the child's limit adds to it)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")


def run_case(reader, data, path, memory_gib=1.0, cpu_seconds=20):
    """``data`` written as ``reader``'s file ``path`` (None: the file is already there) and read
    in a forked child: its outcome (``kind``: loaded, named, raw, memory, crash or cpu;
    ``error``; ``seconds``; ``peak``)."""
    if data is not None:
        path.write_bytes(data)
    memory = _address_space() + int(memory_gib * 2**30)
    r, w = os.pipe()
    t0 = time.perf_counter()
    pid = os.fork()
    if pid == 0:  # the child
        os.close(r)
        _child(reader, path, memory, cpu_seconds, w)
    os.close(w)
    with os.fdopen(r) as pipe:
        line = pipe.read()
    _, status = os.waitpid(pid, 0)
    seconds = time.perf_counter() - t0
    if line:
        return dict(json.loads(line), seconds=seconds)
    sig = os.WTERMSIG(status) if os.WIFSIGNALED(status) else None
    kind = "cpu" if sig in (signal.SIGXCPU, signal.SIGKILL) else "crash"
    return dict(kind=kind, error=f"died: signal {sig}, status {status}", seconds=seconds)
