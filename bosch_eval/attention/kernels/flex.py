"""FlexAttention kernels (``torch.nn.attention.flex_attention``, torch ≥ 2.5): the band
predicate of :class:`~bosch_eval.attention.local_window.LocalWindow` is the ``mask_mod``, so a hybrid
layer — full heads causal, SWA heads windowed with sinks, the model's padding on top — is
one call.

Compiled with ``torch.compile`` on CUDA where a probe compile succeeds on the device and
dtype that will run (Inductor's Triton templates); otherwise flex runs eagerly (exact, but it
materializes the scores), with the reason logged once. On a CPU flex runs eagerly unless
``compile_policy`` is True: Inductor's C++ flex template (torch 2.13) answered wrongly there
once a process had compiled flex for another window or batch at the same length (the
padding-free rows of ``benchmarks/backend_reference.py`` after a first case: |Δ logit| 0.6 to
0.93, NaN), and the CPU's fast SWA path is the ``blocked`` kernel anyway. Set
``compile_policy`` to ``False`` to force eager everywhere (tests).

Block masks (:mod:`bosch_eval.attention.kernels.flex_blocks`) are built from the band's block
arithmetic, never by evaluating the predicate over T × K, and a :class:`BlockMaskCache`
owned by the hybrid model reuses them across layers and calls.

One compiled graph for every layer of any mask: every call hands flex all of a layer's query
heads and a per-head pattern *tensor* (which heads are windowed), so layers with different
numbers of SWA groups differ in data, not in shape or code; the window, sinks and query offset
are the same in every layer of a call. Compiled flex never falls back silently: a call that
dynamo gives up on (its recompile limit) would run flex unfused, materializing the T × K
scores; compiled with ``fullgraph=True``, dynamo raises there instead, and
:data:`unfused_policy` makes that an error (bench, the GPU check) or a warning with the
reason. One query (a decode step) needs no flex at all: it attends its band over K keys,
O(K), by SDPA with an explicit mask, with no compile and no block mask per step.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

from bosch_eval.attention.kernels import BACKENDS, Backend, LayerPattern
from bosch_eval.attention.kernels.flex_blocks import BlockMaskCache, block_mask_for
from bosch_eval.attention.kernels.reference import restrict_to_window
from bosch_eval.attention.kernels.row_sinks import row_sinks
from bosch_eval.attention.local_window import LocalWindow

logger = logging.getLogger("bosch_eval")

# None: compile on CUDA if the probe compiles, eager on a CPU (module docstring); True/False: force.
compile_policy: bool | None = None

# What a compiled call that ran flex unfused (dynamo's recompile limit, a graph break) does:
# "warn" (once per reason, the result is exact but O(T × K) in memory) or "error".
unfused_policy: str = "warn"

# Compiles of flex so far in this process (bench reports them apart from steady state).
compiles = 0

# FlexAttention with enable_gqa and BlockMask.from_kv_blocks: torch 2.5.
MIN_TORCH = (2, 5)


def flex_unavailable(device: torch.device | None = None) -> str | None:
    """Why FlexAttention cannot run with this torch (None: it can)."""
    version = tuple(int(part) for part in torch.__version__.split("+")[0].split(".")[:2])
    if version < MIN_TORCH:
        return f"needs torch >= {'.'.join(map(str, MIN_TORCH))} (FlexAttention); torch {torch.__version__} is installed"
    return None


def _counting_inductor(graph: Any, example_inputs: Any) -> Any:
    """Inductor, counting each graph it compiles (:data:`compiles`)."""
    global compiles
    compiles += 1
    return torch._dynamo.lookup_backend("inductor")(graph, example_inputs)


@functools.cache
def _compiled_flex(dynamic: bool | None) -> Callable[..., torch.Tensor]:
    """One compiled ``flex_attention`` per process and shape policy, as transformers does."""
    # fullgraph: where dynamo gives up (its recompile limit, a graph break) it raises instead
    # of running flex eagerly, which would materialize the scores; _run_flex decides.
    return torch.compile(_flex_attention(), dynamic=dynamic, backend=_counting_inductor, fullgraph=True)


def _flex_attention() -> Callable[..., torch.Tensor]:
    from torch.nn.attention.flex_attention import flex_attention

    return flex_attention


class UnfusedFlexError(RuntimeError):
    """Compiled flex would run unfused (it would materialize the T × K scores)."""


def _unfused_errors() -> tuple[type[BaseException], ...]:
    """What dynamo raises, compiling with ``fullgraph=True``, where it would otherwise run
    flex eagerly: its recompile limit (FailOnRecompileLimitHit; FailOnCacheLimitHit before
    torch 2.6) or a graph break (Unsupported)."""
    from torch._dynamo import exc

    found = (getattr(exc, "FailOnRecompileLimitHit", None), getattr(exc, "FailOnCacheLimitHit", None), exc.Unsupported)
    return tuple(error for error in found if error is not None)


_unfused_reported: set[str] = set()


@contextlib.contextmanager
def unfused_is_an_error() -> Iterator[None]:
    """Within the block, compiled flex that would run unfused raises :class:`UnfusedFlexError`
    (what bench and the GPU check measure must be the fused kernel)."""
    global unfused_policy
    saved, unfused_policy = unfused_policy, "error"
    try:
        yield
    finally:
        unfused_policy = saved


def _unfused(err: BaseException, *args: Any, **kwargs: Any) -> torch.Tensor:
    """Flex unfused, as :data:`unfused_policy` says: an error, or exact eager flex (O(T × K)
    memory) with a warning once per reason."""
    reason = _describe(err)
    if unfused_policy == "error":
        raise UnfusedFlexError(
            f"flex: compiled flex_attention would run unfused ({reason}); its T × K scores would be materialized"
        ) from err
    if reason not in _unfused_reported:
        _unfused_reported.add(reason)
        logger.warning("flex: compiled flex_attention runs unfused here (%s): exact, but O(T × K) memory", reason)
    return _eager_flex(*args, **kwargs)


def _shape_policy(device: str) -> bool | None:
    # CUDA: torch's default, static first and dynamic shapes after the first change, so a
    # new sequence length costs no compile (transformers' choice). CPU: static shapes, one
    # compile per length: Inductor's C++ flex template fails to build some dynamic-shape
    # graphs with a padding mask (torch 2.13: "cur_qSplitSize5 was not declared").
    return False if device.startswith("cpu") else None


# Why compiled flex failed at run time on a (device, dtype): it runs eagerly there since.
_run_failures: dict[tuple[str, torch.dtype], str] = {}


@functools.cache
def compile_failure(device: str, dtype: torch.dtype) -> str | None:
    """Why compiled flex fails on ``device`` in ``dtype`` (None: a probe compiled and ran).

    The probe uses distinct query, key and value tensors (Inductor refuses one buffer for
    all three), GQA, and a band block mask over two blocks, on the device and in the
    dtype the model runs.
    """
    reason = flex_unavailable()
    if reason is not None:
        return reason
    generator = torch.Generator().manual_seed(0)
    heads, groups, length, dim = 4, 2, 256, 64
    query, key, value = (
        torch.randn(1, n, length, dim, generator=generator).to(device, dtype) for n in (heads, groups, groups)
    )
    # The layout every call of the model has: all heads, a per-head pattern tensor, sinks, no grad.
    try:
        block_mask = block_mask_for(length, length, LocalWindow(64, 4), None, (True, False) * 2, torch.device(device))
        with torch.no_grad():
            _compiled_flex(_shape_policy(device))(query, key, value, block_mask=block_mask, enable_gqa=True)
    except Exception as err:  # noqa: BLE001 - any compiler failure (no C++ compiler, no Triton) leaves eager flex
        reason = _describe(err)
        logger.warning(
            "flex: torch.compile of flex_attention fails on %s in %s (%s); flex runs eagerly (exact, slower)",
            device,
            dtype,
            reason,
        )
        return reason
    return None


def _describe(err: Exception) -> str:
    lines = str(err).strip().splitlines()
    return f"{type(err).__name__}: {lines[0] if lines else ''}"


def _device_name(device: torch.device) -> str:
    if device.type == "cuda" and device.index is None:
        return f"cuda:{torch.cuda.current_device()}"
    return str(device)


def _run_flex(*args: Any, **kwargs: Any) -> torch.Tensor:
    """flex_attention, compiled on CUDA unless ``compile_policy`` is False or compiling fails
    there; eager on a CPU unless ``compile_policy`` is True (the module docstring says why).

    A compile that fails on a later shape (after the probe passed) is logged once and flex
    runs eagerly on that device and dtype from then on: exact, slower, never stopped.
    """
    query = args[0]
    device, dtype = _device_name(query.device), query.dtype
    if compile_policy is False or (compile_policy is None and query.device.type == "cpu"):
        return _eager_flex(*args, **kwargs)
    reason = _run_failures.get((device, dtype)) or compile_failure(device, dtype)
    if reason is not None:
        if compile_policy:
            raise RuntimeError(f"flex: compile_policy=True, but torch.compile of flex_attention fails here ({reason})")
        return _eager_flex(*args, **kwargs)
    policy = _shape_policy(device)
    if policy is None:
        _lengths_dynamic(*args, block_mask=kwargs["block_mask"])
    try:
        return _compiled_flex(policy)(*args, **kwargs)
    except _unfused_errors() as err:
        return _unfused(err, *args, **kwargs)
    except Exception as err:  # noqa: BLE001 - a compiler failure; a real input error raises again below, eagerly
        if compile_policy:
            raise
        _run_failures[(device, dtype)] = _describe(err)
        logger.warning(
            "flex: torch.compile of flex_attention failed on %s in %s (%s); flex runs eagerly from now on",
            device,
            dtype,
            _describe(err),
        )
        return _eager_flex(*args, **kwargs)


# The BlockMask's tensors, by the dims that count blocks of queries (q) or keys (kv).
_BLOCK_DIMS = {"kv_num_blocks": (2,), "kv_indices": (2, 3), "full_kv_num_blocks": (2,), "full_kv_indices": (2, 3),
               "q_num_blocks": (2,), "q_indices": (2, 3), "full_q_num_blocks": (2,), "full_q_indices": (2, 3)}  # fmt: skip


def _lengths_dynamic(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, block_mask: Any) -> None:
    """Mark the sequence lengths and block counts as dynamic from the first compile on (the
    shape policy that allows it): otherwise dynamo's automatic dynamic makes dynamic only
    what changed between its first two graphs, and a third length whose block count differs
    compiles again."""
    mark = torch._dynamo.maybe_mark_dynamic
    for tensor in (query, key, value):
        mark(tensor, 2)
    for name, dims in _BLOCK_DIMS.items():
        tensor = getattr(block_mask, name, None)
        if tensor is not None:
            for dim in dims:
                mark(tensor, dim)


def _eager_flex(*args: Any, **kwargs: Any) -> torch.Tensor:
    with warnings.catch_warnings():
        # Eager is chosen on purpose here (logged once above); flex warns on every call.
        warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
        return _flex_attention()(*args, **kwargs)


def flex_attention_layer(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    local: LocalWindow,
    swa_groups: Sequence[bool] | None = None,
    scaling: float | None = None,
    block_masks: BlockMaskCache | None = None,
) -> torch.Tensor:
    """One flex call over every head.

    Args:
        query: ``[B, H, T, D]``, the last T of the K keys; key, value: ``[B, G, K, D]``.
        attention_mask: the model's boolean ``[B, 1, T, K]`` mask, or None.
        swa_groups: per KV group, True = windowed (``local``), False = full causal;
            None: every group windowed.
        block_masks: the hybrid model's cache of block masks (None: build one for this call).

    Returns:
        ``[B, T, H, Dv]``.
    """
    if attention_mask is not None and attention_mask.dtype != torch.bool:
        raise TypeError("flex SWA expects a boolean attention mask (the sdpa mask format)")
    heads, q_len = query.shape[1], query.shape[2]
    per_group = heads // key.shape[1]
    swa_heads = tuple(
        swa for swa in (swa_groups if swa_groups is not None else [True] * key.shape[1]) for _ in range(per_group)
    )
    if q_len == 1:
        return _one_query(query, key, value, attention_mask, local, swa_heads, scaling)
    args = (q_len, key.shape[2], local, attention_mask, swa_heads, query.device)
    block_mask = block_masks.get(*args) if block_masks is not None else block_mask_for(*args)
    # One memory layout in every call (the model's transposed states, a cache's copies), or
    # compiled flex would guard on strides and compile per layout.
    query, key, value = query.contiguous(), key.contiguous(), value.contiguous()
    out = _run_flex(query, key, value, block_mask=block_mask, scale=scaling, enable_gqa=key.shape[1] != heads)
    return out.transpose(1, 2)


def _one_query(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    local: LocalWindow,
    swa_heads: tuple[bool, ...],
    scaling: float | None,
) -> torch.Tensor:
    """One query per row (a decode step): its band over the K keys as an explicit
    ``[B, H, 1, K]`` mask for SDPA. O(K) like the step itself; flex would compile and build
    a block mask for every new K."""
    kv_len = key.shape[2]
    band = restrict_to_window(
        attention_mask, 1, kv_len, local, query.device, row_sinks(attention_mask, local)
    )  # [B or 1, 1, 1, K]
    causal = torch.ones(1, 1, 1, kv_len, dtype=torch.bool, device=query.device)
    if attention_mask is not None:
        causal = causal & attention_mask.bool()
    windowed = torch.tensor(swa_heads, device=query.device)[None, :, None, None]
    allowed = torch.where(windowed, band, causal)
    out = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=allowed, scale=scaling, enable_gqa=key.shape[1] != query.shape[1]
    )
    return out.transpose(1, 2)


def flex_swa_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    local: LocalWindow,
    kernel_cache: BlockMaskCache | None = None,
    **kwargs: Any,
) -> torch.Tensor:
    """The registered SWA kernel: every head handed is windowed."""
    return flex_attention_layer(
        query, key, value, attention_mask, local, scaling=kwargs.get("scaling"), block_masks=kernel_cache
    )


def flex_hybrid_layer(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    pattern: LayerPattern,
    kernel_cache: BlockMaskCache | None = None,
    **kwargs: Any,
) -> torch.Tensor:
    """The registered whole-layer kernel: full and SWA groups in one call."""
    return flex_attention_layer(
        query, key, value, attention_mask, pattern.local, pattern.swa_groups, kwargs.get("scaling"), kernel_cache
    )


BACKENDS.register(
    "flex", Backend(swa=flex_swa_attention, layer=flex_hybrid_layer, unavailable=flex_unavailable, cache=BlockMaskCache)
)
