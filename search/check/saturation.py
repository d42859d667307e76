"""Does the calibration set saturate? The cheap part of ``calib-check``, read off a search's own scores.

Two places: Stage 1 (below), and the top, where many masks of the found mask's SWA ratio
reach its score (:func:`top_ties`).

Stage 1 converts each layer's share ρ of KV groups to SWA, one layer at a time with the
rest of the model full, and keeps the best score ``s_best`` per layer. Stage 2 then spreads
the SWA budget by the drops ``S(full) − s_best``. When most layers lose nothing, Stage 2
has no drops to order them by and Stage 3's sub-problems end on plateaus of equal scores:
the calibration set cannot tell the search which heads a held-out task needs (issue 29;
on toy-l at ρ ≤ 0.75 six of eight layers lost nothing on ``bosch_niah_calib``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from bosch_eval.masks.head_mask import HeadMask
from bosch_eval.search.journal.store import mask_key, read_records

SATURATED_LAYER_SHARE = 0.5


@dataclass(frozen=True)
class Stage1Saturation:
    """Layers whose Stage-1 best reaches S(full), out of ``num_layers``."""

    no_drop_layers: tuple[int, ...]
    num_layers: int

    @property
    def saturated(self) -> bool:
        return len(self.no_drop_layers) >= SATURATED_LAYER_SHARE * self.num_layers

    def message(self) -> str:
        layers = ", ".join(map(str, self.no_drop_layers)) or "none"
        head = f"{len(self.no_drop_layers)} of {self.num_layers} layers lose nothing in Stage 1 (layers {layers})"
        if not self.saturated:
            return head
        return (
            f"{head}: the calibration set is saturated at this ratio, so Stage 2 cannot order those layers "
            "and Stage 3 will choose among equal scores; check it with `bosch-eval calib-check` before trusting the mask"
        )


def stage1_saturation(
    stage1_scores: Sequence[float], all_full: float, higher_is_better: bool = True
) -> Stage1Saturation:
    """Which layers' Stage-1 best is at least as good as S(full) (in the metric's direction)."""
    no_drop = tuple(
        layer
        for layer, score in enumerate(stage1_scores)
        if (score >= all_full if higher_is_better else score <= all_full)
    )
    return Stage1Saturation(no_drop, len(stage1_scores))


@dataclass(frozen=True)
class TopTies:
    """Masks the calibration set cannot tell from the one a search returns.

    Attributes:
        keys: other distinct masks with as many SWA groups and the same S, scored to the end
            (journal keys, sorted: the same order however often the search was resumed).
        may_tie: masks racing stopped early whose bound equals that S: they could at best tie,
            so how many of them do is not known.
    """

    keys: tuple[str, ...]
    may_tie: int

    @property
    def scored(self) -> int:
        return len(self.keys)

    def message(self) -> str:
        head = f"{self.scored} other mask(s) with as many SWA groups reach the same S"
        if self.may_tie:
            head += f" (and {self.may_tie} stopped early by racing could at best tie)"
        if not self.scored:
            return head
        return (
            f"{head}: the calibration set cannot tell them apart and the search returns the first it met; "
            "a held-out task may not score them alike. Check the calibration set with `bosch-eval calib-check`; "
            "the default metric (`acc_tiebreak`) orders equal accuracies, and tasks that score the tied masks "
            "(`--tie-break-tasks`) are a choice for a development split"
        )


def top_ties(scores: Mapping[str, float], bounds: Mapping[str, float], found_key: str, found_score: float) -> TopTies:
    """How many masks tie with ``found_key``: the same number of SWA groups (so the same ratio
    penalty) and exactly its S. ``scores`` and ``bounds`` are keyed by ``journal.mask_key``
    (a 0 is an SWA group); S values are averages over the same examples, so equal means equal."""
    swa_groups = found_key.count("0")

    def same_ratio(key: str) -> bool:
        return key != found_key and key.count("0") == swa_groups

    tied = tuple(sorted(key for key, score in scores.items() if same_ratio(key) and score == found_score))
    may_tie = sum(1 for key, bound in bounds.items() if same_ratio(key) and bound == found_score)
    return TopTies(tied, may_tie)


def search_ties(search: str | Path) -> tuple[str, TopTies]:
    """The key of the mask a finished search returned (``mask.json``) and the masks its
    journal ties with it (``journal.jsonl``, or its committed ``.gz``): what ``--tie-break-tasks``
    would order. A key's first full score counts; a bound only for a mask never scored to the end."""
    search = Path(search)
    scores: dict[str, float] = {}
    bounds: dict[str, float] = {}
    for record in read_records(search / "journal.jsonl"):
        if "score" in record:
            scores.setdefault(record["key"], record["score"])
        elif "bound" in record:
            bounds.setdefault(record["key"], record["bound"])
    found = mask_key(HeadMask.load(search / "mask.json").bits)
    return found, top_ties(
        scores, {key: bound for key, bound in bounds.items() if key not in scores}, found, scores[found]
    )
