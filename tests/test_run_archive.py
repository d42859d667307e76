"""A comparison's finished runs in one ``runs.tar.xz`` (bosch_eval.compare.run_archive): what
``compare --pack`` moves there, that every reader sees the same runs, and that ``compare``
restores them before it writes."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pytest

from bosch_eval.cli import main
from bosch_eval.compare.pack import pack
from bosch_eval.compare.results import doc_values, read_run
from bosch_eval.compare.run_archive import (
    ARCHIVE,
    archive_runs,
    archived_runs,
    finished_runs,
    readable_runs,
    restore_runs,
)
from bosch_eval.runtime.errors import BoschError
from tests.test_compare_pack import SAMPLE, write_run


def finished_run(root: Path, name: str, acc: float = 1.0) -> Path:
    """A finished run of a comparison under ``root``: lm-eval's files and ``run.json``."""
    write_run(root / "runs" / name / "model", [{**SAMPLE, "doc_id": 0, "acc": acc}, {**SAMPLE, "doc_id": 1}])
    (root / "runs" / name / "run.json").write_text(json.dumps({"entry": name}) + "\n")
    return root / "runs" / name


def runs_read(root: Path) -> dict[str, tuple]:
    """Each finished run's results and per-document values, as the leaderboard reads them."""
    with readable_runs(root) as runs:
        read = {run.name: read_run(run) for run in sorted(runs.iterdir())}
    return {name: (run.results, doc_values(run.samples["t"], "acc")) for name, run in read.items()}


def test_packing_moves_finished_runs_into_one_archive_that_reads_as_they_did(tmp_path: Path):
    finished_run(tmp_path, "a", 1.0)
    finished_run(tmp_path, "b", 0.0)
    write_run(tmp_path / "runs" / "c" / "model")  # no run.json: in progress, left alone
    before = {name: value for name, value in runs_read(tmp_path).items() if name != "c"}
    pack(tmp_path)
    assert (tmp_path / ARCHIVE).is_file() and archived_runs(tmp_path) == {"a", "b"}
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["c"]
    assert finished_runs(tmp_path) == {"a", "b"}
    assert runs_read(tmp_path) == before
    assert pack(tmp_path) == 0  # packed once is packed


def test_the_same_runs_give_the_same_archive_and_restore_as_plain_files(tmp_path: Path):
    finished_run(tmp_path, "a")
    pack(tmp_path)
    first = (tmp_path / ARCHIVE).read_bytes()
    with tarfile.open(fileobj=io.BytesIO(first), mode="r:xz") as archive:
        names = archive.getnames()
        assert all(member.mtime == 0 and member.uid == 0 for member in archive.getmembers())
    assert names == sorted(names) and not any(name.endswith(".gz") for name in names)  # one stream sees all text
    assert restore_runs(tmp_path) == 1 and not (tmp_path / ARCHIVE).exists()
    assert (tmp_path / "runs" / "a" / "run.json").is_file() and list((tmp_path / "runs" / "a").rglob("samples_*.jsonl"))
    assert archive_runs(tmp_path)
    assert (tmp_path / ARCHIVE).read_bytes() == first


def test_runs_finished_later_join_the_archive(tmp_path: Path):
    finished_run(tmp_path, "a")
    pack(tmp_path)
    finished_run(tmp_path, "b")
    assert finished_runs(tmp_path) == {"a", "b"}
    assert archive_runs(tmp_path) and archived_runs(tmp_path) == {"a", "b"} and not (tmp_path / "runs").exists()


def test_a_linked_run_is_stored_by_content_and_its_target_is_kept(tmp_path: Path):
    target = finished_run(tmp_path / "other", "original")
    (tmp_path / "this" / "runs").mkdir(parents=True)
    (tmp_path / "this" / "runs" / "original").symlink_to(target, target_is_directory=True)
    assert archive_runs(tmp_path / "this")
    assert archived_runs(tmp_path / "this") == {"original"} and (target / "run.json").is_file()
    assert runs_read(tmp_path / "this") == runs_read(tmp_path / "other")


def test_a_run_both_archived_and_on_disk_is_refused(tmp_path: Path):
    finished_run(tmp_path, "a")
    archive_runs(tmp_path)
    finished_run(tmp_path, "a")
    with pytest.raises(BoschError, match=r"runs \['a'\] are both in runs/ and in runs\.tar\.xz"):
        archive_runs(tmp_path)
    with pytest.raises(BoschError, match=r"runs \['a'\] are both"):
        restore_runs(tmp_path)


def test_an_archive_with_a_member_outside_runs_is_named(tmp_path: Path):
    with tarfile.open(tmp_path / ARCHIVE, "w:xz") as archive:
        info = tarfile.TarInfo("../escape.json")
        archive.addfile(info, io.BytesIO(b""))
    with pytest.raises(BoschError, match=r"runs\.tar\.xz: member '\.\./escape\.json' is not a file under runs/<run>/"):
        archived_runs(tmp_path)
    (tmp_path / ARCHIVE).write_bytes(b"not xz")
    with pytest.raises(BoschError, match=r"runs\.tar\.xz: not a readable tar\.xz archive"):
        archived_runs(tmp_path)


def test_pack_on_a_missing_folder_is_refused_without_creating_it(tmp_path: Path):
    assert main(["compare", "--pack", "--out", str(tmp_path / "missing")]) != 0
    assert not (tmp_path / "missing").exists()
