"""The reference backend, ``sdpa``: transformers' SDPA, with an explicit band mask for SWA heads.

Exact on any device, O(T·K) work; every other backend is tested against it.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from bosch_eval.attention.kernels import BACKENDS, Backend
from bosch_eval.attention.kernels.row_sinks import row_sinks
from bosch_eval.attention.kernels.sdpa_full import sdpa_full_attention
from bosch_eval.attention.local_window import LocalWindow

# Re-exported: the full groups' kernel of this family, defined where ``Backend`` takes it as its default.
__all__ = ["masked_swa_attention", "restrict_to_window", "sdpa_full_attention"]


def restrict_to_window(
    attention_mask: torch.Tensor | None,
    q_len: int,
    kv_len: int,
    local: LocalWindow,
    device: torch.device,
    sink_keys: torch.Tensor | None = None,
) -> torch.Tensor:
    """The model's 4D mask (padding, causality) intersected with the band of ``local``, whose
    sinks are ``sink_keys [B, K]`` per row (None: the first S indices)."""
    band = local.dense(q_len, kv_len, device, sink_keys)
    band = band[:, None] if band.dim() == 3 else band[None, None]
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
    local: LocalWindow,
    **kwargs: Any,
) -> torch.Tensor:
    """Reference SWA: SDPA with the band as an explicit mask, each row's sinks its own."""
    sinks = row_sinks(attention_mask, local)
    mask = restrict_to_window(attention_mask, query.shape[2], key.shape[2], local, query.device, sinks)
    return sdpa_attention_forward(module, query, key, value, mask, **kwargs)[0]


BACKENDS.register("sdpa", Backend(swa=masked_swa_attention))
