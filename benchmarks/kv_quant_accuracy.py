"""Accuracy of KV quantization on a model, next to the 16-bit cache and a BOSCH mask.

    python benchmarks/kv_quant_accuracy.py --model toy --mask results/toy_search/bosch-r0.75/mask.json \\
        --kv-window 32 --out results/kv_quant

Configurations: the original cache, LogQuant 2-bit, KiVi 2-bit (same full-precision
budget), the BOSCH mask, and the BOSCH mask + LogQuant. Tasks: upstream ``niah_single_1``
(generation) scored per length on the first N documents of each length (lm-eval's
``--limit`` would keep only the first length's; ``benchmarks/toy_model_checks.py`` does the same),
and ``bosch_niah_calib`` (loglikelihood, the search's calibration set: in-sample for a
searched mask).
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
from lm_eval.tasks import TaskManager
from toy_model_checks import RULER_LENGTHS, ruler_indices  # benchmarks/ is sys.path[0] when run as a script

from bosch_eval.models.model_check import resolve_model
from bosch_eval.models.model_defaults import model_defaults
from bosch_eval.runtime.versions import versions
from bosch_eval.search.objective.defaults import DEFAULT_CALIB_EXAMPLES
from bosch_eval.tasks import TASKS_DIR


def configurations(mask: str, bits: int, kv_window: int) -> list[tuple[str, str]]:
    kv = f"kv_bits={bits},kv_window={kv_window}"
    return [
        ("16-bit (original cache)", "mask=full"),
        (f"LogQuant {bits}-bit (W_lq={kv_window})", f"mask=full,kv_quant=logquant,{kv}"),
        (f"KiVi {bits}-bit (same full-precision budget)", f"mask=full,kv_quant=kivi,{kv}"),
        ("BOSCH ρ=0.75", f"mask={mask}"),
        (f"BOSCH ρ=0.75 + LogQuant {bits}-bit", f"mask={mask},kv_quant=logquant,{kv}"),
    ]


def score(model: str, model_args: str, calib_len: int, samples_per_length: int) -> dict[str, float]:
    common = dict(model="bosch", model_args=f"pretrained={model},dtype=float32,{model_args}", device="cpu", batch_size=8,
                  log_samples=False, bootstrap_iters=0)  # fmt: skip
    indices = ruler_indices(samples_per_length)
    ruler = lm_eval.simple_evaluate(
        tasks=["niah_single_1"],
        metadata={"max_seq_lengths": list(RULER_LENGTHS)},
        samples={"niah_single_1": indices},
        **common,
    )["results"]["niah_single_1"]
    metadata = {
        "pretrained": model,
        "tokenizer": model,
        "calib_seed": 0,
        "seq_len": calib_len,
        "num_examples": DEFAULT_CALIB_EXAMPLES,
    }
    calib = lm_eval.simple_evaluate(
        tasks=["bosch_niah_calib"],
        task_manager=TaskManager(include_path=[str(TASKS_DIR)], include_defaults=False, metadata=metadata),
        **common,
    )["results"]["bosch_niah_calib"]
    out = {f"niah_single_1@{length}": ruler[f"{length},none"] for length in RULER_LENGTHS}
    out["bosch_niah_calib"] = calib["acc,none"]
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="toy", help="model id or directory (default: the bundled toy model)")
    parser.add_argument("--mask", required=True, help="the BOSCH mask file (bosch-mask/1)")
    parser.add_argument("--kv-bits", type=int, default=2, help="bits of the quantized KV (2 or 4)")
    parser.add_argument("--kv-window", type=int, required=True, help="W_lq (full precision keeps 2W..3W tokens)")
    parser.add_argument("--ruler-samples", type=int, default=100, help="niah_single_1 documents per length")
    parser.add_argument("--out", type=Path, required=True, help="directory for kv_quant_accuracy.json/.md")
    args = parser.parse_args(argv)
    model = resolve_model(args.model)
    calib_len = model_defaults(model).calib_len or 1024
    started = time.time()
    rows = {}
    for label, model_args in configurations(args.mask, args.kv_bits, args.kv_window):
        rows[label] = {"model_args": model_args, **score(model, model_args, calib_len, args.ruler_samples)}
        print(label, rows[label], flush=True)
    report = {
        "command": shlex.join(
            [sys.executable, "benchmarks/kv_quant_accuracy.py", *(sys.argv[1:] if argv is None else argv)]
        ),
        "versions": versions("bosch-eval", "lm_eval", "torch", "transformers"),
        "calib_len": calib_len,
        "rows": rows,
        "wall_time_s": round(time.time() - started, 1),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "kv_quant_accuracy.json").write_text(json.dumps(report, indent=1) + "\n")
    (args.out / "kv_quant_accuracy.md").write_text(render(report))
    print(render(report))


def render(report: dict[str, Any]) -> str:
    lines = [f"$ {report['command']}", "", f"versions: {json.dumps(report['versions'])}", f"wall time {report['wall_time_s']} s", "",
             f"| configuration | model_args | niah_single_1 @ {RULER_LENGTHS[0]} | @ {RULER_LENGTHS[1]} | bosch_niah_calib acc ({report['calib_len']} tokens) |",
             "|---|---|---|---|---|"]  # fmt: skip
    for label, row in report["rows"].items():
        in_sample = " (in-sample)" if "mask=full" not in row["model_args"] else ""
        lines.append(
            f"| {label} | `{row['model_args']}` | {row[f'niah_single_1@{RULER_LENGTHS[0]}']:.2f} | "
            f"{row[f'niah_single_1@{RULER_LENGTHS[1]}']:.2f} | {row['bosch_niah_calib']:.3f}{in_sample} |"
        )
    lines += ["", "in-sample: the BOSCH mask was searched on bosch_niah_calib (same seed and length)."]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
