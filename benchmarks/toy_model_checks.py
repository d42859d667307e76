"""Measure what the toy model's card promises, with lm-eval, and write it down.

    python benchmarks/toy_model_checks.py --model bosch_eval/toy/model --out results/toy_model

1. ``bosch_niah_calib`` (64 examples at the card's calibration length, scored by the
   search's objective): full attention, every KV group SWA, and 20 random masks at
   ρ = 0.5 and 0.75 (seeds 0–19) — the search needs b > a and masks that differ.
2. lm-eval's upstream RULER ``niah_single_1`` at 512 and 1024 tokens, the first
   ``--ruler-samples`` documents of each length (RULER generates 500 per length), with
   full attention and with every KV group SWA.

Writes ``toy_model_checks.json`` and ``toy_model_checks.md`` (command and versions first).
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path
from typing import Any

import lm_eval

from bosch_eval.masks.head_mask import HeadMask
from bosch_eval.masks.layer_heuristics import random_masks
from bosch_eval.models.model_defaults import model_defaults
from bosch_eval.runtime.doc_selection import per_length_indices
from bosch_eval.runtime.versions import versions
from bosch_eval.search.objective.loading import CalibrationSettings, LoadSettings, build_objective

RULER_LENGTHS = (512, 1024)
RULER_DOCS_PER_LENGTH = 500  # lm-eval's niah_utils generates this many per length


def calibration_scores(
    model: str, calibration: CalibrationSettings, window: int, ratios: list[float], random_count: int
) -> dict[str, Any]:
    """``acc`` of bosch_niah_calib for full, all-SWA and random masks, scored by the search's
    own objective (same settings as ``bosch-eval search``, so the numbers compare)."""
    objective = build_objective(model, calibration, LoadSettings(window=window))
    shape = objective.shape
    randoms = {
        str(ratio): [objective(mask) for mask in random_masks(shape, ratio, range(random_count), window)]
        for ratio in ratios
    }
    return {
        "full": objective(HeadMask.uniform(shape, full=True, window=window)),
        "all_swa": objective(HeadMask.uniform(shape, full=False, window=window)),
        "random": randoms,
        "random_spread": {ratio: max(scores) - min(scores) for ratio, scores in randoms.items()},
    }


def ruler_indices(samples_per_length: int) -> list[int]:
    """Document indices of the first ``samples_per_length`` RULER documents of each length
    (lm-eval orders them by length, so a plain ``--limit`` would keep only the first length)."""
    lengths = [length for length in RULER_LENGTHS for _ in range(RULER_DOCS_PER_LENGTH)]  # niah_utils' order
    return per_length_indices(lengths, samples_per_length)


def ruler_scores(model: str, window: int, samples_per_length: int) -> dict[str, dict[str, float]]:
    """Upstream ``niah_single_1`` (lm-eval's own task) with full attention and all-SWA."""
    indices = ruler_indices(samples_per_length)
    scores = {}
    for name, ratio in (("full", 0.0), ("all_swa", 1.0)):
        results = lm_eval.simple_evaluate(
            model="bosch",
            model_args=f"pretrained={model},layers=intr,ratio={ratio},window={window},dtype=float32",
            tasks=["niah_single_1"],
            metadata={"max_seq_lengths": list(RULER_LENGTHS)},
            samples={"niah_single_1": indices},
            device="cpu",
            batch_size=8,
            log_samples=False,
            bootstrap_iters=0,
        )
        row = results["results"]["niah_single_1"]
        scores[name] = {str(length): row[f"{length},none"] for length in RULER_LENGTHS}
    return scores


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--model", required=True, help="checkpoint directory (the bundled one: bosch-eval toy-model --path)"
    )
    parser.add_argument("--out", type=Path, required=True, help="directory for toy_model_checks.json/.md")
    parser.add_argument("--window", type=int, help="SWA window (default: the model's bosch_defaults.json)")
    parser.add_argument("--calib-len", type=int, help="calibration length in tokens (default: bosch_defaults.json)")
    parser.add_argument("--calib-examples", type=int, help="bosch_niah_calib examples (default: the search's, 64)")
    parser.add_argument(
        "--random-masks", type=int, default=20, help="random masks per ratio scored on the calibration set"
    )
    parser.add_argument(
        "--random-ratios", type=float, nargs="+", default=[0.5, 0.75], help="SWA ratios of the random masks"
    )
    parser.add_argument("--ruler-samples", type=int, default=100, help="upstream niah_single_1 documents per length")
    args = parser.parse_args(argv)
    defaults = model_defaults(args.model)
    window, calib_len = args.window or defaults.window, args.calib_len or defaults.calib_len
    if window is None or calib_len is None:
        parser.error(f"{args.model} has no bosch_defaults.json; pass --window and --calib-len")

    started = time.time()
    report = {
        "command": shlex.join(
            [sys.executable, "benchmarks/toy_model_checks.py", *(sys.argv[1:] if argv is None else argv)]
        ),
        "versions": versions("bosch-eval", "lm_eval", "torch", "transformers"),
        "window": window,
        "calib_len": calib_len,
        "bosch_niah_calib": calibration_scores(
            args.model,
            CalibrationSettings(length=calib_len, examples=args.calib_examples),
            window,
            args.random_ratios,
            args.random_masks,
        ),
        "niah_single_1": ruler_scores(args.model, window, args.ruler_samples),
    }
    report["wall_time_s"] = round(time.time() - started, 1)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "toy_model_checks.json").write_text(json.dumps(report, indent=1) + "\n")
    (args.out / "toy_model_checks.md").write_text(render(report))
    print(render(report))


def render(report: dict[str, Any]) -> str:
    calib, ruler = report["bosch_niah_calib"], report["niah_single_1"]
    lines = [
        f"$ {report['command']}",
        "",
        f"versions: {json.dumps(report['versions'])}",
        f"window W={report['window']}, calibration length {report['calib_len']} tokens, wall time {report['wall_time_s']} s",
        "",
        "| check | full attention | every KV group SWA |",
        "|---|---|---|",
        f"| bosch_niah_calib acc | {calib['full']:.3f} | {calib['all_swa']:.3f} |",
        *(f"| niah_single_1 @ {n} | {ruler['full'][n]:.3f} | {ruler['all_swa'][n]:.3f} |" for n in ruler["full"]),
        "",
    ]
    for ratio, randoms in calib["random"].items():
        lines += [
            f"bosch_niah_calib acc of {len(randoms)} random masks at ρ = {ratio}: min {min(randoms):.3f}, "
            f"max {max(randoms):.3f}, spread {calib['random_spread'][ratio]:.3f}",
            f"  {', '.join(f'{score:.3f}' for score in randoms)}",
        ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
