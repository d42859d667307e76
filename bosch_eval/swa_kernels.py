"""Sliding-window attention kernels for the SWA heads of a hybrid layer.

One window semantics everywhere, the same as transformers' ``sliding_attention``
layers (``masking_utils.sliding_window_overlay``): query ``t`` sees keys ``j`` with
``t − W < j ≤ t``, i.e. ``W`` keys including itself.

Positions: the keys handed to an attention function are contiguous and end at the last
query (no cache, or a dynamic cache), so query ``i`` of ``T`` sits at key position
``S − T + i``.

Shapes follow transformers' attention functions: ``query [B, H, T, D]``,
``key/value [B, G, S, D]`` (before the GQA repeat), output ``[B, T, H, D]``.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from transformers.integrations.sdpa_attention import sdpa_attention_forward


def band_mask(q_len: int, kv_len: int, window: int, device: torch.device) -> torch.Tensor:
    """Boolean ``[q_len, kv_len]`` mask of the causal window ``t − W < j ≤ t``."""
    lag = (torch.arange(q_len, device=device) + (kv_len - q_len))[:, None] - torch.arange(kv_len, device=device)
    return (lag >= 0) & (lag < window)


def restrict_to_window(attention_mask: torch.Tensor | None, q_len: int, kv_len: int, window: int, device: torch.device) -> torch.Tensor:
    """The model's 4D mask (padding, causality) intersected with the window band."""
    band = band_mask(q_len, kv_len, window, device)[None, None]
    if attention_mask is None:
        return band
    if attention_mask.dtype == torch.bool:
        return attention_mask & band
    return attention_mask.masked_fill(~band, torch.finfo(attention_mask.dtype).min)


def masked_swa_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    window: int,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Reference SWA: SDPA with an explicit band mask. Exact, any device, O(T·S) work."""
    mask = restrict_to_window(attention_mask, query.shape[2], key.shape[2], window, query.device)
    return sdpa_attention_forward(module, query, key, value, mask, **kwargs)


def default_block_size(window: int) -> int:
    """Query-block size of the blocked kernel.

    A block of ``C`` queries computes ``C·(C + W − 1)`` scores for ``C·W`` useful ones,
    so smaller blocks waste less; below ~32 queries the per-call overhead of the CPU
    SDPA kernel dominates (measured with ``benchmarks/swa_attention.py``).
    """
    return max(32, window // 4)


def blocked_swa_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    window: int,
    scaling: float | None = None,
    dropout: float = 0.0,
    block_size: int | None = None,
) -> torch.Tensor:
    """SWA whose cost grows with T·W, not T²: each block of C queries attends only the
    C + W − 1 keys its windows can reach, one SDPA call per block.

    The keys of a block are a slice of the key tensor (a view, no copy), and SDPA's own
    GQA support reads each KV group for its query heads, so the only memory beyond the
    output is one block's ``C × (C + W − 1)`` mask and scores. (Batching all blocks into
    one call needs overlapping key blocks, copied ~(C + W)/C times: slower and larger.)

    Args:
        query: ``[B, H, T, D]``.
        key, value: ``[B, G, S, D]`` with ``S ≥ T``, the last T keys at the queries'
            positions; H must be a multiple of G.
        attention_mask: the model's boolean ``[B, 1, T, S]`` mask (padding), or None.
        window: W, keys seen per query including itself.

    Returns:
        ``[B, T, H, Dv]``.
    """
    if attention_mask is not None and attention_mask.dtype != torch.bool:
        raise TypeError("blocked SWA expects a boolean attention mask (the sdpa mask format)")
    batch, heads, q_len, _ = query.shape
    offset = key.shape[2] - q_len  # key position of query 0
    block = block_size or default_block_size(window)
    out = query.new_empty(batch, q_len, heads, value.shape[-1])
    for first in range(0, q_len, block):
        last = min(first + block, q_len)
        lo, hi = max(0, offset + first - window + 1), offset + last
        allowed = band_mask(last - first, hi - lo, window, query.device)[None, None]
        if attention_mask is not None:
            allowed = allowed & attention_mask[:, :, first:last, lo:hi]
        out[:, first:last] = F.scaled_dot_product_attention(
            query[:, :, first:last], key[:, :, lo:hi], value[:, :, lo:hi],
            attn_mask=allowed, dropout_p=dropout, scale=scaling, enable_gqa=True,
        ).transpose(1, 2)  # fmt: skip
    return out


def flash_swa_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    window: int,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """flash-attn 2 with ``window_size``; transformers maps ``sliding_window=W`` to
    ``window_size=(W − 1, W − 1)``, which under causality is exactly our window."""
    from transformers.integrations.flash_attention import flash_attention_forward  # needs flash_attn, CUDA

    kwargs.pop("sliding_window", None)
    return flash_attention_forward(module, query, key, value, attention_mask, sliding_window=window, **kwargs)
