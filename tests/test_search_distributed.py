"""The whole search under a real two-process ``accelerate launch`` on CPU (gloo): the same
mask and the same journal as one process, and only the main process writes.

Scores are perplexities of a random model (see ``test_search_cli.py``): each process sums
its own shard, so two processes add the same log-likelihoods in another order and a
score may differ from the one-process score in its last bits, never enough to change a
decision.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bosch_eval.masks.head_mask import HeadMask
from tests.helpers import PROCESSES, free_port, search_args, write_tasks

pytestmark = pytest.mark.slow  # spawns accelerate processes


def journal(out: Path) -> list[tuple[str, float]]:
    lines = [json.loads(line) for line in (out / "journal.jsonl").read_text().splitlines()]
    return [(record["key"], record["score"]) for record in lines if "key" in record]


def test_two_processes_find_the_one_process_mask(tiny_model_dir: Path, tmp_path: Path) -> None:
    task_dir = write_tasks(tmp_path / "tasks")
    launched = tmp_path / "two"
    command = [
        sys.executable, "-m", "accelerate.commands.launch",
        "--multi_gpu", "--num_processes", str(PROCESSES), "--num_machines", "1",
        "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", str(free_port()),
        "-m", "bosch_eval.search", *search_args(tiny_model_dir, task_dir, launched)[1:], "--device", "cpu",
    ]  # fmt: skip
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600, check=False)
    assert result.returncode == 0, result.stderr[-4000:]
    assert result.stdout.count("mask.json: S =") == 1  # only the main process reports

    # One process, fresh as each launched one and with its environment (one thread: the same float
    # sums per document); run in this test process it read state earlier tests left behind.
    one = [sys.executable, "-m", "bosch_eval.search", *search_args(tiny_model_dir, task_dir, tmp_path / "one")[1:]]
    alone = subprocess.run([*one, "--device", "cpu"], capture_output=True, text=True, env=env, timeout=600, check=False)
    assert alone.returncode == 0, alone.stderr[-4000:]

    assert HeadMask.load(launched / "mask.json").bits == HeadMask.load(tmp_path / "one" / "mask.json").bits
    two, one = journal(launched), journal(tmp_path / "one")
    assert [key for key, _ in two] == [key for key, _ in one]
    assert [score for _, score in two] == pytest.approx([score for _, score in one], rel=1e-9)
    provenance = json.loads((launched / "mask.json").read_text())["provenance"]
    assert provenance["processes"] == PROCESSES
    # The main process alone locked --out (the lock file is emptied on release, never deleted).
    assert sorted(path.name for path in launched.iterdir()) == [
        ".bosch-search.lock",
        "journal.jsonl",
        "mask.json",
        "rankings",  # the incumbents' rankings, computed on the main process (the task is a calibration set)
        "report.md",
    ]
    assert (launched / ".bosch-search.lock").read_text() == ""


def test_two_processes_race_masks_in_parallel_to_the_one_process_journal(tmp_path: Path) -> None:
    """Racing on the toy model: the two processes score different masks (or halves of a
    chunk) at once; mask, per-example values, scores and bounds are those of one process."""
    args = ["--model", "toy", "--ratio", "0.75", "--calib-examples", "8", "--race-chunk", "2", "--device", "cpu"]
    launched = tmp_path / "two"
    command = [
        sys.executable, "-m", "accelerate.commands.launch",
        "--multi_gpu", "--num_processes", str(PROCESSES), "--num_machines", "1",
        "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", str(free_port()),
        "-m", "bosch_eval.search", *args, "--out", str(launched),
    ]  # fmt: skip
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600, check=False)
    assert result.returncode == 0, result.stderr[-4000:]
    # One process, fresh and with the launched processes' environment (one thread each).
    one = [sys.executable, "-m", "bosch_eval.search", *args, "--out", str(tmp_path / "one")]
    alone = subprocess.run(one, capture_output=True, text=True, env=env, timeout=600, check=False)
    assert alone.returncode == 0, alone.stderr[-4000:]

    def records(out: Path) -> list[dict]:
        lines = [json.loads(line) for line in (out / "journal.jsonl").read_text().splitlines()[1:]]
        return [
            {k: v for k, v in record.items() if k in ("key", "values", "score", "bound", "examples")}
            for record in lines
        ]

    assert HeadMask.load(launched / "mask.json").bits == HeadMask.load(tmp_path / "one" / "mask.json").bits
    two, one = records(launched), records(tmp_path / "one")
    # Under acc_tiebreak (the default) S is a mean of probabilities: lm-eval gathers the two
    # processes' examples in another order, and the sum may differ in its last bit.
    assert [{**r, "score": pytest.approx(r["score"], rel=1e-12)} if "score" in r else r for r in one] == two
    assert any("bound" in record for record in two)
