"""``--tie-break-tasks``: the masks the calibration ties with the found one, ordered by other
tasks. The choice is checked on a planted objective whose tie-break optimum is known; the
file that makes it resumable, and the command line end to end on a tiny checkpoint."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from bosch_eval.cli import main
from bosch_eval.masks.head_mask import HeadMask, ModelShape
from bosch_eval.runtime.errors import SearchError
from bosch_eval.search.journal.store import mask_key, read_records
from bosch_eval.search.objective.racing import RaceBound
from bosch_eval.search.run.pipeline import SearchSettings, run_search
from bosch_eval.search.check.saturation import search_ties
from bosch_eval.search.objective.tie_break import (
    TIE_BREAK_FILE,
    TieBreak,
    TieBreakFile,
    best_key,
    break_ties,
    layer_computations,
    shared_rows_layer,
    tie_key_bits,
)
from tests.helpers import DOT_TASK, search_args, write_tasks

SHAPE = ModelShape(num_layers=4, num_heads=3, num_kv_heads=3)


def saturated(mask: HeadMask) -> float:
    """S drops by 0.25 per layer with all three groups SWA; two of three lose nothing, so many masks tie."""
    return 1.0 - 0.25 * sum(row.count(0) == 3 for row in mask.bits)


def prefers_high_groups(mask: HeadMask) -> float:
    """A second task with one best mask among any set: full groups weigh 2^(layer·G + group)."""
    return sum(
        2.0 ** (layer * 3 + group) for layer, row in enumerate(mask.bits) for group, bit in enumerate(row) if bit
    )


def test_the_tie_break_returns_the_tied_mask_the_second_task_scores_best():
    asked: dict[str, float] = {}

    def score(mask: HeadMask) -> float:
        asked[mask_key(mask.bits)] = saturated(mask)
        return asked[mask_key(mask.bits)]

    result = run_search(
        score, SHAPE, SearchSettings(ratio=0.5, budget_per_layer=8, buckets=(0.0, 2 / 3)), progress=False
    )
    found = mask_key(result.mask.bits)
    assert result.ties is not None and result.ties.scored > 1
    tied = {key for key, s in asked.items() if s == result.score and key.count("0") == found.count("0")}
    assert set(result.ties.keys) == tied - {found}

    calls: list[str] = []
    written: list[tuple[str, float]] = []

    def second(mask: HeadMask) -> float:
        calls.append(mask_key(mask.bits))
        return prefers_high_groups(mask)

    candidates = (found, *result.ties.keys)
    known = {result.ties.keys[0]: prefers_high_groups(HeadMask(tie_key_bits(result.ties.keys[0]), 3))}
    scores = break_ties(candidates, second, 3, known, on_score=lambda key, s: written.append((key, s)))
    assert list(scores) == list(candidates) and calls == [key for key in candidates if key not in known]
    assert written == [(key, scores[key]) for key in calls]
    chosen = best_key(scores)
    assert chosen == max(tied, key=lambda key: prefers_high_groups(HeadMask(tie_key_bits(key), 3)))
    assert saturated(HeadMask(tie_key_bits(chosen), 3)) == result.score and chosen.count("0") == found.count("0")


class ExactRacer:
    """A score function that races as the objective does: the full score while it can still win,
    else a bound (here the score itself, reached after one example)."""

    def __init__(self, score) -> None:
        self.score, self.calls, self.raced = score, 0, 0

    def __call__(self, mask: HeadMask) -> float:
        self.calls += 1
        return self.score(mask)

    def race(self, mask: HeadMask, can_win) -> float | RaceBound:
        self.raced += 1
        value = self.score(mask)
        return value if can_win(value) else RaceBound(value, 1)


@pytest.mark.parametrize("higher_is_better", [True, False])
def test_racing_the_candidates_returns_the_unraced_choice(higher_is_better: bool):
    keys = ["110/011", "101/110", "011/101", "111/000", "000/111", "100/011"]
    # two candidates share the best value: the earlier one must win, raced or not
    score = lambda mask: [0.5, 0.25, 0.75, 0.75, 0.125, 0.5][keys.index(mask_key(mask.bits))]  # noqa: E731
    if not higher_is_better:
        score = lambda mask, plain=score: 1.0 - plain(mask)  # noqa: E731
    plain = break_ties(keys, score, 3, {}, higher_is_better=higher_is_better)
    racer = ExactRacer(score)
    raced = break_ties(keys, racer, 3, {}, race=True, higher_is_better=higher_is_better)
    assert best_key(raced, higher_is_better) == best_key(plain, higher_is_better) == "011/101"
    assert racer.calls == 0 and racer.raced == 6  # the first too, on the same chunks: nothing to beat, so to the end
    stopped = [key for key, value in raced.items() if isinstance(value, RaceBound)]
    assert stopped == ["101/110", "111/000", "000/111", "100/011"]  # a tie cannot win: the earlier mask stays
    assert all(raced[key] == plain[key] for key in keys if key not in stopped)
    again = break_ties(keys, ExactRacer(score), 3, raced, race=True, higher_is_better=higher_is_better)
    assert again == raced


def test_the_found_mask_wins_a_second_tie_and_lower_can_be_better():
    assert best_key({"11/00": 0.5, "00/11": 0.5, "10/01": 0.25}) == "11/00"
    assert best_key({"11/00": 0.5, "00/11": 0.5, "10/01": 0.25}, higher_is_better=False) == "10/01"
    tie_break = TieBreak(("second",), {"11/00": 0.5, "00/11": 0.75}, "00/11")
    assert tie_break.found == "11/00" and tie_break.to_json() == {
        "tasks": ["second"], "candidates": 2, "stopped_early": 0, "found_mask": "11/00", "found_score": 0.5, "chosen_score": 0.75,
        "file": TIE_BREAK_FILE,
    }  # fmt: skip
    assert (
        tie_break.message()
        == "another of the 2 masks at the search's S is returned: 0.7500 against the found mask's 0.5000"
    )
    assert tie_key_bits("110/001") == ((1, 1, 0), (0, 0, 1)) and mask_key(tie_key_bits("110/001")) == "110/001"


class TestSharedRowsLayer:
    """Where the prefix cache should start each candidate: the fewest layer computations."""

    def test_candidates_that_share_low_rows_in_runs_start_above_them(self):
        # 6 layers; rows 0 take two values in two runs, rows 4-5 vary, rows 1-3 are shared.
        low = ["011/111/011/101/", "110/111/011/101/"]
        tops = ["011/110", "101/110", "110/011"]
        candidates = [low[0] + tops[0], *(low[0] + t for t in tops[1:]), *(low[1] + t for t in tops)]
        assert shared_rows_layer(candidates) == 4
        assert layer_computations(candidates, 4) == 2 * 4 + 6 * 2 and layer_computations(candidates, None) == 6 * 6

    def test_no_layer_is_saved_when_every_candidate_has_its_own_low_rows(self):
        assert shared_rows_layer(["011/111", "101/111", "110/111"]) is None

    def test_one_candidate_or_none_saves_nothing(self):
        assert shared_rows_layer(["011/111"]) is None
        assert shared_rows_layer([]) is None

    def test_rows_shared_only_across_a_gap_are_not_counted_as_one_run(self):
        # A B A B: four runs below layer 1, so starting there saves nothing (4·1 + 4·1 = 8 = 4·2).
        assert shared_rows_layer(["011/011", "101/011", "011/101", "101/101"]) is None


class TestTieBreakFile:
    def test_scores_are_kept_and_read_back(self, tmp_path: Path):
        record = TieBreakFile(tmp_path, {"tasks": ["second"]}, write=True)
        record.append("11/00", 0.5)
        record.append("00/11", 0.75)
        assert TieBreakFile(tmp_path, {"tasks": ["second"]}, write=True).scores == {"11/00": 0.5, "00/11": 0.75}

    def test_bounds_of_masks_racing_stopped_are_kept_too(self, tmp_path: Path):
        record = TieBreakFile(tmp_path, {"tasks": ["second"]}, write=True)
        record.append("11/00", 0.5)
        record.append("00/11", RaceBound(0.25, 16))
        assert TieBreakFile(tmp_path, {"tasks": ["second"]}, write=True).scores == {
            "11/00": 0.5,
            "00/11": RaceBound(0.25, 16),
        }

    def test_a_header_cut_short_by_a_kill_is_written_again(self, tmp_path: Path):
        (tmp_path / TIE_BREAK_FILE).write_text('{"format": "bosch-tie')
        record = TieBreakFile(tmp_path, {"tasks": ["second"]}, write=True)
        record.append("11/00", 0.5)
        assert TieBreakFile(tmp_path, {"tasks": ["second"]}, write=True).scores == {"11/00": 0.5}

    def test_a_file_made_under_another_objective_is_refused_naming_it(self, tmp_path: Path):
        TieBreakFile(tmp_path, {"tasks": ["second"]}, write=True).append("11/00", 0.5)
        with pytest.raises(
            SearchError, match=rf"{TIE_BREAK_FILE}: its tie-break scores were made under other settings"
        ):
            TieBreakFile(tmp_path, {"tasks": ["third"]}, write=True)

    def test_a_line_cut_short_by_a_kill_is_dropped_and_the_file_goes_on(self, tmp_path: Path):
        record = TieBreakFile(tmp_path, {"tasks": ["second"]}, write=True)
        record.append("11/00", 0.5)
        with (tmp_path / TIE_BREAK_FILE).open("a") as handle:
            handle.write('{"key": "00/1')
        again = TieBreakFile(tmp_path, {"tasks": ["second"]}, write=True)
        assert again.scores == {"11/00": 0.5}
        again.append("00/11", 0.75)
        assert TieBreakFile(tmp_path, {"tasks": ["second"]}, write=True).scores == {"11/00": 0.5, "00/11": 0.75}

    def test_a_broken_line_before_the_last_is_an_error(self, tmp_path: Path):
        TieBreakFile(tmp_path, {"tasks": ["second"]}, write=True).append("11/00", 0.5)
        path = tmp_path / TIE_BREAK_FILE
        path.write_text(path.read_text() + "not json\n" + json.dumps({"key": "00/11", "score": 0.75}) + "\n")
        with pytest.raises(SearchError, match=rf"{TIE_BREAK_FILE}, line 3: expected"):
            TieBreakFile(tmp_path, {"tasks": ["second"]}, write=True)

    def test_only_the_main_process_writes(self, tmp_path: Path):
        record = TieBreakFile(tmp_path, {"tasks": ["second"]}, write=False)
        record.append("11/00", 0.5)
        assert not (tmp_path / TIE_BREAK_FILE).exists()


@pytest.mark.slow  # a search on a tiny checkpoint (~20 s)
def test_a_finished_search_resumed_with_tie_break_tasks_scores_only_its_candidates(
    tiny_model_dir: Path, tmp_path: Path
):
    """The tiny model's perplexities never tie, so the only candidate is the found mask: it is
    scored once on the second task, recorded in mask.json, report.md and tiebreak.jsonl, and a
    second resume scores nothing."""
    task_dir = write_tasks(tmp_path / "tasks")
    out = tmp_path / "run"
    assert main(search_args(tiny_model_dir, task_dir, out)) == 0
    found = HeadMask.load(out / "mask.json").bits
    journal = (out / "journal.jsonl").read_text()
    assert main(search_args(tiny_model_dir, task_dir, out, "--resume", "--tie-break-tasks", DOT_TASK)) == 0
    assert (out / "journal.jsonl").read_text() == journal  # the search itself scored nothing
    lines = (out / TIE_BREAK_FILE).read_text().splitlines()
    header, records = json.loads(lines[0])["header"], [json.loads(line) for line in lines[1:]]
    assert header["objective"]["tasks"] == [DOT_TASK] and [r["key"] for r in records] == [mask_key(found)]
    provenance = json.loads((out / "mask.json").read_text())["provenance"]
    assert provenance["tie_break"] == {
        "tasks": [DOT_TASK], "candidates": 1, "stopped_early": 0, "found_mask": mask_key(found), "found_score": records[0]["score"],
        "chosen_score": records[0]["score"], "file": TIE_BREAK_FILE,
    }  # fmt: skip
    assert HeadMask.load(out / "mask.json").bits == found
    assert f"| tie-break on {DOT_TASK} ({TIE_BREAK_FILE}) | the found mask stays" in (out / "report.md").read_text()
    kept = (out / TIE_BREAK_FILE).read_text()
    assert main(search_args(tiny_model_dir, task_dir, out, "--resume", "--tie-break-tasks", DOT_TASK)) == 0
    assert (out / TIE_BREAK_FILE).read_text() == kept


@pytest.mark.slow  # loads a tiny checkpoint (~10 s)
def test_an_unknown_tie_break_task_fails_before_the_search_scores_anything(
    tiny_model_dir: Path, tmp_path: Path, capsys
):
    task_dir = write_tasks(tmp_path / "tasks")
    out = tmp_path / "run"
    assert main(search_args(tiny_model_dir, task_dir, out, "--tie-break-tasks", "no_such_task")) != 0
    assert "tasks: ['no_such_task'] are not lm-eval tasks" in capsys.readouterr().err
    journal = out / "journal.jsonl"
    assert not journal.exists() or not [line for line in journal.read_text().splitlines() if '"key"' in line]


def test_a_ratio_with_one_mask_refuses_a_tie_break_before_the_model_loads(tiny_model_dir: Path, tmp_path: Path, capsys):
    task_dir = write_tasks(tmp_path / "tasks")
    args = search_args(tiny_model_dir, task_dir, tmp_path / "run", "--tie-break-tasks", DOT_TASK)
    args[args.index("--ratio") + 1] = "1"
    assert main(args) != 0
    assert "--tie-break-tasks: ratio 1 allows one mask, so there are no ties to break" in capsys.readouterr().err
    assert not (tmp_path / "run" / "journal.jsonl").exists()


@pytest.mark.slow  # a search on the bundled toy model (~20 s)
def test_the_toy_models_tied_masks_are_all_candidates_and_the_choice_is_recorded(tmp_path: Path):
    """On 8 calibration examples the toy model's search ties masks at its S: each is scored on
    the second task once, in key order after the found mask, and mask.json names the choice."""
    out = tmp_path / "run"
    args = [
        "search",
        "--model",
        "toy",
        "--ratio",
        "0.5",
        "--calib-examples",
        "8",
        "--calib-len",
        "256",
        "--budget-per-layer",
        "4",
        "--calib-metric",
        "acc",  # accuracy ties masks on 8 examples (the default, acc_tiebreak, orders them by probability)
    ]
    assert main([*args, "--tie-break-tasks", "bosch_retrieval_calib", "--out", str(out)]) == 0
    provenance = json.loads((out / "mask.json").read_text())["provenance"]
    ties = provenance["ties"]["scored"]
    assert ties > 0 and provenance["tie_break"]["candidates"] == ties + 1
    keys = [json.loads(line)["key"] for line in (out / TIE_BREAK_FILE).read_text().splitlines()[1:]]
    assert (
        keys[0] == provenance["tie_break"]["found_mask"] and keys[1:] == sorted(keys[1:]) and len(set(keys)) == ties + 1
    )
    chosen = mask_key(HeadMask.load(out / "mask.json").bits)
    assert chosen in keys and chosen.count("0") == keys[0].count("0")


def test_a_finished_searchs_ties_are_read_from_its_committed_journal(tmp_path: Path):
    """``search_ties`` reads a gzipped journal as committed: equal S and as many SWA groups tie; a
    bound counts only for a mask never scored to the end."""
    found, tied, more_swa, lower, bounded, rescored = "011/111", "101/111", "001/111", "110/111", "111/011", "111/101"
    HeadMask(tie_key_bits(found), 3).save(tmp_path / "mask.json")
    records = [
        {"journal": "bosch-journal/1", "header": {"model": "planted"}},
        {"key": found, "score": 0.75}, {"key": tied, "score": 0.75}, {"key": more_swa, "score": 0.75},
        {"key": lower, "score": 0.5}, {"key": bounded, "bound": 0.75, "examples": 8},
        {"key": rescored, "bound": 0.75, "examples": 8}, {"key": rescored, "score": 0.5},
    ]  # fmt: skip
    with gzip.open(tmp_path / "journal.jsonl.gz", "wt") as handle:
        handle.writelines(json.dumps(record) + "\n" for record in records)
    assert next(read_records(tmp_path / "journal.jsonl"))["header"] == {"model": "planted"}
    key, ties = search_ties(tmp_path)
    assert key == found and ties.keys == (tied,) and ties.may_tie == 1
