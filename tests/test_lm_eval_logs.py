"""lm-eval's per-length warnings (RULER-style metrics) are dropped; the same warnings about
other metrics still show."""

from __future__ import annotations

import logging

import pytest

from bosch_eval.runtime.lm_eval_logs import quiet_per_length_warnings

LENGTH_NOISE = [
    "[niah_single_1] No aggregation function defined for metric 512. Using mean.",
    "[niah_single_1] Metrics were not scored on the same number of documents (1024,none=32, 4096,none=64, 512,none=32). "
    "Each metric was aggregated over only the documents that produced it; reporting 64 as the evaluated sample count.",
    "[bosch_niah_single_1] Metrics were not scored on the same number of documents (1024,none=20, 512,none=20, score,none=40). ...",
]
REAL = [
    "[my_task] No aggregation function defined for metric f1. Using mean.",
    "[my_task] Metrics were not scored on the same number of documents (acc,none=10, f1,none=7). Each metric ...",
    "[my_task] Metrics were not scored on the same number of documents (score,none=10, f1,none=7). ...",
]


class Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def logged(message: str) -> list[str]:
    """What a handler on lm-eval 0.4.13's logger for these warnings receives."""
    logger, handler = logging.getLogger("lm_eval.evaluator_utils"), Collect()
    logger.addHandler(handler)
    try:
        logger.warning(message)
    finally:
        logger.removeHandler(handler)
    return handler.messages


@pytest.mark.parametrize(("message", "shown"), [(m, False) for m in LENGTH_NOISE] + [(m, True) for m in REAL])
def test_only_per_length_warnings_are_dropped(message, shown):
    quiet_per_length_warnings()
    assert logged(message) == ([message] if shown else [])


HINT = ": Custom kwargs can be passed to `--metadata` in console (as json string) or to the TaskManager.\nFor example"


def test_the_metadata_hint_is_dropped_for_ruler_and_our_tasks_only():
    """The filter stays installed for the rest of the process: other tasks keep their hint."""
    quiet_per_length_warnings()
    logger, handler = logging.getLogger("lm_eval.api.task"), Collect()
    logger.addHandler(handler)
    try:
        for task in ["niah_single_1", "ruler_vt", "bosch_niah_single_1", "babilong_qa1", "other_task"]:
            logger.warning(task + HINT)
        logger.warning("niah_single_1: something else")
    finally:
        logger.removeHandler(handler)
    assert handler.messages == ["babilong_qa1" + HINT, "other_task" + HINT, "niah_single_1: something else"]


def test_the_adapter_installs_the_filter(tiny_model_dir):
    from bosch_eval.model_adapters.bosch import BoschLM

    logger = logging.getLogger("lm_eval.evaluator_utils")
    for installed in [f for f in logger.filters if type(f).__name__ == "_PerLengthNoise"]:
        logger.removeFilter(installed)
    quiet_per_length_warnings.cache_clear()
    assert logged(LENGTH_NOISE[0]) == [LENGTH_NOISE[0]]
    BoschLM(pretrained=str(tiny_model_dir), device="cpu", mask="full")
    assert logged(LENGTH_NOISE[0]) == []
