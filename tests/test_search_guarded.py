"""The ``guarded`` variant (issue 53): incumbents scored first, a whole-model local search after
Stage 3, never a result below the best incumbent; and Stage 1 by one-layer probes when ⌈ρG⌉ = G."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from bosch_eval.masks.head_mask import HeadMask, ModelShape, ceil_count
from bosch_eval.masks.layer_heuristics import layer_heuristic_mask
from bosch_eval.runtime.errors import SearchError
from bosch_eval.search.journal.store import Journal, mask_key
from bosch_eval.search.objective.racing import RaceBound
from bosch_eval.search.objective.scoring import ScoreScale
from bosch_eval.search.run.pipeline import Resumed, SearchSettings, run_search, validate_for_shape
from bosch_eval.search.run.report import render_report
from bosch_eval.search.stages.stage2 import assign_layer_ratios, cumulative_from_probes
from bosch_eval.tasks.niah.tiebreak import tiebreak_weight
from tests.helpers import SHAPE, ExampleObjective, Killed, planted, score_of


def random_key(shape: ModelShape, swa: int, seed: int) -> str:
    cells = [(layer, group) for layer in range(shape.num_layers) for group in range(shape.num_kv_heads)]
    return mask_key(HeadMask.from_swa_groups(shape, set(random.Random(seed).sample(cells, swa))).bits)


class Needle:
    """``planted()``'s S scaled to at most 0.8, except one mask, which scores 1: the optimum
    is an isolated mask no stage and no local search step is led to."""

    def __init__(self, optimum: str) -> None:
        self.optimum = optimum
        self.base = planted()
        self.calls: list[str] = []

    def __call__(self, mask: HeadMask) -> float:
        key = mask_key(mask.bits)
        assert key not in self.calls, "a mask was evaluated twice"
        self.calls.append(key)
        return 1.0 if key == self.optimum else 0.8 * score_of(self.base, mask)


def test_an_incumbent_that_is_the_optimum_is_returned() -> None:
    optimum = random_key(SHAPE, 8, seed=11)
    objective = Needle(optimum)
    settings = SearchSettings(ratio=0.5, incumbents=(("planted", optimum),))
    result = run_search(objective, SHAPE, settings, progress=False)
    guard = result.guard
    assert mask_key(result.mask.bits) == optimum and result.score == 1.0
    assert guard is not None and guard.best == "planted" and guard.source == "incumbent planted"
    assert guard.stages_score < 1.0 and guard.gain(result.score) == 0.0
    assert result.evaluations == len(objective.calls)  # every distinct mask once, incumbents included


def test_the_stages_mask_is_returned_where_it_beats_every_incumbent() -> None:
    objective = planted()
    weak = mask_key(
        HeadMask.from_swa_groups(SHAPE, {(3, 0), (3, 1), (3, 2), (1, 0), (0, 3), (0, 0), (1, 3), (2, 0)}).bits
    )
    result = run_search(
        objective, SHAPE, SearchSettings(ratio=0.5, incumbents=(("weak", weak),), local_calls=0), progress=False
    )
    guard = result.guard
    assert guard is not None and guard.source == "the stages" and mask_key(result.mask.bits) == guard.stages_key
    assert result.score == guard.stages_score == pytest.approx(1.0)  # planted()'s optimum at 8 SWA groups
    assert guard.gain(result.score) > 0 and guard.scores[weak] == score_of(
        objective, HeadMask.from_rows([[int(c) for c in row] for row in weak.split("/")], 8)
    )
    # Each layer heuristic is scored and named.
    names = set(guard.incumbents)
    assert names == {"weak", "intr", "bme", "rand:0"}
    assert guard.incumbents["bme"] == mask_key(layer_heuristic_mask("bme", SHAPE, 0.5).bits)


class Additive:
    """S = 1 − the weight of the SWA groups (weights drawn per group): the best mask with k SWA
    groups holds the k lightest, wherever they are, which Stage 2's per-layer quotas miss."""

    def __init__(self, shape: ModelShape, seed: int) -> None:
        rng = random.Random(seed)
        self.weights = [[rng.random() ** 3 for _ in range(shape.num_kv_heads)] for _ in range(shape.num_layers)]
        self.total = sum(map(sum, self.weights))

    def __call__(self, mask: HeadMask) -> float:
        lost = sum(
            w
            for row, bits in zip(self.weights, mask.bits, strict=True)
            for w, bit in zip(row, bits, strict=True)
            if not bit
        )
        return 1.0 - lost / self.total

    def best(self, swa: int) -> float:
        return 1.0 - sum(sorted(w for row in self.weights for w in row)[:swa]) / self.total


def test_the_local_search_returns_what_it_finds_better_than_the_stages_and_the_incumbents() -> None:
    objective = Additive(SHAPE, seed=3)
    settings = SearchSettings(ratio=0.5, budget_per_layer=2, local_calls=200)
    result = run_search(objective, SHAPE, settings, progress=False)
    guard = result.guard
    assert guard is not None and guard.source.startswith("the local search from")
    assert result.score > max(guard.stages_score, guard.best_score)
    assert result.score == pytest.approx(objective.best(8))  # the 8 lightest groups, across layers
    assert result.mask.num_swa_groups == 8


@pytest.mark.parametrize("local_calls", [0, 10])
def test_never_below_stage_1s_own_mask(local_calls: int) -> None:
    # Seed 2: the paper's Stage 2 gives layers 0 and 3 more SWA groups than Stage 1 measured, and
    # the stages' mask scores below Stage 1's, which has as many SWA groups (2 of 4 in each layer).
    settings = SearchSettings(ratio=0.5, seed=2, budget_per_layer=6, local_calls=local_calls)
    result = run_search(ExampleObjective(seed=2), SHAPE, settings, progress=False)
    guard = result.guard
    assert guard is not None and result.stage1_scores is not None
    assert guard.stages_score < result.stage1_scores[0] <= result.score
    assert guard.lineages[0].origin == "Stage 1's mask" and guard.source.endswith("Stage 1's mask")
    assert result.mask.num_swa_groups == 8


@pytest.mark.parametrize("seed", range(6))
def test_never_below_any_incumbent(seed: int) -> None:
    given = tuple((f"random{i}", random_key(SHAPE, 8, seed=100 * seed + i)) for i in range(4))
    settings = SearchSettings(ratio=0.5, seed=seed, budget_per_layer=3, local_calls=10, incumbents=given)
    for racing in (False, True):
        objective = ExampleObjective(seed=seed)
        result = run_search(objective, SHAPE, settings, progress=False, racing=racing)
        guard = result.guard
        assert guard is not None
        exact = [score for score in guard.scores.values() if not isinstance(score, RaceBound)]
        assert result.score >= max(exact) and result.score >= guard.stages_score
        assert (
            result.stage1_scores is not None and result.score >= result.stage1_scores[0]
        )  # 2 of 4 per layer: the ratio
        # A raced incumbent stops only below the best one.
        assert all(bound.score <= guard.best_score for bound in guard.scores.values() if isinstance(bound, RaceBound))
        assert result.score == ExampleObjective(seed=seed)(result.mask)


class SaturatedAccuracy:
    """Issue 67's failure, planted: ``planted()``'s S as an accuracy that many masks reach (1.000
    for every mask keeping the essential groups, the stages' and the favourite's among them) and,
    under ``acc_tiebreak``, the answers' probability on ties, highest for one mask (the favourite,
    the held-out test's best in the study). (1 − ε)·acc + ε·p, ε as the calibration tasks weigh it."""

    def __init__(self, favourite: str, tiebreak: bool) -> None:
        self.base, self.favourite, self.tiebreak = planted(), favourite, tiebreak
        self.weight = tiebreak_weight(self.base.units)

    def __call__(self, mask: HeadMask) -> float:
        acc = score_of(self.base, mask)
        if not self.tiebreak:
            return acc
        key = mask_key(mask.bits)
        prob = 1.0 if key == self.favourite else random.Random(key).uniform(0.0, 0.9)
        return (1 - self.weight) * acc + self.weight * prob


def test_the_tie_break_metric_returns_the_incumbent_that_accuracy_ties_with_the_stages() -> None:
    full = {(3, 0), (3, 1), (3, 2), (1, 0), (0, 3), (1, 3), (2, 0), (2, 1)}  # the essential groups and three more
    cells = {(layer, group) for layer in range(SHAPE.num_layers) for group in range(SHAPE.num_kv_heads)}
    favourite = mask_key(HeadMask.from_swa_groups(SHAPE, cells - full).bits)
    settings = SearchSettings(ratio=0.5, incumbents=(("razor", favourite),), local_calls=20)
    tied = run_search(SaturatedAccuracy(favourite, tiebreak=False), SHAPE, settings, progress=False)
    assert tied.guard is not None and tied.score == pytest.approx(1.0) == tied.guard.scores[favourite]
    assert mask_key(tied.mask.bits) != favourite  # accuracy ties them, and on equal S the stages' side wins
    ordered = run_search(SaturatedAccuracy(favourite, tiebreak=True), SHAPE, settings, progress=False)
    guard = ordered.guard
    assert guard is not None and mask_key(ordered.mask.bits) == favourite and guard.source == "incumbent razor"
    assert (
        ordered.score == pytest.approx(1.0) and ordered.score > guard.stages_score
    )  # only the favourite is sure of every answer
    exact = [score for score in guard.scores.values() if not isinstance(score, RaceBound)]
    assert ordered.score >= max(exact)  # S(search) >= S(every incumbent), under the new objective


def test_racing_returns_the_unraced_mask() -> None:
    settings = SearchSettings(ratio=0.75, seed=2, budget_per_layer=10, local_calls=30)
    plain = run_search(ExampleObjective(seed=2), SHAPE, settings, progress=False)
    raced_fn = ExampleObjective(seed=2)
    raced = run_search(raced_fn, SHAPE, settings, progress=False, racing=True)
    assert raced.mask.bits == plain.mask.bits and raced.score == plain.score
    assert raced.guard is not None and plain.guard is not None and raced.guard.best == plain.guard.best
    assert raced.pruned > 0


@pytest.mark.parametrize("variant", ["guarded", "bosch"])
def test_the_best_possible_score_ends_each_sub_problem_with_the_same_mask(variant: str) -> None:
    # planted() scores its best wherever the essential groups and one of the pair stay full: at
    # ρ = 0.5 many masks do, as on a saturated calibration set.
    best = score_of(planted(), HeadMask.uniform(SHAPE, full=True))
    settings = SearchSettings(ratio=0.5, variant=variant, local_calls=40 if variant == "guarded" else 0)
    whole, stopped = planted(), planted()
    reference = run_search(whole, SHAPE, settings, progress=False)
    result = run_search(stopped, SHAPE, settings, progress=False, scale=ScoreScale(best_possible=best))
    assert reference.score == result.score == best
    assert result.mask.bits == reference.mask.bits and result.guard == reference.guard
    assert set(stopped.calls) < set(whole.calls)
    assert "A sub-problem ends at its first mask with S = 1.0000" in render_report(
        result, "synthetic", 8, {"tasks": ["t"]}
    )
    if variant == "guarded":  # the local search from the stages' mask, at the best S already, asks nothing
        assert result.guard.lineages[0].origin == "the stages" and result.guard.stages_score == best
        assert result.costs["local"]["calls"] <= 20 < reference.costs["local"]["calls"] == 40


class Interrupt(Exception):
    pass


@pytest.mark.parametrize("die_after", [4, 30, 60])  # while scoring the incumbents, in the stages, in the local search
def test_a_killed_search_resumes_to_the_same_mask_evaluating_nothing_twice(tmp_path: Path, die_after: int) -> None:
    settings = SearchSettings(ratio=0.5, local_calls=40)
    reference = run_search(planted(), SHAPE, settings, progress=False)
    assert reference.evaluations > 60
    path, header = tmp_path / "journal.jsonl", {"test": "guarded"}
    objective = planted()

    def dies(mask: HeadMask) -> float:
        if len(objective.calls) == die_after:
            raise Interrupt
        return objective(mask)

    with pytest.raises(Interrupt):
        run_search(dies, SHAPE, settings, journal=Journal(path, header, resume=False), progress=False)
    journal = Journal(path, header, resume=True)
    again = planted()
    resumed = run_search(again, SHAPE, settings, resumed=Resumed.of(journal), journal=journal, progress=False)
    assert resumed.mask.bits == reference.mask.bits and resumed.guard == reference.guard
    assert not set(again.calls) & set(objective.calls)
    keys = [record["key"] for record in Journal(path, header, resume=True).records]
    assert len(keys) == len(set(keys)) == reference.evaluations
    assert {record["stage"] for record in journal.records} >= {"incumbent", "stage1", "stage3"}


def test_a_killed_racing_search_resumes_to_the_same_mask(tmp_path: Path) -> None:
    settings = SearchSettings(ratio=0.5, seed=1, budget_per_layer=6, local_calls=20)
    reference = run_search(ExampleObjective(seed=1), SHAPE, settings, progress=False, racing=True)
    path = tmp_path / "journal.jsonl"
    for kill_after in (3, 25):
        journal = Journal(path, {"m": 1}, resume=path.exists())
        with pytest.raises(Killed):
            run_search(ExampleObjective(seed=1, kill_after=kill_after), SHAPE, settings, resumed=Resumed.of(journal),
                       journal=journal, progress=False, racing=True)  # fmt: skip
    journal = Journal(path, {"m": 1}, resume=True)
    resumed = run_search(
        ExampleObjective(seed=1),
        SHAPE,
        settings,
        resumed=Resumed.of(journal),
        journal=journal,
        progress=False,
        racing=True,
    )
    assert (
        resumed.mask.bits == reference.mask.bits
        and resumed.score == reference.score
        and resumed.guard == reference.guard
    )


def test_the_report_names_the_incumbent_the_gain_and_the_stages_alone() -> None:
    result = run_search(planted(), SHAPE, SearchSettings(ratio=0.5, local_calls=4), progress=False)
    report = render_report(result, "synthetic", 8, {"tasks": ["t"]})
    guard = result.guard
    assert guard is not None
    assert "## Incumbents" in report and f"| {guard.best} (the best) |" in report
    assert guard.message() in report
    provenance = result.provenance()["guard"]
    assert provenance["best_incumbent"] == guard.best and provenance["gain"] == guard.gain(result.score)
    assert provenance["stages_score"] == guard.stages_score


def test_bad_incumbents_are_named() -> None:
    with pytest.raises(SearchError, match=r"^incumbents: scored only by variant 'guarded', got variant 'bosch'$"):
        SearchSettings(ratio=0.5, variant="bosch", incumbents=(("a", "1111/0000/1111/0000"),))
    with pytest.raises(SearchError, match=r"^incumbents: expected distinct names, got \['a', 'a'\]$"):
        SearchSettings(ratio=0.5, incumbents=(("a", "1111/0000/1111/0000"), ("a", "0000/1111/1111/0000")))
    with pytest.raises(SearchError, match=r"^local_calls: expected an integer >= 0"):
        SearchSettings(ratio=0.5, local_calls=-1)
    with pytest.raises(SearchError, match=r"^incumbents: a: expected a mask key of 4 rows of 4 digits 0/1"):
        validate_for_shape(SearchSettings(ratio=0.5, incumbents=(("a", "111/000"),)), SHAPE)
    with pytest.raises(
        SearchError, match=r"^incumbents: a has 4 SWA groups, expected at least 8 \(⌈ρ·L·G⌉ at ratio 0.5\)$"
    ):
        validate_for_shape(SearchSettings(ratio=0.5, incumbents=(("a", "1111/0000/1111/1111"),)), SHAPE)


# -- Stage 1 by one-layer probes when ⌈ρG⌉ = G --------------------------------------------------------

THREE = ModelShape(num_layers=6, num_heads=6, num_kv_heads=3)  # SmolLM2's G = 3


class LayerUse:
    """S falls with the SWA groups of each layer, by a weight per layer; the floor (0.1) is
    reached once the top two layers are SWA, as SmolLM2's Stage 1 reached it at layer 18."""

    WEIGHTS = [0.3, 0.05, 0.2, 0.1, 0.5, 0.45]

    def __init__(self) -> None:
        self.calls: list[str] = []

    def __call__(self, mask: HeadMask) -> float:
        self.calls.append(mask_key(mask.bits))
        lost = sum(w * row.count(0) / len(row) for w, row in zip(self.WEIGHTS, mask.bits, strict=True))
        return max(0.1, 1.0 - lost)


def test_stage1_probes_each_layer_alone_when_every_group_turns_swa() -> None:
    objective = LayerUse()
    result = run_search(objective, THREE, SearchSettings(ratio=0.75, local_calls=0), progress=False)
    assert result.stage1_probes
    stage1 = [sub for sub in result.subproblems if sub.stage == "stage1"]
    assert [sub.layers for sub in stage1] == [(layer,) for layer in range(5, -1, -1)] and all(
        sub.evaluations == 1 for sub in stage1
    )
    assert result.stage1_scores == pytest.approx([1.0 - w for w in LayerUse.WEIGHTS])
    # Stage 2 allocates from each layer's own drop: the least used layers get the most SWA groups.
    assert result.stage2 is not None and list(result.stage2.drops) == pytest.approx(LayerUse.WEIGHTS)
    ratios = result.stage2.ratios
    assert ratios[1] == max(ratios) and ratios[4] == min(ratios)


def test_the_paper_stage1_reaches_the_floor_and_sees_no_drop_below_it() -> None:
    result = run_search(LayerUse(), THREE, SearchSettings(ratio=0.75, variant="bosch"), progress=False)
    assert not result.stage1_probes and result.stage2 is not None
    assert result.stage2.drops[:4] == (0.0, 0.0, 0.0, 0.0)  # below layer 4 the cumulative pass sits at the floor


def test_probe_scores_give_stage2_their_own_drops() -> None:
    probes, full = [0.9, 0.5, 1.0, 0.7], 1.0
    stage2 = assign_layer_ratios(cumulative_from_probes(probes, full), full, 0.5, 4)
    assert list(stage2.drops) == pytest.approx([0.1, 0.5, 0.0, 0.3])


def test_stage1_is_algorithm_1_where_a_layer_keeps_a_full_group() -> None:
    """G = 8 at ρ = 0.75: ⌈6⌉ = 6 of 8 groups per layer, the cumulative pass of the paper."""
    eight = ModelShape(num_layers=3, num_heads=8, num_kv_heads=8)
    settings = {"ratio": 0.75, "budget_per_layer": 12, "local_calls": 0}
    guarded = run_search(ExampleObjectiveOn(eight), eight, SearchSettings(**settings), progress=False)
    paper = run_search(ExampleObjectiveOn(eight), eight, SearchSettings(variant="bosch", **settings), progress=False)
    assert not guarded.stage1_probes
    assert guarded.stage1_scores == paper.stage1_scores and guarded.stage2 == paper.stage2
    stage1 = [sub for sub in guarded.subproblems if sub.stage == "stage1"]
    assert stage1 == [sub for sub in paper.subproblems if sub.stage == "stage1"]


class ExampleObjectiveOn:
    """A deterministic S on any shape: how many of a fixed random set of groups stay full."""

    def __init__(self, shape: ModelShape) -> None:
        cells = [(layer, group) for layer in range(shape.num_layers) for group in range(shape.num_kv_heads)]
        self.needed = random.Random(7).sample(cells, ceil_count(0.5, len(cells)))

    def __call__(self, mask: HeadMask) -> float:
        return 0.05 + 0.95 * sum(mask.bits[layer][group] for layer, group in self.needed) / len(self.needed)
