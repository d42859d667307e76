"""Exact racing: the search's answer and every full score are those of the search without it."""

from __future__ import annotations

import itertools
import json
import random

import pytest

from bosch_eval.masks.head_mask import HeadMask
from bosch_eval.runtime.errors import JournalError
from bosch_eval.search.journal.store import Journal, mask_key
from bosch_eval.search.objective.racing import Racer, RaceBound, Tally, ruled_out
from bosch_eval.search.run.pipeline import Resumed, SearchSettings, run_search
from bosch_eval.search.stages.optimizers import Bound, Cutoff, SubProblem, minimize
from tests.helpers import SHAPE, ExampleObjective, Killed


class TestRuledOut:
    def test_a_sure_better_candidate_rules_out(self) -> None:
        assert ruled_out([0.5, 0.1], [0.6, 0.2]) == {0}

    def test_overlapping_intervals_rule_out_nothing(self) -> None:
        assert ruled_out([0.1, 0.15], [0.3, 0.4]) == set()

    def test_ties_keep_the_first(self) -> None:
        # Equal exact losses: the first wins, so only the later one is ruled out.
        assert ruled_out([0.2, 0.2, 0.2], [0.2, 0.2, 0.2]) == {1, 2}

    def test_a_later_candidate_tying_an_earlier_bound_is_out_but_not_the_reverse(self) -> None:
        assert ruled_out([0.0, 0.3], [0.3, 0.5]) == {1}
        assert ruled_out([0.3, 0.0], [0.5, 0.3]) == set()

    @pytest.mark.parametrize("seed", range(20))
    def test_never_rules_out_the_first_least_loss(self, seed: int) -> None:
        rng = random.Random(seed)
        true = [rng.choice([0.0, 0.25, 0.5, 0.75]) for _ in range(8)]
        lowest = [value - rng.choice([0.0, 0.1, 0.3]) for value in true]
        highest = [value + rng.choice([0.0, 0.1, 0.3]) for value in true]
        winner = true.index(min(true))
        assert winner not in ruled_out(lowest, highest)


class TestTally:
    def test_bounds_hold_whatever_comes_next(self) -> None:
        tally = Tally({"a": 4, "b": 2}, higher_is_better=True)
        tally.add("a", {3: 1.0, 0: 0.0}, "acc")
        assert tally.optimistic() == pytest.approx((3 / 4 + 1) / 2)
        assert tally.pessimistic() == pytest.approx((1 / 4 + 0) / 2)
        assert not tally.complete
        tally.add("a", {1: 1.0, 2: 1.0}, "acc")
        tally.add("b", {0: 0.0, 1: 1.0}, "acc")
        assert tally.complete and tally.optimistic() == tally.pessimistic() == pytest.approx((3 / 4 + 1 / 2) / 2)
        assert tally.in_document_order("a") == [0.0, 1.0, 1.0, 1.0]

    def test_lower_is_better_swaps_the_bounds(self) -> None:
        tally = Tally({"a": 4}, higher_is_better=False)
        tally.add("a", {0: 1.0}, "err")
        assert (tally.optimistic(), tally.pessimistic()) == (0.25, 1.0)

    def test_values_outside_the_unit_interval_are_refused(self) -> None:
        with pytest.raises(ValueError, match=r"reported ppl = 3.5 .* values in \[0, 1\].*--no-racing"):
            Tally({"a": 2}, True).add("a", {0: 3.5}, "ppl")


class TestRaceMany:
    """The schedule of a race among several masks: best first, the first of ties finished first."""

    @staticmethod
    def race(per_mask: list[list[float]], chunk: int = 4) -> tuple[list, list[int]]:
        """Race masks whose per-example values are given; returns the outcomes and the
        examples scored per mask."""
        cells = [(layer, group) for layer in range(SHAPE.num_layers) for group in range(SHAPE.num_kv_heads)]
        masks = [  # stand-ins with distinct bits (the racer remembers values by mask), one SWA group each
            HeadMask(tuple(tuple(int((layer, group) != cells[n]) for group in range(SHAPE.num_kv_heads)) for layer in range(SHAPE.num_layers)), SHAPE.num_heads)
            for n in range(len(per_mask))
        ]  # fmt: skip
        scored = [0] * len(per_mask)

        def score_chunks(items):  # noqa: ANN001, ANN202
            out = []
            for mask, _, indices in items:
                number = next(n for n, m in enumerate(masks) if m is mask)
                scored[number] += len(indices)
                out.append({e: per_mask[number][e] for e in indices})
            return out

        def exact(tally: Tally) -> float:
            values = tally.in_document_order("t")
            return sum(values) / len(values)

        racer = Racer({"t": len(per_mask[0])}, True, score_chunks, exact, chunk)
        outcomes = racer.race_many(
            masks, lambda intervals: ruled_out([-b for b, _ in intervals], [-w for _, w in intervals])
        )
        return outcomes, scored

    def test_a_kill_inside_a_round_loses_at_most_the_mask_being_scored(self) -> None:
        """A first round over many masks is long on a real model; every mask's chunk is in the
        memo (so in the journal) as soon as it is scored, not when the round ends."""
        cells = [(layer, group) for layer in range(SHAPE.num_layers) for group in range(SHAPE.num_kv_heads)]
        masks = [HeadMask.from_swa_groups(SHAPE, {cells[n]}) for n in range(6)]
        scored: list[int] = []

        def score_chunks(items):  # noqa: ANN001, ANN202
            out = []
            for mask, _, indices in items:
                if len(scored) == 3:
                    raise KeyboardInterrupt  # killed while scoring the fourth mask
                scored.append(masks.index(mask))
                out.append(dict.fromkeys(indices, 1.0))
            return out

        racer = Racer({"t": 8}, True, score_chunks, lambda tally: 1.0, chunk=4)
        with pytest.raises(KeyboardInterrupt):
            racer.race_many(masks, lambda intervals: set())
        assert [n for n, mask in enumerate(masks) if mask_key(mask.bits) in racer.memo] == [0, 1, 2]

    def test_a_mask_answered_from_the_memo_is_not_counted_as_forwarded(self) -> None:
        """A resumed search replays its races from the journal's values; a report must not
        count those masks as calls that ran the model."""
        masks = [HeadMask.from_swa_groups(SHAPE, {cell}) for cell in [(0, 0), (0, 1), (1, 0)]]

        def score_chunks(items):  # noqa: ANN001, ANN202
            return [dict.fromkeys(indices, 1.0) for _, _, indices in items]

        first = Racer({"t": 8}, True, score_chunks, lambda tally: 1.0, chunk=4)
        first.race_many(masks[:2], lambda intervals: set())
        assert (first.masks_forwarded, first.examples_scored) == (2, 16)
        replay = Racer({"t": 8}, True, score_chunks, lambda tally: 1.0, chunk=4)
        replay.memo = first.memo
        replay.race_many(masks[:2], lambda intervals: set())
        replay.race(masks[0], lambda best: True)
        assert (replay.masks_forwarded, replay.examples_scored) == (0, 0)
        replay.race_many(masks, lambda intervals: set())  # one new mask among two known ones
        assert (replay.masks_forwarded, replay.examples_scored) == (1, 8)

    def test_a_weak_first_mask_stops_after_its_first_chunk(self) -> None:
        weak, strong, middling = [0.0] * 24, [1.0] * 24, [1.0, 0.0] * 12
        outcomes, scored = self.race([weak, strong, middling])
        assert outcomes[1] == 1.0 and scored == [4, 24, 4]
        assert isinstance(outcomes[0], RaceBound) and isinstance(outcomes[2], RaceBound)

    def test_of_equal_masks_the_first_is_finished_and_the_rest_stop(self) -> None:
        values = [0.0, 0.0] + [1.0] * 22  # the misses come in the first chunk
        outcomes, scored = self.race([values, values, values])
        assert outcomes[0] == 22 / 24 and scored == [24, 4, 4]
        assert all(isinstance(outcome, RaceBound) and outcome.score == 22 / 24 for outcome in outcomes[1:])

    @pytest.mark.parametrize("seed", range(10))
    def test_the_winner_and_every_full_score_are_exact(self, seed: int) -> None:
        rng = random.Random(seed)
        per_mask = [[float(rng.random() < rng.choice([0.2, 0.5, 0.8])) for _ in range(16)] for _ in range(5)]
        truth = [sum(values) / 16 for values in per_mask]
        outcomes, _ = self.race(per_mask)
        assert outcomes[truth.index(max(truth))] == max(truth)
        for outcome, value in zip(outcomes, truth, strict=True):
            assert outcome == value if not isinstance(outcome, RaceBound) else outcome.score >= value


def test_a_fixed_example_order_gives_every_race_the_same_chunks() -> None:
    """Learning moves missed examples first; fixed (a tie-break's candidates, for the prefix
    cache's batches), every race asks for the chunks the first one did, and scores stay exact."""
    values = [1.0, 1.0, 0.0, 1.0, 0.0, 1.0, 1.0, 0.0]
    masks = [HeadMask.from_swa_groups(SHAPE, {(0, group)}) for group in range(3)]

    def chunks_asked(fixed: bool) -> tuple[list[list[list[int]]], list[float | RaceBound]]:
        asked: list[list[list[int]]] = []

        def score_chunks(items):  # noqa: ANN001, ANN202
            asked[-1] += [indices for _, _, indices in items]
            return [{e: values[e] for e in indices} for _, _, indices in items]

        racer = Racer(
            {"t": len(values)}, True, score_chunks, lambda tally: sum(tally.in_document_order("t")) / len(values), 2
        )
        racer.order.fixed = fixed
        outcomes = []
        for mask in masks:
            asked.append([])
            outcomes.append(racer.race(mask, lambda best: True))
        return asked, outcomes

    learned, learned_scores = chunks_asked(fixed=False)
    assert learned[1] != learned[0]  # the misses (examples 2, 4, 7) come first after one race
    fixed, fixed_scores = chunks_asked(fixed=True)
    assert fixed[0] == fixed[1] == fixed[2] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert fixed_scores == learned_scores == [0.625] * 3


class TestOptimizers:
    @pytest.mark.parametrize("seed", range(12))
    def test_exhaustive_with_race_all_picks_the_same_point(self, seed: int) -> None:
        rng = random.Random(seed)
        values = {p: rng.choice([0.0, 0.5, 1.0]) for p in itertools.product((0, 1), repeat=5)}  # many ties
        problem = SubProblem(n=5, k=2, budget=100, seed=seed)

        def race_all(points):  # noqa: ANN001, ANN202 - exact for the first least, bounds for the rest
            first = min(range(len(points)), key=lambda i: (values[points[i]], i))
            return [values[p] if i == first else Bound(values[p]) for i, p in enumerate(points)]

        plain = minimize(values.__getitem__, problem, "exhaustive")
        raced = minimize(values.__getitem__, problem, "exhaustive", race_all=race_all)
        assert (raced.best, raced.best_loss, raced.evaluations) == (plain.best, plain.best_loss, plain.evaluations)
        assert raced.pruned == plain.evaluations - 1  # every point but the winner

    @pytest.mark.parametrize("seed", range(6))
    def test_oneplusone_with_cutoffs_takes_the_same_steps(self, seed: int) -> None:
        rng = random.Random(seed)
        values = {p: rng.choice([0.0, 0.25, 0.5]) for p in itertools.product((0, 1), repeat=8)}
        problem = SubProblem(n=8, k=4, budget=30, seed=seed)
        calls: list[tuple] = []

        def loss(point):  # noqa: ANN001, ANN202
            calls.append(point)
            return values[point]

        def race(point, cutoff: Cutoff):  # noqa: ANN001, ANN202
            calls.append(point)
            return values[point] if cutoff.reachable(values[point]) else Bound(values[point])

        plain_calls = []
        plain = minimize(lambda p: plain_calls.append(p) or values[p], problem, "oneplusone")
        raced = minimize(loss, problem, "oneplusone", race=race)
        assert calls == plain_calls
        assert (raced.best, raced.best_loss, raced.evaluations) == (plain.best, plain.best_loss, plain.evaluations)

    def test_a_bound_that_does_not_rule_out_is_an_error(self) -> None:
        problem = SubProblem(n=6, k=3, budget=20, seed=0)
        with pytest.raises(ValueError, match="does not rule it out"):
            minimize(lambda p: 1.0, problem, "oneplusone", race=lambda p, cutoff: Bound(-5.0))


class TestSearch:
    @pytest.mark.parametrize(
        ("ratio", "seed", "variant"),
        [
            (0.5, 0, "bosch"),
            (0.75, 1, "bosch"),
            (0.75, 2, "bosch"),
            (0.5, 5, "bosch"),
            (0.625, 3, "nested"),
            (0.375, 4, "nested"),
        ],
    )
    def test_same_mask_and_scores_with_fewer_examples(self, ratio: float, seed: int, variant: str) -> None:
        plain_fn, raced_fn = ExampleObjective(seed=seed), ExampleObjective(seed=seed)
        settings = SearchSettings(ratio=ratio, seed=seed, budget_per_layer=10, variant=variant)
        plain = run_search(plain_fn, SHAPE, settings, progress=False)
        raced = run_search(raced_fn, SHAPE, settings, progress=False, racing=True)
        assert raced.mask.bits == plain.mask.bits and raced.score == plain.score
        assert [s.score for s in raced.subproblems] == [s.score for s in plain.subproblems]
        assert raced.evaluations == plain.evaluations and raced.pruned > 0
        assert raced_fn.examples_scored < plain_fn.examples_scored
        # A mask raced to the end has its plain score, so racing can only hide ties, never make them.
        assert raced.ties is not None and plain.ties is not None and raced.ties.scored <= plain.ties.scored

    @pytest.mark.parametrize("processes", [2, 3, 8])
    def test_items_shared_among_processes_change_nothing(self, processes: int, tmp_path) -> None:  # noqa: ANN001
        one, many = ExampleObjective(seed=6), ExampleObjective(seed=6, processes=processes)
        settings = SearchSettings(ratio=0.5, seed=6, budget_per_layer=10)
        first = resumed_search(tmp_path / "one.jsonl", one, settings, resume=False)
        second = resumed_search(tmp_path / "many.jsonl", many, settings, resume=False)
        assert (first.mask.bits, first.score, first.pruned) == (second.mask.bits, second.score, second.pruned)
        assert one.examples_scored == many.examples_scored
        # The same journal: a chunk split among processes is one values record, as with one.
        assert journal_records(tmp_path / "many.jsonl") == journal_records(tmp_path / "one.jsonl")
        # Every call gives each process an item: several masks, or parts of one chunk; one
        # process scores one item per call, journaled before the next.
        assert min(many.items) >= min(processes, 4) and set(one.items) == {1}

    def test_every_full_score_equals_the_unraced_score(self, tmp_path) -> None:  # noqa: ANN001
        objective = ExampleObjective(seed=4)
        journal = Journal(tmp_path / "journal.jsonl", {"model": "synthetic"}, resume=False)
        run_search(
            objective,
            SHAPE,
            SearchSettings(ratio=0.75, budget_per_layer=10),
            journal=journal,
            progress=False,
            racing=True,
        )
        fresh = ExampleObjective(seed=4)
        for record in journal.records:
            bits = tuple(tuple(int(c) for c in row) for row in record["key"].split("/"))
            assert record["score"] == fresh(HeadMask(bits, SHAPE.num_heads))
        assert journal.bounds and all(
            fresh(HeadMask(tuple(tuple(int(c) for c in row) for row in key.split("/")), SHAPE.num_heads)) <= bound
            for key, bound in journal.bounds.items()
        )

    def test_resume_from_a_journal_with_bounds(self, tmp_path) -> None:  # noqa: ANN001
        settings = SearchSettings(ratio=0.75, budget_per_layer=10)
        path = tmp_path / "journal.jsonl"
        first = resumed_search(path, ExampleObjective(), settings, resume=False)
        again = resumed_search(path, ExampleObjective(), settings, resume=True)
        assert again.mask.bits == first.mask.bits and again.score == first.score
        assert again.new_evaluations < first.new_evaluations

    def test_racing_needs_race_methods(self) -> None:
        with pytest.raises(TypeError, match="race"):
            run_search(lambda mask: 0.5, SHAPE, SearchSettings(ratio=0.5), progress=False, racing=True)


def resumed_search(path, objective: ExampleObjective, settings: SearchSettings, resume: bool = True):  # noqa: ANN001, ANN201
    """A racing search journaled at ``path``, given what the journal holds (as the search CLI does)."""
    journal = Journal(path, {"m": 1}, resume=resume)
    return run_search(
        objective, SHAPE, settings, resumed=Resumed.of(journal), journal=journal, progress=False, racing=True
    )


def journal_records(path) -> list[str]:  # noqa: ANN001
    """Every record of a journal, without its timings, as comparable strings."""
    records = [json.loads(line) for line in path.read_text().splitlines()[1:]]
    return [json.dumps({k: v for k, v in r.items() if k not in ("seconds", "wall_s")}, sort_keys=True) for r in records]


class TestResume:
    """A resumed search makes the decisions the original made, from the journal, and scores
    nothing the journal holds: no (mask, example) pair twice, whenever it was killed."""

    SETTINGS = SearchSettings(ratio=0.5, seed=5, budget_per_layer=10)

    @pytest.fixture(scope="class")
    @classmethod
    def uninterrupted(cls, tmp_path_factory) -> tuple:  # noqa: ANN001
        path = tmp_path_factory.mktemp("whole") / "journal.jsonl"
        objective = ExampleObjective(seed=5)
        result = resumed_search(path, objective, cls.SETTINGS, resume=False)
        return result, journal_records(path), objective.examples_scored

    def test_a_finished_search_resumed_scores_nothing_and_writes_nothing(self, uninterrupted, tmp_path) -> None:  # noqa: ANN001
        result, records, _ = uninterrupted
        path = tmp_path / "journal.jsonl"
        path.write_text("\n".join([json.dumps({"journal": "bosch-journal/1", "header": {"m": 1}}), *records]) + "\n")
        before = path.read_text()
        objective = ExampleObjective(seed=5)
        again = resumed_search(path, objective, self.SETTINGS)
        assert objective.examples_scored == 0 and again.new_evaluations == 0
        assert path.read_text() == before
        assert (again.mask.bits, again.score, again.pruned, again.evaluations) == (
            result.mask.bits, result.score, result.pruned, result.evaluations,
        )  # fmt: skip

    @pytest.mark.parametrize("kill_after", [1, 2, 3, 7, 19, 60])
    def test_killed_again_and_again_it_ends_with_the_uninterrupted_journal(
        self, uninterrupted, tmp_path, kill_after
    ) -> None:  # noqa: ANN001
        result, records, examples = uninterrupted
        path = tmp_path / "journal.jsonl"
        scored, runs, resume = 0, 0, False
        while True:
            objective = ExampleObjective(seed=5, kill_after=kill_after)
            runs += 1
            try:
                final = resumed_search(path, objective, self.SETTINGS, resume=resume)
                break
            except Killed:
                resume = True
            finally:
                scored += objective.examples_scored
        assert runs > 1
        resumed = journal_records(path)
        assert len(resumed) == len(set(resumed)) and sorted(resumed) == sorted(records)
        pairs = [
            (record["key"], record["task"], doc)
            for record in map(json.loads, resumed) if "values" in record
            for doc in record["values"]
        ]  # fmt: skip
        assert len(pairs) == len(set(pairs))  # no (mask, example) pair scored twice
        assert scored == examples
        assert (final.mask.bits, final.score) == (result.mask.bits, result.score)

    def test_a_resume_under_another_seed_scores_no_journaled_example_again(self, uninterrupted, tmp_path) -> None:  # noqa: ANN001
        _, records, _ = uninterrupted
        path = tmp_path / "journal.jsonl"
        path.write_text("\n".join([json.dumps({"journal": "bosch-journal/1", "header": {"m": 1}}), *records]) + "\n")
        other = SearchSettings(ratio=0.5, seed=6, budget_per_layer=10)
        fresh_fn, resumed_fn = ExampleObjective(seed=5), ExampleObjective(seed=5)
        fresh = run_search(fresh_fn, SHAPE, other, progress=False, racing=True)
        resumed = resumed_search(path, resumed_fn, other)
        assert (resumed.mask.bits, resumed.score) == (fresh.mask.bits, fresh.score)
        assert resumed_fn.examples_scored < fresh_fn.examples_scored
        pairs = [
            (record["key"], record["task"], doc)
            for record in map(json.loads, journal_records(path)) if "values" in record
            for doc in record["values"]
        ]  # fmt: skip
        assert len(pairs) == len(set(pairs))


class TestJournalBounds:
    def test_bounds_are_kept_apart_from_scores(self, tmp_path) -> None:  # noqa: ANN001
        path = tmp_path / "journal.jsonl"
        journal = Journal(path, {"m": 1}, resume=False)
        journal.append("1/0", 0.5, stage="stage1")
        journal.append_bound("0/1", 0.75, examples=16, stage="stage1")
        reopened = Journal(path, {"m": 1}, resume=True)
        assert reopened.records == [{"key": "1/0", "score": 0.5, "stage": "stage1"}]
        assert reopened.bounds == {"0/1": 0.75} and reopened.lookup("0/1") is None
        reopened.append("0/1", 0.25)  # a mask stopped early may be scored later
        assert Journal(path, {"m": 1}, resume=True).bounds == {}

    def test_a_damaged_bound_record_is_named(self, tmp_path) -> None:  # noqa: ANN001
        path = tmp_path / "journal.jsonl"
        Journal(path, {"m": 1}, resume=False).append("1/0", 0.5)
        with path.open("a") as handle:
            handle.write(json.dumps({"key": "0/1", "bound": 0.5}) + "\n")
            handle.write(json.dumps({"key": "1/1", "score": 0.5}) + "\n")
        with pytest.raises(JournalError, match="line 3: field 'examples'"):
            Journal(path, {"m": 1}, resume=True)


def test_race_bound_is_not_a_float() -> None:
    # A bound must never pass for a score anywhere a float is expected.
    assert not isinstance(RaceBound(0.5, 8), float)
