"""Tiny models built in the test session: no download, deterministic non-trivial weights."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedModel

# Three decoder families that dispatch through AttentionInterface, with GQA H = 2G and 4G.
FAMILIES = {
    "qwen3": dict(model_type="qwen3", num_attention_heads=8, num_key_value_heads=4, head_dim=16),
    "llama": dict(model_type="llama", num_attention_heads=8, num_key_value_heads=2, head_dim=16),
    "qwen2": dict(model_type="qwen2", num_attention_heads=4, num_key_value_heads=2),
}


def tiny_config(family: str, num_layers: int = 3, **overrides: object):
    spec = dict(FAMILIES[family])
    model_type = spec.pop("model_type")
    fields = dict(
        vocab_size=300,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=num_layers,
        max_position_embeddings=512,
        tie_word_embeddings=False,
        attn_implementation="sdpa",
    )
    fields.update(spec)
    fields.update(overrides)
    return AutoConfig.for_model(model_type, **fields)


def tiny_model(family: str, seed: int = 0, **overrides: object) -> PreTrainedModel:
    """A random-weight fp32 model; 5x the default init, so attention is far from uniform while fp32 logits stay O(1)."""
    torch.manual_seed(seed)
    config = tiny_config(family, initializer_range=0.1, **overrides)
    return AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()


def left_padded_batch(vocab: int, lengths: list[int], seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """Input ids and attention mask of rows with different lengths, left-padded."""
    generator = torch.Generator().manual_seed(seed)
    total = max(lengths)
    ids = torch.randint(3, vocab, (len(lengths), total), generator=generator)
    attention = torch.zeros(len(lengths), total, dtype=torch.long)
    for row, length in enumerate(lengths):
        attention[row, total - length :] = 1
        ids[row, : total - length] = 0
    return ids, attention


@pytest.fixture(scope="session")
def tiny_tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A byte-level BPE tokenizer trained here on a few sentences, saved as HF files."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<pad>", "<eos>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    text = ["The quick brown fox jumps over the lazy dog.", "A needle hides in the haystack: 7 3 1."] * 20
    tokenizer.train_from_iterator(text, trainer)
    wrapped = PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token="<pad>", eos_token="<eos>")
    path = tmp_path_factory.mktemp("tokenizer")
    wrapped.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory, tiny_tokenizer_dir: Path) -> Path:
    """A local Qwen3 checkpoint directory (weights + tokenizer), as a user would pass by path."""
    from transformers import AutoTokenizer

    path = tmp_path_factory.mktemp("tiny-qwen3")
    model = tiny_model("qwen3")
    tokenizer = AutoTokenizer.from_pretrained(tiny_tokenizer_dir)
    model.config.eos_token_id = tokenizer.eos_token_id
    model.config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path
