"""Stage 2 (Algorithm 2): hand-worked examples, the budget, termination, direction, input errors."""

from __future__ import annotations

import random

import numpy as np
import pytest

from bosch_eval.masks.head_mask import ceil_count
from bosch_eval.search.stages.stage2 import DEFAULT_BUCKETS, Stage2Result, assign_layer_ratios, default_buckets

QUARTERS = DEFAULT_BUCKETS


class TestHandWorked:
    """Every number below is worked out by hand in the comments."""

    # s_orig = 1, s_best (bottom → top) = [0.5, 0.75, 0.875, 1.0]
    # δ = [-0.5, -0.25, -0.125, 0.0], δ_4 = 0
    # d_l = δ_{l+1} − δ_l = [0.25, 0.125, 0.125, 0.0]
    # sorted d = [0, 0.125, 0.125, 0.25], n = 4, linear percentiles:
    #   q_lo (2.5):  position 0.025·3 = 0.075 → 0 + 0.075·0.125         = 0.009375
    #   q_hi (97.5): position 0.975·3 = 2.925 → 0.125 + 0.925·0.125     = 0.240625
    # clipped d = [0.240625, 0.125, 0.125, 0.009375]; span = 0.23125
    # w = [1.0, 0.115625/0.23125 = 0.5, 0.5, 0.0]
    # hardest first by (−w, l): 0, 1, 2, 3 (layers 1 and 2 tie: layer 1 counts as harder)
    # array_split of 4 layers into 5 buckets: sizes 1, 1, 1, 1, 0 → ranks [0, 1, 2, 3]
    # G = 4: KV groups per bucket = [0, 1, 2, 3, 4]; M_now = 0 + 1 + 2 + 3 = 6
    SCORES_A = [0.5, 0.75, 0.875, 1.0]

    def test_raise_easiest_first(self) -> None:
        # ρ = 0.5: M_target = ⌈0.5·16⌉ = 8, Δ = +2. Easy order: 3, 2, 1, 0.
        #   layer 3: rank 3 → 4 (+1), Δ = 1;  layer 2: rank 2 → 3 (+1), Δ = 0, stop.
        # ranks [0, 1, 3, 4] → ratios [0, 0.25, 0.75, 1.0], 0 + 1 + 3 + 4 = 8 groups
        result = assign_layer_ratios(self.SCORES_A, 1.0, 0.5, 4)
        assert result.drops == pytest.approx([0.25, 0.125, 0.125, 0.0], abs=1e-15)
        assert result.weights == pytest.approx([1.0, 0.5, 0.5, 0.0], abs=1e-12)
        assert result.ratios == (0.0, 0.25, 0.75, 1.0)
        assert (result.target_groups, result.assigned_groups) == (8, 8)

    def test_lower_hardest_first(self) -> None:
        # ρ = 0.25: M_target = 4, Δ = 4 − 6 = −2. Hard order: 0, 1, 2, 3.
        #   layer 0: rank 0, cannot go lower;  layer 1: rank 1 → 0 (−1), Δ = −1;
        #   layer 2: rank 2 → 1 (−1), Δ = 0, stop.
        # ranks [0, 0, 1, 3] → ratios [0, 0, 0.25, 0.75], 0 + 0 + 1 + 3 = 4 groups
        result = assign_layer_ratios(self.SCORES_A, 1.0, 0.25, 4)
        assert result.ratios == (0.0, 0.0, 0.25, 0.75)
        assert (result.target_groups, result.assigned_groups) == (4, 4)

    def test_uneven_groups_and_relative_scale(self) -> None:
        # s_orig = 2, s_best = [0.25, 1.5, 1.75, 1.75, 2.0], G = 2, buckets (0, 0.5, 1), ρ = 0.5
        # δ = (s − 2)/2 = [-0.875, -0.25, -0.125, -0.125, 0.0], δ_5 = 0
        # d = [0.625, 0.125, 0.0, 0.125, 0.0]
        # sorted d = [0, 0, 0.125, 0.125, 0.625], n = 5:
        #   q_lo: position 0.1 → 0;  q_hi: position 3.9 → 0.125 + 0.9·0.5 = 0.575
        # clipped d = [0.575, 0.125, 0, 0.125, 0]; w = d/0.575 = [1, 5/23, 0, 5/23, 0]
        # hardest first: 0, 1, 3, 2, 4 (1 before 3 and 2 before 4 by layer index)
        # array_split of 5 into 3: sizes 2, 2, 1 → {0, 1} → b_0, {3, 2} → b_1, {4} → b_2
        # ranks [0, 0, 1, 1, 2]; groups per bucket [0, 1, 2]; M_now = 0 + 0 + 1 + 1 + 2 = 4
        # M_target = ⌈0.5·10⌉ = 5, Δ = +1. Easy order 4, 2, 3, 1, 0:
        #   layer 4 is at the top bucket; layer 2: rank 1 → 2 (+1), Δ = 0.
        # ranks [0, 0, 2, 1, 2] → ratios [0, 0, 1, 0.5, 1]
        result = assign_layer_ratios([0.25, 1.5, 1.75, 1.75, 2.0], 2.0, 0.5, 2, buckets=(0.0, 0.5, 1.0))
        assert result.drops == pytest.approx([0.625, 0.125, 0.0, 0.125, 0.0], abs=1e-15)
        assert result.weights == pytest.approx([1.0, 5 / 23, 0.0, 5 / 23, 0.0], abs=1e-12)
        assert result.ratios == (0.0, 0.0, 1.0, 0.5, 1.0)
        assert (result.target_groups, result.assigned_groups) == (5, 5)

    def test_budget_out_of_reach_stops(self) -> None:
        # G = 2, buckets (0, 1): every move is worth 2 groups. percentiles (0, 100): plain min-max.
        # s_orig = 1, s_best = [0.25, 0.5, 1.0]: δ = [-0.75, -0.5, 0], d = [0.25, 0.5, 0.0]
        # q_lo = 0, q_hi = 0.5 → w = [0.5, 1.0, 0.0]; hardest first: 1, 0, 2
        # array_split of 3 into 2: {1, 0} → b_0 = 0, {2} → b_1 = 1; M_now = 2
        # ρ = 0.5: M_target = ⌈3⌉ = 3, Δ = +1: layer 2 is at the top, layers 0 and 1 would add
        # 2 > 1 → a pass without a move; stop at 2 groups (the printed loop never ends here).
        result = assign_layer_ratios([0.25, 0.5, 1.0], 1.0, 0.5, 2, buckets=(0.0, 1.0), percentiles=(0, 100))
        assert result.weights == pytest.approx([0.5, 1.0, 0.0])
        assert result.ratios == (0.0, 0.0, 1.0)
        assert (result.target_groups, result.assigned_groups) == (3, 2)
        # ρ = 0.6: M_target = ⌈3.6⌉ = 4, Δ = +2: the easiest movable layer (0) rises to 1.
        result = assign_layer_ratios([0.25, 0.5, 1.0], 1.0, 0.6, 2, buckets=(0.0, 1.0), percentiles=(0, 100))
        assert result.ratios == (1.0, 0.0, 1.0)
        assert (result.target_groups, result.assigned_groups) == (4, 4)

    def test_equal_drops_give_zero_weights_and_layer_order(self) -> None:
        # Every layer kept the score: d = [0, 0, 0], q_lo = q_hi = 0 → w = [0, 0, 0].
        # Hardest first by layer index: 0, 1, 2 → ranks [0, 1, 2]; G = 4 → M_now = 0 + 1 + 2 = 3.
        # ρ = 0.5: M_target = 6, Δ = +3; one pass in easy order 2, 1, 0 raises each by one.
        result = assign_layer_ratios([1.0, 1.0, 1.0], 1.0, 0.5, 4)
        assert result.weights == (0.0, 0.0, 0.0)
        assert result.ratios == (0.25, 0.5, 0.75)
        assert (result.target_groups, result.assigned_groups) == (6, 6)

    def test_single_layer(self) -> None:
        # L = 1: both percentiles equal the one drop → w = [0]; array_split gives it b_0,
        # then three raises bring it to ⌈0.75·4⌉ = 3 groups.
        result = assign_layer_ratios([0.4], 1.0, 0.75, 4)
        assert result.drops == pytest.approx([0.6])
        assert result.weights == (0.0,)
        assert result.ratios == (0.75,)


class TestDirection:
    def test_destroying_layer_gets_lowest_ratio(self) -> None:
        # Localizing layer 2 wipes out the score; the other layers cost almost nothing.
        # (With Algorithm 2's printed signs, layer 2 would get w = 0 and the largest ratio.)
        scores = [0.04, 0.05, 0.06, 0.99, 1.0]
        result = assign_layer_ratios(scores, 1.0, 0.5, 4)
        assert result.drops[2] == max(result.drops)
        assert result.weights[2] == 1.0
        assert result.ratios[2] == min(result.ratios) == 0.0
        assert result.ratios[2] < min(r for layer, r in enumerate(result.ratios) if layer != 2)

    def test_a_gain_is_a_negative_drop(self) -> None:
        # Localizing layer 1 raised the score: the easiest layer, w = 0, the largest ratio.
        result = assign_layer_ratios([0.7, 0.9, 0.8, 0.8], 1.0, 0.5, 4, percentiles=(0, 100))
        assert result.drops == pytest.approx([0.2, -0.1, 0.0, 0.2])
        assert result.weights[1] == 0.0
        assert result.ratios[1] == max(result.ratios)


def _initial_assigned(result: Stage2Result, counts: list[int]) -> int:
    """Groups before reconciliation, from the reported weights (the bucketing rule, stated plainly)."""
    hardest_first = sorted(range(len(result.weights)), key=lambda layer: (-result.weights[layer], layer))
    sections = np.array_split(np.asarray(hardest_first), len(counts))
    return sum(counts[bucket] * len(members) for bucket, members in enumerate(sections))


class TestBudget:
    @pytest.mark.parametrize("seed", range(100))
    def test_met_exactly_with_one_group_steps(self, seed: int) -> None:
        rng = random.Random(seed)
        layers = rng.randint(1, 40)
        scores = [rng.uniform(0.0, 1.2) for _ in range(layers)]
        ratio = rng.choice([0.0, 1.0, rng.random(), round(rng.random(), 2)])
        result = assign_layer_ratios(scores, rng.uniform(0.1, 2.0), ratio, 4)
        assert result.target_groups == result.assigned_groups == sum(round(r * 4) for r in result.ratios)
        assert len(result.ratios) == layers and set(result.ratios) <= set(QUARTERS)
        assert all(0.0 <= w <= 1.0 for w in result.weights)
        # Equal steps: the ratio never decreases from the hardest layer to the easiest.
        hardest_first = sorted(range(layers), key=lambda layer: (-result.weights[layer], layer))
        ordered = [result.ratios[layer] for layer in hardest_first]
        assert ordered == sorted(ordered)

    @pytest.mark.parametrize("seed", range(100))
    def test_met_whenever_the_step_divides_the_target(self, seed: int) -> None:
        rng = random.Random(1000 + seed)
        groups, buckets, step = rng.choice(
            [(8, QUARTERS, 2), (2, (0.0, 0.5, 1.0), 1), (1, (0.0, 1.0), 1), (4, (0.0, 0.5, 1.0), 2)]
        )
        layers = rng.randint(1, 30)
        result = assign_layer_ratios([rng.random() for _ in range(layers)], 1.0, rng.random(), groups, buckets)
        if result.target_groups % step == 0:
            assert result.assigned_groups == result.target_groups
        else:
            assert abs(result.assigned_groups - result.target_groups) < step


class TestTermination:
    """Bucket sets whose moves cannot always fill the gap: the loop must stop, not spin or overshoot."""

    @pytest.mark.parametrize(
        ("groups", "buckets"),
        [(2, (0.0, 1.0)), (4, (0.0, 0.5, 1.0)), (4, (0.0, 0.25, 1.0)), (8, (0.0, 0.125, 0.875, 1.0)), (8, (0.5, 1.0))],
    )
    @pytest.mark.parametrize("seed", range(20))
    def test_stops_short_of_the_target(self, groups: int, buckets: tuple[float, ...], seed: int) -> None:
        rng = random.Random(seed)
        layers = rng.randint(1, 12)
        scores = [rng.random() for _ in range(layers)]
        result = assign_layer_ratios(scores, 1.0, rng.random(), groups, buckets)
        counts = [round(b * groups) for b in buckets]
        assigned, target = result.assigned_groups, result.target_groups
        assert assigned == sum(round(r * groups) for r in result.ratios)
        # Never crossed the target: still on the side where the bucketing started (or on it).
        initial = _initial_assigned(result, counts)
        assert (initial - target) * (assigned - target) >= 0
        assert abs(assigned - target) <= abs(initial - target)
        # Stopped only because no single adjacent move fits the remaining gap.
        gap = target - assigned
        index = {b: i for i, b in enumerate(buckets)}
        for ratio in result.ratios:
            bucket = index[ratio]
            if gap > 0 and bucket < len(buckets) - 1:
                assert counts[bucket + 1] - counts[bucket] > gap
            if gap < 0 and bucket > 0:
                assert counts[bucket] - counts[bucket - 1] > -gap

    def test_odd_target_with_two_group_steps(self) -> None:
        # G = 2, buckets (0, 1), L = 5, ρ = 0.5: target ⌈5⌉ = 5 is odd and every layer holds 0 or 2.
        result = assign_layer_ratios([0.1, 0.3, 0.5, 0.7, 0.9], 1.0, 0.5, 2, buckets=(0.0, 1.0))
        assert result.target_groups == 5
        assert result.assigned_groups in (4, 6)
        assert result.assigned_groups == 2 * result.ratios.count(1.0)


class TestInputErrors:
    @pytest.mark.parametrize(
        ("kwargs", "message"),
        [
            ({"stage1_scores": []}, "empty"),
            ({"stage1_scores": [0.5, float("nan")]}, "entry 1"),
            ({"stage1_scores": [0.5, True]}, "entry 1"),
            ({"original_score": 0.0}, "undefined"),
            ({"original_score": -0.5}, "undefined"),
            ({"original_score": float("inf")}, "undefined"),
            ({"target_ratio": 1.5}, "target_ratio"),
            ({"target_ratio": -0.1}, "target_ratio"),
            ({"groups_per_layer": 0}, "groups_per_layer"),
            ({"groups_per_layer": 2.0}, "groups_per_layer"),
            ({"buckets": ()}, "buckets"),
            ({"buckets": (0.0, 0.5, 0.5, 1.0)}, "strictly increasing"),
            ({"buckets": (0.5, 0.25)}, "strictly increasing"),
            ({"buckets": (0.0, 1.5)}, "entry 1"),
            ({"buckets": (0.0, 0.3, 1.0)}, "multiples of 1/4"),
            ({"percentiles": (97.5, 2.5)}, "percentiles"),
            ({"percentiles": (0.0, 101.0)}, "percentiles"),
            ({"percentiles": (2.5,)}, "percentiles"),
        ],
    )
    def test_rejected(self, kwargs: dict, message: str) -> None:
        args = {"stage1_scores": [0.5, 0.8], "original_score": 1.0, "target_ratio": 0.5, "groups_per_layer": 4}
        args.update(kwargs)
        with pytest.raises(ValueError, match=message):
            assign_layer_ratios(**args)

    def test_quarters_named_need_groups_in_steps_of_four(self) -> None:
        with pytest.raises(ValueError, match=r"0\.25 × 2 KV groups per layer = 0\.5"):
            assign_layer_ratios([0.5, 0.8], 1.0, 0.5, 2, buckets=QUARTERS)
        with pytest.raises(ValueError, match=r"0\.25 × 3 KV groups per layer = 0\.75 is not a whole number"):
            assign_layer_ratios([0.5, 0.8], 1.0, 0.5, 3, buckets=QUARTERS)

    def test_result_lengths_must_agree(self) -> None:
        with pytest.raises(ValueError, match="one entry per layer"):
            Stage2Result(ratios=(0.0,), weights=(0.0, 1.0), drops=(0.0, 0.1), target_groups=0, assigned_groups=0)


class TestDirectionAndZeroRatios:
    def test_lower_is_better_scores_give_the_same_ratios_as_their_mirror(self) -> None:
        """A perplexity that rises where a higher-is-better score falls ranks layers the same."""
        scores = [0.2, 0.5, 0.45, 0.9, 0.8, 0.85, 0.95, 0.97]
        higher = assign_layer_ratios(scores, 1.0, 0.5, 4)
        lower = assign_layer_ratios([2.0 - s for s in scores], 1.0, 0.5, 4, higher_is_better=False)
        assert lower.ratios == higher.ratios and lower.weights == pytest.approx(higher.weights)
        wrong = assign_layer_ratios([2.0 - s for s in scores], 1.0, 0.5, 4)  # direction ignored: hardest = easiest
        assert wrong.ratios != higher.ratios

    def test_quarter_buckets_lift_every_layer_off_zero_at_075_on_32_by_8(self) -> None:
        """Algorithm 2 as printed: one raising pass visits *every* layer (lines 19-25) and the
        gap after bucketing (70 groups) outlasts the pass, so the 7 hardest layers go 0 → 0.25."""
        scores = [1.0 - 0.01 * layer for layer in range(32)][::-1]  # distinct drops
        result = assign_layer_ratios(scores, 1.0, 0.75, 8)
        assert result.assigned_groups == result.target_groups == 192
        assert min(result.ratios) == 0.25

    def test_a_layer_stays_full_when_the_gap_closes_first(self) -> None:
        """L = 8, ρ = 0.5 (the paper's Fig. 1 setting): the gap of 6 closes before the pass
        reaches the hardest layers, which stay at 0 (Fig. 1's "-" rows)."""
        scores = [0.2, 0.5, 0.45, 0.9, 0.8, 0.85, 0.95, 0.97]
        result = assign_layer_ratios(scores, 1.0, 0.5, 8)
        assert result.assigned_groups == 32 and result.ratios.count(0.0) == 2


class TestBucketsForAnyG:
    """The paper's quarter buckets are whole numbers of groups only when 4 divides G; with
    SmolLM2's G = 3, ¾ and 1 would both be a quota of ⌈2.25⌉ = ⌈3⌉ = 3 groups."""

    @pytest.mark.parametrize(
        ("groups", "expected"),
        [(4, QUARTERS), (8, QUARTERS), (32, QUARTERS), (3, (0.0, 1 / 3, 2 / 3, 1.0)), (2, (0.0, 0.5, 1.0)), (1, (0.0, 1.0)),
         (6, tuple(k / 6 for k in range(7)))],
    )  # fmt: skip
    def test_default_buckets(self, groups: int, expected: tuple[float, ...]) -> None:
        assert default_buckets(groups) == expected
        # Each bucket is a distinct Stage-3 quota (Algorithm 3: ⌈r·G⌉), and Stage 2 counts what Stage 3 converts.
        quotas = [ceil_count(bucket, groups) for bucket in expected]
        assert quotas == sorted(set(quotas)) and quotas == [round(bucket * groups) for bucket in expected]

    def test_hand_worked_at_three_groups(self, caplog: pytest.LogCaptureFixture) -> None:
        # SCORES_A (TestHandWorked): w = [1, 0.5, 0.5, 0], hardest first 0, 1, 2, 3.
        # Buckets (0, 1/3, 2/3, 1): array_split of 4 layers into 4 → ranks [0, 1, 2, 3];
        # groups per bucket [0, 1, 2, 3]: M_now = 6. ρ = 0.75: M_target = ⌈0.75·12⌉ = 9, Δ = +3.
        # Easy order 3, 2, 1, 0: layer 3 is at the top; 2 → 3, 1 → 2, 0 → 1 (+1 each): Δ = 0.
        # ranks [1, 2, 3, 3] → ratios [1/3, 2/3, 1, 1] → 1 + 2 + 3 + 3 = 9 groups
        with caplog.at_level("INFO", logger="bosch_eval.search"):
            result = assign_layer_ratios(TestHandWorked.SCORES_A, 1.0, 0.75, 3)
        assert result.ratios == (1 / 3, 2 / 3, 1.0, 1.0)
        assert result.buckets == (0.0, 1 / 3, 2 / 3, 1.0)
        assert (result.target_groups, result.assigned_groups) == (9, 9)
        assert "not whole numbers of 3 KV groups per layer; using every ratio 3 groups can realize" in caplog.text

    def test_quarters_stay_the_default_where_they_fit(self, caplog: pytest.LogCaptureFixture) -> None:
        with caplog.at_level("INFO", logger="bosch_eval.search"):
            result = assign_layer_ratios(TestHandWorked.SCORES_A, 1.0, 0.5, 4)
        assert result.buckets == QUARTERS and result.ratios == (0.0, 0.25, 0.75, 1.0)  # as TestHandWorked
        assert "not whole numbers" not in caplog.text

    @pytest.mark.parametrize("seed", range(50))
    def test_the_budget_is_met_exactly_at_three_groups(self, seed: int) -> None:
        rng = random.Random(2000 + seed)
        layers = rng.randint(1, 30)
        result = assign_layer_ratios([rng.uniform(0.0, 1.2) for _ in range(layers)], 1.0, rng.random(), 3)
        assert set(result.ratios) <= set(default_buckets(3))
        assert result.target_groups == result.assigned_groups == sum(ceil_count(r, 3) for r in result.ratios)
