"""Export a head mask so that it runs outside this package.

* :func:`export_transformers`: a whole-layer mask (every row all-SWA or all-full) becomes a
  plain transformers checkpoint whose config says which layers slide, in transformers' own
  ``layer_types`` / ``sliding_window`` fields, for families whose modeling code builds each
  layer's attention mask from them. It loads with ``AutoModelForCausalLM`` alone.
* :func:`serving_json`: any mask (per KV group) as a small versioned JSON
  (``bosch-serving/1``) that a serving engine's plugin can read: per layer, the KV groups
  that keep full attention, those that slide, the window and the sinks, and how the window
  is counted.

Window semantics: our SWA lets query ``t`` see keys ``t − W < j ≤ t`` (W keys, itself
included). transformers' ``sliding_window_overlay`` keeps ``kv_idx > q_idx − sliding_window``
under the causal mask: the same band, so ``sliding_window = W`` exactly ("inclusive").
Engines that count only the keys before the query (flash-attn's ``window_size[0]``) use
W − 1 ("exclusive").
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch

from bosch_eval.attention.hybrid_attention import CONFIG_FIELD as MASK_FIELD
from bosch_eval.attention.hybrid_attention import hybridize
from bosch_eval.caches.kv_quant.config import CONFIG_FIELD as KV_QUANT_FIELD
from bosch_eval.masks.head_mask import HeadMask
from bosch_eval.masks.window import WINDOW_CONVENTIONS
from bosch_eval.runtime.errors import ExportError

SERVING_FORMAT = "bosch-serving/1"
CONVENTIONS = WINDOW_CONVENTIONS
SLIDING, FULL = "sliding_attention", "full_attention"
# Positions whose logits the export check compares: the last ones of a 2W-token probe, each
# of which loses W or more keys in a sliding layer.
_CHECKED_POSITIONS = 16
# The exported model must be at least 10x closer to the hybrid model than the unmasked
# model is; a family that ignores layer_types gives exactly the unmasked model (ratio 1).
_MAX_DISTANCE_RATIO = 0.1


def whole_layer_types(mask: HeadMask, source: str = "mask") -> list[str]:
    """transformers ``layer_types`` for a mask whose rows are all-SWA or all-full.

    Raises:
        ExportError: naming the first mixed layer; per-group masks need the hybrid
            checkpoint or ``--to serving``.
    """
    for layer, row in enumerate(mask.bits):
        if 0 < sum(row) < len(row):
            raise ExportError(
                f"{source}: layer {layer} mixes full and SWA KV groups ({list(row)}); transformers' layer_types "
                "give a whole layer one attention type, so only masks whose rows are all 0 or all 1 export "
                "--to transformers (per-group masks: save a hybrid checkpoint, or export --to serving)"
            )
    return [FULL if row[0] else SLIDING for row in mask.bits]


def _declared_fields(config_class: type) -> set[str]:
    """The fields a config class declares: its dataclass fields, or its ``__init__`` parameters
    (configs that are not dataclasses, e.g. some remote code)."""
    if dataclasses.is_dataclass(config_class):
        return {f.name for f in dataclasses.fields(config_class)}
    return set(inspect.signature(config_class.__init__).parameters)


def sliding_config(config: Any, mask: HeadMask, window: int, source: str = "mask") -> Any:
    """A copy of ``config`` whose layers slide where ``mask`` says, in transformers' fields.

    Decided from the config class, not from the family's name: the class must declare
    ``layer_types`` (Llama's and Mistral's do not: their modeling gives every layer the same
    attention), and a rebuilt config must keep the layer types and window as written
    (Qwen2/3 drop ``sliding_window`` unless ``use_sliding_window``, which is set where the
    class declares it). Whether the modeling code builds each layer's mask from
    ``layer_types`` is checked on the weights by :func:`export_transformers`.

    Raises:
        ExportError: naming the config class and the field it lacks or changes.
    """
    layer_types = whole_layer_types(mask, source)
    if mask.sinks:
        raise ExportError(
            f"{source}: field 'sinks' is {mask.sinks}; transformers' sliding_attention layers have no attention "
            "sinks (query t sees only t - W < j <= t), so the export would drop them (export --to serving keeps them)"
        )
    config_class = type(config)
    fields = _declared_fields(config_class)
    if "layer_types" not in fields:
        raise ExportError(
            f"{config_class.__name__} has no field 'layer_types': this family's modeling code gives every layer "
            f"the same attention, so a per-layer sliding window cannot be written into its config "
            f"(families whose config declares layer_types: Qwen2/3, Ministral, Gemma2/3, ...)"
        )
    data = config.to_dict()
    if data.get(KV_QUANT_FIELD) is not None:
        raise ExportError(
            f"{source}: the model has KV quantization ({KV_QUANT_FIELD!r}), which transformers' cache cannot "
            "run; the exported model would score differently"
        )
    for field in (MASK_FIELD, KV_QUANT_FIELD):
        data.pop(field, None)  # the mask now lives in layer_types; no bosch_* field survives
    data.update(layer_types=layer_types, sliding_window=window)
    if "use_sliding_window" in fields:
        data["use_sliding_window"] = True
    swa_layers = [layer for layer, kind in enumerate(layer_types) if kind == SLIDING]
    if "max_window_layers" in fields and swa_layers and swa_layers == list(range(swa_layers[0], len(layer_types))):
        # Qwen2/3 readers that predate layer_types slide layers i >= max_window_layers; when the
        # SWA layers are such a suffix, they then read the same model.
        data["max_window_layers"] = swa_layers[0]
    rebuilt = config_class.from_dict(data)
    for field, wanted in (("layer_types", layer_types), ("sliding_window", window)):
        if getattr(rebuilt, field, None) != wanted:
            raise ExportError(
                f"{config_class.__name__}: field '{field}' was set to {wanted!r} but the config class turns it "
                f"into {getattr(rebuilt, field, None)!r}; this family cannot express the mask in transformers' fields"
            )
    return rebuilt


@torch.no_grad()
def _last_logits(model: Any, ids: torch.Tensor) -> torch.Tensor:
    return model(input_ids=ids, logits_to_keep=_CHECKED_POSITIONS).logits.float()


def export_transformers(model_path: str | Path, mask: HeadMask, out: str | Path, source: str = "mask") -> Path:
    """Write a plain transformers checkpoint that runs ``mask`` (whole layers only) at ``out``.

    The weights and tokenizer are copied unchanged; only the config changes
    (:func:`sliding_config`). Before ``out`` appears, the written checkpoint is loaded with
    ``AutoModelForCausalLM`` and its logits on a random 2W-token probe are compared with
    the hybrid model's: a family whose modeling ignores ``layer_types`` gives the unmasked
    model's logits and is refused.

    Raises:
        ExportError: ``out`` is not empty, the mask or family cannot be expressed, or the
            written checkpoint does not run the mask.
    """
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    out = Path(out)
    if out.exists() and any(out.iterdir()):
        raise ExportError(f"{out}: directory exists and is not empty; choose a new export directory")
    window = mask.window
    if window is None:
        raise ExportError(f"{source}: field 'window' is missing; pass --window W")
    # Decided from the config alone, so a refused family costs no weight loading.
    exported_config = sliding_config(AutoConfig.from_pretrained(model_path), mask, window, source)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype="auto").eval()
    original_config = model.config

    limit = getattr(original_config, "max_position_embeddings", None) or 2 * window
    length = max(min(2 * window, limit), _CHECKED_POSITIONS)
    probe = torch.randint(0, original_config.vocab_size, (1, length), generator=torch.Generator().manual_seed(0))
    probe = probe.to(model.device)
    unmasked = _last_logits(model, probe)

    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        model.config = exported_config
        model.save_pretrained(staging)
        AutoTokenizer.from_pretrained(model_path).save_pretrained(staging)
        model.config = original_config
        with hybridize(model, mask, window, source=source):  # the reference the export must match
            hybrid = _last_logits(model, probe)
        del model
        exported = _last_logits(
            AutoModelForCausalLM.from_pretrained(staging, dtype="auto").eval().to(probe.device), probe
        )
        gap, effect = (exported - hybrid).abs().max().item(), (unmasked - hybrid).abs().max().item()
        if effect > 0 and gap > _MAX_DISTANCE_RATIO * effect:
            raise ExportError(
                f"{type(exported_config).__name__}: the exported checkpoint does not run the mask: its logits on a "
                f"{length}-token probe are {gap:.3g} from the hybrid model's, against {effect:.3g} for the unmasked "
                f"model (must be below {_MAX_DISTANCE_RATIO:g}x); this family's modeling code ignores layer_types"
            )
        if out.exists():
            out.rmdir()
        staging.rename(out)
    finally:
        if staging.exists():
            shutil.rmtree(staging)
    return out


def serving_json(mask: HeadMask, convention: str = "inclusive") -> dict[str, Any]:
    """The ``bosch-serving/1`` description of ``mask``: per layer, the KV groups with full
    attention, the sliding ones, their window counted by ``convention`` and their sinks.

    ``inclusive``: query ``t`` sees keys ``t − window < j ≤ t`` (transformers, vLLM, SGLang).
    ``exclusive``: ``window`` keys before the query, ``t − window ≤ j ≤ t`` (flash-attn's
    ``window_size[0]``), i.e. W − 1.
    """
    if convention not in CONVENTIONS:
        raise ExportError(f"window convention: expected one of {list(CONVENTIONS)}, got {convention!r}")
    if mask.window is None:
        raise ExportError("mask: field 'window' is missing; pass --window W")
    window = mask.window if convention == "inclusive" else mask.window - 1
    shape = mask.shape
    layers = []
    for layer, row in enumerate(mask.bits):
        swa = [group for group, bit in enumerate(row) if not bit]
        layers.append(
            {
                "layer": layer,
                "full_kv_groups": [group for group, bit in enumerate(row) if bit],
                "swa_kv_groups": swa,
                "window": window if swa else None,
                "sinks": mask.sinks if swa else 0,
            }
        )
    return {
        "format": SERVING_FORMAT,
        "model": mask.model,
        "num_layers": shape.num_layers,
        "num_heads": shape.num_heads,
        "num_kv_heads": shape.num_kv_heads,
        "window_convention": convention,
        "window_semantics": (
            "query t sees keys j with t - window < j <= t (window keys, itself included)"
            if convention == "inclusive"
            else "query t sees keys j with t - window <= j <= t (window keys before it, plus itself)"
        ),
        "kv_group_heads": "KV group g serves query heads g*H/G .. (g+1)*H/G - 1",
        "sinks_semantics": "the first `sinks` positions stay visible to every query of a sliding group, besides its window",
        "swa_ratio": mask.swa_ratio,
        "method": mask.method,
        "layers": layers,
    }


def write_serving(mask: HeadMask, out: str | Path, convention: str = "inclusive") -> Path:
    """Write :func:`serving_json` of ``mask`` to ``out`` (its folder is created)."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(serving_json(mask, convention), indent=1) + "\n")
    return out
