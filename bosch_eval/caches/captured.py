"""Decode steps a CUDA graph can capture: every shape fixed, every position a tensor.

A hybrid cache built with ``captured=True`` (``HybridCache.for_model(model, max_cache_len=N,
captured=True)``) runs its prompt as the eager cache does (chunks of any length, int
positions), then each one-token step the way transformers' ``StaticLayer`` does:

* the next position is a 0-d tensor per layer (:class:`CapturedPosition`), never a Python int
  that changes, so a compiled step has nothing to guard on or recompile for, and a captured
  CUDA graph replays it at every step;
* the full groups' keys and values are written with ``index_copy_`` into buffers of the
  cache's whole capacity, and attention reads the whole buffers: the model's mask spans the
  capacity (``get_mask_sizes``), hiding the positions not written yet;
* the SWA groups write slot ``S + t mod W`` of their ring and attend all ``S + W`` slots; the
  ring's mask is computed from the position tensor (:func:`ring_mask`), and a row still short
  of sinks takes the step's key as its next one in place (decode keys are real tokens, as the
  eager cache takes them).

Every buffer keeps its address (``torch._dynamo.mark_static_address``, set after each eager
step: a CUDA graph reads its inputs where it recorded them). ``max_cache_len`` holds prompt and
new tokens: a prompt past it is an error naming it, a decode step past it an index error (as on
transformers' static cache, whose steps cannot check an int without a sync either).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

import torch

from bosch_eval.attention.kernels.row_sinks import key_padding


class CapturedPosition:
    """The next position of one cache layer: a 0-d long tensor, advanced in place."""

    def __init__(self) -> None:
        self.next = torch.zeros((), dtype=torch.long)
        self.decoded = False  # a one-token step ran: the eager int counters no longer follow

    def place(self, device: torch.device, length: int) -> None:
        """After an eager step: ``length`` positions written (on the cache's device)."""
        if self.decoded:
            raise RuntimeError(
                "a captured hybrid cache takes its prompt (one or more chunks) and then one token a step; "
                "a chunk after a decode step needs the eager cache (HybridCache.for_model without captured=True)"
            )
        self.next = self.next.to(device)
        self.next.fill_(length)

    def advance(self) -> None:
        """After a decode step's writes (its attention then reads position ``next − 1``)."""
        self.decoded = True
        self.next.add_(1)


def mark_static(tensors: Iterable[torch.Tensor | None]) -> None:
    """Tell dynamo these tensors keep their address (a captured graph reads them in place);
    not while tracing, where dynamo cannot take it (as transformers' ``StaticLayer``)."""
    if torch.compiler.is_compiling():
        return
    for tensor in tensors:
        if tensor is not None:
            torch._dynamo.mark_static_address(tensor)


def ring_mask(
    attention_mask: torch.Tensor | None, step: torch.Tensor, sink_seen: torch.Tensor, window: int
) -> torch.Tensor:
    """``[B, S + W]`` the ring's slots a decode query at position ``step`` sees: the sink slots
    ``sink_seen [B, S]`` shows, then ring slot r, which holds position
    ``step − (step − r) mod W`` where that is ≥ 0 and a real token (from the model's mask over
    the capacity).

    Raises:
        RuntimeError: no mask: over a capacity buffer the positions not written yet must be hidden.
    """
    real = key_padding(attention_mask)
    if real is None:
        raise RuntimeError(
            "a captured decode step needs the model's attention mask over the cache's capacity; it got none"
        )
    slots = torch.arange(window, device=real.device)
    held = step - torch.remainder(step - slots, window)  # [W]
    ring = real.gather(1, held.clamp(min=0).expand(real.shape[0], -1)) & (held >= 0)
    return torch.cat([sink_seen.expand(real.shape[0], -1), ring], dim=1)


class CapturedRing(Protocol):
    def captured_mask(self, attention_mask: torch.Tensor | None, step: torch.Tensor) -> torch.Tensor: ...


class CapturedRingPart:
    """The SWA part of a captured decode step (the attention function's ``SwaPart``): every
    slot of the ring, masked by the ring's :func:`ring_mask`. ``position`` has been advanced
    past the step when the attention asks for the mask."""

    start = 1  # a decode step: the cache held its prompt before it (only chunks read this)

    def __init__(self, ring: CapturedRing, position: CapturedPosition) -> None:
        self.ring, self.position = ring, position

    def part_mask(self, attention_mask: torch.Tensor | None, q_len: int) -> torch.Tensor:
        return self.ring.captured_mask(attention_mask, self.position.next - 1)

    def settle(self, part_mask: torch.Tensor | None) -> None:
        """Nothing: the step took its sink in place before the attention (``SwaRing.write_captured``)."""


def bucketed_capacity(length: int) -> int:
    """A captured cache's capacity for runs of up to ``length`` positions, rounded up to one of
    four sizes per octave (``2^k · {1, 1.25, 1.5, 1.75}``, at most 25% spare): the capacity is
    the compiled step's shape, so the lengths a stream of requests brings share a few graphs."""
    if length < 1:
        raise ValueError(f"capacity: expected at least 1 position, got {length}")
    step = 1 << max(0, length.bit_length() - 3)  # a quarter of the octave [2^(b−1), 2^b)
    return -(-length // step) * step
