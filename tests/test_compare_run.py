"""bosch-eval compare end to end on the bundled toy model (tiny settings): lm-eval files per
run, one model load, resume after a kill, refusing to overwrite, bad entries."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bosch_eval.cli import main
from bosch_eval.compare import runner
from bosch_eval.compare.entries import EntryError, parse_entry
from bosch_eval.compare.spec import build_spec

pytestmark = pytest.mark.slow
MASK = Path(__file__).parents[1] / "results" / "toy_search" / "bosch-r0.75" / "mask.json"
FIELDS = {"model": "toy", "model_args": "device=cpu,batch_size=4", "tasks": ["bosch_niah_calib"],
          "metadata": {"seq_len": 128, "num_examples": 4}}  # fmt: skip
ENTRIES = ["original=", f"bosch=mask={MASK}", "intr=layers=intr,ratio=0.5"]


class Killed(Exception):
    """Stands in for SIGKILL (pytest itself intercepts KeyboardInterrupt)."""


def spec(entries=ENTRIES):
    return build_spec(dict(FIELDS), [parse_entry(e) for e in entries], "test")


def test_resume_after_a_kill_evaluates_only_the_rest(tmp_path, monkeypatch):
    import lm_eval.evaluator

    real = lm_eval.evaluator.simple_evaluate
    calls: list[str] = []
    loads: list[int] = []
    kills: list[int] = []
    real_load = runner._load_model
    monkeypatch.setattr(runner, "_load_model", lambda *a: loads.append(1) or real_load(*a))

    def killed_at_the_second_run(**kwargs):
        calls.append(kwargs["model_args"])
        if len(calls) == 2 and not kills:
            kills.append(1)
            raise Killed  # the kill, in the middle of the second run
        return real(**kwargs)

    monkeypatch.setattr(lm_eval.evaluator, "simple_evaluate", killed_at_the_second_run)
    with pytest.raises(Killed):
        runner.run_compare(spec(), tmp_path, progress=False)
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["original"]
    original_files = sorted(p.name for p in (tmp_path / "runs" / "original").rglob("*"))
    assert any(n.startswith("results_") for n in original_files) and any(n.startswith("samples_") for n in original_files)

    with pytest.raises(EntryError, match="already finished"):  # nothing finished is overwritten
        runner.run_compare(spec(), tmp_path, progress=False)
    calls.clear()
    assert runner.run_compare(spec(), tmp_path, resume=True, progress=False) == ["bosch", "intr"]
    assert len(calls) == 2 and loads == [1, 1]  # one load per invocation, masks swapped in place
    assert sorted(p.name for p in (tmp_path / "runs" / "original").rglob("*")) == original_files
    record = json.loads((tmp_path / "runs" / "intr" / "run.json").read_text())
    assert record["mask"]["swa_ratio"] == 0.5

    changed = spec(["original=", "bosch=layers=bme,ratio=0.5", "intr=layers=intr,ratio=0.5"])
    with pytest.raises(EntryError, match="entry 'bosch': field 'args'"):
        runner.run_compare(changed, tmp_path, resume=True, progress=False)


def test_cli_leaderboard(tmp_path, capsys):
    out = tmp_path / "cmp"
    args = ["compare", "--model", "toy", "--model-args", "device=cpu,batch_size=4", "--tasks", "bosch_niah_calib",
            "--metadata", json.dumps(FIELDS["metadata"]), "--entry", "original=", "--entry", f"bosch=mask={MASK}", "--out", str(out)]  # fmt: skip
    assert main(args) == 0
    table = (out / "leaderboard.md").read_text()
    assert "*in-sample*" in table and "| bosch | 0.750 |" in table
    rows = json.loads((out / "leaderboard.json").read_text())["rows"]
    assert rows[1]["cells"]["bosch_niah_calib"]["ci"] is not None
    assert (out / "pareto.png").stat().st_size > 0 and (out / "leaderboard.csv").is_file()

    # A finished lm-eval output directory joins as an entry, nothing is re-run (--resume).
    import shutil

    shutil.copytree(out / "runs" / "bosch", tmp_path / "elsewhere")
    assert main([*args, "--resume", "--from-results", str(tmp_path / "elsewhere")]) == 0
    rows = {r["entry"]: r for r in json.loads((out / "leaderboard.json").read_text())["rows"]}
    assert rows["elsewhere"]["swa_ratio"] == 0.75
    assert rows["elsewhere"]["cells"]["bosch_niah_calib"]["in_sample"]  # from the mask file in its model_args
    assert rows["elsewhere"]["cells"]["bosch_niah_calib"]["mean"] == rows["bosch"]["cells"]["bosch_niah_calib"]["mean"]


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ("other=mask=" + str(Path(__file__).parent / "nope.json"), "entry 'other'"),
        ("wide=layers=rand,ratio=2", "entry 'wide': ratio"),
    ],
)
def test_bad_entries_fail_naming_the_entry(tmp_path, entry, message, capsys):
    args = ["compare", "--model", "toy", "--model-args", "device=cpu", "--tasks", "bosch_niah_calib", "--metadata", json.dumps(FIELDS["metadata"]),
            "--entry", entry, "--out", str(tmp_path)]  # fmt: skip
    assert main(args) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()  # refused before any run


def test_unknown_task_is_an_error(tmp_path, capsys):
    assert main(["compare", "--model", "toy", "--model-args", "device=cpu", "--tasks", "no_such_task_xyz", "--entry", "original=", "--out", str(tmp_path)]) == 2
    assert "no_such_task_xyz" in capsys.readouterr().err


def test_mask_for_another_model_is_an_error(tmp_path, capsys):
    from bosch_eval.masks import HeadMask

    other = tmp_path / "other.json"
    HeadMask.from_rows([[0, 1]] * 2, 2, window=8).save(other)  # 2 layers × 2 groups; toy has 4 × 4
    args = ["compare", "--model", "toy", "--model-args", "device=cpu", "--tasks", "bosch_niah_calib",
            "--entry", f"small=mask={other}", "--out", str(tmp_path / "out")]  # fmt: skip
    assert main(args) == 2
    assert "entry 'small'" in capsys.readouterr().err
