"""The O(T·W) blocked SWA kernel against the masked SDPA reference, on random tensors."""

from __future__ import annotations

import types

import pytest
import torch

from bosch_eval.swa_kernels import band_mask, blocked_swa_attention, masked_swa_attention


def test_band_mask_is_the_transformers_window():
    # query t sees keys t − W < j ≤ t: W keys including itself.
    expected = torch.tensor(
        [
            [1, 0, 0, 0],
            [1, 1, 0, 0],
            [0, 1, 1, 0],
            [0, 0, 1, 1],
        ],
        dtype=torch.bool,
    )
    assert torch.equal(band_mask(4, 4, 2, torch.device("cpu")), expected)
    # Two cached keys before the queries: query i sits at key position i + 2.
    assert torch.equal(band_mask(2, 4, 2, torch.device("cpu")), expected[2:])


@pytest.mark.parametrize(
    ("q_len", "kv_len", "window", "block"),
    [
        (37, 37, 5, None),  # prefill, T not a multiple of the block
        (64, 64, 16, 8),
        (10, 10, 32, None),  # window longer than the sequence
        (1, 50, 7, None),  # one decode step against a cache
        (9, 30, 4, 4),  # chunked prefill after 21 cached keys
        (33, 33, 1, 5),  # W = 1: each query sees only itself
    ],
)
@pytest.mark.parametrize("with_padding", [False, True])
@pytest.mark.parametrize("one_call_limit", [1 << 40, 0], ids=["all-blocks-in-one-call", "block-by-block"])
def test_blocked_equals_masked_reference(q_len, kv_len, window, block, with_padding, one_call_limit, monkeypatch):
    monkeypatch.setattr("bosch_eval.swa_kernels._ONE_CALL_MAX_KEY_ELEMENTS", one_call_limit)
    generator = torch.Generator().manual_seed(q_len * 1000 + kv_len + window)
    batch, heads, groups, dim = 2, 6, 3, 8
    query = torch.randn(batch, heads, q_len, dim, generator=generator)
    key = torch.randn(batch, groups, kv_len, dim, generator=generator)
    value = torch.randn(batch, groups, kv_len, dim, generator=generator)
    causal = band_mask(q_len, kv_len, kv_len, torch.device("cpu"))[None, None].repeat(batch, 1, 1, 1)
    if with_padding:
        causal[1, :, :, : kv_len // 3] = False  # row 1 left-padded: its first keys are padding
        causal[1, :, causal[1, 0].sum(-1) == 0] = True  # transformers' fix for all-padding query rows
    module = types.SimpleNamespace(num_key_value_groups=heads // groups, is_causal=True)

    expected, _ = masked_swa_attention(module, query, key, value, causal, window, scaling=0.3)
    got = blocked_swa_attention(query, key, value, causal, window, scaling=0.3, block_size=block)
    assert got.shape == (batch, q_len, heads, dim)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    if not with_padding:
        got_without_mask = blocked_swa_attention(query, key, value, None, window, scaling=0.3, block_size=block)
        torch.testing.assert_close(got_without_mask, expected, atol=1e-5, rtol=1e-5)


def test_blocked_rejects_float_masks():
    query = torch.randn(1, 2, 4, 8)
    key = value = torch.randn(1, 2, 4, 8)
    with pytest.raises(TypeError, match="boolean attention mask"):
        blocked_swa_attention(query, key, value, torch.zeros(1, 1, 4, 4), window=2)
