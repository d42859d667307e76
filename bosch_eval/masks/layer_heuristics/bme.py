"""BME: full attention at the beginning, middle and end. ``n_full`` is split into three
near-equal parts (begin, middle, end; a remainder of one goes to the beginning, two to
beginning and end); the begin part takes layers ``0…``, the end part ``…L−1``, the middle
part is centred on layer ``L/2``."""

from __future__ import annotations

from bosch_eval.masks.head_mask import HeadMask, ModelShape
from bosch_eval.masks.layer_heuristics import LAYER_HEURISTICS, mask_with_full_layers, num_full_layers


@LAYER_HEURISTICS.register("bme")
def bme_layers(shape: ModelShape, ratio: float, seed: int = 0) -> HeadMask:
    """BME: keep full attention at the beginning, middle and end of the stack."""
    del seed  # deterministic
    n_layers, n_full = shape.num_layers, num_full_layers(shape, ratio)
    base, extra = divmod(n_full, 3)
    begin, middle, end = base + (extra >= 1), base, base + (extra >= 2)
    full = set(range(begin)) | set(range(n_layers - end, n_layers))
    start = max(begin, min(n_layers - end - middle, n_layers // 2 - middle // 2))
    # Clamped so that the middle block never overlaps the begin or end block.
    full |= set(range(start, start + middle))
    return mask_with_full_layers(shape, full, "bme", ratio, None)
