"""What the lm-eval start-up hook adds to every Python start, side by side.

    python benchmarks/hook_startup.py [--repeats 20]

The hook (``bosch_eval_lm_eval_hook.pth`` in site-packages) runs in every interpreter of
the environment, so it must stay light. Each repetition starts ``python -X importtime -c
pass`` and reads the cumulative import time of ``bosch_eval.model_adapters.lm_eval_hook`` (the hook and
the light ``bosch_eval`` package it imports) and of everything imported at start; prints
the medians and their ratio. Needs the package installed (``pip install -e .``).
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys

LINE = re.compile(r"^import time:\s+\d+ \|\s+(\d+) \|( *)(\S+)$", re.MULTILINE)


def start_once() -> tuple[int, int]:
    """Cumulative µs of the hook, and of every top-level import at interpreter start."""
    report = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", "pass"], capture_output=True, text=True, check=True
    ).stderr
    rows = [(int(cumulative), len(indent), name) for cumulative, indent, name in LINE.findall(report)]
    hook = [cumulative for cumulative, _, name in rows if name == "bosch_eval.model_adapters.lm_eval_hook"]
    if not hook:
        sys.exit(
            "bosch_eval.model_adapters.lm_eval_hook was not imported at start: install the package (pip install -e .)"
        )
    top_level = min(indent for _, indent, _ in rows)
    return hook[0], sum(cumulative for cumulative, indent, _ in rows if indent == top_level)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    runs = [start_once() for _ in range(args.repeats)]
    hook = statistics.median(h for h, _ in runs)
    total = statistics.median(t for _, t in runs)
    print(f"python {sys.version.split()[0]}, {args.repeats} starts")
    print(f"hook import (median)          {hook / 1000:8.2f} ms")
    print(f"all start-up imports (median) {total / 1000:8.2f} ms")
    print(f"hook / start-up imports       {hook / total:8.3f}")


if __name__ == "__main__":
    main()
