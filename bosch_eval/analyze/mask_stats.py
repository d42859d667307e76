"""Set statistics of head masks: overlap (paper §4.2, Fig. 2) and turnover (§4.3, Table 3).

SWA set of a mask: its (layer, KV group) pairs with bit 0.

* Jaccard similarity J(A, B) = |A ∩ B| / |A ∪ B| (1 for two empty sets); the paper plots
  the distance 1 − J.
* Turnover (§4.3): for one method at ρ_s < ρ_l, T = |S_s \\ S_l| / |S_s|, the share of the
  heads SWA at ρ_s that are full again at ρ_l. Nested masks (S_s ⊆ S_l) give T = 0; the most
  any pair of sizes allows is T_max = min(|S_s|, N − |S_l|) / |S_s| (N groups in all), and the
  normalized T̃ = T / T_max (the paper's example T_max(0.5, 0.75) = 0.5).
"""

from __future__ import annotations

from bosch_eval.masks.head_mask import HeadMask
from bosch_eval.runtime.errors import MaskError


def swa_set(mask: HeadMask) -> frozenset[tuple[int, int]]:
    """The (layer, group) pairs a mask runs with SWA."""
    return frozenset((layer, g) for layer, row in enumerate(mask.bits) for g, bit in enumerate(row) if bit == 0)


def jaccard(a: HeadMask, b: HeadMask) -> float:
    """Jaccard similarity of the SWA sets of two masks of one shape."""
    if a.shape != b.shape:
        raise MaskError(f"jaccard: masks of shapes {a.shape} and {b.shape} cannot be compared")
    sa, sb = swa_set(a), swa_set(b)
    union = sa | sb
    return 1.0 if not union else len(sa & sb) / len(union)


def turnover(small: HeadMask, large: HeadMask) -> tuple[float, float, float]:
    """``(T, T_max, T̃)`` from the mask at the smaller ratio to the one at the larger.

    Raises:
        MaskError: shapes differ, ``small`` has no SWA group, or it is not the smaller ratio.
    """
    if small.shape != large.shape:
        raise MaskError(f"turnover: masks of shapes {small.shape} and {large.shape} cannot be compared")
    s, big = swa_set(small), swa_set(large)
    if not s or len(s) > len(big):
        raise MaskError(f"turnover: expected 0 < SWA groups of the first mask ({len(s)}) <= the second's ({len(big)})")
    total = small.shape.num_layers * small.shape.num_kv_heads
    t = len(s - big) / len(s)
    t_max = min(len(s), total - len(big)) / len(s)
    return t, t_max, (t / t_max if t_max else 0.0)
