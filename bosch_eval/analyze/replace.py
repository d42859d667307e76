"""Head replacement (paper Table 5): swap k of a mask's SWA groups for those a static ranking
would pick instead, and the reverse, at an unchanged SWA count."""

from __future__ import annotations

from bosch_eval.analyze.mask_stats import swa_set
from bosch_eval.masks.head_mask import HeadMask, HeadRanking
from bosch_eval.runtime.errors import MaskError


def _locality_order(ranking: HeadRanking) -> list[tuple[int, int]]:
    """Groups from most to least local by the ranking (ties by (layer, group), as to_mask)."""
    shape = ranking.shape
    cells = [(layer, g) for layer in range(shape.num_layers) for g in range(shape.num_kv_heads)]
    sign = -1.0 if ranking.more_local == "higher" else 1.0
    return sorted(cells, key=lambda c: (sign * ranking.scores[c[0]][c[1]], c))


def replace_heads(mask: HeadMask, ranking: HeadRanking, k: int) -> tuple[HeadMask, HeadMask]:
    """``(mask with k of the ranking's heads, ranking's mask with k of the mask's heads)``.

    Forward: the k SWA groups of ``mask`` the ranking finds least local and outside its own
    choice become full; the k groups of the ranking's choice it finds most local and outside
    ``mask`` become SWA. Reverse: the same with the roles swapped (the mask's heads taken in
    the ranking's order).

    Raises:
        MaskError: shapes differ, or the two choices differ in fewer than k groups.
    """
    if mask.shape != ranking.shape:
        raise MaskError(f"replace: mask shape {mask.shape} differs from ranking shape {ranking.shape}")
    order = _locality_order(ranking)
    ours = swa_set(mask)
    theirs = set(order[: len(ours)])
    only_ours = [c for c in order if c in ours and c not in theirs]  # most local first
    only_theirs = [c for c in order if c in theirs and c not in ours]
    if k < 0 or k > len(only_ours):
        raise MaskError(f"replace: k={k}, but the mask and the ranking differ in only {len(only_ours)} SWA groups")
    forward = (ours - set(only_ours[len(only_ours) - k :])) | set(only_theirs[:k])
    reverse = (theirs - set(only_theirs[len(only_theirs) - k :])) | set(only_ours[:k])
    # The variants keep the mask's calibration provenance: a score on that task stays in-sample.
    meta = {
        "window": mask.window,
        "model": mask.model,
        "provenance": {"calibration": mask.provenance.get("calibration"), "replaced": k},
    }
    return (
        HeadMask.from_swa_groups(mask.shape, forward, method=f"{mask.method}+{k}{ranking.method}", **meta),
        HeadMask.from_swa_groups(mask.shape, reverse, method=f"{ranking.method}+{k}{mask.method}", **meta),
    )
