"""``bosch-eval search`` end to end on a tiny local checkpoint: the files it writes, resume
with zero re-evaluation, and the errors it names.

A random model solves no needle (``acc`` is 0 for every mask), so these runs score the
calibration documents by perplexity, which every mask changes a little. Perplexity is
lower-is-better (the test task's ``metric_list`` says so), and the run must carry that
direction from lm-eval into the anchors and the search. That exercises the plumbing
(objective, stages, journal, provenance); whether the search finds good masks is tested on
planted objectives (``test_search_pipeline.py``).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bosch_eval.cli import main
from bosch_eval.masks import HeadMask
from tests.objective_worker import PPL_TASK, write_tasks

CALIB = ["--calib-examples", "3", "--calib-len", "320", "--window", "256"]


def search_args(model_dir: Path, task_dir: Path, out: Path, *extra: str) -> list[str]:
    return [
        "search", "--model", str(model_dir), "--ratio", "0.5", "--out", str(out), "--budget-per-layer", "6",
        "--calib-tasks", PPL_TASK, "--include-path", str(task_dir), "--calib-metric", "perplexity",
        "--dtype", "float32", *CALIB, *extra,
    ]  # fmt: skip


@pytest.fixture(scope="module")
def finished(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    root = tmp_path_factory.mktemp("search")
    task_dir = write_tasks(root / "tasks")
    out = root / "run"
    assert main(search_args(tiny_model_dir, task_dir, out)) == 0
    return tiny_model_dir, task_dir, out


def journal_lines(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "journal.jsonl").read_text().splitlines()]


def test_writes_the_mask_with_its_provenance(finished: tuple[Path, Path, Path]) -> None:
    _, _, out = finished
    mask = HeadMask.load(out / "mask.json")
    assert mask.num_swa_groups == 6  # ⌈0.5 · 3 layers · 4 groups⌉
    assert mask.window == 256
    provenance = json.loads((out / "mask.json").read_text())["provenance"]
    anchors = provenance["anchors"]
    # Perplexity: lower is better, so b lies below the original model, which lies below all-SWA.
    assert provenance["calibration"]["higher_is_better"] is False and anchors["higher_is_better"] is False
    assert anchors["b"] == pytest.approx(0.8 * anchors["all_full"])
    assert anchors["b"] < anchors["all_full"] < anchors["a"]
    assert provenance["score"] < anchors["a"] and provenance["normalized_score"] > 0
    assert len(provenance["stage1_scores"]) == 3 and len(provenance["stage2"]["ratios"]) == 3
    assert provenance["seed"] == 0 and provenance["processes"] == 1
    assert {"torch", "transformers", "lm_eval", "accelerate", "PyNomadBBO"} <= set(provenance["versions"])
    assert provenance["evaluations"] == provenance["new_evaluations"] > 2
    assert provenance["wall_s"] > 0
    assert "# BOSCH search" in (out / "report.md").read_text()


def test_journal_holds_every_evaluation_once(finished: tuple[Path, Path, Path]) -> None:
    _, _, out = finished
    records = [record for record in journal_lines(out) if "key" in record]
    keys = [record["key"] for record in records]
    assert len(keys) == len(set(keys))
    provenance = json.loads((out / "mask.json").read_text())["provenance"]
    assert len(keys) == provenance["evaluations"]


def test_resume_of_a_finished_search_evaluates_nothing(finished: tuple[Path, Path, Path], capsys) -> None:
    model_dir, task_dir, out = finished
    before = (out / "journal.jsonl").read_text()
    first = HeadMask.load(out / "mask.json").bits
    assert main(search_args(model_dir, task_dir, out, "--resume")) == 0
    assert "(0 now)" in capsys.readouterr().out
    assert (out / "journal.jsonl").read_text() == before
    assert HeadMask.load(out / "mask.json").bits == first


def test_a_journal_of_other_settings_is_refused(finished: tuple[Path, Path, Path], capsys) -> None:
    model_dir, task_dir, out = finished
    assert main(search_args(model_dir, task_dir, out, "--resume", "--seed", "1")) == 2
    assert "seed" in capsys.readouterr().err


def test_an_existing_journal_needs_resume(finished: tuple[Path, Path, Path], capsys) -> None:
    model_dir, task_dir, out = finished
    assert main(search_args(model_dir, task_dir, out)) == 2
    assert "--resume" in capsys.readouterr().err


def test_a_model_without_defaults_needs_a_window(finished: tuple[Path, Path, Path], tmp_path: Path, capsys) -> None:
    model_dir, task_dir, _ = finished
    args = [arg for arg in search_args(model_dir, task_dir, tmp_path / "run") if arg not in ("--window", "256")]
    assert main(args) == 2
    assert "--window" in capsys.readouterr().err


def test_new_search_options_reach_the_search(finished: tuple[Path, Path, Path], tmp_path: Path) -> None:
    model_dir, task_dir, _ = finished
    out = tmp_path / "run"
    assert main(search_args(model_dir, task_dir, out, "--chunk-layers", "2", "--quota", "chunk", "--refine", "1")) == 0
    provenance = json.loads((out / "mask.json").read_text())["provenance"]
    assert {key: provenance["search"][key] for key in ("chunk_layers", "quota", "refine")} == {
        "chunk_layers": 2, "quota": "chunk", "refine": 1
    }  # fmt: skip
    assert provenance["refine"]["stage3_evaluations"] <= provenance["evaluations"]
    assert any(sub["stage"] == "refine" for sub in provenance["subproblems"])


def test_settings_that_do_not_fit_the_model_are_named_before_loading_scores(finished, tmp_path: Path, capsys) -> None:
    model_dir, task_dir, _ = finished
    assert main(search_args(model_dir, task_dir, tmp_path / "run", "--buckets", "0", "0.3", "1")) == 2
    assert "buckets: entry 1 is 0.3" in capsys.readouterr().err
    assert not (tmp_path / "run" / "journal.jsonl").exists() or len((tmp_path / "run" / "journal.jsonl").read_text().splitlines()) <= 1
