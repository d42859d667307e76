"""The cost of one S() call on this machine, bf16 against fp32, measured side by side.

S(z) is ``lm_eval.simple_evaluate`` of the ``bosch`` adapter on the calibration task (the
search's objective). One adapter per dtype is loaded once; the calls alternate between them
(after one untimed warm-up call each), so both see the same machine load; medians over the
repeats. Scores are printed too: bf16 is only a saving if it gives the same S().

    python results/smollm2/cost_of_s.py --out results/smollm2/card/cost_of_s.md
"""

from __future__ import annotations

import argparse
import os
import shlex
import statistics
import sys
import time
from pathlib import Path

import lm_eval
from lm_eval.tasks import TaskManager

from bosch_eval.model_adapters.bosch import BoschLM
from bosch_eval.runtime.versions import versions


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--task", default="bosch_retrieval_calib")
    parser.add_argument("--mask-args", default="layers=bme,ratio=0.75", help="the mask S() is scored with, as model_args")
    parser.add_argument("--examples", type=int, default=64)
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    mask_args = dict(item.split("=", 1) for item in args.mask_args.split(","))
    metadata = {"pretrained": args.model, "seq_len": args.seq_len, "num_examples": args.examples}
    tasks = TaskManager(metadata=metadata)
    adapters = {dtype: BoschLM(pretrained=args.model, dtype=dtype, batch_size=args.batch_size, device="cpu", **mask_args)
                for dtype in ("bfloat16", "float32")}  # fmt: skip

    def s_call(dtype: str) -> tuple[float, float]:
        started = time.perf_counter()
        out = lm_eval.simple_evaluate(model=adapters[dtype], tasks=[args.task], task_manager=tasks, verbosity="WARNING")
        return time.perf_counter() - started, out["results"][args.task]["acc,none"]

    seconds: dict[str, list[float]] = {dtype: [] for dtype in adapters}
    scores: dict[str, set[float]] = {dtype: set() for dtype in adapters}
    for dtype in adapters:
        s_call(dtype)  # warm-up: tokenizer caches, first-call allocations
    for _ in range(args.repeats):
        for dtype in adapters:
            elapsed, score = s_call(dtype)
            seconds[dtype].append(elapsed)
            scores[dtype].add(score)
    median = {dtype: statistics.median(values) for dtype, values in seconds.items()}
    lines = [
        f"# One S() call on {args.model}: {args.task}, {args.examples} examples x {args.seq_len} tokens, "
        f"mask {args.mask_args}, batch size {args.batch_size}",
        "",
        f"`{shlex.join(['python', *sys.argv])}`; OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}; "
        + ", ".join(f"{name} {version}" for name, version in versions("torch", "transformers", "lm_eval").items()),
        "",
        "| dtype | median s per S() | runs (s) | S() |",
        "|---|---|---|---|",
    ]
    lines += [f"| {dtype} | {median[dtype]:.1f} | {', '.join(f'{s:.1f}' for s in seconds[dtype])} | {', '.join(f'{s:.4f}' for s in sorted(scores[dtype]))} |"
              for dtype in adapters]  # fmt: skip
    lines += ["", f"fp32 / bf16 time: {median['float32'] / median['bfloat16']:.2f}x (alternating calls, same load)"]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
