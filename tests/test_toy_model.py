"""The bundled toy model: the shape the issue asks for, loadable by path, and found by the CLI."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from bosch_eval.model_defaults import model_defaults
from bosch_eval.toy import MODEL_DIR, model_path, resolve_model


def test_architecture_is_a_small_gqa_qwen3():
    config = AutoConfig.from_pretrained(model_path())
    assert config.model_type == "qwen3"
    assert config.num_hidden_layers >= 4
    assert config.num_key_value_heads >= 4 and config.num_attention_heads >= 2 * config.num_key_value_heads
    assert config.max_position_embeddings >= 1024
    assert 1000 <= config.vocab_size <= 10_000


def test_weights_fit_the_repo_budget():
    assert sum(path.stat().st_size for path in MODEL_DIR.iterdir()) <= 10 * 2**20


def test_loads_by_path_and_its_tokenizer_encodes_any_text():
    model = AutoModelForCausalLM.from_pretrained(model_path())
    tokenizer = AutoTokenizer.from_pretrained(model_path())
    text = "Zürich 東京 — 1234567 tokens?"
    ids = tokenizer(text)["input_ids"]
    assert tokenizer.decode(ids) == text
    assert model(**tokenizer(text, return_tensors="pt")).logits.shape[-1] == len(tokenizer)


def test_defaults_and_card_are_shipped():
    defaults = model_defaults(model_path())
    assert (defaults.window, defaults.calib_len) == (32, 1024)
    training = json.loads((MODEL_DIR / "training.json").read_text())
    assert training["wall_time_s"] > 0 and "final" in training
    assert "bosch-eval toy-model --path" in (MODEL_DIR / "README.md").read_text()


def test_cli_prints_the_path():
    out = subprocess.run([sys.executable, "-m", "bosch_eval.cli", "toy-model", "--path"], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == str(MODEL_DIR)


def test_missing_weights_are_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setattr("bosch_eval.toy.MODEL_DIR", tmp_path)
    with pytest.raises(FileNotFoundError, match="model.safetensors"):
        model_path()


def test_toy_alias_names_the_bundled_model():
    assert resolve_model("toy") == str(MODEL_DIR)
    assert resolve_model("Qwen/Qwen3-1.7B-Base", check=False) == "Qwen/Qwen3-1.7B-Base"
