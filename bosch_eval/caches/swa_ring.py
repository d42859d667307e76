"""The SWA groups of one cache layer: ``S`` sink slots and a ring of ``W`` slots, preallocated.

Keys and values live in ``[B, G_swa, S + W, D]`` tensors: slots ``0 … S − 1`` hold each row's
sinks (its first ``S`` real tokens, never padding), slots ``S … S + W − 1`` the ring, where
position ``j`` (a key index of the batch, shared by its rows) goes to slot ``S + j mod W``. A
step writes its positions in place; nothing grows and nothing is concatenated per decode step.
W ring slots, one more than the ``W − 1`` that :meth:`LocalWindow.retained` keeps, because a
step writes its own key before it attends: the ring then holds exactly the query's window.

What the kernels see (their index convention, ``bosch_eval.attention.local_window``: keys
``0 … K − 1``, queries the last T of them):

* a decode step (one query at position t): the buffers themselves, slots in slot order; plain
  attention over them (no band: they hold exactly what the query sees). Order is irrelevant
  there; a mask is needed only while some slot holds nothing the query sees (a sink not found
  yet, a sink still inside the ring, padding or an empty slot in the ring). Once every slot is
  seen (:attr:`steady`) the step passes no mask at all. Later decode keys are taken as real
  tokens, as transformers' ``generate`` and lm-eval always append them;
* a chunk of q > 1 queries: ``[sink slots | the ring's positions before the chunk, in order |
  the chunk]``, a copy made before the chunk overwrites the ring. The band predicate on these
  indices is exact: the ring's run ends right before the chunk, so index and position
  distances agree there, and every slot holds a sink, which every later query sees. A slot
  whose sink is still in the run is masked (the run shows it), so a row's first ``S`` real keys
  in this order are exactly its sinks, as the windowed kernels take them. The first chunk of
  an empty cache is the chunk alone.

The sinks are found after the step's attention (:meth:`SwaRing.settle`), from the part's mask:
which keys are real, only the model's mask shows. Rows still short of ``S`` real tokens take
their next real tokens as sinks, until every slot holds one (:attr:`slots_final`).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from bosch_eval.attention.kernels.row_sinks import gather_keys, key_padding
from bosch_eval.attention.local_window import LocalWindow, sink_indices
from bosch_eval.caches.captured import ring_mask


class SwaRing:
    """``[B, G, S + W, D]`` keys and values of a layer's SWA groups: sink slots, then the ring.

    Attributes:
        seen: positions written so far (the batch's key indices ``0 … seen − 1``).
        sink_real: ``[B, S]`` which slots hold a sink of their row.
        sink_pos: ``[B, S]`` the position each slot's sink came from.
        slots_final: every slot holds its row's sink (none is looked for any more).
        steady: a decode step sees every slot: it runs with no mask.
    """

    def __init__(self, local: LocalWindow) -> None:
        self.local = local
        self.keys: torch.Tensor | None = None
        self.values: torch.Tensor | None = None
        self.sink_real: torch.Tensor | None = None
        self.sink_pos: torch.Tensor | None = None
        self.reset()

    def reset(self) -> None:
        self.keys = self.values = self.sink_real = self.sink_pos = None
        self.seen = self.start = self.count = 0  # start, count: the current step's positions
        self.slots_final = self.steady = False
        # No step so far had padding: each row's sinks are positions 0 … S − 1 (known without a sync).
        self._sinks_leading = True
        self._unpadded = True  # the model passed no mask for the current step
        self._chunk: tuple[torch.Tensor, torch.Tensor] | None = None  # what a chunk attended
        self._chunk_slots = 0  # slot columns at the front of it

    # -- writing a step ----------------------------------------------------------------------
    def stage(self, keys: torch.Tensor, values: torch.Tensor, groups: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Begin a step of ``[B, groups, q, D]`` new states (for one query, any ``[B, ·, 1,
        D]`` states: only their shape is read); returns the part its queries attend to. The
        caller then writes the states to :meth:`targets`."""
        sinks, window = self.local.sinks, self.local.window
        if self.keys is None:
            self.allocate(keys, values, groups)
        self.start, self.count = self.seen, keys.shape[2]
        self.seen += self.count
        if self.count == 1:
            self._chunk = None
            held = sinks + min(self.seen, window)
            return self.keys[:, :, :held], self.values[:, :, :held]
        self.steady = False  # a chunk may bring padding into the ring
        self._chunk = self._chunk_part(keys, values)
        return self._chunk

    def allocate(self, keys: torch.Tensor, values: torch.Tensor, groups: int) -> None:
        """The buffers, for ``groups`` groups shaped like ``keys``/``values`` ``[B, ·, ·, D]``."""
        sinks, window = self.local.sinks, self.local.window
        shape = (keys.shape[0], groups, sinks + window)
        self.keys, self.values = keys.new_zeros(*shape, keys.shape[3]), values.new_zeros(*shape, values.shape[3])
        self.sink_real = torch.zeros(keys.shape[0], sinks, dtype=torch.bool, device=keys.device)
        self.sink_pos = torch.zeros(keys.shape[0], sinks, dtype=torch.long, device=keys.device)
        self.slots_final = sinks == 0

    def targets(self) -> list[tuple[slice, slice]]:
        """Where the step's states go: ``(ring slots, positions within the step)`` pairs, at
        most two (the ring wraps), for the step's last ``min(q, W)`` positions."""
        sinks, window, end = self.local.sinks, self.local.window, self.start + self.count
        pairs, position = [], max(self.start, end - window)
        while position < end:
            slot = position % window
            span = min(window - slot, end - position)
            pairs.append(
                (slice(sinks + slot, sinks + slot + span), slice(position - self.start, position - self.start + span))
            )
            position += span
        return pairs

    def _chunk_part(self, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``[slots | the ring's run before the chunk, in position order | chunk]`` (a copy),
        or the chunk alone on an empty cache."""
        if self.start == 0:
            self._chunk_slots = 0
            return keys, values
        sinks, window = self.local.sinks, self.local.window
        self._chunk_slots = sinks
        if self.start >= window:  # full ring: its oldest position sits at slot start mod W
            oldest = sinks + self.start % window
            order = [slice(0, sinks), slice(oldest, sinks + window), slice(sinks, oldest)]
        else:
            order = [slice(0, sinks + self.start)]
        return (
            torch.cat([self.keys[:, :, part] for part in order] + [keys], dim=2),
            torch.cat([self.values[:, :, part] for part in order] + [values], dim=2),
        )

    # -- the step's mask -----------------------------------------------------------------------
    def part_mask(self, attention_mask: torch.Tensor | None, q_len: int) -> torch.Tensor | None:
        """The model's mask (over every position) made into the mask of the part that
        :meth:`stage` returned."""
        # transformers passes no mask only where no key is padding (else the sinks must be searched).
        self._unpadded = attention_mask is None
        if q_len == 1:
            return self._decode_mask(attention_mask)
        run = min(self.start, self.local.window)
        held = self._chunk_slots + run + q_len
        if not self._chunk_slots:
            return (
                attention_mask
                if attention_mask is None or attention_mask.shape[-1] == held
                else attention_mask[..., -held:]
            )
        return slot_columns(self._slot_seen(self.start - run), attention_mask, held, q_len)

    def _slot_seen(self, lowest: int) -> torch.Tensor:
        """``[B, S]`` slots a query sees: a sink of their row that the part's positions from
        ``lowest`` on do not also show."""
        return self.sink_real & (self.sink_pos < lowest)

    def _decode_mask(self, attention_mask: torch.Tensor | None) -> torch.Tensor | None:
        if self.steady:
            return None
        sinks, window, position = self.local.sinks, self.local.window, self.start
        filled = min(self.seen, window)
        real = key_padding(attention_mask)
        if real is None and self._sinks_leading:
            # No padding: the ring is real and slot s holds position s, seen once the ring has
            # moved past it. Decided from ints: no sync, so a compiled step has no graph break.
            self.steady = self.slots_final and filled == window and position - window + 1 >= sinks
            return None if self.steady or not sinks else _like(self._seen(real, filled), attention_mask)
        seen = self._seen(real, filled)
        if self.slots_final and filled == window and bool(seen.all()):  # one sync per step until steady
            self.steady = True
            return None
        return _like(seen, attention_mask)

    def _seen(self, real: torch.Tensor | None, filled: int) -> torch.Tensor:
        """``[B, S + filled]`` the slots a decode query sees: sinks outside the ring, and the
        ring's slots that hold a real token (``real [B, K]``: the model's real keys; None: all)."""
        window, position, batch = self.local.window, self.start, self.keys.shape[0]
        # The position each ring slot holds: slot r the latest j ≤ t with j ≡ r (mod W).
        held = [r if position < window else position - (position - r) % window for r in range(filled)]
        ring = real[:, held] if real is not None else self.keys.new_ones(batch, filled, dtype=torch.bool)
        return torch.cat([self._slot_seen(position - window + 1).expand(batch, -1), ring.expand(batch, -1)], dim=1)

    # -- after the step's attention ------------------------------------------------------------
    def settle(self, part_mask: torch.Tensor | None) -> None:
        """Find the sinks the step brought (a row's first real tokens), now that its
        attention is done: ``part_mask`` is :meth:`part_mask`'s, which shows the real keys."""
        if not self.slots_final:
            padding = key_padding(part_mask)
            if self._chunk is not None:
                self._gather_sinks(padding)
            else:
                self._take_new_sink(padding)
            self._sinks_leading = self._sinks_leading and self._unpadded
            if self._sinks_leading:  # every row's sinks are positions 0 … S − 1
                self.slots_final = self.seen >= self.local.sinks
            else:
                self.slots_final = bool(self.sink_real.all())  # one sync per step until every row has its sinks
        self._chunk = None

    def _gather_sinks(self, padding: torch.Tensor | None) -> None:
        """A chunk: each row's first ``S`` real keys in the part's order into the slots."""
        keys, values = self._chunk
        index, found = (t.to(keys.device) for t in sink_indices(padding, self.local.sinks, keys.shape[2]))
        index, found = index.expand(keys.shape[0], -1), found.expand(keys.shape[0], -1)
        count, slots = index.shape[1], self._chunk_slots
        run_start = self.start - min(self.start, self.local.window)
        from_slots = self.sink_pos.gather(1, index.clamp(max=max(slots - 1, 0))) if slots else index
        positions = torch.where(index < slots, from_slots, run_start + index - slots)
        self.keys[:, :, :count] = gather_keys(keys, index)
        self.values[:, :, :count] = gather_keys(values, index)
        self.sink_pos[:, :count] = positions
        self.sink_real = torch.cat([found, found.new_zeros(found.shape[0], self.local.sinks - count)], dim=1)

    def _take_new_sink(self, padding: torch.Tensor | None) -> None:
        """A decode step: a row short of sinks takes its new key (if real) as the next one."""
        sinks, slot = self.local.sinks, self.local.sinks + self.start % self.local.window
        batch = self.keys.shape[0]
        real = padding[:, slot] if padding is not None else torch.ones(batch, dtype=torch.bool, device=self.keys.device)
        take = (torch.arange(sinks, device=self.keys.device) == self.sink_real.sum(-1, keepdim=True)) & real[:, None]
        chosen = take[:, None, :, None]
        self.keys[:, :, :sinks] = torch.where(chosen, self.keys[:, :, slot : slot + 1], self.keys[:, :, :sinks])
        self.values[:, :, :sinks] = torch.where(chosen, self.values[:, :, slot : slot + 1], self.values[:, :, :sinks])
        self.sink_pos = torch.where(take, self.start, self.sink_pos)
        self.sink_real = self.sink_real | take

    # -- a captured decode step (bosch_eval.caches.captured) ------------------------------------
    def write_captured(self, keys: torch.Tensor, values: torch.Tensor, step: torch.Tensor) -> None:
        """One token's ``[B, G, 1, D]`` states at position ``step`` (a 0-d tensor) into slot
        ``S + step mod W``, in place; a row still short of sinks takes them as its next sink.
        The int counters do not move (the cache's position tensor does)."""
        slot = (self.local.sinks + torch.remainder(step, self.local.window)).view(1)
        self.keys.index_copy_(2, slot, keys)
        self.values.index_copy_(2, slot, values)
        if not self.slots_final:  # decided by the prompt: the same in every step of a captured graph
            sinks = self.local.sinks
            take = torch.arange(sinks, device=keys.device) == self.sink_real.sum(
                -1, keepdim=True
            )  # [B, S]: each row's next empty slot
            chosen = take[:, None, :, None]
            self.keys[:, :, :sinks].copy_(torch.where(chosen, keys, self.keys[:, :, :sinks]))
            self.values[:, :, :sinks].copy_(torch.where(chosen, values, self.values[:, :, :sinks]))
            self.sink_pos.copy_(torch.where(take, step, self.sink_pos))
            self.sink_real.logical_or_(take)

    def captured_mask(self, attention_mask: torch.Tensor | None, step: torch.Tensor) -> torch.Tensor:
        """The mask of every slot for a decode query at position ``step``, in the model's format."""
        sink_seen = self.sink_real & (self.sink_pos < step - self.local.window + 1)  # sinks the ring no longer shows
        return _like(ring_mask(attention_mask, step, sink_seen, self.local.window), attention_mask)

    def buffers(self) -> tuple[torch.Tensor | None, ...]:
        """Every tensor a captured step reads or writes in place."""
        return self.keys, self.values, self.sink_real, self.sink_pos

    # -- bookkeeping ---------------------------------------------------------------------------
    def held_bytes(self, seen: int | None = None) -> int:
        """Bytes of the positions a later query can still see after ``seen`` positions
        (:meth:`LocalWindow.retained_count`; default the ring's own count, which a captured
        step does not move: the cache passes its position then)."""
        if self.keys is None:
            return 0
        per_position = (
            self.keys[:, :, 0].numel() * self.keys.element_size()
            + self.values[:, :, 0].numel() * self.values.element_size()
        )
        return per_position * self.local.retained_count(self.seen if seen is None else seen)

    def allocated_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.keys, self.values) if t is not None)

    def map_batch(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> None:
        """Apply a batch operation (beam reorder, repeat, select) to every per-row tensor."""
        if self.keys is not None:
            self.keys, self.values = fn(self.keys), fn(self.values)
            self.sink_real, self.sink_pos = fn(self.sink_real), fn(self.sink_pos)


def slot_columns(seen: torch.Tensor, attention_mask: torch.Tensor | None, held: int, q_len: int) -> torch.Tensor:
    """The part's mask: the slots' columns (``seen [B, S]``, every query alike: a sink
    precedes every query) before the model's mask's last ``held − S`` columns."""
    slots = seen.shape[1]
    if attention_mask is None:
        # transformers passes no mask only where nothing is padding: every key held is seen.
        recent = seen.new_ones(seen.shape[0], 1, q_len, held - slots)
        return torch.cat([seen[:, None, None, :].expand(-1, 1, q_len, -1), recent], dim=-1)
    if attention_mask.dim() == 2:
        return torch.cat(
            [seen.to(attention_mask.dtype), attention_mask[:, attention_mask.shape[1] - (held - slots) :]], dim=1
        )
    columns = _like(seen, attention_mask)[:, :, :1].expand(-1, 1, attention_mask.shape[2], -1)
    return torch.cat([columns, attention_mask[..., attention_mask.shape[-1] - (held - slots) :]], dim=-1)


def _like(seen: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
    """``seen [B, K]`` in the model's mask format: flash's ``[B, K]``, else ``[B, 1, 1, K]``,
    boolean or additive (0 where seen)."""
    if attention_mask is not None and attention_mask.dim() == 2:
        return seen.to(attention_mask.dtype)
    columns = seen[:, None, None, :]
    if attention_mask is None or attention_mask.dtype == torch.bool:
        return columns
    return torch.zeros(columns.shape, dtype=attention_mask.dtype, device=columns.device).masked_fill(
        ~columns, torch.finfo(attention_mask.dtype).min
    )
