"""The BOSCH pipeline (stages 1–3, variants, journal/resume) on synthetic objectives with known optima."""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bosch_eval.masks import HeadMask, ModelShape, ceil_count
from bosch_eval.search.journal import Journal, mask_key
from bosch_eval.search.pipeline import SearchSettings, run_search
from bosch_eval.search.scoring import Anchors, SearchError, subproblem_loss

SHAPE = ModelShape(num_layers=4, num_heads=8, num_kv_heads=4)


class RetrievalObjective:
    """S(z) of a model whose long-range work is done by a planted set of KV groups.

    ``essential`` groups each carry one unit of score; a ``redundant`` pair carries one
    more unit that is lost only when BOTH are SWA (an interaction: each looks harmless
    alone, so a one-at-a-time static ranking converts both). The all-SWA model keeps a
    floor of 0.05 so that a < b.
    """

    def __init__(self, essential: set[tuple[int, int]], redundant: tuple[tuple[int, int], tuple[int, int]]) -> None:
        self.essential = essential
        self.redundant = redundant
        self.units = len(essential) + 1
        self.calls: list[str] = []

    def __call__(self, mask: HeadMask) -> float:
        key = mask_key(mask.bits)
        assert key not in self.calls, "a mask was evaluated twice"
        self.calls.append(key)
        return score_of(self, mask)


def planted() -> RetrievalObjective:
    # Layer 3 does most retrieval, layer 2 none; layers 1 and 0 share a redundant pair.
    essential = {(3, 0), (3, 1), (3, 2), (1, 0), (0, 3)}
    return RetrievalObjective(essential, redundant=((1, 3), (0, 0)))


def best_possible(objective: RetrievalObjective, swa_groups: int) -> float:
    """Brute force over every mask with exactly ``swa_groups`` SWA groups."""
    cells = [(layer, group) for layer in range(SHAPE.num_layers) for group in range(SHAPE.num_kv_heads)]
    return max(
        score_of(objective, HeadMask.from_swa_groups(SHAPE, set(swa))) for swa in itertools.combinations(cells, swa_groups)
    )


def static_ranking_mask(objective: RetrievalObjective, ratio: float) -> HeadMask:
    """The 'static' baseline: score each group alone, convert the ⌈ρN⌉ least harmful."""
    cells = [(layer, group) for layer in range(SHAPE.num_layers) for group in range(SHAPE.num_kv_heads)]
    scored = sorted((-score_of(objective, HeadMask.from_swa_groups(SHAPE, {cell})), cell) for cell in cells)
    return HeadMask.from_swa_groups(SHAPE, {cell for _, cell in scored[: ceil_count(ratio, len(cells))]})


def score_of(objective: RetrievalObjective, mask: HeadMask) -> float:
    kept = sum(mask.bits[layer][group] for layer, group in objective.essential)
    kept += any(mask.bits[layer][group] for layer, group in objective.redundant)
    return 0.05 + 0.95 * kept / objective.units


@pytest.mark.parametrize("ratio", [0.5, 0.625])
def test_bosch_reaches_planted_optimum_and_beats_static_ranking(ratio: float) -> None:
    objective = planted()
    result = run_search(objective, SHAPE, SearchSettings(ratio=ratio), progress=False)
    target = ceil_count(ratio, 16)
    assert result.mask.num_swa_groups == target  # Stage 2 met the budget exactly (quarter buckets, G = 4)
    optimum = best_possible(objective, target)
    assert result.score == pytest.approx(optimum)
    # The interaction fools the static ranking, not the search.
    assert score_of(objective, static_ranking_mask(objective, ratio)) < optimum
    assert result.evaluations == len(objective.calls)  # every distinct mask once
    json.dumps(result.provenance())  # goes into mask.json as is


def test_single_variant_is_stage_one_mask() -> None:
    objective = planted()
    result = run_search(objective, SHAPE, SearchSettings(ratio=0.5, variant="single"), progress=False)
    assert [row.count(0) for row in result.mask.bits] == [2, 2, 2, 2]  # ⌈ρG⌉ per layer
    assert result.stage2 is None and result.stage1_scores is not None
    full = run_search(planted(), SHAPE, SearchSettings(ratio=0.5), progress=False)
    assert full.score >= result.score


def test_layer_variant_converts_whole_layers() -> None:
    objective = planted()
    result = run_search(objective, SHAPE, SearchSettings(ratio=0.5, variant="layer"), progress=False)
    rows = result.mask.bits
    assert sum(row == (0,) * 4 for row in rows) == 2 and sum(row == (1,) * 4 for row in rows) == 2
    # Layer 2 (no essential group) is always among the SWA layers of the best layer-level mask.
    assert rows[2] == (0, 0, 0, 0)


def test_multi_variant_searches_layers_jointly() -> None:
    objective = planted()
    result = run_search(objective, SHAPE, SearchSettings(ratio=0.5, variant="multi", budget_per_layer=60), progress=False)
    assert result.mask.num_swa_groups == 8
    assert len(result.subproblems) == 1 and result.subproblems[0].variables == 16  # 50 // G = 12 ≥ L layers
    assert result.score >= 0.8 * best_possible(objective, 8)


def test_same_seed_same_mask_and_budget_respected() -> None:
    first = run_search(planted(), SHAPE, SearchSettings(ratio=0.5, budget_per_layer=4, seed=3), progress=False)
    second = run_search(planted(), SHAPE, SearchSettings(ratio=0.5, budget_per_layer=4, seed=3), progress=False)
    assert first.mask.bits == second.mask.bits and first.score == second.score
    for sub in first.subproblems:
        assert sub.evaluations <= 4 * len(sub.layers)


def test_anchor_error_when_calibration_cannot_rank() -> None:
    with pytest.raises(SearchError, match="cannot rank masks"):
        run_search(lambda mask: 0.0, SHAPE, SearchSettings(ratio=0.5), progress=False)


def test_loss_matches_equation_5() -> None:
    anchors = Anchors(all_swa=0.1, all_full=0.8, gamma=0.2)
    assert anchors.b == pytest.approx(0.96)
    assert anchors.normalize(0.1) == 0.0
    normalized = (0.5 - 0.1) / (0.96 - 0.1)
    assert subproblem_loss(anchors.normalize(0.5), 0.25, 0.5, alpha=100) == pytest.approx(-normalized + 100 * 0.0625)


def test_bad_settings_are_named() -> None:
    with pytest.raises(SearchError, match="variant"):
        SearchSettings(ratio=0.5, variant="fast")
    with pytest.raises(SearchError, match="optimizer"):
        SearchSettings(ratio=0.5, optimizer="cma")
    with pytest.raises(ValueError, match="ratio"):
        SearchSettings(ratio=1.5)


class Interrupt(Exception):
    pass


def test_resume_after_interruption_reevaluates_nothing(tmp_path: Path) -> None:
    settings = SearchSettings(ratio=0.5)
    reference = run_search(planted(), SHAPE, settings, progress=False)

    header = {"test": "resume", "settings": settings.to_json()}
    path = tmp_path / "journal.jsonl"
    objective = planted()

    def dies_after_twenty(mask: HeadMask) -> float:
        if len(objective.calls) == 20:
            raise Interrupt
        return objective(mask)

    with pytest.raises(Interrupt):
        run_search(dies_after_twenty, SHAPE, settings, journal=Journal(path, header, resume=False), progress=False)
    journal = Journal(path, header, resume=True)
    assert len(journal) == 20
    known = {record["key"]: record["score"] for record in journal.records}
    resumed_objective = planted()
    resumed = run_search(resumed_objective, SHAPE, settings, known=known, journal=journal, progress=False)
    assert resumed.mask.bits == reference.mask.bits
    assert not set(resumed_objective.calls) & set(known)  # nothing journaled was evaluated again
    keys = [record["key"] for record in Journal(path, header, resume=True).records]
    assert len(keys) == len(set(keys)) == reference.evaluations


SEARCH_SCRIPT = """
import sys, time
sys.path.insert(0, {tests!r})
from test_search_pipeline import SHAPE, planted
from bosch_eval.search.journal import Journal
from bosch_eval.search.pipeline import SearchSettings, run_search
settings = SearchSettings(ratio=0.5)
journal = Journal({path!r}, {{"test": "sigkill"}}, resume=True)
known = {{record["key"]: record["score"] for record in journal.records}}
objective = planted()
def slow(mask):
    time.sleep({delay})
    return objective(mask)
result = run_search(slow, SHAPE, settings, known=known, journal=journal, progress=False)
print("MASK", [list(row) for row in result.mask.bits])
"""


def test_sigkill_midway_then_resume_gives_the_uninterrupted_mask(tmp_path: Path) -> None:
    reference = run_search(planted(), SHAPE, SearchSettings(ratio=0.5), progress=False)
    path = tmp_path / "journal.jsonl"
    tests_dir = str(Path(__file__).parent)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    script = SEARCH_SCRIPT.format(tests=tests_dir, path=str(path), delay=0.05)
    child = subprocess.Popen([sys.executable, "-c", script], env=env, stdout=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and (not path.exists() or len(path.read_text().splitlines()) < 15):
        time.sleep(0.02)
    child.send_signal(signal.SIGKILL)
    child.wait()
    done = len(path.read_text().splitlines()) - 1  # minus the header line
    assert 14 <= done < reference.evaluations, "the kill must land midway"
    finish = subprocess.run(
        [sys.executable, "-c", SEARCH_SCRIPT.format(tests=tests_dir, path=str(path), delay=0.0)],
        env=env, capture_output=True, text=True, check=True,
    )  # fmt: skip
    mask = json.loads(finish.stdout.split("MASK", 1)[1])
    assert tuple(map(tuple, mask)) == reference.mask.bits
    keys = [json.loads(line)["key"] for line in path.read_text().splitlines()[1:]]
    assert len(keys) == len(set(keys)) == reference.evaluations
