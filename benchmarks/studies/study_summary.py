"""The answer of a study, one line per ratio, from its comparisons' own files (results/smollm2).

    python benchmarks/studies/study_summary.py STUDY_DIR [STUDY_DIR ...] [--rankings apl dcam ...]

Each STUDY_DIR is a ``bosch-eval compare`` output with ``claims.md`` (its ``leaderboard.json``
and ``claims.json``). Printed, as markdown:

1. per ratio: the claimant's (the search's) headline, the best static ranking's (the ranking
   entry with the highest headline), the reference's (full attention), the floor (the lowest
   entry), and the claim of the search against that ranking as ``claims.json`` has it (paired
   95% CI, Holm-adjusted p, verdict);
2. per ratio, the same three entries on each NIAH value format (the leaderboard's columns that
   name one: numbers in noise, numbers in prose, UUIDs in prose), so a gap shows where it is.

Nothing is computed that the comparison did not write: the headlines are the means over the
leaderboard's headline columns, as ``compare`` computes them.
"""

from __future__ import annotations

import argparse
import json
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bosch_eval.tasks.niah.eval_suite import value_format

DEFAULT_RANKINGS = ("apl", "dcam", "fisher", "proxy", "qada", "razor")


@dataclass(frozen=True)
class Study:
    """One comparison's leaderboard and claims."""

    name: str
    leaderboard: dict[str, Any]
    claims: dict[str, Any]

    @classmethod
    def read(cls, directory: Path) -> Study:
        files = {name: directory / f"{name}.json" for name in ("leaderboard", "claims")}
        missing = [str(path) for path in files.values() if not path.is_file()]
        if missing:
            raise SystemExit(f"{directory}: no {', '.join(missing)} (run bosch-eval compare with a claimant first)")
        return cls(directory.name, *(json.loads(path.read_text()) for path in files.values()))

    def rows(self) -> dict[str, dict[str, Any]]:
        return {row["entry"]: row for row in self.leaderboard["rows"]}

    def headline(self, entry: str) -> float:
        cells = self.rows()[entry]["cells"]
        return statistics.fmean(cells[name]["mean"] for name in self.leaderboard["headline_columns"])

    def best_ranking(self, rankings: tuple[str, ...]) -> str:
        entries = [entry for entry in self.rows() if entry.split("-r")[0] in rankings]
        if not entries:
            raise SystemExit(f"{self.name}: no entry of the rankings {list(rankings)}")
        return max(entries, key=self.headline)

    def claim(self, rival: str) -> dict[str, Any]:
        for claim in self.claims["claims"]:
            if claim["rival"] == rival:
                return claim
        raise SystemExit(f"{self.name}: claims.json has no claim against {rival!r}")

    def format_columns(self) -> dict[str, str]:
        """The leaderboard's columns that name a NIAH value format, in its order (a leaderboard
        written before it recorded them: the formats the eval suite gives those task names)."""
        formats = self.leaderboard.get("formats") or {name: value_format(name) for name in self._columns()}
        return {name: formats[name] for name in self._columns() if formats.get(name)}

    def _columns(self) -> list[str]:
        return list(dict.fromkeys(name for row in self.leaderboard["rows"] for name in row["cells"]))


def answer_table(studies: list[Study], rankings: tuple[str, ...]) -> list[str]:
    lines = [
        "| ρ | the search's mask | best ranking | full attention | floor (lowest entry) "
        "| search − best ranking [95% CI] | p (Holm) | verdict |",
        "|---" * 8 + "|",
    ]
    for study in studies:
        search, reference = study.claims["claimant"], study.claims["reference"]
        best = study.best_ranking(rankings)
        claim = study.claim(best)
        floor = min(study.rows(), key=study.headline)
        lines.append(
            f"| {_ratio(search)} | {study.headline(search):.3f} | {best.split('-r')[0]} {study.headline(best):.3f} "
            f"| {study.headline(reference):.3f} | {study.headline(floor):.3f} ({floor.split('-r')[0]}) "
            f"| {claim['difference']:+.3f} [{claim['low']:+.3f}, {claim['high']:+.3f}] | {_p(claim['p_holm'])} "
            f"| {claim['verdict']} |"
        )
    return lines


def format_table(studies: list[Study], rankings: tuple[str, ...]) -> list[str]:
    columns = studies[0].format_columns()
    lines = [
        "| ρ | entry | " + " | ".join(f"{name} ({what})" for name, what in columns.items()) + " |",
        "|---" * (2 + len(columns)) + "|",
    ]
    for study in studies:
        search, reference = study.claims["claimant"], study.claims["reference"]
        for entry in (search, study.best_ranking(rankings), reference):
            cells = study.rows()[entry]["cells"]
            scores = " | ".join(f"{cells[name]['mean']:.3f}" if name in cells else "–" for name in columns)
            lines.append(f"| {_ratio(search)} | {entry.split('-r')[0]} | {scores} |")
    return lines


def summary(directories: list[Path], rankings: tuple[str, ...] = DEFAULT_RANKINGS) -> str:
    studies = [Study.read(directory) for directory in directories]
    sources = ", ".join(f"`{directory}`" for directory in directories)
    return "\n".join(
        [
            f"Held out, from {sources} (each `leaderboard.json` and `claims.json`):",
            "",
            *answer_table(studies, rankings),
            "",
            "Per NIAH value format (each column's mean over its documents):",
            "",
            *format_table(studies, rankings),
        ]
    )


def _ratio(entry: str) -> str:
    return entry.rsplit("-r", 1)[1].split("-")[0]


def _p(value: float) -> str:
    return "< 0.001" if value < 0.001 else f"{value:.3f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("studies", nargs="+", type=Path, help="compare output directories, one per ratio")
    parser.add_argument(
        "--rankings", nargs="+", default=list(DEFAULT_RANKINGS), help="entry name prefixes of the static rankings"
    )
    args = parser.parse_args()
    print(summary(args.studies, tuple(args.rankings)))


if __name__ == "__main__":
    main()
