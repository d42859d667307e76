"""Paired differences between two masks' scores on the same documents (results/smollm2).

    python benchmarks/studies/paired_runs.py documents RUN_A RUN_B
    python benchmarks/studies/paired_runs.py entries OUT ENTRY REFERENCE [REFERENCE ...]

``documents``: two lm_eval ``--output_path`` folders made with ``--log_samples`` (plain or
packed): each run's score and the mean paired difference B − A with its standard error, a
document's value being its ``acc`` (prefill tasks) or its ``score`` (bosch_niah_dev_gen). The
development split's rule reads these numbers.
``entries``: a comparison's paired CI of ENTRY against each REFERENCE (the leaderboard's are
against the original): the headline and each held-out column, over the same documents, as
``compare`` computes them (:mod:`bosch_eval.compare.leaderboard`).
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

from bosch_eval.compare.leaderboard import build_rows, from_compare_dir, headline
from bosch_eval.compare.results import doc_values, read_run


def document_values(run: Path) -> dict[tuple[Any, ...], float]:
    """(task, stratum, doc_id) -> the document's value, from the samples under ``run``."""
    samples = read_run(run).samples
    if not samples:
        raise SystemExit(f"{run}: no samples_*.jsonl[.gz] (run lm_eval with --log_samples)")
    return {
        (task, *key): value for task, rows in samples.items() for key, value in doc_values(rows, _metric(rows)).items()
    }


def _metric(rows: list[dict[str, Any]]) -> str:
    """``acc`` for a prefill task's samples, ``score`` for bosch_niah_dev_gen's."""
    return "acc" if "acc" in rows[0] else "score"


def paired_documents(run_a: Path, run_b: Path) -> str:
    """Both runs' scores and B − A ± its standard error over their documents."""
    a, b = document_values(run_a), document_values(run_b)
    if a.keys() != b.keys():
        raise SystemExit(f"{run_a} and {run_b} scored different documents ({len(a)} and {len(b)})")
    if len(a) < 2:
        raise SystemExit(f"{run_a}: {len(a)} document(s); a standard error needs at least 2")
    differences = [b[key] - a[key] for key in a]
    n = len(differences)
    mean = sum(differences) / n
    se = math.sqrt(sum((d - mean) ** 2 for d in differences) / (n - 1) / n)
    return f"{n} documents: A {sum(a.values()) / n:.3f}, B {sum(b.values()) / n:.3f}, B − A {mean:+.3f} ± {se:.3f} (SE)"


def paired_entries(out: Path, entry: str, references: list[str]) -> list[str]:
    """One line per reference: ENTRY − REFERENCE on the headline and each held-out column, with 95% CIs."""
    board = json.loads((out / "leaderboard.json").read_text())
    held, tasks = board["headline_columns"], board["settings"]["tasks"]
    lines = []
    for reference in references:
        runs = from_compare_dir(out, [reference, entry])
        row = next(r for r in build_rows(runs, reference, None, tasks=tasks) if r.entry == entry)
        cells = "; ".join(f"{n} {_ci(row.cells[n].ci)}" for n in held)
        lines.append(f"{entry} − {reference}: headline {headline(row, held):.3f}, {_ci(row.headline_ci)}; {cells}")
    return lines


def _ci(ci: tuple[float, float, float] | None) -> str:
    """A paired difference and its 95% CI; a column the leaderboard cannot pair (a run kept no
    samples, the metrics differ, or lm-eval weighs a group by size) says so."""
    return "no paired CI" if ci is None else f"{ci[0]:+.3f} [{ci[1]:+.3f}, {ci[2]:+.3f}]"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    documents = commands.add_parser("documents", help="two lm_eval runs on the same documents")
    documents.add_argument("run_a", type=Path)
    documents.add_argument("run_b", type=Path)
    entries = commands.add_parser("entries", help="one comparison entry against others")
    entries.add_argument("out", type=Path, help="a comparison's --out (leaderboard.json and runs/)")
    entries.add_argument("entry")
    entries.add_argument("references", nargs="+")
    args = parser.parse_args(argv)
    if args.command == "documents":
        print(paired_documents(args.run_a, args.run_b))
    else:
        print("\n".join(paired_entries(args.out, args.entry, args.references)))


if __name__ == "__main__":
    main()
