"""The cost model counts the S() calls a search makes."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from bosch_eval.masks import ModelShape
from bosch_eval.search.cost import CallEstimate, estimate_calls, render_cost
from bosch_eval.search.pipeline import SearchSettings, run_search
from bosch_eval.search.scoring import SearchError
from bosch_eval.search.search_cli import render_estimate
from tests.helpers import SHAPE, ExampleObjective


def test_the_paper_scale_formula() -> None:
    shape = ModelShape(num_layers=32, num_heads=32, num_kv_heads=8)
    calls = estimate_calls(shape, 0.75, budget_per_layer=100, chunk_layers=4)
    assert calls.stage1 == 32 * math.comb(8, 6)  # 28 masks per layer fit κ = 100: enumerated
    assert (calls.stage3_low, calls.stage3_high) == (0, 8 * 400)  # 28**4 > κ·4: the budget per 4-layer chunk
    assert (calls.low, calls.high) == (2 + 896, 2 + 896 + 3200)


@pytest.mark.parametrize(("ratio", "seed"), [(0.5, 0), (0.75, 1), (0.5, 2)])
def test_a_search_makes_at_most_the_calls_predicted_after_stage_2(ratio: float, seed: int) -> None:
    settings = SearchSettings(ratio=ratio, seed=seed, budget_per_layer=10)
    result = run_search(ExampleObjective(seed=seed), SHAPE, settings, progress=False)
    chunk = settings.chunk_layers_for(SHAPE)
    before = estimate_calls(SHAPE, ratio, 10, chunk)
    after = estimate_calls(SHAPE, ratio, 10, chunk, layer_ratios=result.stage2.ratios)
    made = {stage: int(row["calls"]) for stage, row in result.costs.items()}
    assert made["anchor"] == 2 and made["stage1"] == before.stage1 == after.stage1
    # Stage 3 may meet masks Stage 1 scored (answered from the book, not called again).
    assert made.get("stage3", 0) <= after.stage3_high <= before.stage3_high
    assert before.low <= sum(made.values()) <= after.high


def test_nomad_calls_are_counted_apart_since_they_are_never_raced() -> None:
    shape = ModelShape(num_layers=2, num_heads=16, num_kv_heads=8)
    # One quota over both layers: 16 variables in one block, C(16, 8) > κ·2, so NOMAD.
    chunk = estimate_calls(shape, 0.5, 100, chunk_layers=2, quota="chunk", layer_ratios=[0.5, 0.5])
    assert (chunk.stage3_high, chunk.stage3_exact) == (200, 200)
    # A quota per layer: two blocks, which NOMAD cannot keep, so the (1+1)-EA (raced).
    per_layer = estimate_calls(shape, 0.5, 100, chunk_layers=2, quota="layer", layer_ratios=[0.5, 0.5])
    assert (per_layer.stage3_high, per_layer.stage3_exact) == (200, 0)


def test_the_prediction_times_nomad_calls_as_unraced_ones() -> None:
    # Stage 1's calls were mostly stopped early (1 s each); an anchor took 10 s, as every NOMAD call will.
    costs = {"anchor": {"calls": 2, "pruned": 0, "seconds": 20.0}, "stage1": {"calls": 10, "pruned": 9, "seconds": 10.0},
             "stage3": {"calls": 200, "pruned": 0, "seconds": 2000.0}}  # fmt: skip
    before, after = CallEstimate(2, 10, 0, 200, 200), CallEstimate(2, 10, 200, 200, 200)
    line = render_cost(costs, before, after)[-2]
    assert "200 NOMAD calls × 10.000 s" in line and "2030.0 s predicted, 2030.0 s measured (+0%)" in line
    # A resumed run that scored no anchor has no unraced call to time, and says so.
    resumed = {stage: row for stage, row in costs.items() if stage != "anchor"}
    line = render_cost(resumed, before, after)[-2]
    assert "no unraced call timed in this run" in line and "210.0 s predicted, 2010.0 s measured (-90%)" in line


def test_the_estimate_reads_only_the_config(tiny_model_dir: Path) -> None:
    text = render_estimate(str(tiny_model_dir), SearchSettings(ratio=0.5), 2.0)
    assert "L=3 × G=4" in text and "S() calls" in text and " h at 2 s per call" in text
    with pytest.raises(SearchError, match="--estimate: expected the seconds"):
        render_estimate(str(tiny_model_dir), SearchSettings(ratio=0.5), 0.0)
