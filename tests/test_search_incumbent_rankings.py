"""The guarded search on the bundled toy model computes its rankings on its own calibration set,
writes them to ``<out>/rankings/``, scores their masks as incumbents and never returns less."""

from __future__ import annotations

from pathlib import Path

import pytest

from bosch_eval.masks.head_mask import HeadMask, HeadRanking
from bosch_eval.runtime.errors import SearchError
from bosch_eval.search.run.api import RunOptions, search_model
from bosch_eval.search.journal.store import mask_key
from bosch_eval.search.objective.loading import CalibrationSettings, LoadSettings
from bosch_eval.search.run.pipeline import SearchSettings


CALIBRATION = CalibrationSettings(examples=4, length=256)
LOAD = LoadSettings(window=32, prefix_cache_mb=0)


def test_rankings_on_the_calibration_set_are_incumbents_and_a_resume_reads_them(tmp_path: Path) -> None:
    settings = SearchSettings(ratio=0.5, budget_per_layer=2, local_calls=4, rankings=("dcam", "apl"))
    result = search_model("toy", settings, tmp_path, calibration=CALIBRATION, load=LOAD, run=RunOptions(progress=False))
    guard = result.guard
    assert guard is not None and {"dcam", "apl", "intr", "bme", "rand:0"} <= set(guard.incumbents)
    ranking = HeadRanking.load(tmp_path / "rankings" / "dcam.json")
    assert ranking.provenance["calib_task"] == "bosch_niah_calib" and ranking.provenance["calib_examples"] == 4
    assert guard.incumbents["dcam"] == mask_key(ranking.to_mask(0.5).bits)
    assert result.score >= guard.best_score
    provenance = HeadMask.load(tmp_path / "mask.json").provenance
    assert dict(map(tuple, provenance["search"]["incumbents"]))["dcam"] == guard.incumbents["dcam"]
    before = (tmp_path / "rankings" / "dcam.json").stat().st_mtime_ns
    again = search_model(
        "toy", settings, tmp_path, calibration=CALIBRATION, load=LOAD, run=RunOptions(progress=False), resume=True
    )
    assert again.mask.bits == result.mask.bits and again.new_evaluations == 0
    assert (tmp_path / "rankings" / "dcam.json").stat().st_mtime_ns == before  # read back, not computed again


@pytest.mark.parametrize("ratio", [0.25, 0.75, 0.875])
def test_at_every_ratio_the_search_scores_at_least_every_ranking_and_heuristic(tmp_path: Path, ratio: float) -> None:
    settings = SearchSettings(ratio=ratio, budget_per_layer=2, local_calls=4, rankings=("dcam", "apl", "qada"))
    result = search_model("toy", settings, tmp_path, calibration=CALIBRATION, load=LOAD, run=RunOptions(progress=False))
    guard = result.guard
    assert guard is not None and {"dcam", "apl", "qada", "intr", "bme", "rand:0"} <= set(guard.incumbents)
    exact = [
        score for score in guard.scores.values() if isinstance(score, float)
    ]  # racing stops only masks below the best
    assert len(exact) >= 1 and result.score >= max(exact) and result.score >= guard.stages_score
    assert (
        result.mask.num_swa_groups == HeadRanking.load(tmp_path / "rankings" / "apl.json").to_mask(ratio).num_swa_groups
    )


def test_a_ranker_named_for_tasks_the_rankers_cannot_read_is_refused(tmp_path: Path) -> None:
    calibration = CalibrationSettings(tasks=("some_other_task",))
    with pytest.raises(SearchError, match=r"^rankings: \['dcam'\] would be computed on the calibration set"):
        search_model("toy", SearchSettings(ratio=0.5, rankings=("dcam",)), tmp_path, calibration=calibration, load=LOAD)
