"""Attention over a deploy-mode cache layer, whose full and SWA groups hold different spans.

A :class:`~bosch_eval.caches.hybrid_cache.HybridHeadLayer` hands the attention function
:class:`HybridStates` (full part, SWA part) instead of one ``[B, G, K, D]`` tensor. The full
groups attend every position; the SWA groups attend their part (:class:`SwaPart`): each row's
sink slots and the recent positions, under the mask the part makes of the model's. Once the
step's attention is done, the part finds the sinks the step brought (:meth:`SwaPart.settle`)
from that mask: only the model's mask shows which keys are real.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, NamedTuple, Protocol

import torch

from bosch_eval.attention.hybrid_spec import LayerSplit
from bosch_eval.attention.layer_call import LayerCall, group_index, head_index

if TYPE_CHECKING:  # hybrid_attention calls this module
    from bosch_eval.attention.hybrid_attention import HybridAttention


class SwaPart(Protocol):
    """The SWA part of a deploy-mode cache layer, as the attention function sees it
    (``bosch_eval.caches.swa_ring.SwaRing``, which states what its keys are for one query
    and for a chunk)."""

    @property
    def start(self) -> int:
        """The step's first position (0: the cache held nothing before it)."""

    def part_mask(self, attention_mask: torch.Tensor | None, q_len: int) -> torch.Tensor | None:
        """The model's mask over every position, made into the mask of the part's keys."""

    def settle(self, part_mask: torch.Tensor | None) -> None:
        """After this step's attention: find the sinks it brought, from ``part_mask``
        (:meth:`part_mask`'s: it shows which keys are real)."""


class HybridStates(NamedTuple):
    """Keys (or values) handed over by a deploy-mode cache layer (``bosch_eval.caches.hybrid_cache``):
    ``full [B, G_full, S, D]`` over every position and ``swa [B, G_swa, S_swa, D]``, what
    ``part`` holds (:class:`SwaPart`)."""

    full: torch.Tensor
    swa: torch.Tensor
    part: SwaPart


def attend_cached(
    handle: HybridAttention,
    split: LayerSplit,
    call: LayerCall,
    key: HybridStates,
    value: HybridStates,
    attention_mask: torch.Tensor | None,
) -> torch.Tensor:
    """Attention over a hybrid cache layer (the cache checks that it was built for the current
    spec), written into ``call.out``; then the cache's SWA part drops what no later query sees."""
    query, kwargs = call.query, call.kwargs
    handle.layer_local(kwargs, query.shape[2], key.full.shape[2])  # refuses sinks past the model's own window
    swa_mask = key.part.part_mask(attention_mask, query.shape[2])
    if query.shape[2] > 1 and handle.kernels.layer is not None and split.full:
        out = _prefill_in_one_call(handle, split, call, key, value, attention_mask, swa_mask)
    elif not split.full:
        out = _swa_attention(handle, query)(call.module, query, key.swa, value.swa, swa_mask, **kwargs)
    elif len(split.full) == len(split.swa) == 1:
        out = _two_runs(handle, split, call, key, value, (attention_mask, swa_mask))
    else:
        call.attend_kind(handle.full_attention, split.full, split.group_size, key.full, value.full, attention_mask)
        call.attend_kind(_swa_attention(handle, query), split.swa, split.group_size, key.swa, value.swa, swa_mask)
        out = call.out
    key.part.settle(swa_mask)
    return out


def _two_runs(
    handle: HybridAttention,
    split: LayerSplit,
    call: LayerCall,
    key: HybridStates,
    value: HybridStates,
    masks: tuple[torch.Tensor | None, ...],
) -> torch.Tensor:
    """A layer whose full groups and SWA groups are one run each (every mixed layer where the
    heads are permuted by kind, ``bosch_eval.attention.head_order``): each kind's queries are
    a view, and the two outputs, put side by side in head order, are the layer's output, one
    op (no output buffer to fill)."""
    size = split.group_size
    full, swa = split.full[0], split.swa[0]
    full_out = handle.full_attention(
        call.module, call.query[:, full.start * size : full.stop * size], key.full, value.full, masks[0], **call.kwargs
    )
    swa_kernel = _swa_attention(handle, call.query)
    swa_out = swa_kernel(
        call.module, call.query[:, swa.start * size : swa.stop * size], key.swa, value.swa, masks[1], **call.kwargs
    )
    return torch.cat([full_out, swa_out] if full.start == 0 else [swa_out, full_out], dim=2)


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
    if key.part.start == 0:  # the part is the chunk itself, as the full part is
        return handle.mixed_layer(
            module, query, _all_groups(key, split), _all_groups(value, split), attention_mask, **kwargs
        )
    call.attend_kind(handle.full_attention, split.full, split.group_size, key.full, value.full, attention_mask)
    empty_keys = HybridStates(
        key.swa.new_zeros(key.swa.shape[0], len(split.full_groups), *key.swa.shape[2:]), key.swa, key.part
    )
    empty_values = HybridStates(
        value.swa.new_zeros(value.swa.shape[0], len(split.full_groups), *value.swa.shape[2:]), value.swa, value.part
    )
    windowed = handle.swa_attention(
        module, query, _all_groups(empty_keys, split), _all_groups(empty_values, split), swa_mask, **kwargs
    )
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
