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


def _key_blocks(x: torch.Tensor, start: int, n_blocks: int, block: int, span: int) -> torch.Tensor:
    """``[B, G, S, D]`` -> ``[B, n_blocks, G, span, D]``: block i holds keys ``start + i·block …``."""
    x = x[:, :, start:] if start >= 0 else F.pad(x, (0, 0, -start, 0))
    x = F.pad(x, (0, 0, 0, n_blocks * block + span - block - x.shape[2]))
    return x.unfold(2, span, block).permute(0, 2, 1, 4, 3)


def _mask_blocks(mask: torch.Tensor, start: int, q_len: int, n_blocks: int, block: int, span: int) -> torch.Tensor:
    """Diagonal blocks of a ``[B, 1, T, S]`` bool mask -> ``[B, n_blocks, block, span]``."""
    mask = mask[:, 0]
    mask = mask[:, :, start:] if start >= 0 else F.pad(mask, (-start, 0), value=False)
    padded_q = n_blocks * block
    # Padded query rows may look anywhere (their output is dropped); this keeps them finite.
    mask = F.pad(mask, (0, padded_q + span - block - mask.shape[2], 0, padded_q - q_len), value=True).contiguous()
    row_stride, col_stride = mask.stride(1), mask.stride(2)
    return mask.as_strided(
        (mask.shape[0], n_blocks, block, span),
        (mask.stride(0), block * (row_stride + col_stride), row_stride, col_stride),
    )


# Above this many key elements in the overlapping blocks (16 MB in fp32), copying them
# for one batched call costs more than one SDPA call per block on key views.
_ONE_CALL_MAX_KEY_ELEMENTS = 1 << 22


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
    C + W − 1 keys its windows can reach.

    Two schedules, the same result. Small problems (the search's calibration passes on
    small models) run all blocks in one batched SDPA call, which needs the overlapping key
    blocks copied (~(C + W)/C times the keys) but pays SDPA's per-call overhead once. Large
    ones run one SDPA call per block on a slice of the keys (a view, no copy) with SDPA's
    own GQA: there the copies cost more than the calls (measured with
    ``benchmarks/swa_attention.py`` and ``bosch-eval bench``).

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
    batch, _, q_len, _ = query.shape
    block = min(block_size or default_block_size(window), q_len)
    n_blocks = -(-q_len // block)
    copied = batch * n_blocks * (block + window - 1) * key.shape[1] * key.shape[-1]
    schedule = _all_blocks_in_one_call if copied <= _ONE_CALL_MAX_KEY_ELEMENTS else _block_by_block
    return schedule(query, key, value, attention_mask, window, scaling, dropout, block)


def _all_blocks_in_one_call(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    window: int,
    scaling: float | None,
    dropout: float,
    block: int,
) -> torch.Tensor:
    """The query heads of a KV group packed into the query axis (``[G, R·C]``), blocks on
    the batch axis: plain 4D SDPA inputs with a dense boolean mask, no GQA repeat."""
    batch, heads, q_len, _ = query.shape
    groups, kv_len = key.shape[1], key.shape[2]
    per_group = heads // groups
    n_blocks = -(-q_len // block)
    span = block + window - 1
    # Key position (in key coordinates) of local key 0 in block 0.
    start = kv_len - q_len - window + 1

    q_blocks = F.pad(query, (0, 0, 0, n_blocks * block - q_len))
    q_blocks = q_blocks.view(batch, groups, per_group, n_blocks, block, -1).permute(0, 3, 1, 2, 4, 5)
    q_blocks = q_blocks.reshape(batch * n_blocks, groups, per_group * block, -1)  # [B·nb, G, R·C, D]
    k_blocks = _key_blocks(key, start, n_blocks, block, span).reshape(batch * n_blocks, groups, span, -1)
    v_blocks = _key_blocks(value, start, n_blocks, block, span).reshape(batch * n_blocks, groups, span, -1)

    device = query.device
    local_q = torch.arange(block, device=device)[:, None]
    local_k = torch.arange(span, device=device)[None, :]
    # Query r of a block sits at local key r + W − 1, so its window is local keys r … r + W − 1.
    allowed = (local_k >= local_q) & (local_k < local_q + window)  # [C, span]
    key_pos = start + block * torch.arange(n_blocks, device=device)[:, None] + torch.arange(span, device=device)
    allowed = allowed[None, None] & (key_pos >= 0)[None, :, None, :]  # [1, nb, C, span]
    if attention_mask is not None:
        allowed = allowed & _mask_blocks(attention_mask, start, q_len, n_blocks, block, span)
    # Every query head of a group shares its row of the mask.
    allowed = allowed[:, :, None].expand(batch, -1, per_group, -1, -1)
    allowed = allowed.reshape(batch * n_blocks, 1, per_group * block, span)

    out = F.scaled_dot_product_attention(q_blocks, k_blocks, v_blocks, attn_mask=allowed, dropout_p=dropout, scale=scaling)
    out = out.view(batch, n_blocks, groups, per_group, block, -1).permute(0, 1, 4, 2, 3, 5)
    return out.reshape(batch, n_blocks * block, heads, -1)[:, :q_len]


def _block_by_block(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    window: int,
    scaling: float | None,
    dropout: float,
    block: int,
) -> torch.Tensor:
    """One SDPA call per block on key slices; memory beyond the output: one block's
    ``C × (C + W − 1)`` mask and scores."""
    batch, heads, q_len, _ = query.shape
    offset = key.shape[2] - q_len  # key position of query 0
    out = query.new_empty(batch, q_len, heads, value.shape[-1])
    # Every block that is whole and starts at least W − 1 keys in has the same band.
    interior = band_mask(block, block + window - 1, window, query.device)[None, None]
    if attention_mask is None:
        # SDPA turns a boolean mask into an additive one on every call: convert this one once.
        interior = torch.zeros(interior.shape, dtype=query.dtype, device=query.device).masked_fill_(~interior, float("-inf"))
    for first in range(0, q_len, block):
        last = min(first + block, q_len)
        lo, hi = max(0, offset + first - window + 1), offset + last
        whole = last - first == block and hi - lo == block + window - 1
        allowed = interior if whole else band_mask(last - first, hi - lo, window, query.device)[None, None]
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
