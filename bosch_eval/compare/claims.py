"""One entry's claims against every other: "the claimant scores at least what each rival does".

A study's claim that its search beats the rankings rests on several comparisons, one per rival,
so each comparison's p-value is Holm-adjusted over the family (every rival of the leaderboard
but the reference): the claim "higher than every rival" holds at level α where every adjusted
p-value is below α and every difference is positive. Each comparison pairs the two entries'
documents on the headline (:func:`~bosch_eval.compare.leaderboard.paired_difference`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bosch_eval.compare.leaderboard import EntryRuns, Row, headline, paired_difference

ALPHA = 0.05


def holm_adjusted(p_values: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values, in the order given: the i-th smallest of m is
    multiplied by ``m − i`` (i from 0), then made non-decreasing in that order, capped at 1."""
    order = sorted(range(len(p_values)), key=lambda index: p_values[index])
    adjusted = [0.0] * len(p_values)
    running = 0.0
    for rank, index in enumerate(order):
        running = max(running, min(1.0, (len(p_values) - rank) * p_values[index]))
        adjusted[index] = running
    return adjusted


@dataclass(frozen=True)
class Claim:
    """The claimant's headline minus one rival's, over the same documents."""

    rival: str
    rival_headline: float
    difference: float
    low: float
    high: float
    n_docs: int
    p_value: float
    p_holm: float

    @property
    def verdict(self) -> str:
        if self.p_holm >= ALPHA:
            return "not resolved"
        return "higher" if self.difference > 0 else "lower"


def claims_of(claimant: str, entries: list[EntryRuns], rows: list[Row], reference: str, held: list[str]) -> list[Claim]:
    """The claimant against every entry but itself and the reference, best rival first; empty
    where the claimant has no headline (not run yet, or no held-out column)."""
    by_name = {entry.name: entry for entry in entries}
    scores = {row.entry: headline(row, held) for row in rows}
    if claimant not in by_name or not held or scores.get(claimant) is None:
        return []
    found = []
    for rival in (
        entry for entry in entries if entry.name not in (claimant, reference) and scores.get(entry.name) is not None
    ):
        paired = paired_difference(by_name[claimant], rival, held, scores[claimant])
        if paired is not None:
            found.append((rival.name, scores[rival.name], paired))
    adjusted = holm_adjusted([paired.p_value for *_, paired in found])
    claims = [
        Claim(name, score, *paired, p_holm) for (name, score, paired), p_holm in zip(found, adjusted, strict=True)
    ]
    return sorted(claims, key=lambda claim: -claim.rival_headline)


def claims_table(claimant: str, claims: list[Claim]) -> list[str]:
    """Markdown lines: one row per rival, with the family's Holm-adjusted p-values."""
    lines = [f"Claims of `{claimant}` (its headline minus each rival's over the same documents, 95% CI; p two-sided, "
             f"Holm-adjusted over the {len(claims)} rivals; verdict at α = {ALPHA}):", "",
             "| rival | rival's headline | difference [95% CI] | p | p (Holm) | verdict |", "|---|---|---|---|---|---|"]  # fmt: skip
    for claim in claims:
        lines.append(
            f"| {claim.rival} | {claim.rival_headline:.3f} | {claim.difference:+.3f} [{claim.low:+.3f}, {claim.high:+.3f}] "
            f"| {claim.p_value:.4f} | {claim.p_holm:.4f} | {claim.verdict} |"
        )
    return lines


def write_claims(out: Path, claimant: str, claims: list[Claim], header: dict[str, Any]) -> None:
    """``claims.md`` and ``claims.json`` beside the leaderboard (the same header)."""
    (out / "claims.md").write_text("\n".join([f"$ {header['command']}", "", *claims_table(claimant, claims)]) + "\n")
    payload = {
        **header,
        "claimant": claimant,
        "alpha": ALPHA,
        "claims": [asdict(claim) | {"verdict": claim.verdict} for claim in claims],
    }
    (out / "claims.json").write_text(json.dumps(payload, indent=1) + "\n")
