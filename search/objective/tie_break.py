"""Ordering the masks the calibration set ties: ``--tie-break-tasks`` (a deviation from the paper).

When S(z) saturates, many masks with the found mask's number of SWA groups reach exactly its
S (the search counts them, :class:`~bosch_eval.search.check.saturation.TopTies`), and the search
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
from bosch_eval.runtime.errors import SearchError
from bosch_eval.search.objective.racing import RaceBound

TIE_BREAK_FILE = "tiebreak.jsonl"
FORMAT = "bosch-tiebreak/1"


@dataclass(frozen=True)
class TieBreak:
    """What a tie-break did: its candidates' scores and the mask it chose.

    Attributes:
        tasks: the tie-break task(s).
        scores: tie-break score per candidate mask key, the search's found mask first (a
            :class:`RaceBound` for a candidate racing stopped: it could not beat the best).
        chosen: the key of the mask returned.
    """

    tasks: tuple[str, ...]
    scores: dict[str, float | RaceBound]
    chosen: str

    @property
    def found(self) -> str:
        """The key of the mask the search found (before the tie-break)."""
        return next(iter(self.scores))

    def to_json(self) -> dict[str, Any]:
        return {
            "tasks": list(self.tasks),
            "candidates": len(self.scores),
            "stopped_early": sum(isinstance(value, RaceBound) for value in self.scores.values()),
            "found_mask": self.found,
            "found_score": self.scores[self.found],
            "chosen_score": self.scores[self.chosen],
            "file": TIE_BREAK_FILE,
        }

    def message(self) -> str:
        """What the tie-break chose, in a sentence (the log's and report.md's)."""
        stopped = sum(isinstance(value, RaceBound) for value in self.scores.values())
        raced = f" ({stopped} stopped early by racing)" if stopped else ""
        if self.chosen == self.found:
            return f"the found mask stays: {self.scores[self.found]:.4f}, the best of the {len(self.scores)} masks at the search's S{raced}"
        return (
            f"another of the {len(self.scores)} masks at the search's S{raced} is returned: {self.scores[self.chosen]:.4f} "
            f"against the found mask's {self.scores[self.found]:.4f}"
        )


def tie_key_bits(key: str) -> tuple[tuple[int, ...], ...]:
    """The L×G grid of a journal mask key (``journal.mask_key``'s inverse)."""
    return tuple(tuple(int(c) for c in row) for row in key.split("/"))


def layer_computations(candidates: Sequence[str], layer: int | None) -> int:
    """Decoder-layer computations per example when the prefix cache runs each candidate from
    ``layer`` (None: every layer): candidates scored one after another with the same rows
    below ``layer`` compute layers 0 … layer−1 once, so a run of k of them costs
    ``layer + k·(L−layer)``."""
    rows = [key.split("/") for key in candidates]
    if not rows:
        return 0
    start = layer or 0
    runs = 1 + sum(rows[i][:start] != rows[i - 1][:start] for i in range(1, len(rows)))
    return runs * start + len(rows) * (len(rows[0]) - start)


def shared_rows_layer(candidates: Sequence[str]) -> int | None:
    """The layer ℓ0 from which the prefix cache should run each candidate, or None (every layer).

    The tied masks of a Stage-3 search differ in a few layers and agree in the rest (on
    SmolLM2 at ρ = 0.75, in layers 0–1 and 18–23 of 30). The prefix cache keys the states
    entering ℓ0 by the rows below it, so candidates in a run with the same rows below ℓ0 share
    them. This returns the ℓ0 with the fewest :func:`layer_computations` in scoring order
    (the lowest such ℓ0, which stores the fewest states); None where that is 0, i.e. no layer
    is saved.
    """
    if not candidates:
        return None
    return min(range(candidates[0].count("/") + 1), key=lambda layer: layer_computations(candidates, layer)) or None


def break_ties(
    candidates: Sequence[str],
    score_fn: Callable[[HeadMask], float],
    num_heads: int,
    known: Mapping[str, float | RaceBound],
    *,
    race: bool = False,
    higher_is_better: bool = True,
    on_score: Callable[[str, float | RaceBound], None] | None = None,
    progress: bool = False,
) -> dict[str, float | RaceBound]:
    """Score every candidate key not in ``known`` with ``score_fn``, calling ``on_score`` after
    each, and return every candidate's value in candidate order (:func:`best_key` picks).

    ``race``: ``score_fn.race`` (:class:`~bosch_eval.search.objective.score_book.RacingScoreFunction`)
    stops a candidate with a :class:`RaceBound` once it cannot beat the best so far, since a
    tie keeps the earlier mask; one raced to the end gets exactly its plain score, so the
    choice is the unraced one. A candidate known by a bound (a resumed run) was stopped under
    the best of the full scores before it, which the resumed run rebuilds the same.
    """
    values: dict[str, float | RaceBound] = {}
    best: float | None = None

    def beats(value: float) -> bool:
        return best is None or (value > best if higher_is_better else value < best)

    for key in tqdm(candidates, desc="tie-break", unit="mask", disable=not progress):
        value = known.get(key)
        if value is None:
            mask = HeadMask(tie_key_bits(key), num_heads)
            # The first is raced too (nothing to beat: scored to the end), on the chunks the rest get.
            value = score_fn.race(mask, beats) if race else score_fn(mask)  # type: ignore[attr-defined]
            if on_score is not None:
                on_score(key, value)
        values[key] = value
        if not isinstance(value, RaceBound) and beats(value):
            best = value
    return values


def best_key(values: Mapping[str, float | RaceBound], higher_is_better: bool = True) -> str:
    """The first key with the best full score (dict order: the found mask first); masks stopped
    early by racing could not beat it."""
    sign = 1.0 if higher_is_better else -1.0
    scored = [key for key, value in values.items() if not isinstance(value, RaceBound)]
    return max(scored, key=lambda key: sign * values[key])


class TieBreakFile:
    """``tiebreak.jsonl``: a header line, then one line per candidate, ``{"key", "score"}`` or, for
    one racing stopped, ``{"key", "bound", "examples"}``."""

    def __init__(self, out: Path, header: Mapping[str, Any], write: bool) -> None:
        self.path = Path(out) / TIE_BREAK_FILE
        self.header = json.loads(json.dumps(dict(header)))  # as it reads back
        self.write = write
        self.scores: dict[str, float | RaceBound] = {}
        if self.path.exists():
            self._load()
        elif write:
            self._append({"format": FORMAT, "header": self.header})

    def _load(self) -> None:
        lines = self.path.read_text().splitlines()
        try:
            first = json.loads(lines[0]) if lines else {}
        except ValueError:  # the header line itself cut short by a kill: no score was written after it
            first = {}
        if len(lines) <= 1 and first.get("header") is None:
            if self.write:
                self.path.unlink()
                self._append({"format": FORMAT, "header": self.header})
            return
        if first.get("format") != FORMAT or first.get("header") != self.header:
            raise SearchError(
                f"{self.path}: its tie-break scores were made under other settings or calibration (its header: "
                f"{json.dumps(first.get('header'))[:300]}); move it away to break the ties under these"
            )
        for number, line in enumerate(lines[1:], start=2):
            try:
                record = json.loads(line)
                bound = "bound" in record
                value = RaceBound(float(record["bound"]), int(record["examples"])) if bound else float(record["score"])
                self.scores[str(record["key"])] = value
            except (ValueError, KeyError, TypeError):
                if number < len(lines):
                    expected = "{'key': ..., 'score': ...} or {'key': ..., 'bound': ..., 'examples': ...}"
                    raise SearchError(f"{self.path}, line {number}: expected {expected}, got {line[:200]!r}") from None
                if self.write:  # the last line, cut short by a kill: dropped (that mask is scored again)
                    kept = self.path.with_name(f"{self.path.name}.tmp")
                    kept.write_text("".join(f"{whole}\n" for whole in lines[:-1]))
                    os.replace(kept, self.path)  # a rename: a kill leaves the old file or the new one

    def append(self, key: str, value: float | RaceBound) -> None:
        if self.write:
            record = (
                {"bound": value.score, "examples": value.examples} if isinstance(value, RaceBound) else {"score": value}
            )
            self._append({"key": key, **record})

    def _append(self, record: Mapping[str, Any]) -> None:
        with self.path.open("a") as handle:
            handle.write(json.dumps(record) + "\n")
            handle.flush()
