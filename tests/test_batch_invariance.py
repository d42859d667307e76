"""A row's output does not depend on its batch: each row of a padded batch of rows of
different lengths gets the logits, and the greedy tokens, of that row run alone.

The oracle beside the dense band reference (``tests/helpers.py``): with sinks, a kernel that
took the first S *indices* of a left-padded row as its sinks would attend padding there, and
its row would change with the batch's longest row. Every backend that runs on a CPU, sinks 0
and 4, left and right padding, prefill and generation (left padding only: a decoder
generates after its prompt, so right padding would put padding between prompt and answer),
in search mode (transformers' ``DynamicCache``) and deploy mode (:class:`HybridCache`).
"""

from __future__ import annotations

import pytest
import torch

from bosch_eval.attention.hybrid_attention import hybridize
from bosch_eval.caches.hybrid_cache import HybridCache
from bosch_eval.masks.head_mask import HeadMask, ModelShape
from bosch_eval.models.random_model import random_model

LENGTHS = [23, 9, 16]  # the longest row is several windows long; the shortest has fewer real tokens than pads
WINDOW = 5
BACKENDS = ["sdpa", "blocked", "flex"]
FP32 = {"atol": 1e-5, "rtol": 0}


@pytest.fixture(autouse=True)
def eager_flex(monkeypatch):
    """Flex runs eagerly here (compiled, every new length is a compile on CPU)."""
    monkeypatch.setattr("bosch_eval.attention.kernels.flex.compile_policy", False)


def hybrid(backend: str, sinks: int, by_kind: bool = False):
    """A 4-layer random Qwen3 with every kind of layer: full, SWA, and mixed twice (by_kind:
    its heads permuted so that each kind is one run, as deploy mode runs it)."""
    model = random_model("qwen3", num_layers=4, seed=11)
    shape = ModelShape.from_config(model.config)
    rows = [
        [1] * shape.num_kv_heads,
        [0] * shape.num_kv_heads,
        [g % 2 for g in range(shape.num_kv_heads)],
        [1, 0, 0, 1],
    ]
    hybridize(
        model, HeadMask.from_rows(rows, shape.num_heads, window=WINDOW, sinks=sinks), backend=backend, by_kind=by_kind
    )
    return model


def rows(vocab: int) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(5)
    return [torch.randint(3, vocab, (length,), generator=generator) for length in LENGTHS]


def padded(tokens: list[torch.Tensor], side: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """ids, attention mask and position ids (each row's own: 0 at its first real token)."""
    total = max(len(row) for row in tokens)
    ids = torch.zeros(len(tokens), total, dtype=torch.long)
    attention = torch.zeros(len(tokens), total, dtype=torch.long)
    for index, row in enumerate(tokens):
        span = slice(total - len(row), total) if side == "left" else slice(0, len(row))
        ids[index, span], attention[index, span] = row, 1
    positions = (attention.cumsum(-1) - 1).clamp(min=0)
    return ids, attention, positions


@torch.no_grad()
def alone(model, row: torch.Tensor) -> torch.Tensor:
    return model(input_ids=row[None]).logits[0]


@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("sinks", [0, 4])
@pytest.mark.parametrize("backend", BACKENDS)
def test_prefill_logits_of_each_row_equal_the_row_alone(backend, sinks, side):
    model = hybrid(backend, sinks)
    tokens = rows(model.config.vocab_size)
    ids, attention, positions = padded(tokens, side)
    with torch.no_grad():
        batched = model(input_ids=ids, attention_mask=attention, position_ids=positions).logits
    for index, row in enumerate(tokens):
        torch.testing.assert_close(batched[index][attention[index].bool()], alone(model, row), **FP32)


@pytest.mark.parametrize("cache", ["dynamic", "hybrid"])
@pytest.mark.parametrize("sinks", [0, 4])
@pytest.mark.parametrize("backend", BACKENDS)
def test_greedy_generation_of_each_row_equals_the_row_alone(backend, sinks, cache):
    model = hybrid(backend, sinks)
    tokens = rows(model.config.vocab_size)
    ids, attention, _ = padded(tokens, "left")
    settings = {"max_new_tokens": 12, "min_new_tokens": 12, "do_sample": False, "pad_token_id": 0}

    def generate(input_ids, attention_mask):
        past = {"past_key_values": HybridCache.for_model(model)} if cache == "hybrid" else {}
        with torch.no_grad():
            return model.generate(input_ids=input_ids, attention_mask=attention_mask, **settings, **past)[
                :, input_ids.shape[1] :
            ]

    batched = generate(ids, attention)
    for index, row in enumerate(tokens):
        assert torch.equal(batched[index], generate(row[None], torch.ones(1, len(row), dtype=torch.long))[0]), (
            f"row {index}"
        )


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_sinks_matter_here(backend):
    """Guards the tests above: on these rows, attention sinks at the padded row's first
    indices (padding) instead of its first real tokens change its logits."""
    model = hybrid(backend, 4)
    tokens = rows(model.config.vocab_size)
    ids, attention, positions = padded(tokens, "left")
    with torch.no_grad():
        right = model(input_ids=ids, attention_mask=attention, position_ids=positions).logits
        model.bosch_hybrid.set_mask(model.bosch_hybrid.mask, sinks=0)
        without = model(input_ids=ids, attention_mask=attention, position_ids=positions).logits
    real = attention.bool()
    assert (right[real] - without[real]).abs().max() > 1e-3


@pytest.mark.parametrize("by_kind", [False, True])
@pytest.mark.parametrize("backend", BACKENDS)
def test_chunked_prefill_on_the_hybrid_cache_keeps_each_rows_sinks(backend, by_kind):
    """Deploy mode over several chunks of a left-padded batch: once the cache has dropped
    positions, its sink slots hold each row's own first real tokens."""
    model = hybrid(backend, 4, by_kind)
    tokens = rows(model.config.vocab_size)
    ids, attention, positions = padded(tokens, "left")
    cache = HybridCache.for_model(model)
    chunks = []
    with torch.no_grad():
        for start in range(0, ids.shape[1], 7):
            stop = start + 7
            chunks.append(
                model(
                    input_ids=ids[:, start:stop], attention_mask=attention[:, :stop], position_ids=positions[:, start:stop],
                    past_key_values=cache, use_cache=True,
                ).logits
            )  # fmt: skip
    batched = torch.cat(chunks, dim=1)
    for index, row in enumerate(tokens):
        torch.testing.assert_close(batched[index][attention[index].bool()], alone(model, row), **FP32)


@pytest.mark.parametrize("backend", BACKENDS)
def test_in_bf16_batching_moves_a_row_less_than_bf16_itself_does(backend):
    """bf16: each row sees the same keys in a batch as alone (the fp32 tests), but the
    kernels round in an order that depends on the batch's shape. What holds: a row's logits
    in the batch lie within two bf16 floors of the row alone (the floor: how far bf16 moves
    that row from fp32; the tolerance of benchmarks/backend_reference.py). Greedy tokens
    can then still differ where two candidates are that close."""
    model = hybrid(backend, 4)
    tokens = rows(model.config.vocab_size)
    ids, attention, positions = padded(tokens, "left")
    exact = [alone(model, row) for row in tokens]
    model.to(torch.bfloat16)
    with torch.no_grad():
        batched = model(input_ids=ids, attention_mask=attention, position_ids=positions).logits.float()
    for index, row in enumerate(tokens):
        rounded = alone(model, row).float()
        bf16_floor = (rounded - exact[index]).abs().max()
        assert (batched[index][attention[index].bool()] - rounded).abs().max() <= 2 * bf16_floor
