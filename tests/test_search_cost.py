"""The cost model counts the S() calls a search makes."""

from __future__ import annotations

import itertools
import math
import random
from pathlib import Path

import pytest

from bosch_eval.cli import main
from bosch_eval.masks.head_mask import ModelShape, ceil_count
from bosch_eval.runtime.errors import SearchError
from bosch_eval.search.cli.find_mask import render_estimate
from bosch_eval.search.run.cost import CallEstimate, estimate_calls, render_cost, stage3_calls, stage3_range
from bosch_eval.search.run.pipeline import SearchSettings, run_search
from bosch_eval.search.rankers import RANKERS
from tests.helpers import SHAPE, ExampleObjective


def test_the_paper_scale_formula() -> None:
    shape = ModelShape(num_layers=32, num_heads=32, num_kv_heads=8)
    calls = estimate_calls(shape, SearchSettings(ratio=0.75, chunk_layers=4, variant="bosch"))
    assert calls.stage1 == 32 * math.comb(8, 6)  # 28 masks per layer fit κ = 100: enumerated
    assert (calls.stage3_low, calls.stage3_high) == (0, 8 * 400)  # 28**4 > κ·4: the budget per 4-layer chunk
    assert (calls.low, calls.high) == (2 + 896, 2 + 896 + 3200)
    assert (calls.incumbents, calls.local, calls.rankings) == (0, 0, 0)


def test_the_guarded_variant_adds_its_incumbents_and_local_search() -> None:
    shape = ModelShape(num_layers=32, num_heads=32, num_kv_heads=8)
    given = (("mine", "/".join(["00000011"] * 32)),)
    settings = SearchSettings(ratio=0.75, chunk_layers=4, local_calls=40, incumbents=given)
    calls = estimate_calls(shape, settings, rankings=6, ranking_files=1)
    # 3 layer heuristics + 1 given mask + 6 rankings computed + 1 ranking file, one call each.
    assert (calls.incumbents, calls.local, calls.rankings) == (3 + 1 + 6 + 1, 40, 6)
    assert (calls.low, calls.high) == (2 + 11 + 896 + 40, 2 + 11 + 896 + 3200 + 40)
    assert calls.terms() == "2 anchors + 11 incumbents + 896 Stage 1 + 0–3200 Stage 3 + 40 local search"
    assert "6 ranking(s) computed on the calibration set" in calls.rankings_note()


@pytest.mark.parametrize(("ratio", "seed"), [(0.5, 0), (0.75, 1)])
def test_a_guarded_search_makes_at_most_the_calls_predicted(ratio: float, seed: int) -> None:
    settings = SearchSettings(ratio=ratio, seed=seed, budget_per_layer=10, local_calls=12)
    result = run_search(ExampleObjective(seed=seed), SHAPE, settings, progress=False)
    after = estimate_calls(SHAPE, settings, result.stage2.ratios)
    made = {stage: int(row["calls"]) for stage, row in result.costs.items()}
    assert 0 < made["incumbent"] <= after.incumbents == 3  # the layer heuristics (some may share a mask)
    assert 0 < made["local"] <= after.local == 12
    assert sum(made.values()) <= after.high <= estimate_calls(SHAPE, settings).high


@pytest.mark.parametrize(
    ("ratio", "seed", "variant"), [(0.5, 0, "bosch"), (0.75, 1, "bosch"), (0.5, 2, "bosch"), (0.625, 3, "nested")]
)
def test_a_search_makes_at_most_the_calls_predicted_after_stage_2(ratio: float, seed: int, variant: str) -> None:
    settings = SearchSettings(ratio=ratio, seed=seed, budget_per_layer=10, variant=variant)
    result = run_search(ExampleObjective(seed=seed), SHAPE, settings, progress=False)
    before = estimate_calls(SHAPE, settings)
    after = estimate_calls(SHAPE, settings, result.stage2.ratios)
    made = {stage: int(row["calls"]) for stage, row in result.costs.items()}
    assert made["anchor"] == 2 and made["stage1"] == before.stage1 == after.stage1
    # Stage 3 may meet masks Stage 1 scored (answered from the book, not called again).
    assert made.get("stage3", 0) <= after.stage3_high <= before.stage3_high
    assert before.low <= sum(made.values()) <= after.high


def test_nomad_calls_are_counted_apart_since_they_are_never_raced() -> None:
    shape = ModelShape(num_layers=2, num_heads=16, num_kv_heads=8)
    # One quota over both layers: 16 variables in one block, C(16, 8) > κ·2, so NOMAD.
    chunk = estimate_calls(shape, SearchSettings(ratio=0.5, chunk_layers=2, quota="chunk"), [0.5, 0.5])
    assert (chunk.stage3_high, chunk.stage3_exact) == (200, 200)
    # A quota per layer: two blocks, which NOMAD cannot keep, so the (1+1)-EA (raced).
    per_layer = estimate_calls(shape, SearchSettings(ratio=0.5, chunk_layers=2, quota="layer"), [0.5, 0.5])
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
    # A resume that reached Stage 3 from the journal timed nothing to predict from (not "0.0 s predicted").
    stage3_only = {"stage3": costs["stage3"]}
    line = render_cost(stage3_only, before, after)[-2]
    assert line.startswith("After Stage 2: no prediction") and "predicted," not in line


def test_the_prediction_counts_the_guarded_variants_incumbents_and_local_search() -> None:
    # One second per call throughout: the incumbents are timed with the anchors and Stage 1, the
    # local search is predicted with Stage 3.
    costs = {stage: {"calls": calls, "pruned": 0, "seconds": float(calls)}
             for stage, calls in (("anchor", 2), ("incumbent", 3), ("stage1", 5), ("stage3", 10), ("local", 20))}  # fmt: skip
    before, after = CallEstimate(2, 5, 0, 10, 0, 3, 20), CallEstimate(2, 5, 10, 10, 0, 3, 20)
    lines = render_cost(costs, before, after)
    assert "N = 30 to 40 S() calls (2 anchors + 3 incumbents + 5 Stage 1 + 0–10 Stage 3 + 20 local search" in lines[-3]
    assert lines[-2].startswith("After Stage 2: Stage 3 and the local search predicted at ≤ 30 calls × 1.000 s")
    assert "40.0 s predicted, 40.0 s measured (+0%)" in lines[-2]


def test_the_estimate_reads_only_the_config(tiny_model_dir: Path) -> None:
    text = render_estimate(str(tiny_model_dir), SearchSettings(ratio=0.5), 2.0)
    assert "L=3 × G=4" in text and "S() calls" in text and " h at 2 s per call" in text
    with pytest.raises(SearchError, match="--estimate: expected the seconds"):
        render_estimate(str(tiny_model_dir), SearchSettings(ratio=0.5), 0.0)


def test_the_estimate_without_a_time_gives_the_calls(tiny_model_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = render_estimate(str(tiny_model_dir), SearchSettings(ratio=0.5), None)
    assert "S() calls" in text and " h at" not in text and "pass --estimate SECONDS" in text
    assert main(["search", "--model", str(tiny_model_dir), "--ratio", "0.5", "--estimate"]) == 0
    assert capsys.readouterr().out.strip() == text


class TestThreeKVGroups:
    """SmolLM2-135M's shape: 30 layers × 3 KV groups, Stage-2 buckets k/3, 16 layers per Stage-3 chunk."""

    SHAPE = ModelShape(num_layers=30, num_heads=9, num_kv_heads=3)

    def test_the_calls_worked_by_hand(self) -> None:
        # ρ = 0.75: Stage 1 converts ⌈2.25⌉ = 3 of 3 groups per layer, C(3, 3) = 1 candidate each.
        # Stage 2 must place ⌈67.5⌉ = 68 groups with buckets 0, 1/3, 2/3, 1 (0..3 groups per layer):
        #   fewest: 22 layers at 1, one at 2/3 (C(3, 2) = 3 candidates, enumerated), 7 at 0 → 3 calls;
        #   most: a + 2b + 3c = 68 with a + b + c <= 30 searched layers a + b at most 22 (c >= 8), best
        #   as 22 layers at 2/3: chunks of 16 and 6 → min(3^16, 1600) + min(3^6 = 729, 600) = 2200.
        calls = estimate_calls(self.SHAPE, SearchSettings(ratio=0.75, chunk_layers=16))
        assert (calls.stage1, calls.stage3_low, calls.stage3_high) == (30, 3, 2200)
        # ρ = 0.5: ⌈1.5⌉ = 2 of 3 per layer, C(3, 2) = 3 candidates; 45 groups: 15 layers at 1 and 15 at 0
        # need no Stage 3; 15 at 1/3 and 15 at 2/3 need min(3^15, 1500) each.
        calls = estimate_calls(self.SHAPE, SearchSettings(ratio=0.5, chunk_layers=16))
        assert (calls.stage1, calls.stage3_low, calls.stage3_high) == (90, 0, 3000)

    def test_the_nested_calls_worked_by_hand(self) -> None:
        # ρ = 0.5, nested: buckets 0, 1/3, 2/3 (Stage 1's 2 groups per layer at most), and a layer
        # at 1/3 chooses 1 of Stage 1's 2 groups, so C(2, 1) = 2 candidates (a layer at 2/3 has one).
        # 45 = 2a + b groups over a layers at 2/3 and b at 1/3 (a + b <= 30): fewest, b = 1 (22 at 2/3,
        # 7 at 0) → 2 calls; most, b = 15 (a = 15) → one chunk of 15 layers: min(2^15, 1500) = 1500.
        settings = SearchSettings(ratio=0.5, variant="nested")
        buckets, pool = settings.buckets_for(self.SHAPE), settings.stage3_pool(self.SHAPE)
        assert (buckets, pool) == ((0.0, 1 / 3, 2 / 3), 2)
        calls = estimate_calls(self.SHAPE, settings)
        assert (calls.stage1, calls.stage3_low, calls.stage3_high) == (90, 2, 1500)
        # What Stage 2 gave the SmolLM2 search: 20 layers at 2/3, 5 at 1/3, 5 at 0 → one chunk of 5: 2^5.
        ratios = [2 / 3] * 20 + [1 / 3] * 5 + [0.0] * 5
        assert estimate_calls(self.SHAPE, settings, ratios).stage3_high == 32

    def test_the_estimate_of_a_model_of_that_shape(self, tmp_path: Path) -> None:
        from transformers import AutoConfig

        AutoConfig.for_model(
            "llama",
            num_hidden_layers=30,
            num_attention_heads=9,
            num_key_value_heads=3,
            hidden_size=576,
            max_position_embeddings=8192,
        ).save_pretrained(tmp_path)
        text = render_estimate(str(tmp_path), SearchSettings(ratio=0.75, variant="bosch"), 10.0)
        assert (
            "L=30 × G=3" in text and "Stage-2 buckets 0, 0.3333, 0.6667, 1, 16 layers per Stage-3 sub-problem" in text
        )
        assert "35–2232 S() calls (2 anchors + 30 Stage 1 [3 of 3 groups per layer] + 3–2200 Stage 3, by" in text
        assert "0.10–6.20 h at 10 s per call" in text
        # The default, guarded: every registered ranker computed on the default calibration set, and
        # its mask scored with the layer heuristics'; then the local search's 100 calls.
        guarded = render_estimate(str(tmp_path), SearchSettings(ratio=0.75), 10.0)
        rankers = len(RANKERS.names())
        assert (
            f"(2 anchors + {3 + rankers} incumbents + 30 Stage 1 [3 of 3 groups per layer] + 3–2200 Stage 3 + 100 local search"
            in guarded
        )
        assert f"; before the incumbents, {rankers} ranking(s) computed on the calibration set" in guarded
        # `--rankings` alone computes none; calibrated on a task the rankers cannot read, none either.
        for settings, tasks in (
            (SearchSettings(ratio=0.75, rankings=()), ("bosch_niah_calib",)),
            (SearchSettings(ratio=0.75), ("mine",)),
        ):
            alone = render_estimate(str(tmp_path), settings, None, tasks)
            assert "+ 3 incumbents +" in alone and "ranking(s) computed" not in alone
        nested = render_estimate(str(tmp_path), SearchSettings(ratio=0.5, variant="nested"), None)
        assert "Stage-2 buckets 0, 0.3333, 0.6667, 16 layers per Stage-3 sub-problem" in nested
        assert "94–1592 S() calls (2 anchors + 90 Stage 1 [2 of 3 groups per layer] + 2–1500 Stage 3" in nested

    def test_a_ratio_of_zero_or_one_scores_only_the_anchors(self) -> None:
        for ratio in (0.0, 1.0):
            assert estimate_calls(self.SHAPE, SearchSettings(ratio=ratio)) == CallEstimate(2, 0, 0, 0)


@pytest.mark.parametrize("seed", range(40))
def test_the_stage3_range_is_the_extremes_over_every_stage2_outcome(seed: int) -> None:
    """The dynamic program against enumerating every assignment of layers to buckets."""
    rng = random.Random(seed)
    groups = rng.choice([1, 2, 3, 4, 6])
    shape = ModelShape(num_layers=rng.randint(1, 5), num_heads=2 * groups, num_kv_heads=groups)
    ratio, budget, chunk = rng.random(), rng.choice([1, 3, 10, 100]), rng.randint(1, 3)
    quota, optimizer = rng.choice(["layer", "chunk"]), rng.choice(["auto", "oneplusone"])
    variant = rng.choice(["bosch", "nested"])  # nested: capped buckets, layers choose among Stage 1's groups
    settings = SearchSettings(ratio=ratio, variant=variant)
    buckets, pool = settings.buckets_for(shape), settings.stage3_pool(shape)
    target = ceil_count(ratio, shape.num_layers * groups)
    outcomes = [
        stage3_calls(shape, ratios, budget, chunk, optimizer, quota, pool)
        for ratios in itertools.product(buckets, repeat=shape.num_layers)
        if sum(round(r * groups) for r in ratios) == target
    ]
    assert outcomes  # k/G buckets (up to ⌈ρG⌉/G when nested) reach every total up to L·⌈ρG⌉ ≥ the target
    low, high, exact = stage3_range(shape, ratio, budget, chunk, optimizer, quota, buckets, pool)
    assert low == min(calls for calls, _ in outcomes)
    assert (high, exact) == max(outcomes)
