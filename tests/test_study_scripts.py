"""The study scripts of benchmarks/studies/: each one gives back the committed files it made
(results/), or, where a model had to run, runs at toy size."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
import yaml

from bosch_eval.masks.head_mask import HeadMask, ModelShape
from bosch_eval.search.journal.store import Journal, read_records
from bosch_eval.search.run.pipeline import Resumed

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks" / "studies"))  # the scripts are run as files, not installed

import available_entries  # noqa: E402
import calibration_scores  # noqa: E402
import greedy_by_kind  # noqa: E402
import journal_masks  # noqa: E402
import order_within_ties  # noqa: E402
import paired_runs  # noqa: E402
import probe_calibration  # noqa: E402
import probe_guided  # noqa: E402
import recovery_curves  # noqa: E402
import study_summary  # noqa: E402
import toy_optimum_heldout  # noqa: E402
import uuid_answers  # noqa: E402

SMOLLM2 = REPO / "results" / "smollm2"


@pytest.fixture
def at_repo_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)  # the scripts name results/ relative to the repo root, as commands.sh runs them


class TestJournalMasks:
    def test_the_tied_masks_of_the_check_come_back_byte_for_byte(self, at_repo_root: None, tmp_path: Path) -> None:
        written = journal_masks.write_tied(Path("results/smollm2/search/bosch-r0.75"), 8, tmp_path)
        assert [path.name for path in written] == [f"tied{i}.json" for i in range(8)]
        for path in written:
            assert path.read_bytes() == (SMOLLM2 / "tied_r0.75" / path.name).read_bytes(), path.name

    def test_the_stage1_mask_comes_back_byte_for_byte(self, tmp_path: Path) -> None:
        journal_masks.stage1_mask(SMOLLM2 / "search" / "bosch-paper-r0.5").save(tmp_path / "stage1.json")
        assert (tmp_path / "stage1.json").read_bytes() == (SMOLLM2 / "stage1_r0.5" / "stage1.json").read_bytes()

    def test_the_tie_count_is_the_searchs_own(self) -> None:
        line = journal_masks.ties_line(SMOLLM2 / "search" / "bosch-r0.75")
        assert (
            line
            == "bosch-r0.75: S = 1.0000, 68 SWA groups; 143 other masks tie, 0 stopped early by racing could at best tie"
        )

    def test_a_copy_of_the_scores_resumes_with_every_score_and_bound_and_no_values(self, tmp_path: Path) -> None:
        search = SMOLLM2 / "search" / "bosch-r0.875"
        kept = journal_masks.copy_scores(search, tmp_path)
        original = list(read_records(search / "journal.jsonl"))
        copied = list(read_records(tmp_path / "journal.jsonl"))
        assert (
            kept == len(copied) == len(original) - sum("values" in record for record in original)
            and copied[0] == original[0]
        )
        journal = Journal(tmp_path / "journal.jsonl", original[0]["header"], resume=True)
        before = Journal(tmp_path / "before" / "journal.jsonl", original[0]["header"], resume=False)
        for record in original[1:]:
            if "score" in record:
                before.append(record["key"], record["score"], stage=record["stage"], seconds=record["seconds"])
            elif "bound" in record:
                before.append_bound(
                    record["key"], record["bound"], record["examples"], stage=record["stage"], seconds=record["seconds"]
                )
        assert (
            Resumed.of(journal).scores == Resumed.of(before).scores
            and Resumed.of(journal).bounds == Resumed.of(before).bounds
        )
        assert journal.bounds and not journal.examples

    def test_a_copy_adds_the_masks_of_another_search_of_the_same_objective(self, tmp_path: Path) -> None:
        search, other = SMOLLM2 / "search" / "bosch-r0.75", SMOLLM2 / "search" / "guarded-r0.875"
        journal_masks.copy_scores(search, tmp_path, [other])
        copied = {record["key"]: record for record in list(read_records(tmp_path / "journal.jsonl"))[1:]}
        probes = [
            record
            for record in read_records(other / "journal.jsonl")
            if "score" in record and sorted(record["key"].split("/"))[1] == "111" and "000" in record["key"]
        ]  # one layer all SWA
        own = {
            record["key"]: record
            for record in list(read_records(search / "journal.jsonl"))[1:]
            if "values" not in record
        }
        assert len(probes) == 30 and all(copied[record["key"]]["score"] == record["score"] for record in probes)
        added = [record for record in probes if record["key"] not in own]  # each mask once: its own record first
        assert added and all(
            copied[record["key"]] == {k: v for k, v in record.items() if k != "wall_s"} for record in added
        )
        assert all(copied[key] == record for key, record in own.items())
        assert max(r.get("wall_s", 0) for r in copied.values()) == max(
            r.get("wall_s", 0) for r in own.values()
        )  # its own search time

    def test_a_search_of_another_objective_is_refused(self, tmp_path: Path) -> None:
        other = REPO / "results" / "toy_l" / "search" / "bosch-r0.75"
        with pytest.raises(SystemExit, match=r"another objective than .*header fields \[.*'model'"):
            journal_masks.copy_scores(SMOLLM2 / "search" / "bosch-r0.75", tmp_path, [other])

    def test_a_count_below_one_is_refused(self, tmp_path: Path) -> None:
        with pytest.raises(SystemExit, match="count: 0; expected at least 1"):
            journal_masks.write_tied(SMOLLM2 / "search" / "bosch-r0.75", 0, tmp_path)


def test_the_held_out_page_of_the_toy_optimum_comes_back(at_repo_root: None) -> None:
    committed = (REPO / "results" / "toy_optimum" / "heldout.md").read_text()
    assert toy_optimum_heldout.heldout_table() + "\n" == committed


def test_the_recovery_table_comes_back(tmp_path: Path) -> None:
    table = recovery_curves.collect(REPO / "results" / "toy_train" / "recovery")
    recovery_curves.write_table(table, tmp_path / "recovery.md", "(command)")
    committed = (REPO / "results" / "toy_train" / "recovery" / "recovery.md").read_text().splitlines()
    assert (tmp_path / "recovery.md").read_text().splitlines()[1:] == committed[1:]


def test_the_probe_guided_masks_come_back(tmp_path: Path) -> None:
    shutil.copy(SMOLLM2 / "check" / "check.json", tmp_path)
    probe_guided.main([str(tmp_path)])
    for ratio in ("0.75", "0.875"):
        name = f"mask-r{ratio}.json"
        assert (tmp_path / "probe_guided" / name).read_bytes() == (
            SMOLLM2 / "check" / "probe_guided" / name
        ).read_bytes()


def test_the_tie_break_order_against_dev_is_the_readmes() -> None:
    report = order_within_ties.order_within_ties(
        SMOLLM2 / "check_sinks" / "bosch_niah_calib", SMOLLM2 / "check_tiebreak" / "bosch_niah_calib", "0.5"
    )
    assert report.startswith("ratio 0.5: 9 of ") and report.endswith(
        "Spearman, tie-break ~ dev, among the tied masks: -0.17"
    )
    with pytest.raises(SystemExit, match="no calibration score of a mask at ratio 0.6"):
        order_within_ties.order_within_ties(
            SMOLLM2 / "check_sinks" / "bosch_niah_calib", SMOLLM2 / "check_tiebreak" / "bosch_niah_calib", "0.6"
        )


class TestPairedRuns:
    @staticmethod
    def run(folder: Path, accs: list[float]) -> Path:
        folder.mkdir()
        (folder / "results_1.json").write_text(json.dumps({"results": {"t": {"acc,none": sum(accs) / len(accs)}}}))
        rows = [{"doc_id": i, "acc": acc} for i, acc in enumerate(accs)]
        (folder / "samples_t_1.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
        return folder

    def test_documents_gives_both_scores_and_the_paired_difference(self, tmp_path: Path) -> None:
        a = self.run(tmp_path / "a", [1.0, 0.0, 1.0, 0.0])
        b = self.run(tmp_path / "b", [1.0, 1.0, 1.0, 0.0])
        # differences 0, 1, 0, 0: mean 0.25, sd 0.5, SE 0.25
        assert paired_runs.paired_documents(a, b) == "4 documents: A 0.500, B 0.750, B − A +0.250 ± 0.250 (SE)"

    def test_runs_on_other_documents_are_refused(self, tmp_path: Path) -> None:
        a = self.run(tmp_path / "a", [1.0, 0.0])
        b = self.run(tmp_path / "b", [1.0, 0.0, 1.0])
        with pytest.raises(SystemExit, match="scored different documents"):
            paired_runs.paired_documents(a, b)

    def test_entries_pairs_an_entry_with_another_as_the_leaderboard_does(self) -> None:
        (line,) = paired_runs.paired_entries(REPO / "results" / "toy_compare" / "small", "bosch", ["apl"])
        assert line == ("bosch − apl: headline 0.625, +0.025 [-0.050, +0.100]; niah_single_1 +0.050 [+0.000, +0.150]; "
                        "bosch_niah_multikey_1 +0.000 [-0.150, +0.150]")  # fmt: skip

    def test_a_column_without_paired_documents_says_so(self) -> None:
        # toy_l's razor-r0.75 run kept its results, not its samples
        (line,) = paired_runs.paired_entries(REPO / "results" / "toy_l" / "leaderboard", "bosch-r0.75", ["razor-r0.75"])
        assert "no paired CI" in line and line.startswith("bosch-r0.75 − razor-r0.75: headline ")


class TestAvailableEntries:
    def test_entries_whose_mask_is_missing_are_left_for_later(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        (tmp_path / "m.json").write_text("{}")
        spec = {"entries": ["original=", f"here=mask={tmp_path / 'm.json'}", f"later=mask={tmp_path / 'nope.json'}"]}
        (tmp_path / "in.yaml").write_text(yaml.safe_dump(spec))
        available_entries.main([str(tmp_path / "in.yaml"), str(tmp_path / "out.yaml")])
        assert [e.split("=")[0] for e in yaml.safe_load((tmp_path / "out.yaml").read_text())["entries"]] == [
            "original",
            "here",
        ]
        assert "entry 'later' left for a later call" in capsys.readouterr().err

    def test_a_claimant_left_out_leaves_no_claims_field(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        spec = {"claimant": "later", "entries": ["original=", f"later=mask={tmp_path / 'nope.json'}"]}
        (tmp_path / "in.yaml").write_text(yaml.safe_dump(spec))
        available_entries.main([str(tmp_path / "in.yaml"), str(tmp_path / "out.yaml")])
        assert "claimant" not in yaml.safe_load((tmp_path / "out.yaml").read_text())
        assert "claimant 'later' is left out, so no claims.md yet" in capsys.readouterr().err

    def test_finished_keeps_finished_runs_and_seeds(self, tmp_path: Path) -> None:
        for run in ("original", "intr", "rand@seed=1"):
            (tmp_path / "runs" / run).mkdir(parents=True)
            (tmp_path / "runs" / run / "run.json").write_text("{}")
        spec = {
            "seeds": [0, 1],
            "entries": [
                "original=",
                "intr=layers=intr,ratio=0.5",
                "bme=layers=bme,ratio=0.5",
                "rand=layers=rand,ratio=0.5",
            ],
        }
        kept = available_entries.narrow(spec, tmp_path, "in.yaml")
        assert kept == [
            "original=",
            "intr=layers=intr,ratio=0.5",
            {"name": "rand", "args": "layers=rand,ratio=0.5", "seeds": [1]},
        ]


def test_calibration_scores_tables_every_mask_and_score() -> None:
    shape = ModelShape(num_layers=1, num_heads=2, num_kv_heads=2)
    masks = {"full": HeadMask.uniform(shape, full=True, window=4), "swa": HeadMask.uniform(shape, full=False, window=4)}
    scores = {"calib": lambda mask: mask.num_swa_groups / 2, "dev": lambda mask: 1 - mask.num_swa_groups / 4}
    table = calibration_scores.score_table(masks, scores)
    assert table == {"full": {"calib": 0.0, "dev": 1.0}, "swa": {"calib": 1.0, "dev": 0.5}}
    assert calibration_scores.markdown_table(table, ["dev", "calib"])[2:] == [
        "| full | 1.000 | 0.000 |",
        "| swa | 0.500 | 1.000 |",
    ]


def test_the_diagnosis_scores_the_committed_toy_l_masks(at_repo_root: None) -> None:
    masks = calibration_scores.toy_l_masks(32, ModelShape(num_layers=8, num_heads=16, num_kv_heads=8))
    assert list(masks)[:3] == ["full", "bosch-r0.5", "fisher-r0.5"] and len(masks) == 9
    assert masks["bosch-r0.5"] == HeadMask.load("results/toy_l/search/bosch-r0.5/mask.json")


def test_keyed_kinds_are_read_off_the_document() -> None:
    assert greedy_by_kind.keyed_kind("Where does Ann Lee live?", "Paris") == "single"
    assert greedy_by_kind.keyed_kind("Ann Lee met Bob Ray. Where does Ann Lee live?", "Paris") == "multikey"
    assert greedy_by_kind.keyed_kind("Where does Ann Lee live?", "Paris and Rome") == "multivalue"


@pytest.mark.slow
def test_the_greedy_probes_run_on_the_toy_model(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The model-running scripts at toy size: every row, every kind, counts within their totals."""
    from bosch_eval.models.model_check import resolve_model

    toy = str(resolve_model("toy"))
    calib = greedy_by_kind.calib_by_kind(toy, seed=1, examples=4)
    assert set(calib) <= {"single", "multikey", "multivalue"} and sum(total for total, _, _ in calib.values()) == 4
    assert all(
        0 <= right <= first <= total for total, right, first in calib.values()
    )  # all digits right: the first too
    keyed = greedy_by_kind.keyed_by_kind(toy, length=256, documents=4)
    assert sum(n for n, _ in keyed.values()) == 4 and all(0 <= right <= n for n, right in keyed.values())
    probe_calibration.main(
        [
            "--model",
            "toy",
            "--seq-len",
            "256",
            "--examples",
            "3",
            "--dtype",
            "float32",
            "--out",
            str(tmp_path / "probe.md"),
        ]
    )
    rows = [line for line in (tmp_path / "probe.md").read_text().splitlines() if line.startswith("| v")]
    assert [row.split(" | ")[0] for row in rows] == ["| v1"] + ["| v2"] * 5
    table = uuid_answers.answers_table("toy", 1).splitlines()
    assert len(table) == 3 and table[2].startswith("| 0 | …")


class TestStudySummary:
    """The study's answer table reads the comparison's files and computes nothing they lack."""

    @staticmethod
    def write_study(directory: Path, ratio: str) -> Path:
        def row(entry: str, noise: float, prose: float, uuid: float) -> dict:
            cells = {"niah_single_1": noise, "bosch_niah_single": (noise + prose + uuid) / 3, "bosch_niah_single_1": noise,
                     "bosch_niah_single_2": prose, "bosch_niah_single_3": uuid}  # fmt: skip
            return {"entry": entry, "cells": {name: {"mean": value} for name, value in cells.items()}}

        rows = [row("original", 1.0, 1.0, 0.85), row(f"guarded-r{ratio}", 0.97, 0.98, 0.34),
                row(f"razor-r{ratio}", 0.99, 0.97, 0.86), row(f"qada-r{ratio}", 0.84, 0.76, 0.40),
                row(f"intr-r{ratio}", 0.09, 0.08, 0.05)]  # fmt: skip
        formats = {"niah_single_1": "numbers in noise", "bosch_niah_single_1": "numbers in noise",
                   "bosch_niah_single_2": "numbers in prose", "bosch_niah_single_3": "UUIDs in prose"}  # fmt: skip
        leaderboard = {"headline_columns": ["niah_single_1", "bosch_niah_single"], "formats": formats, "rows": rows}
        claim = {
            "rival": f"razor-r{ratio}",
            "difference": -0.103,
            "low": -0.125,
            "high": -0.082,
            "p_holm": 0.0,
            "verdict": "lower",
        }
        claims = {"claimant": f"guarded-r{ratio}", "reference": "original", "claims": [claim]}
        directory.mkdir()
        (directory / "leaderboard.json").write_text(json.dumps(leaderboard))
        (directory / "claims.json").write_text(json.dumps(claims))
        return directory

    def test_one_line_per_ratio_and_each_format_of_the_three_entries(self, tmp_path: Path) -> None:
        text = study_summary.summary([self.write_study(tmp_path / "study_r0.75", "0.75")])
        guarded = (0.97 + (0.97 + 0.98 + 0.34) / 3) / 2
        razor = (0.99 + (0.99 + 0.97 + 0.86) / 3) / 2
        intr = (0.09 + (0.09 + 0.08 + 0.05) / 3) / 2
        original = (1.0 + 2.85 / 3) / 2
        answer = (f"| 0.75 | {guarded:.3f} | razor {razor:.3f} | {original:.3f} | {intr:.3f} (intr) "
                  "| -0.103 [-0.125, -0.082] | < 0.001 | lower |")  # fmt: skip
        assert answer in text.splitlines()
        assert "| ρ | entry | niah_single_1 (numbers in noise) | bosch_niah_single_1 (numbers in noise) " in text
        assert "| 0.75 | guarded | 0.970 | 0.970 | 0.980 | 0.340 |" in text.splitlines()
        assert "| 0.75 | razor | 0.990 | 0.990 | 0.970 | 0.860 |" in text.splitlines()

    def test_a_study_without_claims_is_named(self, tmp_path: Path) -> None:
        study = self.write_study(tmp_path / "study_r0.5", "0.5")
        (study / "claims.json").unlink()
        with pytest.raises(SystemExit, match=r"study_r0.5: no .*claims.json"):
            study_summary.summary([study])
