"""``bosch-eval calib-check``: score the check's panel of masks on a calibration and a dev task.

    bosch-eval calib-check --model toy-l --calib bosch_niah_calib --dev bosch_niah_dev \
        --dev-metadata '{"dev_lengths": [512, 1024]}' --ranking fisher=fisher.json --out check

Every score is appended to ``<out>/scores.jsonl`` as it is made, so a killed check resumes
where it stopped when run again with the same settings (``<out>/settings.json``); other
settings on that ``--out`` are refused unless ``--new-settings`` (the old files then move to
``<out>/previous/``). ``check.json`` and ``report.md`` (the command and versions first) are
rewritten as scores arrive, marked partial until every mask is scored: a check that takes a
day on a CPU shows each ratio's verdict as soon as that ratio's masks are all scored.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from bosch_eval.search.objective.defaults import DEFAULT_CALIB_METRIC, DEFAULT_CALIB_TASK, PAPER_CALIB_TASK


DEFAULT_DEV = "bosch_niah_dev"

# What --help shows (the module docstring is for the code: its markup would print as is).
DESCRIPTION = """\
Score one panel of masks on a calibration task and on a development task, per SWA ratio, and
say whether the calibration ranks masks the way the development split does.

example:
  bosch-eval calib-check --model toy-l --calib bosch_niah_calib --dev bosch_niah_dev \\
      --dev-metadata '{"dev_lengths": [512, 1024]}' --ranking fisher=fisher.json --out check

Every score is appended to OUT/scores.jsonl as it is made: a killed check, run again with the
same settings, resumes where it stopped. Other settings on the same --out are refused unless
--new-settings is given (the old files then move to OUT/previous/). OUT/check.json and
OUT/report.md are rewritten as scores arrive, marked partial until every mask is scored; a
ratio's verdict appears once all its masks are scored.
"""


def add_calib_check_parser(subparsers: Any) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "calib-check",
        help="is a calibration set fit for the search? masks scored on it and on a dev split, per ratio",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--model",
        required=True,
        help="HF id or local directory; toy / toy-l are the bundled models, smollm2 the packaged one, or a .gguf file",
    )
    parser.add_argument("--calib", help=f"calibration task (default {DEFAULT_CALIB_TASK}; toys: {PAPER_CALIB_TASK})")
    parser.add_argument("--calib-metadata", type=json.loads, default={}, help="JSON metadata for the calibration task")
    parser.add_argument(
        "--calib-metric",
        nargs="+",
        default=[DEFAULT_CALIB_METRIC],
        help=f"metric of the calibration task, as the search's --calib-metric (default {DEFAULT_CALIB_METRIC}); several (e.g. acc acc_tiebreak "
        "prob) are read from the same evaluation of each mask and each gets its Spearman and verdict, the first the headline",
    )
    parser.add_argument(
        "--dev", default=DEFAULT_DEV, help=f"development task, never the test set (default {DEFAULT_DEV})"
    )
    parser.add_argument("--dev-metadata", type=json.loads, default={}, help="JSON metadata for the dev task")
    parser.add_argument(
        "--dev-metric", default="acc", help="metric of the dev task (default acc; score for bosch_niah_dev_gen)"
    )
    parser.add_argument(
        "--dev-gen-kwargs",
        type=json.loads,
        default={},
        help="JSON generation settings of a generation-scored dev task, e.g. '{\"max_gen_toks\": 64}'",
    )
    parser.add_argument("--ratios", type=float, nargs="+", default=[0.5, 0.75, 0.875], help="SWA ratios to check")
    parser.add_argument("--random", type=int, default=20, help="random masks per ratio")
    parser.add_argument(
        "--ranking", action="append", default=[], metavar="NAME=FILE", help="a bosch-ranking/1 file (repeatable)"
    )
    parser.add_argument(
        "--mask", action="append", default=[], metavar="NAME=FILE", help="a bosch-mask/1 file to place (repeatable)"
    )
    parser.add_argument("--window", type=int, help="SWA window (default: the model's bosch_defaults.json)")
    parser.add_argument(
        "--sink",
        type=int,
        help="attention-sink positions every SWA query also sees, for every mask scored (default 0, as the paper's SWA)",
    )
    parser.add_argument("--calib-len", type=int, help="calibration length in tokens (default: bosch_defaults.json)")
    parser.add_argument("--calib-examples", type=int, help="calibration examples (default 64)")
    parser.add_argument("--device", help="cpu or cuda (default: cuda when torch sees a GPU, else cpu)")
    parser.add_argument("--batch-size", type=int, default=8, help="lm-eval batch size")
    parser.add_argument("--dtype", help="model dtype, e.g. bfloat16 (default: the checkpoint's); use the search's")
    parser.add_argument(
        "--no-probes",
        action="store_true",
        help="leave out the one-layer probes (the layer drops, two scores per layer) when only the ratios' verdicts are wanted",
    )
    parser.add_argument(
        "--out", type=Path, required=True, help="output directory (a killed check resumes there with the same settings)"
    )
    parser.add_argument(
        "--dev-scores-from",
        type=Path,
        metavar="CHECK",
        help="take the dev scores of the same masks from another check's output directory, made with the same "
        "model, dev task, window, dtype, sinks and mask files (a check of another calibration set or metric "
        "then scores only its calibration side)",
    )
    parser.add_argument(
        "--new-settings",
        action="store_true",
        help="--out holds a check made with other settings: move its files to --out/previous/ and start afresh "
        "(without it, such a check is refused)",
    )
    parser.set_defaults(run=run_from_args)
    return parser


def run_from_args(args: argparse.Namespace) -> None:
    from bosch_eval.search.check.runner import run_check  # the check: numpy, torch, lm-eval, not for --help

    run_check(args)
