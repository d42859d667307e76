"""Bulky logs under results/ are committed compressed (issue 38): search journals gzipped, a
comparison's runs in its ``runs.tar.xz``. The readers of lm-eval results and samples
(``compare``'s leaderboard and paired CIs) and of search journals (``--resume``) take them as they
are, and the committed files still give the committed numbers."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import pytest

from bosch_eval.compare.leaderboard import build_rows, column_order, from_compare_dir, write_leaderboard
from bosch_eval.compare.pack import DOC_HASH_DIGITS
from bosch_eval.compare.results import read_run
from bosch_eval.compare.run_archive import ARCHIVE, readable_runs, restore_runs
from bosch_eval.compare.runner import check_out_dir, plan_runs
from bosch_eval.compare.spec import load_spec
from bosch_eval.masks.head_mask import ModelShape
from bosch_eval.models.model_check import model_config, resolve_model
from bosch_eval.runtime.errors import EntryError, JournalError
from bosch_eval.search.journal.store import Journal

REPO = Path(__file__).resolve().parents[1]
HEADER = {"model": "toy", "ratio": 0.5, "window": 64}


def gzip_in_place(path: Path) -> Path:
    """``gzip path``: ``path.gz`` replaces ``path``."""
    packed = path.with_name(path.name + ".gz")
    packed.write_bytes(gzip.compress(path.read_bytes()))
    path.unlink()
    return packed


class TestReadRunGzip:
    def test_gzipped_samples_read_as_the_plain_file(self, tmp_path: Path) -> None:
        (tmp_path / "results_2026-01-01T00-00-00.json").write_text(
            json.dumps({"results": {"my_task": {"acc,none": 0.5}}})
        )
        rows = [{"doc_id": 0, "acc": 1.0}, {"doc_id": 1, "acc": 0.0}]
        samples = tmp_path / "samples_my_task_2026-01-01T00-00-00.jsonl"
        samples.write_text("".join(json.dumps(row) + "\n" for row in rows))
        plain = read_run(tmp_path).samples
        gzip_in_place(samples)
        assert plain == read_run(tmp_path).samples == {"my_task": rows}

    def test_gzipped_results_read_as_the_plain_file(self, tmp_path: Path) -> None:
        """Two tasks' results files, one per subdirectory as lm-eval writes them: merged the same way."""
        first = {"results": {"a": {"acc,none": 0.5}}, "config": {"model_args": "pretrained=toy"},
                 "configs": {"a": {}}, "group_subtasks": {"a": []}}  # fmt: skip
        second = {
            "results": {"b": {"score,none": 0.25}},
            "config": {"bosch_truncated": {"b": {"documents": 3}}},
            "configs": {"b": {}},
        }
        for name, data in (
            ("x/results_2026-01-01T00-00-00.json", first),
            ("y/results_2026-01-01T00-00-01.json", second),
        ):
            (tmp_path / name).parent.mkdir()
            (tmp_path / name).write_text(json.dumps(data))
        plain = read_run(tmp_path)
        for path in tmp_path.rglob("results_*.json"):
            gzip_in_place(path)
        packed = read_run(tmp_path)
        merged = lambda run: (run.results, run.config, run.group_subtasks, run.truncated)  # noqa: E731
        assert merged(packed) == merged(plain)
        assert packed.results == {"a": {"acc,none": 0.5}, "b": {"score,none": 0.25}} and packed.truncated == {
            "b": {"documents": 3}
        }

    def test_a_results_gz_that_is_not_gzip_is_named(self, tmp_path: Path) -> None:
        (tmp_path / "results_1.json.gz").write_text(json.dumps({"results": {"t": {"acc,none": 0.5}}}))
        with pytest.raises(ValueError, match=r"results_1\.json\.gz: not a readable gzip file"):
            read_run(tmp_path)

    def test_a_gz_that_is_not_gzip_is_named(self, tmp_path: Path) -> None:
        (tmp_path / "results_1.json").write_text(json.dumps({"results": {"t": {"acc,none": 0.5}}}))
        (tmp_path / "samples_t_1.jsonl.gz").write_text('{"doc_id": 0}\n')
        with pytest.raises(ValueError, match=r"samples_t_1\.jsonl\.gz: not a readable gzip file"):
            read_run(tmp_path)


class TestJournalGzip:
    @pytest.fixture
    def packed(self, tmp_path: Path) -> tuple[Path, list[dict]]:
        """A finished journal, gzipped as under results/: (its plain path, its records)."""
        path = tmp_path / "journal.jsonl"
        journal = Journal(path, HEADER, resume=False)
        journal.append("10/01", 0.75, stage="stage1")
        journal.append_bound("00/01", 0.5, examples=16)
        gzip_in_place(path)
        return path, journal.records

    def test_resume_unpacks_it_and_appends_to_the_plain_file(self, packed: tuple[Path, list[dict]]) -> None:
        path, records = packed
        committed = path.with_name("journal.jsonl.gz").read_bytes()
        resumed = Journal(path, HEADER, resume=True)
        assert resumed.records == records and resumed.bounds == {"00/01": 0.5}
        resumed.append("11/11", 0.25)
        assert Journal(path, HEADER, resume=True).lookup("11/11") == 0.25
        assert path.with_name("journal.jsonl.gz").read_bytes() == committed  # the committed copy is left as it was

    def test_a_new_search_on_it_is_refused(self, packed: tuple[Path, list[dict]]) -> None:
        path, _ = packed
        with pytest.raises(
            JournalError, match=r"journal\.jsonl\.gz: a gzipped journal of a finished search; pass --resume"
        ):
            Journal(path, HEADER, resume=False)
        assert not path.exists()

    def test_a_read_only_opener_does_not_unpack(self, packed: tuple[Path, list[dict]]) -> None:
        path, _ = packed
        with pytest.raises(JournalError, match="gunzip -k"):
            Journal(path, HEADER, resume=True, writable=False)
        assert not path.exists()

    def test_the_header_still_decides(self, packed: tuple[Path, list[dict]]) -> None:
        path, _ = packed
        with pytest.raises(JournalError, match="header field 'window'"):
            Journal(path, {**HEADER, "window": 32}, resume=True)

    def test_a_gz_that_is_not_gzip_is_named(self, tmp_path: Path) -> None:
        path = tmp_path / "journal.jsonl"
        path.with_name("journal.jsonl.gz").write_text("not gzip")
        with pytest.raises(JournalError, match=r"journal\.jsonl\.gz: not a readable gzip file"):
            Journal(path, HEADER, resume=True)
        assert not path.exists()


class TestCommittedResults:
    def test_every_gz_under_results_unpacks_to_json_lines_or_json(self) -> None:
        packed = sorted((REPO / "results").rglob("*.gz"))
        assert packed, "no gzipped file under results/"
        for path in packed:
            text = gzip.decompress(path.read_bytes()).decode()
            if path.name.endswith(".jsonl.gz"):
                assert all(json.loads(line) is not None for line in text.splitlines()), path
            elif path.name.endswith(".json.gz"):
                json.loads(text)
            else:
                assert path.name.endswith(".log.gz") and text, path  # a command's output (toy_sinks/run.log.gz)

    def test_every_committed_comparison_keeps_its_runs_in_its_archive_and_each_reads(self) -> None:
        """No committed comparison leaves finished runs beside its ``runs.tar.xz``; each archived run reads."""
        assert not list((REPO / "results").glob("**/runs/*/run.json"))
        archives = sorted((REPO / "results").rglob(ARCHIVE))
        read = 0
        for archive in archives:
            with readable_runs(archive.parent) as runs:
                for run in runs.iterdir():
                    assert read_run(run).results and (run / "run.json").is_file(), (archive, run.name)
                    read += 1
        assert len(archives) >= 11 and read > 100, (archives, read)


# Committed comparisons (config, out) and what each must still do from its gzipped runs.
# vs_static_r0.5_s1 is left out: it reuses vs_static_r0.5's runs (its README).
def _comparison(out: str, config: str | None = None) -> tuple[str, str]:
    return config or f"{out}.yaml", out


# Written by today's leaderboard code, their runs pin their inputs, their samples are committed.
CURRENT = [
    _comparison("results/calibration/tiebreak/vs_static_r0.5"),
    _comparison("results/calibration/tiebreak/vs_static_r0.75"),
]
# toy_sinks/run pins its inputs too; the others predate pinned inputs (a resume evaluates them again)
# and the leaderboard's `truncated` field; toy_l/leaderboard and leaderboard_toy never committed samples.
COMPARISONS = [*CURRENT, _comparison("results/toy_sinks/run", "results/toy_sinks/sinks.yaml"),
               _comparison("results/toy_l/leaderboard"), _comparison("results/toy_compare/leaderboard_toy"),
               _comparison("results/toy_compare/small")]  # fmt: skip
HEADER_FIELDS = ("command", "versions", "reference", "kv_length", "settings")
WRITTEN = ("leaderboard.json", "leaderboard.md", "leaderboard.csv")


def rebuild(config: str, out: Path, dest: Path) -> dict:
    """The leaderboard of ``out``'s runs as ``compare`` writes it (header from the committed one) into ``dest``."""
    header = json.loads((Path(out) / "leaderboard.json").read_text())
    spec = load_spec(config)
    entries = from_compare_dir(out, [entry.name for entry in spec.entries])
    head_dim = ModelShape.head_dim_of(model_config(resolve_model(spec.model)))
    rows = build_rows(entries, spec.reference, spec.default_kv_length(), head_dim=head_dim, tasks=spec.tasks)
    dest.mkdir(exist_ok=True)
    write_leaderboard(rows, column_order(entries), dest, {key: header[key] for key in HEADER_FIELDS}, spec.tasks)
    return json.loads((dest / "leaderboard.json").read_text())


class TestCommittedComparison:  # about 0.5 s per test: the fast lane
    @pytest.fixture(autouse=True)
    def _at_repo_root(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.chdir(REPO)  # the YAMLs and run.json name masks relative to the repo root

    @pytest.mark.parametrize(("config", "out"), [*CURRENT, COMPARISONS[2]])
    def test_resume_takes_every_run_as_finished(self, config: str, out: str, tmp_path: Path) -> None:
        """Archived runs count as finished: refused without --resume, skipped with it, the archive untouched."""
        copy = tmp_path / "out"
        shutil.copytree(out, copy)
        spec = load_spec(config)
        plan = plan_runs(spec)
        with pytest.raises(EntryError, match="runs are already finished"):
            check_out_dir(spec, copy, resume=False, plan=plan)
        assert (copy / ARCHIVE).read_bytes() == (Path(out) / ARCHIVE).read_bytes() and not (copy / "runs").exists()
        assert check_out_dir(spec, copy, resume=True, plan=plan) == {item.run for item in plan}
        assert (copy / ARCHIVE).read_bytes() == (Path(out) / ARCHIVE).read_bytes() and not (copy / "runs").exists()

    @pytest.mark.parametrize(("config", "out"), CURRENT)
    def test_the_leaderboard_rebuilds_byte_for_byte(self, config: str, out: str, tmp_path: Path) -> None:
        """Every row, paired CIs included, from the committed (gzipped) runs, as ``compare --resume`` writes it."""
        rebuild(config, Path(out), tmp_path)
        for name in WRITTEN:
            assert (tmp_path / name).read_bytes() == (Path(out) / name).read_bytes(), name

    @pytest.mark.parametrize(("config", "out"), COMPARISONS)
    def test_archived_runs_give_the_leaderboard_of_the_restored_ones(
        self, config: str, out: str, tmp_path: Path
    ) -> None:
        copy = tmp_path / "out"
        shutil.copytree(out, copy)
        assert restore_runs(copy)
        rebuild(config, Path(out), tmp_path / "packed")
        rebuild(config, copy, tmp_path / "plain")
        for name in WRITTEN:
            assert (tmp_path / "packed" / name).read_bytes() == (tmp_path / "plain" / name).read_bytes(), name

    @pytest.mark.parametrize(("config", "out"), COMPARISONS)
    def test_every_committed_score_rebuilds(self, config: str, out: str, tmp_path: Path) -> None:
        """Each cell's metric and mean (and CI where the samples are committed) as the committed leaderboard has it."""
        committed = json.loads((Path(out) / "leaderboard.json").read_text())
        rebuilt = rebuild(config, Path(out), tmp_path)
        with readable_runs(out) as runs:
            with_samples = bool(list(runs.glob("*/*/samples_*")))
        assert [row["entry"] for row in rebuilt["rows"]] == [row["entry"] for row in committed["rows"]]
        for new, old in zip(rebuilt["rows"], committed["rows"]):
            assert new["cells"].keys() == old["cells"].keys(), new["entry"]
            for task, cell in old["cells"].items():
                keys = ("metric", "mean", "ci") if with_samples else ("metric", "mean")
                assert {k: new["cells"][task][k] for k in keys} == {k: cell[k] for k in keys}, (new["entry"], task)

    def test_paired_cis_come_from_archived_samples(self) -> None:
        """The byte-for-byte rebuild covers paired CIs read from the samples in the archive."""
        out = Path("results/calibration/tiebreak/vs_static_r0.75")
        with readable_runs(out) as runs:
            assert list(runs.glob("*/*/samples_*.jsonl")) and not (out / "runs").exists()
        saved = json.loads((out / "leaderboard.json").read_text())
        assert any(cell.get("ci") for row in saved["rows"] for cell in row["cells"].values()), "no paired CI to compare"


@pytest.mark.slow
def test_stripped_samples_regenerate_with_their_doc_hash(monkeypatch: pytest.MonkeyPatch) -> None:
    """The committed samples lack the prompt text (results/README.md): the task, built as
    ``compare`` builds it, gives back each document whose ``doc_hash`` the sample keeps."""
    from lm_eval.utils import handle_non_serializable, hash_string

    from bosch_eval.runtime.lm_eval_session import load_task, task_manager

    monkeypatch.chdir(REPO)
    config, out = COMPARISONS[2]  # toy_sinks/run: two tasks, 336 documents, about 30 s
    spec = load_spec(config)
    path = resolve_model(spec.model)
    manager = task_manager(spec.tasks, spec.include_path, {"pretrained": path, "tokenizer": path} | dict(spec.metadata))
    docs = {
        name: list(task.eval_docs)
        for task_name in spec.tasks
        for name, task in load_task(manager, task_name)["tasks"].items()
    }
    checked = 0
    with readable_runs(out) as runs:
        packed_files = {path.relative_to(runs): path.read_text() for path in runs.glob("*/*/samples_*.jsonl")}
    for packed, text in sorted(packed_files.items()):
        task = packed.name[len("samples_") :].rsplit("_", 1)[0]
        for line in text.splitlines():
            sample = json.loads(line)
            assert "input" not in sample["doc"] and "arg_0" not in sample["arguments"]["gen_args_0"], packed
            doc = docs[task][sample["doc_id"]]
            assert {k: v for k, v in doc.items() if k != "input"} == sample["doc"], (packed, sample["doc_id"])
            text = json.dumps(doc, indent=2, default=handle_non_serializable, ensure_ascii=False)  # lm-eval's doc_hash
            assert hash_string(text)[:DOC_HASH_DIGITS] == sample["doc_hash"], (packed, sample["doc_id"])
            checked += 1
    assert checked == 336
