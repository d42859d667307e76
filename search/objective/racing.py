"""Exact racing: stop scoring a candidate mask once it provably cannot change the search.

S(z) is a mean over calibration examples of a per-example value in [0, 1] (``acc``). After
``m`` of a task's ``n`` examples with sum ``s``, its final mean is at most
``(s + (n − m)) / n`` (at least ``s / n`` when lower is better): the *optimistic* score.
Scored in chunks, a candidate stops as soon as its optimistic score cannot reach the
optimizer's cutoff (:class:`bosch_eval.search.stages.optimizers.Cutoff`), and is journaled with
that bound, never a score. A candidate that is scored to the end gets exactly the value a
single evaluation gives: the same per-example values, aggregated in document order.

Examples are scored hardest first: in decreasing order of how far below the best value
they fell for the masks scored before (:class:`ExampleOrder`). Any order gives the same
answers (a bound holds whatever was scored first); this one makes a weak candidate show
its misses in the first chunk instead of the last.

Every per-example value scored is remembered (:class:`ExampleMemo`, journaled by the
search): a (mask, example) pair is scored once per search, resumes included. A resumed
search replays the killed one's calls with their values from the memo, so its schedule,
its example order, its bounds and its ties come out exactly as they did, and it scores
only the examples the killed search had not reached.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from bosch_eval.masks.head_mask import HeadMask
from bosch_eval.runtime.checks import is_number
from bosch_eval.search.journal.store import mask_key

DEFAULT_RACE_CHUNK = 8  # examples per chunk; smaller stops sooner but pays lm-eval's per-call overhead more often


@dataclass(frozen=True)
class Racing:
    """Whether an objective races its calls (where racing can be exact), and in chunks of how many examples."""

    enabled: bool = False
    chunk: int = DEFAULT_RACE_CHUNK


@dataclass(frozen=True)
class RaceBound:
    """A mask stopped after ``examples`` calibration examples: its S(z) cannot be better than ``score``."""

    score: float
    examples: int


@dataclass
class Tally:
    """Per-example values of one mask so far, per task and document, and what they still allow."""

    sizes: Mapping[str, int]  # examples per task
    higher_is_better: bool
    values: dict[str, dict[int, float]] = field(default_factory=dict)
    forwarded: bool = False  # some example of this mask was scored, not answered from the memo

    def add(self, task: str, values: Mapping[int, float], metric: str) -> None:
        """Record ``task``'s values of some documents (by index).

        Raises:
            ValueError: a value outside [0, 1], where the bound would not hold.
        """
        for value in values.values():
            if not is_number(value) or not 0.0 <= value <= 1.0:
                raise ValueError(
                    f"racing: {task} reported {metric} = {value!r} for one example; racing needs per-example "
                    "values in [0, 1] (acc, exact_match); pass --no-racing for this metric"
                )
        self.values.setdefault(task, {}).update((int(doc), float(value)) for doc, value in values.items())

    @property
    def examples(self) -> int:
        return sum(len(values) for values in self.values.values())

    @property
    def complete(self) -> bool:
        return all(len(self.values.get(task, ())) == size for task, size in self.sizes.items())

    def in_document_order(self, task: str) -> list[float]:
        return [value for _, value in sorted(self.values[task].items())]

    def optimistic(self) -> float:
        """The best S the mask can still reach: the unweighted mean over tasks of each
        task's mean with every unscored example at the best value (1, or 0 when lower is better)."""
        return self._filled(1.0 if self.higher_is_better else 0.0)

    def pessimistic(self) -> float:
        """The worst S the mask can still end with (every unscored example at the worst value)."""
        return self._filled(0.0 if self.higher_is_better else 1.0)

    def _filled(self, unseen: float) -> float:
        means = []
        for task, size in self.sizes.items():
            seen = self.values.get(task, {})
            means.append((math.fsum(seen.values()) + (size - len(seen)) * unseen) / size)
        return math.fsum(means) / len(means)


def ruled_out(lowest: Sequence[float], highest: Sequence[float]) -> set[int]:
    """The candidates that provably are not the first of least loss.

    Candidate ``c``'s loss lies in ``[lowest[c], highest[c]]``. It is ruled out when another
    candidate surely does better (``highest[d] < lowest[c]``), or at least as well and comes
    first (``highest[d] <= lowest[c]`` with ``d < c``: the first of equal losses wins, as in
    the optimizers). The first least-loss candidate is never ruled out.
    """
    best_anywhere = min(highest, default=math.inf)
    best_before = math.inf
    out = set()
    for candidate, (low, high) in enumerate(zip(lowest, highest, strict=True)):
        if best_anywhere < low or best_before <= low:
            out.add(candidate)
        best_before = min(best_before, high)
    return out


@dataclass
class ExampleOrder:
    """Which examples to score first: the ones masks scored so far missed most.

    ``fixed``: values are not recorded, so every race gets the same chunks (a tie-break's
    candidates: the prefix cache keys states by a batch's inputs, and only repeated chunks
    repeat the batches)."""

    higher_is_better: bool
    shortfall: dict[tuple[str, int], float] = field(default_factory=dict)
    fixed: bool = False

    def record(self, task: str, values: Mapping[int, float]) -> None:
        if self.fixed:
            return
        best = 1.0 if self.higher_is_better else 0.0
        for doc, value in values.items():
            self.shortfall[task, doc] = self.shortfall.get((task, doc), 0.0) + abs(best - value)

    def chunks(self, sizes: Mapping[str, int], chunk: int) -> list[tuple[str, list[int]]]:
        """Each task's documents, hardest first (ties by index), in chunks of ``chunk``."""
        out = []
        for task, size in sizes.items():
            order = sorted(range(size), key=lambda doc: (-self.shortfall.get((task, doc), 0.0), doc))
            out += [(task, order[start : start + chunk]) for start in range(0, size, chunk)]
        return out


# Per-example values of several (mask, task, document indices) items at once.
ScoreChunks = Callable[[list[tuple[HeadMask, str, list[int]]]], list[Mapping[int, float]]]
# Told of values scored for the first time: (mask key, task, {document: value}).
OnNewValues = Callable[[str, str, dict[int, float]], None]


class ExampleMemo:
    """Per-example values scored so far, by mask key, task and document.

    Args:
        values: values known before (a resumed journal's): ``{key: {task: {doc: value}}}``.
        on_new: called with the values of each (mask, task) scored for the first time
            (the search journals them); a document already known is never passed again.
    """

    def __init__(
        self, values: Mapping[str, Mapping[str, Mapping[int, float]]] | None = None, on_new: OnNewValues | None = None
    ) -> None:
        self.values: dict[str, dict[str, dict[int, float]]] = {
            key: {task: dict(docs) for task, docs in tasks.items()} for key, tasks in (values or {}).items()
        }
        self.on_new = on_new

    def __contains__(self, key: object) -> bool:
        return key in self.values

    def known(self, key: str, task: str, docs: Iterable[int]) -> dict[int, float]:
        """The values of ``docs`` known for ``key`` on ``task`` (those not known are left out)."""
        seen = self.values.get(key, {}).get(task, {})
        return {doc: seen[doc] for doc in docs if doc in seen}

    def add(self, key: str, task: str, values: Mapping[int, float]) -> None:
        """Remember ``values``; a document known before keeps its first value."""
        seen = self.values.setdefault(key, {}).setdefault(task, {})
        new = {int(doc): float(value) for doc, value in values.items() if int(doc) not in seen}
        seen.update(new)
        if new and self.on_new is not None:
            self.on_new(key, task, new)


class Racer:
    """Races masks over the examples of one objective, a chunk at a time.

    Args:
        sizes: examples per task.
        higher_is_better: the metric's direction.
        score_chunks: ``[(mask, task, document indices), ...] -> [{index: value}, ...]``,
            the per-example values of several items (the same on every process).
        exact: S(z) from a complete :class:`Tally` (the objective's own aggregation).
        chunk: examples per chunk.
        processes: how many processes ``score_chunks`` shares items among. Each round
            splits the chunk into enough parts that every process gets an item: several
            masks at once (mask-parallel), or parts of one mask's chunk (data-parallel).

    Attributes:
        examples_scored: examples forwarded so far (not those answered from ``memo``).
        masks_forwarded: masks raced so far that forwarded at least one example (a mask a
            resumed search answers wholly from the journal's values is not among them).
        memo: per-example values scored so far; a chunk's known examples are answered from it.
    """

    def __init__(
        self,
        sizes: Mapping[str, int],
        higher_is_better: bool,
        score_chunks: ScoreChunks,
        exact: Callable[[Tally], float],
        chunk: int = DEFAULT_RACE_CHUNK,
        processes: int = 1,
    ) -> None:
        self.sizes = dict(sizes)
        self.higher_is_better = higher_is_better
        self.score_chunks = score_chunks
        self.processes = processes
        self.exact = exact
        self.chunk = chunk
        self.order = ExampleOrder(higher_is_better)
        self.examples_scored = 0
        self.masks_forwarded = 0
        self.memo = ExampleMemo()

    def learn(self, mask: HeadMask, values: Mapping[str, Mapping[int, float]]) -> None:
        """Take in the per-example values of a plain (unraced) call of ``mask``: every task's
        values, ``{task: {doc: value}}``. They order the examples of later races."""
        key = mask_key(mask.bits)
        for task, task_values in values.items():
            self.memo.add(key, task, task_values)
            self.order.record(task, task_values)

    def recall(self, mask: HeadMask, metric: str = "S") -> float | None:
        """What a plain call of ``mask`` answers, from the memo, with the same effect on the
        example order (:meth:`learn`); None when some example of it was never scored."""
        key = mask_key(mask.bits)
        tally = Tally(self.sizes, self.higher_is_better)
        for task, size in self.sizes.items():
            values = self.memo.known(key, task, range(size))
            if len(values) < size:
                return None
            tally.add(task, values, metric)
        for task, values in tally.values.items():
            self.order.record(task, values)
        return self.exact(tally)

    def race(self, mask: HeadMask, can_win: Callable[[float], bool], metric: str = "S") -> float | RaceBound:
        """S(z) of ``mask``, or a :class:`RaceBound` as soon as ``can_win(best S still reachable)`` is False."""
        tally = Tally(self.sizes, self.higher_is_better)
        outcome: float | RaceBound | None = None
        for task, indices in self.order.chunks(self.sizes, self.chunk):
            self._add_round([(tally, mask, task, indices)], metric)
            if tally.complete:
                outcome = self.exact(tally)
            elif not can_win(tally.optimistic()):
                outcome = RaceBound(tally.optimistic(), tally.examples)
            if outcome is not None:
                break
        self._learn([tally])
        self.masks_forwarded += tally.forwarded
        assert outcome is not None  # the last chunk completes the tally
        return outcome

    def race_many(
        self, masks: Sequence[HeadMask], rule_out: Callable[[list[tuple[float, float]]], set[int]], metric: str = "S"
    ) -> list[float | RaceBound]:
        """Score ``masks`` a chunk at a time until each is exact or provably cannot win.

        Best first: the first round scores every mask's first chunk; each later round, the
        next chunk of the mask whose best reachable S is the highest (the first of equal
        ones). Work goes to the mask that may still be the winner, a weak mask is scored
        only until its bound falls below the one that turns out best, and of masks that tie
        the first is finished first, which is what rules the later ones out. (It ranks by
        S, the loss's only mask-dependent term among one sub-problem's feasible points.)

        After every round, ``rule_out`` gets each mask's (best, worst) S still reachable and
        names the masks that provably cannot win: they stop with a :class:`RaceBound`; the
        rest are scored to the end. The schedule only decides when each mask stops: the
        first least-loss mask is never ruled out, whatever was scored first.
        """
        tallies = [Tally(self.sizes, self.higher_is_better) for _ in masks]
        outcomes: list[float | RaceBound | None] = [None] * len(masks)
        chunks = self.order.chunks(self.sizes, self.chunk)
        played = [0] * len(masks)  # chunks scored per mask
        sign = 1.0 if self.higher_is_better else -1.0
        chosen = list(range(len(masks)))  # the first round: every mask's first chunk
        while chosen:
            self._add_round([(tallies[n], masks[n], *chunks[played[n]]) for n in chosen], metric)
            for number in chosen:
                played[number] += 1
                if tallies[number].complete:
                    outcomes[number] = self.exact(tallies[number])
            for number in rule_out([(tally.optimistic(), tally.pessimistic()) for tally in tallies]):
                if outcomes[number] is None:
                    outcomes[number] = RaceBound(tallies[number].optimistic(), tallies[number].examples)
            running = [number for number, outcome in enumerate(outcomes) if outcome is None]
            chosen = [max(running, key=lambda n: (sign * tallies[n].optimistic(), -n))] if running else []
        self._learn(tallies)
        self.masks_forwarded += sum(tally.forwarded for tally in tallies)
        return [outcome for outcome in outcomes if outcome is not None]

    def _add_round(self, entries: Sequence[tuple[Tally, HeadMask, str, list[int]]], metric: str) -> None:
        """Add one chunk of each (tally, mask, task, indices) entry: the examples the memo
        knows from it, the rest scored, one item per entry, or per part of a chunk when
        there are fewer entries to score than processes.

        The entries are scored a group at a time (one entry per process), and each group's
        values reach the memo, and so the journal, before the next group starts: a first
        round can hold hundreds of masks (Stage 3 on a real model: an hour of CPU), and a
        kill must lose at most one group."""
        missing = []
        for tally, mask, task, indices in entries:
            key = mask_key(mask.bits)
            known = self.memo.known(key, task, indices)
            if known:
                tally.add(task, known, metric)
            if len(known) < len(indices):
                tally.forwarded = True
                missing.append((tally, mask, key, task, [doc for doc in indices if doc not in known]))
        group = max(1, self.processes)
        for start in range(0, len(missing), group):
            self._score_group(missing[start : start + group], metric)

    def _score_group(self, missing: Sequence[tuple[Tally, HeadMask, str, str, list[int]]], metric: str) -> None:
        """Score the unknown examples of each (tally, mask, key, task, indices) entry; the memo keeps them."""
        parts = max(1, -(-self.processes // len(missing)))
        items, owners = [], []
        for number, (_, mask, _, task, indices) in enumerate(missing):
            pieces = min(parts, len(indices))
            items += [(mask, task, indices[start::pieces]) for start in range(pieces)]
            owners += [number] * pieces
            self.examples_scored += len(indices)
        # A chunk split among processes is put back together before the memo sees it: one
        # memo entry (one journal record) per chunk, as one process writes, whatever N is.
        scored: list[dict[int, float]] = [{} for _ in missing]
        for number, values in zip(owners, self.score_chunks(items), strict=True):
            scored[number].update(values)
        for (tally, _, key, task, _), values in zip(missing, scored, strict=True):
            tally.add(task, values, metric)  # checks the values before the memo (and the journal) keeps them
            self.memo.add(key, task, values)

    def _learn(self, tallies: Sequence[Tally]) -> None:
        """Update the example order after a race (never during one: every mask of a race sees the same order)."""
        for tally in tallies:
            for task, values in tally.values.items():
                self.order.record(task, values)
