"""What a running stage shows: a tqdm bar per stage, and a log line per sub-problem with the
best complete and partial scores, the masks asked and an ETA from this run's measured cost."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from tqdm import tqdm

from bosch_eval.search.objective.score_book import Bits, ScoreBook

if TYPE_CHECKING:  # stages imports this module
    from bosch_eval.search.stages.subproblems import SubResult

log = logging.getLogger("bosch_eval.search")


class StageProgress:
    """A tqdm bar for one stage plus a log line per sub-problem (best score, masks asked, ETA).

    "Best" is the best *complete* mask: one with as many SWA groups as the stage's result
    (``complete_swa``). A stage's earlier sub-problems score partial masks, with fewer SWA
    groups and so a higher S than any complete mask can reach; their best is shown apart,
    labelled partial, so that it is not read as what the search will end with.

    Counts: a *mask asked* is one answer the optimizers got (the bar's unit; ``total`` is
    their budget), whether it was evaluated now or answered from memory (a mask seen before,
    or a journal a resumed run replays).

    ETA: the remaining sub-problems' budgets at the time per mask *evaluated in this run*
    (answers from memory cost nothing, and the journal's timings are another run's). A mask
    costs what its sub-problem runs: with the prefix cache, the layers from the sub-problem's
    lowest one up (``plan`` gives each sub-problem's budget and lowest layer, the book their
    relative cost), so that Stage 1, which goes down from the top layer, does not promise
    the bottom layers at the top layer's speed (an ETA of 14 s once became 4 minutes).
    """

    def __init__(
        self,
        stage: str,
        plan: Sequence[tuple[int, int | None]],
        book: ScoreBook,
        enabled: bool,
        higher_is_better: bool = True,
        *,
        complete_swa: int,
    ) -> None:
        self.stage = stage
        self.plan = list(plan)  # per sub-problem, in order: (masks it may ask, its lowest layer)
        self.total = sum(asks for asks, _ in self.plan)
        self.done = 0
        self.sign = 1.0 if higher_is_better else -1.0  # best = the highest sign·S
        self.complete_swa = complete_swa
        self.best: float | None = None  # of complete masks
        self.best_partial: float | None = None
        self.started = time.perf_counter()
        self.reported = 0  # sub-problems finished
        self.evaluated_mark = book.new_evaluations  # this run's evaluations when the last sub-problem ended
        self.cost_units = 0.0  # this stage's evaluations, each weighted by its relative cost
        self.bar = tqdm(total=self.total, desc=f"BOSCH {stage}", unit="mask", disable=not enabled)
        self.enabled = enabled
        self.book = book

    def __enter__(self) -> StageProgress:
        self.book.on_score = self.update
        return self

    def __exit__(self, *exc: Any) -> None:
        self.book.on_score = None
        self.bar.close()

    def update(self, score: float | None, bits: Bits) -> None:
        """One mask ``bits`` asked and answered; ``None`` for a mask racing stopped early (no score)."""
        self.done += 1
        if score is not None:
            if sum(row.count(0) for row in bits) == self.complete_swa:
                self.best = self._better(self.best, score)
            else:
                self.best_partial = self._better(self.best_partial, score)
        self.bar.update(1)
        self.bar.set_postfix_str(self._bests(), refresh=False)

    def _better(self, best: float | None, score: float) -> float:
        return score if best is None or self.sign * score > self.sign * best else best

    def _bests(self) -> str:
        text = f"best={_shown(self.best)}"
        return text if self.best_partial is None else f"{text}, best partial={_shown(self.best_partial)}"

    def eta(self) -> str:
        """How long the remaining sub-problems take at this stage's measured cost, and why."""
        if self.cost_units > 0:
            per_unit = (time.perf_counter() - self.started) / self.cost_units
        else:  # nothing evaluated in this stage yet: this run's earlier stages (unweighted)
            costs = self.book.costs.values()
            calls = sum(row["calls"] for row in costs)
            if not calls:
                return "ETA unknown (no mask evaluated in this run yet)"
            per_unit = sum(row["seconds"] for row in costs) / calls
        left = self.plan[self.reported :]
        seconds = per_unit * sum(asks * self.book.relative_cost(lowest) for asks, lowest in left)
        asks = sum(asks for asks, _ in left)
        return f"ETA {seconds:.0f} s ({asks} masks left to ask, at most; {per_unit:.1f} s per full-cost mask evaluated in this run)"

    def report(self, result: SubResult) -> None:
        """One sub-problem done (they are reported in ``plan`` order)."""
        if self.reported < len(self.plan):
            evaluated = self.book.new_evaluations - self.evaluated_mark
            self.cost_units += evaluated * self.book.relative_cost(self.plan[self.reported][1])
            self.reported += 1
        self.evaluated_mark = self.book.new_evaluations
        if not self.enabled:
            return
        partial = "" if self.best_partial is None else f", best partial {_shown(self.best_partial)}"
        log.info(
            "%s layers %s: S=%.4f with %d/%d SWA (%s, %d masks asked); best complete (%d SWA groups) %s%s; %d/%d masks asked; %s",
            self.stage, list(result.layers), result.score, result.converted, result.variables, result.method,
            result.evaluations, self.complete_swa, _shown(self.best), partial, self.done, self.total, self.eta(),
        )  # fmt: skip


def _shown(score: float | None) -> str:
    return "none yet" if score is None else f"{score:.4f}"
