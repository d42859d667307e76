"""Latency and memory of hybrid models next to the original (paper §C.4, Fig. 5–6).

For each sequence length T and each configuration (the original model, then one hybrid
per mask or ratio), measured interleaved in one process: prefill tokens/s (optionally in
chunks of C tokens), decode tokens/s over N greedy steps after the prefill, KV-cache
bytes after the prefill, peak memory (CUDA allocator peak; on CPU the peak resident
set size above the start, see :func:`peak_memory`), and the decode phase's own peak:
the tensor bytes live at the worst moment of the decode steps, the KV cache included and
the weights not (:func:`decode_peak`, from the profiler's allocation events). The original runs unpatched
(``sdpa``, transformers' dynamic cache); hybrids run the bosch attention on the
deploy-mode :class:`~bosch_eval.hybrid_cache.HybridCache`.

A configuration may add KV quantization (LogQuant/KiVi, ``bosch_eval.kv_quant``) to its
full-attention groups; without a mask it runs on the all-full mask (the original
attention). Each row has the bytes measured from the stored tensors next to the
closed-form :func:`~bosch_eval.kv_quant.formula.kv_cache_bytes_formula`.
"""

from __future__ import annotations

import platform
import re
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import DynamicCache
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from bosch_eval.hybrid_attention import hybridize
from bosch_eval.hybrid_cache import HybridCache, kv_cache_bytes
from bosch_eval.kv_quant.config import KVQuantConfig
from bosch_eval.kv_quant.formula import kv_cache_bytes_formula
from bosch_eval.masks import HeadMask, ModelShape, ceil_count, check_ratio
from bosch_eval.transformers_compat import cache_argument


@dataclass(frozen=True)
class BenchRow:
    label: str
    swa_ratio: float
    window: int | None
    length: int
    prefill_tokens_per_s: float
    decode_tokens_per_s: float
    kv_cache_bytes: int
    peak_memory_bytes: int
    attention_share: float  # of the prefill time, spent in the attention function
    kv_quant: str | None = None  # e.g. "logquant-2bit-W128"
    kv_bytes_formula: int = 0  # the closed form at this length, to check kv_cache_bytes against
    decode_peak_bytes: int = 0  # tensor bytes live at the decode steps' peak (the cache included, weights not)


def balanced_mask(shape: ModelShape, ratio: float, window: int) -> HeadMask:
    """⌈ρ·L·G⌉ SWA groups spread evenly over layers (for timing, which groups does not matter)."""
    ratio = check_ratio(ratio)
    cells = sorted(((layer, g) for layer in range(shape.num_layers) for g in range(shape.num_kv_heads)), key=lambda c: (c[1], c[0]))
    swa = set(cells[: ceil_count(ratio, len(cells))])
    return HeadMask.from_swa_groups(shape, swa, window=window, method=f"balanced-{ratio:g}")


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


DECODE_LABEL = "bosch_bench.decode"


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
    changes = sorted((e.start_ns(), e.nbytes()) for e in events if e.name() == "[memory]" and e.device_type() == DeviceType.CPU)
    live = 0
    for moment, nbytes in changes:
        live += nbytes
        if start is None or moment >= start:
            peak[0] = max(peak[0], live)


@torch.no_grad()
def decode_peak(model: Any, ids: torch.Tensor, chunk: int | None, cache: DynamicCache, steps: int = 4) -> int:
    """Tensor bytes live at the peak of ``steps`` greedy decode steps after prefilling ``ids``:
    the KV cache the prefill left, whatever else it left, and the steps' own temporaries
    (weights excluded). CPU: prefill and decode both run under :func:`tensor_memory_peak`,
    so the cache tensors a decode step replaces are seen freed. CUDA: the allocator's peak
    during the steps, above what was allocated before the prefill."""
    device = ids.device
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        before = torch.cuda.memory_allocated(device)
        token = _prefill(model, ids, chunk, cache)[:, -1:].argmax(-1)
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        for _ in range(steps):
            token = model(input_ids=token, **{cache_argument(model): cache}, use_cache=True).logits[:, -1:].argmax(-1)
        torch.cuda.synchronize(device)
        return torch.cuda.max_memory_allocated(device) - before
    with tensor_memory_peak(since=DECODE_LABEL) as peak:
        token = _prefill(model, ids, chunk, cache)[:, -1:].argmax(-1)
        with torch.profiler.record_function(DECODE_LABEL):
            for _ in range(steps):
                token = model(input_ids=token, **{cache_argument(model): cache}, use_cache=True).logits[:, -1:].argmax(-1)
    return peak()


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


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _prefill(model: Any, ids: torch.Tensor, chunk: int | None, cache: DynamicCache) -> torch.Tensor:
    """Logits of the last position after prefilling ``ids`` (in chunks of ``chunk`` tokens)."""
    for piece in ids.split(chunk or ids.shape[1], dim=1):
        logits = model(input_ids=piece, **{cache_argument(model): cache}, use_cache=True, logits_to_keep=1).logits
    return logits


@torch.no_grad()
def measure(model: Any, ids: torch.Tensor, decode_tokens: int, chunk: int | None, cache: DynamicCache) -> tuple[float, float, int, int]:
    """Prefill seconds, decode seconds per token, KV bytes after prefill, peak memory bytes."""
    device = ids.device
    with peak_memory(device) as peak:
        _sync(device)
        start = time.perf_counter()
        logits = _prefill(model, ids, chunk, cache)
        _sync(device)
        prefill = time.perf_counter() - start
        kv_bytes = kv_cache_bytes(cache)
        token = logits[:, -1:].argmax(-1)
        start = time.perf_counter()
        for _ in range(decode_tokens):
            token = model(input_ids=token, **{cache_argument(model): cache}, use_cache=True).logits[:, -1:].argmax(-1)
        _sync(device)
        decode = (time.perf_counter() - start) / max(1, decode_tokens)
        return prefill, decode, kv_bytes, peak()


@contextmanager
def attention_seconds(model: Any) -> Iterator[Callable[[], float]]:
    """Yields a function returning the seconds spent so far in the model's attention function.

    Wraps the function that transformers' attention registry holds for the model's
    implementation, so only attention itself counts (not the projections, norms or
    rotary embeddings around it). Each call is synchronized: a separate, untimed run.
    """
    name, device = model.config._attn_implementation, model.device
    function, seconds = ALL_ATTENTION_FUNCTIONS[name], [0.0]

    def timed(*args: Any, **kwargs: Any) -> Any:
        _sync(device)
        start = time.perf_counter()
        try:
            return function(*args, **kwargs)
        finally:
            _sync(device)
            seconds[0] += time.perf_counter() - start

    ALL_ATTENTION_FUNCTIONS[name] = timed  # an instance-local override; del restores the registered one
    try:
        yield lambda: seconds[0]
    finally:
        del ALL_ATTENTION_FUNCTIONS[name]


@torch.no_grad()
def attention_share(model: Any, ids: torch.Tensor, chunk: int | None, cache: DynamicCache) -> float:
    """Share of one prefill's time spent in attention: with share a, no change to attention
    alone can bring the prefill time below 1 − a of what it is."""
    with attention_seconds(model) as seconds:
        start = time.perf_counter()
        _prefill(model, ids, chunk, cache)
        _sync(ids.device)
        return seconds() / (time.perf_counter() - start)


def _set_up(model: Any, mask: HeadMask | None, window: int, kv_quant: KVQuantConfig | None = None) -> DynamicCache:
    """Put ``model`` in one configuration (``None``: the original) and return a fresh cache for it."""
    if mask is None and kv_quant is None:
        model.set_attn_implementation("sdpa")
        return DynamicCache()
    if mask is None:  # quantization alone: the original attention in every group
        mask = HeadMask.uniform(ModelShape.from_config(model.config), full=True, window=window, method="full")
    hybridize(model, mask, window=mask.window or window, backend="auto")
    return HybridCache.for_model(model, kv_quant)


def kv_quant_label(kv_quant: KVQuantConfig) -> str:
    return f"{kv_quant.method}-{kv_quant.bits}bit-W{kv_quant.window}"


def max_batch(budget_bytes: int, weight_bytes: int, kv_bytes_per_sequence: int) -> int:
    """Largest batch whose KV cache (closed form, per sequence) fits next to the weights."""
    return max(0, (budget_bytes - weight_bytes) // max(1, kv_bytes_per_sequence))


def run_bench(
    model: Any,
    configs: list[tuple[str, float | HeadMask | None] | tuple[str, float | HeadMask | None, KVQuantConfig | None]],
    lengths: list[int],
    decode_tokens: int,
    window: int | None = None,
    chunk: int | None = None,
    repeats: int = 3,
    sinks: int = 0,
) -> list[BenchRow]:
    """Measure the original model and each hybrid configuration at each length.

    Args:
        configs: ``(label, ratio or mask[, kv_quant])``; a ratio gets :func:`balanced_mask`;
            ``None`` with a ``kv_quant``: quantization alone on the original attention.
        window: W for ratio configs; default ``T // 32`` (the paper's T/W) per length.
        sinks: S attention sinks for ratio configs (a mask config keeps its own).
        repeats: timed runs per configuration (medians are reported), plus one run that
            measures the attention share.
    """
    shape = ModelShape.from_config(model.config)
    device = model.device
    quant = {c[0]: c[2] for c in configs if len(c) > 2}
    head_dim = ModelShape.head_dim_of(model.config)
    dtype_bytes = next(model.parameters()).element_size()
    rows = []
    for length in lengths:
        w = window or max(1, length // 32)
        masks = [(c[0], c[1] if isinstance(c[1], HeadMask) or c[1] is None else balanced_mask(shape, c[1], w).with_meta(sinks=sinks)) for c in configs]
        ids = torch.randint(0, model.config.vocab_size, (1, length), generator=torch.Generator().manual_seed(length)).to(device)
        configurations: list[tuple[str, HeadMask | None]] = [("original", None), *masks]
        timings: dict[str, list[tuple[float, float, int, int]]] = {}
        for _ in range(repeats):  # interleaved, so drifting machine load hits every configuration alike
            for label, mask in configurations:
                timings.setdefault(label, []).append(measure(model, ids, decode_tokens, chunk, _set_up(model, mask, w, quant.get(label))))
        # Separate runs: timing every attention call, or profiling allocations, perturbs the timing.
        shares = {label: attention_share(model, ids, chunk, _set_up(model, mask, w, quant.get(label))) for label, mask in configurations}
        decode_peaks = {label: decode_peak(model, ids, chunk, _set_up(model, mask, w, quant.get(label))) for label, mask in configurations}
        for label, runs in timings.items():
            mask = dict(masks).get(label)
            rows.append(
                BenchRow(
                    label=label,
                    swa_ratio=mask.swa_ratio if mask else 0.0,
                    window=(mask.window or w) if mask else None,
                    length=length,
                    prefill_tokens_per_s=length / statistics.median(r[0] for r in runs),
                    decode_tokens_per_s=1.0 / statistics.median(r[1] for r in runs),
                    kv_cache_bytes=runs[0][2],
                    peak_memory_bytes=int(statistics.median(r[3] for r in runs)),
                    attention_share=shares[label],
                    kv_quant=kv_quant_label(quant[label]) if quant.get(label) else None,
                    kv_bytes_formula=kv_cache_bytes_formula(
                        mask.bits if mask else None, shape.num_layers, shape.num_kv_heads, head_dim, length,
                        window=(mask.window or w) if mask else None, kv_quant=quant.get(label), dtype_bytes=dtype_bytes,
                        sinks=mask.sinks if mask else 0,
                    ),  # fmt: skip
                    decode_peak_bytes=decode_peaks[label],
                )
            )
    return rows


def ratio_table(rows: list[BenchRow], budget_bytes: int | None = None, weight_bytes: int = 0) -> str:
    """Markdown table with each hybrid's ratios to the original at the same length; with a
    memory budget, KV columns (formula, quantization) and the largest batch that fits."""
    original = {row.length: row for row in rows if row.label == "original"}
    kv_columns = budget_bytes is not None
    lines = [
        "| config | ρ | W | T | prefill tok/s | decode tok/s | KV bytes | peak MB | decode peak MB | attention share | prefill time ratio | decode time ratio | KV ratio | decode peak ratio |"
        + (" kv_quant | KV bytes (formula) | max batch |" if kv_columns else ""),
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|" + ("---|---|---|" if kv_columns else ""),
    ]
    for row in rows:
        base = original[row.length]
        lines.append(
            f"| {row.label} | {row.swa_ratio:.3g} | {row.window or '-'} | {row.length} | {row.prefill_tokens_per_s:.1f} | "
            f"{row.decode_tokens_per_s:.2f} | {row.kv_cache_bytes} | {row.peak_memory_bytes / 2**20:.1f} | "
            f"{row.decode_peak_bytes / 2**20:.1f} | {row.attention_share:.2f} | "
            f"{base.prefill_tokens_per_s / row.prefill_tokens_per_s:.3f} | {base.decode_tokens_per_s / row.decode_tokens_per_s:.3f} | "
            f"{row.kv_cache_bytes / base.kv_cache_bytes:.4f} | {row.decode_peak_bytes / max(base.decode_peak_bytes, 1):.3f} |"
            + (f" {row.kv_quant or '-'} | {row.kv_bytes_formula} | {max_batch(budget_bytes, weight_bytes, row.kv_bytes_formula)} |" if kv_columns else "")
        )
    return "\n".join(lines)


def environment(device: torch.device) -> dict[str, str]:
    """The device the benchmark ran on and versions, recorded beside every benchmark result."""
    import transformers

    # The device used, not the best one present: a CPU run on a GPU machine says cpu.
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"{device.type} ({platform.processor() or platform.machine()})"
    return {"device": name, "threads": str(torch.get_num_threads()), "torch": torch.__version__,
            "transformers": transformers.__version__, "python": platform.python_version()}  # fmt: skip


def plot(rows: list[BenchRow], path: str, x: str = "length") -> None:
    """Prefill and decode throughput and KV bytes per configuration against ``x`` (Fig. 5/6 style)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def series(row: BenchRow) -> str:  # one line per configuration; in a window sweep, per ratio
        return row.label if x == "length" or row.window is None else f"ρ={row.swa_ratio:g}"

    metrics = [("prefill_tokens_per_s", "prefill tokens/s"), ("decode_tokens_per_s", "decode tokens/s"), ("kv_cache_bytes", "KV-cache bytes")]
    figure, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    for axis, (field, title) in zip(axes, metrics, strict=True):
        for label in dict.fromkeys(map(series, rows)):
            points = [(getattr(r, x), getattr(r, field)) for r in rows if series(r) == label]
            if points[0][0] is None:  # the original has no window: a reference line in the sweep
                axis.axhline(points[0][1], color="black", linestyle="--", label=label)
            else:
                axis.plot(*zip(*points, strict=True), marker="o", label=label)
        axis.set_xscale("log", base=2)
        axis.set_xlabel("sequence length T" if x == "length" else "window W")
        axis.set_title(title)
    axes[0].legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def rows_as_json(rows: list[BenchRow]) -> list[dict[str, Any]]:
    return [asdict(row) for row in rows]
