"""Forward passes of a bundled model with 1 thread and with one per core, alone and beside a
busy process: why ``bosch_eval.runtime.threads`` leaves one core free, and what a job alone on
the machine gains by setting ``OMP_NUM_THREADS`` to the core count itself.

    python benchmarks/threads_loaded.py [--model toy] [--dtype float32] [--batch 1] [--rounds 3]
        [--forwards 20] [--length 1024]

Each measurement is a fresh interpreter whose thread count is set before torch loads
(``OMP_NUM_THREADS``), timing ``--forwards`` forward passes of ``--model`` on ``--batch`` ×
``--length`` tokens (the quickstart's calibration length) after one warm-up. The configurations run
interleaved, round after round, so a machine whose load drifts affects them alike; "busy"
runs start ``python -c 'while True: pass'`` (one core taken) for the measurement's
duration. Prints the median seconds per forward pass of each configuration, and the
loaded/idle ratio per thread count.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys

CHILD = """
import sys, time, torch
from transformers import AutoModelForCausalLM
from bosch_eval.models.model_check import resolve_model
model = AutoModelForCausalLM.from_pretrained(resolve_model({model!r}), attn_implementation="sdpa", dtype=torch.{dtype}).eval()
ids = torch.randint(0, model.config.vocab_size, ({batch}, {length}), generator=torch.Generator().manual_seed(0))
with torch.inference_mode():
    model(ids)
    started = time.perf_counter()
    for _ in range({forwards}):
        model(ids)
print((time.perf_counter() - started) / {forwards}, torch.get_num_threads())
"""


def measure(threads: int, busy: bool, args: argparse.Namespace) -> float:
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if busy else None
    try:
        out = subprocess.run(
            [
                sys.executable,
                "-c",
                CHILD.format(
                    model=args.model, dtype=args.dtype, batch=args.batch, forwards=args.forwards, length=args.length
                ),
            ],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
    finally:
        if spinner is not None:
            spinner.kill()
            spinner.wait()
    if int(out[1]) != threads:
        raise RuntimeError(f"torch ran {out[1]} threads, expected {threads}")
    return float(out[0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--model", default="toy", help="a model name bosch-eval resolves: toy, toy-l, smollm2, a path or hub id"
    )
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--forwards", type=int, default=20)
    parser.add_argument("--length", type=int, default=1024)
    args = parser.parse_args()
    cores = len(os.sched_getaffinity(0))
    configs = [(threads, busy) for threads in sorted({1, cores}) for busy in (False, True)]
    times: dict[tuple[int, bool], list[float]] = {config: [] for config in configs}
    for _ in range(args.rounds):
        for threads, busy in configs:
            times[(threads, busy)].append(measure(threads, busy, args))
    print(
        f"{args.model}, {args.dtype}, {args.batch} × {args.length} tokens; {cores} usable cores, "
        f"1-min load average before the run included: {os.getloadavg()[0]:.1f}"
    )
    print("| threads | beside a busy process | s per forward (median) | all rounds |")
    print("|---|---|---|---|")
    for (threads, busy), values in times.items():
        print(
            f"| {threads} | {'yes' if busy else 'no'} | {statistics.median(values):.4f} | {', '.join(f'{v:.4f}' for v in values)} |"
        )
    for threads in sorted({1, cores}):
        ratio = statistics.median(times[(threads, True)]) / statistics.median(times[(threads, False)])
        print(f"{threads} thread(s): busy / idle = {ratio:.2f}")


if __name__ == "__main__":
    main()
