"""Stage 1's saturation check: layers whose best Stage-1 score reaches S(full)."""

from __future__ import annotations

from bosch_eval.search.saturation import stage1_saturation


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
    from bosch_eval.search.pipeline import SearchSettings, run_search

    shape = ModelShape(num_layers=2, num_heads=4, num_kv_heads=2)
    score = lambda mask: 1.0 if mask.num_swa_groups <= 2 else 0.5 if mask.num_swa_groups < 4 else 0.0  # noqa: E731
    with caplog.at_level(logging.INFO, logger="bosch_eval.search"):
        run_search(score, shape, SearchSettings(ratio=0.5, budget_per_layer=4, buckets=(0.0, 0.5, 1.0)), progress=False)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and "stage 1:" in r.getMessage()]
    assert warnings == ["stage 1: 2 of 2 layers lose nothing in Stage 1 (layers 0, 1): the calibration set is saturated at "
                        "this ratio, so Stage 2 cannot order those layers and Stage 3 will choose among equal scores; "
                        "check it with `bosch-eval calib-check` before trusting the mask"]  # fmt: skip
