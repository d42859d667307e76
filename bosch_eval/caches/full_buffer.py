"""The full-attention groups of one cache layer, preallocated and written in place.

Like transformers' ``StaticLayer``, keys and values live in ``[B, G, capacity, D]`` tensors
and each step writes its positions into them (no ``cat`` per step, which copies the whole
past every time). Unlike it, the capacity need not be known in advance: without one the
buffers start at the first chunk's length and double when a step would overflow them, so a
run of N steps reallocates O(log N) times. Attention gets views of the positions written
(``[:, :, :length]``), so the model's mask, built for ``length`` keys, lines up as on
transformers' ``DynamicCache``.

Positions are plain ints: this is the eager cache (a decode step writes one slice). The write
itself is left to the caller, which copies every part of a layer in one
``torch._foreach_copy_`` (one launch, one aten op, for the full and SWA parts' keys and values).
"""

from __future__ import annotations

from collections.abc import Callable

import torch


class FullBuffer:
    """Keys and values ``[B, G, capacity, D]`` of ``G`` full-attention groups; ``length``
    positions written.

    Args:
        capacity: positions to allocate up front (None: the first chunk's length, then doubling).
    """

    def __init__(self, capacity: int | None = None) -> None:
        self.capacity = capacity
        self.keys: torch.Tensor | None = None
        self.values: torch.Tensor | None = None
        self.length = 0

    def slots(self, keys: torch.Tensor, values: torch.Tensor, groups: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The ``[B, groups, q, D]`` views that a step's new states go to (allocating or
        growing first), shaped like ``keys``/``values`` ``[B, ·, q, D]``; :meth:`advance`
        once they are written."""
        end = self.length + keys.shape[2]
        if self.keys is None:
            size = max(end, self.capacity or 0)
            self.keys = keys.new_empty(keys.shape[0], groups, size, keys.shape[3])
            self.values = values.new_empty(values.shape[0], groups, size, values.shape[3])
        elif end > self.keys.shape[2]:
            self._grow(max(end, 2 * self.keys.shape[2]))
        return self.keys[:, :, self.length : end], self.values[:, :, self.length : end]

    def advance(self, count: int) -> None:
        self.length += count

    def held(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Views of every position written: ``[B, G, length, D]``."""
        return self.keys[:, :, : self.length], self.values[:, :, : self.length]

    def _grow(self, size: int) -> None:
        # Rare (a doubling): the one copy of the past that a dynamic cache makes every step.
        keys, values = self.keys, self.values
        self.keys = keys.new_empty(*keys.shape[:2], size, keys.shape[3])
        self.values = values.new_empty(*values.shape[:2], size, values.shape[3])
        self.keys[:, :, : self.length] = keys[:, :, : self.length]
        self.values[:, :, : self.length] = values[:, :, : self.length]

    def allocated_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.keys, self.values) if t is not None)

    def map_batch(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> None:
        """Apply a batch operation (beam reorder, repeat, select) to the buffers."""
        if self.keys is not None:
            self.keys, self.values = fn(self.keys), fn(self.values)

    def reset(self) -> None:
        self.keys = self.values = None
        self.length = 0
