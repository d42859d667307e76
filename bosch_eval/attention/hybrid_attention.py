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

import functools
from typing import Any, NamedTuple, Protocol

import torch
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, flash_attention_mask, sdpa_mask

from bosch_eval.attention.hybrid_spec import GroupRun, HybridSpec, LayerSplit
from bosch_eval.attention.kernels import Backend
from bosch_eval.attention.kernels.row_sinks import key_padding
from bosch_eval.attention.local_window import LocalWindow
from bosch_eval.attention.restore_point import RestorePoint
from bosch_eval.masks.head_mask import HeadMask, MaskError, ModelShape
from bosch_eval.models.model_check import ModelError
from bosch_eval.runtime.errors import SettingsError

# The attention implementation registered with transformers, per mask format.
IMPLEMENTATIONS = {"sdpa": "bosch_sdpa", "flash": "bosch_flash_attention_2"}
SDPA_IMPLEMENTATION, FLASH_IMPLEMENTATION = IMPLEMENTATIONS["sdpa"], IMPLEMENTATIONS["flash"]

# The attribute by which the model and each of its attention modules reference the handle.
HANDLE_ATTRIBUTE = "bosch_hybrid"
# The config field save_pretrained writes the mask into (bosch_eval.models.checkpoint reads it).
CONFIG_FIELD = "bosch_mask"


class SwaPart(Protocol):
    """The SWA part of a deploy-mode cache layer, as the attention function sees it.

    Its keys are every position until it first drops some; after that, ``S`` sink slots
    (each row's first real tokens outside the recent run, gathered per row; ``sink_real``
    says which slots hold one) followed by the contiguous run of positions that ends at the
    last query.
    """

    sink_real: torch.Tensor | None  # [B, S] once slots exist, else None
    slots_final: bool  # every slot holds its row's sink: settle needs no key padding

    def settle(self, key_padding: torch.Tensor | None) -> None:
        """Keep only what later queries can see, after this step's attention; ``key_padding
        [B, K_swa]``: the part's real keys in its own order (None: every key real)."""


class HybridStates(NamedTuple):
    """Keys (or values) handed over by a deploy-mode cache layer (``bosch_eval.caches.hybrid_cache``):
    ``full [B, G_full, S, D]`` over every position and ``swa [B, G_swa, S_swa, D]``, what
    ``part`` holds (:class:`SwaPart`)."""

    full: torch.Tensor
    swa: torch.Tensor
    part: SwaPart


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
        self._spec = spec
        setattr(self.model.config, CONFIG_FIELD, spec.saved_mask())

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
        """The head partition of ``layer`` under the current spec."""
        return self.spec.layer_split(layer)

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
        self, module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attention_mask: torch.Tensor | None, **kwargs: Any
    ) -> torch.Tensor:
        """A layer of full and SWA groups in one call of the backend's whole-layer kernel."""
        swa_groups = [not bit for bit in self.spec.mask.bits[module.layer_idx]]
        local = self.layer_local(kwargs, query.shape[2], key.shape[2])
        layer = self.spec.kernels.layer
        return layer(module, query, key, value, attention_mask, local, swa_groups=swa_groups, **self._with_cache(kwargs))

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
        return _attend_cached_split(handle, split, module, query, key, value, attention_mask, **kwargs), None
    if not split.swa:
        # Bit-identical to the unpatched model: the very same kernel on the very same tensors.
        return handle.full_attention(module, query, key, value, attention_mask, **kwargs), None
    if not split.full:
        return handle.swa_attention(module, query, key, value, attention_mask, **kwargs), None
    if handle.kernels.layer is not None:  # the backend runs a mixed layer in one call
        return handle.mixed_layer(module, query, key, value, attention_mask, **kwargs), None
    out = query.new_empty(query.shape[0], query.shape[2], query.shape[1], value.shape[-1])
    for attend, runs in ((handle.full_attention, split.full), (handle.swa_attention, split.swa)):
        _attend_runs(attend, runs, split.group_size, module, query, key, value, attention_mask, out, kind_only=False, **kwargs)
    return out, None


def _attend_cached_split(
    handle: HybridAttention,
    split: LayerSplit,
    module: torch.nn.Module,
    query: torch.Tensor,
    key: HybridStates,
    value: HybridStates,
    attention_mask: torch.Tensor | None,
    **kwargs: Any,
) -> torch.Tensor:
    """Attention over a hybrid cache layer, whose full and SWA groups hold different spans
    (the cache checks that it was built for the current spec); then the cache's SWA part
    drops what no later query sees."""
    handle.layer_local(kwargs, query.shape[2], key.full.shape[2])  # refuses sinks past the model's own window
    part_padding = None
    if handle.sinks and not key.part.slots_final:
        part_padding = _part_padding(key_padding(attention_mask), key.part, key.swa.shape[2])
    swa_mask = _part_mask(attention_mask, key.part, key.swa.shape[2], query.shape[2])
    if query.shape[2] > 1 and handle.kernels.layer is not None and split.full:
        out = _prefill_in_one_call(handle, split, module, query, key, value, attention_mask, swa_mask, **kwargs)
        key.part.settle(part_padding)
        return out
    # One query (a decode step): the SWA part holds exactly the positions it sees (each
    # row's sinks and the last W, hybrid_cache keeps no more), so its attention is plain
    # attention over the part, by the backend's full kernel — no band mask, nothing of
    # length T, no new shape to compile per step.
    # Longer chunks: the kernels find each row's sinks in the part's mask (its sink slots' columns first).
    swa_attention = handle.full_attention if query.shape[2] == 1 else handle.swa_attention
    if not split.full:
        out = swa_attention(module, query, key.swa, value.swa, swa_mask, **kwargs)
        key.part.settle(part_padding)
        return out
    out = query.new_empty(query.shape[0], query.shape[2], query.shape[1], value.full.shape[-1])
    _attend_kind(handle.full_attention, split.full, split.group_size, module, query, key.full, value.full, attention_mask, out, **kwargs)
    _attend_kind(swa_attention, split.swa, split.group_size, module, query, key.swa, value.swa, swa_mask, out, **kwargs)
    key.part.settle(part_padding)
    return out


def _attend_kind(
    attend: Any,
    runs: tuple[GroupRun, ...],
    group_size: int,
    module: torch.nn.Module,
    query: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor | None,
    out: torch.Tensor,
    **kwargs: Any,
) -> None:
    """``attend`` on the query heads of one kind's groups, whose keys a cache holds side by side."""
    if len(runs) == 1:
        _attend_runs(attend, runs, group_size, module, query, keys, values, mask, out, kind_only=True, **kwargs)
    else:
        # One call on the query heads gathered, not one per run (a decode step is launch-bound on a GPU).
        heads = _head_index(runs, group_size, query.device)
        out[:, :, heads] = attend(module, query[:, heads], keys, values, mask, **kwargs)


def _prefill_in_one_call(
    handle: HybridAttention,
    split: LayerSplit,
    module: torch.nn.Module,
    query: torch.Tensor,
    key: HybridStates,
    value: HybridStates,
    attention_mask: torch.Tensor | None,
    swa_mask: torch.Tensor | None,
    **kwargs: Any,
) -> torch.Tensor:
    """A mixed layer's chunk on the cache by the backend's whole-layer kernel, with every query
    head and every group in each call, so the call has the same shapes in every layer of any
    mask (one compiled graph; a call on the SWA groups alone would have as many shapes as the
    mask has SWA counts).

    Until the SWA part drops positions both parts hold every position: the layer's keys,
    put together again, go through one call. After it, the full heads attend every position by
    the base kernel, and the SWA heads the part by one call over all groups, the full groups'
    slots left empty and their heads' outputs unused (W + S keys each: little beside a full head).
    """
    if key.part.sink_real is None and key.swa.shape[2] == key.full.shape[2]:
        return handle.mixed_layer(module, query, _all_groups(key, split), _all_groups(value, split), attention_mask, **kwargs)
    out = query.new_empty(query.shape[0], query.shape[2], query.shape[1], value.full.shape[-1])
    _attend_kind(handle.full_attention, split.full, split.group_size, module, query, key.full, value.full, attention_mask, out, **kwargs)
    empty_full = HybridStates(key.swa.new_zeros(key.swa.shape[0], len(split.full_groups), *key.swa.shape[2:]), key.swa, key.part)
    empty_values = HybridStates(value.swa.new_zeros(value.swa.shape[0], len(split.full_groups), *value.swa.shape[2:]), value.swa, value.part)
    windowed = handle.swa_attention(module, query, _all_groups(empty_full, split), _all_groups(empty_values, split), swa_mask, **kwargs)
    heads = _head_index(split.swa, split.group_size, query.device)
    out[:, :, heads] = windowed[:, :, heads]
    return out


def _all_groups(states: HybridStates, split: LayerSplit) -> torch.Tensor:
    """``[B, G, K, D]``: the full and SWA parts (of one length) in the layer's group order."""
    full, swa = states.full, states.swa
    merged = full.new_empty(full.shape[0], full.shape[1] + swa.shape[1], *full.shape[2:])
    merged[:, _group_index(split.full, full.device)] = full
    merged[:, _group_index(split.swa, full.device)] = swa
    return merged


@functools.lru_cache(maxsize=4096)
def _group_index(runs: tuple[GroupRun, ...], device: torch.device) -> torch.Tensor:
    """The groups of ``runs``, in order, as an index tensor on ``device`` (made once)."""
    return torch.tensor([group for run in runs for group in range(run.start, run.stop)], device=device)


@functools.lru_cache(maxsize=4096)
def _head_index(runs: tuple[GroupRun, ...], group_size: int, device: torch.device) -> torch.Tensor:
    """The query heads of ``runs``, in order, as an index tensor on ``device`` (made once)."""
    heads = [head for run in runs for head in range(run.start * group_size, run.stop * group_size)]
    return torch.tensor(heads, device=device)


def _part_padding(real: torch.Tensor | None, part: SwaPart, held: int) -> torch.Tensor | None:
    """The real keys of a cache's SWA part in its own order, from ``real [B, K]`` over every
    position: its sink slots' (``part.sink_real``) and the last positions' (None: no
    padding and no slot)."""
    if part.sink_real is None:
        return None if real is None else real[:, real.shape[1] - held :]
    slots = part.sink_real.shape[1]
    recent = real[:, real.shape[1] - (held - slots) :] if real is not None else part.sink_real.new_ones(part.sink_real.shape[0], held - slots)
    return torch.cat([part.sink_real, recent], dim=1)


def _part_mask(attention_mask: torch.Tensor | None, part: SwaPart, held: int, q_len: int) -> torch.Tensor | None:
    """The model's mask over a cache's SWA part: the columns of its last positions, after
    its sink slots' columns (each slot seen where it holds a real token: a sink precedes
    every query). O(held), whatever the mask's length. None where the model passed none and
    every slot holds a sink (a decode step without padding: no mask to build per step)."""
    sink_real = part.sink_real
    if sink_real is None or (attention_mask is None and part.slots_final):
        return attention_mask if attention_mask is None or attention_mask.shape[-1] == held else attention_mask[..., -held:]
    slots = sink_real.shape[1]
    if attention_mask is None:
        # transformers passes no mask only for one query without padding, which sees every key held.
        recent = sink_real.new_ones(sink_real.shape[0], 1, q_len, held - slots)
        return torch.cat([sink_real[:, None, None, :].expand(-1, 1, q_len, -1), recent], dim=-1)
    if attention_mask.dim() == 2:
        return torch.cat([sink_real.to(attention_mask.dtype), attention_mask[:, attention_mask.shape[1] - (held - slots) :]], dim=1)
    columns = sink_real[:, None, None, :].expand(-1, 1, attention_mask.shape[2], -1).to(attention_mask.dtype)
    if attention_mask.dtype != torch.bool:  # additive: 0 where allowed
        columns = torch.zeros_like(columns).masked_fill(~sink_real[:, None, None, :], torch.finfo(attention_mask.dtype).min)
    return torch.cat([columns, attention_mask[..., attention_mask.shape[-1] - (held - slots) :]], dim=-1)


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
        found = existing.spec
        existing.swap(spec)
        existing._next_block_exit = found
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
    model: Any, mask: HeadMask, window: int | None = None, backend: str = "auto", source: str = "mask", sinks: int | None = None
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

    Returns:
        The handle: swap masks on it (search mode), or leave it (``with``) to restore the model.

    Raises:
        MaskError: the mask does not fit the model, or no window is known.
        SettingsError: the backend cannot run on the model's device.
        ModelError: the model does not dispatch attention through transformers.
    """
    spec = HybridSpec.build(
        mask, window, sinks, backend, device=model.device, dtype=model.dtype,
        shape=ModelShape.from_config(model.config), model_name=_model_name(model), source=source,
    )  # fmt: skip
    return apply_spec(model, spec, source)


def hybrid_state(model: Any) -> HybridAttention:
    """The handle of a hybridized model (raises if the model is not hybridized)."""
    handle = getattr(model, HANDLE_ATTRIBUTE, None)
    if handle is None:
        raise RuntimeError(f"{type(model).__name__} is not hybridized; call hybridize(model, mask) first")
    return handle
