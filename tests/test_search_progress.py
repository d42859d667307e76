"""The search's progress bar and log lines: "best" is the best complete mask, never a partial one."""

from __future__ import annotations

import logging
import re

import pytest

from bosch_eval.masks.head_mask import HeadMask
from bosch_eval.search.objective.score_book import ScoreBook
from bosch_eval.search.run.pipeline import SearchSettings, run_search
from bosch_eval.search.stages.progress import StageProgress
from tests.helpers import SHAPE, ExampleObjective


def test_the_log_names_the_best_complete_mask_and_labels_partial_ones(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="bosch_eval.search"):
        result = run_search(
            ExampleObjective(seed=5),
            SHAPE,
            SearchSettings(ratio=0.5, seed=5, budget_per_layer=10, variant="bosch"),
            racing=True,
        )
    lines = [r.getMessage() for r in caplog.records if "best complete" in r.getMessage()]
    stage1 = [line for line in lines if line.startswith("stage 1")]
    # Stage 1's first sub-problems score masks with fewer than the 8 SWA groups of its result.
    assert stage1[:-1] and all("best complete (8 SWA groups) none yet, best partial " in line for line in stage1[:-1])
    partial = [float(re.search(r"best partial ([\d.]+)", line).group(1)) for line in lines]
    complete = float(re.search(r"best complete \(8 SWA groups\) ([\d.]+)", lines[-1]).group(1))
    # The final S is the best complete mask's; partial masks score higher, and are labelled so.
    assert complete == pytest.approx(result.score, abs=5e-5) and max(partial) > result.score + 0.1


def test_the_bar_shows_the_best_complete_mask_apart_from_partial_ones() -> None:
    book = ScoreBook(lambda mask: 0.0, SHAPE)
    full, swa = HeadMask.uniform(SHAPE, full=True).bits, HeadMask.uniform(SHAPE, full=False).bits
    with StageProgress("stage 1", [(3, 3)], book, enabled=False, complete_swa=16) as bar:
        bar.update(0.9, full)
        assert (bar.best, bar.best_partial, bar._bests()) == (None, 0.9, "best=none yet, best partial=0.9000")
        bar.update(0.25, swa)
        bar.update(None, swa)  # a mask racing stopped early: no score
        assert (bar.best, bar.best_partial, bar._bests()) == (0.25, 0.9, "best=0.2500, best partial=0.9000")


class Deepening:
    """A score function whose evaluation costs 0.05 s per layer it runs, as with the prefix
    cache: masks that vary from layer l run layers l..3."""

    def __init__(self) -> None:
        self.lowest: int | None = None

    def __call__(self, mask: HeadMask) -> float:
        import time

        time.sleep(0.05 * self.relative_cost(self.lowest) * SHAPE.num_layers)
        return 0.5

    def relative_cost(self, lowest: int | None) -> float:
        return 1.0 if lowest is None else (SHAPE.num_layers - lowest) / SHAPE.num_layers

    def vary_layers_from(self, layer: int | None) -> None:
        self.lowest = layer


def eta_seconds(caplog: pytest.LogCaptureFixture) -> list[float]:
    return [
        float(re.search(r"ETA (\d+) s", r.getMessage()).group(1)) for r in caplog.records if "ETA" in r.getMessage()
    ]


def masks_of(count: int, start: int) -> list[tuple[tuple[int, ...], ...]]:
    rows = [[(i >> shift) & 1 for shift in range(4)] for i in range(16)]
    return [tuple(tuple(rows[(start + i + layer) % 16]) for layer in range(4)) for i in range(count)]


def test_the_eta_uses_the_time_per_mask_evaluated_in_this_run(caplog: pytest.LogCaptureFixture) -> None:
    """Issue 40: a resumed run said "ETA 250 s" at 83 s per evaluation: masks answered from
    the journal (free) were averaged into the rate. Six masks come from memory here, then
    one is evaluated at 0.2 s: 17 asks are left, so the ETA is about 17 × 0.2 s, not 17 × 0.2 / 7."""
    from bosch_eval.search.journal.store import mask_key
    from bosch_eval.search.stages.subproblems import SubResult

    journaled = masks_of(6, 0)
    deep = Deepening()
    book = ScoreBook(deep, SHAPE, known={mask_key(bits): 0.5 for bits in journaled})
    plan = [(7, None), (17, None)]
    with (
        caplog.at_level(logging.INFO, logger="bosch_eval.search"),
        StageProgress("stage 3", plan, book, enabled=True, complete_swa=8) as bar,
    ):
        for bits in journaled:
            book.score(bits, "stage3")  # from the journal: no call
        book.score(HeadMask.uniform(SHAPE, full=True).bits, "stage3")  # evaluated now, 0.2 s
        bar.report(SubResult("stage 3", (3,), 0.5, 4, 2, "exhaustive", 7, 0.5, 0.0))
    (eta,) = eta_seconds(caplog)
    assert round(17 * 0.2) <= eta <= 17 * 0.6
    assert "7/24 masks asked" in caplog.text and "17 masks left to ask" in caplog.text


def test_the_eta_of_a_stage_that_goes_down_the_layers_counts_their_cost(caplog: pytest.LogCaptureFixture) -> None:
    """Stage 1 goes from the top layer down; with the prefix cache a lower layer's masks run
    more layers. After the top layer (6 masks at 0.05 s) the rest cost 6 × (0.1 + 0.15 + 0.2) s."""
    from bosch_eval.search.stages.subproblems import SubResult

    deep = Deepening()
    book = ScoreBook(deep, SHAPE)
    plan = [(6, 3), (6, 2), (6, 1), (6, 0)]
    with (
        caplog.at_level(logging.INFO, logger="bosch_eval.search"),
        StageProgress("stage 1", plan, book, enabled=True, complete_swa=8) as bar,
    ):
        for number, (asks, lowest) in enumerate(plan[:2]):
            with book.varying_from(lowest):
                for bits in masks_of(asks, 6 * number):
                    book.score(bits, "stage1")
            bar.report(SubResult("stage 1", (lowest,), 0.5, 4, 2, "exhaustive", asks, 0.5, 0.0))
    first, second = eta_seconds(caplog)
    assert 6 * (0.1 + 0.15 + 0.2) * 0.8 <= first <= 6 * (0.1 + 0.15 + 0.2) * 2  # not 18 × 0.05 s
    assert 6 * (0.15 + 0.2) * 0.8 <= second <= 6 * (0.15 + 0.2) * 2


def test_every_count_of_masks_evaluated_agrees(tmp_path) -> None:  # noqa: ANN001
    """One word for one count: the journal's refusal, the resume log and the result count the
    same distinct masks (scored or stopped early), never journal lines (racing writes values
    and bounds too)."""
    from bosch_eval.runtime.errors import JournalError
    from bosch_eval.search.journal.store import Journal
    from bosch_eval.search.run.pipeline import Resumed

    path = tmp_path / "journal.jsonl"
    settings = SearchSettings(ratio=0.5, seed=5, budget_per_layer=10)
    result = run_search(
        ExampleObjective(seed=5),
        SHAPE,
        settings,
        journal=Journal(path, {"s": 1}, resume=False),
        progress=False,
        racing=True,
    )
    assert result.pruned > 0 and len(path.read_text().splitlines()) - 1 > result.evaluations  # more lines than masks
    with pytest.raises(JournalError, match=f"holds {result.evaluations} masks evaluated"):
        Journal(path, {"s": 1}, resume=False)
    journal = Journal(path, {"s": 1}, resume=True)
    assert journal.masks_evaluated == result.evaluations
    again = run_search(
        ExampleObjective(seed=5),
        SHAPE,
        settings,
        resumed=Resumed.of(journal),
        journal=journal,
        progress=False,
        racing=True,
    )
    assert again.evaluations == result.evaluations and again.new_evaluations == 0
