"""RAND: ``n_full`` layers drawn uniformly at random (``random.Random(seed)``); the paper
averages seeds 0, 1, 2."""

from __future__ import annotations

import random

from bosch_eval.masks.head_mask import HeadMask, ModelShape
from bosch_eval.masks.layer_heuristics import LAYER_HEURISTICS, mask_with_full_layers, num_full_layers


@LAYER_HEURISTICS.register("rand")
def rand_layers(shape: ModelShape, ratio: float, seed: int = 0) -> HeadMask:
    """RAND: keep ``L − ⌈ρL⌉`` randomly drawn layers at full attention."""
    n_full = num_full_layers(shape, ratio)
    full = set(random.Random(seed).sample(range(shape.num_layers), n_full))
    return mask_with_full_layers(shape, full, "rand", ratio, seed)
