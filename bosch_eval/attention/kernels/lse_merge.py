"""Sinks for kernels that have no sink option (flash-attn): two calls merged exactly.

Softmax attention over a key set that splits into disjoint parts A and B is the
log-sum-exp-weighted sum of the attentions over each part:

    out = e^(lse_A − lse) · out_A + e^(lse_B − lse) · out_B,   lse = log(e^lse_A + e^lse_B)

Part A is the window (the kernel's own call), part B the row's sink keys (its first S real
keys) outside the window (``j ≤ t − W``), at most S keys per query, gathered per row and
done here in eager PyTorch. The
windowed call is a parameter, so the same merge runs on CPU with an eager stand-in
(:func:`attention_with_lse`) in the tests and with flash-attn on CUDA.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from bosch_eval.attention.kernels.row_sinks import gather_keys
from bosch_eval.attention.local_window import LocalWindow, causal, recent, sink_indices

# (query, key, value, key_padding [B, K] bool or None, window, scaling) -> (out [B, T, H, D], lse [B, H, T] fp32)
WindowedWithLse = Callable[
    [torch.Tensor, torch.Tensor, torch.Tensor, "torch.Tensor | None", int, float], tuple[torch.Tensor, torch.Tensor]
]


def attention_with_lse(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, allowed: torch.Tensor, scaling: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Eager attention and its log-sum-exp.

    Args:
        query: ``[B, H, T, D]``; key, value: ``[B, G, K, D]``.
        allowed: boolean, broadcastable to ``[B, H, T, K]``.

    Returns:
        ``out [B, T, H, Dv]`` (zero where a query sees no key) and ``lse [B, H, T]`` in
        float32 (``-inf`` there).
    """
    repeat = query.shape[1] // key.shape[1]
    key, value = key.repeat_interleave(repeat, dim=1), value.repeat_interleave(repeat, dim=1)
    scores = (query.float() @ key.float().transpose(2, 3)) * scaling
    scores = scores.masked_fill(~allowed, float("-inf"))
    lse = scores.logsumexp(dim=-1)  # [B, H, T]
    weights = (scores - lse[..., None]).exp().nan_to_num(0.0)
    out = (weights @ value.float()).to(query.dtype).transpose(1, 2)
    return out, lse


def merge_by_lse(out_a: torch.Tensor, lse_a: torch.Tensor, out_b: torch.Tensor, lse_b: torch.Tensor) -> torch.Tensor:
    """Attention over the union of two disjoint key sets, from each set's ``out [B, T, H, D]``
    and ``lse [B, H, T]``; a query that sees neither set gets zeros."""
    lse = torch.logaddexp(lse_a, lse_b)
    # -inf − -inf is NaN: a part that sees no key weighs nothing.
    weight_a = (lse_a - lse).exp().nan_to_num(0.0).transpose(1, 2)[..., None]
    weight_b = (lse_b - lse).exp().nan_to_num(0.0).transpose(1, 2)[..., None]
    return (out_a.float() * weight_a + out_b.float() * weight_b).to(out_a.dtype)


def sink_merged_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    key_padding: torch.Tensor | None,
    local: LocalWindow,
    scaling: float,
    windowed: WindowedWithLse,
) -> torch.Tensor:
    """``local``'s attention (window and sinks) from a windowed kernel without sinks.

    Args:
        query: ``[B, H, T, D]``, the last T of the K keys.
        key, value: ``[B, G, K, D]``.
        key_padding: ``[B, K]``, True where a key is a real token (None: no padding).
        windowed: attention over the last ``W`` keys with its log-sum-exp.

    Returns:
        ``[B, T, H, Dv]``.
    """
    out_w, lse_w = windowed(query, key, value, key_padding, local.window, scaling)
    if not min(local.sinks, key.shape[2]):
        return out_w
    q_len, kv_len = query.shape[2], key.shape[2]
    index, found = (t.to(query.device) for t in sink_indices(key_padding, local.sinks, kv_len))  # [B or 1, S']
    q_pos = torch.arange(kv_len - q_len, kv_len, device=query.device)[None, :, None]
    kv_pos = index[:, None, :]
    # The sink keys outside the window: disjoint from part A, so the merge is exact.
    allowed = (found[:, None, :] & causal(0, 0, q_pos, kv_pos) & ~recent(local.window)(0, 0, q_pos, kv_pos))[
        :, None
    ]  # [B or 1, 1, T, S']
    out_s, lse_s = attention_with_lse(query, gather_keys(key, index), gather_keys(value, index), allowed, scaling)
    return merge_by_lse(out_w, lse_w, out_s, lse_s)


def eager_windowed(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    key_padding: torch.Tensor | None,
    window: int,
    scaling: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The stand-in for flash-attn's windowed call: the same inputs and outputs, eager."""
    allowed = LocalWindow(window).dense(query.shape[2], key.shape[2], query.device)[None, None]
    if key_padding is not None:
        allowed = allowed & key_padding[:, None, None, :].bool()
    return attention_with_lse(query, key, value, allowed, scaling)
