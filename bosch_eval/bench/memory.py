"""Peak-memory meters for the benchmark: on CUDA the allocator's peak above a start; on a CPU
the peak of live tensor bytes from the profiler's allocation events (an allocator hook).

A CPU has no resident-set measure of what a step allocates: glibc keeps freed memory and
hands it out again without the resident set growing, so once earlier runs have grown the
heap, a prefill's activations and KV cache fit in memory already resident, and the resident
set's peak above the start reads about 0 however exactly its high-water mark is taken
(issue 68). SmolLM2, fp32, after one 2048-token prefill: the kernel's reset peak RSS
(``VmHWM`` after ``/proc/self/clear_refs``) read 0.0 MB above the start for prefills of 1024
and 2048 tokens that write 45 and 90 MB of KV cache; the tensor peak read 72.5 and 145 MB at
every run. The profiler sees every tensor allocation and free.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from itertools import accumulate

import torch

CPU_PEAK_METHOD = (
    "CPU peaks: tensor bytes live at the worst moment of the step, summed from the profiler's allocation "
    "events (torch.profiler profile_memory) in the separate profiled run; not the resident set, which does "
    "not grow when the C allocator reuses memory it kept from earlier runs"
)


@contextmanager
def peak_memory(device: torch.device) -> Iterator[Callable[[], int | None]]:
    """Yields a function returning the peak memory above the start, in bytes.

    CUDA: the allocator's peak. CPU: None, not measured here: the resident set cannot show a
    step's memory (the module's docstring) and the profiler that can would slow the timed
    block; :func:`tensor_memory_peak` measures it in a separate run.
    """
    if device.type != "cuda":
        yield lambda: None
        return
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    start = torch.cuda.memory_allocated(device)
    yield lambda: torch.cuda.max_memory_allocated(device) - start


@contextmanager
def tensor_memory_peak() -> Iterator[Callable[..., int]]:
    """Yields a function ``peak(label=None)`` to call after the block: the peak bytes of CPU
    tensor memory that the block allocated and had not yet freed, over the whole block, or
    (``label``: a ``record_function`` inside the block) over that label's span, counting what
    was live when it began.

    Every allocation and free of tensor storage is one ``[memory]`` event of the profiler
    (``profile_memory=True``) with its bytes and time; they are summed in time order.
    Unlike the resident set size this sees memory the C allocator hands out again (after a
    warm-up, glibc holds earlier runs' temporaries and a step's peak hides inside them); it
    does not see the weights. A tensor allocated before the block and freed inside it counts
    as a negative change, so the block should free only what it allocated (garbage is
    collected first); a peak is never below 0. The profiler slows the block: time it apart.
    """
    import gc

    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    _quiet_kineto()
    gc.collect()
    events: list = []

    def peak(label: str | None = None) -> int:
        spans = [(e.start_ns(), e.end_ns()) for e in events if e.name() == label]
        if label is not None and not spans:
            raise ValueError(f"tensor_memory_peak: no record_function {label!r} ran inside the block")
        start, end = (min(s for s, _ in spans), max(e for _, e in spans)) if spans else (None, None)
        changes = sorted(
            (e.start_ns(), e.nbytes()) for e in events if e.name() == "[memory]" and e.device_type() == DeviceType.CPU
        )
        before = sum(nbytes for moment, nbytes in changes if start is not None and moment < start)
        within = [
            nbytes
            for moment, nbytes in changes
            if (start is None or start <= moment) and (end is None or moment <= end)
        ]
        return max(0, *accumulate(within, initial=before))  # live bytes after each change, from the span's start

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        yield peak
    events = list(prof.profiler.kineto_results.events())


def _quiet_kineto() -> None:
    """Keep libkineto from printing ``USDT: ... profiler_start`` and ``profiler_stop`` at every
    profile (stderr, two lines a run). They are its highest log level (USDT, 5, above ERROR,
    so torch's own quieting to ERROR lets them through); only level 6 hides them. libkineto
    reads ``KINETO_LOG_LEVEL`` once, when the process first profiles; a value the user set is
    kept."""
    os.environ.setdefault("KINETO_LOG_LEVEL", "6")
