"""The bundled toy models (toy: 4 layers x 4 KV groups; toy-l: 8 x 8): the shapes the issues
ask for, loadable by path, and found by the CLI and the model resolver."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from bosch_eval.models.model_check import BUNDLED_MODELS, model_path, resolve_model
from bosch_eval.models.model_defaults import model_defaults

# alias -> (fewest layers, fewest KV groups, weights budget in MiB)
SHAPES = {"toy": (4, 4, 10), "toy-l": (8, 8, 20)}


@pytest.mark.parametrize("name", sorted(BUNDLED_MODELS))
def test_architecture_is_a_small_gqa_qwen3(name):
    layers, groups, _ = SHAPES[name]
    config = AutoConfig.from_pretrained(model_path(name))
    assert config.model_type == "qwen3"
    assert config.num_hidden_layers >= layers
    assert config.num_key_value_heads >= groups and config.num_attention_heads >= 2 * config.num_key_value_heads
    assert config.max_position_embeddings >= 1024
    assert 1000 <= config.vocab_size <= 10_000


@pytest.mark.parametrize("name", sorted(BUNDLED_MODELS))
def test_weights_fit_the_repo_budget(name):
    assert sum(path.stat().st_size for path in model_path(name).iterdir()) <= SHAPES[name][2] * 2**20


@pytest.mark.parametrize("name", sorted(BUNDLED_MODELS))
def test_loads_by_path_and_its_tokenizer_encodes_any_text(name):
    model = AutoModelForCausalLM.from_pretrained(model_path(name))
    tokenizer = AutoTokenizer.from_pretrained(model_path(name))
    text = "Zürich 東京 — 1234567 tokens?"
    ids = tokenizer(text)["input_ids"]
    assert tokenizer.decode(ids) == text
    assert model(**tokenizer(text, return_tensors="pt")).logits.shape[-1] == len(tokenizer)


@pytest.mark.parametrize("name", sorted(BUNDLED_MODELS))
def test_defaults_and_card_are_shipped(name):
    defaults = model_defaults(model_path(name))
    assert (defaults.window, defaults.calib_len) == (32, 1024)
    training = json.loads((model_path(name) / "training.json").read_text())
    assert training["wall_time_s"] > 0 and "final" in training
    assert "bosch-eval toy-model --path" in (model_path(name) / "README.md").read_text()


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(BUNDLED_MODELS))
def test_cli_prints_the_path(name):
    command = [sys.executable, "-m", "bosch_eval.cli", "toy-model", "--path", "--name", name]
    assert subprocess.run(command, capture_output=True, text=True, check=True).stdout.strip() == str(
        BUNDLED_MODELS[name]
    )


def test_missing_weights_are_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setitem(BUNDLED_MODELS, "toy-l", tmp_path)
    with pytest.raises(FileNotFoundError, match="'toy-l'.*model.safetensors"):
        model_path("toy-l")
    with pytest.raises(KeyError, match="'toy-xl' is not a bundled model; expected one of"):
        model_path("toy-xl")


@pytest.mark.parametrize("name", sorted(BUNDLED_MODELS))
def test_alias_names_the_bundled_model(name):
    assert resolve_model(name) == str(BUNDLED_MODELS[name])
    assert resolve_model("Qwen/Qwen3-1.7B-Base", check=False) == "Qwen/Qwen3-1.7B-Base"
