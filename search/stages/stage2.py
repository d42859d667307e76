"""BOSCH Stage 2 (§2.2.2, Algorithm 2): per-layer SWA ratios from Stage 1's layer scores.

Stage 1 localizes layers from the top down and records, for every layer ``l``, the score
``s_best[l]`` of the model with layers ``l … L-1`` localized. Stage 2 turns the score each
layer cost into a weight ``w_l`` in [0, 1] (higher = harder to localize), ranks the layers
into buckets of coarse ratios (hardest → smallest ratio), and moves layers between adjacent
buckets until the number of SWA KV groups matches the budget ⌈ρ·L·G⌉. Stage 3 then converts
``r_l · G`` KV groups of each layer.

The paper's "heads" are KV groups here: under GQA only a whole group can switch to SWA.

Buckets and G. Algorithm 2 counts b·G groups for a layer at bucket b (lines 14 and 21) and
Algorithm 3 converts ⌈r_l·G⌉ (line 5), so a bucket means what the paper intends, a coarse
per-layer ratio that is the layer's quota in Stage 3 (§2.2.2), only when b·G is a whole
number. The paper's buckets (0, ¼, ½, ¾, 1) are whole for its models (G = 4 and 8) but not
for SmolLM2's G = 3: there ¾ and 1 would both convert ⌈2.25⌉ = ⌈3⌉ = 3 groups, and Stage 2
would balance a budget of 0.75·3 = 2.25 groups per layer that Stage 3 never spends. So by
default (``buckets=None``) a search uses the paper's buckets where they are whole numbers of
G's groups and otherwise every ratio G groups can realize, k/G for k = 0 … G (G = 3: 0, ⅓,
⅔, 1): each bucket a distinct quota, and Stage 2's count equal to Stage 3's. Buckets a user
names are used as given, and refused when they are not whole numbers of groups.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass


from bosch_eval.masks.head_mask import ceil_count, check_ratio
from bosch_eval.runtime.checks import is_int, is_number

DEFAULT_BUCKETS: tuple[float, ...] = (0.0, 0.25, 0.5, 0.75, 1.0)
DEFAULT_PERCENTILES: tuple[float, float] = (2.5, 97.5)

# Bucket × G must be a whole number of KV groups; 0.1 * 30 is 3.0000000000000004 in floats.
_COUNT_SLACK = 1e-9

log = logging.getLogger("bosch_eval.search")


def default_buckets(groups_per_layer: int) -> tuple[float, ...]:
    """Stage 2's buckets when the user names none: the paper's (0, ¼, ½, ¾, 1) where each is a
    whole number of ``groups_per_layer`` KV groups, else every ratio k/G (see the module docstring)."""
    if all(_whole(bucket * groups_per_layer) for bucket in DEFAULT_BUCKETS):
        return DEFAULT_BUCKETS
    return tuple(k / groups_per_layer for k in range(groups_per_layer + 1))


def _whole(groups: float) -> bool:
    return abs(groups - round(groups)) <= _COUNT_SLACK


@dataclass(frozen=True)
class Stage2Result:
    """Stage 2's outcome; every per-layer tuple runs from the bottom layer (0) to the top.

    Attributes:
        ratios: r_l, each one of the buckets; layer l gets ``round(r_l · G)`` SWA groups.
        buckets: the buckets the ratios were drawn from (given, or :func:`default_buckets`).
        weights: w_l in [0, 1]; lower means easier to localize.
        drops: d_l, the share of the full-attention score lost when layer l was localized
            on top of the layers above it (positive = the score fell).
        target_groups: M_target = ⌈ρ·L·G⌉, the KV groups the budget asks for.
        assigned_groups: Σ_l round(r_l · G), the KV groups the ratios convert. It equals
            ``target_groups`` unless no move between adjacent buckets fits the remaining gap.
    """

    ratios: tuple[float, ...]
    weights: tuple[float, ...]
    drops: tuple[float, ...]
    target_groups: int
    assigned_groups: int
    buckets: tuple[float, ...] = DEFAULT_BUCKETS

    def __post_init__(self) -> None:
        if not len(self.ratios) == len(self.weights) == len(self.drops):
            raise ValueError(
                f"Stage2Result: ratios, weights and drops must have one entry per layer, got "
                f"{len(self.ratios)}, {len(self.weights)} and {len(self.drops)}"
            )


def assign_layer_ratios(
    stage1_scores: Sequence[float],
    original_score: float,
    target_ratio: float,
    groups_per_layer: int,
    buckets: Sequence[float] | None = None,
    percentiles: tuple[float, float] = DEFAULT_PERCENTILES,
    higher_is_better: bool = True,
) -> Stage2Result:
    """Assign every layer an SWA ratio from ``buckets`` so that the total meets ρ (Algorithm 2).

    Decisions where Algorithm 2 as printed is ambiguous or does not do what §2.2.2 says:

    * **Direction.** As printed, δ_l = (s_best[l] − s_orig)/s_orig is negative for a drop and
      d_l = δ_l − δ_{l+1} is most negative for the layer whose localization hurt most; min-max
      scaling would then give that layer the *lowest* weight, i.e. call it the easiest, and
      the bucketing would give it the *largest* ratio. The prose says "lower w_l means easier
      to localize", so we use the drop d_l = δ_{l+1} − δ_l (δ_L = 0): the layer that cost the
      most score gets w = 1 and the smallest ratio.
    * **Clipping.** q_lo, q_hi are numpy's linear percentiles of {d_l}; if q_hi == q_lo
      (e.g. every layer cost the same, or L = 1) every weight is 0.
    * **Ties.** Layers are ordered hardest first by (−w_l, l): among equal weights the lower
      layer counts as harder. The same total order, reversed, is the "easy" order, so the
      bucketing and both directions of reconciliation agree.
    * **Bucketing.** The ordered layers are split into B = len(buckets) groups as
      ``numpy.array_split`` does (the first L mod B groups get one extra layer; groups are
      empty when L < B); group j gets bucket b_j, so the hardest layers get b_0.
    * **Counting.** A layer at bucket b converts round(b·G) KV groups, and b·G must be a whole
      number: buckets must be multiples of 1/G (for G = 2, e.g. (0, 0.5, 1)). Without
      ``buckets``, :func:`default_buckets` (the paper's, or k/G where they are not whole).
    * **Reconciliation.** While the gap Δ = M_target − M_now is not 0, one pass visits the
      layers easiest first (Δ > 0, raising each by one bucket) or hardest first (Δ < 0,
      lowering), and moves a layer only if its change in KV groups fits in |Δ|, so the
      total never crosses the target. The printed loop spins forever when no single move
      fits (e.g. G = 2, buckets (0, 1) and an odd target); we stop after a pass with no move
      and report ``assigned_groups != target_groups``.
    * **Layers at r = 0.** One raising pass visits every layer (lines 19–25 break only when
      Δ = 0), so a layer stays fully global only if the gap closes before the pass reaches
      it. At L = 8, ρ = 0.5 (Fig. 1, whose "-" rows are layers left all full or all SWA)
      the hardest layers stay at 0; at ρ = 0.75 on 32 layers × 8 groups with quarter
      buckets the gap after bucketing is 70 groups and the first pass lifts even the
      hardest layers to 0.25. The paper states no bucket values (Fig. 1 uses 0.25 and
      r ≥ 0.5) and no rule that protects a layer at 0, so this follows the printed loop.

    Args:
        stage1_scores: s_best per layer, bottom (layer 0) to top, as Algorithm 1 records them.
        original_score: s_orig, the full-attention model's score; must be positive.
        target_ratio: ρ, the share of the model's KV groups to convert to SWA.
        groups_per_layer: G, KV groups per layer.
        buckets: the coarse ratios b_0 < … < b_{B−1} in [0, 1]; None: :func:`default_buckets`.
        percentiles: (p_lo, p_hi) for clipping the drops, 0 ≤ p_lo < p_hi ≤ 100.
        higher_is_better: the direction of the scores (lm-eval's ``higher_is_better``).

    Raises:
        ValueError: naming the argument that cannot be used as given.
    """
    scores = _check_scores(stage1_scores)
    original = _check_original(original_score)
    ratio = check_ratio(target_ratio, "target_ratio")
    buckets = _resolve_buckets(buckets, groups_per_layer)
    counts = _bucket_counts(buckets, groups_per_layer)
    low, high = _check_percentiles(percentiles)

    drops = _layer_drops(scores, original)
    if not higher_is_better:
        drops = [-drop for drop in drops]
    weights = _weights(drops, low, high)
    hardest_first = sorted(range(len(scores)), key=lambda layer: (-weights[layer], layer))
    rank = _bucket_ranks(hardest_first, len(counts))
    target = ceil_count(ratio, len(scores) * groups_per_layer)
    assigned = _reconcile(rank, hardest_first, counts, target)
    return Stage2Result(
        ratios=tuple(float(buckets[bucket]) for bucket in rank),
        weights=tuple(weights),
        drops=tuple(drops),
        target_groups=target,
        assigned_groups=assigned,
        buckets=tuple(float(bucket) for bucket in buckets),
    )


def _check_original(original_score: float) -> float:
    """s_orig as a float: the relative drops divide by it, so it must be positive and finite."""
    if not is_number(original_score):
        raise ValueError(f"original_score: expected a number, got {original_score!r}")
    if not (math.isfinite(original_score) and original_score > 0):
        raise ValueError(
            f"original_score: the relative drop (s_best − s_orig) / s_orig is undefined unless the "
            f"full-attention score is a positive finite number, got {original_score!r}"
        )
    return float(original_score)


def _resolve_buckets(buckets: Sequence[float] | None, groups_per_layer: int) -> Sequence[float]:
    """The buckets given, or :func:`default_buckets` for G (saying so when they are not the paper's)."""
    if not is_int(groups_per_layer) or groups_per_layer < 1:
        raise ValueError(
            f"groups_per_layer: expected a positive integer (KV groups per layer), got {groups_per_layer!r}"
        )
    if buckets is not None:
        return buckets
    buckets = default_buckets(groups_per_layer)
    if buckets != DEFAULT_BUCKETS:
        log.info(
            "stage 2: the paper's buckets %s are not whole numbers of %d KV groups per layer; using every ratio "
            "%d groups can realize, %s",
            list(DEFAULT_BUCKETS), groups_per_layer, groups_per_layer, [round(b, 4) for b in buckets],
        )  # fmt: skip
    return buckets


def _bucket_ranks(hardest_first: list[int], bucket_count: int) -> list[int]:
    """Each layer's bucket: the layers, hardest first, split into ``bucket_count`` groups as
    ``numpy.array_split`` does (the first L mod B groups one layer longer)."""
    import numpy as np  # here, not at import: `bosch-eval search --help` must not load numpy

    rank = [0] * len(hardest_first)
    for bucket, members in enumerate(np.array_split(np.asarray(hardest_first, dtype=int), bucket_count)):
        for layer in members:
            rank[int(layer)] = bucket
    return rank


def cumulative_from_probes(probe_scores: Sequence[float], original_score: float) -> list[float]:
    """Stage-1 scores as Algorithm 2 reads them (cumulative, top layer first) whose drops are the
    one-layer probes' own: s_l = s_orig + Σ_{m ≥ l} (p_m − s_orig), so that d_l = δ_{l+1} − δ_l =
    (s_orig − p_l)/s_orig, the share of S(full) lost when layer l alone is SWA (the ``guarded``
    variant's Stage 1 when ⌈ρG⌉ = G, :func:`bosch_eval.search.stages.subproblems.stage1_probes`)."""
    scores = _check_scores(probe_scores)
    cumulative, running = [0.0] * len(scores), float(original_score)
    for layer in range(len(scores) - 1, -1, -1):
        running += scores[layer] - original_score
        cumulative[layer] = running
    return cumulative


def _layer_drops(scores: list[float], original: float) -> list[float]:
    """d_l = δ_{l+1} − δ_l with δ_l = (s_best[l] − s_orig)/s_orig and δ_L = 0 (positive = a drop)."""
    deltas = [(score - original) / original for score in scores] + [0.0]
    return [deltas[layer + 1] - deltas[layer] for layer in range(len(scores))]


def _weights(drops: list[float], low: float, high: float) -> list[float]:
    """Clip the drops to their [p_lo, p_hi] percentiles and scale them to [0, 1]."""
    import numpy as np

    q_lo, q_hi = (float(q) for q in np.percentile(np.asarray(drops), [low, high], method="linear"))
    if q_hi == q_lo:
        return [0.0] * len(drops)
    return [(min(max(drop, q_lo), q_hi) - q_lo) / (q_hi - q_lo) for drop in drops]


def _reconcile(rank: list[int], hardest_first: list[int], counts: list[int], target: int) -> int:
    """Move layers between adjacent buckets (``rank`` in place) towards ``target``; return the total.

    Each move changes the total by at most the remaining gap, so the total approaches the
    target from one side and never crosses it; a pass without a move ends the loop.
    """
    assigned = sum(counts[bucket] for bucket in rank)
    top = len(counts) - 1
    moved = True
    while assigned != target and moved:
        moved = False
        raising = assigned < target
        step = 1 if raising else -1
        for layer in reversed(hardest_first) if raising else hardest_first:
            bucket = rank[layer]
            if not 0 <= bucket + step <= top:
                continue
            change = counts[bucket + step] - counts[bucket]  # > 0 raising, < 0 lowering
            if abs(change) <= abs(target - assigned):
                rank[layer] = bucket + step
                assigned += change
                moved = True
                if assigned == target:
                    break
    return assigned


def _check_scores(stage1_scores: Sequence[float]) -> list[float]:
    if isinstance(stage1_scores, (str, bytes)) or not isinstance(stage1_scores, Sequence):
        raise ValueError(f"stage1_scores: expected a sequence of per-layer scores, got {type(stage1_scores).__name__}")
    if not stage1_scores:
        raise ValueError("stage1_scores: expected one Stage-1 score per layer, got an empty sequence")
    for layer, score in enumerate(stage1_scores):
        if not is_number(score) or not math.isfinite(score):
            raise ValueError(f"stage1_scores: entry {layer} is {score!r}, expected a finite number")
    return [float(score) for score in stage1_scores]


def _bucket_counts(buckets: Sequence[float], groups_per_layer: int) -> list[int]:
    """KV groups per layer at each bucket; buckets must rise strictly within [0, 1] in steps of 1/G."""
    if isinstance(buckets, (str, bytes)) or not isinstance(buckets, Sequence) or not buckets:
        raise ValueError(f"buckets: expected a non-empty sequence of ratios in [0, 1], got {buckets!r}")
    counts = []
    for index, bucket in enumerate(buckets):
        if not is_number(bucket) or not 0.0 <= bucket <= 1.0:
            raise ValueError(f"buckets: entry {index} is {bucket!r}, expected a ratio in [0, 1]")
        if index and bucket <= buckets[index - 1]:
            raise ValueError(f"buckets: expected strictly increasing ratios, got {list(buckets)}")
        groups = bucket * groups_per_layer
        if not _whole(groups):
            raise ValueError(
                f"buckets: {bucket!r} × {groups_per_layer} KV groups per layer = {groups:g} is not a whole "
                f"number of groups; use multiples of 1/{groups_per_layer}"
            )
        counts.append(round(groups))
    return counts


def _check_percentiles(percentiles: tuple[float, float]) -> tuple[float, float]:
    try:
        low, high = (float(p) for p in percentiles)
    except (TypeError, ValueError):
        raise ValueError(f"percentiles: expected two numbers (p_lo, p_hi), got {percentiles!r}") from None
    if not 0.0 <= low < high <= 100.0:
        raise ValueError(f"percentiles: expected 0 <= p_lo < p_hi <= 100, got {percentiles!r}")
    return low, high
