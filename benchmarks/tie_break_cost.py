"""What the prefix cache saves a tie-break (``search --tie-break-tasks``), measured side by side.

The candidates are a finished search's found mask and the masks its calibration set tied with
it (``bosch_eval.search.check.saturation.search_ties``), in the tie-break's order. The
first ``--candidates`` of them are scored on the tie-break task twice with one objective:
every layer run for each mask, then each run from the layer
:func:`bosch_eval.search.objective.tie_break.shared_rows_layer` picks, so that the layers below are
computed once per run of candidates that share them. The scores must be equal (the cache is
exact); the ratio of the two wall times is the saving on those candidates, printed beside the
cost model's share of layer computations for them and for all candidates. Racing is off: every
candidate forwards every example.

    # SmolLM2's ρ = 0.75 ties, 8 candidates on 8 of the 64 examples (results/smollm2/tiebreak_cost.md)
    python benchmarks/tie_break_cost.py --search results/smollm2/search/bosch-r0.75 --task bosch_niah_calib_uuid \
        --candidates 8 --limit 8 --dtype float32 --out results/smollm2/tiebreak_cost.md
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path
from typing import Any

import torch

from bosch_eval.masks.head_mask import HeadMask
from bosch_eval.runtime.threads import apply_thread_policy
from bosch_eval.runtime.versions import versions
from bosch_eval.search.journal.store import read_records
from bosch_eval.search.objective.loading import CalibrationSettings, LoadSettings, build_objective
from bosch_eval.search.check.saturation import search_ties
from bosch_eval.search.objective.tie_break import layer_computations, shared_rows_layer, tie_key_bits


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--search", type=Path, required=True, help="a finished search's directory (journal, mask.json)")
    parser.add_argument("--task", required=True, help="the tie-break task")
    parser.add_argument("--candidates", type=int, default=8, help="how many candidates, in the tie-break's order")
    parser.add_argument("--limit", type=int, help="examples per task (lm-eval's limit; default: all)")
    parser.add_argument("--dtype", help="model dtype (default: the checkpoint's)")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--prefix-cache-mb", type=int, default=2560)
    parser.add_argument("--out", type=Path, required=True, help="a .md file; the numbers go beside it as .json")
    args = parser.parse_args(argv)
    apply_thread_policy()
    header = next(read_records(args.search / "journal.jsonl"))["header"]
    found, ties = search_ties(args.search)
    everyone = [found, *ties.keys]  # the tie-break's order
    chosen = everyone[: args.candidates]
    layer = shared_rows_layer(everyone)
    calibration = header["calibration"]["metadata"]
    objective = build_objective(
        header["model"],
        CalibrationSettings(
            tasks=(args.task,), metric=header["calibration"]["metric"], examples=calibration["num_examples"],
            length=calibration["seq_len"], seed=calibration["calib_seed"], limit=args.limit,
        ),
        LoadSettings(
            window=header["window"], device=args.device, batch_size=args.batch_size, dtype=args.dtype,
            model_args=header.get("model_args"), prefix_cache_mb=args.prefix_cache_mb,
        ),
    )  # fmt: skip
    num_heads = objective.shape.num_heads
    objective(HeadMask(tie_key_bits(chosen[0]), num_heads))  # warm-up: lm-eval's first call, allocator, kernels

    def one_pass(start: int | None) -> tuple[float, list[float]]:
        objective.vary_layers_from(start)
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()
        began = time.perf_counter()
        scores = [objective(HeadMask(tie_key_bits(key), num_heads)) for key in chosen]
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()
        return time.perf_counter() - began, scores

    every_s, every_scores = one_pass(None)
    cached_s, cached_scores = one_pass(layer)
    objective.vary_layers_from(None)
    if cached_scores != every_scores:
        raise SystemExit(f"the prefix cache changed a score: {cached_scores} against {every_scores}")
    write(args, argv if argv is not None else sys.argv[1:], {
        "candidates": len(chosen), "of": len(everyone), "layer": layer, "examples": args.limit or calibration["num_examples"],
        "every_layer_s": round(every_s, 2), "cached_s": round(cached_s, 2), "measured_ratio": round(cached_s / every_s, 3),
        "model_ratio_these": round(layer_computations(chosen, layer) / layer_computations(chosen, None), 3),
        "model_ratio_all": round(layer_computations(everyone, layer) / layer_computations(everyone, None), 3),
        "scores": every_scores,
    })  # fmt: skip
    return 0


def write(args: argparse.Namespace, argv: list[str], row: dict[str, Any]) -> None:
    device = (
        torch.cuda.get_device_name() if args.device.startswith("cuda") else f"cpu ({torch.get_num_threads()} threads)"
    )
    lines = [
        f"# The tie-break's cost with the prefix cache: {args.search}, task {args.task}, dtype {args.dtype or 'the checkpoint'}, {device}",
        "",
        f"`{shlex.join(['python', 'benchmarks/tie_break_cost.py', *argv])}`; "
        + ", ".join(f"{name} {version}" for name, version in versions("torch", "transformers", "lm_eval").items()),
        "",
        f"The first {row['candidates']} of the {row['of']} candidates, {row['examples']} examples each; "
        f"the cache runs each candidate from layer {row['layer']}.",
        "",
        "| | every layer | from the shared rows | ratio |",
        "|---|---|---|---|",
        f"| wall time, s (measured, these candidates) | {row['every_layer_s']:.1f} | {row['cached_s']:.1f} | {row['measured_ratio']:.2f}x |",
        f"| layer computations (the cost model, these candidates) | 1 | {row['model_ratio_these']:.3f} | {row['model_ratio_these']:.2f}x |",
        f"| layer computations (the cost model, all {row['of']} candidates) | 1 | {row['model_ratio_all']:.3f} | {row['model_ratio_all']:.2f}x |",
        "",
        f"Scores, equal in both passes: {', '.join(f'{score:.4f}' for score in row['scores'])}.",
    ]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines) + "\n")
    args.out.with_suffix(".json").write_text(json.dumps({"device": device, "argv": argv, **row}, indent=1) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
