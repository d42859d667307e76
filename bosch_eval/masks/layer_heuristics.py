"""Baseline masks. Layer level (paper §3.4): whole layers become SWA, exactly ⌈ρL⌉ of them;
head level: :func:`random_masks`, ⌈ρ·L·G⌉ KV groups drawn at random.

Each builder is ``(shape, ratio, seed) -> HeadMask``; a SWA layer has all its KV groups
set to 0. With ``n_full = L − ⌈ρL⌉`` full-attention layers:

* ``rand``: ``n_full`` layers drawn uniformly at random (``random.Random(seed)``); the
  paper averages seeds 0, 1, 2.
* ``bme``: full attention at the beginning, middle and end. ``n_full`` is split into
  three near-equal parts (begin, middle, end; a remainder of one goes to the beginning,
  two to beginning and end); the begin part takes layers ``0…``, the end part ``…L−1``,
  the middle part is centred on layer ``L/2``.
* ``intr``: full layers evenly interleaved, each closing its stride: layer
  ``⌊(i+1)·L/n_full⌋ − 1`` for ``i < n_full`` (as in local/global stacks that end on a
  global layer).
"""

from __future__ import annotations

import random
from collections.abc import Callable

from bosch_eval.masks.head_mask import HeadMask, MaskError, ModelShape, ceil_count, check_ratio
from bosch_eval.runtime.registry import Registry

LayerHeuristic = Callable[[ModelShape, float, int], HeadMask]
# In registration order, the order the calibration check's panel shows them.
LAYER_HEURISTICS: Registry[LayerHeuristic] = Registry("layer heuristic", field="layers", error=MaskError)


def _mask_with_full_layers(shape: ModelShape, full_layers: set[int], method: str, ratio: float, seed: int | None) -> HeadMask:
    swa = {(layer, g) for layer in range(shape.num_layers) if layer not in full_layers for g in range(shape.num_kv_heads)}
    provenance = {"heuristic": method, "ratio": ratio}
    if seed is not None:
        provenance["seed"] = seed
    return HeadMask.from_swa_groups(shape, swa, method=method, provenance=provenance)


def _num_full_layers(shape: ModelShape, ratio: float) -> int:
    return shape.num_layers - ceil_count(check_ratio(ratio), shape.num_layers)


@LAYER_HEURISTICS.register("intr")
def intr_layers(shape: ModelShape, ratio: float, seed: int = 0) -> HeadMask:
    """INTR: full-attention layers evenly interleaved among SWA layers."""
    del seed  # deterministic
    n_layers, n_full = shape.num_layers, _num_full_layers(shape, ratio)
    full = {(i + 1) * n_layers // n_full - 1 for i in range(n_full)}
    return _mask_with_full_layers(shape, full, "intr", ratio, None)


@LAYER_HEURISTICS.register("bme")
def bme_layers(shape: ModelShape, ratio: float, seed: int = 0) -> HeadMask:
    """BME: keep full attention at the beginning, middle and end of the stack."""
    del seed  # deterministic
    n_layers, n_full = shape.num_layers, _num_full_layers(shape, ratio)
    base, extra = divmod(n_full, 3)
    begin, middle, end = base + (extra >= 1), base, base + (extra >= 2)
    full = set(range(begin)) | set(range(n_layers - end, n_layers))
    start = max(begin, min(n_layers - end - middle, n_layers // 2 - middle // 2))
    # Clamped so that the middle block never overlaps the begin or end block.
    full |= set(range(start, start + middle))
    return _mask_with_full_layers(shape, full, "bme", ratio, None)


@LAYER_HEURISTICS.register("rand")
def rand_layers(shape: ModelShape, ratio: float, seed: int = 0) -> HeadMask:
    """RAND: keep ``L − ⌈ρL⌉`` randomly drawn layers at full attention."""
    n_full = _num_full_layers(shape, ratio)
    full = set(random.Random(seed).sample(range(shape.num_layers), n_full))
    return _mask_with_full_layers(shape, full, "rand", ratio, seed)


def layer_heuristic_mask(name: str, shape: ModelShape, ratio: float, seed: int = 0) -> HeadMask:
    """Build the mask of the layer heuristic ``name`` (a name in :data:`LAYER_HEURISTICS`)."""
    return LAYER_HEURISTICS.lookup(name)(shape, ratio, seed)


def random_masks(shape: ModelShape, ratio: float, seeds: range, window: int) -> list[HeadMask]:
    """GQA-consistent random masks: ⌈ρ·L·G⌉ KV groups drawn uniformly per seed."""
    groups = [(layer, group) for layer in range(shape.num_layers) for group in range(shape.num_kv_heads)]
    count = ceil_count(ratio, len(groups))
    return [
        HeadMask.from_swa_groups(shape, set(random.Random(seed).sample(groups, count)), window=window, method=f"random:{seed}")
        for seed in seeds
    ]
