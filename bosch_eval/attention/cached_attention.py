"""Attention over a deploy-mode cache layer, whose full and SWA groups hold different spans.

A :class:`~bosch_eval.caches.hybrid_cache.HybridHeadLayer` hands the attention function
:class:`HybridStates` (full part, SWA part) instead of one ``[B, G, K, D]`` tensor. The full
groups attend every position; the SWA groups attend their part (:class:`SwaPart`): each row's
sink slots and the recent run. Once the step's attention is done, the part drops what no later
query sees (:meth:`SwaPart.settle`), given its key padding, which only the model's mask shows.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, NamedTuple, Protocol

import torch

from bosch_eval.attention.hybrid_spec import LayerSplit
from bosch_eval.attention.kernels.row_sinks import key_padding
from bosch_eval.attention.layer_call import LayerCall, group_index, head_index

if TYPE_CHECKING:  # hybrid_attention calls this module
    from bosch_eval.attention.hybrid_attention import HybridAttention


class SwaPart(Protocol):
    """The SWA part of a deploy-mode cache layer, as the attention function sees it.

    Its keys are every position until it first drops some; after that, ``S`` sink slots
    (each row's first real tokens outside the recent run, gathered per row; ``sink_real``
    says which slots hold one) followed by the contiguous run of positions that ends at the
    last query.
    """

    sink_real: torch.Tensor | None  # [B, S] once slots exist, else None
    slots_final: bool  # every slot holds its row's sink: settle needs no key padding

    def settle(self, key_padding: torch.Tensor | None) -> None:
        """Keep only what later queries can see, after this step's attention; ``key_padding
        [B, K_swa]``: the part's real keys in its own order (None: every key real)."""


class HybridStates(NamedTuple):
    """Keys (or values) handed over by a deploy-mode cache layer (``bosch_eval.caches.hybrid_cache``):
    ``full [B, G_full, S, D]`` over every position and ``swa [B, G_swa, S_swa, D]``, what
    ``part`` holds (:class:`SwaPart`)."""

    full: torch.Tensor
    swa: torch.Tensor
    part: SwaPart


def attend_cached(
    handle: HybridAttention, split: LayerSplit, call: LayerCall, key: HybridStates, value: HybridStates, attention_mask: torch.Tensor | None
) -> torch.Tensor:
    """Attention over a hybrid cache layer (the cache checks that it was built for the current
    spec), written into ``call.out``; then the cache's SWA part drops what no later query sees."""
    query, kwargs = call.query, call.kwargs
    handle.layer_local(kwargs, query.shape[2], key.full.shape[2])  # refuses sinks past the model's own window
    part_padding = None
    if handle.sinks and not key.part.slots_final:
        part_padding = _part_padding(key_padding(attention_mask), key.part, key.swa.shape[2])
    swa_mask = _part_mask(attention_mask, key.part, key.swa.shape[2], query.shape[2])
    if query.shape[2] > 1 and handle.kernels.layer is not None and split.full:
        out = _prefill_in_one_call(handle, split, call, key, value, attention_mask, swa_mask)
    elif not split.full:
        out = _swa_attention(handle, query)(call.module, query, key.swa, value.swa, swa_mask, **kwargs)
    else:
        call.attend_kind(handle.full_attention, split.full, split.group_size, key.full, value.full, attention_mask)
        call.attend_kind(_swa_attention(handle, query), split.swa, split.group_size, key.swa, value.swa, swa_mask)
        out = call.out
    key.part.settle(part_padding)
    return out


def _swa_attention(handle: HybridAttention, query: torch.Tensor) -> Callable[..., torch.Tensor]:
    """The kernel for the SWA part. One query (a decode step): the part holds exactly the
    positions it sees (each row's sinks and the last W, the cache keeps no more), so plain
    attention over it by the backend's full kernel — no band mask, nothing of length T, no
    new shape to compile per step. Longer chunks: the windowed kernel, which finds each row's
    sinks in the part's mask (its sink slots' columns first)."""
    return handle.full_attention if query.shape[2] == 1 else handle.swa_attention


def _prefill_in_one_call(
    handle: HybridAttention,
    split: LayerSplit,
    call: LayerCall,
    key: HybridStates,
    value: HybridStates,
    attention_mask: torch.Tensor | None,
    swa_mask: torch.Tensor | None,
) -> torch.Tensor:
    """A mixed layer's chunk on the cache by the backend's whole-layer kernel, with every query
    head and every group in each call, so the call has the same shapes in every layer of any
    mask (one compiled graph; a call on the SWA groups alone would have as many shapes as the
    mask has SWA counts).

    Until the SWA part drops positions both parts hold every position: the layer's keys,
    put together again, go through one call. After it, the full heads attend every position by
    the base kernel, and the SWA heads the part by one call over all groups, the full groups'
    slots left empty and their heads' outputs unused (W + S keys each: little beside a full head).
    """
    module, query, kwargs = call.module, call.query, call.kwargs
    if key.part.sink_real is None and key.swa.shape[2] == key.full.shape[2]:
        return handle.mixed_layer(module, query, _all_groups(key, split), _all_groups(value, split), attention_mask, **kwargs)
    call.attend_kind(handle.full_attention, split.full, split.group_size, key.full, value.full, attention_mask)
    empty_keys = HybridStates(key.swa.new_zeros(key.swa.shape[0], len(split.full_groups), *key.swa.shape[2:]), key.swa, key.part)
    empty_values = HybridStates(value.swa.new_zeros(value.swa.shape[0], len(split.full_groups), *value.swa.shape[2:]), value.swa, value.part)
    windowed = handle.swa_attention(module, query, _all_groups(empty_keys, split), _all_groups(empty_values, split), swa_mask, **kwargs)
    heads = head_index(split.swa, split.group_size, query.device)
    call.out[:, :, heads] = windowed[:, :, heads]
    return call.out


def _all_groups(states: HybridStates, split: LayerSplit) -> torch.Tensor:
    """``[B, G, K, D]``: the full and SWA parts (of one length) in the layer's group order."""
    full, swa = states.full, states.swa
    merged = full.new_empty(full.shape[0], full.shape[1] + swa.shape[1], *full.shape[2:])
    merged[:, group_index(split.full, full.device)] = full
    merged[:, group_index(split.swa, full.device)] = swa
    return merged


def _part_padding(real: torch.Tensor | None, part: SwaPart, held: int) -> torch.Tensor | None:
    """The real keys of a cache's SWA part in its own order, from ``real [B, K]`` over every
    position: its sink slots' (``part.sink_real``) and the last positions' (None: no
    padding and no slot)."""
    if part.sink_real is None:
        return None if real is None else real[:, real.shape[1] - held :]
    slots = part.sink_real.shape[1]
    recent = real[:, real.shape[1] - (held - slots) :] if real is not None else part.sink_real.new_ones(part.sink_real.shape[0], held - slots)
    return torch.cat([part.sink_real, recent], dim=1)


def _part_mask(attention_mask: torch.Tensor | None, part: SwaPart, held: int, q_len: int) -> torch.Tensor | None:
    """The model's mask over a cache's SWA part: the columns of its last positions, after
    its sink slots' columns (each slot seen where it holds a real token: a sink precedes
    every query). O(held), whatever the mask's length. None where the model passed none and
    every slot holds a sink (a decode step without padding: no mask to build per step)."""
    sink_real = part.sink_real
    if sink_real is None or (attention_mask is None and part.slots_final):
        return attention_mask if attention_mask is None or attention_mask.shape[-1] == held else attention_mask[..., -held:]
    slots = sink_real.shape[1]
    if attention_mask is None:
        # transformers passes no mask only for one query without padding, which sees every key held.
        recent = sink_real.new_ones(sink_real.shape[0], 1, q_len, held - slots)
        return torch.cat([sink_real[:, None, None, :].expand(-1, 1, q_len, -1), recent], dim=-1)
    if attention_mask.dim() == 2:
        return torch.cat([sink_real.to(attention_mask.dtype), attention_mask[:, attention_mask.shape[1] - (held - slots) :]], dim=1)
    columns = sink_real[:, None, None, :].expand(-1, 1, attention_mask.shape[2], -1).to(attention_mask.dtype)
    if attention_mask.dtype != torch.bool:  # additive: 0 where allowed
        columns = torch.zeros_like(columns).masked_fill(~sink_real[:, None, None, :], torch.finfo(attention_mask.dtype).min)
    return torch.cat([columns, attention_mask[..., attention_mask.shape[-1] - (held - slots) :]], dim=-1)
