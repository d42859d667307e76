"""Heads permuted by kind in the weights (``hybridize(..., by_kind=True)``): the same model,
each layer's full and SWA groups one run each, undone on restore, kept right through
set_mask, state_dict / save_pretrained / load_state_dict and KV quantization."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from bosch_eval.attention.head_order import by_kind
from bosch_eval.attention.hybrid_attention import hybrid_state, hybridize
from bosch_eval.caches.hybrid_cache import HybridCache
from bosch_eval.caches.kv_quant.config import KVQuantConfig
from bosch_eval.masks.head_mask import HeadMask, ModelShape
from bosch_eval.models.random_model import random_model
from bosch_eval.runtime.errors import SettingsError
from tests.helpers import left_padded_batch

ROWS = [[1, 1, 1, 1], [0, 1, 0, 0], [0, 0, 0, 0], [1, 0, 1, 0]]
OTHER = [[0, 1, 1, 0], [1, 1, 0, 0], [1, 0, 0, 1], [0, 0, 0, 0]]
# Every family with separate q/k/v/o projections, at 4 KV groups (qwen2: biases on q/k/v).
FAMILIES = {
    "qwen3": {},
    "llama": {"num_key_value_heads": 4},
    "qwen2": {"num_attention_heads": 8, "num_key_value_heads": 4},
    "mistral": {},
}
FP32 = {"atol": 1e-5, "rtol": 0}


def model_of(family: str = "qwen3"):
    return random_model(family, num_layers=4, seed=5, **FAMILIES[family])


def mask_of(model, rows=ROWS, sinks: int = 2) -> HeadMask:
    return HeadMask.from_rows(rows, ModelShape.from_config(model.config).num_heads, window=6, sinks=sinks)


def weights(model) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def generate(model, ids, attention, **cache):
    return model.generate(
        input_ids=ids, attention_mask=attention, past_key_values=HybridCache.for_model(model, **cache), max_new_tokens=24,
        min_new_tokens=24, do_sample=False, pad_token_id=0,
    )  # fmt: skip


def test_the_order_makes_each_kind_one_run_and_leaves_runs_alone():
    assert by_kind((1, 0, 1, 0)) == (0, 2, 1, 3)
    assert by_kind((0, 1, 0, 0)) == (1, 0, 2, 3)
    for bits in [(1, 1, 1, 1), (0, 0, 0, 0), (1, 1, 0, 0), (0, 0, 1, 1), (0, 1, 1, 1)]:
        assert by_kind(bits) == (0, 1, 2, 3)


@pytest.mark.parametrize("family", sorted(FAMILIES))
@torch.no_grad()
def test_permuted_model_equals_the_unpermuted_hybrid_and_restores_bit_for_bit(family):
    model = model_of(family)
    before = weights(model)
    mask = mask_of(model)
    ids, attention = left_padded_batch(model.config.vocab_size, [20, 9, 14], seed=2)
    with hybridize(model, mask, backend="blocked"):
        expected = model(input_ids=ids, attention_mask=attention).logits
        tokens = generate(model, ids, attention)
    with hybridize(model, mask, backend="blocked", by_kind=True) as hybrid:
        assert any(not torch.equal(before[name], p) for name, p in model.named_parameters())  # really permuted
        splits = [hybrid.layer_split(layer) for layer in range(4)]
        assert all(len(split.full) <= 1 and len(split.swa) <= 1 for split in splits)
        got = model(input_ids=ids, attention_mask=attention).logits
        assert torch.equal(generate(model, ids, attention), tokens)
        # state_dict (what save_pretrained and export write) is in the model's order.
        assert all(torch.equal(before[name], value) for name, value in model.state_dict().items() if name in before)
    torch.testing.assert_close(got[attention.bool()], expected[attention.bool()], **FP32)
    assert all(torch.equal(before[name], p) for name, p in model.named_parameters())  # restored bit for bit


@torch.no_grad()
def test_set_mask_permutes_again_and_an_all_full_mask_touches_no_weight():
    model = model_of()
    before = weights(model)
    ids, attention = left_padded_batch(model.config.vocab_size, [18, 7], seed=3)
    with hybridize(model, mask_of(model, OTHER), backend="sdpa"):
        expected = model(input_ids=ids, attention_mask=attention).logits
    plain = model(input_ids=ids, attention_mask=attention).logits
    with hybridize(model, mask_of(model), backend="sdpa", by_kind=True) as hybrid:
        hybrid.set_mask(mask_of(model, OTHER))
        got = model(input_ids=ids, attention_mask=attention).logits
        hybrid.set_mask(HeadMask.uniform(ModelShape.from_config(model.config), full=True, window=6))
        assert all(torch.equal(before[name], p) for name, p in model.named_parameters())
        assert torch.equal(model(input_ids=ids, attention_mask=attention).logits, plain)  # no-SWA: bit for bit
    torch.testing.assert_close(got[attention.bool()], expected[attention.bool()], **FP32)


@torch.no_grad()
def test_save_and_load_state_dict_in_the_models_order(tmp_path):
    model = model_of()
    before = weights(model)
    ids, attention = left_padded_batch(model.config.vocab_size, [12, 12], seed=4)
    with hybridize(model, mask_of(model), backend="blocked", by_kind=True):
        expected = model(input_ids=ids, attention_mask=attention).logits
        model.save_pretrained(tmp_path / "saved")
        state = {name: value.clone() for name, value in model.state_dict().items()}
        model.load_state_dict(state)  # taken in the model's order, stored permuted again
        torch.testing.assert_close(model(input_ids=ids, attention_mask=attention).logits, expected, atol=0, rtol=0)
    saved = AutoModelForCausalLM.from_pretrained(tmp_path / "saved")
    assert all(torch.equal(before[name], p) for name, p in saved.named_parameters())


@torch.no_grad()
def test_kv_quantization_on_the_permuted_model():
    """The quantized store holds the full groups in the same order either way (full groups
    first, each in the model's order), so it quantizes the same values."""
    model = model_of()
    mask = mask_of(model, sinks=0)
    ids, attention = left_padded_batch(model.config.vocab_size, [30, 16], seed=5)
    quant = {"kv_quant": KVQuantConfig("kivi", bits=4, window=4, group_size=8)}
    with hybridize(model, mask, backend="blocked"):
        tokens = generate(model, ids, attention, **quant)
    with hybridize(model, mask, backend="blocked", by_kind=True):
        assert torch.equal(generate(model, ids, attention, **quant), tokens)


@torch.no_grad()
def test_bf16_within_the_unpatched_models_own_bf16_error():
    model = model_of()
    mask = mask_of(model)
    ids, attention = left_padded_batch(model.config.vocab_size, [24, 11], seed=6)
    real = attention.bool()
    with hybridize(model, mask, backend="blocked"):
        exact = model(input_ids=ids, attention_mask=attention).logits[real]
    floor = (
        model.to(torch.bfloat16)(input_ids=ids, attention_mask=attention).logits.float()
        - model.float()(input_ids=ids, attention_mask=attention).logits
    )[real]
    model.to(torch.bfloat16)
    with hybridize(model, mask, backend="blocked", by_kind=True):
        error = (model(input_ids=ids, attention_mask=attention).logits.float()[real] - exact).abs().max()
    assert error <= 2 * floor.abs().max()


def test_a_family_without_separate_projections_is_refused_and_left_as_it_was():
    model = random_model("gpt2", num_layers=2, seed=1)
    shape = ModelShape.from_config(model.config)
    rows = [[1, 0, 1, 0], [0, 0, 0, 0]]
    with pytest.raises(SettingsError, match="by_kind"):
        hybridize(model, HeadMask.from_rows(rows, shape.num_heads, window=4), backend="sdpa", by_kind=True)
    assert not hasattr(model, "bosch_hybrid") and model.config._attn_implementation == "sdpa"
    with pytest.raises(RuntimeError, match="not hybridized"):
        hybrid_state(model)
