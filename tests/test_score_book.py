"""The ScoreBook's contract with a racing score function (``RacingScoreFunction``)."""

from __future__ import annotations

import pytest

from bosch_eval.masks.head_mask import ModelShape
from bosch_eval.search.objective.score_book import RacingScoreFunction, ScoreBook

SHAPE = ModelShape(num_layers=2, num_heads=4, num_kv_heads=2)


class HalfRacer:
    """Callable with ``race`` and ``recall`` but not ``race_many`` or ``use_memo``."""

    def __call__(self, mask):  # noqa: ANN001, ANN204
        return 0.0

    def race(self, mask, can_win):  # noqa: ANN001, ANN201
        return 0.0

    def recall(self, mask):  # noqa: ANN001, ANN201
        return None


def test_a_racing_book_names_the_methods_a_score_function_lacks():
    assert not isinstance(HalfRacer(), RacingScoreFunction)
    with pytest.raises(TypeError, match=r"lacks the RacingScoreFunction methods race_many, use_memo"):
        ScoreBook(HalfRacer(), SHAPE, racing=True)
    ScoreBook(HalfRacer(), SHAPE)  # a plain book needs only a callable


def test_the_search_objective_is_a_racing_score_function():
    from bosch_eval.search.objective.calibration import CalibrationObjective

    assert all(callable(getattr(CalibrationObjective, name)) for name in ("race", "race_many", "recall", "use_memo"))
