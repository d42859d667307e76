"""What the ``guarded`` variant returns, and why: never less than the best incumbent.

After Stages 1–3 the local search (:mod:`bosch_eval.search.guard.local_walk`) runs from the stages'
mask and from the best incumbent (:mod:`bosch_eval.search.guard.incumbents`), half the budget each (one
run with all of it when they are the same mask). The stages' run starts from Stage 1's own mask
instead where that has as many SWA groups and scored better (the paper's Stage 2 can give layers
a ratio no stage scored). The search returns the best of the masks those runs end with; each ends
with its start or a mask that scores strictly better, so the result scores at least the best
incumbent, the stages' mask and Stage 1's. On equal S the stages' side wins, since a tie is no
evidence for the incumbent: an incumbent is returned only when it, or a mask found from it,
scores strictly better. :class:`Guard` records the incumbents' scores, what the stages alone
returned and the gain, for ``report.md`` and the mask's provenance.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from bosch_eval.search.objective.racing import RaceBound

STAGES = "the stages"
STAGE1 = "Stage 1's mask"


@dataclass(frozen=True)
class Lineage:
    """One local-search run: where it started (``STAGES``, ``STAGE1`` or an incumbent's name) and ended."""

    origin: str
    start: str  # mask key
    end: str  # mask key
    score: float  # S of ``end``
    calls: int  # its budget of new S() calls


@dataclass(frozen=True)
class Guard:
    """The incumbents and the local search of a ``guarded`` search.

    Attributes:
        incumbents: incumbent name → mask key.
        scores: mask key → S, or the racing bound of an incumbent stopped below the best.
        best: the best incumbent's name.
        stages_key, stages_score: the mask Stages 1–3 (and ``refine``) returned, and its S.
        lineages: the local-search runs, the stages' first.
        chosen: the returned mask's key; ``source`` says where it came from.
        higher_is_better: the direction of S.
    """

    incumbents: Mapping[str, str]
    scores: Mapping[str, float | RaceBound]
    best: str
    stages_key: str
    stages_score: float
    lineages: tuple[Lineage, ...]
    chosen: str
    source: str
    higher_is_better: bool = True

    @property
    def best_score(self) -> float:
        return float(self.scores[self.incumbents[self.best]])  # the best is always scored exactly

    @property
    def chosen_score(self) -> float:
        return next(lineage.score for lineage in self.lineages if lineage.end == self.chosen)

    def gain(self, score: float) -> float:
        """How much better ``score`` is than the best incumbent's, in the metric's direction."""
        return (score - self.best_score) * (1.0 if self.higher_is_better else -1.0)

    def message(self) -> str:
        """The log's and report's sentence."""
        return (
            f"returned the mask from {self.source} (S = {self.chosen_score:.4f}, {self.gain(self.chosen_score):+.4f} over the best "
            f"incumbent {self.best}, S = {self.best_score:.4f}); the stages alone returned S = {self.stages_score:.4f} "
            f"({self.gain(self.stages_score):+.4f})"
        )

    def to_json(self) -> dict[str, Any]:
        def value(outcome: float | RaceBound) -> dict[str, float | int]:
            if isinstance(outcome, RaceBound):
                return {"bound": outcome.score, "examples": outcome.examples}
            return {"score": outcome}

        return {
            "incumbents": {name: {"key": key, **value(self.scores[key])} for name, key in self.incumbents.items()},
            "best_incumbent": self.best,
            "best_incumbent_score": self.best_score,
            "stages_key": self.stages_key,
            "stages_score": self.stages_score,
            "local_search": [lineage.__dict__ for lineage in self.lineages],
            "chosen": self.chosen,
            "source": self.source,
            "gain": self.gain(self.chosen_score),
        }


def choose(lineages: Sequence[Lineage], higher_is_better: bool) -> Lineage:
    """The run that ended best; the first (the stages') on equal S."""
    sign = 1.0 if higher_is_better else -1.0
    return max(lineages, key=lambda lineage: sign * lineage.score)  # max keeps the first of equals


def source_of(lineage: Lineage) -> str:
    """Where the returned mask came from, in words."""
    start = lineage.origin if lineage.origin in (STAGES, STAGE1) else f"incumbent {lineage.origin}"
    return start if lineage.end == lineage.start else f"the local search from {start}"
