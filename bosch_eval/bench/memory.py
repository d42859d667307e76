"""Peak-memory meters for the benchmark: the device's peak above a start (CUDA allocator, or
the process's resident set on a CPU) and the peak of live tensor bytes from the profiler's
allocation events (which, unlike the resident set, does not see what the C allocator keeps)."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import torch


@contextmanager
def peak_memory(device: torch.device) -> Iterator[Callable[[], int]]:
    """Yields a function returning the peak memory above the start, in bytes.

    CUDA: the allocator's peak. CPU on Linux: the kernel's peak resident set size
    (``VmHWM``), reset at the start; elsewhere the resident set size sampled every
    millisecond by a thread (which takes CPU time from the run it measures).
    """
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        start = torch.cuda.memory_allocated(device)
        yield lambda: torch.cuda.max_memory_allocated(device) - start
        return
    if _reset_peak_rss():
        start = _proc_status_bytes("VmRSS")
        yield lambda: _proc_status_bytes("VmHWM") - start
        return
    import psutil

    process, peak, done = psutil.Process(), [0], threading.Event()
    start = process.memory_info().rss

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], process.memory_info().rss - start)
            time.sleep(0.001)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        yield lambda: peak[0]
    finally:
        done.set()
        sampler.join()


@contextmanager
def tensor_memory_peak(since: str | None = None) -> Iterator[Callable[[], int]]:
    """Yields a function returning, after the block, the peak bytes of CPU tensor memory that
    the block allocated and had not yet freed; with ``since`` (a ``record_function`` label
    inside the block), the peak from that label's start on.

    Every allocation and free of tensor storage is one ``[memory]`` event of the profiler
    (``profile_memory=True``) with its bytes and time; they are summed in time order.
    Unlike the resident set size this does not see memory the C allocator keeps from
    earlier phases (after a prefill, glibc holds the prefill's temporaries and a decode
    step's peak hides inside them), nor the weights. A tensor allocated before the block
    and freed inside it counts as a negative change, so the block should free only what it
    allocated (garbage is collected first). The profiler slows the block: time it apart.
    """
    import gc

    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    gc.collect()
    peak = [0]
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        yield lambda: peak[0]
    events = prof.profiler.kineto_results.events()
    labels = [e.start_ns() for e in events if since is not None and e.name() == since]
    if since is not None and not labels:
        raise ValueError(f"tensor_memory_peak: no record_function {since!r} ran inside the block")
    start = min(labels, default=None)
    changes = sorted(
        (e.start_ns(), e.nbytes()) for e in events if e.name() == "[memory]" and e.device_type() == DeviceType.CPU
    )
    live = 0
    for moment, nbytes in changes:
        live += nbytes
        if start is None or moment >= start:
            peak[0] = max(peak[0], live)


def _reset_peak_rss() -> bool:
    """Linux (≥ 4.0) resets a process's peak resident set size when 5 is written to clear_refs."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def _proc_status_bytes(field: str) -> int:
    match = re.search(rf"^{field}:\s+(\d+) kB", Path("/proc/self/status").read_text(), re.MULTILINE)
    if match is None:
        raise RuntimeError(f"/proc/self/status: no field {field!r}")
    return int(match.group(1)) * 1024
