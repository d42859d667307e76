"""Bulky logs under results/ are committed gzipped (issue 38): the readers of lm-eval samples
(``compare``'s paired CIs) and of search journals (``--resume``) take ``.gz`` too, and the
committed files still give the committed numbers."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from bosch_eval.compare.leaderboard import build_rows, column_order, from_compare_dir, write_leaderboard
from bosch_eval.compare.results import read_run
from bosch_eval.compare.spec import load_spec
from bosch_eval.masks import ModelShape
from bosch_eval.model_check import model_config, resolve_model
from bosch_eval.search.journal import Journal, JournalError

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
        (tmp_path / "results_2026-01-01T00-00-00.json").write_text(json.dumps({"results": {"my_task": {"acc,none": 0.5}}}))
        rows = [{"doc_id": 0, "acc": 1.0}, {"doc_id": 1, "acc": 0.0}]
        samples = tmp_path / "samples_my_task_2026-01-01T00-00-00.jsonl"
        samples.write_text("".join(json.dumps(row) + "\n" for row in rows))
        plain = read_run(tmp_path).samples
        gzip_in_place(samples)
        assert plain == read_run(tmp_path).samples == {"my_task": rows}

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
        with pytest.raises(JournalError, match=r"journal\.jsonl\.gz: a gzipped journal of a finished search; pass --resume"):
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
            else:
                json.loads(text)

    @pytest.mark.slow
    def test_a_leaderboard_rebuilds_from_its_gzipped_samples(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        """Every row of the committed vs_static_r0.75 leaderboard, paired CIs included, from the committed runs."""
        monkeypatch.chdir(REPO)  # the YAML names masks relative to the repo root
        out = Path("results/calibration/tiebreak/vs_static_r0.75")
        assert list(out.glob("runs/*/*/samples_*.jsonl.gz")) and not list(out.glob("runs/*/*/samples_*.jsonl"))
        committed = json.loads((out / "leaderboard.json").read_text())
        assert any(cell.get("ci") for row in committed["rows"] for cell in row["cells"].values()), "no paired CI to compare"
        spec = load_spec(f"{out}.yaml")
        entries = from_compare_dir(out, [entry.name for entry in spec.entries])
        head_dim = ModelShape.head_dim_of(model_config(resolve_model(spec.model)))
        rows = build_rows(entries, spec.reference, spec.default_kv_length(), head_dim=head_dim, tasks=spec.tasks)
        write_leaderboard(rows, column_order(entries), tmp_path, committed, spec.tasks)
        assert json.loads((tmp_path / "leaderboard.json").read_text())["rows"] == committed["rows"]
        assert (tmp_path / "leaderboard.md").read_text() == (out / "leaderboard.md").read_text()
