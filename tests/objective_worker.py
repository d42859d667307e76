"""One process of a data-parallel objective run (``tests/test_objective_distributed.py``).

    accelerate launch --multi_gpu --num_processes 2 tests/objective_worker.py MODEL_DIR TASK_DIR OUT_DIR

Each process scores ``helpers.masks`` (``helpers.score_masks``) and writes
``OUT_DIR/rank<i>.json``: its scores and the documents its adapter was asked to score.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from helpers import score_masks  # this script's directory (tests/) is on sys.path


def main(argv: list[str]) -> None:
    model_dir, task_dir, out_dir = argv
    report = score_masks(model_dir, task_dir)
    Path(out_dir, f"rank{report['rank']}.json").write_text(json.dumps(report))


if __name__ == "__main__":
    main(sys.argv[1:])
