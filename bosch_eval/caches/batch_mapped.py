"""The batch operations of a transformers cache layer that keeps its tensors in stores of its own.

Beam search and batched generation reorder, repeat and select a cache's rows through
``reorder_cache``, ``batch_repeat_interleave`` and ``batch_select_indices``; a layer whose
keys and values live in buffers, rings or quantized stores (not ``DynamicLayer.keys``) applies
one function to every tensor it holds instead (:meth:`BatchMappedLayer.map_batch`).
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable

import torch
from transformers.cache_utils import DynamicLayer


class BatchMappedLayer(DynamicLayer):
    """A cache layer whose tensors live in its own stores: subclasses say how to apply a
    function to each of them along the batch (:meth:`map_batch`; transformers' layer base is an
    ``ABC``, so a subclass without it cannot be made)."""

    is_croppable = False  # what a store dropped or quantized cannot be restored

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.dtype, self.device = key_states.dtype, key_states.device
        self.is_initialized = True

    @abstractmethod
    def map_batch(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> None:
        """Replace every tensor the layer holds by ``fn`` of it (rows along dimension 0)."""

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        self.map_batch(lambda t: t.index_select(0, beam_idx.to(t.device)))

    def batch_repeat_interleave(self, repeats: int) -> None:
        self.map_batch(lambda t: t.repeat_interleave(repeats, dim=0))

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self.map_batch(lambda t: t[indices])
