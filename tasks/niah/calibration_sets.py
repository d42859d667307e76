"""The calibration sets by task name, for code that reads their examples directly (rankers).

Names only at import time (the rank command's parser must not import torch); a set's
module is imported when its examples are asked for.
"""

from __future__ import annotations

import importlib
from typing import Any

# task -> (module, keyword arguments of its ``examples`` that the task's YAML metadata sets)
CALIBRATION_SETS: dict[str, tuple[str, dict[str, Any]]] = {
    "bosch_niah_calib": ("calibration", {}),
    "bosch_niah_calib_uuid": ("calibration", {"values": "uuid"}),
    "bosch_niah_calib_formats": ("calibration", {"values": "mixed"}),
    "bosch_retrieval_calib": ("retrieval_calib", {}),
}
DEFAULT_CALIBRATION = "bosch_niah_calib"


def calibration_examples(
    task: str, tokenizer: Any, seq_len: int, num_examples: int, seed: int
) -> tuple[dict[str, Any], ...]:
    """The examples of calibration set ``task`` (``input``, ``target``, ...), as its lm-eval task builds them.

    Raises:
        ValueError: ``task`` is not a calibration set, naming the ones there are.
    """
    if task not in CALIBRATION_SETS:
        raise ValueError(f"calibration task {task!r}: expected one of {sorted(CALIBRATION_SETS)}")
    module, options = CALIBRATION_SETS[task]
    examples = importlib.import_module(f"bosch_eval.tasks.niah.{module}").examples
    return examples(tokenizer, seq_len=seq_len, num_examples=num_examples, seed=seed, **options)
