"""Hybrid full/SWA attention for any transformers decoder, via ``AttentionInterface``.

Each attention module of a hybridized model carries a reference to one shared
:class:`HybridAttention` state. The registered attention function reads the module's
``layer_idx``, splits the KV groups (and their query heads) into a full-attention set and
an SWA set, runs causal attention on the first and windowed causal attention on the
second, and writes both back in the original head order — the same result as the
paper's W_o permutation, without touching any weight.

Search mode (paper B.2): :meth:`HybridAttention.set_mask` swaps the mask in place; the
per-layer head partitions are rebuilt lazily, no weight is copied or reloaded.

Window semantics (everywhere, identical to transformers' ``sliding_attention`` layers):
query ``t`` sees keys ``j`` with ``t − W < j ≤ t``. Layers that the model itself already
runs with a sliding window keep it; our SWA groups there use ``min(W, model window)``.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, flash_attention_mask, sdpa_mask

from bosch_eval.masks import HeadMask, MaskError, ModelShape, check_window
from bosch_eval.swa_kernels import blocked_swa_attention, flash_swa_attention, masked_swa_attention

SDPA_IMPLEMENTATION = "bosch_sdpa"
FLASH_IMPLEMENTATION = "bosch_flash_attention_2"
# auto: flash-attn on CUDA when installed, the O(T·W) blocked kernel on CPU, else masked SDPA.
BACKENDS = ("auto", "sdpa", "blocked", "flash_attention_2")


class HybridStates(NamedTuple):
    """Keys (or values) handed over by a deploy-mode cache layer (``bosch_eval.hybrid_cache``):
    ``full [B, G_full, S, D]`` over every position and ``swa [B, G_swa, S_swa, D]`` over
    the last ``S_swa`` positions, ending at the last query."""

    full: torch.Tensor
    swa: torch.Tensor


@dataclass(frozen=True)
class LayerSplit:
    """Index tensors that split one layer's heads into full and SWA sets."""

    full_kv: torch.Tensor  # KV groups kept at full attention
    swa_kv: torch.Tensor
    full_q: torch.Tensor  # their query heads
    swa_q: torch.Tensor


class HybridAttention:
    """The mutable mask state shared by a hybridized model and its attention modules.

    Args:
        mask: the head mask (1 = full, 0 = SWA per KV group).
        window: W, keys seen by an SWA query including itself.
        backend: one of ``sdpa`` (exact masked reference), ``blocked`` (O(T·W) SWA,
            any device), ``flash_attention_2`` (CUDA, flash-attn 2).
        config: the model's config; the current mask is kept in it under
            ``bosch_mask`` so that ``save_pretrained`` writes it into the checkpoint.
    """

    def __init__(self, mask: HeadMask, window: int, backend: str, config: Any = None) -> None:
        if backend not in BACKENDS[1:]:
            raise MaskError(f"attn_backend: expected one of {list(BACKENDS)}, got {backend!r}")
        self.backend = backend
        self.config = config
        self._splits: dict[tuple[int, torch.device], LayerSplit] = {}
        self._apply(mask, check_window(window))

    def _apply(self, mask: HeadMask, window: int) -> None:
        self.mask, self.window = mask, window
        self._splits.clear()
        if self.config is not None:
            self.config.bosch_mask = mask.with_meta(window=window).to_json()

    def set_mask(self, mask: HeadMask, window: int | None = None) -> None:
        """Swap the mask in place (search mode): no reload, no weight copy.

        The window stays unless ``window`` is given.
        """
        mask.check_fits(self.mask.shape, source="set_mask", model=self.mask.model)
        self._apply(mask, self.window if window is None else check_window(window))

    def layer_split(self, layer: int, device: torch.device) -> LayerSplit:
        """The head partition of ``layer``, built once per mask and device."""
        key = (layer, device)
        if key not in self._splits:
            bits = self.mask.bits[layer]
            per_group = self.mask.shape.group_size
            full_kv = [g for g, bit in enumerate(bits) if bit]
            swa_kv = [g for g, bit in enumerate(bits) if not bit]

            def heads(groups: list[int]) -> list[int]:
                return [g * per_group + i for g in groups for i in range(per_group)]

            def as_index(values: list[int]) -> torch.Tensor:
                return torch.tensor(values, dtype=torch.long, device=device)

            self._splits[key] = LayerSplit(as_index(full_kv), as_index(swa_kv), as_index(heads(full_kv)), as_index(heads(swa_kv)))
        return self._splits[key]

    # -- kernels ------------------------------------------------------------------------
    def full_attention(self, module: torch.nn.Module, *args: Any, **kwargs: Any) -> torch.Tensor:
        """The base implementation's attention (causal, plus the model's own mask)."""
        if self.backend == "flash_attention_2":
            from transformers.integrations.flash_attention import flash_attention_forward

            return flash_attention_forward(module, *args, **kwargs)[0]
        return sdpa_attention_forward(module, *args, **kwargs)[0]

    def swa_attention(
        self,
        module: torch.nn.Module,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: torch.Tensor | None,
        **kwargs: Any,
    ) -> torch.Tensor:
        """Windowed causal attention; the model's own sliding window, if any, still applies."""
        model_window = kwargs.get("sliding_window")
        window = min(self.window, model_window) if model_window else self.window
        if self.backend == "flash_attention_2":
            return flash_swa_attention(module, query, key, value, attention_mask, window, **kwargs)[0]
        if self.backend == "blocked":
            return blocked_swa_attention(
                query, key, value, attention_mask, window, scaling=kwargs.get("scaling"), dropout=kwargs.get("dropout", 0.0)
            )
        return masked_swa_attention(module, query, key, value, attention_mask, window, **kwargs)[0]


def hybrid_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """The registered attention function. query ``[B, H, T, D]``, key/value ``[B, G, S, D]``;
    returns ``[B, T, H, D]``."""
    state: HybridAttention | None = getattr(module, "bosch_hybrid", None)
    if state is None:
        raise RuntimeError(
            f"{type(module).__name__} runs the bosch attention implementation but carries no mask; "
            "use bosch_eval.hybrid_attention.hybridize(model, mask)"
        )
    split = state.layer_split(module.layer_idx, query.device)
    if isinstance(key, HybridStates):
        return _attend_cached_split(state, split, module, query, key, value, attention_mask, **kwargs), None
    if not len(split.swa_kv):
        # Bit-identical to the unpatched model: the very same kernel on the very same tensors.
        return state.full_attention(module, query, key, value, attention_mask, **kwargs), None
    if not len(split.full_kv):
        return state.swa_attention(module, query, key, value, attention_mask, **kwargs), None
    full = state.full_attention(
        module, query[:, split.full_q], key[:, split.full_kv], value[:, split.full_kv], attention_mask, **kwargs
    )
    swa = state.swa_attention(
        module, query[:, split.swa_q], key[:, split.swa_kv], value[:, split.swa_kv], attention_mask, **kwargs
    )
    return _merge_heads(full, swa, split), None


def _attend_cached_split(
    state: HybridAttention,
    split: LayerSplit,
    module: torch.nn.Module,
    query: torch.Tensor,
    key: HybridStates,
    value: HybridStates,
    attention_mask: torch.Tensor | None,
    **kwargs: Any,
) -> torch.Tensor:
    """Attention over a hybrid cache layer, whose full and SWA groups hold different spans."""
    if key.full.shape[1] != len(split.full_kv) or key.swa.shape[1] != len(split.swa_kv):
        raise RuntimeError(
            f"layer {module.layer_idx}: the KV cache was built for another mask "
            f"({key.full.shape[1]} full / {key.swa.shape[1]} SWA groups, mask has {len(split.full_kv)} / "
            f"{len(split.swa_kv)}); build a new cache after set_mask"
        )
    # The SWA part covers the last positions only: the matching last columns of the mask.
    swa_mask = attention_mask[..., -key.swa.shape[2] :] if attention_mask is not None else None
    swa = state.swa_attention(module, query[:, split.swa_q], key.swa, value.swa, swa_mask, **kwargs)
    if not len(split.full_kv):
        return swa
    full = state.full_attention(module, query[:, split.full_q], key.full, value.full, attention_mask, **kwargs)
    return _merge_heads(full, swa, split)


def _merge_heads(full: torch.Tensor, swa: torch.Tensor, split: LayerSplit) -> torch.Tensor:
    """``[B, T, H_full, D]`` and ``[B, T, H_swa, D]`` -> ``[B, T, H, D]`` in head order,
    written once into one tensor (a concatenation and a gather would copy it twice)."""
    batch, length, _, dim = full.shape
    out = full.new_empty(batch, length, full.shape[2] + swa.shape[2], dim)
    out[:, :, split.full_q] = full
    out[:, :, split.swa_q] = swa
    return out


def register() -> None:
    """Register the hybrid attention under both names, with the mask format each base expects.

    A custom attention name needs an entry in ``AttentionMaskInterface`` too, or
    transformers builds no mask for it (padding would be ignored).
    """
    AttentionInterface.register(SDPA_IMPLEMENTATION, hybrid_attention_forward)
    AttentionMaskInterface.register(SDPA_IMPLEMENTATION, sdpa_mask)
    AttentionInterface.register(FLASH_IMPLEMENTATION, hybrid_attention_forward)
    AttentionMaskInterface.register(FLASH_IMPLEMENTATION, flash_attention_mask)


def resolve_backend(backend: str, device: torch.device) -> str:
    """Turn ``auto`` into a concrete backend for ``device``; check the others can run there."""
    flash_installed = importlib.util.find_spec("flash_attn") is not None
    if backend == "auto":
        if device.type == "cuda":
            return "flash_attention_2" if flash_installed else "sdpa"
        return "blocked"
    if backend not in BACKENDS:
        raise MaskError(f"attn_backend: expected one of {list(BACKENDS)}, got {backend!r}")
    if backend == "flash_attention_2" and (device.type != "cuda" or not flash_installed):
        raise MaskError(
            f"attn_backend: 'flash_attention_2' needs a CUDA model and the flash-attn package "
            f"(pip install 'bosch-eval[flash]'); model is on {device}, flash-attn "
            f"{'installed' if flash_installed else 'not installed'}"
        )
    return backend


def attention_modules(model: torch.nn.Module) -> dict[int, torch.nn.Module]:
    """The attention modules of a decoder, by layer index.

    Transformers' attention modules (Llama, Qwen2/3, Mistral, Gemma, ...) carry
    ``layer_idx`` and ``num_key_value_groups``; that is what the hybrid function reads.
    """
    return {
        module.layer_idx: module
        for module in model.modules()
        if hasattr(module, "layer_idx") and hasattr(module, "num_key_value_groups")
    }


def hybridize(
    model: Any, mask: HeadMask, window: int | None = None, backend: str = "auto", source: str = "mask"
) -> HybridAttention:
    """Apply ``mask`` to ``model`` in place and return the state that swaps it later.

    Args:
        model: a transformers ``PreTrainedModel`` (decoder) whose attention dispatches
            through ``ALL_ATTENTION_FUNCTIONS``.
        mask: the head mask; must match the model's L, H and G.
        window: W; defaults to the mask's own ``window``.
        backend: ``auto``, ``sdpa``, ``blocked`` or ``flash_attention_2``.
        source: how to name the mask in error messages (e.g. its file).

    Raises:
        MaskError: the mask does not fit the model, no window is known, or the backend
            cannot run on the model's device.
    """
    shape = ModelShape.from_config(model.config)
    model_name = getattr(model.config, "_name_or_path", None) or type(model).__name__
    mask.check_fits(shape, source=source, model=model_name)
    window = window if window is not None else mask.window
    if window is None:
        raise MaskError(f"{source}: field 'window' is missing; pass window= explicitly")
    modules = attention_modules(model)
    if sorted(modules) != list(range(shape.num_layers)):
        raise MaskError(
            f"{type(model).__name__}: expected attention modules with layer_idx 0..{shape.num_layers - 1} "
            f"that dispatch through transformers' AttentionInterface, found {sorted(modules)}"
        )
    backend = resolve_backend(backend, model.device)
    register()
    implementation = FLASH_IMPLEMENTATION if backend == "flash_attention_2" else SDPA_IMPLEMENTATION
    # transformers only logs a warning when a model cannot switch implementation; running
    # the unpatched attention under a mask would silently measure the wrong model.
    model.set_attn_implementation(implementation)
    if model.config._attn_implementation != implementation:
        raise MaskError(
            f"{type(model).__name__} does not dispatch attention through transformers' AttentionInterface; "
            "it cannot run a hybrid mask"
        )
    existing: HybridAttention | None = getattr(model, "bosch_hybrid", None)
    if existing is not None and existing.backend == backend:
        existing.set_mask(mask, window)  # re-applying swaps in place, never stacks states
        return existing
    state = HybridAttention(mask, window, backend, model.config)
    for module in modules.values():
        module.bosch_hybrid = state
    model.bosch_hybrid = state
    return state


def hybrid_state(model: Any) -> HybridAttention:
    """The state of a hybridized model (raises if the model was never hybridized)."""
    state = getattr(model, "bosch_hybrid", None)
    if state is None:
        raise RuntimeError(f"{type(model).__name__} is not hybridized; call hybridize(model, mask) first")
    return state

