"""benchmarks/toy_model_checks.py (what the toy model's card promises, measured with lm-eval)
at tiny sizes: which RULER documents it keeps, what it asks lm-eval for, a whole run's files
(RULER's evaluation stubbed), and, slow, a whole run through lm-eval."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from bosch_eval.models.random_model import save_random_checkpoint

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))  # the scripts are run as files, not installed

import toy_model_checks  # noqa: E402


@pytest.fixture(scope="module")
def long_tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random model that holds RULER's 1024-token documents (the session's holds 512)."""
    return save_random_checkpoint(tmp_path_factory.mktemp("tiny-qwen3-2k"), max_position_embeddings=2048)


def run(model: Path, out: Path) -> tuple[list[str], dict[str, Any]]:
    argv = ["--model", str(model), "--out", str(out), "--window", "32", "--calib-len", "320", "--calib-examples", "4",
            "--random-masks", "2", "--random-ratios", "0.5", "--ruler-samples", "1"]  # fmt: skip
    toy_model_checks.main(argv)
    return argv, json.loads((out / "toy_model_checks.json").read_text())


def test_ruler_keeps_the_first_documents_of_each_length():
    # lm-eval orders niah_single_1's documents by length, 500 per length: a plain limit would keep 512 only.
    assert toy_model_checks.ruler_indices(2) == [0, 1, 500, 501]


def test_ruler_scores_full_attention_and_every_group_swa(monkeypatch):
    asked = []

    def simple_evaluate(**kwargs: Any) -> dict[str, Any]:
        asked.append(kwargs)
        return {"results": {"niah_single_1": {"512,none": 0.5, "1024,none": 0.25}}}

    monkeypatch.setattr(toy_model_checks.lm_eval, "simple_evaluate", simple_evaluate)
    scores = toy_model_checks.ruler_scores("m", 32, 2)
    assert scores == {"full": {"512": 0.5, "1024": 0.25}, "all_swa": {"512": 0.5, "1024": 0.25}}
    assert [kwargs["model_args"] for kwargs in asked] == [
        "pretrained=m,layers=intr,ratio=0.0,window=32,dtype=float32",
        "pretrained=m,layers=intr,ratio=1.0,window=32,dtype=float32",
    ]
    assert asked[0]["samples"] == {"niah_single_1": [0, 1, 500, 501]} and asked[0]["metadata"] == {
        "max_seq_lengths": [512, 1024]
    }


def test_a_run_writes_its_command_and_every_check(tiny_model_dir, tmp_path, monkeypatch, capsys):
    ruler = {"full": {"512": 1.0, "1024": 0.5}, "all_swa": {"512": 0.25, "1024": 0.0}}
    monkeypatch.setattr(toy_model_checks, "ruler_scores", lambda model, window, samples: ruler)
    argv, report = run(tiny_model_dir, tmp_path)
    assert report["command"].endswith("benchmarks/toy_model_checks.py " + " ".join(argv))
    assert (report["window"], report["calib_len"], report["niah_single_1"]) == (32, 320, ruler)
    calib = report["bosch_niah_calib"]
    assert len(calib["random"]["0.5"]) == 2 and calib["random_spread"]["0.5"] >= 0
    text = (tmp_path / "toy_model_checks.md").read_text()
    assert text in capsys.readouterr().out
    assert "| niah_single_1 @ 1024 | 0.500 | 0.000 |" in text and "2 random masks at ρ = 0.5" in text


@pytest.mark.slow  # RULER's niah_single_1 built and run twice through lm-eval: about a minute
def test_a_whole_run_through_lm_eval(long_tiny_model, tmp_path):
    _, report = run(long_tiny_model, tmp_path)
    assert set(report["niah_single_1"]) == {"full", "all_swa"} and set(report["niah_single_1"]["full"]) == {
        "512",
        "1024",
    }
