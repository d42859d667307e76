"""A tiny Llama written as a GGUF file with the ``gguf`` package's writer, for the conversion tests.

The file is what llama.cpp's ``convert_hf_to_gguf.py`` would write for the same model, reduced to
what transformers' GGUF loader reads: the ``llama.*`` hyperparameters, a byte-level BPE
tokenizer (``tokenizer.ggml.model = "gpt2"``: tokens, token types, merges, special ids) and
the tensors under GGUF names. llama.cpp stores q/k projections with the rows of each head
interleaved for its rotary kernel (``LlamaModel.permute`` in ``convert_hf_to_gguf.py``), and
transformers undoes that on load; writing the permuted rows here is what lets a test compare
the converted model's logits with the source model's.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from transformers import PreTrainedModel, PreTrainedTokenizerFast

from bosch_eval.models.random_model import random_model, train_tokenizer

CONTROL, NORMAL = 3, 1  # gguf.TokenType values


def _permute(weights: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's q/k row order: per head, the two rotary halves interleaved."""
    return (
        weights.reshape(heads, 2, weights.shape[0] // heads // 2, *weights.shape[1:])
        .swapaxes(1, 2)
        .reshape(weights.shape)
    )


def tiny_llama(num_layers: int = 2, seed: int = 0) -> tuple[PreTrainedModel, PreTrainedTokenizerFast]:
    """A random fp32 Llama (8 heads, 2 KV groups) and the byte-level BPE tokenizer it reads."""
    tokenizer = train_tokenizer()
    model = random_model(
        "llama", num_layers=num_layers, seed=seed, vocab_size=len(tokenizer), max_position_embeddings=256
    )
    model.config.eos_token_id = model.config.pad_token_id = tokenizer.eos_token_id
    model.config.bos_token_id = tokenizer.eos_token_id
    return model, tokenizer


def write_gguf(
    path: str | Path, model: PreTrainedModel, tokenizer: PreTrainedTokenizerFast, arch: str = "llama"
) -> Path:
    """Write ``model`` and ``tokenizer`` as one GGUF file (every tensor F32); ``arch`` names the
    architecture in the header (a test of an unsupported one passes another name)."""
    import gguf

    path = Path(path)
    config = model.config
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    writer = gguf.GGUFWriter(path, arch)
    writer.add_name("tiny-llama")
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_rope_dimension_count(config.head_dim)
    writer.add_rope_freq_base(float(config.rope_parameters["rope_theta"]))
    writer.add_layer_norm_rms_eps(float(config.rms_norm_eps))
    writer.add_vocab_size(config.vocab_size)

    state = json.loads(tokenizer.backend_tokenizer.to_str())
    vocab: dict[str, int] = state["model"]["vocab"]
    tokens = [token for token, _ in sorted(vocab.items(), key=lambda item: item[1])]
    special = set(tokenizer.all_special_tokens)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types([CONTROL if token in special else NORMAL for token in tokens])
    writer.add_token_merges(
        [merge if isinstance(merge, str) else " ".join(merge) for merge in state["model"]["merges"]]
    )
    writer.add_bos_token_id(tokenizer.eos_token_id)
    writer.add_eos_token_id(tokenizer.eos_token_id)
    writer.add_pad_token_id(tokenizer.pad_token_id)
    writer.add_add_bos_token(False)

    weights = {
        name: tensor.detach().to("cpu").numpy().astype(np.float32) for name, tensor in model.state_dict().items()
    }
    writer.add_tensor("token_embd.weight", weights["model.embed_tokens.weight"])
    for layer in range(config.num_hidden_layers):
        hf, blk = f"model.layers.{layer}.", f"blk.{layer}."
        writer.add_tensor(blk + "attn_norm.weight", weights[hf + "input_layernorm.weight"])
        writer.add_tensor(blk + "attn_q.weight", _permute(weights[hf + "self_attn.q_proj.weight"], heads))
        writer.add_tensor(blk + "attn_k.weight", _permute(weights[hf + "self_attn.k_proj.weight"], kv_heads))
        writer.add_tensor(blk + "attn_v.weight", weights[hf + "self_attn.v_proj.weight"])
        writer.add_tensor(blk + "attn_output.weight", weights[hf + "self_attn.o_proj.weight"])
        writer.add_tensor(blk + "ffn_norm.weight", weights[hf + "post_attention_layernorm.weight"])
        writer.add_tensor(blk + "ffn_gate.weight", weights[hf + "mlp.gate_proj.weight"])
        writer.add_tensor(blk + "ffn_up.weight", weights[hf + "mlp.up_proj.weight"])
        writer.add_tensor(blk + "ffn_down.weight", weights[hf + "mlp.down_proj.weight"])
    writer.add_tensor("output_norm.weight", weights["model.norm.weight"])
    if not config.tie_word_embeddings:  # a tied model has no output.weight (llama.cpp reuses token_embd)
        writer.add_tensor("output.weight", weights["lm_head.weight"])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
