"""KV-cache bytes of an entry relative to the original model, in closed form.

The one formula is :func:`bosch_eval.caches.kv_quant.formula.kv_cache_bytes_formula` (what the
bench checks against the stored tensors): full KV groups keep every position (LogQuant or
KiVi packs most of them when ``kv_quant`` is set), SWA groups their S sinks and the last
``W − 1``. The
leaderboard divides it by the original's 16-bit cache at the same length, so without
``kv_quant`` the head dim, dtype and batch cancel; with it, the packed codes and scales
depend on the head dim, which the entry's model config gives.
"""

from __future__ import annotations

from collections.abc import Mapping

from bosch_eval.caches.kv_quant.config import parse_kv_quant
from bosch_eval.caches.kv_quant.formula import KVLayout, kv_cache_bytes_formula
from bosch_eval.masks.head_mask import HeadMask

REFERENCE_DTYPE_BYTES = 2  # the original model's cache in fp16/bf16


def relative_kv_bytes(
    mask: HeadMask, window: int, length: int, head_dim: int = 1, kv_quant_args: Mapping[str, str] | None = None
) -> float:
    """Cache bytes of ``mask`` (its SWA groups keep ``mask.sinks`` sinks; its KV quantization,
    if any) over the original's at ``length``."""
    shape = mask.shape
    kv_quant = None
    if kv_quant_args:
        kv_quant = parse_kv_quant(
            kv_quant_args.get("kv_quant"),
            kv_quant_args.get("kv_bits"),
            kv_quant_args.get("kv_window"),
            kv_quant_args.get("kv_group_size"),
            head_dim=head_dim,
        )
    hybrid = kv_cache_bytes_formula(
        mask.bits,
        KVLayout(shape.num_layers, shape.num_kv_heads, head_dim),
        length,
        window=window,
        kv_quant=kv_quant,
        dtype_bytes=REFERENCE_DTYPE_BYTES,
        sinks=mask.sinks,
    )
    original = kv_cache_bytes_formula(
        None, KVLayout(shape.num_layers, shape.num_kv_heads, head_dim), length, dtype_bytes=REFERENCE_DTYPE_BYTES
    )
    return hybrid / original


def entry_kv_bytes(
    model_args: Mapping[str, str], mask: HeadMask, window: int, length: int, head_dim: int | None = None
) -> float:
    """KV bytes of an entry relative to the original model at ``length``; an entry's
    ``sink=S`` overrides the mask's own sinks, as the adapter does.

    Raises:
        ValueError: a ``kv_quant`` entry without the model's ``head_dim`` (the packed size
            depends on it).
    """
    if model_args.get("kv_cache", "hybrid") == "dynamic":
        return 1.0  # transformers' cache keeps every position of every group
    if model_args.get("sink") is not None:
        mask = mask.with_meta(sinks=int(model_args["sink"]))
    quant = {key: value for key, value in model_args.items() if key.startswith("kv_") and key != "kv_cache"}
    if quant.get("kv_quant", "none") == "none":
        return relative_kv_bytes(mask, window, length)
    if head_dim is None:
        raise ValueError("kv_quant: the relative size of a quantized cache needs the model's head_dim")
    return relative_kv_bytes(mask, window, length, head_dim, quant)
