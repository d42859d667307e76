"""Hybrid full/SWA attention for any transformers decoder, via ``AttentionInterface``.

A :class:`~bosch_eval.attention.hybrid_spec.HybridSpec` (mask, window and sinks, backend) is applied
to a model by :func:`apply_spec` (or :func:`hybridize`, which builds the spec first). That
returns a :class:`HybridAttention` handle, which every attention module of the model
references. The registered attention function reads the module's ``layer_idx`` and the
handle's current spec, splits the KV groups (and their query heads) into a full-attention
set and an SWA set, runs causal attention on the first and windowed causal attention on the
second, and writes both back in the original head order — the same result as the paper's
W_o permutation, without touching any weight.

The handle is a context manager: leaving it (or :meth:`HybridAttention.restore`) gives the
model back exactly as it was — attention implementation, config and modules — like
lm-eval's ``hf_steered``. Search mode (paper B.2) swaps the spec on the handle in place
(:meth:`HybridAttention.set_mask`, :meth:`HybridAttention.swap`): no reload, no weight copy.

Window semantics (everywhere): :class:`~bosch_eval.attention.local_window.LocalWindow`, W keys up to
and including the query plus S sinks, each row's first S real tokens; with S = 0, identical
to transformers' ``sliding_attention`` layers. The sinks of a row come from its key padding,
which the model's mask carries: the last query row of the 4D mask (causal ∧ padding: that row
sees every real key) or flash's ``[B, K]`` mask itself. Layers that the model itself already runs with a sliding
window keep it; our SWA groups there use ``min(W, model window)``. Sinks there are refused:
such a layer's mask (and cache) no longer shows which keys are a row's first real tokens.

Kernels come from the registry in :mod:`bosch_eval.attention.kernels` (``attn_backend=``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, flash_attention_mask, sdpa_mask

from bosch_eval.attention.cached_attention import HybridStates, attend_cached
from bosch_eval.attention.head_order import HeadOrder
from bosch_eval.attention.hybrid_spec import HybridSpec, LayerSplit, RunsOn
from bosch_eval.attention.kernels import Backend, LayerPattern
from bosch_eval.attention.layer_call import LayerCall
from bosch_eval.attention.local_window import LocalWindow
from bosch_eval.attention.restore_point import RestorePoint
from bosch_eval.masks.head_mask import HeadMask, ModelShape
from bosch_eval.runtime.errors import MaskError, ModelError, SettingsError

# The attention implementation registered with transformers, per mask format.
IMPLEMENTATIONS = {"sdpa": "bosch_sdpa", "flash": "bosch_flash_attention_2"}
SDPA_IMPLEMENTATION, FLASH_IMPLEMENTATION = IMPLEMENTATIONS["sdpa"], IMPLEMENTATIONS["flash"]

# The attribute by which the model and each of its attention modules reference the handle.
HANDLE_ATTRIBUTE = "bosch_hybrid"
# The config field save_pretrained writes the mask into (bosch_eval.models.checkpoint reads it).
CONFIG_FIELD = "bosch_mask"


class HybridAttention:
    """A model with a hybrid spec applied: the current spec, swapped in place, and the undo.

    Made by :func:`apply_spec` / :func:`hybridize`, never directly. Use it as a context
    manager (or call :meth:`restore`) to give the model back as it was. Blocks nest: a
    ``with hybridize(model, ...)`` on a model already hybridized swaps its spec on this handle,
    and leaving that block swaps back the spec it found; only leaving the block that first
    applied a spec restores the model.

    Attributes:
        model: the model it is applied to.
        spec: the current :class:`HybridSpec` (read-only; :meth:`swap` replaces it).
        kernel_cache: the backend's per-model state (flex: its block masks), or None.
    """

    def __init__(self, model: Any, spec: HybridSpec, modules: dict[int, torch.nn.Module]) -> None:
        self.model = model
        self._modules = list(modules.values())
        self._saved = RestorePoint.take(model, CONFIG_FIELD)
        self._order = HeadOrder(modules)  # the weights' head order (spec.by_kind)
        self._spec: HybridSpec | None = None
        self.kernel_cache: Any = None
        self.restored = False
        # What leaving a with-block goes back to, per open block (None: the original model), and
        # what the next block entered will go back to: the spec found by the last apply_spec.
        self._block_exits: list[HybridSpec | None] = []
        self._next_block_exit: HybridSpec | None = None
        try:
            self.swap(spec)
        except Exception:
            self._order.arrange(None)
            self._saved.put_back()  # a model that cannot take the spec is left as it was
            raise
        for module in self._modules:
            setattr(module, HANDLE_ATTRIBUTE, self)
        setattr(model, HANDLE_ATTRIBUTE, self)

    # -- the spec -----------------------------------------------------------------------
    @property
    def spec(self) -> HybridSpec:
        if self._spec is None:
            raise RuntimeError("HybridAttention: no spec applied")
        return self._spec

    def swap(self, spec: HybridSpec) -> None:
        """Run ``spec`` from the next forward on (search mode: no reload, no weight copy).

        Raises:
            RuntimeError: the handle was restored.
            MaskError: the spec's mask was made for another model shape.
            SettingsError: its backend cannot run on the model's device.
        """
        if self.restored:
            raise RuntimeError("this hybrid model was restored to the original; apply a spec again (hybridize)")
        if self._spec is not None:
            spec.mask.check_fits(self._spec.mask.shape, source="set_mask", model=self._spec.mask.model)
        if self._spec is None or spec.backend != self._spec.backend:
            reason = spec.kernels.unavailable(self.model.device)
            if reason is not None:
                raise SettingsError(f"attn_backend: {spec.backend!r} {reason}")
            self.kernel_cache = spec.kernels.cache() if spec.kernels.cache is not None else None
        implementation = IMPLEMENTATIONS[spec.kernels.mask_format]
        if self.model.config._attn_implementation != implementation:  # new, or switched away since
            _set_implementation(self.model, implementation)
        self._order.arrange(spec.group_orders if spec.by_kind else None)
        self._spec = spec
        # What save_pretrained writes: the mask with the window and sinks it runs (models.checkpoint reads it back).
        saved = spec.mask.with_meta(window=spec.local.window, sinks=spec.local.sinks)
        setattr(self.model.config, CONFIG_FIELD, saved.to_json())

    def set_mask(self, mask: HeadMask, window: int | None = None, sinks: int | None = None) -> None:
        """Swap the mask in place (search mode): no reload, no weight copy.

        The window and sinks stay unless given.
        """
        self.swap(self.spec.with_mask(mask, window, sinks))

    @property
    def mask(self) -> HeadMask:
        return self.spec.mask

    @property
    def local(self) -> LocalWindow:
        return self.spec.local

    @property
    def window(self) -> int:
        return self.spec.local.window

    @property
    def sinks(self) -> int:
        return self.spec.local.sinks

    @property
    def backend(self) -> str:
        return self.spec.backend

    @property
    def kernels(self) -> Backend:
        return self.spec.kernels

    def layer_split(self, layer: int) -> LayerSplit:
        """The head partition of ``layer`` under the current spec, in the weights' head order
        (:attr:`HybridSpec.by_kind`)."""
        return self.spec.layout_split(layer)

    def swap_for_block(self, spec: HybridSpec) -> None:
        """:meth:`swap` to ``spec`` for a with-block entered next: on its exit the model runs
        the spec it ran before (hybridizing a hybridized model again nests, never stacks)."""
        found = self.spec
        self.swap(spec)
        self._next_block_exit = found

    # -- the undo ---------------------------------------------------------------------------
    def restore(self) -> None:
        """Give the model back as it was before the spec was applied: its attention
        implementation (config and sub-configs), its ``bosch_mask`` config field (removed,
        or the value it had), and no attribute of ours on any module. Idempotent."""
        if self.restored:
            return
        for module in (*self._modules, self.model):
            if getattr(module, HANDLE_ATTRIBUTE, None) is self:
                delattr(module, HANDLE_ATTRIBUTE)
        self._order.arrange(None)  # the weights back in the model's head order
        self._saved.put_back()
        self.kernel_cache = None
        self.restored = True

    def __enter__(self) -> HybridAttention:
        self._block_exits.append(self._next_block_exit)
        self._next_block_exit = None
        return self

    def __exit__(self, *exc: object) -> None:
        found = self._block_exits.pop() if self._block_exits else None
        if found is None or self.restored:
            self.restore()
        else:
            self.swap(found)

    # -- kernels ------------------------------------------------------------------------
    def full_attention(self, module: torch.nn.Module, *args: Any, **kwargs: Any) -> torch.Tensor:
        """The base implementation's attention (causal, plus the model's own mask)."""
        return self.spec.kernels.full(module, *args, **kwargs)

    def layer_local(self, kwargs: dict[str, Any], q_len: int, kv_len: int) -> LocalWindow:
        """The window of this call: the model's own sliding window, if any, still applies.

        Raises:
            SettingsError: sinks in a layer the model itself runs with a sliding window that
                may hide a row's first real tokens (its own cache may drop them once it
                holds ``window − 1`` earlier keys; its mask hides keys past its window).
        """
        model_window = kwargs.get("sliding_window")
        if model_window and self.spec.local.sinks and kv_len - q_len >= model_window - 1:
            raise SettingsError(
                f"sink: {self.spec.local.sinks} attention sinks cannot run past the model's own sliding window "
                f"({model_window} keys, reached with {kv_len} keys): there its mask and cache no longer show each row's "
                "first real tokens; use sink=0 or shorter inputs"
            )
        return self.spec.local.narrowed(model_window)

    def swa_attention(
        self,
        module: torch.nn.Module,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: torch.Tensor | None,
        **kwargs: Any,
    ) -> torch.Tensor:
        """Windowed causal attention (window and sinks) by the backend's kernel; the sinks
        are each row's first real keys, which the kernel reads from ``attention_mask``."""
        local = self.layer_local(kwargs, query.shape[2], key.shape[2])
        return self.spec.kernels.swa(module, query, key, value, attention_mask, local, **self._with_cache(kwargs))

    def mixed_layer(
        self,
        module: torch.nn.Module,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: torch.Tensor | None,
        **kwargs: Any,
    ) -> torch.Tensor:
        """A layer of full and SWA groups in one call of the backend's whole-layer kernel."""
        swa_groups = tuple(not bit for bit in self.spec.layout_bits(module.layer_idx))
        pattern = LayerPattern(self.layer_local(kwargs, query.shape[2], key.shape[2]), swa_groups)
        return self.spec.kernels.layer(module, query, key, value, attention_mask, pattern, **self._with_cache(kwargs))

    def _with_cache(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        return kwargs if self.kernel_cache is None else {**kwargs, "kernel_cache": self.kernel_cache}


def _set_implementation(model: Any, implementation: str) -> None:
    register()
    # transformers only logs a warning when a model cannot switch implementation; running
    # the unpatched attention under a mask would silently measure the wrong model.
    model.set_attn_implementation(implementation)
    if model.config._attn_implementation != implementation:
        raise ModelError(
            f"{type(model).__name__} does not dispatch attention through transformers' AttentionInterface; "
            "it cannot run a hybrid mask"
        )


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
    handle: HybridAttention | None = getattr(module, HANDLE_ATTRIBUTE, None)
    if handle is None:
        raise RuntimeError(
            f"{type(module).__name__} runs the bosch attention implementation but carries no mask; "
            "use bosch_eval.attention.hybrid_attention.hybridize(model, mask)"
        )
    split = handle.layer_split(module.layer_idx)
    if isinstance(key, HybridStates):
        return attend_cached(
            handle, split, LayerCall.start(module, query, value.full.shape[-1], kwargs), key, value, attention_mask
        ), None
    if not split.swa:
        # Bit-identical to the unpatched model: the very same kernel on the very same tensors.
        return handle.full_attention(module, query, key, value, attention_mask, **kwargs), None
    if not split.full:
        return handle.swa_attention(module, query, key, value, attention_mask, **kwargs), None
    if handle.kernels.layer is not None:  # the backend runs a mixed layer in one call
        return handle.mixed_layer(module, query, key, value, attention_mask, **kwargs), None
    call = LayerCall.start(module, query, value.shape[-1], kwargs)
    for attend, runs in ((handle.full_attention, split.full), (handle.swa_attention, split.swa)):
        call.attend_runs(attend, runs, split.group_size, key, value, attention_mask, kind_only=False)
    return call.out, None


def register() -> None:
    """Register the hybrid attention under one name per mask format, with that format's mask.

    A custom attention name needs an entry in ``AttentionMaskInterface`` too, or
    transformers builds no mask for it (padding would be ignored). The registry is
    transformers' and global; the names stay registered after a model is restored (no
    model runs them unless it is hybridized).
    """
    masks = {"sdpa": sdpa_mask, "flash": flash_attention_mask}
    for mask_format, name in IMPLEMENTATIONS.items():
        AttentionInterface.register(name, hybrid_attention_forward)
        AttentionMaskInterface.register(name, masks[mask_format])


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


def _model_name(model: Any) -> str:
    return getattr(model.config, "_name_or_path", None) or type(model).__name__


def apply_spec(model: Any, spec: HybridSpec, source: str = "mask") -> HybridAttention:
    """Apply ``spec`` to ``model`` and return its handle (a context manager that undoes it).

    A model that already carries a handle gets the spec swapped on it (never a second,
    stacked patch), and that handle is returned; a with-block on it swaps back, on exit, the
    spec it found.

    Raises:
        MaskError: the spec's mask does not fit the model, or the model has no attention
            module per layer.
        SettingsError: the spec's backend cannot run on the model's device.
        ModelError: the model does not dispatch attention through transformers.
    """
    shape = ModelShape.from_config(model.config)
    spec.mask.check_fits(shape, source=source, model=_model_name(model))
    existing: HybridAttention | None = getattr(model, HANDLE_ATTRIBUTE, None)
    if existing is not None:
        existing.swap_for_block(spec)
        return existing
    modules = attention_modules(model)
    if sorted(modules) != list(range(shape.num_layers)):
        raise MaskError(
            f"{type(model).__name__}: expected one self-attention module per layer carrying layer_idx "
            f"0..{shape.num_layers - 1} and num_key_value_groups or is_causal (transformers' attention modules "
            f"do), found layer indices {sorted(modules)}; this model's attention cannot take a head mask"
        )
    return HybridAttention(model, spec, modules)


def hybridize(
    model: Any,
    mask: HeadMask,
    window: int | None = None,
    backend: str = "auto",
    source: str = "mask",
    sinks: int | None = None,
    by_kind: bool = False,
) -> HybridAttention:
    """Build a :class:`HybridSpec` for ``model`` and apply it (:func:`apply_spec`).

    Args:
        model: a transformers ``PreTrainedModel`` (decoder) whose attention dispatches
            through ``ALL_ATTENTION_FUNCTIONS``.
        mask: the head mask; must match the model's L, H and G.
        window: W; defaults to the mask's own ``window``.
        backend: ``auto`` (chosen for the model's device and dtype) or a registered backend
            (:func:`~bosch_eval.attention.hybrid_spec.backend_names`).
        source: how to name the mask in error messages (e.g. its file).
        sinks: S; defaults to the mask's own ``sinks``.
        by_kind: permute each layer's heads in the weights so that its full and SWA groups
            are one run each (:mod:`bosch_eval.attention.head_order`): deploy mode's decode
            steps read views only. Off by default: code that reads a head's weights by index
            sees the model's order.

    Returns:
        The handle: swap masks on it (search mode), or leave it (``with``) to restore the model.

    Raises:
        MaskError: the mask does not fit the model, or no window is known.
        SettingsError: the backend cannot run on the model's device.
        ModelError: the model does not dispatch attention through transformers.
    """
    on = RunsOn(model.device, model.dtype, ModelShape.from_config(model.config), _model_name(model))
    spec = HybridSpec.build(mask, window, sinks, backend, on=on, source=source)
    return apply_spec(model, dataclasses.replace(spec, by_kind=by_kind) if by_kind else spec, source)


def hybrid_state(model: Any) -> HybridAttention:
    """The handle of a hybridized model (raises if the model is not hybridized)."""
    handle = getattr(model, HANDLE_ATTRIBUTE, None)
    if handle is None:
        raise RuntimeError(f"{type(model).__name__} is not hybridized; call hybridize(model, mask) first")
    return handle
