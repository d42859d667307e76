"""Latency and memory of hybrid models next to the original (paper §C.4, Fig. 5–6).

For each sequence length T and each configuration (the original model, then one hybrid
per mask or ratio), measured interleaved in one process: prefill tokens/s (optionally in
chunks of C tokens), decode tokens/s over N greedy steps after the prefill at batch 1 and
at batch B (default 8), KV-cache bytes after the prefill, the prefill's peak memory (CUDA:
the allocator's peak above the start, in the timed runs; CPU: the tensor bytes live at the
prefill's worst moment, from the profiler's allocation events in a separate run, see
:mod:`~bosch_eval.bench.memory`), and the decode phase's own peak: the tensor bytes live at the worst
moment of the decode steps, the KV cache included and the weights not (:func:`memory_peaks`). The original runs as loaded
(the CLI loads ``sdpa``; transformers' dynamic cache); hybrids run the bosch attention (``backend``,
default ``auto``) on the deploy-mode :class:`~bosch_eval.caches.hybrid_cache.HybridCache`,
each for its block only (:func:`configured`): the model is given back as it was after every run;
where the family allows, with each layer's heads permuted by kind (``bosch_eval.attention.head_order``).

Timing is honest on a GPU: every configuration runs once untimed first (CUDA context,
kernel selection and compilation, allocator growth: the first configuration would pay
them otherwise), every timer synchronizes the device on both sides
(:func:`stopwatch`), and rows report medians of the warm, interleaved repeats.

A configuration may add KV quantization (LogQuant/KiVi, ``bosch_eval.caches.kv_quant``) to its
full-attention groups; without a mask it runs on the all-full mask (the original
attention). Each row has the bytes measured from the stored tensors next to the
closed-form :func:`~bosch_eval.caches.kv_quant.formula.kv_cache_bytes_formula`.
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import DynamicCache, StaticCache
from transformers.cache_utils import Cache, StaticLayer
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from bosch_eval.attention.head_order import can_permute
from bosch_eval.attention.hybrid_attention import HANDLE_ATTRIBUTE, attention_modules, hybrid_state, hybridize
from bosch_eval.attention.kernels import flex
from bosch_eval.attention.kernels.flex import unfused_is_an_error
from bosch_eval.bench.memory import peak_memory, tensor_memory_peak
from bosch_eval.caches.hybrid_cache import HybridCache, kv_cache_bytes
from bosch_eval.caches.kv_quant.config import KVQuantConfig
from bosch_eval.caches.kv_quant.formula import KVLayout, kv_cache_bytes_formula
from bosch_eval.masks.head_mask import HeadMask, ModelShape, ceil_count, check_ratio
from bosch_eval.models.transformers_compat import cache_argument
from bosch_eval.runtime.errors import SettingsError


@dataclass(frozen=True)
class BenchRow:
    label: str
    swa_ratio: float
    window: int | None
    length: int
    prefill_tokens_per_s: float
    decode_tokens_per_s: float  # batch 1
    kv_cache_bytes: int
    # Above what was allocated before the prefill: activations and the KV cache it writes (None: not measured,
    # a CPU run with --no-profile).
    prefill_peak_bytes: int | None
    attention_share: float | None  # of the prefill time, spent in the attention function (None: not profiled)
    kv_quant: str | None = None  # e.g. "logquant-2bit-W128"
    kv_bytes_formula: int = 0  # the closed form at this length, to check kv_cache_bytes against
    decode_peak_bytes: int | None = (
        None  # tensor bytes live at the decode steps' peak (the cache included, weights not)
    )
    decode_batch: int = 1  # B of the batched decode
    decode_batch_tokens_per_s: float = 0.0  # tokens of all B sequences per second
    backend: str | None = None  # the hybrid attention backend that ran (None: the original, unpatched)
    warmup_s: float | None = (
        None  # the first, untimed run: compiles, kernel selection, allocator growth (None: no warm-up)
    )
    compiles: int = 0  # flex graphs compiled during this configuration's runs (apart from the steady state timed)
    compiled_decode: bool = False  # decode steps under torch.compile (the original on StaticCache)


@dataclass(frozen=True)
class Measurement:
    """One timed run of one configuration (seconds; bytes)."""

    prefill_s: float
    decode_s: float  # per step at batch 1
    decode_batch_s: float  # per step at batch B
    kv_bytes: int  # after the prefill
    prefill_peak_bytes: int | None  # None: not measured in timed runs (a CPU's: see memory_peaks)


def balanced_mask(shape: ModelShape, ratio: float, window: int) -> HeadMask:
    """⌈ρ·L·G⌉ SWA groups spread evenly over layers: every layer holds (nearly) the same count."""
    ratio = check_ratio(ratio)
    cells = sorted(
        ((layer, g) for layer in range(shape.num_layers) for g in range(shape.num_kv_heads)), key=lambda c: (c[1], c[0])
    )
    swa = set(cells[: ceil_count(ratio, len(cells))])
    return HeadMask.from_swa_groups(shape, swa, window=window, method=f"balanced-{ratio:g}")


def drawn_mask(shape: ModelShape, ratio: float, window: int, seed: int = 0) -> HeadMask:
    """⌈ρ·L·G⌉ SWA groups drawn at random over the model, so that layers hold different
    counts as a search's or a ranking's mask does: what bench times by default. A balanced
    mask, the same count in every layer, would hide what a real mask costs where kernels
    specialize on a layer's count (compiled graphs, cache layouts)."""
    ratio = check_ratio(ratio)
    cells = [(layer, g) for layer in range(shape.num_layers) for g in range(shape.num_kv_heads)]
    swa = set(random.Random(seed).sample(cells, ceil_count(ratio, len(cells))))
    return HeadMask.from_swa_groups(shape, swa, window=window, method=f"drawn-{ratio:g}-seed{seed}")


PREFILL_LABEL, DECODE_LABEL = "bosch_bench.prefill", "bosch_bench.decode"


@torch.no_grad()
def memory_peaks(
    model: Any, ids: torch.Tensor, chunk: int | None, cache: DynamicCache, steps: int = 4
) -> tuple[int | None, int]:
    """The prefill's and the decode's peaks, in bytes, of one prefill of ``ids`` and ``steps``
    greedy decode steps after it, above what was allocated before the prefill (weights excluded).

    The decode's: the KV cache the prefill left, whatever else it left, and the steps' own
    temporaries. CPU: both phases run under :func:`tensor_memory_peak`, so the cache tensors a
    decode step replaces are seen freed, and the prefill's peak (activations and the KV cache it
    writes) comes from the same run. CUDA: the allocator's peak during the steps; the prefill's
    is None here (the timed runs measure it, :func:`measure`)."""
    device = ids.device
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        before = torch.cuda.memory_allocated(device)
        token = _prefill(model, ids, chunk, cache)[:, -1:].argmax(-1)
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        _decode(model, token, cache, steps)
        torch.cuda.synchronize(device)
        return None, torch.cuda.max_memory_allocated(device) - before
    with tensor_memory_peak() as peak:
        with torch.profiler.record_function(PREFILL_LABEL):
            token = _prefill(model, ids, chunk, cache)[:, -1:].argmax(-1)
        with torch.profiler.record_function(DECODE_LABEL):
            _decode(model, token, cache, steps)
    return peak(PREFILL_LABEL), peak(DECODE_LABEL)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@contextmanager
def stopwatch(device: torch.device) -> Iterator[Callable[[], float]]:
    """Yields a function returning, after the block, its wall-clock seconds.

    CUDA runs kernels asynchronously: the device is synchronized before the start (earlier
    work must not land in this block) and at the end (this block's kernels must), so the
    time is what the work costs, not what launching it costs. CPU: ``perf_counter`` alone.
    """
    _sync(device)
    start = time.perf_counter()
    elapsed: list[float] = []
    yield lambda: elapsed[0]
    _sync(device)
    elapsed.append(time.perf_counter() - start)


def _prefill(model: Any, ids: torch.Tensor, chunk: int | None, cache: DynamicCache) -> torch.Tensor:
    """Logits of the last position after prefilling ``ids`` (in chunks of ``chunk`` tokens)."""
    for piece in ids.split(chunk or ids.shape[1], dim=1):
        logits = model(input_ids=piece, **{cache_argument(model): cache}, use_cache=True, logits_to_keep=1).logits
    return logits


def _decode(
    model: Any, token: torch.Tensor, cache: DynamicCache, steps: int, forward: Callable[..., Any] | None = None
) -> torch.Tensor:
    """``steps`` greedy steps from ``token [B, 1]`` (by ``forward``, e.g. the model compiled;
    None: the model); the last token."""
    step = model if forward is None else forward
    for _ in range(steps):
        token = step(input_ids=token, **{cache_argument(model): cache}, use_cache=True).logits[:, -1:].argmax(-1)
    return token


@torch.no_grad()
def measure(
    model: Any,
    ids: torch.Tensor,
    decode_tokens: int,
    chunk: int | None,
    cache: DynamicCache,
    decode_batch: int = 8,
    forward: Callable[..., Any] | None = None,
) -> Measurement:
    """Time one prefill of ``ids [1, T]``, then ``decode_tokens`` greedy steps at batch 1, then as
    many at batch ``decode_batch`` (by ``forward``: the model compiled; None: eager).

    The batched decode runs on the cache repeated ``decode_batch`` times (:func:`_repeat_rows`): a step costs the same whatever the rows hold, and
    prefilling B different sequences would only add B − 1 untimed prefills.
    """
    device = ids.device
    with peak_memory(device) as peak, stopwatch(device) as prefill:
        logits = _prefill(model, ids, chunk, cache)
    prefill_peak = peak()
    kv_bytes = kv_cache_bytes(cache)
    token = logits[:, -1:].argmax(-1)
    untimed = 1 if forward is not None else 0  # compiled: the step that records this cache's graph
    token = _decode(model, token, cache, untimed, forward)
    with stopwatch(device) as decode:
        token = _decode(model, token, cache, decode_tokens, forward)
    _repeat_rows(cache, decode_batch)
    token = _decode(model, token.repeat_interleave(decode_batch, dim=0), cache, untimed, forward)
    with stopwatch(device) as batch_decode:
        _decode(model, token, cache, decode_tokens, forward)
    steps = max(1, decode_tokens)
    return Measurement(prefill(), decode() / steps, batch_decode() / steps, kv_bytes, prefill_peak)


def _repeat_rows(cache: Cache, repeats: int) -> None:
    """Every row of ``cache`` ``repeats`` times (transformers' ``StaticLayer`` has no
    ``batch_repeat_interleave``; its buffers are repeated here)."""
    for layer in cache.layers:
        if isinstance(layer, StaticLayer):
            layer.keys, layer.values = (
                layer.keys.repeat_interleave(repeats, dim=0),
                layer.values.repeat_interleave(repeats, dim=0),
            )
        else:
            layer.batch_repeat_interleave(repeats)


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
    with attention_seconds(model) as seconds, stopwatch(ids.device) as prefill:
        _prefill(model, ids, chunk, cache)
    return seconds() / prefill()


@contextmanager
def configured(
    model: Any,
    mask: HeadMask | None,
    window: int,
    kv_quant: KVQuantConfig | None = None,
    backend: str = "auto",
    capacity: int | None = None,
) -> Iterator[DynamicCache]:
    """``model`` in one configuration for the block (``None``: the original as loaded), with a
    fresh cache for it; leaving the block gives the model back as it was (lm-eval's
    ``hf_steered`` way: a patch applied for a block, never left behind).

    ``capacity`` (compiled decoding): caches preallocated for that many positions, the
    original on transformers' ``StaticCache``, a hybrid on its captured cache
    (``HybridCache.for_model(..., max_cache_len=capacity, captured=True)``): fixed shapes and
    tensor positions in both, so one graph (one CUDA graph on a GPU) serves every step.

    Raises:
        SettingsError: the model is already hybridized, so its original cannot be timed.
    """
    if getattr(model, HANDLE_ATTRIBUTE, None) is not None:
        raise SettingsError(
            "bench: the model is already hybridized; pass the plain model (bench applies each mask itself)"
        )
    if mask is None and kv_quant is None:
        yield DynamicCache() if capacity is None else StaticCache(config=model.config, max_cache_len=capacity)
        return
    if mask is None:  # quantization alone: the original attention in every group
        mask = HeadMask.uniform(ModelShape.from_config(model.config), full=True, window=window, method="full")
    # Heads permuted by kind where the family allows (deploy mode: decode steps read views only).
    by_kind = can_permute(attention_modules(model).values())
    with hybridize(model, mask, window=mask.window or window, backend=backend, by_kind=by_kind):
        yield HybridCache.for_model(model, kv_quant, max_cache_len=capacity, captured=capacity is not None)


@contextmanager
def compiled_decoding(model: Any, wanted: bool, kv_quant: bool) -> Iterator[Callable[..., Any] | None]:
    """The model compiled for decode steps (None: not wanted): ``dynamic=False`` over the
    static caches :func:`configured` builds (every shape fixed, positions in tensors), and on
    CUDA ``mode="reduce-overhead"``, so each step replays one captured CUDA graph. Graphs are
    per configuration, batch size and capacity (the prompt length plus the decodes): each is
    compiled in the warm-up, and each cache's first step, which records its graph for the
    cache's buffers, is left out of the timing (:func:`measure`). Dynamo's recompile limit is
    raised for the block, since past it dynamo runs eagerly, which would time the eager model
    as the compiled one.

    Raises:
        SettingsError: with KV quantization (its store appends a step's states and
            quantizes a window's worth at once: shapes that change every step).
    """
    if not wanted:
        yield None
        return
    if kv_quant:
        raise SettingsError(
            "bench --compile: KV quantization is not compiled (its store grows and quantizes in steps of W); drop --kv-quant or --compile"
        )
    mode = "reduce-overhead" if model.device.type == "cuda" else None  # CUDA graphs need a GPU
    with torch._dynamo.config.patch(recompile_limit=256):
        yield torch.compile(model, dynamic=False, mode=mode)


def kv_quant_label(kv_quant: KVQuantConfig) -> str:
    return f"{kv_quant.method}-{kv_quant.bits}bit-W{kv_quant.window}"


Config = tuple[str, float | HeadMask | None] | tuple[str, float | HeadMask | None, KVQuantConfig | None]


@dataclass(frozen=True)
class BenchPlan:
    """What ``run_bench`` measures, and how.

    Attributes:
        lengths: prompt lengths T, one row per configuration each.
        decode_tokens: tokens decoded after each prefill.
        window: W for ratio configs; default ``T // 32`` (the paper's T/W) per length.
        chunk: prefill chunk (None: the whole prompt at once).
        repeats: timed runs per configuration, interleaved; rows report their medians.
        sinks: S attention sinks for ratio configs (a mask config keeps its own).
        decode_batch: B of the batched decode (:func:`measure`).
        warmup: untimed runs of every configuration at each length before the timed ones.
        backend: attention backend of the hybrids (``auto`` or a registered one).
        profile: also measure the attention share and the decode phase's peak, in two more
            runs per configuration (else those fields are None).
        compile_decode: decode steps under ``torch.compile`` on static caches (CUDA graphs on a
            GPU), every configuration alike (:func:`compiled_decoding`); the warm-up runs compile.
    """

    lengths: tuple[int, ...]
    decode_tokens: int
    window: int | None = None
    chunk: int | None = None
    repeats: int = 3
    sinks: int = 0
    decode_batch: int = 8
    warmup: int = 1
    backend: str = "auto"
    profile: bool = True
    compile_decode: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "lengths", tuple(self.lengths))
        for name, value, least in (
            ("repeats", self.repeats, 1),
            ("warmup", self.warmup, 0),
            ("decode_batch", self.decode_batch, 1),
        ):
            if value < least:
                raise SettingsError(f"bench: {name} must be >= {least}, got {value}")


@dataclass
class _Measured:
    """One length's measurements, per configuration label, and what they were made with."""

    length: int
    window: int
    decode_batch: int
    compiled_decode: bool
    timings: dict[str, list[Measurement]] = field(default_factory=dict)
    first_run_s: dict[str, float] = field(default_factory=dict)
    compiles: dict[str, int] = field(default_factory=dict)
    backends: dict[str, str | None] = field(default_factory=dict)
    shares: dict[str, float] = field(default_factory=dict)
    prefill_peaks: dict[str, int | None] = field(default_factory=dict)  # from the profiled run (a CPU's)
    peaks: dict[str, int] = field(default_factory=dict)  # the decode's

    def count_compiles(self, label: str, before: int) -> None:
        self.compiles[label] = self.compiles.get(label, 0) + flex.compiles - before


def run_bench(
    model: Any, configs: list[Config], plan: BenchPlan, progress: Callable[[list[BenchRow]], None] | None = None
) -> list[BenchRow]:
    """Measure the original model and each hybrid configuration at each of ``plan``'s lengths.

    Args:
        configs: ``(label, ratio or mask[, kv_quant])``; a ratio gets :func:`drawn_mask`;
            ``None`` with a ``kv_quant``: quantization alone on the original attention.
        progress: called with every row so far after each length (to write partial results).
    """
    quant = {c[0]: c[2] for c in configs if len(c) > 2}
    rows: list[BenchRow] = []
    with (
        unfused_is_an_error(),
        compiled_decoding(model, plan.compile_decode, any(quant.values())) as forward,
    ):  # flex unfused would time another kernel
        for length in plan.lengths:
            rows += _bench_length(model, configs, plan, length, forward)
            if progress is not None:
                progress(list(rows))
    return rows


def _bench_length(model: Any, configs: list[Config], plan: BenchPlan, length: int, forward: Any) -> list[BenchRow]:
    """Every configuration's row at one length: warm-up, interleaved timed runs, then the profiled runs."""
    shape, device = ModelShape.from_config(model.config), model.device
    quant = {c[0]: c[2] for c in configs if len(c) > 2}
    w = plan.window or max(1, length // 32)
    masks = {
        c[0]: c[1]
        if isinstance(c[1], HeadMask) or c[1] is None
        else drawn_mask(shape, c[1], w).with_meta(sinks=plan.sinks)
        for c in configs
    }
    ids = torch.randint(0, model.config.vocab_size, (1, length), generator=torch.Generator().manual_seed(length)).to(
        device
    )
    configurations: list[tuple[str, HeadMask | None]] = [("original", None), *masks.items()]
    capacity = (
        length + 2 * (plan.decode_tokens + 1) if forward is not None else None
    )  # the prefill and both decodes, each with its untimed step

    def set_up(label: str, mask: HeadMask | None) -> AbstractContextManager[DynamicCache]:
        return configured(model, mask, w, quant.get(label), plan.backend, capacity)

    def run(cache: Any) -> Measurement:
        return measure(model, ids, plan.decode_tokens, plan.chunk, cache, plan.decode_batch, forward)

    measured = _Measured(length, w, plan.decode_batch, forward is not None)
    for _ in range(plan.warmup):  # start-up costs land here, not in the first configuration's timings
        for label, mask in configurations:
            before = flex.compiles
            with set_up(label, mask) as cache, stopwatch(device) as seconds:
                run(cache)
            measured.first_run_s.setdefault(label, seconds())
            measured.count_compiles(label, before)
    for _ in range(plan.repeats):  # interleaved, so drifting machine load hits every configuration alike
        for label, mask in configurations:
            with set_up(label, mask) as cache:
                measured.backends[label] = hybrid_state(model).backend if isinstance(cache, HybridCache) else None
                before = flex.compiles
                measured.timings.setdefault(label, []).append(run(cache))
                measured.count_compiles(label, before)
    # Separate runs: timing every attention call, or profiling allocations, perturbs the timing.
    for label, mask in configurations if plan.profile else ():
        with set_up(label, mask) as cache:
            measured.shares[label] = attention_share(model, ids, plan.chunk, cache)
        with set_up(label, mask) as cache:
            measured.prefill_peaks[label], measured.peaks[label] = memory_peaks(model, ids, plan.chunk, cache)
    return [_row(model, label, masks.get(label), measured, quant.get(label)) for label in measured.timings]


def _row(
    model: Any, label: str, mask: HeadMask | None, measured: _Measured, kv_quant: KVQuantConfig | None
) -> BenchRow:
    """One configuration's row: medians of its timed runs."""
    shape, runs = ModelShape.from_config(model.config), measured.timings[label]
    length, window, decode_batch = measured.length, measured.window, measured.decode_batch
    return BenchRow(
        label=label,
        swa_ratio=mask.swa_ratio if mask else 0.0,
        window=(mask.window or window) if mask else None,
        length=length,
        prefill_tokens_per_s=length / statistics.median(r.prefill_s for r in runs),
        decode_tokens_per_s=1.0 / statistics.median(r.decode_s for r in runs),
        kv_cache_bytes=runs[0].kv_bytes,
        prefill_peak_bytes=_prefill_peak(runs, measured.prefill_peaks.get(label)),
        attention_share=measured.shares.get(label),
        kv_quant=kv_quant_label(kv_quant) if kv_quant else None,
        kv_bytes_formula=kv_cache_bytes_formula(
            mask.bits if mask else None,
            KVLayout(shape.num_layers, shape.num_kv_heads, ModelShape.head_dim_of(model.config)),
            length,
            window=(mask.window or window) if mask else None,
            kv_quant=kv_quant,
            dtype_bytes=next(model.parameters()).element_size(),
            sinks=mask.sinks if mask else 0,
        ),  # fmt: skip
        decode_peak_bytes=measured.peaks.get(label),
        decode_batch=decode_batch,
        decode_batch_tokens_per_s=decode_batch / statistics.median(r.decode_batch_s for r in runs),
        backend=measured.backends[label],
        warmup_s=measured.first_run_s.get(label),
        compiles=measured.compiles.get(label, 0),
        compiled_decode=measured.compiled_decode,
    )


def _prefill_peak(runs: list[Measurement], profiled: int | None) -> int | None:
    """The median of the timed runs' prefill peaks where they measured it (CUDA), else the
    profiled run's (CPU; None: not profiled)."""
    timed = [r.prefill_peak_bytes for r in runs if r.prefill_peak_bytes is not None]
    return int(statistics.median(timed)) if timed else profiled
