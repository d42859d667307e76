"""The paired CI of one leaderboard entry against another (the leaderboard's CIs are against the
original): the headline and each held-out column, over the same documents, as compare computes
them (bosch_eval.compare.leaderboard).

    python results/smollm2/paired_vs.py results/smollm2/leaderboard_r0.875 bosch-r0.875 razor-r0.875 [...]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from bosch_eval.compare.leaderboard import build_rows, from_compare_dir, headline


def main(out: str, entry: str, *references: str) -> None:
    board = json.loads((Path(out) / "leaderboard.json").read_text())
    held = board["headline_columns"]
    tasks = board["settings"]["tasks"]
    for reference in references:
        runs = from_compare_dir(Path(out), [reference, entry])
        row = next(r for r in build_rows(runs, reference, None, tasks=tasks) if r.entry == entry)
        cells = "; ".join(f"{n} {row.cells[n].ci[0]:+.3f} [{row.cells[n].ci[1]:+.3f}, {row.cells[n].ci[2]:+.3f}]" for n in held)
        diff, low, high = row.headline_ci
        print(f"{entry} − {reference}: headline {headline(row, held):.3f}, {diff:+.3f} [{low:+.3f}, {high:+.3f}]; {cells}")


if __name__ == "__main__":
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    main(*sys.argv[1:])
