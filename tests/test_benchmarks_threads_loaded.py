"""benchmarks/threads_loaded.py at tiny sizes: a child interpreter times the model with the
thread count it names (checked against torch's), and the table and ratios print."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))  # the scripts are run as files, not installed

import threads_loaded  # noqa: E402


def test_a_run_prints_every_configuration_and_the_ratios(monkeypatch, capsys):
    monkeypatch.setattr(threads_loaded.os, "sched_getaffinity", lambda pid: {0, 1})
    asked = []
    monkeypatch.setattr(
        threads_loaded, "measure", lambda threads, busy, args: asked.append((threads, busy)) or threads + busy
    )
    argv = ["--model", "toy", "--length", "16", "--batch", "2", "--rounds", "2", "--forwards", "1"]
    monkeypatch.setattr(sys, "argv", ["threads_loaded.py", *argv])
    threads_loaded.main()
    out = capsys.readouterr().out
    assert asked == [(1, False), (1, True), (2, False), (2, True)] * 2  # interleaved, round after round
    assert out.startswith("toy, float32, 2 × 16 tokens; 2 usable cores")
    assert "| 2 | yes | 3.0000 | 3.0000, 3.0000 |" in out
    assert "1 thread(s): busy / idle = 2.00" in out and "2 thread(s): busy / idle = 1.50" in out


@pytest.mark.slow
def test_a_child_times_the_model_with_the_threads_it_was_given():
    args = threads_loaded.argparse.Namespace(model="toy", dtype="float32", batch=2, forwards=1, length=16)
    assert 0 < threads_loaded.measure(1, False, args) < 60


def test_a_child_that_runs_another_thread_count_is_an_error(monkeypatch):
    class Finished:
        stdout = "0.01 3\n"

    monkeypatch.setattr(threads_loaded.subprocess, "run", lambda *a, **k: Finished())
    args = threads_loaded.argparse.Namespace(model="toy", dtype="float32", batch=1, forwards=1, length=16)
    with pytest.raises(RuntimeError, match="torch ran 3 threads, expected 2"):
        threads_loaded.measure(2, False, args)
