"""The full-attention groups of one cache layer, preallocated and written in place.

Like transformers' ``StaticLayer``, keys and values live in ``[B, G, capacity, D]`` tensors
and each step writes its positions into them (no ``cat`` per step, which copies the whole
past every time). Unlike it, the capacity need not be known in advance: without one the
buffers start at the first chunk's length and double when a step would overflow them, so a
run of N steps reallocates O(log N) times. Attention gets views of the positions written
(``[:, :, :length]``), so the model's mask, built for ``length`` keys, lines up as on
transformers' ``DynamicCache``.

Positions are plain ints in the eager cache (a decode step writes one slice); a captured
decode step writes at a tensor position instead (:meth:`FullBuffer.write_at`). The write
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

    def __init__(self, capacity: int | None = None, fixed: bool = False) -> None:
        self.capacity = capacity
        self.fixed = (
            fixed  # never reallocated (a captured graph reads the buffers where it recorded them): needs a capacity
        )
        self.keys: torch.Tensor | None = None
        self.values: torch.Tensor | None = None
        self.length = 0

    def slots(self, keys: torch.Tensor, values: torch.Tensor, groups: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The ``[B, groups, q, D]`` views that a step's new states go to (allocating or
        growing first), shaped like ``keys``/``values`` ``[B, ·, q, D]``; :meth:`advance`
        once they are written."""
        end = self.length + keys.shape[2]
        if self.fixed and end > self.capacity:
            raise ValueError(
                f"max_cache_len={self.capacity}: a captured cache cannot hold {end} positions; build it with a larger max_cache_len"
            )
        if self.keys is None:
            self.allocate(keys, values, groups, max(end, self.capacity or 0))
        elif end > self.keys.shape[2]:
            self._grow(max(end, 2 * self.keys.shape[2]))
        return self.keys[:, :, self.length : end], self.values[:, :, self.length : end]

    def allocate(self, keys: torch.Tensor, values: torch.Tensor, groups: int, size: int) -> None:
        """Buffers of ``size`` positions for ``groups`` groups shaped like ``keys``/``values``;
        zeros where fixed: a captured step attends the whole buffer, its unwritten positions
        masked, and a NaN of uninitialized memory times a zero weight would still be NaN."""
        allocate = torch.zeros if self.fixed else torch.empty
        self.keys = allocate(keys.shape[0], groups, size, keys.shape[3], dtype=keys.dtype, device=keys.device)
        self.values = allocate(values.shape[0], groups, size, values.shape[3], dtype=values.dtype, device=values.device)

    def write_at(self, step: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> None:
        """A captured decode step (``bosch_eval.caches.captured``): one position's ``[B, G, 1, D]``
        states at ``step``, a 0-d tensor (``length`` does not move; the caller's position does)."""
        self.keys.index_copy_(2, step.view(1), keys)
        self.values.index_copy_(2, step.view(1), values)

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
