"""Deploy-mode KV cache: generation equals recomputation, bytes equal the formula,
chunked prefill equals one-shot prefill."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import AutoModelForCausalLM

from bosch_eval.attention.hybrid_attention import hybridize
from bosch_eval.caches.hybrid_cache import HybridCache, HybridHeadLayer, allocated_bytes, kv_cache_bytes
from bosch_eval.caches.kv_quant.formula import KVLayout, kv_cache_bytes_formula
from bosch_eval.masks.head_mask import HeadMask, ModelShape
from bosch_eval.models.model_check import model_path
from bosch_eval.models.random_model import random_model
from tests.helpers import left_padded_batch

WINDOW = 8
MASKS = {
    "all_full": [[1, 1, 1, 1]] * 4,
    "all_swa": [[0, 0, 0, 0]] * 4,
    "mixed": [[1, 1, 1, 1], [0, 1, 0, 0], [0, 0, 0, 0], [1, 0, 1, 0]],
}


def hybrid_model(rows, backend="blocked", source="random", sinks=0):
    """A 4-layer, 8-head, 4-KV-group model: random weights, or the bundled toy model (same shape)."""
    model = (
        random_model("qwen3", num_layers=4, seed=5)
        if source == "random"
        else AutoModelForCausalLM.from_pretrained(model_path())
    )
    hybridize(model, HeadMask.from_rows(rows, 8, window=WINDOW, sinks=sinks), backend=backend)
    return model


def greedy_by_recomputation(model, ids, attention, new_tokens):
    """Search mode, no cache: the whole sequence through the model for every new token."""
    for _ in range(new_tokens):
        positions = (attention.cumsum(-1) - 1).clamp(min=0)
        with torch.no_grad():
            logits = model(input_ids=ids, attention_mask=attention, position_ids=positions).logits
        ids = torch.cat([ids, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
        attention = torch.cat([attention, torch.ones_like(attention[:, :1])], dim=1)
    return ids


@pytest.mark.parametrize(("source", "sinks"), [("random", 0), ("toy", 0), ("random", 3), ("toy", 4)])
@pytest.mark.parametrize("mask", sorted(MASKS))
def test_greedy_generation_with_hybrid_cache_equals_recomputation(mask, source, sinks):
    model = hybrid_model(MASKS[mask], source=source, sinks=sinks)
    ids, attention = left_padded_batch(model.config.vocab_size, [11, 5, 17], seed=2)
    cache = HybridCache.for_model(model)
    generated = model.generate(
        input_ids=ids, attention_mask=attention, past_key_values=cache, max_new_tokens=64, min_new_tokens=64,
        do_sample=False, pad_token_id=0,
    )  # fmt: skip
    assert torch.equal(generated, greedy_by_recomputation(model, ids, attention, 64))
    swa_layers = [layer for layer in cache.layers if isinstance(layer, HybridHeadLayer)]
    assert len(swa_layers) == sum(not all(row) for row in MASKS[mask])
    assert all(layer.ring.keys.shape[2] == sinks + WINDOW for layer in swa_layers)  # S sink slots and a ring of W


@pytest.mark.parametrize("backend", ["sdpa", "blocked", "flex"])
def test_decoding_past_the_sinks_and_window_equals_recomputation(backend, monkeypatch):
    """Every backend on the cache's non-contiguous SWA keys (sinks, then the recent run)."""
    monkeypatch.setattr("bosch_eval.attention.kernels.flex.compile_policy", False)
    model = hybrid_model(MASKS["mixed"], backend, sinks=2)
    ids, attention = left_padded_batch(model.config.vocab_size, [13, 6], seed=6)
    generated = model.generate(
        input_ids=ids, attention_mask=attention, past_key_values=HybridCache.for_model(model), max_new_tokens=20,
        min_new_tokens=20, do_sample=False, pad_token_id=0,
    )  # fmt: skip
    assert torch.equal(generated, greedy_by_recomputation(model, ids, attention, 20))


@pytest.mark.parametrize("sinks", [0, 2, 50])
@pytest.mark.parametrize("length", [3, WINDOW - 1, WINDOW, 40])
def test_cache_bytes_equal_the_formula_and_the_memory_held(length, sinks):
    model = hybrid_model(MASKS["mixed"], sinks=sinks)
    ids, _ = left_padded_batch(model.config.vocab_size, [length, length], seed=3)
    cache = HybridCache.for_model(model)
    with torch.no_grad():
        model(input_ids=ids, past_key_values=cache, use_cache=True)
    head_dim, dtype_size, batch = model.config.head_dim, 4, 2
    expected = sum(
        (row.count(1) * length + row.count(0) * (min(length, sinks) + min(max(length - sinks, 0), WINDOW - 1)))
        * 2
        * head_dim
        * dtype_size
        * batch
        for row in MASKS["mixed"]
    )
    assert kv_cache_bytes(cache) == expected
    formula = kv_cache_bytes_formula(
        MASKS["mixed"],
        KVLayout(4, 4, head_dim),
        length,
        window=WINDOW,
        dtype_bytes=dtype_size,
        batch=batch,
        sinks=sinks,
    )
    assert formula == expected
    # ... and the buffers allocated: the full groups at exactly the prefill's length (no capacity
    # asked for), the SWA groups' S + W slots; none is a view that pins the model's states.
    allocated = sum(
        (row.count(1) * length + row.count(0) * (sinks + WINDOW)) * 2 * head_dim * dtype_size * batch
        for row in MASKS["mixed"]
    )
    assert allocated_bytes(cache) == allocated
    for layer in cache.layers:
        if isinstance(layer, HybridHeadLayer):
            for stored in (layer.full.keys, layer.full.values, layer.ring.keys, layer.ring.values):
                assert stored.untyped_storage().nbytes() == stored.numel() * stored.element_size()


@pytest.mark.parametrize("backend", ["sdpa", "blocked", "flex"])
def test_chunked_prefill_equals_one_shot(backend, monkeypatch):
    """flex runs a mixed layer's chunk in one call over every group (tests/test_flex_compiles
    counts its graphs); once the SWA part dropped positions, its SWA heads over the part."""
    monkeypatch.setattr("bosch_eval.attention.kernels.flex.compile_policy", False)
    model = hybrid_model(MASKS["mixed"], backend)
    ids, _ = left_padded_batch(model.config.vocab_size, [45], seed=4)
    with torch.no_grad():
        expected = model(input_ids=ids).logits
        cache = HybridCache.for_model(model)
        chunks = [
            model(input_ids=chunk, past_key_values=cache, use_cache=True).logits for chunk in ids.split(10, dim=1)
        ]
    torch.testing.assert_close(torch.cat(chunks, dim=1), expected, atol=1e-5, rtol=0)


def test_cache_from_another_mask_is_an_error():
    model = hybrid_model(MASKS["mixed"])
    ids, _ = left_padded_batch(model.config.vocab_size, [6], seed=4)
    cache = HybridCache.for_model(model)
    model.bosch_hybrid.set_mask(HeadMask.uniform(ModelShape(4, 8, 4), full=False, window=WINDOW))
    with pytest.raises(RuntimeError, match="the KV cache was built for another mask"), torch.no_grad():
        model(input_ids=ids, past_key_values=cache, use_cache=True)


def test_decode_steps_read_only_the_window_in_swa_groups(monkeypatch):
    """At one query per step the SWA part holds exactly what the query sees: it runs the
    backend's plain (full) kernel over at most S + W keys and mask columns, never the
    windowed kernel, and nothing in it grows with the sequence; no mask at all once the
    padding and the sinks have left the ring."""
    from bosch_eval.attention.kernels import BACKENDS, Backend
    from bosch_eval.attention.kernels.blocked import blocked_swa_attention
    from bosch_eval.attention.kernels.reference import sdpa_full_attention

    calls = []

    def swa(module, query, key, value, attention_mask, local, **kwargs):
        calls.append(("windowed", query.shape[2], key.shape[2]))
        return blocked_swa_attention(module, query, key, value, attention_mask, local, **kwargs)

    def full(module, query, key, value, attention_mask, **kwargs):
        columns = None if attention_mask is None else attention_mask.shape[-1]
        calls.append(("plain", query.shape[2], key.shape[2], columns))
        return sdpa_full_attention(module, query, key, value, attention_mask, **kwargs)

    monkeypatch.setitem(BACKENDS.members, "recording", Backend(swa=swa, full=full))
    sinks, new_tokens = 2, 30
    model = hybrid_model(MASKS["all_swa"], "recording", sinks=sinks)
    ids, attention = left_padded_batch(model.config.vocab_size, [13, 6], seed=6)
    generated = model.generate(
        input_ids=ids, attention_mask=attention, past_key_values=HybridCache.for_model(model), max_new_tokens=new_tokens,
        min_new_tokens=new_tokens, do_sample=False, pad_token_id=0,
    )  # fmt: skip
    steps = [call for call in calls if call[1] == 1]
    assert len(steps) == (new_tokens - 1) * 4  # every decode step, every layer
    assert {call[0] for call in steps} == {"plain"}
    assert max(call[2] for call in steps) == max(call[3] or 0 for call in steps) == sinks + WINDOW
    assert steps[-1][3] is None  # once every slot holds what the query sees, a step passes no mask
    assert torch.equal(generated, greedy_by_recomputation(model, ids, attention, new_tokens))


class _OpNames(TorchDispatchMode):
    """The names of the aten ops a block runs."""

    def __init__(self) -> None:
        super().__init__()
        self.names: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(str(func.overloadpacket))
        return func(*args, **(kwargs or {}))


def test_per_row_sinks_are_searched_for_only_until_found():
    """A left-padded batch: the prefill finds each row's sinks (its first real tokens, by
    rank); once every slot holds its row's sink, a decode step keeps the slots as they are,
    with no search (no cumsum, searchsorted or gather): per-row sinks cost a step nothing."""
    model = hybrid_model(MASKS["mixed"], sinks=4)
    ids, attention = left_padded_batch(model.config.vocab_size, [30, 17], seed=2)
    positions = (attention.cumsum(-1) - 1).clamp(min=0)
    cache = HybridCache.for_model(model)
    with torch.no_grad(), _OpNames() as prefill:
        logits = model(
            input_ids=ids, attention_mask=attention, position_ids=positions, past_key_values=cache, use_cache=True
        ).logits
    assert "aten.searchsorted" in prefill.names
    assert all(layer.slots_final for layer in cache.layers if isinstance(layer, HybridHeadLayer))
    attention = torch.cat([attention, torch.ones_like(attention[:, :1])], dim=1)
    with torch.no_grad(), _OpNames() as step:
        model(
            input_ids=logits[:, -1:].argmax(-1),
            attention_mask=attention,
            position_ids=positions[:, -1:] + 1,
            past_key_values=cache,
            use_cache=True,
        )
    assert not {"aten.cumsum", "aten.searchsorted", "aten.gather"} & set(step.names)
