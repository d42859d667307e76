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
import re
from pathlib import Path
from unittest import mock

import pytest

from bosch_eval.cli import main
from bosch_eval.masks.head_mask import HeadMask
from tests.helpers import search_args, write_tasks


@pytest.fixture(scope="module")
def finished(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    root = tmp_path_factory.mktemp("search")
    task_dir = write_tasks(root / "tasks")
    out = root / "run"
    assert main(search_args(tiny_model_dir, task_dir, out)) == 0
    return tiny_model_dir, task_dir, out


def test_sinks_given_as_a_model_arg_score_every_mask_and_are_written_in_the_mask(
    finished: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    model_dir, task_dir, plain = finished
    out = tmp_path / "sinks"
    assert main(search_args(model_dir, task_dir, out, "--model-args", "sink=2")) == 0
    assert HeadMask.load(out / "mask.json").sinks == 2 and HeadMask.load(plain / "mask.json").sinks == 0
    anchors = lambda run: json.loads((run / "mask.json").read_text())["provenance"]["anchors"]  # noqa: E731
    # 320-token documents, W = 256: with two sinks the all-SWA model's late queries see more
    assert anchors(out)["a"] != anchors(plain)["a"] and anchors(out)["all_full"] == anchors(plain)["all_full"]


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
    assert "(0 in this run)" in capsys.readouterr().out
    assert (out / "journal.jsonl").read_text() == before
    assert HeadMask.load(out / "mask.json").bits == first


def test_a_journal_of_another_window_is_refused_naming_the_field(finished: tuple[Path, Path, Path], capsys) -> None:
    model_dir, task_dir, out = finished
    args = search_args(model_dir, task_dir, out, "--resume")
    args[args.index("--window") + 1] = "128"
    assert main(args) == 2
    assert "header field 'window' is 256 in the journal but 128 in this search" in capsys.readouterr().err


def test_a_journal_of_another_dtype_is_refused_naming_the_field(finished: tuple[Path, Path, Path], capsys) -> None:
    """bf16 and fp32 round differently, so a resume in another dtype would mix two arithmetics."""
    model_dir, task_dir, out = finished
    before = (out / "journal.jsonl").read_text()
    args = search_args(model_dir, task_dir, out, "--resume")
    args[args.index("--dtype") + 1] = "bfloat16"
    assert main(args) == 2
    assert "header field 'dtype'" in (err := capsys.readouterr().err) and "float32" in err and "bfloat16" in err
    assert (out / "journal.jsonl").read_text() == before


def test_a_journal_from_before_the_dtype_was_pinned_resumes_under_this_runs(
    finished: tuple[Path, Path, Path], tmp_path: Path, capsys, caplog
) -> None:
    import shutil

    model_dir, task_dir, out = finished
    copy = tmp_path / "copy"
    shutil.copytree(out, copy, ignore=shutil.ignore_patterns(".bosch-search.lock"))
    first, *rest = (copy / "journal.jsonl").read_text().splitlines(keepends=True)
    header = json.loads(first)
    del header["header"]["dtype"]
    (copy / "journal.jsonl").write_text(json.dumps(header) + "\n" + "".join(rest))
    with caplog.at_level("INFO"):
        assert main(search_args(model_dir, task_dir, copy, "--resume")) == 0
    assert "(0 in this run)" in capsys.readouterr().out
    assert "does not pin the dtype" in caplog.text and "float32" in caplog.text


def test_a_resume_under_other_settings_is_refused_unless_asked_and_keeps_the_old_result(
    finished: tuple[Path, Path, Path], tmp_path: Path, capsys, caplog
) -> None:
    """Issue 40: `--resume --ratio 0.75` replaced a finished ρ = 0.5 mask. Now it is refused,
    naming the fields; asked for (--new-settings), it reuses every journaled score and keeps
    the old mask and report beside the new ones."""
    import shutil

    model_dir, task_dir, out = finished
    copy = tmp_path / "copy"
    shutil.copytree(out, copy, ignore=shutil.ignore_patterns(".bosch-search.lock"))
    old_mask, old_report = (copy / "mask.json").read_text(), (copy / "report.md").read_text()
    journaled = {record["key"]: record["score"] for record in journal_lines(copy) if "score" in record}
    other = ("--seed", "1", "--buckets", "0", "0.5", "1")
    with mock.patch("bosch_eval.search.run.api.build_objective", side_effect=AssertionError("loaded the model")):
        assert main(search_args(model_dir, task_dir, copy, "--resume", *other)) == 2  # refused before the model loads
    err = capsys.readouterr().err
    assert "settings.seed: 0 → 1" in err and "settings.buckets" in err and "--new-settings" in err
    assert (copy / "mask.json").read_text() == old_mask and not (copy / "previous").exists()
    with caplog.at_level("WARNING"):
        assert main(search_args(model_dir, task_dir, copy, "--resume", "--new-settings", *other)) == 0
    assert "settings.seed: 0 → 1" in caplog.text
    (kept,) = (copy / "previous").iterdir()
    assert (kept / "mask.json").read_text() == old_mask and (kept / "report.md").read_text() == old_report
    assert json.loads((kept / "settings.json").read_text())["journal header"]["settings"]["seed"] == 0
    lines = journal_lines(copy)
    assert lines[0]["header"]["settings"]["seed"] == 1
    assert json.loads((copy / "mask.json").read_text())["provenance"]["search"]["seed"] == 1
    records = [record for record in lines[1:] if "score" in record]
    assert {r["key"]: r["score"] for r in records[: len(journaled)]} == journaled  # kept, none re-scored
    assert len({r["key"] for r in records}) == len(records)


@pytest.mark.parametrize("pinned", [None, [0.0, 0.25, 0.5, 0.75, 1.0]], ids=["default-as-null", "paper-buckets-named"])
def test_the_default_buckets_and_the_same_buckets_named_are_one_setting(
    finished: tuple[Path, Path, Path], tmp_path: Path, capsys, pinned: list[float] | None
) -> None:
    """Stage 2's default buckets depend on G (``buckets=None``); journals pinned them as null, or,
    before that, named the paper's. With G = 4 both are this search's buckets: it resumes."""
    import shutil

    model_dir, task_dir, out = finished
    copy = tmp_path / "copy"
    shutil.copytree(out, copy, ignore=shutil.ignore_patterns(".bosch-search.lock"))
    lines = (copy / "journal.jsonl").read_text().splitlines()
    first = json.loads(lines[0])
    first["header"]["settings"]["buckets"] = pinned
    (copy / "journal.jsonl").write_text("\n".join([json.dumps(first), *lines[1:]]) + "\n")
    assert main(search_args(model_dir, task_dir, copy, "--resume")) == 0
    assert "(0 in this run)" in capsys.readouterr().out
    assert journal_lines(copy)[0]["header"]["settings"]["buckets"] == [0.0, 0.25, 0.5, 0.75, 1.0]


def test_a_gzipped_journal_under_other_settings_is_refused_before_the_model_loads(
    finished: tuple[Path, Path, Path], tmp_path: Path, capsys
) -> None:
    """Committed journals are gzipped (results/); the check before the load reads them too."""
    import gzip
    import shutil

    model_dir, task_dir, out = finished
    copy = tmp_path / "copy"
    shutil.copytree(out, copy, ignore=shutil.ignore_patterns(".bosch-search.lock"))
    (copy / "journal.jsonl.gz").write_bytes(gzip.compress((copy / "journal.jsonl").read_bytes()))
    (copy / "journal.jsonl").unlink()
    with mock.patch("bosch_eval.search.run.api.build_objective", side_effect=AssertionError("loaded the model")):
        assert main(search_args(model_dir, task_dir, copy, "--resume", "--seed", "1")) == 2
    err = capsys.readouterr().err
    assert "journal.jsonl" in err and "settings.seed: 0 → 1" in err and "--new-settings" in err


def test_a_journal_of_another_calibration_metric_is_refused_before_the_model_loads(
    finished: tuple[Path, Path, Path], capsys
) -> None:
    """Issue 67 made acc_tiebreak the default: a journal of acc resumed without --calib-metric acc
    is refused, naming the field, before anything loads."""
    model_dir, task_dir, out = finished
    with mock.patch("bosch_eval.search.run.api.build_objective", side_effect=AssertionError("loaded the model")):
        assert main(search_args(model_dir, task_dir, out, "--resume", "--calib-metric", "acc_tiebreak")) == 2
    assert 'calibration.metric: "perplexity" → "acc_tiebreak"' in capsys.readouterr().err


def test_a_folder_holding_a_search_is_refused_without_resume_before_the_model_loads(
    finished: tuple[Path, Path, Path], capsys
) -> None:
    """Issue 68: the first message said only "pass --resume", after the model had loaded; the
    resume was then refused for other settings. Now one message, before the load, says both."""
    model_dir, task_dir, out = finished
    with mock.patch("bosch_eval.search.run.api.build_objective", side_effect=AssertionError("loaded the model")):
        assert main(search_args(model_dir, task_dir, out)) == 2
        assert "holds a search; pass --resume to continue it; it ran under these settings" in capsys.readouterr().err
        assert main(search_args(model_dir, task_dir, out, "--seed", "1")) == 2
    err = capsys.readouterr().err
    assert "pass --resume to continue it; a resume would change settings.seed: 0 → 1, so it needs --new-settings" in err


def test_new_settings_needs_resume(finished: tuple[Path, Path, Path], tmp_path: Path, capsys) -> None:
    model_dir, task_dir, _ = finished
    assert main(search_args(model_dir, task_dir, tmp_path / "run", "--new-settings")) == 2
    assert "--new-settings" in capsys.readouterr().err and not (tmp_path / "run").exists()


def test_a_resumed_finished_search_keeps_its_wall_time(finished: tuple[Path, Path, Path]) -> None:
    model_dir, task_dir, out = finished
    wall_s = json.loads((out / "mask.json").read_text())["provenance"]["wall_s"]
    assert main(search_args(model_dir, task_dir, out, "--resume")) == 0
    again = json.loads((out / "mask.json").read_text())["provenance"]["wall_s"]
    assert wall_s > 0 and again >= 0.9 * wall_s
    report = (out / "report.md").read_text()
    assert "| search time, every run of this journal | " in report  # not "of the last run"
    assert "| masks the calibration set cannot tell from the found one (as many SWA groups, the same S) | " in report


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--buckets", "0", "0.3", "1"], r"--buckets: 0\.3 × 4 KV groups per layer = 1\.2 is not a whole number"),
        (
            ["--ratio", "0.75", "--buckets", "0.25", "0.5"],
            r"--buckets: ratio 0\.75 asks for 9 SWA groups, but buckets \[0\.25, 0\.5\] give 3 to 6",
        ),
        (
            ["--calib-len", "1024"],
            r"--calib-len 1024: longer than model .* \(max_position_embeddings = 512\).*--ignore-max-positions",
        ),
    ],
)
def test_settings_the_config_refutes_fail_before_the_weights_load(
    finished: tuple[Path, Path, Path], tmp_path: Path, capsys, extra: list[str], message: str
) -> None:
    model_dir, task_dir, _ = finished
    args = search_args(model_dir, task_dir, tmp_path / "run") + extra
    with mock.patch("bosch_eval.search.run.api.build_objective", side_effect=AssertionError("loaded the model")):
        assert main(args) == 2
    assert re.search(message, capsys.readouterr().err)
    assert not (tmp_path / "run" / "journal.jsonl").exists()


def test_an_existing_journal_needs_resume(finished: tuple[Path, Path, Path], capsys) -> None:
    model_dir, task_dir, out = finished
    assert main(search_args(model_dir, task_dir, out)) == 2
    assert "--resume" in capsys.readouterr().err


def test_a_model_without_defaults_needs_a_window(finished: tuple[Path, Path, Path], tmp_path: Path, capsys) -> None:
    model_dir, task_dir, _ = finished
    args = [arg for arg in search_args(model_dir, task_dir, tmp_path / "run") if arg not in ("--window", "256")]
    assert main(args) == 2
    assert "--window" in capsys.readouterr().err


@pytest.mark.parametrize(("ratio", "swa_groups"), [("1", 12), ("0", 0)])
def test_a_ratio_that_allows_one_mask_spends_only_the_anchors(
    finished: tuple[Path, Path, Path], tmp_path: Path, ratio: str, swa_groups: int
) -> None:
    model_dir, task_dir, _ = finished
    args = search_args(model_dir, task_dir, tmp_path / "run")
    args[args.index("--ratio") + 1] = ratio
    assert main(args) == 0
    provenance = json.loads((tmp_path / "run" / "mask.json").read_text())["provenance"]
    assert provenance["evaluations"] == 2  # S(all SWA) and S(full); one of them is the answer
    assert HeadMask.load(tmp_path / "run" / "mask.json").num_swa_groups == swa_groups
    assert provenance["score"] == provenance["anchors"]["all_swa" if ratio == "1" else "all_full"]


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


@pytest.mark.parametrize(
    ("model_args", "message"),
    [
        ("batch_size=4", "--model-args: 'batch_size' is set by --batch-size, not here"),
        ("tp_plan=auto", "'tp_plan' is set by nothing: tensor parallelism is not supported"),
        ("attn_implementation=eager", "choose its kernel with attn_backend="),
        ("revison=main", "model_arg 'revison' is not one the bosch adapter takes"),
        ("revison=main", "did you mean 'revision'?"),
    ],
)
def test_bad_model_args_fail_before_anything_loads(
    finished: tuple[Path, Path, Path], tmp_path: Path, capsys, model_args, message
) -> None:
    model_dir, task_dir, _ = finished
    assert main(search_args(model_dir, task_dir, tmp_path / "out", "--model-args", model_args)) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_model_args_reach_the_loader_and_pin_the_journal(finished: tuple[Path, Path, Path], capsys) -> None:
    # The finished search had none: a resume that loads another revision must not reuse its scores.
    model_dir, task_dir, out = finished
    assert (
        main(search_args(model_dir, task_dir, out, "--resume", "--model-args", "revision=main,trust_remote_code=False"))
        == 2
    )
    assert "header field 'model_args'" in capsys.readouterr().err


def test_model_args_are_typed_as_lm_eval_types_them() -> None:
    from bosch_eval.model_adapters.loader_args import parse_model_args

    assert parse_model_args("parallelize=True,revision=v2,max_batch_size=8") == {
        "parallelize": True,
        "revision": "v2",
        "max_batch_size": 8,
    }
    assert parse_model_args(None) == {}
