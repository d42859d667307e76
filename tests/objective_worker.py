"""Test helper: calibration tasks with a continuous metric, and one process of a
data-parallel objective run (``tests/test_objective_distributed.py``).

    accelerate launch --multi_gpu --num_processes 2 tests/objective_worker.py MODEL_DIR TASK_DIR OUT_DIR

Each process scores :func:`masks` and writes ``OUT_DIR/rank<i>.json``: its scores and the
documents its adapter was asked to score.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from bosch_eval.masks import HeadMask, ModelShape

# bosch_niah_calib's documents, scored with a continuous metric as well as acc: a random
# model never gets every answer token right, so acc alone is 0 for every mask.
PPL_TASK = "bosch_objective_ppl"
DOT_TASK = "bosch_objective_dot"  # the same documents, the target followed by "."
PLAIN_GROUP = "bosch_objective_group"  # no aggregate_metric_list: S = mean of its tasks
CALIB_METADATA = {"seq_len": 320, "num_examples": 6, "calib_seed": 0}
WINDOW = 8

_TASK = """\
task: {name}
dataset_path: ""
output_type: loglikelihood
test_split: test
custom_dataset: !function bosch_eval.tasks.niah.calibration.dataset
doc_to_text: "{{{{input}}}}"
doc_to_target: " {{{{target}}}}{suffix}"
target_delimiter: ""
metric_list:
  - metric: perplexity
    aggregation: perplexity
    higher_is_better: false
  - metric: acc
    aggregation: mean
    higher_is_better: true
metadata:
  version: 1.0
"""
_GROUP = """\
group: {name}
task: [{tasks}]
metadata:
  version: 1.0
"""


def write_tasks(directory: Path) -> Path:
    """Write the test tasks and group into ``directory`` (an lm-eval include path)."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{PPL_TASK}.yaml").write_text(_TASK.format(name=PPL_TASK, suffix=""))
    (directory / f"{DOT_TASK}.yaml").write_text(_TASK.format(name=DOT_TASK, suffix="."))
    (directory / f"{PLAIN_GROUP}.yaml").write_text(_GROUP.format(name=PLAIN_GROUP, tasks=f"{PPL_TASK}, {DOT_TASK}"))
    return directory


def masks(shape: ModelShape) -> list[HeadMask]:
    """All full, all SWA, and a checkerboard of the two."""
    checker = [[(layer + group) % 2 for group in range(shape.num_kv_heads)] for layer in range(shape.num_layers)]
    return [
        HeadMask.uniform(shape, full=True),
        HeadMask.uniform(shape, full=False),
        HeadMask.from_rows(checker, shape.num_heads),
    ]


def score_masks(model_dir: str, task_dir: str) -> dict[str, Any]:
    """Build the objective once, score :func:`masks`, record what this process scored."""
    from bosch_eval.search.objective_loading import build_objective

    objective = build_objective(
        model_dir,
        tasks=[PPL_TASK],
        include_path=task_dir,
        calib_examples=CALIB_METADATA["num_examples"],
        calib_len=CALIB_METADATA["seq_len"],
        metric="perplexity",
        dtype="float32",
        batch_size=1,  # a document's score does not depend on its shard's other documents
        window=WINDOW,
    )
    lm = objective.lm
    seen: list[list[int]] = []
    loglikelihood = lm.loglikelihood

    def recording(requests: list[Any], *args: Any, **kwargs: Any) -> Any:
        seen.append(sorted(request.doc_id for request in requests))
        return loglikelihood(requests, *args, **kwargs)

    lm.loglikelihood = recording  # evaluate() looks the method up on the instance
    scores = [objective(mask) for mask in masks(objective.shape)]
    return {"rank": lm.rank, "world_size": lm.world_size, "scores": scores, "docs": seen, "calls": objective.calls}


def main(argv: list[str]) -> None:
    model_dir, task_dir, out_dir = argv
    report = score_masks(model_dir, task_dir)
    Path(out_dir, f"rank{report['rank']}.json").write_text(json.dumps(report))


if __name__ == "__main__":
    main(sys.argv[1:])
