"""Deploy-mode KV cache: SWA groups keep only what their window needs, in preallocated buffers.

Per layer of a hybridized model (transformers' ``Cache`` API, one layer object each):

* no SWA group: a :class:`StaticFullLayer` (every position, written in place);
* otherwise a :class:`HybridHeadLayer`: the full-attention KV groups keep every position
  (:class:`~bosch_eval.caches.full_buffer.FullBuffer`), the SWA groups ``S`` sink slots (each
  row's first ``S`` real tokens) and a ring of ``W`` slots
  (:class:`~bosch_eval.caches.swa_ring.SwaRing`, which states the kernels' index convention on it).

Nothing is concatenated per decode step: a step writes its keys and values into the buffers
of every part of the layer with one ``torch._foreach_copy_`` (the groups of each kind are
contiguous slices where the model's heads are permuted by kind,
:mod:`bosch_eval.attention.head_order`; otherwise one slice per run of groups), and the
attention reads views. Full groups grow by doubling when no capacity is given
(``HybridCache.for_model(model, max_cache_len=...)`` allocates it up front).

Bytes held (what a later query can see) = Σ_layers (G_full·T + G_swa·(min(T, S) + min(max(T − S, 0),
W − 1))) × 2 (K and V) × head_dim × dtype size (:func:`kv_cache_bytes`); the buffers allocated
add the full groups' spare capacity and one ring slot per SWA group (:func:`allocated_bytes`).

A hybrid layer hands :class:`HybridStates` (full part, SWA part) to the attention
function instead of one ``[B, G, S, D]`` tensor, because the two parts have different
lengths; only the bosch attention function consumes them.

With a :class:`~bosch_eval.caches.kv_quant.config.KVQuantConfig` (LogQuant or KiVi), the
full-attention groups of every layer are stored quantized outside their full-precision
set (:mod:`bosch_eval.caches.kv_quant`; appended, not preallocated); SWA groups keep their
full-precision ring as above. One selector per cache decides the full-precision positions for all layers.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers.cache_utils import Cache, DynamicCache, DynamicLayer

from bosch_eval.attention.cached_attention import HybridStates
from bosch_eval.attention.hybrid_attention import HybridAttention, attention_modules, hybrid_state
from bosch_eval.attention.hybrid_spec import GroupRun, HybridSpec, LayerSplit
from bosch_eval.attention.local_window import LocalWindow
from bosch_eval.caches.batch_mapped import BatchMappedLayer
from bosch_eval.caches.captured import CapturedPosition, CapturedRingPart, mark_static
from bosch_eval.caches.full_buffer import FullBuffer
from bosch_eval.caches.kv_quant.config import KVQuantConfig
from bosch_eval.caches.kv_quant.layer import QuantizedFullLayer
from bosch_eval.caches.kv_quant.selection import Selector
from bosch_eval.caches.kv_quant.store import QuantizedKVStore
from bosch_eval.caches.swa_ring import SwaRing
from bosch_eval.runtime.errors import SettingsError


class StaticFullLayer(BatchMappedLayer):
    """A layer with every group full: every position, preallocated and written in place
    (transformers' ``StaticLayer`` idea, with int positions and growth for eager decoding;
    ``captured``: decode steps at a tensor position over the whole capacity,
    :mod:`bosch_eval.caches.captured`)."""

    def __init__(self, capacity: int | None = None, captured: bool = False) -> None:
        super().__init__()
        self.buffer = FullBuffer(capacity, fixed=captured)
        self.position = CapturedPosition() if captured else None
        self.is_compileable = captured

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        if self.position is not None and key_states.shape[2] == 1:
            return self._captured_step(key_states, value_states)
        torch._foreach_copy_(
            list(self.buffer.slots(key_states, value_states, key_states.shape[1])), [key_states, value_states]
        )
        self.buffer.advance(key_states.shape[2])
        # transformers' layer attributes, read as a DynamicLayer's: the positions held (views).
        self.keys, self.values = self.buffer.held()
        if self.position is not None:
            self.position.place(key_states.device, self.buffer.length)
            mark_static([self.buffer.keys, self.buffer.values, self.position.next])
        return self.keys, self.values

    def _captured_step(self, key_states: torch.Tensor, value_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.buffer.keys is None:  # a one-token prompt
            self.buffer.allocate(key_states, value_states, key_states.shape[1], self.buffer.capacity)
            self.position.place(key_states.device, 0)
        self.buffer.write_at(self.position.next, key_states, value_states)
        self.position.advance()
        self.keys, self.values = self.buffer.keys, self.buffer.values
        return self.keys, self.values

    def get_seq_length(self) -> int | torch.Tensor:
        # Captured: the position tensor, so a compiled step's RoPE positions are no int to guard on.
        return self.position.next if self.position is not None else self.buffer.length

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        if self.position is not None and query_length == 1:
            return self.buffer.capacity, 0  # a captured step attends the whole buffer
        return self.buffer.length + query_length, 0

    def stored_bytes(self) -> int:
        if self.keys is None:
            return 0
        per_position = (
            self.keys[:, :, 0].numel() * self.keys.element_size()
            + self.values[:, :, 0].numel() * self.values.element_size()
        )
        return per_position * int(self.get_seq_length())

    def allocated_bytes(self) -> int:
        return self.buffer.allocated_bytes()

    def reset(self) -> None:
        self.buffer.reset()
        self.keys = self.values = None
        self.is_initialized = False
        if self.position is not None:
            self.position = CapturedPosition()

    def map_batch(self, fn: Any) -> None:
        if self.buffer.keys is not None:
            self.buffer.map_batch(fn)
            self.keys, self.values = self.buffer.held()
            if self.position is not None:
                mark_static([self.buffer.keys, self.buffer.values])

    def crop(self, tokens_to_remove: int) -> None:
        raise RuntimeError("a hybrid KV cache cannot be cropped")


class HybridHeadLayer(BatchMappedLayer):
    """Cache layer holding every position for full groups and ``S + W`` slots for SWA groups."""

    is_croppable = False  # dropped SWA positions cannot be restored

    def __init__(
        self,
        split: LayerSplit,
        local: LocalWindow,
        kv_quant: KVQuantConfig | None = None,
        selector: Selector | None = None,
        capacity: int | None = None,
        captured: bool = False,
    ) -> None:
        super().__init__()
        self.split, self.local = split, local
        self.cumulative_length = 0
        self.full = FullBuffer(capacity, fixed=captured)
        self.ring = SwaRing(local)
        # Full groups quantized outside the selector's full-precision set (none: no full group).
        self.quantized = (
            QuantizedKVStore(kv_quant, selector)
            if kv_quant is not None and split.full and selector is not None
            else None
        )
        # captured: decode steps at a tensor position over fixed shapes (bosch_eval.caches.captured).
        self.position = CapturedPosition() if captured else None
        self.is_compileable = captured

    @property
    def sink_real(self) -> torch.Tensor | None:
        return self.ring.sink_real

    @property
    def slots_final(self) -> bool:
        return self.ring.slots_final

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[HybridStates, HybridStates]:
        """Write ``[B, G, q, D]`` states; return what this step's queries attend to (the SWA
        part as :meth:`SwaRing.stage` presents it)."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        if self.position is not None and key_states.shape[2] == 1:
            return self._captured_step(key_states, value_states)
        self.cumulative_length += key_states.shape[2]
        # One query: the ring is written before it is read, so the new states are not needed
        # apart (no copy of several runs); a chunk is put together with the ring's run first.
        new_keys, new_values = (
            (key_states, value_states)
            if key_states.shape[2] == 1
            else (_select(key_states, self.split.swa), _select(value_states, self.split.swa))
        )
        swa_keys, swa_values = self.ring.stage(new_keys, new_values, len(self.split.swa_groups))
        targets, sources = self._ring_writes(key_states, value_states)
        if self.quantized is not None:
            full_keys, full_values = self.quantized.update(
                _select(key_states, self.split.full), _select(value_states, self.split.full)
            )
        else:
            slot_keys, slot_values = self.full.slots(key_states, value_states, len(self.split.full_groups))
            for run in self.split.full:
                groups = slice(run.offset, run.offset + run.stop - run.start)
                targets += [slot_keys[:, groups], slot_values[:, groups]]
                sources += [key_states[:, run.start : run.stop], value_states[:, run.start : run.stop]]
        torch._foreach_copy_(targets, sources)  # every part's keys and values in one op
        if self.quantized is None:
            self.full.advance(key_states.shape[2])
            full_keys, full_values = self.full.held()
        if self.position is not None:
            self.position.place(key_states.device, self.cumulative_length)
            mark_static([self.full.keys, self.full.values, *self.ring.buffers(), self.position.next])
        return HybridStates(full_keys, swa_keys, self.ring), HybridStates(full_values, swa_values, self.ring)

    def _captured_step(self, key_states: torch.Tensor, value_states: torch.Tensor) -> tuple[HybridStates, HybridStates]:
        """One token at the position tensor: the full groups' buffers and the whole ring, every
        shape fixed (:mod:`bosch_eval.caches.captured`)."""
        if self.full.keys is None:  # a one-token prompt
            self.full.allocate(key_states, value_states, len(self.split.full_groups), self.full.capacity)
            self.ring.allocate(key_states, value_states, len(self.split.swa_groups))
            self.position.place(key_states.device, 0)
        step = self.position.next
        self.full.write_at(step, _select(key_states, self.split.full), _select(value_states, self.split.full))
        self.ring.write_captured(_select(key_states, self.split.swa), _select(value_states, self.split.swa), step)
        self.position.advance()
        part = CapturedRingPart(self.ring, self.position)
        return HybridStates(self.full.keys, self.ring.keys, part), HybridStates(
            self.full.values, self.ring.values, part
        )

    def _ring_writes(
        self, key_states: torch.Tensor, value_states: torch.Tensor
    ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """The ring's slots for the step's last positions, and the states that go there."""
        targets, sources = [], []
        for slots, steps in self.ring.targets():
            for run in self.split.swa:
                groups = slice(run.offset, run.offset + run.stop - run.start)
                targets += [self.ring.keys[:, groups, slots], self.ring.values[:, groups, slots]]
                sources += [key_states[:, run.start : run.stop, steps], value_states[:, run.start : run.stop, steps]]
        return targets, sources

    def get_seq_length(self) -> int | torch.Tensor:
        # Captured: the position tensor, so a compiled step's RoPE positions are no int to guard on.
        return self.position.next if self.position is not None else self.cumulative_length

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        if self.position is not None and query_length == 1:
            return self.full.capacity, 0  # a captured step attends the whole buffer
        # The mask spans every position (full groups); the SWA part picks its columns.
        return self.cumulative_length + query_length, 0

    def stored_bytes(self) -> int:
        """Bytes of the positions a later query can see (the formula's count)."""
        if not self.is_initialized:
            return 0
        seen = int(self.get_seq_length())
        if self.quantized is not None:
            full = sum(t.numel() * t.element_size() for t in self.quantized.tensors())
        else:
            keys, values = self.full.keys, self.full.values
            full = (
                keys[:, :, 0].numel() * keys.element_size() + values[:, :, 0].numel() * values.element_size()
            ) * seen
        return full + self.ring.held_bytes(seen)

    def allocated_bytes(self) -> int:
        quantized = (
            sum(t.numel() * t.element_size() for t in self.quantized.tensors()) if self.quantized is not None else 0
        )
        return self.full.allocated_bytes() + self.ring.allocated_bytes() + quantized

    def reset(self) -> None:
        self.full.reset()
        self.ring.reset()
        if self.quantized is not None:
            self.quantized.reset()
        self.cumulative_length = 0
        self.is_initialized = False
        if self.position is not None:
            self.position = CapturedPosition()

    def map_batch(self, fn: Any) -> None:
        if self.is_initialized:
            if self.quantized is not None:
                self.quantized.map_batch(fn)
            self.full.map_batch(fn)
            self.ring.map_batch(fn)
            if self.position is not None:
                mark_static([self.full.keys, self.full.values, *self.ring.buffers()])

    def crop(self, tokens_to_remove: int) -> None:
        raise RuntimeError("a hybrid KV cache cannot be cropped: its SWA groups no longer hold old positions")


class HybridCache(DynamicCache):
    """A ``DynamicCache`` whose layers follow one hybrid spec.

    It refuses to run under another spec: swapping the model's mask (or window, or sinks)
    changes what each layer must hold, so a cache built before the swap raises at its next
    update instead of handing the kernels the wrong positions.

    Attributes:
        spec: the spec the layers were built for.
    """

    def __init__(
        self, layers: list[DynamicLayer], spec: HybridSpec | None = None, handle: HybridAttention | None = None
    ) -> None:
        Cache.__init__(self, layers=layers)  # DynamicCache.__init__ would build its own layers
        self.spec, self._handle = spec, handle

    @classmethod
    def for_model(
        cls, model: Any, kv_quant: KVQuantConfig | None = None, max_cache_len: int | None = None, captured: bool = False
    ) -> HybridCache:
        """The cache of a hybridized ``model`` for its current spec (deploy mode keeps it fixed).

        Args:
            kv_quant: quantize the full-attention groups (LogQuant or KiVi); ``None``: keep
                them at full precision.
            max_cache_len: positions to allocate for the full groups up front (prompt and
                new tokens); None: the first chunk's length, doubled when outgrown.
            captured: decode steps a CUDA graph can capture (:mod:`bosch_eval.caches.captured`):
                needs ``max_cache_len`` (every position the run writes) and the sdpa mask
                format; the cache is then ``is_compileable``, so transformers' ``generate``
                compiles its decode steps on a GPU.

        Raises:
            SettingsError: ``captured`` without ``max_cache_len``, with KV quantization, with
                a backend whose mask is not the sdpa format (flash), or with sinks in a model
                that has its own sliding window.
        """
        handle = hybrid_state(model)
        spec = handle.spec
        if captured:
            _check_captured(model, kv_quant, max_cache_len)
        selector = Selector(kv_quant.method, kv_quant.window) if kv_quant is not None else None
        layers: list[DynamicLayer] = []
        for layer, bits in enumerate(spec.mask.bits):
            if not all(bits):
                layers.append(
                    HybridHeadLayer(handle.layer_split(layer), spec.local, kv_quant, selector, max_cache_len, captured)
                )
            elif kv_quant is not None:
                layers.append(QuantizedFullLayer(kv_quant, selector))
            else:
                layers.append(StaticFullLayer(max_cache_len, captured))
        return cls(layers, spec, handle)

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args: Any, **kwargs: Any
    ) -> Any:
        """Transformers' update, once the model is checked to run this cache's spec."""
        if self._handle is not None and (self._handle.restored or self._handle.spec is not self.spec):
            self._check_spec(self._handle)
        return super().update(key_states, value_states, layer_idx, *args, **kwargs)

    def _check_spec(self, handle: HybridAttention) -> None:
        current = handle.spec if not handle.restored else None
        if current is None or not current.same_layout(self.spec):
            raise RuntimeError(
                "the KV cache was built for another mask, window or sink count than the model runs now "
                f"({_describe(self.spec)}; the model: {_describe(current)}); build a new cache "
                "(HybridCache.for_model) after set_mask"
            )


def captured_refusal(model: Any, kv_quant: KVQuantConfig | None) -> str | None:
    """Why a hybridized ``model`` cannot decode on a captured cache (None: it can)."""
    spec = hybrid_state(model).spec
    if kv_quant is not None:
        return "KV quantization is not captured (its store grows and quantizes in steps of W)"
    if spec.kernels.mask_format != "sdpa":
        return f"the {spec.backend} backend takes the {spec.kernels.mask_format} mask format; a captured step needs the sdpa format's mask over the capacity"
    if spec.local.sinks and _own_sliding_window(model):
        # Whether the model's own window still shows a row's sinks depends on the position,
        # which a captured step holds in a tensor: the check (HybridAttention.layer_local) needs an int.
        return "sinks in a model with its own sliding window are checked against the position at every step; use the eager cache"
    return None


def _own_sliding_window(model: Any) -> bool:
    """Whether the model runs a sliding window of its own in some layer: the config's window
    (Mistral, Gemma) unless switched off (Qwen2/3's ``use_sliding_window``), or a module's."""
    config = model.config
    if getattr(config, "use_sliding_window", True) is False:
        return False
    return bool(getattr(config, "sliding_window", None)) or any(
        getattr(module, "sliding_window", None) for module in attention_modules(model).values()
    )


def _check_captured(model: Any, kv_quant: KVQuantConfig | None, max_cache_len: int | None) -> None:
    if max_cache_len is None:
        raise SettingsError("captured=True: give max_cache_len, every position the run writes (prompt and new tokens)")
    if (why := captured_refusal(model, kv_quant)) is not None:
        raise SettingsError(f"captured=True: {why}")


def _describe(spec: HybridSpec | None) -> str:
    if spec is None:
        return "restored to the original, no spec"
    return f"{spec.mask.num_swa_groups} SWA groups, window {spec.local.window}, {spec.local.sinks} sinks"


def _select(states: torch.Tensor, runs: tuple[GroupRun, ...]) -> torch.Tensor:
    """The groups of ``runs`` from ``[B, G, q, D]`` states: a view for none or one run, else one copy."""
    parts = [states[:, run.start : run.stop] for run in runs] or [states[:, :0]]
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)


def kv_cache_bytes(cache: Cache) -> int:
    """Bytes of the keys and values the cache holds for later queries (what the closed-form
    ``kv_cache_bytes_formula`` counts)."""
    total = 0
    for layer in cache.layers:
        if isinstance(layer, (HybridHeadLayer, QuantizedFullLayer, StaticFullLayer)):
            total += layer.stored_bytes()
        elif layer.is_initialized:
            total += layer.keys.numel() * layer.keys.element_size() + layer.values.numel() * layer.values.element_size()
    return total


def allocated_bytes(cache: Cache) -> int:
    """Bytes of the buffers the cache has allocated: :func:`kv_cache_bytes` plus the full
    groups' spare capacity and the rings' spare slot."""
    total = 0
    for layer in cache.layers:
        if isinstance(layer, (HybridHeadLayer, StaticFullLayer)):
            total += layer.allocated_bytes()
        elif isinstance(layer, QuantizedFullLayer):
            total += layer.stored_bytes()
        elif layer.is_initialized:
            total += layer.keys.numel() * layer.keys.element_size() + layer.values.numel() * layer.values.element_size()
    return total
