"""Compiled flex: one graph serves every layer of any mask, and it never runs unfused silently.

A 28-layer model whose layers hold every SWA count from 0 to 8 of its 8 KV groups, prefilled
at three lengths with and without the deploy-mode cache, and chunk by chunk on it. Graphs are
counted with dynamo's counting backend (no Inductor, seconds on a CPU); one test compiles the
same mask with Inductor for real, so a graph the counter accepts but Inductor refuses shows.
The shape policies are flex.py's: CUDA's (static first, dynamic after a change) and the
CPU's (static: one graph per length).
"""

from __future__ import annotations

import functools

import pytest
import torch
from torch._dynamo.testing import CompileCounter
from transformers import DynamicCache

from bosch_eval.attention.hybrid_attention import hybridize
from bosch_eval.attention.kernels import flex
from bosch_eval.caches.hybrid_cache import HybridCache
from bosch_eval.masks.head_mask import HeadMask
from bosch_eval.models.random_model import random_model

LAYERS, GROUPS, HEADS = 28, 8, 16
LENGTHS = (192, 256, 320)
CUDA_POLICY, CPU_POLICY = None, False


def every_swa_count() -> HeadMask:
    """Layer l has l mod 9 SWA groups: every count 0 … 8, each in several layers."""
    rows = [[int(group >= layer % (GROUPS + 1)) for group in range(GROUPS)] for layer in range(LAYERS)]
    return HeadMask.from_rows(rows, HEADS, window=32, sinks=4)


@functools.cache
def model_with_every_swa_count():
    model = random_model(
        "qwen3", num_layers=LAYERS, seed=1, num_attention_heads=HEADS, num_key_value_heads=GROUPS, head_dim=16
    )
    hybridize(model, every_swa_count(), backend="flex")
    return model


@pytest.fixture
def counted(monkeypatch):
    """Compiled flex through dynamo's counting backend, with a shape policy to set."""
    torch._dynamo.reset()
    counter = CompileCounter()
    policy = {"dynamic": CUDA_POLICY}
    compiled = functools.cache(
        lambda dynamic: torch.compile(flex._flex_attention(), dynamic=dynamic, backend=counter, fullgraph=True)
    )
    monkeypatch.setattr(flex, "_compiled_flex", compiled)
    monkeypatch.setattr(flex, "_shape_policy", lambda device: policy["dynamic"])
    monkeypatch.setattr(flex, "compile_failure", lambda device, dtype: None)
    monkeypatch.setattr(flex, "compile_policy", True)
    monkeypatch.setattr(flex, "unfused_policy", "error")
    yield counter, policy
    torch._dynamo.reset()


def prefill(model, length: int, cache: str, chunk: int | None = None) -> None:
    ids = torch.randint(3, model.config.vocab_size, (1, length), generator=torch.Generator().manual_seed(length))
    past = {
        "hybrid": lambda: HybridCache.for_model(model),
        "dynamic": lambda: DynamicCache(config=model.config),
        "none": lambda: None,
    }[cache]()
    with torch.no_grad():
        for part in ids.split(chunk or length, dim=1):
            model(input_ids=part, past_key_values=past, use_cache=past is not None)


@pytest.mark.parametrize("cache", ["none", "hybrid"])
def test_cuda_policy_compiles_at_most_twice_for_every_layer_and_length(counted, cache):
    counter, policy = counted
    policy["dynamic"] = CUDA_POLICY
    for length in LENGTHS:
        prefill(model_with_every_swa_count(), length, cache)
    assert 1 <= counter.frame_count <= 2


@pytest.mark.parametrize("cache", ["none", "hybrid"])
def test_cpu_policy_compiles_once_per_length(counted, cache):
    counter, policy = counted
    policy["dynamic"] = CPU_POLICY
    for index, length in enumerate(LENGTHS, start=1):
        prefill(model_with_every_swa_count(), length, cache)
        assert counter.frame_count == index


def test_chunked_prefill_on_the_hybrid_cache_compiles_twice(counted):
    """The first chunk (every position, no mask) and the later ones (each layer's SWA part,
    the same length in every chunk) are two graphs, under either policy and at every length."""
    counter, policy = counted
    for dynamic in (CUDA_POLICY, CPU_POLICY):
        torch._dynamo.reset()
        counter.frame_count = 0
        policy["dynamic"] = dynamic
        for length in LENGTHS:
            prefill(model_with_every_swa_count(), length, "hybrid", chunk=64)
        assert counter.frame_count == 2, dynamic


def test_chunked_prefill_on_transformers_cache_compiles_three_times_under_the_cuda_policy(counted):
    """Search mode chunk by chunk: the first chunk (no mask), the second (a mask, K static),
    then one dynamic graph for every later K."""
    counter, policy = counted
    policy["dynamic"] = CUDA_POLICY
    for length in LENGTHS:
        prefill(model_with_every_swa_count(), length, "dynamic", chunk=64)
    assert counter.frame_count == 3


def test_a_decode_step_compiles_nothing(counted):
    """One query attends its band by SDPA: no compile and no block mask per step."""
    counter, _ = counted
    model = model_with_every_swa_count()
    ids = torch.randint(3, model.config.vocab_size, (1, 40), generator=torch.Generator().manual_seed(0))
    model.generate(ids, max_new_tokens=4, min_new_tokens=4, do_sample=False)  # prefill 1 graph, then decode steps
    assert counter.frame_count == 1


def test_unfused_flex_is_an_error_or_a_warning(counted, monkeypatch, caplog):
    """Past dynamo's recompile limit flex would run unfused: an error where asked, else a warning."""
    counter, policy = counted
    policy["dynamic"] = CPU_POLICY
    # dynamo's own patch: pytest's monkeypatch would undo it with a delattr, which hides the setting
    with torch._dynamo.config.patch(recompile_limit=1):
        prefill(model_with_every_swa_count(), LENGTHS[0], "none")
        with pytest.raises(flex.UnfusedFlexError, match="would run unfused"):
            prefill(model_with_every_swa_count(), LENGTHS[1], "none")
        monkeypatch.setattr(flex, "unfused_policy", "warn")
        prefill(model_with_every_swa_count(), LENGTHS[2], "none")
    assert "runs unfused here" in caplog.text


@pytest.mark.slow
def test_inductor_compiles_the_every_count_mask_once_and_equals_eager(monkeypatch):
    """Inductor for real on the CPU: one compile for the whole model at one length (beside the
    probe's, once per device and dtype), and the logits of eager flex."""
    torch._dynamo.reset()
    monkeypatch.setattr(flex, "compile_policy", True)
    monkeypatch.setattr(flex, "unfused_policy", "error")
    assert flex.compile_failure("cpu", torch.float32) is None
    model = model_with_every_swa_count()
    ids = torch.randint(3, model.config.vocab_size, (1, LENGTHS[0]), generator=torch.Generator().manual_seed(0))
    before = flex.compiles
    with torch.no_grad():
        compiled = model(input_ids=ids).logits
        assert flex.compiles - before == 1
        monkeypatch.setattr(flex, "compile_policy", False)
        eager = model(input_ids=ids).logits
    torch.testing.assert_close(compiled, eager, atol=1e-4, rtol=1e-4)
