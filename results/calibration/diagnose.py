"""Issue 29, step 1: do the committed toy-l masks keep what bosch_niah_calib measures, or only
its seed and its format? Scores on bosch_niah_calib variants, written to diagnosis.json/.md.

    python results/calibration/diagnose.py --out results/calibration

Variants (metadata of bosch_niah_calib, 64 examples at 1024 tokens): ``seed0`` (the search's
own examples: in-sample for BOSCH), ``seed1`` (other examples, same format), ``plain`` (the
query does not repeat the needle: "Reply: The code is"), ``distract3`` (three more needles
with other keys and values; chance is 1/4 for a model that copies a number at random).
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from importlib.metadata import version
from pathlib import Path

from bosch_eval.masks.head_mask import HeadMask, HeadRanking
from bosch_eval.search.objective import CalibrationObjective
from bosch_eval.search.objective_loading import CalibrationSettings, build_objective

ROOT = Path("results/toy_l")
VARIANTS = {"seed0": {}, "seed1": {"calib_seed": 1}, "plain": {"calib_query": "plain"}, "distract3": {"calib_distractors": 3}}


def masks(window: int, shape) -> dict[str, HeadMask]:
    out = {"full": HeadMask.uniform(shape, full=True, window=window)}
    for ratio in (0.5, 0.75, 0.875):
        out[f"bosch-r{ratio}"] = HeadMask.load(ROOT / f"search/bosch-r{ratio}/mask.json")
        out[f"fisher-r{ratio}"] = HeadRanking.load(ROOT / "rankings/fisher.json").to_mask(ratio, window=window)
    out["razor-r0.5"] = HeadRanking.load(ROOT / "rankings/razor.json").to_mask(0.5, window=window)
    out["proxy-r0.75"] = HeadRanking.load(ROOT / "rankings/proxy.json").to_mask(0.75, window=window)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    first = build_objective("toy-l", CalibrationSettings(tasks=("bosch_niah_calib",), length=1024, examples=64))
    objectives = {name: CalibrationObjective(first.lm, ["bosch_niah_calib"], metadata={**first.metadata, **meta})
                  for name, meta in VARIANTS.items()}  # fmt: skip
    window = first.lm.head_mask.window
    scores = {name: {variant: objective(mask) for variant, objective in objectives.items()} for name, mask in masks(window, first.shape).items()}
    report = {"command": shlex.join(["python", *sys.argv]),
              "versions": {n: version(n) for n in ("bosch-eval", "lm_eval", "torch", "transformers")}, "scores": scores}  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "diagnosis.json").write_text(json.dumps(report, indent=1) + "\n")
    lines = [f"$ {report['command']}", "", f"versions: {json.dumps(report['versions'])}", "",
             "bosch_niah_calib acc, 64 examples at 1024 tokens (seed0 is in-sample for the BOSCH masks)", "",
             "| mask | " + " | ".join(VARIANTS) + " |", "|---|" + "---|" * len(VARIANTS)]  # fmt: skip
    lines += [f"| {name} | " + " | ".join(f"{row[v]:.3f}" for v in VARIANTS) + " |" for name, row in scores.items()]
    (args.out / "diagnosis.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
