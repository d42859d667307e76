"""The preallocated hybrid cache: written in place (no buffer replaced per decode step),
prompts fed in chunks of any size (one token at a time included, padding and all) equal one
shot, beam search's reorders, with the heads permuted by kind and without."""

from __future__ import annotations

import pytest
import torch

from bosch_eval.attention.hybrid_attention import hybridize
from bosch_eval.caches.hybrid_cache import HybridCache, HybridHeadLayer, StaticFullLayer
from bosch_eval.masks.head_mask import HeadMask
from bosch_eval.models.random_model import random_model
from tests.helpers import left_padded_batch

ROWS = [[1, 1, 1, 1], [0, 1, 0, 0], [0, 0, 0, 0], [1, 0, 1, 0]]
WINDOW = 5
FP32 = {"atol": 1e-5, "rtol": 0}


def hybrid_model(sinks: int, by_kind: bool, backend: str = "blocked"):
    model = random_model("qwen3", num_layers=4, seed=9)
    hybridize(model, HeadMask.from_rows(ROWS, 8, window=WINDOW, sinks=sinks), backend=backend, by_kind=by_kind)
    return model


def buffers(cache: HybridCache) -> list[int]:
    pointers = []
    for layer in cache.layers:
        parts = [layer.buffer] if isinstance(layer, StaticFullLayer) else [layer.full, layer.ring]
        pointers += [t.data_ptr() for part in parts for t in (part.keys, part.values)]
    return pointers


@torch.no_grad()
def test_decode_steps_write_in_place():
    model = hybrid_model(sinks=2, by_kind=True)
    ids, attention = left_padded_batch(model.config.vocab_size, [12, 7], seed=1)
    cache = HybridCache.for_model(model, max_cache_len=12 + 20)
    logits = model(input_ids=ids, attention_mask=attention, past_key_values=cache, use_cache=True).logits
    before = buffers(cache)
    for _ in range(20):
        attention = torch.cat([attention, torch.ones_like(attention[:, :1])], dim=1)
        logits = model(
            input_ids=logits[:, -1:].argmax(-1), attention_mask=attention, past_key_values=cache, use_cache=True
        ).logits
    assert buffers(cache) == before
    assert all(layer.ring.keys.shape[2] == 2 + WINDOW for layer in cache.layers if isinstance(layer, HybridHeadLayer))
    # Without a capacity the full groups double when outgrown: a few reallocations, not one per step.
    grown = HybridCache.for_model(model)
    model(input_ids=ids, attention_mask=attention[:, :12], past_key_values=grown, use_cache=True)
    sizes = set()
    for _ in range(20):
        model(input_ids=ids[:, -1:], past_key_values=grown, use_cache=True)
        sizes.add(grown.layers[0].buffer.keys.shape[2])
    assert sizes == {24, 48}


@pytest.mark.parametrize("chunk", [1, 2, 7])
@pytest.mark.parametrize("by_kind", [False, True])
@pytest.mark.parametrize("sinks", [0, 3])
@torch.no_grad()
def test_a_prompt_in_chunks_equals_one_shot(sinks, by_kind, chunk):
    """Chunks shorter than the sinks and than the window, and one token at a time: decode
    steps whose keys are padding, sinks found one by one, the ring filled by padding first."""
    model = hybrid_model(sinks, by_kind)
    ids, attention = left_padded_batch(model.config.vocab_size, [19, 6, 13], seed=3)
    positions = (attention.cumsum(-1) - 1).clamp(min=0)
    expected = model(input_ids=ids, attention_mask=attention, position_ids=positions).logits
    cache = HybridCache.for_model(model)
    pieces = []
    for start in range(0, ids.shape[1], chunk):
        stop = start + chunk
        pieces.append(
            model(
                input_ids=ids[:, start:stop], attention_mask=attention[:, :stop], position_ids=positions[:, start:stop],
                past_key_values=cache, use_cache=True,
            ).logits
        )  # fmt: skip
    real = attention.bool()
    torch.testing.assert_close(torch.cat(pieces, dim=1)[real], expected[real], **FP32)


@pytest.mark.parametrize("by_kind", [False, True])
@torch.no_grad()
def test_beam_search_on_the_cache_equals_beam_search_recomputing(by_kind):
    """Beam search reorders and repeats the cache's rows (sink slots and their bookkeeping included)."""
    model = hybrid_model(sinks=2, by_kind=by_kind)
    ids, attention = left_padded_batch(model.config.vocab_size, [10, 4], seed=5)
    settings = {"max_new_tokens": 16, "min_new_tokens": 16, "num_beams": 3, "do_sample": False, "pad_token_id": 0}
    cached = model.generate(
        input_ids=ids, attention_mask=attention, past_key_values=HybridCache.for_model(model), **settings
    )
    recomputed = model.generate(input_ids=ids, attention_mask=attention, use_cache=False, **settings)
    assert torch.equal(cached, recomputed)
