"""The search's progress bar and log lines: "best" is the best complete mask, never a partial one."""

from __future__ import annotations

import logging
import re

import pytest

from bosch_eval.masks import HeadMask
from bosch_eval.search.pipeline import SearchSettings, run_search
from bosch_eval.search.score_book import ScoreBook
from bosch_eval.search.stages import StageProgress
from tests.helpers import SHAPE, ExampleObjective


def test_the_log_names_the_best_complete_mask_and_labels_partial_ones(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="bosch_eval.search"):
        result = run_search(ExampleObjective(seed=5), SHAPE, SearchSettings(ratio=0.5, seed=5, budget_per_layer=10), racing=True)
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
    with StageProgress("stage 1", 3, book, enabled=False, complete_swa=16) as bar:
        bar.update(0.9, full)
        assert (bar.best, bar.best_partial, bar._bests()) == (None, 0.9, "best=none yet, best partial=0.9000")
        bar.update(0.25, swa)
        bar.update(None, swa)  # a mask racing stopped early: no score
        assert (bar.best, bar.best_partial, bar._bests()) == (0.25, 0.9, "best=0.2500, best partial=0.9000")
