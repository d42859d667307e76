"""INTR: full-attention layers evenly interleaved among SWA layers, each closing its stride:
layer ``⌊(i+1)·L/n_full⌋ − 1`` for ``i < n_full`` (as in local/global stacks that end on a
global layer)."""

from __future__ import annotations

from bosch_eval.masks.head_mask import HeadMask, ModelShape
from bosch_eval.masks.layer_heuristics import LAYER_HEURISTICS, mask_with_full_layers, num_full_layers


@LAYER_HEURISTICS.register("intr")
def intr_layers(shape: ModelShape, ratio: float, seed: int = 0) -> HeadMask:
    """INTR: full-attention layers evenly interleaved among SWA layers."""
    del seed  # deterministic
    n_layers, n_full = shape.num_layers, num_full_layers(shape, ratio)
    full = {(i + 1) * n_layers // n_full - 1 for i in range(n_full)}
    return mask_with_full_layers(shape, full, "intr", ratio, None)
