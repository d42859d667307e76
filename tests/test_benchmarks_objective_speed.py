"""benchmarks/objective_speed.py (the cost of one S() call per configuration) at tiny sizes: its
parsing of a configuration, the masks it asks for, and a whole run's table and numbers."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from bosch_eval.masks.head_mask import ModelShape

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))  # the scripts are run as files, not installed

import objective_speed  # noqa: E402

SHAPE = ModelShape(num_layers=4, num_heads=4, num_kv_heads=2)


def test_a_configuration_is_model_args():
    assert objective_speed.parse_config("dtype=bfloat16,layers=bme,ratio=0.75") == {
        "dtype": "bfloat16",
        "layers": "bme",
        "ratio": "0.75",
    }
    assert objective_speed.parse_config("") == {}


def test_mask_full_is_every_group_full_and_a_source_is_resolved_as_the_adapter_does():
    full = objective_speed.mask_of({"mask": "full"}, SHAPE, 16)
    assert full.num_swa_groups == 0 and full.window == 16
    bme = objective_speed.mask_of({"layers": "bme", "ratio": "0.5"}, SHAPE, 16)
    assert bme.num_swa_groups == 4 and bme.window == 16


def test_a_named_model_is_used_as_given(tmp_path):
    assert objective_speed.model_path("toy", tmp_path, 512) == "toy"
    assert list(tmp_path.iterdir()) == []


def test_a_run_writes_each_configuration_against_the_first(tiny_model_dir, tmp_path):
    out = tmp_path / "cost.md"
    configs = ["dtype=float32,mask=full", "dtype=float32,layers=bme,ratio=0.5"]
    argv = ["--model", str(tiny_model_dir), "--task", "bosch_niah_calib", "--examples", "2", "--seq-len", "320",
            "--batch-size", "2", "--repeats", "2", "--window", "32", "--configs", *configs, "--out", str(out)]  # fmt: skip
    assert objective_speed.main(argv) == 0
    numbers = json.loads(out.with_suffix(".json").read_text())
    assert numbers["argv"] == argv and [row["config"] for row in numbers["rows"]] == configs
    first, hybrid = numbers["rows"]
    assert first["vs_first"] == 1.0 and len(first["seconds"]) == len(hybrid["scores"]) == 2
    assert len(set(first["scores"])) == 1  # the same mask scores the same each repeat
    text = out.read_text()
    assert "python benchmarks/objective_speed.py --model" in text and f"| `{configs[1]}` |" in text
