"""Hybrid full/SWA attention for any transformers decoder, via ``AttentionInterface``.

Each attention module of a hybridized model carries a reference to one shared
:class:`HybridAttention` state. The registered attention function reads the module's
``layer_idx``, splits the KV groups (and their query heads) into a full-attention set and
an SWA set, runs causal attention on the first and windowed causal attention on the
second, and writes both back in the original head order — the same result as the
paper's W_o permutation, without touching any weight.

Search mode (paper B.2): :meth:`HybridAttention.set_mask` swaps the mask in place; the
per-layer head partitions are rebuilt lazily, no weight is copied or reloaded.

Window semantics (everywhere): :class:`~bosch_eval.local_window.LocalWindow`, W keys up to
and including the query plus S sink positions; with S = 0, identical to transformers'
``sliding_attention`` layers. Layers that the model itself already runs with a sliding
window keep it; our SWA groups there use ``min(W, model window)`` (and the model's own
mask still applies, so sinks there are seen only within its window).

Kernels come from the registry in :mod:`bosch_eval.swa_kernels` (``attn_backend=``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, flash_attention_mask, sdpa_mask

from bosch_eval.errors import SettingsError
from bosch_eval.local_window import LocalWindow, LocalWindowError
from bosch_eval.masks import HeadMask, MaskError, ModelShape, check_window
from bosch_eval.model_check import ModelError
from bosch_eval.swa_kernels import BACKENDS as KERNELS
from bosch_eval.swa_kernels import Backend

# The attention implementation registered with transformers, per mask format.
IMPLEMENTATIONS = {"sdpa": "bosch_sdpa", "flash": "bosch_flash_attention_2"}
SDPA_IMPLEMENTATION, FLASH_IMPLEMENTATION = IMPLEMENTATIONS["sdpa"], IMPLEMENTATIONS["flash"]


def backend_names() -> list[str]:
    """``auto`` and every registered backend."""
    return ["auto", *KERNELS]


def local_window(window: int, sinks: int = 0, source: str = "window") -> LocalWindow:
    """A :class:`LocalWindow`, with errors as :class:`MaskError` naming ``source``."""
    try:
        return LocalWindow(window, sinks)
    except LocalWindowError as err:
        raise MaskError(f"{source}: {err}") from None


class HybridStates(NamedTuple):
    """Keys (or values) handed over by a deploy-mode cache layer (``bosch_eval.hybrid_cache``):
    ``full [B, G_full, S, D]`` over every position and ``swa [B, G_swa, S_swa, D]`` over
    the last ``S_swa`` positions, ending at the last query."""

    full: torch.Tensor
    swa: torch.Tensor


@dataclass(frozen=True)
class GroupRun:
    """Consecutive KV groups ``start … stop − 1`` of one kind (full or SWA); ``offset`` is
    the first one's index among the layer's groups of that kind (a cache stores each kind
    apart)."""

    start: int
    stop: int
    offset: int


@dataclass(frozen=True)
class LayerSplit:
    """One layer's KV groups as runs of consecutive full and SWA groups.

    Attention runs once per run on slices of the query, key and value tensors, which are
    views: no gather of the heads of one kind, and each output written once in place.
    """

    full: tuple[GroupRun, ...]
    swa: tuple[GroupRun, ...]
    group_size: int  # query heads per KV group

    @property
    def full_groups(self) -> list[int]:
        return [g for run in self.full for g in range(run.start, run.stop)]

    @property
    def swa_groups(self) -> list[int]:
        return [g for run in self.swa for g in range(run.start, run.stop)]


def _runs(bits: tuple[int, ...], kind: int) -> tuple[GroupRun, ...]:
    runs: list[GroupRun] = []
    offset = 0
    for group, bit in enumerate(bits):
        if bit != kind:
            continue
        if runs and runs[-1].stop == group:
            runs[-1] = GroupRun(runs[-1].start, group + 1, runs[-1].offset)
        else:
            runs.append(GroupRun(group, group + 1, offset))
        offset += 1
    return tuple(runs)


class HybridAttention:
    """The mutable mask state shared by a hybridized model and its attention modules.

    Args:
        mask: the head mask (1 = full, 0 = SWA per KV group).
        window: W, keys seen by an SWA query including itself.
        backend: a registered backend (:mod:`bosch_eval.swa_kernels`): ``sdpa`` (exact
            masked reference), ``blocked`` (O(T·W) SWA, any device), ``flex``
            (FlexAttention), ``flash_attention_2`` (CUDA, flash-attn 2).
        config: the model's config; the current mask is kept in it under
            ``bosch_mask`` so that ``save_pretrained`` writes it into the checkpoint.
        sinks: S, attention-sink positions every SWA query also sees.
    """

    def __init__(self, mask: HeadMask, window: int, backend: str, config: Any = None, sinks: int = 0) -> None:
        if backend not in KERNELS:
            raise SettingsError(f"attn_backend: expected one of {backend_names()}, got {backend!r}")
        self.backend = backend
        self.kernels: Backend = KERNELS[backend]
        self.config = config
        self._splits: dict[int, LayerSplit] = {}
        self._apply(mask, local_window(check_window(window), sinks, "sink"))

    @property
    def window(self) -> int:
        return self.local.window

    @property
    def sinks(self) -> int:
        return self.local.sinks

    def _apply(self, mask: HeadMask, local: LocalWindow) -> None:
        self.mask, self.local = mask, local
        self._splits.clear()
        if self.config is not None:
            self.config.bosch_mask = mask.with_meta(window=local.window, sinks=local.sinks).to_json()

    def set_mask(self, mask: HeadMask, window: int | None = None, sinks: int | None = None) -> None:
        """Swap the mask in place (search mode): no reload, no weight copy.

        The window and sinks stay unless given.
        """
        mask.check_fits(self.mask.shape, source="set_mask", model=self.mask.model)
        window = self.window if window is None else check_window(window)
        self._apply(mask, local_window(window, self.sinks if sinks is None else sinks, "sink"))

    def layer_split(self, layer: int) -> LayerSplit:
        """The head partition of ``layer``, built once per mask."""
        if layer not in self._splits:
            bits = self.mask.bits[layer]
            self._splits[layer] = LayerSplit(full=_runs(bits, 1), swa=_runs(bits, 0), group_size=self.mask.shape.group_size)
        return self._splits[layer]

    # -- kernels ------------------------------------------------------------------------
    def full_attention(self, module: torch.nn.Module, *args: Any, **kwargs: Any) -> torch.Tensor:
        """The base implementation's attention (causal, plus the model's own mask)."""
        return self.kernels.full(module, *args, **kwargs)

    def layer_local(self, kwargs: dict[str, Any]) -> LocalWindow:
        """The window of this call: the model's own sliding window, if any, still applies."""
        return self.local.narrowed(kwargs.get("sliding_window"))

    def swa_attention(
        self,
        module: torch.nn.Module,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: torch.Tensor | None,
        **kwargs: Any,
    ) -> torch.Tensor:
        """Windowed causal attention (window and sinks) by the backend's kernel."""
        return self.kernels.swa(module, query, key, value, attention_mask, self.layer_local(kwargs), **kwargs)


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
    split = state.layer_split(module.layer_idx)
    if isinstance(key, HybridStates):
        return _attend_cached_split(state, split, module, query, key, value, attention_mask, **kwargs), None
    if not split.swa:
        # Bit-identical to the unpatched model: the very same kernel on the very same tensors.
        return state.full_attention(module, query, key, value, attention_mask, **kwargs), None
    if not split.full:
        return state.swa_attention(module, query, key, value, attention_mask, **kwargs), None
    if state.kernels.layer is not None:  # the backend runs a mixed layer in one call
        swa_groups = [not bit for bit in state.mask.bits[module.layer_idx]]
        out = state.kernels.layer(module, query, key, value, attention_mask, state.layer_local(kwargs), swa_groups=swa_groups, **kwargs)
        return out, None
    out = query.new_empty(query.shape[0], query.shape[2], query.shape[1], value.shape[-1])
    for attend, runs in ((state.full_attention, split.full), (state.swa_attention, split.swa)):
        _attend_runs(attend, runs, split.group_size, module, query, key, value, attention_mask, out, kind_only=False, **kwargs)
    return out, None


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
    full_groups, swa_groups = len(split.full_groups), len(split.swa_groups)
    if key.full.shape[1] != full_groups or key.swa.shape[1] != swa_groups:
        raise RuntimeError(
            f"layer {module.layer_idx}: the KV cache was built for another mask "
            f"({key.full.shape[1]} full / {key.swa.shape[1]} SWA groups, mask has {full_groups} / "
            f"{swa_groups}); build a new cache after set_mask"
        )
    swa_mask = _kept_columns(attention_mask, key.swa.shape[2], state.sinks)
    if not split.full:
        return state.swa_attention(module, query, key.swa, value.swa, swa_mask, **kwargs)
    out = query.new_empty(query.shape[0], query.shape[2], query.shape[1], value.full.shape[-1])
    parts = (
        (state.full_attention, split.full, key.full, value.full, attention_mask),
        (state.swa_attention, split.swa, key.swa, value.swa, swa_mask),
    )
    for attend, runs, keys, values, mask in parts:
        _attend_runs(attend, runs, split.group_size, module, query, keys, values, mask, out, kind_only=True, **kwargs)
    return out


def _kept_columns(attention_mask: torch.Tensor | None, kept: int, sinks: int) -> torch.Tensor | None:
    """The mask columns of the positions an SWA cache part holds: every position until it
    drops some, then the first ``sinks`` and the last ``kept − sinks``
    (:meth:`LocalWindow.retained`)."""
    if attention_mask is None or attention_mask.shape[-1] == kept:
        return attention_mask
    if not sinks:
        return attention_mask[..., -kept:]
    return torch.cat([attention_mask[..., :sinks], attention_mask[..., attention_mask.shape[-1] - (kept - sinks) :]], dim=-1)


def _attend_runs(
    attend: Any,
    runs: tuple[GroupRun, ...],
    group_size: int,
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    out: torch.Tensor,
    kind_only: bool,
    **kwargs: Any,
) -> None:
    """``attend`` on the query heads of each run, written into ``out [B, T, H, D]``.

    ``kind_only``: ``key``/``value`` hold only this kind's groups (a cache layer), so a
    run's groups sit at its ``offset``; otherwise at its own group indices.
    """
    for run in runs:
        heads = slice(run.start * group_size, run.stop * group_size)
        first = run.offset if kind_only else run.start
        groups = slice(first, first + run.stop - run.start)
        out[:, :, heads] = attend(module, query[:, heads], key[:, groups], value[:, groups], attention_mask, **kwargs)


def register() -> None:
    """Register the hybrid attention under one name per mask format, with that format's mask.

    A custom attention name needs an entry in ``AttentionMaskInterface`` too, or
    transformers builds no mask for it (padding would be ignored).
    """
    masks = {"sdpa": sdpa_mask, "flash": flash_attention_mask}
    for mask_format, name in IMPLEMENTATIONS.items():
        AttentionInterface.register(name, hybrid_attention_forward)
        AttentionMaskInterface.register(name, masks[mask_format])


def resolve_backend(backend: str, device: torch.device) -> str:
    """Turn ``auto`` into a concrete backend for ``device``; check the others can run there.

    ``auto``: flash-attn on CUDA when installed, else masked SDPA on CUDA; the O(T·W)
    blocked kernel on CPU.
    """
    if backend == "auto":
        if device.type == "cuda":
            return "flash_attention_2" if KERNELS["flash_attention_2"].unavailable(device) is None else "sdpa"
        return "blocked"
    if backend not in KERNELS:
        raise SettingsError(f"attn_backend: expected one of {backend_names()}, got {backend!r}")
    reason = KERNELS[backend].unavailable(device)
    if reason is not None:
        raise SettingsError(f"attn_backend: {backend!r} {reason}")
    return backend


def attention_modules(model: torch.nn.Module) -> dict[int, torch.nn.Module]:
    """The self-attention modules of a decoder, by layer index.

    Transformers' attention modules carry ``layer_idx`` (what the hybrid function reads).
    GQA families (Llama, Qwen2/3, Mistral, Gemma, ...) also carry ``num_key_value_groups``;
    multi-head families without it (GPT-2: G = H, one query head per KV group) are told
    from their decoder blocks by ``is_causal``, and cross-attention modules are left out.
    """
    return {
        module.layer_idx: module
        for module in model.modules()
        if getattr(module, "layer_idx", None) is not None
        and (hasattr(module, "num_key_value_groups") or getattr(module, "is_causal", False) is True)
        and not getattr(module, "is_cross_attention", False)
    }


def hybridize(
    model: Any, mask: HeadMask, window: int | None = None, backend: str = "auto", source: str = "mask", sinks: int | None = None
) -> HybridAttention:
    """Apply ``mask`` to ``model`` in place and return the state that swaps it later.

    Args:
        model: a transformers ``PreTrainedModel`` (decoder) whose attention dispatches
            through ``ALL_ATTENTION_FUNCTIONS``.
        mask: the head mask; must match the model's L, H and G.
        window: W; defaults to the mask's own ``window``.
        backend: ``auto`` or a registered backend (:func:`backend_names`).
        source: how to name the mask in error messages (e.g. its file).
        sinks: S; defaults to the mask's own ``sinks``.

    Raises:
        MaskError: the mask does not fit the model, or no window is known.
        SettingsError: the backend cannot run on the model's device.
        ModelError: the model does not dispatch attention through transformers.
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
            f"{type(model).__name__}: expected one self-attention module per layer carrying layer_idx "
            f"0..{shape.num_layers - 1} and num_key_value_groups or is_causal (transformers' attention modules "
            f"do), found layer indices {sorted(modules)}; this model's attention cannot take a head mask"
        )
    backend = resolve_backend(backend, model.device)
    register()
    sinks = sinks if sinks is not None else mask.sinks
    implementation = IMPLEMENTATIONS[KERNELS[backend].mask_format]
    # transformers only logs a warning when a model cannot switch implementation; running
    # the unpatched attention under a mask would silently measure the wrong model.
    model.set_attn_implementation(implementation)
    if model.config._attn_implementation != implementation:
        raise ModelError(
            f"{type(model).__name__} does not dispatch attention through transformers' AttentionInterface; "
            "it cannot run a hybrid mask"
        )
    existing: HybridAttention | None = getattr(model, "bosch_hybrid", None)
    if existing is not None and existing.backend == backend:
        existing.set_mask(mask, window, sinks)  # re-applying swaps in place, never stacks states
        return existing
    state = HybridAttention(mask, window, backend, model.config, sinks)
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

