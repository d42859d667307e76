"""Baseline masks. Layer level (paper §3.4): whole layers become SWA, exactly ⌈ρL⌉ of them;
head level: :func:`random_masks`, ⌈ρ·L·G⌉ KV groups drawn at random.

A layer heuristic is ``(shape, ratio, seed) -> HeadMask`` (a SWA layer has all its KV groups
set to 0), one module of this package that registers it in :data:`LAYER_HEURISTICS` under its
``layers=`` name; a new one is a new module here (docs/extending.md), found when a name is
looked up or the names are listed. The paper's three, with ``n_full = L − ⌈ρL⌉``
full-attention layers:

* ``intr`` (:mod:`.intr`): full layers evenly interleaved;
* ``bme`` (:mod:`.bme`): full attention at the beginning, middle and end;
* ``rand`` (:mod:`.rand`): ``n_full`` layers drawn at random.

Their modules are imported first, in that order: the order the calibration check's panel
shows them in and the guarded search scores its incumbents in (the first of equal scores wins).
"""

from __future__ import annotations

import random
from collections.abc import Callable

from bosch_eval.masks.head_mask import HeadMask, ModelShape, ceil_count, check_ratio
from bosch_eval.runtime.errors import MaskError
from bosch_eval.runtime.registry import Registry

LayerHeuristic = Callable[[ModelShape, float, int], HeadMask]
LAYER_HEURISTICS: Registry[LayerHeuristic] = Registry(
    "layer heuristic", package=__name__, first=("intr", "bme", "rand"), field="layers", error=MaskError
)


def mask_with_full_layers(
    shape: ModelShape, full_layers: set[int], method: str, ratio: float, seed: int | None
) -> HeadMask:
    """The mask that keeps ``full_layers`` at full attention and makes every other layer SWA;
    its provenance names the heuristic, the ratio and the seed (None: a deterministic rule)."""
    swa = {
        (layer, g) for layer in range(shape.num_layers) if layer not in full_layers for g in range(shape.num_kv_heads)
    }
    provenance = {"heuristic": method, "ratio": ratio}
    if seed is not None:
        provenance["seed"] = seed
    return HeadMask.from_swa_groups(shape, swa, method=method, provenance=provenance)


def num_full_layers(shape: ModelShape, ratio: float) -> int:
    """``L − ⌈ρL⌉``: the layers a heuristic keeps at full attention."""
    return shape.num_layers - ceil_count(check_ratio(ratio), shape.num_layers)


def layer_heuristic_mask(name: str, shape: ModelShape, ratio: float, seed: int = 0) -> HeadMask:
    """Build the mask of the layer heuristic ``name`` (a name in :data:`LAYER_HEURISTICS`)."""
    return LAYER_HEURISTICS.lookup(name)(shape, ratio, seed)


def random_masks(shape: ModelShape, ratio: float, seeds: range, window: int) -> list[HeadMask]:
    """GQA-consistent random masks: ⌈ρ·L·G⌉ KV groups drawn uniformly per seed."""
    groups = [(layer, group) for layer in range(shape.num_layers) for group in range(shape.num_kv_heads)]
    count = ceil_count(ratio, len(groups))
    return [
        HeadMask.from_swa_groups(
            shape, set(random.Random(seed).sample(groups, count)), window=window, method=f"random:{seed}"
        )
        for seed in seeds
    ]
