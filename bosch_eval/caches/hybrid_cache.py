"""Deploy-mode KV cache: SWA groups keep only what their window needs.

Per layer of a hybridized model (transformers' ``Cache`` API, one layer object each):

* no SWA group: a plain ``DynamicLayer`` (every position, as the unpatched model);
* otherwise a :class:`HybridHeadLayer`: the full-attention KV groups keep every position,
  the SWA groups the positions the next query can still see
  (:meth:`~bosch_eval.attention.local_window.LocalWindow.retained`): each row's sinks (its
  first ``S`` real tokens) and the last ``W − 1`` positions (with ``S = 0`` the same as
  transformers' ``DynamicSlidingWindowLayer``).

Bytes held = Σ_layers (G_full·T + G_swa·(min(T, S) + min(max(T − S, 0), W − 1))) × 2 (K and V)
× head_dim × dtype size.

Once the SWA part has dropped positions it is no longer contiguous: it hands the kernels
``S`` sink slots followed by the recent run ending at the last query. Under left padding a
row's sinks sit at its own positions, so the slots are gathered per row, and a slot that
holds no sink of its row (the row has fewer real tokens, or the sink is in the recent run)
is masked (``sink_real``). The kernels find each row's sinks as its first ``S`` real keys in
this order, which are exactly its sinks; the dropped middle lies outside every later query's
window, and no slot is within ``W`` of a query, so the band predicate on these indices is
exact. Which keys are real comes from the model's mask, which the attention function reads:
it hands it back (:meth:`HybridHeadLayer.settle`) once the step's attention is done, and only
then are positions dropped.

A hybrid layer hands :class:`HybridStates` (full part, SWA part) to the attention
function instead of one ``[B, G, S, D]`` tensor, because the two parts have different
lengths; only the bosch attention function consumes them.

With a :class:`~bosch_eval.caches.kv_quant.config.KVQuantConfig` (LogQuant or KiVi), the
full-attention groups of every layer are stored quantized outside their full-precision
set (:mod:`bosch_eval.caches.kv_quant`); SWA groups keep their full-precision window as above.
One selector per cache decides the full-precision positions for all layers.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers.cache_utils import Cache, DynamicCache, DynamicLayer

from bosch_eval.attention.cached_attention import HybridStates
from bosch_eval.attention.hybrid_attention import HybridAttention, hybrid_state
from bosch_eval.attention.hybrid_spec import GroupRun, HybridSpec, LayerSplit
from bosch_eval.attention.kernels.row_sinks import gather_keys
from bosch_eval.attention.local_window import LocalWindow, sink_indices
from bosch_eval.caches.kv_quant.config import KVQuantConfig
from bosch_eval.caches.kv_quant.layer import QuantizedFullLayer
from bosch_eval.caches.kv_quant.selection import Selector
from bosch_eval.caches.kv_quant.store import QuantizedKVStore


class HybridHeadLayer(DynamicLayer):
    """Cache layer holding every position for full groups and ``S + W − 1`` for SWA groups."""

    is_croppable = False  # dropped SWA positions cannot be restored

    def __init__(self, split: LayerSplit, local: LocalWindow, kv_quant: KVQuantConfig | None = None, selector: Selector | None = None) -> None:
        super().__init__()
        self.split, self.local = split, local
        self.cumulative_length = 0
        self.full_keys = self.full_values = self.swa_keys = self.swa_values = None
        # [B, S] once the SWA part has sink slots: which hold a sink of their row.
        self.sink_real: torch.Tensor | None = None
        # Every slot holds its row's sink: no later position can be one, and the slots stay as
        # they are (a decode step then drops one position, with no search for sinks).
        self.slots_final = False
        # The SWA part still holds a view of the model's states (the first step's): copy what is kept.
        self._swa_is_view = False
        # Full groups quantized outside the selector's full-precision set (none: no full group).
        self.quantized = QuantizedKVStore(kv_quant, selector) if kv_quant is not None and split.full and selector is not None else None

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.dtype, self.device = key_states.dtype, key_states.device
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any) -> tuple[HybridStates, HybridStates]:
        """Append ``[B, G, q, D]`` states; return what this step's queries attend to. The SWA
        part keeps every position until :meth:`settle`."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        self.cumulative_length += key_states.shape[-2]
        if self.quantized is not None:
            full_keys, full_values = self.quantized.update(_select(key_states, self.split.full), _select(value_states, self.split.full))
        else:
            full_keys = self.full_keys = _append(self.full_keys, _select(key_states, self.split.full))
            full_values = self.full_values = _append(self.full_values, _select(value_states, self.split.full))
        new_keys, new_values = _select(key_states, self.split.swa), _select(value_states, self.split.swa)
        self._swa_is_view = self.swa_keys is None
        self.swa_keys = new_keys if self.swa_keys is None else torch.cat([self.swa_keys, new_keys], dim=-2)
        self.swa_values = new_values if self.swa_values is None else torch.cat([self.swa_values, new_values], dim=-2)
        return HybridStates(full_keys, self.swa_keys, self), HybridStates(full_values, self.swa_values, self)

    def settle(self, key_padding: torch.Tensor | None) -> None:
        """Keep what the next query can see (:meth:`LocalWindow.retained`): the last ``W − 1``
        positions and, with sinks, each row's sinks outside them in ``S`` slots.

        Args:
            key_padding: ``[B, held]`` the SWA part's real keys in its own order (sink slots,
                then positions), from the attention function; None: every key real.

        Without sinks the kept part is a view, copied when it would pin much more than it
        holds: the model's own states on the first step, every position after a long chunk.
        (A decode step drops one position; its view is kept, the next step's cat copies anyway.)
        """
        held, recent = self.swa_keys.shape[2], self.local.window - 1
        slots = self.local.sinks
        if held <= slots + recent:  # nothing to drop yet
            if self._swa_is_view:
                self.swa_keys, self.swa_values = self.swa_keys.clone(), self.swa_values.clone()
            self._swa_is_view = False
            return
        start = held - recent
        if not slots:
            kept_keys, kept_values = self.swa_keys[:, :, start:], self.swa_values[:, :, start:]
            copy = self._swa_is_view or start > recent
            self.swa_keys, self.swa_values = (kept_keys.clone(), kept_values.clone()) if copy else (kept_keys, kept_values)
        elif self.slots_final:
            self.swa_keys = torch.cat([self.swa_keys[:, :, :slots], self.swa_keys[:, :, start:]], dim=2)
            self.swa_values = torch.cat([self.swa_values[:, :, :slots], self.swa_values[:, :, start:]], dim=2)
        else:
            # Each row's first S real keys, in the part's order, are its sinks; those in the
            # recent run stay there, so their slots hold nothing.
            index, found = (t.to(self.swa_keys.device) for t in sink_indices(key_padding, slots, held))
            self.sink_real = (found & (index < start)).expand(self.swa_keys.shape[0], -1).contiguous()
            self.slots_final = bool(self.sink_real.all())  # one device sync, until the slots are final
            self.swa_keys = torch.cat([gather_keys(self.swa_keys, index), self.swa_keys[:, :, start:]], dim=2)
            self.swa_values = torch.cat([gather_keys(self.swa_values, index), self.swa_values[:, :, start:]], dim=2)
        self._swa_is_view = False

    def get_seq_length(self) -> int:
        return self.cumulative_length

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        # The mask spans every position (full groups); SWA groups use its last columns.
        return self.cumulative_length + query_length, 0

    def stored_bytes(self) -> int:
        if not self.is_initialized:
            return 0
        tensors = [t for t in (self.full_keys, self.full_values, self.swa_keys, self.swa_values) if t is not None]
        if self.quantized is not None:
            tensors += self.quantized.tensors()
        return sum(t.numel() * t.element_size() for t in tensors)

    def reset(self) -> None:
        self.full_keys = self.full_values = self.swa_keys = self.swa_values = None
        self.sink_real, self.slots_final = None, False
        if self.quantized is not None:
            self.quantized.reset()
        self.cumulative_length = 0
        self.is_initialized = False

    def _map(self, fn: Any) -> None:
        if self.is_initialized:
            if self.quantized is not None:
                self.quantized.map_batch(fn)
            else:
                self.full_keys, self.full_values = fn(self.full_keys), fn(self.full_values)
            self.swa_keys, self.swa_values = fn(self.swa_keys), fn(self.swa_values)
            if self.sink_real is not None:
                self.sink_real = fn(self.sink_real)

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        self._map(lambda t: t.index_select(0, beam_idx.to(t.device)))

    def batch_repeat_interleave(self, repeats: int) -> None:
        self._map(lambda t: t.repeat_interleave(repeats, dim=0))

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self._map(lambda t: t[indices])

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

    def __init__(self, layers: list[DynamicLayer], spec: HybridSpec | None = None, handle: HybridAttention | None = None) -> None:
        Cache.__init__(self, layers=layers)  # DynamicCache.__init__ would build its own layers
        self.spec, self._handle = spec, handle

    @classmethod
    def for_model(cls, model: Any, kv_quant: KVQuantConfig | None = None) -> HybridCache:
        """The cache of a hybridized ``model`` for its current spec (deploy mode keeps it fixed).

        Args:
            kv_quant: quantize the full-attention groups (LogQuant or KiVi); ``None``: keep
                them at full precision.
        """
        handle = hybrid_state(model)
        spec = handle.spec
        selector = Selector(kv_quant.method, kv_quant.window) if kv_quant is not None else None
        layers: list[DynamicLayer] = []
        for layer, bits in enumerate(spec.mask.bits):
            if not all(bits):
                layers.append(HybridHeadLayer(spec.layer_split(layer), spec.local, kv_quant, selector))
            elif kv_quant is not None:
                layers.append(QuantizedFullLayer(kv_quant, selector))
            else:
                layers.append(DynamicLayer())
        return cls(layers, spec, handle)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args: Any, **kwargs: Any) -> Any:
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


def _describe(spec: HybridSpec | None) -> str:
    if spec is None:
        return "restored to the original, no spec"
    return f"{spec.mask.num_swa_groups} SWA groups, window {spec.local.window}, {spec.local.sinks} sinks"


def _select(states: torch.Tensor, runs: tuple[GroupRun, ...]) -> torch.Tensor:
    """The groups of ``runs`` from ``[B, G, q, D]`` states: a view for none or one run, else one copy."""
    parts = [states[:, run.start : run.stop] for run in runs] or [states[:, :0]]
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)


def _append(stored: torch.Tensor | None, new: torch.Tensor) -> torch.Tensor:
    """``stored`` followed by ``new`` along positions, in memory of its own (``new`` may be a
    view of the model's states, which also hold the SWA groups)."""
    return new.clone() if stored is None else torch.cat([stored, new], dim=-2)


def kv_cache_bytes(cache: Cache) -> int:
    """Bytes of keys and values the cache holds right now."""
    total = 0
    for layer in cache.layers:
        if isinstance(layer, (HybridHeadLayer, QuantizedFullLayer)):
            total += layer.stored_bytes()
        elif layer.is_initialized:
            total += layer.keys.numel() * layer.keys.element_size() + layer.values.numel() * layer.values.element_size()
    return total
