"""Stage 1's saturation check: layers whose best Stage-1 score reaches S(full)."""

from __future__ import annotations

from bosch_eval.search.check.saturation import stage1_saturation


def test_most_layers_without_a_drop_is_saturated():
    result = stage1_saturation([0.2, 0.95, 0.9, 0.97], all_full=0.95)
    assert result.no_drop_layers == (1, 3) and result.saturated
    assert "2 of 4 layers lose nothing in Stage 1 (layers 1, 3): the calibration set is saturated" in result.message()


def test_a_calibration_with_drops_in_most_layers_is_not():
    result = stage1_saturation([0.2, 0.95, 0.9, 0.5], all_full=0.95)
    assert not result.saturated and result.message() == "1 of 4 layers lose nothing in Stage 1 (layers 1)"


def test_lower_is_better_metrics_count_the_other_way():
    assert stage1_saturation([10.0, 12.0, 9.5], all_full=10.0, higher_is_better=False).no_drop_layers == (0, 2)


def test_the_search_logs_a_saturated_stage_1(caplog):
    """Every layer of a synthetic objective keeps S(full) at ρ = 0.5: the search warns after Stage 1."""
    import logging

    from bosch_eval.masks.head_mask import ModelShape
    from bosch_eval.search.run.pipeline import SearchSettings, run_search

    shape = ModelShape(num_layers=2, num_heads=4, num_kv_heads=2)
    score = lambda mask: 1.0 if mask.num_swa_groups <= 2 else 0.5 if mask.num_swa_groups < 4 else 0.0  # noqa: E731
    with caplog.at_level(logging.INFO, logger="bosch_eval.search"):
        run_search(score, shape, SearchSettings(ratio=0.5, budget_per_layer=4, buckets=(0.0, 0.5, 1.0)), progress=False)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and "stage 1:" in r.getMessage()]
    assert warnings == ["stage 1: 2 of 2 layers lose nothing in Stage 1 (layers 0, 1): the calibration set is saturated at "
                        "this ratio, so Stage 2 cannot order those layers and Stage 3 will choose among equal scores; "
                        "check it with `bosch-eval calib-check` before trusting the mask"]  # fmt: skip


def _saturated_at_two_of_three(mask) -> float:
    """S drops by 0.25 per layer with all three KV groups SWA; two of three lose nothing."""
    return 1.0 - 0.25 * sum(row.count(0) == 3 for row in mask.bits)


def test_the_search_warns_when_stage_1_scored_its_own_mask_higher(caplog):
    """SmolLM2's case at ρ = 0.5 (G = 3): Stage 1 converts 2 of 3 groups per layer and loses
    nothing, so Stage 2 orders the layers by index and gives the top one all 3, which costs
    0.25; Stage 1's mask (8 SWA groups, S = 1) beat the returned one (6, S = 0.75)."""
    import logging

    from bosch_eval.masks.head_mask import ModelShape
    from bosch_eval.search.run.pipeline import SearchSettings, run_search

    shape = ModelShape(num_layers=4, num_heads=3, num_kv_heads=3)
    with caplog.at_level(logging.WARNING, logger="bosch_eval.search"):
        result = run_search(
            _saturated_at_two_of_three,
            shape,
            SearchSettings(ratio=0.5, budget_per_layer=8, variant="bosch"),
            progress=False,
        )
    assert result.score == 0.75 and result.mask.num_swa_groups == 6  # the paper's mask, still returned
    warnings = [r.getMessage() for r in caplog.records if r.getMessage().startswith("stage 1's mask")]
    assert warnings == ["stage 1's mask (8 SWA groups, S=1.0000) scores better than the mask returned (6 SWA groups, "
                        "S=0.7500): Stage 2 gave layers [3] more than the 2 of 3 SWA groups Stage 1 measured in each; "
                        "`--variant nested` keeps every layer within Stage 1's groups, `--variant single` returns "
                        "Stage 1's mask"]  # fmt: skip
    # The nested variant on the same objective: no layer above Stage 1's two groups, nothing lost.
    nested = run_search(
        _saturated_at_two_of_three,
        shape,
        SearchSettings(ratio=0.5, budget_per_layer=8, variant="nested"),
        progress=False,
    )
    assert nested.score == 1.0 and nested.mask.num_swa_groups == 6


def test_no_such_warning_when_stages_2_and_3_do_at_least_as_well(caplog):
    """With buckets that never exceed what Stage 1 measured (0 and ⅔), Stage 3 keeps S = 1."""
    import logging

    from bosch_eval.masks.head_mask import ModelShape
    from bosch_eval.search.run.pipeline import SearchSettings, run_search

    shape = ModelShape(num_layers=4, num_heads=3, num_kv_heads=3)
    settings = SearchSettings(ratio=0.5, budget_per_layer=8, buckets=(0.0, 2 / 3))
    with caplog.at_level(logging.WARNING, logger="bosch_eval.search"):
        result = run_search(_saturated_at_two_of_three, shape, settings, progress=False)
    assert result.score == 1.0
    assert not [r for r in caplog.records if r.getMessage().startswith("stage 1's mask")]


def test_top_ties_counts_other_masks_of_the_found_ratio_at_its_score():
    from bosch_eval.search.check.saturation import top_ties

    scores = {
        "11/00": 1.0,  # the found mask (2 SWA groups)
        "00/11": 1.0,  # ties
        "10/10": 1.0,  # ties
        "01/10": 0.5,  # the same ratio, lower S
        "10/00": 1.0,  # the same S, one more SWA group: a larger ratio, not a tie
        "11/11": 1.0,  # all full
    }
    bounds = {"01/01": 1.0, "10/01": 0.75, "00/00": 1.0}  # stopped early: could at best reach 1.0 / 0.75 / 1.0
    ties = top_ties(scores, bounds, "11/00", 1.0)
    assert (ties.scored, ties.may_tie, ties.keys) == (2, 1, ("00/11", "10/10"))
    assert ties.message().startswith(
        "2 other mask(s) with as many SWA groups reach the same S (and 1 stopped early by racing could at best tie): "
        "the calibration set cannot tell them apart"
    )
    alone = top_ties({"11/00": 0.9, "00/11": 0.8}, {}, "11/00", 0.9)
    assert (alone.scored, alone.may_tie) == (
        0,
        0,
    ) and alone.message() == "0 other mask(s) with as many SWA groups reach the same S"


def test_the_search_reports_the_masks_tied_with_the_one_it_returns(caplog):
    """With buckets (0, ⅔) every layer keeps one full group and loses nothing, so every
    Stage-3 mask with 8 SWA groups scores 1: the search warns and counts them."""
    import logging

    from bosch_eval.masks.head_mask import ModelShape
    from bosch_eval.search.run.pipeline import SearchSettings, run_search

    shape = ModelShape(num_layers=4, num_heads=3, num_kv_heads=3)
    asked: dict[tuple, float] = {}

    def score(mask) -> float:
        asked[mask.bits] = _saturated_at_two_of_three(mask)
        return asked[mask.bits]

    settings = SearchSettings(ratio=0.5, budget_per_layer=8, buckets=(0.0, 2 / 3))
    with caplog.at_level(logging.WARNING, logger="bosch_eval.search"):
        result = run_search(score, shape, settings, progress=False)
    tied = [
        bits
        for bits, s in asked.items()
        if s == result.score and sum(row.count(0) for row in bits) == result.mask.num_swa_groups
    ]
    assert result.ties is not None and result.ties.scored == len(tied) - 1 > 0 and result.ties.may_tie == 0
    assert result.provenance()["ties"] == {"scored": len(tied) - 1, "may_tie": 0}
    warnings = [r.getMessage() for r in caplog.records if r.getMessage().startswith("search: ")]
    assert warnings == [f"search: {result.ties.message()}"] and "cannot tell them apart" in warnings[0]


def test_no_tie_warning_when_every_mask_scores_differently(caplog):
    """S falls by a different power of two for every SWA group: no two masks tie."""
    import logging

    from bosch_eval.masks.head_mask import ModelShape
    from bosch_eval.search.run.pipeline import SearchSettings, run_search

    shape = ModelShape(num_layers=4, num_heads=3, num_kv_heads=3)

    def score(mask) -> float:
        cells = [bit for row in mask.bits for bit in row]
        return 1.0 - sum(2.0 ** -(index + 2) for index, bit in enumerate(cells) if bit == 0)

    with caplog.at_level(logging.WARNING, logger="bosch_eval.search"):
        result = run_search(score, shape, SearchSettings(ratio=0.5, budget_per_layer=8), progress=False)
    assert result.ties is not None and (result.ties.scored, result.ties.may_tie) == (0, 0)
    assert not [r for r in caplog.records if r.getMessage().startswith("search: ")]
