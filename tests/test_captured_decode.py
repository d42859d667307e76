"""Captured decode steps (``HybridCache.for_model(..., captured=True)``): the eager cache's
tokens and logits, fixed shapes and addresses, and one compiled graph for every step."""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.testing import CompileCounter

from bosch_eval.attention.hybrid_attention import hybridize
from bosch_eval.caches.hybrid_cache import HybridCache
from bosch_eval.masks.head_mask import HeadMask
from bosch_eval.models.random_model import random_model
from bosch_eval.models.transformers_compat import cache_argument
from bosch_eval.runtime.errors import SettingsError
from tests.helpers import left_padded_batch

ROWS = [[1, 1, 1, 1], [0, 1, 0, 0], [0, 0, 0, 0], [1, 0, 1, 0]]
WINDOW = 5
STEPS = 14  # past the ring's wrap (W = 5) and past the sinks' window
FP32 = {"atol": 1e-5, "rtol": 0}


def hybrid_model(sinks: int, by_kind: bool, backend: str = "blocked"):
    model = random_model("qwen3", num_layers=4, seed=9)
    hybridize(model, HeadMask.from_rows(ROWS, 8, window=WINDOW, sinks=sinks), backend=backend, by_kind=by_kind)
    return model


@torch.no_grad()
def greedy(model, cache, ids, attention, steps: int, forward=None) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Prefill, then ``steps`` greedy one-token steps with the growing 2D mask; tokens and every step's logits."""
    step = forward or model
    logits = model(input_ids=ids, attention_mask=attention, past_key_values=cache, use_cache=True).logits[:, -1:]
    tokens, every = [logits.argmax(-1)], [logits]
    for _ in range(steps):
        attention = torch.cat([attention, torch.ones_like(attention[:, :1])], dim=1)
        logits = step(input_ids=tokens[-1], attention_mask=attention, past_key_values=cache, use_cache=True).logits[
            :, -1:
        ]
        tokens.append(logits.argmax(-1))
        every.append(logits)
    return torch.cat(tokens, dim=1), every


@pytest.mark.parametrize("by_kind", [False, True])
@pytest.mark.parametrize("sinks", [0, 3])
def test_captured_steps_equal_the_eager_cache(sinks, by_kind):
    model = hybrid_model(sinks, by_kind)
    # Row 1 has 2 real tokens: fewer than 3 sinks, so its decode steps take sinks in place.
    ids, attention = left_padded_batch(model.config.vocab_size, [9, 2], seed=1)
    eager_tokens, eager_logits = greedy(model, HybridCache.for_model(model), ids, attention, STEPS)
    cache = HybridCache.for_model(model, max_cache_len=9 + STEPS + 1, captured=True)
    tokens, logits = greedy(model, cache, ids, attention, STEPS)
    assert torch.equal(tokens, eager_tokens)
    for got, want in zip(logits, eager_logits, strict=True):
        torch.testing.assert_close(got, want, **FP32)
    assert int(cache.get_seq_length()) == 9 + STEPS


@pytest.mark.parametrize("backend", ["sdpa", "flex"])
def test_every_sdpa_format_backend_prefills_the_captured_cache_as_the_eager_one(backend, monkeypatch):
    """The prompt goes through the backend's own kernels (flex: its one call per layer), the
    steps through the full kernel on the capacity and the ring: the eager cache's tokens."""
    monkeypatch.setattr("bosch_eval.attention.kernels.flex.compile_policy", False)
    model = hybrid_model(sinks=2, by_kind=False, backend=backend)
    ids, attention = left_padded_batch(model.config.vocab_size, [9, 4], seed=5)
    want, want_logits = greedy(model, HybridCache.for_model(model), ids, attention, STEPS)
    got, logits = greedy(
        model, HybridCache.for_model(model, max_cache_len=9 + STEPS, captured=True), ids, attention, STEPS
    )
    assert torch.equal(got, want)
    for step, reference in zip(logits, want_logits, strict=True):
        torch.testing.assert_close(step, reference, **FP32)


@torch.no_grad()
def test_a_one_token_prompt_starts_captured():
    model = hybrid_model(sinks=2, by_kind=True)
    ids, attention = left_padded_batch(model.config.vocab_size, [1], seed=3)
    eager_tokens, _ = greedy(model, HybridCache.for_model(model), ids, attention, 8)
    tokens, _ = greedy(model, HybridCache.for_model(model, max_cache_len=10, captured=True), ids, attention, 8)
    assert torch.equal(tokens, eager_tokens)


@torch.no_grad()
def test_shapes_and_addresses_stay_fixed_and_the_cache_is_compileable():
    model = hybrid_model(sinks=2, by_kind=True)
    ids, attention = left_padded_batch(model.config.vocab_size, [6, 4], seed=2)
    cache = HybridCache.for_model(model, max_cache_len=16, captured=True)
    assert cache.is_compileable and not HybridCache.for_model(model).is_compileable
    model(input_ids=ids, attention_mask=attention, past_key_values=cache, use_cache=True)
    seen = []
    for _ in range(4):
        attention = torch.cat([attention, torch.ones_like(attention[:, :1])], dim=1)
        model(input_ids=ids[:, -1:], attention_mask=attention, past_key_values=cache, use_cache=True)
        seen.append([(t.data_ptr(), tuple(t.shape)) for layer in cache.layers for t in _tensors(layer)])
    assert all(step == seen[0] for step in seen)


def _tensors(layer) -> list[torch.Tensor]:
    if hasattr(layer, "buffer"):
        return [layer.buffer.keys, layer.buffer.values, layer.position.next]
    return [layer.full.keys, layer.full.values, *layer.ring.buffers(), layer.position.next]


@torch.no_grad()
def test_a_chunk_after_a_decode_step_is_refused():
    model = hybrid_model(sinks=0, by_kind=True)
    ids, attention = left_padded_batch(model.config.vocab_size, [6], seed=2)
    cache = HybridCache.for_model(model, max_cache_len=16, captured=True)
    greedy(model, cache, ids, attention, 1)
    with pytest.raises(RuntimeError, match="takes its prompt .* then one token a step"):
        model(input_ids=ids[:, :3], past_key_values=cache, use_cache=True)


@torch.no_grad()
def test_a_prompt_past_the_capacity_is_an_error_naming_it():
    model = hybrid_model(sinks=0, by_kind=True)
    ids, attention = left_padded_batch(model.config.vocab_size, [12], seed=2)
    with pytest.raises(ValueError, match="max_cache_len=8: a captured cache cannot hold 12 positions"):
        model(
            input_ids=ids,
            attention_mask=attention,
            past_key_values=HybridCache.for_model(model, max_cache_len=8, captured=True),
            use_cache=True,
        )


def test_what_cannot_be_captured_is_refused_before_any_step():
    model = hybrid_model(sinks=0, by_kind=True)
    with pytest.raises(SettingsError, match="give max_cache_len"):
        HybridCache.for_model(model, captured=True)
    from bosch_eval.caches.kv_quant.config import KVQuantConfig

    with pytest.raises(SettingsError, match="KV quantization is not captured"):
        HybridCache.for_model(model, KVQuantConfig("logquant", 2, 8, 8), max_cache_len=16, captured=True)
    mistral = random_model("mistral", num_layers=2, seed=1, sliding_window=64)
    hybridize(mistral, HeadMask.from_rows([[0, 1, 0, 1]] * 2, 4, window=4, sinks=2), backend="blocked")
    with pytest.raises(SettingsError, match="sinks in a model with its own sliding window"):
        HybridCache.for_model(mistral, max_cache_len=16, captured=True)


@pytest.fixture
def counted():
    """Dynamo's counting backend (no Inductor), with a clean dynamo cache before and after."""
    torch._dynamo.reset()
    yield CompileCounter()
    torch._dynamo.reset()


@torch.no_grad()
def compiled_greedy(model, cache, ids, attention, steps: int, forward, capacity: int) -> torch.Tensor:
    """Eager prefill, then ``steps`` steps by ``forward`` with a 2D mask of the capacity's fixed
    length written in place (as generate hands a compiled step its mask: one shape every step)."""
    argument = cache_argument(model)
    logits = model(input_ids=ids, attention_mask=attention, **{argument: cache}, use_cache=True).logits[:, -1:]
    tokens = [logits.argmax(-1)]
    mask = torch.zeros(ids.shape[0], capacity, dtype=attention.dtype)
    mask[:, : ids.shape[1]] = attention
    for step in range(steps):
        mask[:, ids.shape[1] + step] = 1
        logits = forward(input_ids=tokens[-1], attention_mask=mask, **{argument: cache}, use_cache=True).logits[:, -1:]
        tokens.append(logits.argmax(-1))
    return torch.cat(tokens, dim=1)


def test_one_compiled_graph_serves_every_step(counted):
    """fullgraph: no graph break and no recompile in 14 steps; the eager cache's tokens. Another
    prompt length is the same graph; a prompt whose rows all hold their sinks is the one other
    (no sink is looked for in its steps). One capacity: it is the step's shape."""
    model = hybrid_model(sinks=3, by_kind=False)
    compiled = torch.compile(model, backend=counted, dynamic=False, fullgraph=True)
    for lengths, graphs in (([9, 2], 1), ([7, 5], 2), ([6, 8], 2)):
        ids, attention = left_padded_batch(model.config.vocab_size, lengths, seed=1)
        want, _ = greedy(model, HybridCache.for_model(model), ids, attention, STEPS)
        cache = HybridCache.for_model(model, max_cache_len=24, captured=True)
        assert torch.equal(compiled_greedy(model, cache, ids, attention, STEPS, compiled, 24), want)
        assert counted.frame_count == graphs


def test_capacities_are_bucketed_four_to_an_octave():
    from bosch_eval.caches.captured import bucketed_capacity

    assert [bucketed_capacity(n) for n in (1, 7, 8, 9, 1000, 1024, 1025, 1281, 32769)] == [
        1,
        7,
        8,
        10,
        1024,
        1024,
        1280,
        1536,
        40960,
    ]
    assert all(n <= bucketed_capacity(n) <= 1.25 * n for n in range(1, 5000))
    assert {bucketed_capacity(n) for n in range(1025, 2049)} == {1280, 1536, 1792, 2048}


def test_generate_compiles_its_decode_steps_on_the_captured_cache(counted):
    """transformers' generate compiles the decode step of a compileable cache by itself (on a GPU;
    here asked to on the CPU, with the eager backend): one graph for every step, fullgraph, and
    the eager cache's tokens."""
    from torch._dynamo.utils import counters
    from transformers.generation.configuration_utils import CompileConfig

    model = hybrid_model(sinks=3, by_kind=True)
    argument = cache_argument(model)
    ids, attention = left_padded_batch(model.config.vocab_size, [9, 2], seed=1)
    common = dict(input_ids=ids, attention_mask=attention, max_new_tokens=STEPS, do_sample=False, pad_token_id=0)
    want = model.generate(**common, **{argument: HybridCache.for_model(model)})
    config = CompileConfig(backend="eager", fullgraph=True, dynamic=False, mode=None)
    config._compile_all_devices = True  # transformers' switch for compiling on a CPU
    counters.clear()
    got = model.generate(
        **common, **{argument: HybridCache.for_model(model, max_cache_len=32, captured=True)}, compile_config=config
    )
    assert torch.equal(got, want)
    assert counters["stats"]["unique_graphs"] == 1 and not counters["graph_break"]


def test_one_compiled_query_attends_by_group_as_transformers_does_eagerly(monkeypatch):
    """Compiling, transformers repeats the keys of a GQA layer for one masked query (a copy of
    the cache per step); the full kernel then folds each group's query heads instead. The same
    output as the eager path, fp32 within 1e-6."""
    from bosch_eval.attention.kernels.sdpa_full import sdpa_full_attention

    model = random_model("qwen3", num_layers=1, seed=2)
    module = next(m for m in model.modules() if hasattr(m, "num_key_value_groups"))
    generator = torch.Generator().manual_seed(0)
    query, key, value = (
        torch.randn(2, heads, length, 16, generator=generator) for heads, length in ((8, 1), (4, 40), (4, 40))
    )
    mask = torch.rand(2, 1, 1, 40, generator=generator) > 0.3
    eager = sdpa_full_attention(module, query, key, value, mask, scaling=0.25)
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    by_group = sdpa_full_attention(module, query, key, value, mask, scaling=0.25)
    assert by_group.shape == eager.shape == (2, 1, 8, 16)
    torch.testing.assert_close(by_group, eager, atol=1e-6, rtol=0)
