"""Closed-form KV-cache bytes of the original, hybrid, quantized and hybrid + quantized caches.

Pure arithmetic (no torch), so ``bosch-eval compare`` can report KV bytes at any length T
without building a cache; ``bosch-eval bench`` checks it against the stored tensors.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from bosch_eval.attention.local_window import LocalWindow
from bosch_eval.caches.kv_quant.config import KVQuantConfig


def quantized_token_count(seq_len: int, kv_window: int) -> int:
    """Tokens stored quantized after ``seq_len`` tokens: ``W`` per event, events at
    ``t = 3W, 4W, …`` (the same for LogQuant and KiVi; see ``selection``)."""
    return max(0, seq_len // kv_window - 2) * kv_window


def full_group_bytes(seq_len: int, head_dim: int, dtype_bytes: int, kv_quant: KVQuantConfig | None) -> int:
    """Bytes of keys + values of one full-attention KV group (batch 1) after ``seq_len`` tokens."""
    if kv_quant is None:
        return 2 * seq_len * head_dim * dtype_bytes
    n_q = quantized_token_count(seq_len, kv_quant.window)
    events = n_q // kv_quant.window
    full_precision = 2 * (seq_len - n_q) * head_dim * dtype_bytes
    codes = 2 * n_q * head_dim * kv_quant.bits // 8  # keys and values, packed
    key_scales = 2 * events * head_dim * dtype_bytes  # scale + zero per event and channel
    value_scales = 2 * n_q * (head_dim // kv_quant.group_size) * dtype_bytes  # per token and group
    return full_precision + codes + key_scales + value_scales


class KVLayout(NamedTuple):
    """What sizes a model's KV cache besides the mask: L layers of G KV groups of ``head_dim``."""

    num_layers: int
    num_kv_heads: int
    head_dim: int


def kv_cache_bytes_formula(
    mask: Sequence[Sequence[int]] | None,
    layout: KVLayout,
    seq_len: int,
    window: int | None = None,
    kv_quant: KVQuantConfig | None = None,
    dtype_bytes: int = 2,
    batch: int = 1,
    sinks: int = 0,
) -> int:
    """KV bytes held after ``seq_len`` tokens, as the deploy-mode cache stores them.

    Args:
        mask: ``[L][G]`` bits, 1 = full attention, 0 = SWA; ``None``: every group full.
        window: W of the SWA groups; needed when the mask has SWA groups. They keep what
            :meth:`~bosch_eval.attention.local_window.LocalWindow.retained` says:
            ``min(T, S) + min(max(T − S, 0), W − 1)`` positions.
        kv_quant: LogQuant/KiVi settings for the full groups; ``None``: full precision.
        dtype_bytes: bytes per element of the model's states (2 for fp16/bf16, 4 for fp32);
            scales and zero points are stored in the same dtype.
        sinks: S, attention-sink positions the SWA groups keep besides their window.

    Position indices are not counted: they follow from ``seq_len`` alone and are shared by
    all layers.
    """
    num_layers, num_kv_heads, head_dim = layout
    rows = [[1] * num_kv_heads for _ in range(num_layers)] if mask is None else [list(r) for r in mask]
    if len(rows) != num_layers or any(len(r) != num_kv_heads for r in rows):
        raise ValueError(f"mask: expected {num_layers} rows of {num_kv_heads} bits, got {[len(r) for r in rows]}")
    full = sum(sum(r) for r in rows)
    swa = num_layers * num_kv_heads - full
    if swa and window is None:
        raise ValueError("window: the mask has SWA groups; pass their window W")
    swa_bytes = 2 * LocalWindow(window, sinks).retained_count(seq_len) * head_dim * dtype_bytes if swa else 0
    return batch * (full * full_group_bytes(seq_len, head_dim, dtype_bytes, kv_quant) + swa * swa_bytes)
