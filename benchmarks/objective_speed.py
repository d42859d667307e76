"""The cost of one S() call (the search's objective) per configuration, measured side by side.

S(z) is the search's own objective (``build_objective``: lm-eval's evaluation of the ``bosch``
adapter on the calibration task, tasks built once, the mask swapped in place), without racing:
every call forwards every example. A configuration is a dtype and a mask source
(``dtype=bfloat16,layers=bme,ratio=0.75``; ``mask=full`` is the original model's forward). One
objective per dtype is loaded once; after one untimed warm-up call per configuration, the
timed calls go round the configurations in turn, so all of them see the same machine load;
medians over the repeats, on CUDA between synchronizations. Every ratio is against the first
configuration, measured in the same run. Scores are printed too: a configuration is only a
saving if it gives the same S().

    # bf16 against fp32 on a CPU (results/smollm2/card/)
    python benchmarks/objective_speed.py --model smollm2 --configs dtype=bfloat16,layers=bme,ratio=0.75 \
        dtype=float32,layers=bme,ratio=0.75 --out results/smollm2/card/cost_of_s.md
    # a hybrid's S() against the original's forward on the same requests, on a GPU
    python benchmarks/objective_speed.py --model random:qwen3-1.7b --seq-len 8192 --examples 16 --device cuda \
        --configs dtype=bfloat16,mask=full dtype=bfloat16,layers=bme,ratio=0.75 dtype=bfloat16,layers=bme,ratio=0.5 --out OUT.md

``random:<preset>`` writes a random-weight checkpoint of a ``bosch-eval bench`` preset shape with
a small trained tokenizer into ``--work`` first (timing only: its scores mean nothing).
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

from bosch_eval.bench.cli import RANDOM_CONFIGS
from bosch_eval.masks.head_mask import HeadMask, ModelShape
from bosch_eval.masks.mask_sources import resolve_mask
from bosch_eval.model_adapters.settings import AdapterSettings
from bosch_eval.models.random_model import save_random_checkpoint
from bosch_eval.runtime.threads import apply_thread_policy
from bosch_eval.runtime.versions import versions
from bosch_eval.search.objective.loading import CalibrationSettings, LoadSettings, build_objective


def model_path(name: str, work: Path, seq_len: int) -> str:
    """``name``, or for ``random:<preset>`` a random checkpoint of that shape written to ``work``."""
    if not name.startswith("random:"):
        return name
    preset = dict(RANDOM_CONFIGS[name.removeprefix("random:")])
    family = preset.pop("model_type")
    preset.pop("vocab_size")  # the small tokenizer's
    preset["max_position_embeddings"] = max(seq_len + 64, preset["max_position_embeddings"])
    path = work / name.replace(":", "-")
    if not (path / "config.json").is_file():
        save_random_checkpoint(path, family=family, **preset)
    return str(path)


def parse_config(text: str) -> dict[str, str]:
    """``key=value,key=value`` (the ``--model_args`` syntax)."""
    return dict(item.split("=", 1) for item in text.split(",") if item)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2", help="a model name or path, or random:<bench preset>")
    parser.add_argument("--task", default="bosch_retrieval_calib", help="the calibration task S() scores")
    parser.add_argument(
        "--configs", nargs="+", required=True, help="model_args per configuration; the first is the reference"
    )
    parser.add_argument("--examples", type=int, default=64)
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--window", type=int, help="SWA window (default: the model's bosch_defaults.json; random:<preset>: T/32)"
    )
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--work", type=Path, help="where random:<preset> checkpoints go (default: a temporary folder)")
    parser.add_argument("--out", type=Path, required=True, help="a .md file; the numbers go beside it as .json")
    args = parser.parse_args(argv)
    apply_thread_policy()
    with tempfile.TemporaryDirectory() as scratch:
        model = model_path(args.model, args.work or Path(scratch), args.seq_len)
        if args.window is None and args.model.startswith("random:"):
            args.window = args.seq_len // 32  # the paper's T/W
        rows = measure(args, model)
    write(args, rows, argv if argv is not None else sys.argv[1:])
    return 0


def mask_of(source: dict[str, str], shape: ModelShape, window: int) -> HeadMask:
    """The mask a ``--model_args`` mask source asks for, parsed as the adapter parses it
    (``mask=full``: every group full)."""
    settings = AdapterSettings(**source)
    if settings.mask == "full":
        return HeadMask.uniform(shape, full=True, window=window, method="full")
    return resolve_mask(shape, settings.mask_request(), default_window=window)[0]


def measure(args: argparse.Namespace, model: str) -> list[dict[str, Any]]:
    """Seconds and scores of every configuration's S() calls, round-robin after a warm-up each."""
    calibration = CalibrationSettings(tasks=(args.task,), examples=args.examples, length=args.seq_len)
    sources = [parse_config(text) for text in args.configs]
    dtypes = [source.pop("dtype", None) for source in sources]
    objectives = {}
    for dtype in dict.fromkeys(dtypes):
        objectives[dtype] = build_objective(
            model,
            calibration,
            LoadSettings(window=args.window, device=args.device, batch_size=args.batch_size, dtype=dtype),
        )
    masks = [
        mask_of(source, objectives[dtype].shape, objectives[dtype].lm.head_mask.window)
        for source, dtype in zip(sources, dtypes, strict=True)
    ]

    def s_call(dtype: str | None, mask: Any) -> tuple[float, float]:
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()
        started = time.perf_counter()
        score = objectives[dtype](mask)
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()
        return time.perf_counter() - started, score

    for dtype, mask in zip(dtypes, masks, strict=True):
        s_call(dtype, mask)  # warm-up: caches, allocator, kernels' first calls
    rows = [{"config": config, "seconds": [], "scores": []} for config in args.configs]
    for _ in range(args.repeats):
        for dtype, mask, row in zip(dtypes, masks, rows, strict=True):
            seconds, score = s_call(dtype, mask)
            row["seconds"].append(round(seconds, 3))
            row["scores"].append(score)
    reference = statistics.median(rows[0]["seconds"])
    for row in rows:
        row["median_s"] = statistics.median(row["seconds"])
        row["vs_first"] = row["median_s"] / reference
    return rows


def write(args: argparse.Namespace, rows: list[dict[str, Any]], argv: list[str]) -> None:
    device = (
        torch.cuda.get_device_name() if args.device.startswith("cuda") else f"cpu ({torch.get_num_threads()} threads)"
    )
    lines = [
        f"# One S() call: {args.task}, {args.examples} examples x {args.seq_len} tokens, model {args.model}, "
        f"batch size {args.batch_size}, {device}",
        "",
        f"`{shlex.join(['python', 'benchmarks/objective_speed.py', *argv])}`; "
        + ", ".join(f"{name} {version}" for name, version in versions("torch", "transformers", "lm_eval").items()),
        "",
        "| configuration | median s per S() | vs the first | runs (s) | S() per run |",
        "|---|---|---|---|---|",
    ]
    lines += [f"| `{row['config']}` | {row['median_s']:.2f} | {row['vs_first']:.2f}x | {', '.join(map(str, row['seconds']))} | "
              f"{', '.join(f'{score:.4f}' for score in row['scores'])} |" for row in rows]  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines) + "\n")
    args.out.with_suffix(".json").write_text(
        json.dumps({"device": device, "argv": argv, "rows": rows}, indent=1) + "\n"
    )
    print("\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
