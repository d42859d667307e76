"""Ordering the masks the calibration set ties: ``--tie-break-tasks`` (a deviation from the paper).

When S(z) saturates, many masks with the found mask's number of SWA groups reach exactly its
S (the search counts them, :class:`~bosch_eval.search.saturation.TopTies`), and the search
returns the first it met. With tie-break tasks named, the search then scores the found mask
and every mask tied with it on those tasks (the same model, metric and calibration metadata)
and returns the best; the found mask wins a tie again, then the first by journal key. Every
candidate has the search's S, so S and the ratio penalty stay as they were. Masks that racing
stopped at a bound equal to S could at best tie, but their S is not known: they are not
candidates.

Each score is appended to ``tiebreak.jsonl`` in the search's directory as it is made (main
process only); a resumed search answers from it. Its header pins what the scores measure
(the tie-break objective's description and the search's journal header); a file made under
another is refused, since its scores would rank the candidates by something else.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from bosch_eval.masks.head_mask import HeadMask
from bosch_eval.search.scoring import SearchError

TIE_BREAK_FILE = "tiebreak.jsonl"
FORMAT = "bosch-tiebreak/1"


@dataclass(frozen=True)
class TieBreak:
    """What a tie-break did: its candidates' scores and the mask it chose.

    Attributes:
        tasks: the tie-break task(s).
        scores: tie-break score per candidate mask key, the search's found mask first.
        chosen: the key of the mask returned.
    """

    tasks: tuple[str, ...]
    scores: dict[str, float]
    chosen: str

    @property
    def found(self) -> str:
        """The key of the mask the search found (before the tie-break)."""
        return next(iter(self.scores))

    def to_json(self) -> dict[str, Any]:
        return {
            "tasks": list(self.tasks),
            "candidates": len(self.scores),
            "found_mask": self.found,
            "found_score": self.scores[self.found],
            "chosen_score": self.scores[self.chosen],
            "file": TIE_BREAK_FILE,
        }

    def message(self) -> str:
        """What the tie-break chose, in a sentence (the log's and report.md's)."""
        if self.chosen == self.found:
            return f"the found mask stays: {self.scores[self.found]:.4f}, the best of the {len(self.scores)} masks at the search's S"
        return (
            f"another of the {len(self.scores)} masks at the search's S is returned: {self.scores[self.chosen]:.4f} "
            f"against the found mask's {self.scores[self.found]:.4f}"
        )


def tie_key_bits(key: str) -> tuple[tuple[int, ...], ...]:
    """The L×G grid of a journal mask key (``journal.mask_key``'s inverse)."""
    return tuple(tuple(int(c) for c in row) for row in key.split("/"))


def break_ties(
    candidates: Sequence[str],
    score_fn: Callable[[HeadMask], float],
    num_heads: int,
    known: Mapping[str, float],
    *,
    on_score: Callable[[str, float], None] | None = None,
    progress: bool = False,
) -> dict[str, float]:
    """Score every candidate key not in ``known`` with ``score_fn``, calling ``on_score`` after
    each, and return every candidate's score in candidate order (:func:`best_key` picks)."""
    scores: dict[str, float] = {}
    for key in tqdm(candidates, desc="tie-break", unit="mask", disable=not progress):
        if key in known:
            scores[key] = known[key]
            continue
        score = score_fn(HeadMask(tie_key_bits(key), num_heads))
        scores[key] = score
        if on_score is not None:
            on_score(key, score)
    return scores


def best_key(scores: Mapping[str, float], higher_is_better: bool = True) -> str:
    """The first key with the best score (dict order: the found mask first)."""
    sign = 1.0 if higher_is_better else -1.0
    return max(scores, key=lambda key: sign * scores[key])


class TieBreakFile:
    """``tiebreak.jsonl``: a header line, then one ``{"key", "score"}`` line per scored mask."""

    def __init__(self, out: Path, header: Mapping[str, Any], write: bool) -> None:
        self.path = Path(out) / TIE_BREAK_FILE
        self.header = json.loads(json.dumps(dict(header)))  # as it reads back
        self.write = write
        self.scores: dict[str, float] = {}
        if self.path.exists():
            self._load()
        elif write:
            self._append({"format": FORMAT, "header": self.header})

    def _load(self) -> None:
        lines = self.path.read_text().splitlines()
        first = json.loads(lines[0]) if lines else {}
        if first.get("format") != FORMAT or first.get("header") != self.header:
            raise SearchError(
                f"{self.path}: its tie-break scores were made under other settings or calibration (its header: "
                f"{json.dumps(first.get('header'))[:300]}); move it away to break the ties under these"
            )
        for number, line in enumerate(lines[1:], start=2):
            try:
                record = json.loads(line)
                self.scores[str(record["key"])] = float(record["score"])
            except (ValueError, KeyError, TypeError):
                if number < len(lines):
                    raise SearchError(f"{self.path}, line {number}: expected {{'key': ..., 'score': ...}}, got {line[:200]!r}") from None
                if self.write:  # the last line, cut short by a kill: dropped (that mask is scored again)
                    kept = self.path.with_name(f"{self.path.name}.tmp")
                    kept.write_text("".join(f"{line}\n" for line in lines[:-1]))
                    os.replace(kept, self.path)  # a rename: a kill leaves the old file or the new one

    def append(self, key: str, score: float) -> None:
        if self.write:
            self._append({"key": key, "score": score})

    def _append(self, record: Mapping[str, Any]) -> None:
        with self.path.open("a") as handle:
            handle.write(json.dumps(record) + "\n")
            handle.flush()
