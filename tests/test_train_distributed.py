"""``bosch-eval train`` under a real two-process ``accelerate launch`` on CPU (gloo, DDP):
each process trains on its rows of every step's batch, so two processes end at the
one-process weights (up to float summation order), and the checkpoint loads with its mask."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from bosch_eval.train.trainer import train
from tests.helpers import MASK_SOURCE, PROCESSES, free_port, settings_for


@pytest.mark.slow  # spawns accelerate processes
def test_two_processes_train_like_one(tiny_model_dir, tmp_path):
    settings = settings_for(tiny_model_dir, steps=3)
    command = [
        sys.executable, "-m", "accelerate.commands.launch",
        "--multi_gpu", "--num_processes", str(PROCESSES), "--num_machines", "1",
        "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", str(free_port()),
        "-m", "bosch_eval.train", "--model", str(tiny_model_dir), "--mask-source", MASK_SOURCE, "--data", "toy",
        "--steps", "3", "--seq-len", "48", "--batch-size", "4", "--micro-batch-size", "2", "--lr", "1e-3",
        "--warmup-ratio", "0.25", "--weight-decay", "0.01", "--mixed-precision", "no", "--save-every", "2",
        "--no-progress-bar", "--out", str(tmp_path / "two"),
    ]  # fmt: skip
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600, check=False)
    assert result.returncode == 0, result.stderr[-4000:]
    assert result.stdout.count("hybrid checkpoint;") == 2  # every process returns; the main one alone wrote

    one = train(settings, tmp_path / "one", progress_bar=False)
    two, single = load_file(tmp_path / "two" / "model.safetensors"), load_file(one / "model.safetensors")
    for name in single:
        torch.testing.assert_close(two[name], single[name], rtol=1e-4, atol=1e-5, msg=name)
    assert json.loads((tmp_path / "two" / "training.json").read_text())["processes"] == PROCESSES
    assert (tmp_path / "two" / "state" / "step-00000002").is_dir()

    from bosch_eval.model_adapters.bosch import BoschLM

    lm = BoschLM(pretrained=str(tmp_path / "two"), device="cpu")
    assert lm.head_mask.bits == BoschLM(pretrained=str(one), device="cpu").head_mask.bits


def test_batch_must_split_over_processes(tiny_model_dir):
    from bosch_eval.runtime.errors import SettingsError

    assert settings_for(tiny_model_dir, batch_size=8, micro_batch_size=2).accumulation_steps(2) == 2
    with pytest.raises(
        SettingsError,
        match="--batch-size: 4 sequences per step is not a multiple of --micro-batch-size 3 × 2 processes",
    ):
        settings_for(tiny_model_dir, micro_batch_size=3).accumulation_steps(2)
