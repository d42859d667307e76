"""One search per output directory: the lock, its take-over after a death, and two real
``bosch-eval search`` processes on one ``--out``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bosch_eval.runtime.errors import JournalError
from bosch_eval.runtime.outdir_lock import OutputLock, lock_file
from bosch_eval.search.journal.store import Journal
from tests.helpers import PPL_TASK, write_tasks

REPO = Path(__file__).resolve().parents[1]


def holder(out: Path) -> dict | None:
    path = out / lock_file("search")
    text = path.read_text() if path.exists() else ""
    return json.loads(text) if text else None


class TestOutputLock:
    def test_held_then_released(self, tmp_path: Path) -> None:
        with OutputLock(tmp_path / "out", "search", JournalError):
            assert holder(tmp_path / "out")["pid"] == os.getpid()
            with pytest.raises(
                JournalError, match=rf"another search \(PID {os.getpid()} on host .*\) is running on this --out"
            ):
                OutputLock(tmp_path / "out", "search", JournalError).acquire()
        assert holder(tmp_path / "out") is None
        with OutputLock(tmp_path / "out", "search", JournalError):  # free again
            pass

    @pytest.mark.slow
    def test_a_lock_held_by_another_live_process(self, tmp_path: Path) -> None:
        code = f"from bosch_eval.runtime.outdir_lock import OutputLock; OutputLock({str(tmp_path)!r}, 'search', RuntimeError).acquire(); print('held', flush=True); input()"
        child = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        try:
            assert child.stdout.readline().strip() == "held"
            with pytest.raises(JournalError, match=rf"PID {child.pid} "):
                OutputLock(tmp_path, "search", JournalError).acquire()
        finally:
            child.kill()
            child.wait()
        with OutputLock(tmp_path, "search", JournalError):  # the kernel released it when the holder died
            pass

    @pytest.mark.slow
    def test_a_lock_left_by_a_killed_process_is_taken_over_naming_its_pid(self, tmp_path: Path, caplog) -> None:
        code = f"import os; from bosch_eval.runtime.outdir_lock import OutputLock; OutputLock({str(tmp_path)!r}, 'search', RuntimeError).acquire(); os.kill(os.getpid(), 9)"
        dead = subprocess.run([sys.executable, "-c", code], check=False)
        assert dead.returncode == -signal.SIGKILL
        left = holder(tmp_path)
        assert left is not None and left["pid"] != os.getpid()
        with caplog.at_level("WARNING"), OutputLock(tmp_path, "search", JournalError):
            assert holder(tmp_path)["pid"] == os.getpid()
        assert f"taking over the lock left by PID {left['pid']} on host" in caplog.text


@pytest.mark.slow
def test_two_searches_on_one_out(tiny_model_dir: Path, tmp_path: Path) -> None:
    """A is stopped while it holds --out; B, started on the same --out with --resume, stops
    with a message naming A; A finishes; the journal is valid and resumes with nothing to do."""
    task_dir = write_tasks(tmp_path / "tasks")
    out = tmp_path / "run"
    argv = [
        sys.executable, "-m", "bosch_eval.search", "--model", str(tiny_model_dir), "--ratio", "0.5", "--out", str(out),
        "--budget-per-layer", "4", "--calib-tasks", PPL_TASK, "--include-path", str(task_dir), "--calib-metric", "perplexity",
        "--dtype", "float32", "--calib-examples", "3", "--calib-len", "320", "--window", "256", "--resume",
    ]  # fmt: skip
    env = dict(os.environ, OMP_NUM_THREADS="1")
    first = subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while (holder(out) or {}).get("pid") != first.pid:
            assert first.poll() is None and time.monotonic() < deadline, "the first search never took the lock"
            time.sleep(0.05)
        first.send_signal(signal.SIGSTOP)  # A holds the lock and stands still: B runs against it for sure
        second = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
        first.send_signal(signal.SIGCONT)
        assert second.returncode == 2
        assert (
            f"another search (PID {first.pid} on host" in second.stderr and "is running on this --out" in second.stderr
        )
        stdout, stderr = first.communicate(timeout=300)
    finally:
        first.kill()
        first.wait()
    assert first.returncode == 0, stderr
    header = json.loads((out / "journal.jsonl").read_text().splitlines()[0])["header"]
    journal = Journal(out / "journal.jsonl", header, resume=True, writable=False)
    keys = [record["key"] for record in journal.records]
    assert len(keys) == len(set(keys)) == json.loads((out / "mask.json").read_text())["provenance"]["evaluations"]
    again = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0 and "(0 in this run)" in again.stdout
