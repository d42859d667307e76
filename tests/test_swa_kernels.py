"""Every registered SWA kernel against a dense reference built from the stated rule, on
random fp32 tensors: query t sees key j iff j ≤ t and (j is one of the row's first S real
keys or t − W < j)."""

from __future__ import annotations

import types

import pytest
import torch
from transformers.masking_utils import sliding_window_causal_mask_function

from bosch_eval.attention.kernels import BACKENDS
from bosch_eval.attention.kernels import flash as flash_module
from bosch_eval.attention.kernels import flex as flex_module
from bosch_eval.attention.kernels.blocked import blocked_attention
from bosch_eval.attention.kernels.flex import flex_attention_layer
from bosch_eval.attention.kernels.lse_merge import eager_windowed, sink_merged_attention
from bosch_eval.attention.local_window import LocalWindow
from bosch_eval.runtime.errors import LocalWindowError, SettingsError

TOLERANCE = {"atol": 1e-5, "rtol": 1e-5}  # fp32 kernels against a float64 reference


def rule(t: int, j: int, window: int, sinks: int, rank: int | None = None) -> bool:
    """The band, written out once more without any of the library's code; ``rank``: how many
    real keys come before key j in its row (None: j, no padding)."""
    return j <= t and ((j if rank is None else rank) < sinks or t - window < j)


def ranks(padding, batch: int, kv_len: int) -> list[list[int]]:
    """Per row and key, the number of real keys before it."""
    out = []
    for row in range(batch):
        seen, row_ranks = 0, []
        for j in range(kv_len):
            row_ranks.append(seen)
            seen += 1 if padding is None or padding[row, j] else 0
        out.append(row_ranks)
    return out


def dense_reference(query, key, value, padding, window, sinks, scaling, swa_heads=None):
    """float64 eager attention with an explicit per-(t, j) mask from :func:`rule`.

    ``padding [B, K]`` (True = real key) or None; ``swa_heads``: per query head, True =
    windowed (None: all), False = causal only.
    """
    batch, heads, q_len, _ = query.shape
    kv_len = key.shape[2]
    repeat = heads // key.shape[1]
    key, value = key.repeat_interleave(repeat, 1).double(), value.repeat_interleave(repeat, 1).double()
    allowed = torch.zeros(batch, heads, q_len, kv_len, dtype=torch.bool)
    key_ranks = ranks(padding, batch, kv_len)
    for b in range(batch):
        for h in range(heads):
            windowed = swa_heads is None or swa_heads[h]
            for i in range(q_len):
                t = kv_len - q_len + i
                for j in range(kv_len):
                    allowed[b, h, i, j] = rule(t, j, window, sinks, key_ranks[b][j]) if windowed else j <= t
    if padding is not None:
        allowed &= padding[:, None, None, :]
    scores = (query.double() @ key.transpose(2, 3)) * scaling
    weights = scores.masked_fill(~allowed, float("-inf")).softmax(-1).nan_to_num(0.0)
    return (weights @ value).float().transpose(1, 2)


def random_inputs(q_len, kv_len, seed, batch=2, heads=6, groups=3, dim=8, left_pad=0):
    generator = torch.Generator().manual_seed(seed)
    query = torch.randn(batch, heads, q_len, dim, generator=generator)
    key = torch.randn(batch, groups, kv_len, dim, generator=generator)
    value = torch.randn(batch, groups, kv_len, dim, generator=generator)
    padding = None
    if left_pad:
        padding = torch.ones(batch, kv_len, dtype=torch.bool)
        padding[1, :left_pad] = False  # row 1 left-padded
    return query, key, value, padding


def sdpa_mask_from(padding, q_len, kv_len, batch):
    """The model's 4D boolean mask (causal, padding) as transformers' sdpa_mask builds it."""
    causal = LocalWindow(kv_len).dense(q_len, kv_len)[None, None].repeat(batch, 1, 1, 1)
    if padding is not None:
        causal &= padding[:, None, None, :]
        causal[causal.sum(-1, keepdim=True).expand_as(causal) == 0] = True  # its fix for all-padding rows
    return causal


def real_rows(out, padding, q_len):
    """Outputs of queries that are real tokens (padding queries' outputs are dropped by models)."""
    if padding is None:
        return out
    return out * padding[:, -q_len:, None, None]


# -- the value and its predicate ------------------------------------------------------------
class TestLocalWindow:
    def test_band_is_the_transformers_window_without_sinks(self):
        expected = torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [0, 1, 1, 0], [0, 0, 1, 1]], dtype=torch.bool)
        assert torch.equal(LocalWindow(2).dense(4, 4), expected)
        assert torch.equal(LocalWindow(2).dense(2, 4), expected[2:])  # two cached keys before the queries
        q, kv = torch.arange(9)[:, None], torch.arange(9)[None, :]
        zero = torch.zeros((), dtype=torch.long)
        assert torch.equal(LocalWindow(3).dense(9, 9), sliding_window_causal_mask_function(3)(zero, zero, q, kv))

    def test_band_with_sinks_written_out(self):
        expected = torch.tensor(
            [[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 0, 0], [1, 0, 1, 1, 0], [1, 0, 0, 1, 1]], dtype=torch.bool
        )
        assert torch.equal(LocalWindow(2, sinks=1).dense(5, 5), expected)

    @pytest.mark.parametrize("window", [1, 2, 5])
    @pytest.mark.parametrize("sinks", [0, 1, 3, 8])
    def test_retained_is_what_the_next_query_sees(self, window, sinks):
        local = LocalWindow(window, sinks)
        for seen in range(0, 20):
            wanted = [j for j in range(seen) if rule(seen, j, window, sinks)]
            sink_count, recent_start = local.retained(seen)
            assert list(range(sink_count)) + list(range(recent_start, seen)) == wanted
            assert local.retained_count(seen) == len(wanted)

    @pytest.mark.parametrize(
        ("window", "sinks", "field"), [(0, 0, "window"), (2, -1, "sink"), (2, True, "sink"), (2.0, 0, "window")]
    )
    def test_invalid_values_name_the_field(self, window, sinks, field):
        with pytest.raises(LocalWindowError, match=field):
            LocalWindow(window, sinks)


# -- every backend against the reference ---------------------------------------------------
CASES = [
    # (q_len, kv_len, window, block)
    (37, 37, 5, None),  # prefill, T not a multiple of the block
    (64, 64, 16, 8),
    (10, 10, 32, None),  # window longer than the sequence
    (1, 50, 7, None),  # one decode step against a cache
    (9, 30, 4, 4),  # chunked prefill after 21 cached keys
    (33, 33, 1, 5),  # W = 1: each query sees only itself
]


@pytest.mark.parametrize(("q_len", "kv_len", "window", "block"), CASES)
@pytest.mark.parametrize("sinks", [0, 3])
@pytest.mark.parametrize("left_pad", [0, 7])
@pytest.mark.parametrize("one_call_limit", [1 << 40, 0], ids=["all-blocks-in-one-call", "block-by-block"])
def test_blocked_equals_reference(q_len, kv_len, window, block, sinks, left_pad, one_call_limit, monkeypatch):
    monkeypatch.setattr("bosch_eval.attention.kernels.blocked._ONE_CALL_MAX_KEY_ELEMENTS", one_call_limit)
    query, key, value, padding = random_inputs(q_len, kv_len, q_len * 1000 + kv_len + window + sinks, left_pad=left_pad)
    expected = dense_reference(query, key, value, padding, window, sinks, 0.3)
    mask = sdpa_mask_from(padding, q_len, kv_len, 2)
    got = blocked_attention(query, key, value, mask, LocalWindow(window, sinks), scaling=0.3, block_size=block)
    assert got.shape == (2, q_len, 6, 8)
    torch.testing.assert_close(real_rows(got, padding, q_len), real_rows(expected, padding, q_len), **TOLERANCE)
    if padding is None:
        got = blocked_attention(query, key, value, None, LocalWindow(window, sinks), scaling=0.3, block_size=block)
        torch.testing.assert_close(got, expected, **TOLERANCE)


@pytest.mark.parametrize("backend", ["sdpa", "blocked", "flex"])
@pytest.mark.parametrize(("q_len", "kv_len", "window"), [(37, 37, 5), (1, 50, 7), (9, 30, 4)])
@pytest.mark.parametrize("sinks", [0, 2, 64])
def test_registered_kernels_equal_reference(backend, q_len, kv_len, window, sinks, monkeypatch):
    monkeypatch.setattr(flex_module, "compile_policy", False)  # the compiled path has its own test
    query, key, value, padding = random_inputs(q_len, kv_len, 7 * q_len + sinks, left_pad=5)
    module = types.SimpleNamespace(num_key_value_groups=2, is_causal=True, training=False)
    mask = sdpa_mask_from(padding, q_len, kv_len, 2)
    got = BACKENDS[backend].swa(module, query, key, value, mask, LocalWindow(window, sinks), scaling=0.3, dropout=0.0)
    expected = dense_reference(query, key, value, padding, window, sinks, 0.3)
    torch.testing.assert_close(real_rows(got, padding, q_len), real_rows(expected, padding, q_len), **TOLERANCE)


def test_sinks_beyond_the_sequence_are_full_attention():
    query, key, value, _ = random_inputs(20, 20, 3)
    full = dense_reference(query, key, value, None, 20, 0, 0.3)
    for kernel in (BACKENDS["sdpa"].swa, BACKENDS["blocked"].swa):
        module = types.SimpleNamespace(num_key_value_groups=2, is_causal=True, training=False)
        got = kernel(module, query, key, value, None, LocalWindow(3, sinks=20), scaling=0.3)
        torch.testing.assert_close(got, full, **TOLERANCE)


@pytest.mark.parametrize("sinks", [0, 3])
def test_flex_runs_a_hybrid_layer_in_one_call(sinks, monkeypatch):
    monkeypatch.setattr(flex_module, "compile_policy", False)
    query, key, value, padding = random_inputs(30, 30, 11, left_pad=4)
    swa_groups = [True, False, True]
    swa_heads = [swa_groups[h // 2] for h in range(6)]
    got = flex_attention_layer(
        query, key, value, sdpa_mask_from(padding, 30, 30, 2), LocalWindow(5, sinks), swa_groups, scaling=0.3
    )
    expected = dense_reference(query, key, value, padding, 5, sinks, 0.3, swa_heads=swa_heads)
    torch.testing.assert_close(real_rows(got, padding, 30), real_rows(expected, padding, 30), **TOLERANCE)


def test_compiled_flex_equals_reference():
    reason = flex_module.compile_failure("cpu", torch.float32)
    if reason is not None:
        pytest.skip(f"torch.compile of flex_attention fails here: {reason}")
    query, key, value, _ = random_inputs(32, 32, 5, batch=1, heads=4, groups=2, dim=16)
    got = flex_attention_layer(query, key, value, None, LocalWindow(6, 2), [True, False], scaling=0.25)
    expected = dense_reference(query, key, value, None, 6, 2, 0.25, swa_heads=[True, True, False, False])
    torch.testing.assert_close(got, expected, **TOLERANCE)


# -- flash: the log-sum-exp merge, with an eager stand-in for the flash call ---------------
@pytest.mark.parametrize(
    ("q_len", "kv_len", "window", "sinks"), [(37, 37, 5, 3), (1, 50, 7, 4), (9, 30, 4, 30), (12, 12, 20, 2)]
)
@pytest.mark.parametrize("left_pad", [0, 6])
def test_sink_merge_equals_reference(q_len, kv_len, window, sinks, left_pad):
    query, key, value, padding = random_inputs(q_len, kv_len, q_len + kv_len + sinks, left_pad=left_pad)
    got = sink_merged_attention(query, key, value, padding, LocalWindow(window, sinks), 0.3, eager_windowed)
    expected = dense_reference(query, key, value, padding, window, sinks, 0.3)
    torch.testing.assert_close(real_rows(got, padding, q_len), real_rows(expected, padding, q_len), **TOLERANCE)


def test_flash_kernel_with_sinks_merges_its_windowed_call(monkeypatch):
    # Everything but the flash-attn call itself, which needs CUDA: the stand-in has its inputs and outputs.
    calls = []

    def stand_in(query, key, value, key_padding, window, scaling):
        calls.append(window)
        return eager_windowed(query, key, value, key_padding, window, scaling)

    monkeypatch.setattr(flash_module, "_flash_windowed", stand_in)
    query, key, value, _ = random_inputs(25, 25, 9)
    module = types.SimpleNamespace(num_key_value_groups=2, is_causal=True, training=False)
    got = BACKENDS["flash_attention_2"].swa(
        module, query, key, value, None, LocalWindow(4, 2), scaling=0.3, sliding_window=None
    )
    torch.testing.assert_close(got, dense_reference(query, key, value, None, 4, 2, 0.3), **TOLERANCE)
    assert calls == [4]


def test_flash_refuses_left_padding_with_sinks():
    padding = torch.tensor([[False, True, True], [True, True, True]])
    assert not flash_module._right_padded(padding)
    assert flash_module._right_padded(torch.tensor([[True, True, False], [True, True, True]]))


def test_an_unknown_backend_is_named():
    with pytest.raises(
        SettingsError,
        match=r"attn_backend: unknown attention backend 'flesh', expected one of \[.*\] \(did you mean 'flex'\?\)",
    ):
        BACKENDS["flesh"]


def test_blocked_rejects_float_masks():
    query = torch.randn(1, 2, 4, 8)
    key = value = torch.randn(1, 2, 4, 8)
    with pytest.raises(TypeError, match="boolean attention mask"):
        blocked_attention(query, key, value, torch.zeros(1, 1, 4, 4), LocalWindow(2))
