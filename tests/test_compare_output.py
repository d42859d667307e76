"""What ``bosch-eval compare`` writes and prints besides the scores (issue 32): the truncated
flag, no per-request bars under its own, the device line before its bar, and a plot legend
only when something is labelled."""

from __future__ import annotations

import csv
import json
import warnings

import pytest

from bosch_eval.cli import main
from bosch_eval.compare import runner
from bosch_eval.compare.entries import parse_entry
from bosch_eval.compare.leaderboard import (
    Cell,
    EntryRuns,
    Row,
    build_rows,
    pareto_labels,
    plot_pareto,
    write_leaderboard,
)
from bosch_eval.compare.results import RunResults, read_run
from bosch_eval.compare.spec import build_spec
from bosch_eval.masks.head_mask import HeadMask

INFO = {"documents": 4, "longest_input_tokens": 391, "max_length": 256}
HEADER = {"command": "bosch-eval compare ...", "versions": {}, "reference": "original", "kv_length": 4}


def _results_file(path, task, truncated):
    """A results file as lm-eval writes it, with the adapter's config."""
    config = {"bosch_allow_truncation": True, "bosch_truncated": truncated}
    path.write_text(json.dumps({"results": {task: {"acc,none": 0.5}}, "configs": {task: {}}, "config": config}))


class TestTruncatedFlag:
    def test_each_results_file_counts_for_its_own_tasks_only(self, tmp_path):
        _results_file(tmp_path / "results_1.json", "long", {"long": INFO})
        _results_file(tmp_path / "results_2.json", "short", {"long": INFO})  # the reused adapter still lists "long"
        _results_file(tmp_path / "results_3.json", "other", {})
        assert read_run(tmp_path).truncated == {"long": INFO}

    def test_the_cell_its_group_and_the_headline_are_marked(self, tmp_path):
        results = {"grp": {"acc,none": 0.6}, "long": {"acc,none": 0.5}, "short": {"acc,none": 0.7}}
        run = RunResults(results=results, group_subtasks={"grp": ["long"]}, truncated={"long": INFO})
        rows = build_rows(
            [EntryRuns("original", [run], {}, HeadMask.from_rows([[1, 1]], 2, window=4))],
            "original",
            4,
            tasks=["grp", "short"],
        )
        cells = rows[0].cells
        assert cells["long"].truncated and cells["grp"].truncated and not cells["short"].truncated
        write_leaderboard(rows, list(results), tmp_path, HEADER, ["grp", "short"])
        table = (tmp_path / "leaderboard.md").read_text()
        assert "| original | 0.000 | 1.0000 | 0.650 *truncated* | 0.600 *truncated* | 0.700 |" in table
        assert "| original | 0.000 | 1.0000 | 0.500 *truncated* |" in table  # the subtask
        assert "*truncated*: some of the task's documents were longer than the model's max_length" in table
        with open(tmp_path / "leaderboard.csv") as handle:
            assert {r["task"]: r["truncated"] for r in csv.DictReader(handle)} == {
                "grp": "True",
                "long": "True",
                "short": "False",
            }
        saved = json.loads((tmp_path / "leaderboard.json").read_text())["rows"][0]["cells"]
        assert [saved[n]["truncated"] for n in ("grp", "long", "short")] == [True, True, False]
        assert pareto_labels(rows, ["grp", "short"]) == {(1.0, 0.65): "original (truncated)"}

    def test_no_legend_line_without_a_truncated_cell(self, tmp_path):
        write_leaderboard([Row("original", 1, 0.0, 1.0, {"t": Cell("acc", 0.5)})], ["t"], tmp_path, HEADER, ["t"])
        table = (tmp_path / "leaderboard.md").read_text()
        assert "truncated" not in table and "| original | 0.000 | 1.0000 | 0.500 | 0.500 |" in table


def test_a_plot_with_nothing_labelled_draws_no_legend(tmp_path):
    rows = [Row("original", 1, 0.0, None, {"t": Cell("acc", 1.0)})]  # no KV bytes: no point, no front
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        plot_pareto(rows, ["t"], tmp_path / "pareto.png", None, "original")
    assert not [w for w in caught if "No artists with labels" in str(w.message)]
    assert (tmp_path / "pareto.png").stat().st_size > 0


@pytest.mark.slow
def test_a_truncated_task_is_marked_in_the_leaderboard(tmp_path, capsys):
    # max_length 256: bosch_niah_dev's 512-token documents are truncated, bosch_niah_calib's 128 fit;
    # calib's results file (scored second, same adapter) still lists bosch_niah_dev.
    metadata = {"seq_len": 128, "num_examples": 4, "dev_lengths": [512], "dev_samples": 1}

    def args(model_args, out):
        return ["compare", "--model", "toy", "--model-args", model_args, "--tasks", "bosch_niah_dev", "bosch_niah_calib",
                "--metadata", json.dumps(metadata), "--entry", "original=", "--entry", "intr=layers=intr,ratio=0.5", "--out", str(out)]  # fmt: skip

    assert main(args("device=cpu,batch_size=4,max_length=256", tmp_path / "refused")) == 2
    assert "task 'bosch_niah_dev': 4 request(s) longer than model" in capsys.readouterr().err
    out = tmp_path / "cmp"
    assert main(args("device=cpu,batch_size=4,max_length=256,allow_truncation=true", out)) == 0
    rows = {r["entry"]: r["cells"] for r in json.loads((out / "leaderboard.json").read_text())["rows"]}
    assert {name: (c["bosch_niah_dev"]["truncated"], c["bosch_niah_calib"]["truncated"]) for name, c in rows.items()} == {
        "original": (True, False), "intr": (True, False)}  # fmt: skip
    lines = [
        line for line in (out / "leaderboard.md").read_text().splitlines() if line.startswith(("| original", "| intr"))
    ]
    # the headline and bosch_niah_dev are marked, bosch_niah_calib (the last column) is not
    assert len(lines) == 2 and all(
        line.count("*truncated*") == 2 and "truncated" not in line.split("|")[-2] for line in lines
    )


@pytest.mark.slow
def test_compare_shows_its_own_bar_only_and_the_device_line_before_it(tmp_path, monkeypatch, capfd):
    import tqdm

    from bosch_eval.runtime import device

    events: list[str] = []
    monkeypatch.setattr(device, "_say_picked", lambda picked, reason: events.append("device line"))

    class Bar(tqdm.tqdm):
        def __init__(self, *args, **kwargs):
            events.append(f"bar {kwargs.get('desc')}")
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(tqdm, "tqdm", Bar)
    fields = {
        "model": "toy",
        "model_args": "batch_size=4",
        "tasks": ["bosch_niah_calib"],
        "metadata": {"seq_len": 128, "num_examples": 4},
    }
    assert runner.run_compare(build_spec(fields, [parse_entry("original=")], "test"), tmp_path, progress=True) == [
        "original"
    ]
    assert "device line" in events and events.index("device line") < events.index("bar compare")
    err = capfd.readouterr().err
    assert "compare 1/1 original" in err and "Running loglikelihood requests" not in err
