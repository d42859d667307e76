"""KV-cache bytes of an entry relative to the original model, in closed form.

The hybrid cache (:mod:`bosch_eval.hybrid_cache`) keeps every position for full KV groups
and the last ``W − 1`` for SWA groups, so at length ``T``

    bytes = Σ_layers (G_full·T + G_swa·min(T, W − 1)) × 2 × head_dim × dtype size × batch,

and relative to the original (every group full) the head_dim, dtype and batch cancel.
:func:`entry_kv_bytes` is the one place the leaderboard computes bytes: a KV quantization
setting (``kv_quant``) composes here once it exists.
"""

from __future__ import annotations

from collections.abc import Mapping

from bosch_eval.masks import HeadMask


def hybrid_kv_bytes(mask: HeadMask, window: int, length: int, head_dim: int, dtype_bytes: int, batch: int = 1) -> int:
    """Bytes the hybrid cache holds after ``length`` positions (keys and values)."""
    swa_len = min(length, window - 1)
    positions = sum(row.count(1) * length + row.count(0) * swa_len for row in mask.bits)
    return positions * 2 * head_dim * dtype_bytes * batch


def relative_kv_bytes(mask: HeadMask, window: int, length: int) -> float:
    """Hybrid cache bytes over the original's at ``length`` (1.0 = no saving)."""
    shape = mask.shape
    return hybrid_kv_bytes(mask, window, length, 1, 1) / (2 * shape.num_layers * shape.num_kv_heads * length)


def entry_kv_bytes(model_args: Mapping[str, str], mask: HeadMask, window: int, length: int) -> float:
    """KV bytes of an entry relative to the original model at ``length``.

    Raises:
        ValueError: a model_arg that changes the cache's size and is not modelled here
            (``kv_quant``), rather than a silently wrong number.
    """
    if "kv_quant" in model_args:
        raise ValueError("kv_quant: KV bytes of quantized caches are not modelled by the leaderboard yet")
    if model_args.get("kv_cache", "hybrid") == "dynamic":
        return 1.0  # transformers' cache keeps every position of every group
    return relative_kv_bytes(mask, window, length)
