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


# Key elements materialized per SDPA call of the blocked kernel (16M: 64 MB in fp32).
_BLOCK_ELEMENTS_PER_CALL = 1 << 24


def default_block_size(window: int) -> int:
    """Query-block size of the blocked kernel.

    A block of ``C`` queries computes ``C·(C + W − 1)`` scores for ``C·W`` useful ones,
    so smaller blocks waste less; below ~32 queries the per-block overhead of the CPU
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
    C + W − 1 keys its windows can reach, all blocks in one batched SDPA call.

    The query heads of a KV group are packed into the query axis (``[G, R·C]`` instead
    of ``[H, C]``) and blocks go to the batch axis, so SDPA gets plain 4D tensors with a
    dense boolean mask: the fast CPU kernel, no GQA repeat of the keys.

    Args:
        query: ``[B, H, T, D]``.
        key, value: ``[B, G, S, D]`` with ``S ≥ T``; H must be a multiple of G.
        attention_mask: the model's boolean ``[B, 1, T, S]`` mask (padding), or None.
        window: W, keys seen per query including itself.

    Returns:
        ``[B, T, H, Dv]``.
    """
    batch, heads, q_len, _ = query.shape
    groups, kv_len = key.shape[1], key.shape[2]
    per_group = heads // groups
    block = min(block_size or default_block_size(window), q_len)
    n_blocks = -(-q_len // block)
    span = block + window - 1
    # Key position (in key coordinates) of local key 0 in block 0.
    start = kv_len - q_len - window + 1

    q_blocks = F.pad(query, (0, 0, 0, n_blocks * block - q_len))
    q_blocks = q_blocks.view(batch, groups, per_group, n_blocks, block, -1).permute(0, 3, 1, 2, 4, 5)
    q_blocks = q_blocks.reshape(batch, n_blocks, groups, per_group * block, -1)  # [B, nb, G, R·C, D]
    k_blocks = _key_blocks(key, start, n_blocks, block, span)  # [B, nb, G, span, D], a view
    v_blocks = _key_blocks(value, start, n_blocks, block, span)

    device = query.device
    local_q = torch.arange(block, device=device)[:, None]
    local_k = torch.arange(span, device=device)[None, :]
    # Query r of a block sits at local key r + W − 1, so its window is local keys r … r + W − 1.
    allowed = (local_k >= local_q) & (local_k < local_q + window)  # [C, span]
    key_pos = start + block * torch.arange(n_blocks, device=device)[:, None] + torch.arange(span, device=device)
    allowed = allowed[None, None] & (key_pos >= 0)[None, :, None, :]  # [1, nb, C, span]
    if attention_mask is not None:
        if attention_mask.dtype != torch.bool:
            raise TypeError("blocked SWA expects a boolean attention mask (the sdpa mask format)")
        allowed = allowed & _mask_blocks(attention_mask, start, q_len, n_blocks, block, span)
    # Every query head of a group shares its row of the mask.
    allowed = allowed[:, :, None].expand(batch, -1, per_group, -1, -1)
    allowed = allowed.reshape(batch, n_blocks, 1, per_group * block, span)  # [B, nb, 1, R·C, span]

    # SDPA copies the overlapping key blocks into contiguous memory (~span/C times the
    # keys); calling it on slices of blocks bounds that working set.
    step = max(1, _BLOCK_ELEMENTS_PER_CALL // (groups * span * key.shape[-1]))
    rows = []
    for b in range(batch):
        pieces = [
            F.scaled_dot_product_attention(
                q_blocks[b, i : i + step], k_blocks[b, i : i + step], v_blocks[b, i : i + step],
                attn_mask=allowed[b, i : i + step], dropout_p=dropout, scale=scaling,
            )  # fmt: skip
            for i in range(0, n_blocks, step)
        ]
        rows.append(torch.cat(pieces))  # [nb, G, R·C, Dv]
    out = torch.stack(rows)
    out = out.view(batch, n_blocks, groups, per_group, block, -1).permute(0, 1, 4, 2, 3, 5)
    return out.reshape(batch, n_blocks * block, heads, -1)[:, :q_len]


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
