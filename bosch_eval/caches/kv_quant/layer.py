"""A transformers cache layer whose KV groups are all full attention, stored LogQuant/KiVi style."""

from __future__ import annotations

from typing import Any

import torch

from bosch_eval.caches.batch_mapped import BatchMappedLayer
from bosch_eval.caches.kv_quant.config import KVQuantConfig
from bosch_eval.caches.kv_quant.selection import Selector
from bosch_eval.caches.kv_quant.store import QuantizedKVStore


class QuantizedFullLayer(BatchMappedLayer):
    """Every KV group of the layer in one :class:`QuantizedKVStore`; attention sees plain
    ``[B, G, S, D]`` tensors, so any attention function works on it."""

    is_croppable = False  # quantized positions cannot be restored to full precision

    def __init__(self, config: KVQuantConfig, selector: Selector) -> None:
        super().__init__()
        self.store = QuantizedKVStore(config, selector)

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        return self.store.update(key_states, value_states)

    def get_seq_length(self) -> int:
        return self.store.seen

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.store.seen + query_length, 0

    def stored_bytes(self) -> int:
        return self.store.stored_bytes()

    def reset(self) -> None:
        self.store.reset()
        self.is_initialized = False

    def map_batch(self, fn: Any) -> None:
        self.store.map_batch(fn)

    def crop(self, tokens_to_remove: int) -> None:
        raise RuntimeError("a quantized KV cache cannot be cropped: quantized positions cannot be restored")
