"""Masks scored on variants of the calibration task and on the development split (results/calibration).

    python benchmarks/studies/calibration_scores.py variants --out results/calibration
    python benchmarks/studies/calibration_scores.py dev MASK.json [MASK.json ...] --out results/calibration/tiebreak/dev_scores.md

``variants`` (issue 29, step 1: do the committed toy-l masks keep what bosch_niah_calib
measures, or only its seed and its format?): the masks of results/toy_l on bosch_niah_calib
variants, 64 examples at 1024 tokens, written to OUT/diagnosis.json/.md: ``seed0`` (the
search's own examples: in-sample for BOSCH), ``seed1`` (other examples, same format),
``plain`` (the query does not repeat the needle: "Reply: The code is"), ``distract3`` (three
more needles with other keys and values; chance is 1/4 for a model that copies a number at
random).

``dev`` (issue 29: the tie-break choice is made on the development split, not on the test
set): each mask on its calibration set (``bosch_niah_calib`` acc, 64 examples at 1024
tokens: in-sample for a mask searched on it) and on ``bosch_niah_dev`` (seed 1, 8 documents
per variant at 512 and 1024 tokens), the settings of results/calibration/check-niah-calib.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from collections.abc import Callable, Mapping
from importlib.metadata import version
from pathlib import Path

from bosch_eval.masks.head_mask import HeadMask, HeadRanking, ModelShape
from bosch_eval.search.objective.calibration import CalibrationObjective
from bosch_eval.search.objective.loading import CalibrationSettings, LoadSettings, build_objective

TOY_L = Path("results/toy_l")
VARIANTS = {
    "seed0": {},
    "seed1": {"calib_seed": 1},
    "plain": {"calib_query": "plain"},
    "distract3": {"calib_distractors": 3},
}
DEV = {"dev_lengths": [512, 1024], "dev_samples": 8}
Score = Callable[[HeadMask], float]


def toy_l_masks(window: int, shape: ModelShape, root: Path = TOY_L) -> dict[str, HeadMask]:
    """The committed toy-l masks the diagnosis scores: full, BOSCH and Fisher at three ratios, Razor, Proxy."""
    out = {"full": HeadMask.uniform(shape, full=True, window=window)}
    for ratio in (0.5, 0.75, 0.875):
        out[f"bosch-r{ratio}"] = HeadMask.load(root / f"search/bosch-r{ratio}/mask.json")
        out[f"fisher-r{ratio}"] = HeadRanking.load(root / "rankings/fisher.json").to_mask(ratio, window=window)
    out["razor-r0.5"] = HeadRanking.load(root / "rankings/razor.json").to_mask(0.5, window=window)
    out["proxy-r0.75"] = HeadRanking.load(root / "rankings/proxy.json").to_mask(0.75, window=window)
    return out


def score_table(masks: Mapping[str, HeadMask], scores: Mapping[str, Score]) -> dict[str, dict[str, float]]:
    """mask name -> score name -> its score."""
    return {name: {column: score(mask) for column, score in scores.items()} for name, mask in masks.items()}


def header(argv: list[str]) -> list[str]:
    """A page's first lines: the command and the versions that made it."""
    versions = {name: version(name) for name in ("bosch-eval", "lm_eval", "torch", "transformers")}
    return [f"$ {shlex.join(['python', *argv])}", "", f"versions: {json.dumps(versions)}", ""]


def markdown_table(table: Mapping[str, Mapping[str, float]], columns: list[str]) -> list[str]:
    """A markdown table: one row per mask, one column per score, three decimals."""
    lines = ["| mask | " + " | ".join(columns) + " |", "|---|" + "---|" * len(columns)]
    return lines + [f"| {name} | " + " | ".join(f"{row[c]:.3f}" for c in columns) + " |" for name, row in table.items()]


def variants(out: Path, argv: list[str]) -> None:
    first = build_objective("toy-l", CalibrationSettings(tasks=("bosch_niah_calib",), length=1024, examples=64))
    objectives = {name: CalibrationObjective(first.lm, ["bosch_niah_calib"], metadata={**first.metadata, **meta})
                  for name, meta in VARIANTS.items()}  # fmt: skip
    scores = score_table(toy_l_masks(first.lm.head_mask.window, first.shape), objectives)
    lines = header(argv)
    report = {"command": lines[0][2:], "versions": json.loads(lines[2].removeprefix("versions: ")), "scores": scores}
    out.mkdir(parents=True, exist_ok=True)
    (out / "diagnosis.json").write_text(json.dumps(report, indent=1) + "\n")
    lines += ["bosch_niah_calib acc, 64 examples at 1024 tokens (seed0 is in-sample for the BOSCH masks)", ""]
    lines += markdown_table(scores, list(VARIANTS))
    (out / "diagnosis.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def dev(paths: list[str], out: Path, argv: list[str]) -> None:
    calib = build_objective(
        "toy-l", CalibrationSettings(tasks=("bosch_niah_calib",)), LoadSettings(device="cpu", batch_size=8)
    )
    model = {key: calib.metadata[key] for key in ("pretrained", "tokenizer")}
    objectives = {"bosch_niah_calib acc (in-sample)": calib,
                  "bosch_niah_dev acc": CalibrationObjective(calib.lm, ["bosch_niah_dev"], metadata={**model, **DEV})}  # fmt: skip
    scores = score_table({path: HeadMask.load(path) for path in paths}, objectives)
    lines = header(argv) + markdown_table(scores, list(objectives))
    out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    variants_parser = commands.add_parser("variants", help="toy-l's masks on bosch_niah_calib variants")
    variants_parser.add_argument("--out", type=Path, required=True, help="folder for diagnosis.json/.md")
    dev_parser = commands.add_parser("dev", help="masks on their calibration set and on bosch_niah_dev")
    dev_parser.add_argument("masks", nargs="+")
    dev_parser.add_argument("--out", type=Path, required=True, help="the markdown file to write")
    args = parser.parse_args(argv)
    command = ["benchmarks/studies/calibration_scores.py", *argv]
    if args.command == "variants":
        variants(args.out, command)
    else:
        dev(args.masks, args.out, command)


if __name__ == "__main__":
    main()
