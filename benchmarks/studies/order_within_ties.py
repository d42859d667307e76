"""Does a tie-break metric order the masks a plain metric ties as the development split does?

    python benchmarks/studies/order_within_ties.py results/smollm2/check_sinks/bosch_niah_calib \
        results/smollm2/check_tiebreak/bosch_niah_calib 0.5

Two calib-checks of the same panel (the second made with ``--calib-metric acc_tiebreak`` and
``--dev-scores-from`` the first): at the given ratio, the masks at the plain metric's best
calibration score, with their tie-break and dev scores, and the Spearman correlation of the
two. A check's own verdict cannot say this: it sees a tie-break that separates tied masks as
an unsaturated calibration, whether or not the order it gives means anything on dev.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from bosch_eval.search.check.panel import spearman


def check_scores(check: Path) -> dict[str, dict[str, float]]:
    """``{side: {mask name: score}}`` from a check's ``scores.jsonl``."""
    scores: dict[str, dict[str, float]] = {"calib": {}, "dev": {}}
    for line in (check / "scores.jsonl").read_text().splitlines():
        record = json.loads(line)
        scores[record["side"]][record["name"]] = record["score"]
    return scores


def order_within_ties(plain: Path, tiebreak: Path, ratio: str) -> str:
    """The report: the masks the plain metric ties at its best, their tie-break and dev scores, and the Spearman of the two."""
    plain_scores, tiebreak_scores = check_scores(plain), check_scores(tiebreak)
    names = [name for name in plain_scores["calib"] if name.endswith(f"-r{ratio}") and name in tiebreak_scores["calib"]]
    if not names:
        raise SystemExit(f"{tiebreak / 'scores.jsonl'}: no calibration score of a mask at ratio {ratio} yet")
    best = max(plain_scores["calib"][name] for name in names)
    tied = sorted(
        (name for name in names if plain_scores["calib"][name] == best),
        key=lambda name: -tiebreak_scores["calib"][name],
    )
    lines = [f"ratio {ratio}: {len(tied)} of {len(names)} masks tie at the plain metric's best, {best:.3f}", "",
             "| mask | tie-break (calib) | dev |", "|---|---|---|"]  # fmt: skip
    lines += [f"| {name} | {tiebreak_scores['calib'][name]:.5f} | {plain_scores['dev'][name]:.3f} |" for name in tied]
    rho = spearman([tiebreak_scores["calib"][name] for name in tied], [plain_scores["dev"][name] for name in tied])
    return "\n".join([*lines, "", f"Spearman, tie-break ~ dev, among the tied masks: {rho:.2f}"])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("plain", type=Path, help="the check scored by the plain metric")
    parser.add_argument("tiebreak", type=Path, help="the check of the same panel scored by the tie-break metric")
    parser.add_argument("ratio", help="the ratio, as the mask names spell it (0.5, 0.75, 0.875)")
    args = parser.parse_args(argv)
    print(order_within_ties(args.plain, args.tiebreak, args.ratio))


if __name__ == "__main__":
    main()
