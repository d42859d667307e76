"""Small random-weight decoders with a freshly trained byte-level BPE tokenizer.

For tests, benchmarks and the quick start, where no model hub is reachable: the
checkpoint directory they write loads with ``AutoModelForCausalLM.from_pretrained`` and
``--model_args pretrained=<dir>`` like any Hugging Face model. The weights are random,
so scores measure plumbing, not quality.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedModel, PreTrainedTokenizerFast

# Decoder families that dispatch through AttentionInterface: GQA with H = 2G and 4G, and
# multi-head attention (GPT-2 has no num_key_value_heads: G = H; Mistral with G = H).
FAMILIES: dict[str, dict[str, Any]] = {
    "qwen3": dict(model_type="qwen3", num_attention_heads=8, num_key_value_heads=4, head_dim=16),
    "llama": dict(model_type="llama", num_attention_heads=8, num_key_value_heads=2, head_dim=16),
    "qwen2": dict(model_type="qwen2", num_attention_heads=4, num_key_value_heads=2),
    "mistral": dict(model_type="mistral", num_attention_heads=4, num_key_value_heads=4, head_dim=16),
    "gpt2": dict(model_type="gpt2", num_attention_heads=4),
}

_TOKENIZER_TEXT = [
    "The quick brown fox jumps over the lazy dog.",
    "A needle hides in the haystack: the special magic number is 7 3 1.",
    "What colour is the box? It is red, green, blue, yellow, black or white.",
]


def random_model(family: str = "qwen3", num_layers: int = 3, seed: int = 0, **overrides: Any) -> PreTrainedModel:
    """A random fp32 decoder of ``family`` (see :data:`FAMILIES`), in eval mode.

    The init is 5× transformers' default so attention is far from uniform (an SWA mask
    visibly changes the output) while fp32 logits stay O(1).
    """
    spec = dict(FAMILIES[family])
    fields: dict[str, Any] = dict(
        vocab_size=300,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=num_layers,
        max_position_embeddings=512,
        tie_word_embeddings=False,
        attn_implementation="sdpa",
        initializer_range=0.1,
    )
    fields.update({key: value for key, value in spec.items() if key != "model_type"})
    fields.update(overrides)
    torch.manual_seed(seed)
    config = AutoConfig.for_model(spec["model_type"], **fields)
    return AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()


def train_tokenizer(vocab_size: int = 300) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer (any text encodes) trained on a few sentences."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=["<pad>", "<eos>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tokenizer.train_from_iterator(_TOKENIZER_TEXT * 20, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token="<pad>", eos_token="<eos>")


def save_random_checkpoint(path: str | Path, family: str = "qwen3", seed: int = 0, **overrides: Any) -> Path:
    """Write a random model and its tokenizer to ``path`` as a Hugging Face checkpoint."""
    path = Path(path)
    tokenizer = train_tokenizer()
    model = random_model(family, seed=seed, vocab_size=len(tokenizer), **overrides)
    model.config.eos_token_id = tokenizer.eos_token_id
    model.config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path
