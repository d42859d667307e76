"""The evaluation journal: round trips, durability, resume after a kill, refusals."""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from unittest import mock

import pytest

from bosch_eval.runtime.errors import JournalError
from bosch_eval.search.journal.store import Journal, mask_key

HEADER = {"model": "toy", "ratio": 0.5, "window": 64, "seed": 1, "variant": "bosch", "buckets": [0.0, 0.5, 1.0]}


def lines_of(path: Path) -> list[dict]:
    text = path.read_text()
    assert text.endswith("\n")
    return [json.loads(line) for line in text.splitlines()]


class TestMaskKey:
    def test_rows_joined_bottom_to_top(self) -> None:
        assert mask_key([[1, 0, 1, 1], [0, 1, 1, 0]]) == "1011/0110"
        assert mask_key(((True, False),)) == "10"

    @pytest.mark.parametrize(
        ("bits", "message"),
        [
            ([], "non-empty"),
            ([[]], "non-empty"),
            ([[1, 0], [1]], "row 1"),
            ([[1, 2]], r"\[0\]\[1\]"),
            ([[1.0]], r"\[0\]\[0\]"),
        ],
    )
    def test_rejects(self, bits: list, message: str) -> None:
        with pytest.raises(ValueError, match=message):
            mask_key(bits)


class TestRoundTrip:
    def test_records_survive_reopening(self, tmp_path: Path) -> None:
        path = tmp_path / "journal.jsonl"
        journal = Journal(path, HEADER, resume=False)
        journal.append("10/01", 0.75, stage="stage1", seconds=1.5)
        journal.append("00/01", 0.5)
        assert lines_of(path) == [
            {"journal": "bosch-journal/1", "header": HEADER},
            {"key": "10/01", "score": 0.75, "stage": "stage1", "seconds": 1.5},
            {"key": "00/01", "score": 0.5},
        ]
        again = Journal(path, dict(HEADER, buckets=(0.0, 0.5, 1.0)), resume=True)  # a tuple reads back as a list
        assert again.records == journal.records == lines_of(path)[1:]
        assert len(again) == 2
        assert again.lookup("10/01") == 0.75 and again.lookup("11/11") is None
        assert again.header == HEADER

    def test_floats_round_trip_exactly(self, tmp_path: Path) -> None:
        rng = random.Random(0)
        scores = [0.1 + 0.2, 1 / 3, 5e-324, 1.7976931348623157e308, -0.0, 2.0**-60] + [rng.random() for _ in range(200)]
        journal = Journal(tmp_path / "j.jsonl", HEADER, resume=False)
        for index, score in enumerate(scores):
            journal.append(str(index), score)
        again = Journal(tmp_path / "j.jsonl", HEADER, resume=True)
        for index, score in enumerate(scores):
            assert repr(again.lookup(str(index))) == repr(score)

    def test_records_are_copies(self, tmp_path: Path) -> None:
        journal = Journal(tmp_path / "j.jsonl", HEADER, resume=False)
        journal.append("1", 0.5, stage="a")
        journal.records[0]["score"] = 9.0
        assert journal.records[0]["score"] == 0.5

    def test_fsync_after_each_line_is_written(self, tmp_path: Path) -> None:
        path = tmp_path / "j.jsonl"
        journal = Journal(path, HEADER, resume=False)

        def on_disk(fd: int) -> None:
            written.append(path.read_text().splitlines()[-1])

        written: list[str] = []
        with mock.patch("bosch_eval.search.journal.store.os.fsync", side_effect=on_disk) as fsync:
            journal.append("1", 0.25)
            journal.append("0", 0.125)
        assert fsync.call_count == 2
        assert [json.loads(line)["key"] for line in written] == ["1", "0"]

    def test_resume_without_a_file_starts_fresh(self, tmp_path: Path) -> None:
        path = tmp_path / "new" / "j.jsonl"
        journal = Journal(path, HEADER, resume=True)
        assert len(journal) == 0
        assert lines_of(path) == [{"journal": "bosch-journal/1", "header": HEADER}]


class TestResumeAfterAKill:
    def journal_with(self, path: Path, count: int) -> bytes:
        journal = Journal(path, HEADER, resume=False)
        for index in range(count):
            journal.append(f"k{index}", index / 8, stage="stage1")
        return path.read_bytes()

    @pytest.mark.parametrize(
        "tail",
        [
            b'{"key": "k3", "sco',  # cut mid-record
            b'{"key": "k3", "score": 0.375}',  # complete but the newline never made it
            b'{"key": "k3", "score": 0.3',  # cut inside the number
            b"\x00\x00\x00\n",  # garbage a crash left, newline included
        ],
    )
    def test_cut_last_line_is_dropped_and_truncated(self, tmp_path: Path, tail: bytes) -> None:
        path = tmp_path / "j.jsonl"
        good = self.journal_with(path, 3)
        path.write_bytes(good + tail)
        journal = Journal(path, HEADER, resume=True)
        assert [r["key"] for r in journal.records] == ["k0", "k1", "k2"]
        assert path.read_bytes() == good
        journal.append("k3", 0.375)
        assert [line.get("key") for line in lines_of(path)] == [None, "k0", "k1", "k2", "k3"]

    def test_cut_header_starts_afresh(self, tmp_path: Path) -> None:
        path = tmp_path / "j.jsonl"
        path.write_bytes(b'{"journal": "bosch-jou')
        journal = Journal(path, HEADER, resume=True)
        assert len(journal) == 0
        assert lines_of(path) == [{"journal": "bosch-journal/1", "header": HEADER}]

    def test_damaged_middle_line_names_file_and_line(self, tmp_path: Path) -> None:
        path = tmp_path / "j.jsonl"
        lines = self.journal_with(path, 3).split(b"\n")
        lines[2] = b'{"key": "k1", "sc'
        path.write_bytes(b"\n".join(lines))
        before = path.read_bytes()
        with pytest.raises(JournalError, match=rf"{path}: line 3: not valid JSON"):
            Journal(path, HEADER, resume=True)
        assert path.read_bytes() == before

    def test_duplicate_record_with_another_score_is_damage(self, tmp_path: Path) -> None:
        path = tmp_path / "j.jsonl"
        good = self.journal_with(path, 2)
        path.write_bytes(good + b'{"key": "k0", "score": 0.5}\n{"key": "k9", "score": 0.0}\n')
        with pytest.raises(
            JournalError, match=r"line 4: mask k0 appears twice with different scores \(0\.0 and 0\.5\)"
        ):
            Journal(path, HEADER, resume=True)

    def test_duplicate_record_with_an_equal_score_is_recovered(self, tmp_path: Path, caplog) -> None:
        """Two processes that both appended one mask (the lock prevents it now) lost nothing."""
        path = tmp_path / "j.jsonl"
        good = self.journal_with(path, 2)
        path.write_bytes(good + b'{"key": "k0", "score": 0.0, "stage": "stage1"}\n{"key": "k9", "score": 0.25}\n')
        journal = Journal(path, HEADER, resume=True)
        assert [(r["key"], r["score"]) for r in journal.records] == [("k0", 0.0), ("k1", 0.125), ("k9", 0.25)]
        assert "ignored 1 repeated record" in caplog.text

    @pytest.mark.slow
    def test_sigkill_loses_nothing_that_was_acknowledged(self, tmp_path: Path) -> None:
        """A child appends in a loop and prints each key once append returned; we kill -9 it, twice."""
        path = tmp_path / "j.jsonl"
        child = textwrap.dedent(
            """
            import sys, time
            from bosch_eval.search.journal.store import Journal
            journal = Journal(sys.argv[1], {"seed": 7}, resume=True)
            for index in range(len(journal), 100_000):
                journal.append(f"m{index}", index / 7, stage="loop", pad="x" * (index % 50))
                print(f"m{index}", flush=True)
                time.sleep(0.002)
            """
        )
        acknowledged: list[str] = []
        for round_ in range(2):
            process = subprocess.Popen([sys.executable, "-c", child, str(path)], stdout=subprocess.PIPE, text=True)
            assert process.stdout is not None
            seen = 0
            while seen < 15:
                line = process.stdout.readline()
                assert line, f"child exited early (round {round_}, rc={process.poll()})"
                acknowledged.append(line.strip())
                seen += 1
            process.send_signal(signal.SIGKILL)
            acknowledged.extend(line.strip() for line in process.stdout.read().splitlines())
            assert process.wait(timeout=30) == -signal.SIGKILL
            process.stdout.close()

        journal = Journal(path, {"seed": 7}, resume=True)
        keys = [record["key"] for record in journal.records]
        assert len(keys) == len(set(keys))
        assert set(acknowledged) <= set(keys)
        assert keys == [f"m{index}" for index in range(len(keys))]  # the second run went on where the first stopped
        assert all(journal.lookup(f"m{index}") == index / 7 for index in range(len(keys)))


class TestRefusals:
    def test_never_overwrites_finished_work(self, tmp_path: Path) -> None:
        path = tmp_path / "j.jsonl"
        Journal(path, HEADER, resume=False).append("1", 0.5)
        before = path.read_bytes()
        with pytest.raises(JournalError, match="holds 1 masks evaluated; pass --resume .* another --out"):
            Journal(path, HEADER, resume=False)
        assert path.read_bytes() == before

    def test_header_only_file_is_replaced(self, tmp_path: Path) -> None:
        path = tmp_path / "j.jsonl"
        Journal(path, HEADER, resume=False)
        Journal(path, dict(HEADER, seed=2), resume=False)
        assert lines_of(path) == [{"journal": "bosch-journal/1", "header": dict(HEADER, seed=2)}]

    def test_other_files_are_not_touched(self, tmp_path: Path) -> None:
        path = tmp_path / "notes.txt"
        path.write_text("my notes")
        for resume in (False, True):
            with pytest.raises(JournalError, match="not a bosch-journal/1"):
                Journal(path, HEADER, resume=resume)
        path.write_text('{"some": "json"}\n{"other": 1}\n')
        with pytest.raises(JournalError, match="line 1: not a bosch-journal/1 header"):
            Journal(path, HEADER, resume=True)
        assert path.read_text() == '{"some": "json"}\n{"other": 1}\n'

    @pytest.mark.parametrize(
        ("changed", "message"),
        [
            ({"ratio": 0.75}, r"header field 'ratio' is 0\.5 in the journal but 0\.75 in this search"),
            ({"seed": 1.0}, r"header field 'seed' is 1 in the journal but 1\.0 in this search"),
            ({"alpha": 100}, r"header field 'alpha' is \(absent\) in the journal but 100 in this search"),
            ({"window": None}, r"header field 'window' is 64 in the journal but null in this search"),
        ],
    )
    def test_header_mismatch_names_the_field(self, tmp_path: Path, changed: dict, message: str) -> None:
        path = tmp_path / "j.jsonl"
        Journal(path, HEADER, resume=False).append("1", 0.5)
        with pytest.raises(JournalError, match=message):
            Journal(path, dict(HEADER, **changed), resume=True)

    def test_nested_fields_are_named_by_their_path(self, tmp_path: Path) -> None:
        path = tmp_path / "j.jsonl"
        header = dict(HEADER, calibration={"tasks": ["t"], "metadata": {"seq_len": 1024, "num_examples": 64}})
        Journal(path, header, resume=False).append("1", 0.5)
        changed = dict(header, calibration={"tasks": ["t"], "metadata": {"seq_len": 2048, "num_examples": 64}})
        with pytest.raises(JournalError, match=r"'calibration\.metadata\.seq_len' is 1024 in the journal but 2048"):
            Journal(path, changed, resume=True)

    def test_reusable_fields_change_only_when_asked_and_the_header_follows(self, tmp_path: Path, caplog) -> None:
        path = tmp_path / "j.jsonl"
        header = {"model": "toy", "settings": {"seed": 0, "buckets": [0, 0.5, 1]}}
        Journal(path, header, resume=False).append("1", 0.5)
        changed = {"model": "toy", "settings": {"seed": 1, "buckets": [0, 0.25, 0.5, 0.75, 1]}}
        before = path.read_bytes()
        # Unasked, a resume under other settings would replace the finished result: refused, naming every field.
        with pytest.raises(
            JournalError, match=r"other settings \(settings\.seed: 0 → 1; settings\.buckets: .*--new-settings"
        ):
            Journal(path, changed, resume=True, reusable=("settings",))
        assert path.read_bytes() == before
        told: list[tuple[dict, bytes]] = []  # the old header, and the file when the caller is told (not yet rewritten)
        journal = Journal(
            path,
            changed,
            resume=True,
            reusable=("settings",),
            on_new_settings=lambda old: told.append((old, path.read_bytes())),
        )
        assert told == [(header, before)]
        assert journal.lookup("1") == 0.5
        assert "settings.seed: 0 → 1" in caplog.text and "settings.buckets: [0, 0.5, 1] → [0, 0.25" in caplog.text
        assert lines_of(path) == [{"journal": "bosch-journal/1", "header": changed}, {"key": "1", "score": 0.5}]
        with pytest.raises(JournalError, match="header field 'model'"):
            Journal(path, dict(changed, model="other"), resume=True, reusable=("settings",))

    def test_wall_time_adds_up_over_resumes(self, tmp_path: Path) -> None:
        path = tmp_path / "j.jsonl"
        with mock.patch("bosch_eval.search.journal.store.time.perf_counter", side_effect=[100.0, 102.5]):
            Journal(path, HEADER, resume=False, wall_time=True).append("a", 0.5)
        with mock.patch("bosch_eval.search.journal.store.time.perf_counter", side_effect=[500.0, 501.0]):
            journal = Journal(path, HEADER, resume=True, wall_time=True)
            assert journal.prior_wall_s == 2.5
            journal.append("b", 0.5)
        assert [line.get("wall_s") for line in lines_of(path)] == [None, 2.5, 3.5]
        assert Journal(path, HEADER, resume=True).prior_wall_s == 3.5

    def test_field_missing_from_this_search(self, tmp_path: Path) -> None:
        path = tmp_path / "j.jsonl"
        Journal(path, HEADER, resume=False)
        header = {name: value for name, value in HEADER.items() if name != "variant"}
        with pytest.raises(JournalError, match="'variant' is \"bosch\" in the journal but \\(absent\\)"):
            Journal(path, header, resume=True)

    def test_duplicate_key(self, tmp_path: Path) -> None:
        path = tmp_path / "j.jsonl"
        Journal(path, HEADER, resume=False).append("10", 0.5)
        journal = Journal(path, HEADER, resume=True)
        with pytest.raises(JournalError, match="mask 10 is already journaled"):
            journal.append("10", 0.25)
        assert len(lines_of(path)) == 2

    @pytest.mark.parametrize(
        ("args", "fields", "message"),
        [
            (("", 0.5), {}, "non-empty string"),
            (("1", "0.5"), {}, "must be a number"),
            (("1", True), {}, "must be a number"),
            (("1", 0.5), {"when": object()}, "not JSON-serializable"),
        ],
    )
    def test_bad_records(self, tmp_path: Path, args: tuple, fields: dict, message: str) -> None:
        journal = Journal(tmp_path / "j.jsonl", HEADER, resume=False)
        with pytest.raises(JournalError, match=message):
            journal.append(*args, **fields)
        assert len(journal) == 0 and len(lines_of(tmp_path / "j.jsonl")) == 1

    def test_header_must_be_json(self, tmp_path: Path) -> None:
        with pytest.raises(JournalError, match="header: not JSON-serializable"):
            Journal(tmp_path / "j.jsonl", {"path": Path("x")}, resume=False)
        assert not (tmp_path / "j.jsonl").exists()


class TestReadOnly:
    def test_leaves_no_file(self, tmp_path: Path) -> None:
        path = tmp_path / "j.jsonl"
        journal = Journal(path, HEADER, resume=False, writable=False)
        journal.append("1", 0.5)
        assert journal.lookup("1") == 0.5 and len(journal) == 1
        with pytest.raises(JournalError, match="already journaled"):
            journal.append("1", 0.5)
        assert not path.exists()

    def test_reads_but_never_repairs(self, tmp_path: Path) -> None:
        path = tmp_path / "j.jsonl"
        Journal(path, HEADER, resume=False).append("1", 0.5)
        damaged = path.read_bytes() + b'{"key": "0", "sc'
        path.write_bytes(damaged)
        journal = Journal(path, HEADER, resume=True, writable=False)
        journal.append("0", 0.25)
        assert [r["key"] for r in journal.records] == ["1", "0"]
        assert path.read_bytes() == damaged


class TestExampleValues:
    """Per-example values of a racing search: what a resume replays instead of scoring."""

    def test_values_and_bounds_read_back(self, tmp_path: Path) -> None:
        path = tmp_path / "j.jsonl"
        journal = Journal(path, HEADER, resume=False)
        journal.append_values("10/01", "calib", {3: 1.0, 17: 0.0})
        journal.append_values("10/01", "calib", {5: 1.0})
        journal.append_bound("10/01", 0.75, examples=3)
        assert lines_of(path)[1] == {"key": "10/01", "values": {"3": 1.0, "17": 0.0}, "task": "calib"}
        again = Journal(path, HEADER, resume=True)
        assert again.examples == {"10/01": {"calib": {3: 1.0, 17: 0.0, 5: 1.0}}}
        assert again.records == [] and again.bounds == {"10/01": 0.75}
        assert again.has_bound("10/01", 0.75, 3) and not again.has_bound("10/01", 0.75, 4)

    def test_a_document_with_another_value_is_refused(self, tmp_path: Path) -> None:
        journal = Journal(tmp_path / "j.jsonl", HEADER, resume=False)
        journal.append_values("10", "calib", {3: 1.0})
        journal.append_values("10", "calib", {3: 1.0})  # the same value again contradicts nothing
        with pytest.raises(JournalError, match="mask 10, calib document 3 is journaled with value 1.0, not 0.0"):
            journal.append_values("10", "calib", {3: 0.0})

    def test_values_are_written_in_document_order(self, tmp_path: Path) -> None:
        # N processes gather a chunk's documents rank by rank; the record is the one process's.
        path = tmp_path / "journal.jsonl"
        Journal(path, HEADER, resume=False).append_values("10", "calib", {17: 0.0, 3: 1.0, 8: 1.0})
        assert path.read_text().splitlines()[1].startswith('{"key": "10", "values": {"3": 1.0, "8": 1.0, "17": 0.0}')

    def test_a_contradicting_values_record_is_damage_named_by_line(self, tmp_path: Path) -> None:
        path = tmp_path / "j.jsonl"
        Journal(path, HEADER, resume=False).append_values("10", "calib", {3: 1.0})
        with path.open("a") as handle:
            handle.write(json.dumps({"key": "10", "task": "calib", "values": {"3": 0.0}}) + "\n")
            handle.write(json.dumps({"key": "11", "score": 0.5}) + "\n")
        with pytest.raises(JournalError, match="line 3: mask 10, calib document 3 appears twice with different values"):
            Journal(path, HEADER, resume=True)

    @pytest.mark.parametrize(
        ("record", "message"),
        [({"key": "1", "values": {"0": 1.0}}, "field 'task'"), ({"key": "1", "task": "t", "values": {"a": 1.0}}, "document index"),
         ({"key": "1", "task": "t", "values": {"0": "1"}}, "document 0: value '1'"), ({"key": "1", "task": "t", "values": {}}, "no values")],
    )  # fmt: skip
    def test_a_bad_values_record_is_named(self, tmp_path: Path, record: dict, message: str) -> None:
        path = tmp_path / "j.jsonl"
        Journal(path, HEADER, resume=False).append("0", 0.5)
        with path.open("a") as handle:
            handle.write(json.dumps(record) + "\n")
            handle.write(json.dumps({"key": "11", "score": 0.5}) + "\n")
        with pytest.raises(JournalError, match=f"line 3: .*{message}"):
            Journal(path, HEADER, resume=True)
