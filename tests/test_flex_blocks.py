"""Flex block masks from block arithmetic against torch's ``create_block_mask`` (which
evaluates the predicate everywhere), their reuse across layers and calls, and compiled flex
in a hybrid model against the dense band reference."""

from __future__ import annotations

import pytest
import torch

from bosch_eval.attention.hybrid_attention import hybridize
from bosch_eval.attention.kernels import flex
from bosch_eval.attention.kernels.flex_blocks import BLOCK, BlockMaskCache, block_mask_for, kind_tiles
from bosch_eval.attention.local_window import LocalWindow
from bosch_eval.masks.head_mask import HeadMask, ModelShape
from bosch_eval.models.random_model import random_model
from tests.helpers import left_padded_batch, reference_logits

pytestmark = pytest.mark.skipif(flex.flex_unavailable() is not None, reason=f"flex backend: {flex.flex_unavailable()}")


def rule(b, h, q, kv, offset, window, sinks, swa_heads, padding):
    """The predicate written out once more: windowed heads see j ≤ t and (j < S or t − W < j)."""
    t = q + offset
    windowed = (kv <= t) & ((kv < sinks) | (kv > t - window))
    allowed = windowed if swa_heads is None else torch.where(swa_heads[h], windowed, kv <= t)
    return allowed if padding is None else allowed & padding[b, kv]


def create_block_mask(*args, **kwargs):
    """torch's own: the predicate evaluated on every (b, h, q, kv)."""
    from torch.nn.attention.flex_attention import create_block_mask as evaluate_everywhere

    return evaluate_everywhere(*args, **kwargs)


def tiles_of(block_mask) -> tuple[torch.Tensor, torch.Tensor]:
    """(partial, full) dense tiles ``[B, H, Qb, Kb]`` of a BlockMask."""

    def dense(counts, indices):
        listed = torch.arange(indices.shape[-1]) < counts[..., None]  # indices: a permutation per row
        return torch.zeros(indices.shape, dtype=torch.bool).scatter(-1, indices.long(), listed)

    return dense(block_mask.kv_num_blocks, block_mask.kv_indices), dense(
        block_mask.full_kv_num_blocks, block_mask.full_kv_indices
    )


def test_tile_arithmetic_equals_the_predicate_tile_by_tile_on_every_small_case():
    """Every (T, K, W, S) on 4 × 4 tiles, against the predicate reduced tile by tile (tiles cut
    by the sequence's end padded with masked entries, as create_block_mask does)."""
    block = 4
    for kv_len in range(1, 15):
        for q_len in range(1, kv_len + 1):
            q, kv = torch.arange(q_len)[:, None], torch.arange(kv_len)[None, :]
            for window in range(1, 12):
                for sinks in (0, 1, 3, 6, 20):
                    for local in (LocalWindow(window, sinks), None):
                        if local is None:
                            allowed = kv <= q + kv_len - q_len
                        else:
                            allowed = rule(0, 0, q, kv, kv_len - q_len, window, sinks, None, None)
                        padded = torch.nn.functional.pad(allowed, (0, -kv_len % block, 0, -q_len % block))
                        tiles = padded.view(padded.shape[0] // block, block, padded.shape[1] // block, block)
                        some, every = kind_tiles(q_len, kv_len, local, torch.device("cpu"), block)
                        case = (q_len, kv_len, window, sinks, local is None)
                        assert torch.equal(some, tiles.any(3).any(1)), case
                        assert torch.equal(every, tiles.all(3).all(1)), case


CASES = [
    # (q_len, kv_len, window, sinks, swa pattern per head or None)
    (640, 640, 200, 0, None),
    (640, 640, 200, 3, None),
    (300, 700, 150, 130, None),  # queries after cached keys; sinks spanning a whole tile
    (1, 517, 64, 4, None),  # one decode step
    (384, 384, 128, 0, (True, False, True, False)),
    (500, 500, 1, 0, (False, True)),  # W = 1
    (256, 256, 1000, 2, (True, True, False)),  # window longer than the sequence
]


@pytest.mark.parametrize(("q_len", "kv_len", "window", "sinks", "pattern"), CASES)
def test_tiles_equal_create_block_mask(q_len, kv_len, window, sinks, pattern):
    offset = kv_len - q_len
    heads = torch.tensor(pattern) if pattern is not None else None

    def mask_mod(b, h, q, kv):
        return rule(b, h, q, kv, offset, window, sinks, heads, None)

    expected = create_block_mask(mask_mod, None, len(pattern) if pattern else None, q_len, kv_len, device="cpu")
    got = block_mask_for(q_len, kv_len, LocalWindow(window, sinks), None, pattern, torch.device("cpu"))
    for mine, torchs in zip(tiles_of(got), tiles_of(expected), strict=True):
        assert torch.equal(mine, torchs)
    q, kv = torch.arange(q_len)[:, None], torch.arange(kv_len)[None, :]
    zero = torch.zeros((), dtype=torch.long)
    for h in range(len(pattern) if pattern else 1):
        assert torch.equal(got.mask_mod(zero, torch.tensor(h), q, kv), mask_mod(zero, torch.tensor(h), q, kv))


@pytest.mark.parametrize("length", [520, 512])  # tiles cut by the end, and none
def test_padding_tiles_are_full_only_where_every_entry_is_allowed_and_cover_every_allowed_entry(length):
    q_len = kv_len = length
    padding = torch.ones(2, kv_len, dtype=torch.bool)
    padding[1, :300] = False  # row 1 left-padded past two tiles
    mask4d = torch.ones(q_len, kv_len, dtype=torch.bool).tril()[None, None] & padding[:, None, None, :]
    pattern = (True, False)

    def mask_mod(b, h, q, kv):
        return rule(b, h, q, kv, 0, 100, 2, torch.tensor(pattern), padding)

    expected = create_block_mask(mask_mod, 2, 2, q_len, kv_len, device="cpu")
    got = block_mask_for(q_len, kv_len, LocalWindow(100, 2), mask4d, pattern, torch.device("cpu"))
    (partial, full), (exact_partial, exact_full) = tiles_of(got), tiles_of(expected)
    assert torch.equal(full, exact_full)
    assert not (exact_partial & ~partial).any()  # every tile with an allowed entry is run


def test_block_masks_are_built_once_per_pattern_and_reused_across_layers_and_calls(monkeypatch):
    monkeypatch.setattr(flex, "compile_policy", False)
    model = random_model("qwen3", num_layers=4, seed=1)
    # Two mixed layers with one pattern, one with another, one all SWA: three block masks.
    rows = [[1, 0, 1, 0], [1, 0, 1, 0], [0, 0, 1, 1], [0, 0, 0, 0]]
    hybrid = hybridize(model, HeadMask.from_rows(rows, 8, window=4), backend="flex")
    cache = hybrid.kernel_cache
    assert isinstance(cache, BlockMaskCache)
    ids, attention = left_padded_batch(model.config.vocab_size, [24, 24], seed=2)
    with torch.no_grad():
        model(input_ids=ids)
        assert cache.built == 3
        model(input_ids=ids)  # no padding: reused across calls
        assert cache.built == 3
        attention[1, :5] = 0
        model(input_ids=ids, attention_mask=attention)  # padding: one set per forward
        assert cache.built == 6
        model(input_ids=ids, attention_mask=attention)
        assert cache.built == 9
    hybrid.set_mask(HeadMask.from_rows(rows, 8), window=3)  # another window, other masks
    with torch.no_grad():
        model(input_ids=ids)
    assert cache.built == 12


def test_the_cache_keeps_a_bounded_number_of_shapes():
    cache = BlockMaskCache(max_shapes=2)
    for length in (10, 20, 30, 10):
        cache.get(length, length, LocalWindow(4), None, None, torch.device("cpu"))
    assert cache.built == 4  # 10 was evicted by 30


def test_the_masks_of_two_layer_kinds_in_one_forward_are_each_reused():
    """Models with sliding and full layers hand two 4D masks per forward, layer after layer."""
    cache = BlockMaskCache()
    causal = torch.ones(1, 1, 8, 8, dtype=torch.bool).tril()
    sliding = causal & ~torch.ones(1, 1, 8, 8, dtype=torch.bool).tril(-3)
    for _ in range(3):
        for mask in (causal, sliding):
            cache.get(8, 8, LocalWindow(4), mask, None, torch.device("cpu"))
    assert cache.built == 2
    cache.get(8, 8, LocalWindow(4), causal.clone(), None, torch.device("cpu"))  # the next forward's
    assert cache.built == 3


@pytest.mark.slow
@pytest.mark.parametrize("sinks", [0, 3])
def test_compiled_flex_in_a_hybrid_model_equals_the_dense_band_reference(sinks, monkeypatch):
    """Compiled on CPU (Inductor C++): the block masks' skipped tiles are really skipped here,
    so a tile missing from them would show (eager flex evaluates every entry)."""
    reason = flex.compile_failure("cpu", torch.float32)
    if reason is not None:
        pytest.skip(f"torch.compile of flex_attention fails here: {reason}")
    monkeypatch.setattr(flex, "compile_policy", True)  # a compile failure is an error here
    model = random_model("qwen3", num_layers=3, seed=3)
    shape = ModelShape.from_config(model.config)
    rows = [[1, 0, 1, 0], [0, 0, 0, 0], [0, 1, 1, 0]]
    mask = HeadMask.from_rows(rows, shape.num_heads, window=2 * BLOCK - 30, sinks=sinks)
    ids, attention = left_padded_batch(model.config.vocab_size, [3 * BLOCK + 17, 2 * BLOCK], seed=4)
    expected = reference_logits(model, mask, ids, attention)
    hybridize(model, mask, backend="flex")
    with torch.no_grad():
        got = model(input_ids=ids, attention_mask=attention).logits
    torch.testing.assert_close(got[attention.bool()], expected[attention.bool()], atol=1e-4, rtol=0)
