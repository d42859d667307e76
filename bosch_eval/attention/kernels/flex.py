"""FlexAttention kernels (``torch.nn.attention.flex_attention``, torch ≥ 2.5): the band
predicate of :class:`~bosch_eval.attention.local_window.LocalWindow` is the ``mask_mod``, so a hybrid
layer — full heads causal, SWA heads windowed with sinks, the model's padding on top — is
one call.

Compiled with ``torch.compile`` where a probe compile succeeds on the device and dtype
that will run (Inductor: C++ on CPU, Triton on CUDA); otherwise flex runs eagerly (exact,
but it materializes the scores), with the reason logged once. Set ``compile_policy`` to
``False`` to force eager (tests, or to avoid a compile per new sequence length on CPU).

Block masks (:mod:`bosch_eval.attention.kernels.flex_blocks`) are built from the band's block
arithmetic, never by evaluating the predicate over T × K, and a :class:`BlockMaskCache`
owned by the hybrid model reuses them across layers and calls.
"""

from __future__ import annotations

import functools
import logging
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch

from bosch_eval.attention.kernels.flex_blocks import BlockMaskCache, block_mask_for
from bosch_eval.attention.local_window import LocalWindow

logger = logging.getLogger("bosch_eval")

# None: compile if the probe compiles; True/False: force.
compile_policy: bool | None = None

# FlexAttention with enable_gqa and BlockMask.from_kv_blocks: torch 2.5.
MIN_TORCH = (2, 5)


def flex_unavailable(device: torch.device | None = None) -> str | None:
    """Why FlexAttention cannot run with this torch (None: it can)."""
    version = tuple(int(part) for part in torch.__version__.split("+")[0].split(".")[:2])
    if version < MIN_TORCH:
        return f"needs torch >= {'.'.join(map(str, MIN_TORCH))} (FlexAttention); torch {torch.__version__} is installed"
    return None


@functools.cache
def _compiled_flex(dynamic: bool | None) -> Callable[..., torch.Tensor]:
    """One compiled ``flex_attention`` per process and shape policy, as transformers does."""
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=dynamic)


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
    query, key, value = (torch.randn(1, n, length, dim, generator=generator).to(device, dtype) for n in (heads, groups, groups))
    try:
        block_mask = block_mask_for(length, length, LocalWindow(64, 4), None, None, torch.device(device))
        _compiled_flex(_shape_policy(device))(query, key, value, block_mask=block_mask, enable_gqa=True)
    except Exception as err:  # noqa: BLE001 - any compiler failure (no C++ compiler, no Triton) leaves eager flex
        reason = _describe(err)
        logger.warning("flex: torch.compile of flex_attention fails on %s in %s (%s); flex runs eagerly (exact, slower)", device, dtype, reason)
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
    """flex_attention, compiled unless ``compile_policy`` is False or compiling fails here.

    A compile that fails on a later shape (after the probe passed) is logged once and flex
    runs eagerly on that device and dtype from then on: exact, slower, never stopped.
    """
    query = args[0]
    device, dtype = _device_name(query.device), query.dtype
    if compile_policy is False:
        return _eager_flex(*args, **kwargs)
    reason = _run_failures.get((device, dtype)) or compile_failure(device, dtype)
    if reason is not None:
        if compile_policy:
            raise RuntimeError(f"flex: compile_policy=True, but torch.compile of flex_attention fails here ({reason})")
        return _eager_flex(*args, **kwargs)
    try:
        return _compiled_flex(_shape_policy(device))(*args, **kwargs)
    except Exception as err:  # noqa: BLE001 - a compiler failure; a real input error raises again below, eagerly
        if compile_policy:
            raise
        _run_failures[(device, dtype)] = _describe(err)
        logger.warning("flex: torch.compile of flex_attention failed on %s in %s (%s); flex runs eagerly from now on", device, dtype, _describe(err))
        return _eager_flex(*args, **kwargs)


def _eager_flex(*args: Any, **kwargs: Any) -> torch.Tensor:
    from torch.nn.attention.flex_attention import flex_attention

    with warnings.catch_warnings():
        # Eager is chosen on purpose here (logged once above); flex warns on every call.
        warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
        return flex_attention(*args, **kwargs)


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
    swa_heads = None
    if swa_groups is not None and not all(swa_groups):
        per_group = heads // key.shape[1]
        swa_heads = tuple(swa for swa in swa_groups for _ in range(per_group))
    args = (q_len, key.shape[2], local, attention_mask, swa_heads, query.device)
    block_mask = block_masks.get(*args) if block_masks is not None else block_mask_for(*args)
    out = _run_flex(query, key, value, block_mask=block_mask, scale=scaling, enable_gqa=key.shape[1] != heads)
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
    return flex_attention_layer(query, key, value, attention_mask, local, scaling=kwargs.get("scaling"), block_masks=kernel_cache)


def flex_hybrid_layer(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    local: LocalWindow,
    swa_groups: Sequence[bool],
    kernel_cache: BlockMaskCache | None = None,
    **kwargs: Any,
) -> torch.Tensor:
    """The registered whole-layer kernel: full and SWA groups in one call."""
    return flex_attention_layer(query, key, value, attention_mask, local, swa_groups, kwargs.get("scaling"), kernel_cache)
