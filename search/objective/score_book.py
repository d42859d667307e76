"""``ScoreBook``: S(z) for every mask the search asks about, each evaluated at most once.

The book is the search's memory: a cache of scores and racing bounds, the journal they are
appended to, and the replay of a killed run's races from its journaled per-example values.
What a racing score function must offer is the :class:`RacingScoreFunction` protocol.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Protocol, runtime_checkable

from bosch_eval.masks.head_mask import HeadMask, ModelShape
from bosch_eval.runtime.errors import JournalError
from bosch_eval.search.journal.store import Journal, mask_key
from bosch_eval.search.objective.racing import ExampleMemo, RaceBound, ruled_out

Bits = tuple[tuple[int, ...], ...]


@runtime_checkable
class RacingScoreFunction(Protocol):
    """What a racing search needs of S(z) besides being callable (:class:`CalibrationObjective`)."""

    def __call__(self, mask: HeadMask) -> float: ...

    def race(self, mask: HeadMask, can_win: Callable[[float], bool]) -> float | RaceBound: ...

    def race_many(
        self, masks: Sequence[HeadMask], rule_out: Callable[[list[tuple[float, float]]], set[int]]
    ) -> list[float | RaceBound]: ...

    def recall(self, mask: HeadMask) -> float | None: ...

    def use_memo(self, memo: ExampleMemo) -> None: ...


class ScoreBook:
    """S(z) for every mask the search asks about, each evaluated at most once.

    ``racing=True`` needs a score function with ``race(mask, can_win)``,
    ``race_many(masks, rule_out)``, ``recall(mask)`` and ``use_memo(memo)``
    (:class:`CalibrationObjective`). ``known``, ``bounds`` and ``examples`` are what a
    resumed journal holds: scores, :class:`RaceBound` scores of masks stopped early, and
    per-example values. A racing book replays every mask whose examples are journaled:
    the search asks for it where the killed run did and the score function answers from
    the values (no model call), so the example order, the races and their bounds come out
    as they did. Other journaled masks are looked up. A score function with
    ``vary_layers_from(layer)`` is told, before each sub-problem, the lowest layer its
    candidates differ in (``None`` afterwards).
    """

    def __init__(
        self,
        score_fn: Callable[[HeadMask], float],
        shape: ModelShape,
        known: dict[str, float] | None = None,
        journal: Journal | None = None,
        racing: bool = False,
        bounds: dict[str, float] | None = None,
        examples: dict[str, dict[str, dict[int, float]]] | None = None,
        best_possible: float | None = None,
    ) -> None:
        if racing and not isinstance(score_fn, RacingScoreFunction):
            methods = ", ".join(
                name
                for name in ("race", "race_many", "recall", "use_memo")
                if not callable(getattr(score_fn, name, None))
            )
            raise TypeError(f"racing: the score function {score_fn!r} lacks the RacingScoreFunction methods {methods}")
        self.score_fn = score_fn
        self.shape = shape
        self.known = dict(known or {})
        self.journal = journal  # None on non-main processes: only the main process writes
        self.racing = racing
        # The best S the metric can take, when known (CalibrationObjective.best_possible): a
        # sub-problem stops at the first mask that reaches it.
        self.best_possible = best_possible
        self.bounds = dict(bounds or {})  # mask key -> best S it could still reach
        # Journaled masks the run replays when it reaches them (until then, not known: the
        # killed run did not know them at this point either).
        self._unreplayed: dict[str, float] = {}
        self._unreplayed_bounds: dict[str, float] = {}
        if racing:
            memo = ExampleMemo(examples, on_new=self._journal_values)
            score_fn.use_memo(memo)  # type: ignore[attr-defined]
            self._unreplayed = {key: self.known.pop(key) for key in list(self.known) if key in memo}
            self._unreplayed_bounds = {key: self.bounds.pop(key) for key in list(self.bounds) if key in memo}
        self.new_evaluations = 0
        self.costs: dict[str, dict[str, float]] = {}  # per stage: calls, pruned, seconds (this run)
        self.on_score: Callable[[float | None, Bits], None] | None = (
            None  # progress hook: S (None: a bound) and the mask
        )

    @property
    def evaluations(self) -> int:
        """Distinct masks evaluated, by this run or the journal it resumed (scored or stopped early)."""
        scored = self.known.keys() | self._unreplayed.keys()
        return len(scored) + len((self.bounds.keys() | self._unreplayed_bounds.keys()) - scored)

    @property
    def pruned(self) -> int:
        """Of :attr:`evaluations`, the masks racing stopped early that never got a score."""
        scored = self.known.keys() | self._unreplayed.keys()
        return len((self.bounds.keys() | self._unreplayed_bounds.keys()) - scored)

    def all_scores(self) -> dict[str, float]:
        """S of every mask evaluated to the end, by this run or the journal it resumed, by ``mask_key``."""
        return {**self._unreplayed, **self.known}

    def all_bounds(self) -> dict[str, float]:
        """The racing bound of every mask stopped early and never scored, by ``mask_key``."""
        scored = self.known.keys() | self._unreplayed.keys()
        bounds = {**self._unreplayed_bounds, **self.bounds}
        return {key: bound for key, bound in bounds.items() if key not in scored}

    def _journal_values(self, key: str, task: str, values: dict[int, float]) -> None:
        if self.journal is not None:
            self.journal.append_values(key, task, values)

    def score(self, bits: Bits, stage: str) -> float:
        key = mask_key(bits)
        mask = HeadMask(bits, self.shape.num_heads)
        score = self.known.get(key)
        if score is None and self.racing:
            # A plain call whose every example is known (replayed, or scored before a kill
            # cut its score record) is answered from them, with the call's effect on the order.
            recalled = self.score_fn.recall(mask)  # type: ignore[attr-defined]
            if recalled is not None:
                score = self._record(key, float(recalled), stage, 0.0)
        if score is None and key in self._unreplayed:
            score = self.known[key] = self._unreplayed.pop(key)  # journaled without its examples: looked up
        if score is None:
            started = time.perf_counter()
            score = float(self.score_fn(mask))
            score = self._record(key, score, stage, time.perf_counter() - started)
        if self.on_score is not None:
            self.on_score(score, bits)
        return score

    def race(self, bits: Bits, stage: str, can_win: Callable[[float], bool]) -> float | RaceBound:
        """S(z) of ``bits``, or a :class:`RaceBound` once ``can_win(best S still reachable)`` is False.

        A mask stopped before answers again from its bound while the bound still rules it
        out; otherwise it is raced again (its examples scored before come from the memo).
        """
        key = mask_key(bits)
        if key in self.known:
            return self.score(bits, stage)
        if key in self.bounds and not can_win(self.bounds[key]):
            return RaceBound(self.bounds[key], examples=0)
        started = time.perf_counter()
        outcome = self.score_fn.race(HeadMask(bits, self.shape.num_heads), can_win)  # type: ignore[attr-defined]
        outcome = self._record(key, outcome, stage, time.perf_counter() - started)
        if self.on_score is not None:
            self.on_score(None if isinstance(outcome, RaceBound) else outcome, bits)
        return outcome

    def race_many(
        self, bits_list: Sequence[Bits], stage: str, loss_of: Callable[[int, float], float]
    ) -> list[float | RaceBound]:
        """S(z) of each mask, raced together: exact for the first mask of least loss
        (``loss_of(index, S)``, monotone in S) and for every mask scored to the end, a
        :class:`RaceBound` for masks ruled out on the way. Masks already scored are not
        evaluated; masks stopped early before are raced again."""
        keys = [mask_key(bits) for bits in bits_list]
        todo = [i for i, key in enumerate(keys) if key not in self.known]

        def rule_out(intervals: list[tuple[float, float]]) -> set[int]:
            lowest = [loss_of(i, self.known[key]) if key in self.known else math.nan for i, key in enumerate(keys)]
            highest = list(lowest)
            for position, (best, worst) in zip(todo, intervals, strict=True):
                lowest[position], highest[position] = loss_of(position, best), loss_of(position, worst)
            out = ruled_out(lowest, highest)
            return {number for number, position in enumerate(todo) if position in out}

        outcomes: dict[int, float | RaceBound] = {}
        if todo:
            started = time.perf_counter()
            masks = [HeadMask(bits_list[i], self.shape.num_heads) for i in todo]
            raced = self.score_fn.race_many(masks, rule_out)  # type: ignore[attr-defined]
            seconds = (time.perf_counter() - started) / len(todo)  # the race's time, shared
            for position, outcome in zip(todo, raced, strict=True):
                outcomes[position] = self._record(keys[position], outcome, stage, seconds)
                if self.on_score is not None:
                    self.on_score(None if isinstance(outcome, RaceBound) else outcomes[position], bits_list[position])
        answers = [outcomes[i] if i in outcomes else self.known[keys[i]] for i in range(len(keys))]
        if self.on_score is not None:  # masks scored before cost nothing, but were asked: the bar counts asks
            for i in range(len(keys)):
                if i not in outcomes:
                    self.on_score(answers[i], bits_list[i])
        return answers

    def _record(self, key: str, outcome: float | RaceBound, stage: str, seconds: float) -> float | RaceBound:
        """Keep, count and journal one outcome; one the journal holds already (a replay) is
        neither journaled again nor counted as new.

        Raises:
            JournalError: a replayed score differs from the journaled one.
        """
        if isinstance(outcome, RaceBound):
            self.bounds[key] = outcome.score
            self._unreplayed_bounds.pop(key, None)
            # Already journaled: this bound (a replay), or a score (a resume under other
            # settings races a mask the journal scored; its examples all came from the memo).
            journaled = key in self._unreplayed or (
                self.journal is not None and self.journal.has_bound(key, outcome.score, outcome.examples)
            )
            if not journaled:
                self._count(stage, seconds, pruned=True)
                if self.journal is not None:
                    self.journal.append_bound(
                        key, outcome.score, outcome.examples, stage=stage, seconds=round(seconds, 3)
                    )
            return outcome
        score = float(outcome)
        journaled = self._unreplayed.pop(key, None)
        if journaled is not None and journaled != score:
            raise JournalError(
                f"mask {key}: its journaled examples give S = {score!r}, but the journal's score is {journaled!r}; "
                "the journal is damaged, or its examples were scored under another calibration"
            )
        self.known[key] = score
        self.bounds.pop(key, None)
        if journaled is None:
            self._count(stage, seconds, pruned=False)
            if self.journal is not None:
                self.journal.append(key, score, stage=stage, seconds=round(seconds, 3))
        return score

    def _count(self, stage: str, seconds: float, pruned: bool) -> None:
        self.new_evaluations += 1
        row = self.costs.setdefault(stage, {"calls": 0, "pruned": 0, "seconds": 0.0})
        row["calls"] += 1
        row["pruned"] += int(pruned)
        row["seconds"] += seconds

    def relative_cost(self, lowest_layer: int | None) -> float:
        """What one evaluation of masks that differ only in layers >= ``lowest_layer`` costs,
        relative to one over the whole model (1.0 unless the score function says less: a
        prefix cache runs only the layers from the lowest varied one up)."""
        cost = getattr(self.score_fn, "relative_cost", None)
        return float(cost(lowest_layer)) if cost is not None else 1.0

    @contextlib.contextmanager
    def varying_from(self, layer: int) -> Iterator[None]:
        """Tell the score function that masks differ only in layers >= ``layer`` meanwhile."""
        tell = getattr(self.score_fn, "vary_layers_from", None)
        if tell is None:
            yield
            return
        tell(layer)
        try:
            yield
        finally:
            tell(None)
