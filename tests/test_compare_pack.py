"""``bosch-eval compare --pack`` (bosch_eval.compare.pack): what a committed run keeps, and that
the leaderboard's inputs read the same before and after."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from bosch_eval.cli import main
from bosch_eval.compare.pack import DOC_HASH_DIGITS, SHARED_FILE, SharedStore, pack, strip_sample
from bosch_eval.compare.results import doc_values, read_run

ENVIRONMENT = "PyTorch version: 2.13.0+cpu\nCPU: AMD EPYC\n"
CONFIG = {"task": "t", "metadata": {"seq_len": 1024}, "metric_list": [{"metric": "acc"}]}
SAMPLE = {
    "doc_id": 3,
    "doc": {"input": "a long haystack", "max_length": 1024},
    "target": "42",
    "arguments": {"gen_args_0": {"arg_0": "a long haystack", "arg_1": " 42"}},
    "resps": [["42"]],
    "filtered_resps": ["42"],
    "filter": "none",
    "acc": 1.0,
    "doc_hash": "ab" * 32,
    "prompt_hash": "cd" * 32,
    "target_hash": "ef" * 32,
}


def write_run(folder: Path, samples: list[dict] | None = None) -> None:
    """An lm-eval output folder as lm-eval writes it: plain results and samples of task ``t``."""
    folder.mkdir(parents=True)
    results = {"results": {"t": {"acc,none": 1.0}}, "configs": {"t": CONFIG}, "pretty_env_info": ENVIRONMENT}
    (folder / "results_2026-01-01T00-00-00.json").write_text(json.dumps(results, indent=2))
    rows = samples or [SAMPLE]
    (folder / "samples_t_2026-01-01T00-00-00.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))


def test_a_sample_loses_the_prompt_and_what_kept_fields_give_back():
    assert strip_sample(SAMPLE) == {
        "doc_id": 3,
        "doc": {"max_length": 1024},
        "target": "42",
        "arguments": {"gen_args_0": {"arg_1": " 42"}},
        "resps": [["42"]],
        "filter": "none",
        "acc": 1.0,
        "doc_hash": "ab" * (DOC_HASH_DIGITS // 2),
    }


def test_a_prompt_no_task_regenerates_can_be_kept():
    kept = strip_sample(SAMPLE, keep_prompt=True)
    assert kept["doc"] == SAMPLE["doc"] and kept["arguments"] == SAMPLE["arguments"] and "prompt_hash" not in kept


def test_filtered_responses_stay_when_a_filter_changed_them():
    filtered = {**SAMPLE, "filter": "take_first", "filtered_resps": ["4"]}
    assert strip_sample(filtered)["filtered_resps"] == ["4"]
    assert strip_sample({**SAMPLE, "filtered_resps": ["41"]})["filtered_resps"] == ["41"]


def test_a_packed_folder_reads_as_the_original(tmp_path: Path):
    rows = [{**SAMPLE, "doc_id": 0, "acc": 1.0}, {**SAMPLE, "doc_id": 1, "acc": 0.0}]
    write_run(tmp_path / "run", rows)
    before = read_run(tmp_path / "run")
    assert pack(tmp_path) == 3  # samples, results, the shared store
    after = read_run(tmp_path / "run")
    assert (
        after.results == before.results and not list(tmp_path.rglob("*.json")) and not list(tmp_path.rglob("*.jsonl"))
    )
    assert (
        doc_values(after.samples["t"], "acc")
        == doc_values(before.samples["t"], "acc")
        == {(None, 0): 1.0, (None, 1): 0.0}
    )
    assert pack(tmp_path) == 0  # packed once is packed


def test_environment_and_configs_are_stored_once_and_named(tmp_path: Path):
    write_run(tmp_path / "a" / "runs" / "x")
    (tmp_path / "a" / "runs" / "x" / "run.json").write_text("{}")
    write_run(tmp_path / "b")
    pack(tmp_path)
    store = SharedStore(tmp_path)
    assert list(store.entries["environments"].values()) == [ENVIRONMENT] and list(
        store.entries["configs"].values()
    ) == [CONFIG]
    for folder in (tmp_path / "a" / "runs" / "x", tmp_path / "b"):
        results = json.loads(gzip.decompress(next(folder.glob("results_*.json.gz")).read_bytes()))
        assert results["pretty_env_info"].startswith(
            f"see {Path('../../..') if folder.name == 'x' else Path('..')}/{SHARED_FILE}#"
        )
        assert store.resolve(results["pretty_env_info"], folder) == ENVIRONMENT
        assert store.resolve(results["configs"]["t"], folder) == CONFIG


def test_a_reference_to_another_store_is_refused(tmp_path: Path):
    store = SharedStore(tmp_path)
    with pytest.raises(ValueError, match=r"names no entry of .*shared\.json\.gz"):
        store.resolve("see ../shared.json.gz#configs/000000000000", tmp_path)


def test_runs_in_progress_are_left_alone(tmp_path: Path):
    write_run(tmp_path / ".partial" / "x")
    write_run(tmp_path / "runs" / "y")  # no run.json: not finished
    assert pack(tmp_path) == 0
    assert len(list(tmp_path.rglob("*.json"))) == 2 and not list(tmp_path.rglob("*.gz"))


def test_a_broken_gz_is_named(tmp_path: Path):
    (tmp_path / "samples_t_1.jsonl.gz").write_text("not gzip")
    with pytest.raises(ValueError, match=r"samples_t_1\.jsonl\.gz: not a readable gzip file"):
        pack(tmp_path)


def test_the_command_packs_and_evaluates_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    write_run(tmp_path / "run")
    assert main(["compare", "--pack", "--out", str(tmp_path)]) == 0
    assert f"{tmp_path}: 3 files packed" in capsys.readouterr().out
    assert main(["compare", "--pack", "--out", str(tmp_path / "missing")]) != 0
