"""The blocked CPU kernel: SWA whose cost grows with T·(W + S), not T².

Each block of C queries attends only the C + W − 1 keys its windows can reach, plus the
S sink keys that lie before that span (sinks inside the span are part of it; the band
predicate allows them there). The sinks are each row's own (its first S real keys, from the
model's mask), gathered per row. Shapes: ``query [B, H, T, D]``, ``key/value [B, G, K, D]``.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from bosch_eval.attention.kernels import BACKENDS, Backend
from bosch_eval.attention.kernels.row_sinks import RowSinks
from bosch_eval.attention.local_window import LocalWindow, causal, recent


def default_block_size(window: int) -> int:
    """Query-block size of the blocked kernel.

    A block of ``C`` queries computes ``C·(C + W − 1)`` scores for ``C·W`` useful ones,
    so smaller blocks waste less; below ~32 queries the per-call overhead of the CPU
    SDPA kernel dominates (measured with ``benchmarks/swa_attention.py``).
    """
    return max(32, window // 4)


def _key_blocks(x: torch.Tensor, start: int, n_blocks: int, block: int, span: int) -> torch.Tensor:
    """``[B, G, K, D]`` -> ``[B, n_blocks, G, span, D]``: block i holds keys ``start + i·block …``."""
    x = x[:, :, start:] if start >= 0 else F.pad(x, (0, 0, -start, 0))
    x = F.pad(x, (0, 0, 0, n_blocks * block + span - block - x.shape[2]))
    return x.unfold(2, span, block).permute(0, 2, 1, 4, 3)


def _mask_blocks(mask: torch.Tensor, start: int, q_len: int, n_blocks: int, block: int, span: int) -> torch.Tensor:
    """Diagonal blocks of a ``[B, 1, T, K]`` bool mask -> ``[B, n_blocks, block, span]``."""
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
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    local: LocalWindow,
    **kwargs: Any,
) -> torch.Tensor:
    """The registered kernel: :func:`blocked_attention` with the model's scaling and dropout."""
    return blocked_attention(
        query, key, value, attention_mask, local, scaling=kwargs.get("scaling"), dropout=kwargs.get("dropout", 0.0)
    )


def blocked_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    local: LocalWindow,
    scaling: float | None = None,
    dropout: float = 0.0,
    block_size: int | None = None,
) -> torch.Tensor:
    """Windowed attention in query blocks.

    Two schedules, the same result. Small problems (the search's calibration passes on
    small models) run all blocks in one batched SDPA call, which needs the overlapping key
    blocks copied (~(C + W)/C times the keys) but pays SDPA's per-call overhead once. Large
    ones run one SDPA call per block on a slice of the keys (a view, no copy) with SDPA's
    own GQA: there the copies cost more than the calls (measured with
    ``benchmarks/swa_attention.py`` and ``bosch-eval bench``).

    Args:
        query: ``[B, H, T, D]``.
        key, value: ``[B, G, K, D]`` with ``K ≥ T``, the last T keys at the queries'
            positions; H must be a multiple of G.
        attention_mask: the model's boolean ``[B, 1, T, K]`` mask (padding), or None.
        local: the window and sinks (each row's first S real keys, from ``attention_mask``).

    Returns:
        ``[B, T, H, Dv]``.
    """
    if attention_mask is not None and attention_mask.dtype != torch.bool:
        raise TypeError("blocked SWA expects a boolean attention mask (the sdpa mask format)")
    batch, _, q_len, _ = query.shape
    block = min(block_size or default_block_size(local.window), q_len)
    n_blocks = -(-q_len // block)
    copied = batch * n_blocks * (block + local.window - 1 + local.sinks) * key.shape[1] * key.shape[-1]
    schedule = _all_blocks_in_one_call if copied <= _ONE_CALL_MAX_KEY_ELEMENTS else _block_by_block
    return schedule(query, key, value, attention_mask, local, scaling, dropout, block)


def _all_blocks_in_one_call(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    local: LocalWindow,
    scaling: float | None,
    dropout: float,
    block: int,
) -> torch.Tensor:
    """The query heads of a KV group packed into the query axis (``[G, R·C]``), blocks on
    the batch axis: plain 4D SDPA inputs with a dense boolean mask, no GQA repeat."""
    batch, heads, q_len, _ = query.shape
    groups, kv_len = key.shape[1], key.shape[2]
    sinks = RowSinks(attention_mask, local, key)
    per_group = heads // groups
    n_blocks = -(-q_len // block)
    span = block + local.window - 1
    # Key index of local key 0 in block 0.
    start = kv_len - q_len - local.window + 1

    q_blocks = F.pad(query, (0, 0, 0, n_blocks * block - q_len))
    q_blocks = q_blocks.view(batch, groups, per_group, n_blocks, block, -1).permute(0, 3, 1, 2, 4, 5)
    q_blocks = q_blocks.reshape(batch * n_blocks, groups, per_group * block, -1)  # [B·nb, G, R·C, D]
    k_blocks = _key_blocks(key, start, n_blocks, block, span).reshape(batch * n_blocks, groups, span, -1)
    v_blocks = _key_blocks(value, start, n_blocks, block, span).reshape(batch * n_blocks, groups, span, -1)

    device = query.device
    first_key = start + block * torch.arange(n_blocks, device=device)[:, None]  # [nb, 1]
    key_pos = first_key + torch.arange(span, device=device)  # [nb, span]
    query_pos = (
        kv_len - q_len + block * torch.arange(n_blocks, device=device)[:, None] + torch.arange(block, device=device)
    )
    q_pos, k_pos = query_pos[:, :, None], key_pos[:, None, :]
    seen = causal(0, 0, q_pos, k_pos)
    allowed = (
        seen & (recent(local.window)(0, 0, q_pos, k_pos) | sinks.in_span(k_pos, kv_len)) & (k_pos >= 0)
    )  # [B or 1, nb, C, span]
    if attention_mask is not None:
        allowed = allowed & _mask_blocks(attention_mask, start, q_len, n_blocks, block, span)

    if sinks.count:
        # Each row's sink keys before a block's span; those inside it are in the span.
        sink_allowed = (sinks.found[:, None, :] & (sinks.index[:, None, :] < first_key))[
            :, :, None, :
        ]  # [B or 1, nb, 1, S']
        sink_allowed = sink_allowed.expand(-1, -1, block, -1)
        if attention_mask is not None:
            rows = F.pad(
                sinks.mask_columns(attention_mask, slice(None))[:, 0], (0, 0, 0, n_blocks * block - q_len), value=True
            )
            sink_allowed = sink_allowed & rows.view(batch, n_blocks, block, sinks.count)
        allowed = torch.cat([sink_allowed.expand(batch, -1, -1, -1), allowed.expand(batch, -1, -1, -1)], dim=-1)
        gathered_keys = (
            sinks.gather(key)[:, None]
            .expand(-1, n_blocks, -1, -1, -1)
            .reshape(batch * n_blocks, groups, sinks.count, -1)
        )
        gathered_values = (
            sinks.gather(value)[:, None]
            .expand(-1, n_blocks, -1, -1, -1)
            .reshape(batch * n_blocks, groups, sinks.count, -1)
        )
        k_blocks, v_blocks = torch.cat([gathered_keys, k_blocks], dim=2), torch.cat([gathered_values, v_blocks], dim=2)
    # Every query head of a group shares its row of the mask.
    allowed = allowed.expand(batch, -1, -1, -1)[:, :, None].expand(batch, -1, per_group, -1, -1)
    allowed = allowed.reshape(batch * n_blocks, 1, per_group * block, allowed.shape[-1])

    out = F.scaled_dot_product_attention(
        q_blocks, k_blocks, v_blocks, attn_mask=allowed, dropout_p=dropout, scale=scaling
    )
    out = out.view(batch, n_blocks, groups, per_group, block, -1).permute(0, 1, 4, 2, 3, 5)
    return out.reshape(batch, n_blocks * block, heads, -1)[:, :q_len]


def _block_by_block(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    local: LocalWindow,
    scaling: float | None,
    dropout: float,
    block: int,
) -> torch.Tensor:
    """One SDPA call per block on key slices (plus each row's sinks before them); memory
    beyond the output: one block's ``C × (S + C + W − 1)`` mask and scores."""
    batch, heads, q_len, _ = query.shape
    window, device, kv_len = local.window, query.device, key.shape[2]
    sinks = RowSinks(attention_mask, local, key)
    offset = kv_len - q_len  # key index of query 0
    out = query.new_empty(batch, q_len, heads, value.shape[-1])
    row_sink_keys, row_sink_values = (sinks.gather(key), sinks.gather(value)) if sinks.count else (None, None)
    # The last sink of any row: spans past it need no sink inside them.
    last_sink = int(sinks.index.masked_fill(~sinks.found, -1).max()) if sinks.count else -1
    # Every block that is whole and starts past every sink, W − 1 keys in, has the same band.
    interior = LocalWindow(window).dense(block, block + window - 1, device)[None, None]
    if sinks.count:
        interior = torch.cat(
            [sinks.found[:, None, None, :].expand(-1, 1, block, -1), interior.expand(sinks.found.shape[0], -1, -1, -1)],
            dim=-1,
        )
    if attention_mask is None:
        # SDPA turns a boolean mask into an additive one on every call: convert this one once.
        interior = torch.zeros(interior.shape, dtype=query.dtype, device=device).masked_fill_(~interior, float("-inf"))
    for first in range(0, q_len, block):
        last = min(first + block, q_len)
        lo, hi = max(0, offset + first - window + 1), offset + last
        whole = last - first == block and hi - lo == block + window - 1 and lo > last_sink
        before = sinks.found & (sinks.index < lo) if sinks.count else None  # [B or 1, S']
        with_sinks = before is not None and (whole or bool(before.any()))
        if whole:
            allowed = interior
        else:
            q_pos = torch.arange(offset + first, hi, device=device)[:, None]
            k_pos = torch.arange(lo, hi, device=device)[None, :]
            allowed = causal(0, 0, q_pos, k_pos) & (
                recent(window)(0, 0, q_pos, k_pos) | sinks.in_span(k_pos, kv_len)
            )  # [B or 1, C, span]
            if with_sinks:
                allowed = torch.cat(
                    [before[:, None, :].expand(-1, last - first, -1), allowed.expand(before.shape[0], -1, -1)], dim=-1
                )
            allowed = allowed[:, None]
        keys, values = key[:, :, lo:hi], value[:, :, lo:hi]
        if with_sinks:
            keys, values = torch.cat([row_sink_keys, keys], dim=2), torch.cat([row_sink_values, values], dim=2)
        if attention_mask is not None:
            rows = attention_mask[:, :, first:last, lo:hi]
            allowed = allowed & (
                torch.cat([sinks.mask_columns(attention_mask, slice(first, last)), rows], dim=-1)
                if with_sinks
                else rows
            )
        out[:, first:last] = F.scaled_dot_product_attention(
            query[:, :, first:last], keys, values, attn_mask=allowed, dropout_p=dropout, scale=scaling, enable_gqa=True,
        ).transpose(1, 2)  # fmt: skip
    return out


BACKENDS.register("blocked", Backend(swa=blocked_swa_attention))
