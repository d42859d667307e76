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
