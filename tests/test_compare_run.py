"""bosch-eval compare end to end on the bundled toy model (tiny settings): lm-eval files per
run, one model load, resume after a kill, refusing to overwrite, bad entries."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bosch_eval.cli import main
from bosch_eval.compare import runner
from bosch_eval.compare.entries import parse_entry
from bosch_eval.compare.spec import build_spec
from bosch_eval.runtime.errors import EntryError

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
    assert any(n.startswith("results_") for n in original_files) and any(
        n.startswith("samples_") for n in original_files
    )

    with pytest.raises(EntryError, match="already finished"):  # nothing finished is overwritten
        runner.run_compare(spec(), tmp_path, progress=False)
    calls.clear()
    assert runner.run_compare(spec(), tmp_path, resume=True, progress=False) == ["bosch", "intr"]
    assert len(calls) == 2 and loads == [1, 1]  # one load per invocation, masks swapped in place
    assert sorted(p.name for p in (tmp_path / "runs" / "original").rglob("*")) == original_files
    record = json.loads((tmp_path / "runs" / "intr" / "run.json").read_text())
    assert record["mask"]["swa_ratio"] == 0.5

    changed = spec(["original=", "bosch=layers=bme,ratio=0.5", "intr=layers=intr,ratio=0.5"])
    with pytest.raises(EntryError, match="run 'bosch' \\(entry 'bosch'\\): field 'args'"):
        runner.run_compare(changed, tmp_path, resume=True, progress=False)


def test_a_run_killed_mid_task_resumes_at_its_last_batch(tmp_path, monkeypatch):
    """The answers of the batches before a kill come from the run's request cache; the resumed
    run equals an uninterrupted one. A cache whose run now applies another mask is cleared."""
    from bosch_eval.model_adapters.bosch import BoschLM

    fields = dict(FIELDS, model_args="device=cpu,batch_size=2,sink=4", tasks=["bosch_niah_single_1"],
                  metadata={"max_seq_lengths": [256]}, limit=8, gen_kwargs={"max_gen_toks": 8})  # fmt: skip
    entries = [f"bosch=mask={MASK}"]
    real = BoschLM._model_generate
    batches: list[int] = []

    def killed_at_the_third_batch(self, *args, **kwargs):
        batches.append(1)
        if len(batches) == 3:
            raise Killed
        return real(self, *args, **kwargs)

    def run(out, entry_list=entries, **kwargs):
        batches.clear()
        runner.run_compare(
            build_spec(dict(fields), [parse_entry(e) for e in entry_list], "test"), out, progress=False, **kwargs
        )
        return len(batches)

    def answers(out):
        files = list((out / "runs" / "bosch").rglob("samples_*.jsonl"))
        return {row["doc_id"]: row["resps"] for line in files[0].read_text().splitlines() for row in [json.loads(line)]}

    monkeypatch.setattr(BoschLM, "_model_generate", killed_at_the_third_batch)
    with pytest.raises(Killed):
        run(tmp_path / "killed")
    assert (tmp_path / "killed" / runner.REQUESTS_DIR / "bosch" / runner.PIN_FILE).is_file()
    monkeypatch.setattr(BoschLM, "_model_generate", lambda self, *a, **k: batches.append(1) or real(self, *a, **k))
    assert run(tmp_path / "killed", resume=True) == 2  # batches 3 and 4 of 4
    assert run(tmp_path / "whole") == 4
    assert answers(tmp_path / "killed") == answers(tmp_path / "whole")
    assert not (tmp_path / "killed" / runner.REQUESTS_DIR / "bosch").exists()

    monkeypatch.setattr(BoschLM, "_model_generate", killed_at_the_third_batch)
    with pytest.raises(Killed):
        run(tmp_path / "changed")
    monkeypatch.setattr(BoschLM, "_model_generate", lambda self, *a, **k: batches.append(1) or real(self, *a, **k))
    assert run(tmp_path / "changed", ["bosch=layers=intr,ratio=0.5"], resume=True) == 4  # another mask: nothing reused


def test_cli_leaderboard(tmp_path, capsys):
    out = tmp_path / "cmp"
    args = ["compare", "--model", "toy", "--model-args", "device=cpu,batch_size=4", "--tasks", "bosch_niah_calib",
            "--metadata", json.dumps(FIELDS["metadata"]), "--entry", "original=", "--entry", f"bosch=mask={MASK}", "--out", str(out)]  # fmt: skip
    assert main(args) == 0
    table = (out / "leaderboard.md").read_text()
    assert "*in-sample*" in table and "| bosch | 0.750 |" in table
    rows = json.loads((out / "leaderboard.json").read_text())["rows"]
    assert rows[1]["cells"]["bosch_niah_calib"]["ci"] is not None
    assert (out / "leaderboard.csv").is_file()
    assert (
        not (out / "pareto.png").exists() and "no task is held out" in table
    )  # its one task is bosch's calibration task

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
            "--entry", "original=", "--entry", entry, "--out", str(tmp_path)]  # fmt: skip
    assert main(args) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()  # refused before any run


def test_unknown_task_is_an_error(tmp_path, capsys):
    assert (
        main(
            [
                "compare",
                "--model",
                "toy",
                "--model-args",
                "device=cpu",
                "--tasks",
                "no_such_task_xyz",
                "--entry",
                "original=",
                "--out",
                str(tmp_path),
            ]
        )
        == 2
    )
    assert "no_such_task_xyz" in capsys.readouterr().err


def test_mask_for_another_model_is_an_error(tmp_path, capsys):
    from bosch_eval.masks.head_mask import HeadMask

    other = tmp_path / "other.json"
    HeadMask.from_rows([[0, 1]] * 2, 2, window=8).save(other)  # 2 layers × 2 groups; toy has 4 × 4
    args = ["compare", "--model", "toy", "--model-args", "device=cpu", "--tasks", "bosch_niah_calib",
            "--entry", "original=", "--entry", f"small=mask={other}", "--out", str(tmp_path / "out")]  # fmt: skip
    assert main(args) == 2
    assert "entry 'small'" in capsys.readouterr().err


def _cli(out, *extra, tasks=("bosch_niah_calib",), model_args="device=cpu,batch_size=4", entries=("original=",)):
    args = [
        "compare",
        "--model",
        "toy",
        "--model-args",
        model_args,
        "--tasks",
        *tasks,
        "--metadata",
        json.dumps(FIELDS["metadata"]),
    ]
    return [*args, *(a for e in entries for a in ("--entry", e)), "--out", str(out), *extra]


def test_a_run_whose_inputs_changed_is_refused_unless_asked_and_then_kept_aside(tmp_path, caplog):
    # A new search writes another mask to the same path; the model's files change under the
    # same directory: --resume must neither keep the old rows nor silently replace them.
    import shutil

    from bosch_eval.masks.head_mask import HeadMask
    from bosch_eval.models.model_check import resolve_model

    mask, model, out = tmp_path / "mask.json", tmp_path / "model", tmp_path / "cmp"
    shutil.copy(MASK, mask)
    shutil.copytree(resolve_model("toy"), model)
    entries = [parse_entry(e) for e in ("original=", f"bosch=mask={mask}")]
    local = lambda: build_spec({**FIELDS, "model": str(model)}, entries, "test")  # noqa: E731
    assert runner.run_compare(local(), out, progress=False) == ["original", "bosch"]
    assert runner.run_compare(local(), out, resume=True, progress=False) == []  # nothing changed
    old_run = (out / "runs" / "bosch" / "run.json").read_text()

    all_swa = HeadMask.from_rows([[0] * 4] * 4, 8, window=32)
    all_swa.save(mask)
    with pytest.raises(
        EntryError, match=rf"run 'bosch' \(entry 'bosch'\): mask file {mask} changed \(sha256 .*--new-settings"
    ):
        runner.run_compare(local(), out, resume=True, progress=False)
    assert (out / "runs" / "bosch" / "run.json").read_text() == old_run
    with caplog.at_level("WARNING"):
        assert runner.run_compare(local(), out, resume=True, progress=False, new_settings=True) == ["bosch"]
    (kept,) = (out / "previous").iterdir()
    assert (kept / "runs" / "bosch" / "run.json").read_text() == old_run  # the old result, beside the new one
    record = json.loads((out / "runs" / "bosch" / "run.json").read_text())
    assert record["mask"]["mask"] == [[0] * 4] * 4 and record["inputs"]["mask"]["file"] == str(mask)

    (model / "generation_config.json").write_text((model / "generation_config.json").read_text() + "\n")
    with pytest.raises(EntryError, match="the model changed \\(files generation_config.json\\)"):
        runner.run_compare(local(), out, resume=True, progress=False)
    assert runner.run_compare(local(), out, resume=True, progress=False, new_settings=True) == ["original", "bosch"]


def test_other_settings_are_refused_unless_asked(tmp_path, capsys):
    out = tmp_path / "cmp"
    assert main(_cli(out)) == 0
    capsys.readouterr()
    other = [*_cli(out, "--resume"), "--limit", "2"]
    assert main(other) == 2
    assert "other settings (limit: None → 2)" in capsys.readouterr().err
    before = (out / "leaderboard.md").read_text()
    assert main([*other, "--new-settings"]) == 0
    (kept,) = (out / "previous").iterdir()
    assert (kept / "leaderboard.md").read_text() == before and (kept / "runs" / "original" / "run.json").is_file()
    assert json.loads((out / "compare.json").read_text())["settings"]["limit"] == 2


def test_a_failed_compare_pins_no_settings(tmp_path, monkeypatch, capsys):
    import lm_eval.evaluator

    out = tmp_path / "cmp"
    loads: list[int] = []
    real_load = runner._load_model
    monkeypatch.setattr(runner, "_load_model", lambda *a: loads.append(1) or real_load(*a))
    assert main(_cli(out, tasks=["no_such_task_xyz"])) == 2
    assert "no_such_task_xyz" in capsys.readouterr().err and loads == []  # checked before the model loads

    real = lm_eval.evaluator.simple_evaluate

    def cuda_failure(**kwargs):
        raise RuntimeError("CUDA error: out of memory")

    monkeypatch.setattr(lm_eval.evaluator, "simple_evaluate", cuda_failure)
    with pytest.raises(RuntimeError, match="CUDA error"):
        main(_cli(out, model_args="device=cpu,batch_size=64"))
    monkeypatch.setattr(lm_eval.evaluator, "simple_evaluate", real)
    assert main(_cli(out)) == 0  # the corrected command, on the same --out
    assert json.loads((out / "compare.json").read_text())["settings"]["model_args"] == {
        "device": "cpu",
        "batch_size": "4",
    }
    assert main(_cli(out, "--resume", "--limit", "2")) == 2  # a finished run pins them
    assert "other settings (limit: None → 2)" in capsys.readouterr().err


def test_two_compares_on_one_out(tmp_path, monkeypatch, capsys):
    """A holds --out (stopped in the middle of a run); B on the same --out stops before loading
    the model, naming A, and leaves A's run in progress alone; A then finishes."""
    import os
    import signal
    import subprocess
    import sys
    import time

    out = tmp_path / "cmp"
    entries = ("original=", "intr=layers=intr,ratio=0.5", "bme=layers=bme,ratio=0.5")
    command = [sys.executable, "-m", "bosch_eval.cli", *_cli(out, entries=entries)]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    first = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not (out / ".partial").is_dir():
            if first.poll() is not None or time.monotonic() > deadline:
                pytest.fail(
                    f"the first compare never started a run: {first.stderr.read() if first.poll() is not None else 'timeout'}"
                )
            time.sleep(0.02)
        first.send_signal(signal.SIGSTOP)  # A holds --out and stands still
        in_progress = sorted(p.name for p in (out / ".partial").iterdir())
        loads: list[int] = []
        monkeypatch.setattr(runner, "_load_model", lambda *a: loads.append(1))
        assert main(_cli(out, "--resume", entries=entries)) == 2
        assert f"another compare (PID {first.pid} on host" in capsys.readouterr().err and loads == []
        assert sorted(p.name for p in (out / ".partial").iterdir()) == in_progress
    finally:
        first.send_signal(signal.SIGCONT)
    assert first.wait(timeout=300) == 0, first.stderr.read()
    assert sorted(p.name for p in (out / "runs").iterdir()) == ["bme", "intr", "original"]


def test_reference_and_from_results_that_name_nothing(tmp_path, capsys):
    assert main(_cli(tmp_path / "a", "--reference", "nosuch", entries=("original=", "intr=layers=intr,ratio=0.5"))) == 2
    assert "--reference: 'nosuch' names no entry; expected one of ['original', 'intr']" in capsys.readouterr().err
    assert not (tmp_path / "a").exists()  # refused before anything ran
    assert main(_cli(tmp_path / "c", "--claimant", "bosch", entries=("original=", "intr=layers=intr,ratio=0.5"))) == 2
    assert "--claimant: 'bosch' names no entry; expected one of ['original', 'intr']" in capsys.readouterr().err
    assert not (tmp_path / "c").exists()
    assert main(_cli(tmp_path / "b", "--from-results", str(tmp_path / "nodir"))) == 2
    assert f"--from-results {tmp_path / 'nodir'}: no such directory" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert main(_cli(tmp_path / "b", "--from-results", str(tmp_path / "empty"))) == 2
    assert "no lm-eval results_*.json below it" in capsys.readouterr().err


def test_a_packed_comparison_resumes_beside_its_archive_and_packs_again(tmp_path):
    """Archived runs count as finished; a new entry's run goes to runs/ and the next --pack adds it; a run
    evaluated again is set aside from the restored archive."""
    import shutil

    from bosch_eval.compare.run_archive import ARCHIVE, archived_runs
    from bosch_eval.masks.head_mask import HeadMask

    out, mask = tmp_path / "cmp", tmp_path / "mask.json"
    shutil.copy(MASK, mask)
    both = ("original=", f"bosch=mask={mask}")
    assert main(_cli(out)) == 0 and main(["compare", "--pack", "--out", str(out)]) == 0
    assert archived_runs(out) == {"original"} and not (out / "runs").exists()

    assert main(_cli(out, "--resume", entries=both)) == 0
    assert archived_runs(out) == {"original"} and [p.name for p in (out / "runs").iterdir()] == ["bosch"]
    board = json.loads((out / "leaderboard.json").read_text())
    assert [row["entry"] for row in board["rows"]] == ["original", "bosch"]
    assert main(["compare", "--pack", "--out", str(out)]) == 0
    assert archived_runs(out) == {"original", "bosch"} and not (out / "runs").exists()
    assert main(_cli(out, "--resume", entries=both)) == 0  # nothing evaluated: the same rows from the archive
    assert json.loads((out / "leaderboard.json").read_text())["rows"] == board["rows"]

    HeadMask.from_rows([[0] * 4] * 4, 8, window=32).save(mask)
    assert main(_cli(out, "--resume", "--new-settings", entries=both)) == 0
    (kept,) = (out / "previous").iterdir()
    assert (kept / "runs" / "bosch" / "run.json").is_file() and not (out / ARCHIVE).exists()
    assert sorted(p.name for p in (out / "runs").iterdir()) == ["bosch", "original"]
