"""Recovery curves (paper B.5, Fig. 3 at toy scale) from `commands.sh recovery`'s lm-eval outputs.

    python benchmarks/studies/recovery_curves.py OUT_DIR results/toy_train/recovery   # from the repo root

Reads OUT_DIR/eval/<mask>-r<ratio>/step-<N>/len<L>/**/results_*.json (held-out upstream
niah_single_1 and bosch_niah, one lm_eval call per length; or results_*.json.gz, as they are
committed under results/toy_train/recovery/eval) and writes recovery.md (a table per
ratio: score per step) and recovery.png (one panel per ratio and task, one line per mask).
"""

from __future__ import annotations

import gzip
import json
import re
import sys
from collections import defaultdict
from pathlib import Path

TASKS = ("niah_single_1", "bosch_niah")
SCORE_KEY = {"niah_single_1": None, "bosch_niah": "score,none"}  # niah_single_1 reports only "<L>,none"


def collect(out: Path) -> dict[str, dict[str, dict[int, dict[str, float]]]]:
    """ratio → mask → step → {"<task>@<L>": score}."""
    table: dict[str, dict[str, dict[int, dict[str, float]]]] = defaultdict(lambda: defaultdict(dict))
    pattern = "*/step-*/len*/**/results_*.json"
    for results_file in sorted([*(out / "eval").glob(pattern), *(out / "eval").glob(pattern + ".gz")]):
        run_dir = results_file.relative_to(out / "eval").parts
        match = re.fullmatch(r"(.+)-r([0-9.]+)", run_dir[0])
        if match is None:
            continue
        mask, ratio = match.groups()
        step = int(run_dir[1].removeprefix("step-"))
        length = run_dir[2].removeprefix("len")
        opener = gzip.open if results_file.suffix == ".gz" else open
        with opener(results_file, "rt", encoding="utf-8") as handle:
            results = json.load(handle)["results"]
        scores = table[ratio][mask].setdefault(step, {})
        for task in TASKS:
            if task in results:
                scores[f"{task}@{length}"] = results[task][SCORE_KEY[task] or f"{length},none"]
    return table


def write_table(table: dict, path: Path, command: str) -> None:
    lines = [f"$ {command}", ""]
    for ratio in sorted(table, key=float, reverse=True):
        columns = sorted({c for steps in table[ratio].values() for scores in steps.values() for c in scores})
        lines += [
            f"## ρ = {ratio}",
            "",
            "| mask | step | " + " | ".join(columns) + " |",
            "|---|---|" + "---|" * len(columns),
        ]
        for mask in sorted(table[ratio]):
            for step, scores in sorted(table[ratio][mask].items()):
                lines.append(
                    f"| {mask} | {step} | "
                    + " | ".join(f"{scores[c]:.3f}" if c in scores else "–" for c in columns)
                    + " |"
                )
        lines.append("")
    path.write_text("\n".join(lines))


def plot(table: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ratios = sorted(table, key=float, reverse=True)
    columns = sorted({c for r in ratios for steps in table[r].values() for scores in steps.values() for c in scores})
    fig, axes = plt.subplots(len(ratios), len(columns), figsize=(3.2 * len(columns), 2.8 * len(ratios)), squeeze=False)
    for row, ratio in enumerate(ratios):
        for col, column in enumerate(columns):
            ax = axes[row][col]
            for mask in sorted(table[ratio]):
                points = sorted((step, s[column]) for step, s in table[ratio][mask].items() if column in s)
                ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=mask)
            ax.set_title(f"ρ = {ratio}: {column}", fontsize=9)
            ax.set_xlabel("training step")
            ax.set_ylim(-0.05, 1.05)
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    out, dest = Path(sys.argv[1]), Path(sys.argv[2])
    dest.mkdir(parents=True, exist_ok=True)
    table = collect(out)
    if not table:
        raise SystemExit(f"{out}/eval: no results_*.json(.gz) under <mask>-r<ratio>/step-<N>/len<L>/")
    write_table(table, dest / "recovery.md", "python " + " ".join(sys.argv))
    plot(table, dest / "recovery.png")


if __name__ == "__main__":
    main()
