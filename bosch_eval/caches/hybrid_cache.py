"""Deploy-mode KV cache: SWA groups keep only what their window needs.

Per layer of a hybridized model (transformers' ``Cache`` API, one layer object each):

* no SWA group: a plain ``DynamicLayer`` (every position, as the unpatched model);
* otherwise a :class:`HybridHeadLayer`: the full-attention KV groups keep every position,
  the SWA groups the positions the next query can still see
  (:meth:`~bosch_eval.attention.local_window.LocalWindow.retained`): the first ``S`` (sinks) and the
  last ``W − 1`` (with ``S = 0`` the same as transformers' ``DynamicSlidingWindowLayer``).

Bytes held = Σ_layers (G_full·T + G_swa·(min(T, S) + min(max(T − S, 0), W − 1))) × 2 (K and V)
× head_dim × dtype size.

Once the SWA part has dropped positions it is no longer contiguous: it hands the kernels
the sinks followed by the recent run ending at the last query. The dropped middle lies
outside every later query's window, so the band predicate on these indices is exact.

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

from bosch_eval.attention.hybrid_attention import HybridAttention, HybridStates, hybrid_state
from bosch_eval.attention.hybrid_spec import GroupRun, HybridSpec, LayerSplit
from bosch_eval.attention.local_window import LocalWindow
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
        # Full groups quantized outside the selector's full-precision set (none: no full group).
        self.quantized = QuantizedKVStore(kv_quant, selector) if kv_quant is not None and split.full and selector is not None else None

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.dtype, self.device = key_states.dtype, key_states.device
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any) -> tuple[HybridStates, HybridStates]:
        """Append ``[B, G, q, D]`` states; return what this step's queries attend to."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        self.cumulative_length += key_states.shape[-2]
        if self.quantized is not None:
            full_keys, full_values = self.quantized.update(_select(key_states, self.split.full), _select(value_states, self.split.full))
        else:
            full_keys = self.full_keys = _append(self.full_keys, _select(key_states, self.split.full))
            full_values = self.full_values = _append(self.full_values, _select(value_states, self.split.full))
        swa_keys, self.swa_keys = self._window(self.swa_keys, _select(key_states, self.split.swa))
        swa_values, self.swa_values = self._window(self.swa_values, _select(value_states, self.split.swa))
        return HybridStates(full_keys, swa_keys), HybridStates(full_values, swa_values)

    def _window(self, stored: torch.Tensor | None, new: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """What this step's SWA queries see, and what is kept for the next step.

        Kept: what the next query can see (:meth:`LocalWindow.retained`, counted over what
        this part holds, whose first S entries are the sinks). Without sinks the kept part
        is a view, copied when it would pin much more than it holds: the model's own states
        on the first step, every position after a long chunk. (A decode step drops one
        position; its view is kept, the next step's cat copies anyway.)
        """
        seen = new if stored is None else torch.cat([stored, new], dim=-2)
        sinks, recent_start = self.local.retained(seen.shape[2])
        if recent_start > sinks > 0:  # positions sinks … recent_start − 1 drop out
            return seen, torch.cat([seen[:, :, :sinks], seen[:, :, recent_start:]], dim=2)
        start = 0 if sinks else recent_start
        kept = seen[:, :, start:]
        return seen, kept.clone() if stored is None or start > kept.shape[2] else kept

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
