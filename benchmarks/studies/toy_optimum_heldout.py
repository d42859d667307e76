"""Held-out scores of the placed masks: their rank among all masks (in-sample) next to lm-eval's
held-out scores of the same masks from the toy leaderboard (results/toy_compare/leaderboard_toy).

    python benchmarks/studies/toy_optimum_heldout.py > results/toy_optimum/heldout.md   # from the repo root

A leaderboard run is matched to a placement by its mask bits, not by name, so that masks reached
by different routes (BOSCH --refine 2, the EA, the APL ranking) share one row of scores.
"""

from __future__ import annotations

import json
from pathlib import Path

from bosch_eval.compare.results import read_run
from bosch_eval.compare.run_archive import readable_runs
from bosch_eval.search.journal.store import mask_key

OPTIMUM = Path("results/toy_optimum")
LEADERBOARD = Path("results/toy_compare/leaderboard_toy")


def run_scores(run: Path) -> dict[str, float]:
    scores: dict[str, float] = {}
    results = read_run(run).results
    if "niah_single_1" in results:
        scores["niah_single_1@512"] = results["niah_single_1"]["512,none"]
        scores["niah_single_1@1024"] = results["niah_single_1"]["1024,none"]
    if "bosch_niah" in results:
        scores["bosch_niah"] = results["bosch_niah"]["score,none"]
    return scores


def leaderboard_runs() -> dict[str, tuple[str, dict[str, float]]]:
    """Mask key → (first run name with that mask, its held-out scores)."""
    runs: dict[str, tuple[str, dict[str, float]]] = {}
    with readable_runs(LEADERBOARD) as finished:  # the committed runs are in its runs.tar.xz
        for run in sorted(finished.iterdir()):
            mask = json.loads((run / "run.json").read_text()).get("mask")
            if mask is None:
                continue
            runs.setdefault(mask_key(mask["mask"]), (run.name, run_scores(run)))
    return runs


def main() -> None:
    print(heldout_table())


def heldout_table() -> str:
    """The page: each placed mask's in-sample rank beside its held-out scores."""
    lines: list[str] = []
    runs = leaderboard_runs()
    columns = ("niah_single_1@512", "niah_single_1@1024", "bosch_niah")
    lines.append("$ " + __doc__.split("\n\n")[1].strip())
    lines.append("")
    lines.append("In-sample: `bosch_niah_calib` acc (the search's S(z)) and the rank among all masks with")
    lines.append("the same number of SWA groups. Held out: upstream `niah_single_1` (64 documents per")
    lines.append("length) and `bosch_niah` (6 tasks × 20 documents × 2 lengths), from the leaderboard run")
    lines.append("named in the last column. The optimum's row is the best mask of the enumeration.")
    for ratio_dir in sorted(OPTIMUM.glob("r*/optimum.json"), key=lambda p: p.parent.name):
        data = json.loads(ratio_dir.read_text())
        lines.append(f"\n## ρ = {ratio_dir.parent.name[1:]} ({data['masks']} masks)\n")
        lines.append("| mask | S in-sample | rank | " + " | ".join(columns) + " | leaderboard run |")
        lines.append("|---|---|---|" + "---|" * len(columns) + "---|")
        ties = len(data["optima"]) - 1
        rows = [("**optimum**", key, data["optimum"], 1, ties) for key in data["optima"]]
        rows += [(p["name"], p["key"], p["score"], p["rank"], p["ties"]) for p in data["placements"]]
        for name, key, score, rank, ties in rows:
            run, scores = runs.get(key, ("(not on the leaderboard)", {}))
            cells = " | ".join(f"{scores[c]:.3f}" if c in scores else "–" for c in columns)
            tied = f" (tied with {ties})" if ties else ""
            lines.append(f"| {name} | {score:.3f} | {rank}{tied} | {cells} | {run} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
