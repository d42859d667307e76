"""A real two-process ``accelerate launch`` of the objective on CPU (gloo): each process
scores only its shard, and both return the one-process scores.

``accelerate launch --cpu`` starts one process unless given an MPI hostfile, so the test
launches with ``--multi_gpu`` and hides every GPU; ``build_objective(device="cpu")`` then
joins the processes over gloo (``bosch_eval.runtime.launch.launch_state``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tests.helpers import CALIB_METADATA, PROCESSES, free_port, score_masks, write_tasks

WORKER = Path(__file__).with_name("objective_worker.py")
pytestmark = pytest.mark.slow  # spawns accelerate processes


def launch(model_dir: Path, task_dir: Path, out_dir: Path) -> list[dict]:
    command = [
        sys.executable, "-m", "accelerate.commands.launch",
        "--multi_gpu", "--num_processes", str(PROCESSES), "--num_machines", "1",
        "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", str(free_port()),
        str(WORKER), str(model_dir), str(task_dir), str(out_dir),
    ]  # fmt: skip
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300, check=False)
    assert result.returncode == 0, result.stderr[-4000:]
    return [json.loads((out_dir / f"rank{rank}.json").read_text()) for rank in range(PROCESSES)]


def test_two_processes_split_each_call_and_agree_with_one(tiny_model_dir, tmp_path):
    task_dir = write_tasks(tmp_path / "tasks")
    started = time.perf_counter()
    ranks = launch(tiny_model_dir, task_dir, tmp_path)
    print(f"two-process launch: {time.perf_counter() - started:.1f} s")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as each launched process (OMP_NUM_THREADS=1): same float sums
    try:
        single = score_masks(str(tiny_model_dir), str(task_dir))
    finally:
        torch.set_num_threads(threads)

    documents = list(range(CALIB_METADATA["num_examples"]))
    assert single["world_size"] == 1 and single["docs"] == [documents] * 3
    assert [report["world_size"] for report in ranks] == [PROCESSES] * PROCESSES
    for rank, report in enumerate(ranks):
        assert report["rank"] == rank
        assert report["docs"] == [documents[rank::PROCESSES]] * 3  # its own shard, every call
        assert report["calls"] == 3
    # Every process returns process 0's score. Batch size 1: each document's log-likelihood is
    # the same float in any shard; lm-eval's mean then adds them in another order.
    assert ranks[0]["scores"] == ranks[1]["scores"]
    assert ranks[0]["scores"] == pytest.approx(single["scores"], rel=1e-12)
    assert len(set(single["scores"])) == 3
