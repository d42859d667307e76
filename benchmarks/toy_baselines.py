"""The baselines on the bundled toy model: valid, deterministic, timed, and scored.

    python benchmarks/toy_baselines.py [--out results/toy_model] [--ratios 0.25 0.5 0.75 0.875]

1. Each of the six rankers of paper B.3 runs twice on the search's calibration set
   (64 examples at the model's calibration length, its window); both runs must give the
   same scores, and the wall time of each is printed.
2. Masks at every ρ from each ranking, from the three layer heuristics (RAND with seeds
   0, 1, 2) and from one imported pattern are checked: right shape, ⌈ρ·L·G⌉ SWA groups
   (heuristics: ⌈ρ·L⌉ whole SWA layers), the same mask when built again. No published
   pattern exists for the toy model, so the imported one is a DuoAttention
   ``full_attention_heads.tsv`` written here from the DCAM ranking (gate = out-of-window
   mass of each query head's group) and read back by the DuoAttention importer.
3. Every mask at ``--score-ratios`` is scored by the search's objective
   (``bosch_niah_calib`` acc, the same numbers the search optimizes), next to the BOSCH
   and ``single`` masks in ``results/toy_search`` when they exist; RAND is the mean of its
   three seeds, as in the paper.

Writes ``toy_baselines.json`` and ``toy_baselines.md`` (command and versions first) to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from bosch_eval.masks.head_mask import HeadMask, HeadRanking, ModelShape, ceil_count
from bosch_eval.masks.layer_heuristics import layer_heuristic_mask
from bosch_eval.models.model_check import model_path
from bosch_eval.models.model_defaults import model_defaults
from bosch_eval.runtime.versions import versions
from bosch_eval.search.importers.duo import import_duo
from bosch_eval.search.objective.loading import CalibrationSettings, LoadSettings, build_objective
from bosch_eval.search.rankers import RANKERS
from bosch_eval.search.rankers.driver import RankingInputs, compute_ranking

HEURISTICS = {"rand": (0, 1, 2), "bme": (0,), "intr": (0,)}
SEARCHED = ("bosch", "single")


def time_rankings(path: str, window: int, calib_len: int) -> tuple[dict[str, HeadRanking], dict[str, Any]]:
    """Every ranker twice: its ranking, its wall time and whether both runs agree."""
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="sdpa")
    tokenizer = AutoTokenizer.from_pretrained(path)
    rankings, report = {}, {}
    for method in RANKERS.names():
        runs, seconds = [], []
        for _ in range(2):
            start = time.perf_counter()
            runs.append(compute_ranking(method, model, tokenizer, RankingInputs(window, 64, calib_len)))
            seconds.append(time.perf_counter() - start)
        rankings[method] = runs[0]
        report[method] = {"seconds": [round(s, 1) for s in seconds], "deterministic": runs[0].scores == runs[1].scores}
        print(
            f"{method}: {seconds[0]:.1f} s, {seconds[1]:.1f} s; same scores: {report[method]['deterministic']}",
            flush=True,
        )
    return rankings, report


def duo_pattern_from(ranking: HeadRanking, directory: Path) -> HeadRanking:
    """A DuoAttention-format file (one line per layer, one gate per query head, high =
    needs full attention) made from a DCAM ranking, read back by the importer."""
    per_group = ranking.shape.num_heads // ranking.shape.num_kv_heads
    path = directory / "full_attention_heads.tsv"
    lines = ["\t".join(f"{1.0 - score:.6f}" for score in row for _ in range(per_group)) for row in ranking.scores]
    path.write_text("\n".join(lines) + "\n")
    return import_duo(path, ranking.shape, model="toy")


def check_mask(mask: HeadMask, again: HeadMask, shape: ModelShape, ratio: float, whole_layers: bool) -> str | None:
    """What is wrong with ``mask`` as a ρ-mask of ``shape`` (None: valid)."""
    mask.check_fits(shape)
    if mask.bits != again.bits:
        return "not deterministic"
    if whole_layers:
        swa_layers = [layer for layer, row in enumerate(mask.bits) if not any(row)]
        partial = [layer for layer, row in enumerate(mask.bits) if any(row) and not all(row)]
        if partial or len(swa_layers) != ceil_count(ratio, shape.num_layers):
            return f"SWA layers {swa_layers}, partial {partial}; expected {ceil_count(ratio, shape.num_layers)} whole layers"
    elif mask.num_swa_groups != ceil_count(ratio, shape.num_layers * shape.num_kv_heads):
        return f"{mask.num_swa_groups} SWA groups, expected {ceil_count(ratio, shape.num_layers * shape.num_kv_heads)}"
    return None


def build_masks(
    rankings: dict[str, HeadRanking], shape: ModelShape, ratio: float, window: int
) -> tuple[dict[str, list[HeadMask]], dict[str, str]]:
    """Every baseline's mask(s) at ``ratio`` and the problems found (empty: all valid)."""
    masks, problems = {}, {}
    for name, ranking in rankings.items():
        masks[name] = [ranking.to_mask(ratio, window=window)]
        problems[name] = check_mask(
            masks[name][0], ranking.to_mask(ratio, window=window), shape, ratio, whole_layers=False
        )
    for name, seeds in HEURISTICS.items():
        built = [layer_heuristic_mask(name, shape, ratio, seed=seed).with_meta(window=window) for seed in seeds]
        masks[name.upper()] = built
        found = [
            check_mask(m, layer_heuristic_mask(name, shape, ratio, seed=s), shape, ratio, whole_layers=True)
            for m, s in zip(built, seeds)
        ]
        problems[name.upper()] = next((p for p in found if p), None)
    return masks, {name: problem for name, problem in problems.items() if problem}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("results/toy_model"))
    parser.add_argument("--ratios", type=float, nargs="+", default=[0.25, 0.5, 0.75, 0.875])
    parser.add_argument("--score-ratios", type=float, nargs="+", default=[0.5, 0.75])
    parser.add_argument(
        "--searches",
        type=Path,
        default=Path("results/toy_search"),
        help="BOSCH runs: <dir>/<variant>-r<ratio>/mask.json",
    )
    args = parser.parse_args(argv)
    path = model_path()
    defaults = model_defaults(path)
    window, calib_len = defaults.window, defaults.calib_len

    rankings, timing = time_rankings(path, window, calib_len)
    with tempfile.TemporaryDirectory() as tmp:
        rankings["duo-import"] = duo_pattern_from(rankings["dcam"], Path(tmp))
    shape = rankings["dcam"].shape
    per_ratio = {ratio: build_masks(rankings, shape, ratio, window) for ratio in args.ratios}
    for ratio, (_, problems) in per_ratio.items():
        print(
            f"ρ = {ratio}: " + (f"INVALID {problems}" if problems else "every mask valid and deterministic"), flush=True
        )

    objective = build_objective("toy", CalibrationSettings(length=calib_len), LoadSettings(window=window))
    scores: dict[str, dict[str, float]] = {}
    for ratio in args.score_ratios:
        masks = per_ratio[ratio][0] if ratio in per_ratio else build_masks(rankings, shape, ratio, window)[0]
        for variant in SEARCHED:
            found = args.searches / f"{variant}-r{ratio}" / "mask.json"
            if found.exists():
                masks[f"BOSCH ({variant})" if variant != "bosch" else "BOSCH"] = [HeadMask.load(found)]
        scores[str(ratio)] = {name: statistics.mean(objective(mask) for mask in group) for name, group in masks.items()}
        print(
            f"ρ = {ratio}: " + ", ".join(f"{name} {score:.3f}" for name, score in scores[str(ratio)].items()),
            flush=True,
        )

    report = {
        "command": shlex.join(
            [sys.executable, "benchmarks/toy_baselines.py", *(sys.argv[1:] if argv is None else argv)]
        ),
        "versions": versions("bosch-eval", "lm_eval", "torch", "transformers"),
        "window": window,
        "calib_len": calib_len,
        "ranker_seconds": timing,
        "invalid": {str(ratio): problems for ratio, (_, problems) in per_ratio.items() if problems},
        "bosch_niah_calib_acc": scores,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "toy_baselines.json").write_text(json.dumps(report, indent=1) + "\n")
    (args.out / "toy_baselines.md").write_text(render(report, args.ratios))
    print(render(report, args.ratios))


def render(report: dict[str, Any], ratios: list[float]) -> str:
    lines = [
        f"$ {report['command']}",
        "",
        f"versions: {json.dumps(report['versions'])}",
        f"toy model, W = {report['window']}, calibration 64 × {report['calib_len']} tokens, 2-core CPU",
        "",
        "| ranker | run 1 (s) | run 2 (s) | same scores |",
        "|---|---|---|---|",
        *(
            f"| {m} | {t['seconds'][0]} | {t['seconds'][1]} | {t['deterministic']} |"
            for m, t in report["ranker_seconds"].items()
        ),
        "",
        f"Masks at ρ ∈ {ratios} from the six rankings, RAND (seeds 0–2), BME, INTR and the imported "
        "DuoAttention-format pattern: "
        + (f"INVALID: {report['invalid']}" if report["invalid"] else "all valid and deterministic."),
        "",
    ]
    scores = report["bosch_niah_calib_acc"]
    if scores:
        columns = list(scores)
        names = list(dict.fromkeys(name for by_name in scores.values() for name in by_name))
        lines += [
            "bosch_niah_calib acc (the search's objective; RAND: mean of seeds 0–2):",
            "",
            "| mask | " + " | ".join(f"ρ = {c}" for c in columns) + " |",
            "|---|" + "---|" * len(columns),
            *(
                f"| {n} | " + " | ".join(f"{scores[c][n]:.3f}" if n in scores[c] else "-" for c in columns) + " |"
                for n in names
            ),
        ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
