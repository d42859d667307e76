"""Causal attention exactly as the unpatched model runs it: the full groups' kernel of every
backend whose mask is SDPA's (``Backend.full``'s default), in a module that registers nothing,
so :mod:`~bosch_eval.attention.kernels.backend` can take it as its default without importing a
backend's module (which imports ``backend`` to register itself)."""

from __future__ import annotations

from typing import Any

import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward


def sdpa_full_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    **kwargs: Any,
) -> torch.Tensor:
    """Causal attention exactly as the unpatched model runs it (SDPA and the model's mask).

    One query under ``torch.compile`` (a compiled decode step) with grouped KV heads and a mask
    is the exception: transformers then repeats every key and value for each query head of its
    group (a copy of the whole cache each step), where eagerly it folds the group's query heads
    into the query axis (no copy); this does what it does eagerly.
    """
    if (
        query.shape[2] == 1
        and key.shape[1] != query.shape[1]
        and attention_mask is not None
        and torch.compiler.is_compiling()
    ):
        return _one_query_by_group(query, key, value, attention_mask, kwargs.get("scaling"))
    return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)[0]


def _one_query_by_group(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attention_mask: torch.Tensor, scaling: float | None
) -> torch.Tensor:
    """``query [B, H, 1, D]`` over ``key/value [B, G, K, ·]``: the H / G query heads of a group
    as that group's queries, under the ``[B, 1, 1, K]`` mask; ``[B, 1, H, Dv]``."""
    batch, heads, _, dim = query.shape
    by_group = query.reshape(batch, key.shape[1], heads // key.shape[1], dim)
    out = torch.nn.functional.scaled_dot_product_attention(
        by_group, key, value, attn_mask=attention_mask, scale=scaling
    )
    return out.reshape(batch, 1, heads, out.shape[-1])
