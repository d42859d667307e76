"""Hybrid checkpoints: the head mask travels inside ``config.json`` (field ``bosch_mask``),
and so do KV-quantization settings (field ``bosch_kv_quant``) when the model had them.

``hybridize`` keeps the current mask (with its window) in ``model.config.bosch_mask``, so
``model.save_pretrained(dir)`` writes it with no extra step, and :func:`load_hybrid_model`
or ``lm_eval --model bosch --model_args pretrained=<dir>`` restores the same hybrid model.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from transformers import AutoModelForCausalLM, PreTrainedModel

from bosch_eval.attention.hybrid_attention import CONFIG_FIELD, hybridize
from bosch_eval.caches.kv_quant.config import CONFIG_FIELD as KV_QUANT_FIELD
from bosch_eval.caches.kv_quant.config import KVQuantConfig
from bosch_eval.masks.head_mask import HeadMask
from bosch_eval.runtime.errors import MaskError


def saved_mask(config: Any, source: str = "config.json") -> HeadMask | None:
    """The mask stored in a model config, validated, or None for an ordinary model."""
    data = getattr(config, CONFIG_FIELD, None)
    if data is None:
        return None
    return HeadMask.from_json(data, f"{source}: field '{CONFIG_FIELD}'")


def saved_kv_quant(config: Any, source: str = "config.json") -> KVQuantConfig | None:
    """The KV quantization settings stored in a model config (field ``bosch_kv_quant``), or
    None. Pass them to ``HybridCache.for_model(model, kv_quant)``."""
    data = getattr(config, KV_QUANT_FIELD, None)
    return None if data is None else KVQuantConfig.from_json(data, f"{source}: field '{KV_QUANT_FIELD}'")


def set_saved_kv_quant(config: Any, kv_quant: KVQuantConfig | None) -> None:
    """Keep ``kv_quant`` in the config so ``save_pretrained`` writes it (None removes it)."""
    if kv_quant is not None:
        setattr(config, KV_QUANT_FIELD, kv_quant.to_json())
    elif hasattr(config, KV_QUANT_FIELD):
        delattr(config, KV_QUANT_FIELD)


def load_hybrid_model(path: str | Path, attn_backend: str = "auto", **from_pretrained: Any) -> PreTrainedModel:
    """Load a checkpoint written by ``save_pretrained`` of a hybrid model, hybridized again.

    The hybrid attention is what is asked for here, so it stays on the model returned; its
    handle, ``hybrid_state(model)``, gives the checkpoint's plain model back when left as a
    ``with`` block (or on ``restore()``), as every :func:`hybridize` does.

    Raises:
        MaskError: the checkpoint holds no ``bosch_mask`` (not a hybrid checkpoint).
    """
    model = AutoModelForCausalLM.from_pretrained(path, **from_pretrained)
    source = f"{path}/config.json"
    mask = saved_mask(model.config, source)
    if mask is None:
        raise MaskError(f"{source}: no field '{CONFIG_FIELD}'; this is not a checkpoint of a hybrid model")
    hybridize(model, mask, backend=attn_backend, source=source)
    return model
