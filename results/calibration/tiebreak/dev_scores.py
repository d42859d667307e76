"""Development-split scores of BOSCH masks (issue 29: the tie-break choice is made here, not
on the test set). Writes dev_scores.md beside this file.

    python results/calibration/tiebreak/dev_scores.py MASK.json [MASK.json ...]

Each mask is scored on its calibration set (``bosch_niah_calib`` acc, 64 examples at 1024
tokens: in-sample for a mask searched on it) and on ``bosch_niah_dev`` (seed 1, 8 documents
per variant at 512 and 1024 tokens), the settings of ``../check-niah-calib``.
"""

from __future__ import annotations

import json
import shlex
import sys
from importlib.metadata import version
from pathlib import Path

from bosch_eval.masks.head_mask import HeadMask
from bosch_eval.search.objective import CalibrationObjective
from bosch_eval.search.objective_loading import CalibrationSettings, LoadSettings, build_objective

DEV = {"dev_lengths": [512, 1024], "dev_samples": 8}


def main() -> None:
    calib = build_objective("toy-l", CalibrationSettings(tasks=("bosch_niah_calib",)), LoadSettings(device="cpu", batch_size=8))
    model = {key: calib.metadata[key] for key in ("pretrained", "tokenizer")}
    dev = CalibrationObjective(calib.lm, ["bosch_niah_dev"], metadata={**model, **DEV})
    lines = [f"$ {shlex.join(['python', *sys.argv])}", "",
             f"versions: {json.dumps({n: version(n) for n in ('bosch-eval', 'lm_eval', 'torch', 'transformers')})}", "",
             "| mask | bosch_niah_calib acc (in-sample) | bosch_niah_dev acc |", "|---|---|---|"]  # fmt: skip
    for path in sys.argv[1:]:
        mask = HeadMask.load(path)
        lines.append(f"| {path} | {calib(mask):.3f} | {dev(mask):.3f} |")
        print(lines[-1], flush=True)
    (Path(__file__).parent / "dev_scores.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
