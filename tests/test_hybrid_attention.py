"""Hybrid attention against its oracles: the unpatched model, transformers' own sliding
layers, and a dense eager reference with an explicit band mask per head."""

from __future__ import annotations

import pytest
import torch

from bosch_eval.attention.hybrid_attention import hybrid_state, hybridize
from bosch_eval.attention.hybrid_spec import GroupRun, HybridSpec
from bosch_eval.masks.head_mask import HeadMask, ModelShape
from bosch_eval.models.random_model import FAMILIES, random_model
from bosch_eval.runtime.errors import MaskError, SettingsError
from tests.helpers import left_padded_batch, reference_logits

WINDOW = 5
CPU_BACKENDS = ["sdpa", "blocked", "flex"]


@pytest.fixture(autouse=True)
def eager_flex(monkeypatch):
    """Flex runs eagerly here: compiled, every new sequence length is a compile (tens of
    seconds on CPU); the compiled path has its own test in test_swa_kernels."""
    monkeypatch.setattr("bosch_eval.attention.kernels.flex.compile_policy", False)


def random_mask(model, seed: int, sinks: int = 0) -> HeadMask:
    """A mask with every kind of layer: all full, all SWA and mixed."""
    shape = ModelShape.from_config(model.config)
    generator = torch.Generator().manual_seed(seed)
    rows = torch.randint(0, 2, (shape.num_layers, shape.num_kv_heads), generator=generator).tolist()
    rows[0] = [1] * shape.num_kv_heads
    rows[1] = [0] * shape.num_kv_heads
    rows[2] = [(g + seed) % 2 for g in range(shape.num_kv_heads)]
    return HeadMask.from_rows(rows, shape.num_heads, window=WINDOW, sinks=sinks)


def logits(model, ids, attention=None) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=attention).logits


@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_all_full_mask_is_bit_identical_to_unpatched_model(family, backend):
    model = random_model(family)
    ids, attention = left_padded_batch(model.config.vocab_size, [40, 31, 17])
    expected_padded = logits(model, ids, attention)
    expected_plain = logits(model, ids[:1])
    hybridize(model, HeadMask.uniform(ModelShape.from_config(model.config), full=True, window=WINDOW), backend=backend)
    assert model.config._attn_implementation == "bosch_sdpa"
    assert torch.equal(logits(model, ids, attention), expected_padded)
    assert torch.equal(logits(model, ids[:1]), expected_plain)


@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("family", ["qwen3", "qwen2"])
def test_whole_layer_swa_matches_transformers_sliding_layers(family, backend):
    layer_types = ["sliding_attention", "full_attention", "sliding_attention"]
    native = random_model(family, layer_types=layer_types, use_sliding_window=True, sliding_window=WINDOW)
    assert [m.sliding_window for m in native.model.layers.modules() if hasattr(m, "num_key_value_groups")] == [
        WINDOW,
        None,
        WINDOW,
    ]
    ids, attention = left_padded_batch(native.config.vocab_size, [40, 33])
    expected = logits(native, ids, attention)

    hybrid = random_model(family)
    hybrid.load_state_dict(native.state_dict())
    shape = ModelShape.from_config(hybrid.config)
    rows = [[int(kind == "full_attention")] * shape.num_kv_heads for kind in layer_types]
    hybridize(hybrid, HeadMask.from_rows(rows, shape.num_heads, window=WINDOW), backend=backend)
    got = logits(hybrid, ids, attention)
    torch.testing.assert_close(got[attention.bool()], expected[attention.bool()], atol=1e-5, rtol=0)


@pytest.mark.parametrize("sinks", [0, 3])
@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_per_group_masks_match_dense_band_reference(family, backend, sinks):
    model = random_model(family, seed=3)
    ids, attention = left_padded_batch(model.config.vocab_size, [40, 26, 9], seed=4)
    for seed in range(2):
        mask = random_mask(model, seed, sinks)
        expected = reference_logits(model, mask, ids, attention)
        hybridize(model, mask, backend=backend)
        got = logits(model, ids, attention)
        torch.testing.assert_close(got[attention.bool()], expected[attention.bool()], atol=1e-5, rtol=0)


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_sinks_covering_the_sequence_are_full_attention(backend):
    model = random_model("qwen3")
    ids, _ = left_padded_batch(model.config.vocab_size, [40])
    full = logits(model, ids)
    hybridize(
        model,
        HeadMask.uniform(ModelShape.from_config(model.config), full=False, window=WINDOW, sinks=40),
        backend=backend,
    )
    torch.testing.assert_close(logits(model, ids), full, atol=1e-5, rtol=0)
    hybrid_state(model).set_mask(hybrid_state(model).mask, sinks=2)  # and fewer sinks are not
    assert (logits(model, ids) - full).abs().max() > 1e-3


def test_sinks_are_saved_with_the_mask_in_the_config():
    model = random_model("qwen3")
    hybridize(model, random_mask(model, 0), sinks=4)
    assert model.config.bosch_mask["sinks"] == 4 and hybrid_state(model).local.sinks == 4
    hybrid_state(model).set_mask(random_mask(model, 1), sinks=0)
    assert "sinks" not in model.config.bosch_mask  # files without sinks stay as before


def test_the_window_changes_the_output():
    """Guards the oracles above: an SWA mask must not equal full attention."""
    model = random_model("qwen3")
    ids, _ = left_padded_batch(model.config.vocab_size, [40])
    full = logits(model, ids)
    hybridize(model, HeadMask.uniform(ModelShape.from_config(model.config), full=False, window=WINDOW))
    assert (logits(model, ids) - full).abs().max() > 1e-3


def test_mask_swaps_in_place_reproduce_outputs_and_leave_weights_untouched():
    model = random_model("llama")
    ids, attention = left_padded_batch(model.config.vocab_size, [40, 21])
    pointers = {name: p.data_ptr() for name, p in model.named_parameters()}
    weights = {name: p.detach().clone() for name, p in model.named_parameters()}
    first, second = random_mask(model, 0), random_mask(model, 1)
    state = hybridize(model, first)
    out_first = logits(model, ids, attention)
    state.set_mask(second)
    out_second = logits(model, ids, attention)
    state.set_mask(first)
    assert torch.equal(logits(model, ids, attention), out_first)
    assert not torch.equal(out_first, out_second)
    assert hybridize(model, second) is state  # re-applying swaps too, never stacks patches
    assert torch.equal(logits(model, ids, attention), out_second)
    assert {name: p.data_ptr() for name, p in model.named_parameters()} == pointers
    assert all(torch.equal(p, weights[name]) for name, p in model.named_parameters())


@pytest.mark.parametrize("sinks", [0, 2])
def test_greedy_decoding_with_cache_matches_recomputation(sinks):
    """The SWA kernels place queries correctly when keys come from a cache."""
    model = random_model("qwen3")
    hybridize(model, random_mask(model, 0, sinks), backend="blocked")
    ids, _ = left_padded_batch(model.config.vocab_size, [12])
    generated = model.generate(ids, max_new_tokens=8, do_sample=False, min_new_tokens=8)
    recomputed = ids
    for _ in range(8):
        next_token = logits(model, recomputed)[:, -1].argmax(-1, keepdim=True)
        recomputed = torch.cat([recomputed, next_token], dim=1)
    assert torch.equal(generated, recomputed)


class TestErrors:
    def test_mask_for_another_model_is_rejected(self):
        model = random_model("qwen3")
        shape = ModelShape.from_config(model.config)
        wrong_layers = HeadMask.uniform(ModelShape(shape.num_layers + 1, 8, 4), full=True, window=4)
        with pytest.raises(MaskError, match=r"mask.json: field 'num_layers' is 4, but the model .* has num_layers=3"):
            hybridize(model, wrong_layers, source="mask.json")
        wrong_groups = HeadMask.uniform(ModelShape(shape.num_layers, 8, 2), full=True, window=4)
        with pytest.raises(MaskError, match="field 'num_kv_heads' is 2, but the model .* has num_kv_heads=4"):
            hybridize(model, wrong_groups)

    def test_window_is_required(self):
        model = random_model("qwen3")
        with pytest.raises(MaskError, match="field 'window' is missing"):
            hybridize(model, HeadMask.uniform(ModelShape.from_config(model.config), full=False))

    def test_unknown_and_unavailable_backends(self):
        model = random_model("qwen3")
        mask = HeadMask.uniform(ModelShape.from_config(model.config), full=False, window=4)
        with pytest.raises(SettingsError, match=r"attn_backend: expected one of \['auto'"):
            hybridize(model, mask, backend="triton")
        with pytest.raises(SettingsError, match="'flash_attention_2' needs a CUDA model"):
            hybridize(model, mask, backend="flash_attention_2")

    def test_unhybridized_model_has_no_state(self):
        with pytest.raises(RuntimeError, match="not hybridized"):
            hybrid_state(random_model("qwen3"))


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_flash_backend_matches_dense_band_reference(family):
    pytest.importorskip("flash_attn", reason="needs flash-attn (pip install 'bosch-eval[flash]')")
    model = random_model(family, seed=3).to("cuda", torch.bfloat16)
    ids, attention = left_padded_batch(model.config.vocab_size, [40, 26, 9], seed=4)
    ids, attention = ids.cuda(), attention.cuda()
    for seed in range(2):
        mask = random_mask(model, seed)
        expected = reference_logits(model.float(), mask, ids, attention)
        model.to(torch.bfloat16)
        hybridize(model, mask, backend="flash_attention_2")
        got = logits(model, ids, attention).float()
        # bf16 activations: compare at bf16 resolution.
        torch.testing.assert_close(got[attention.bool()], expected[attention.bool()], atol=5e-2, rtol=5e-2)
        model.set_attn_implementation("sdpa")
    # Sinks: flash's windowed call merged with the sink keys by log-sum-exp (unpadded rows).
    mask = random_mask(model, 0, sinks=3)
    expected = reference_logits(model.float(), mask, ids[:1], attention[:1])
    model.to(torch.bfloat16)
    hybridize(model, mask, backend="flash_attention_2")
    torch.testing.assert_close(logits(model, ids[:1], attention[:1]).float(), expected, atol=5e-2, rtol=5e-2)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("backend", ["sdpa", "blocked", "flex", "flash_attention_2"])
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_cuda_backends_match_dense_band_reference_in_bf16(family, backend, monkeypatch):
    """Every backend on CUDA (flex compiled, as ``auto`` runs it) against the float32 dense
    band reference, at bf16 resolution, with and without sinks."""
    if backend == "flash_attention_2":
        pytest.importorskip("flash_attn", reason="needs flash-attn (pip install 'bosch-eval[flash]')")
    monkeypatch.setattr("bosch_eval.attention.kernels.flex.compile_policy", None)
    model = random_model(family, seed=3).to("cuda")
    ids, attention = left_padded_batch(model.config.vocab_size, [40, 26, 9], seed=4, device="cuda")
    for sinks in (0, 3):
        rows = (
            slice(0, 1) if backend == "flash_attention_2" and sinks else slice(None)
        )  # flash + sinks: no left padding
        mask = random_mask(model, sinks, sinks)
        expected = reference_logits(model.float(), mask, ids[rows], attention[rows])
        with hybridize(model.to(torch.bfloat16), mask, backend=backend):
            got = logits(model, ids[rows], attention[rows]).float()
        real = attention[rows].bool()
        torch.testing.assert_close(got[real], expected[real], atol=5e-2, rtol=5e-2)


def test_layer_split_runs_of_consecutive_groups():
    # Full groups 0 and 3–4, SWA groups 1–2 and 5; offsets count within each kind.
    mask = HeadMask.from_rows([[1, 0, 0, 1, 1, 0]], 12)
    split = HybridSpec.build(mask, window=4, backend="sdpa").layer_split(0)
    assert split.full == (GroupRun(0, 1, 0), GroupRun(3, 5, 1))
    assert split.swa == (GroupRun(1, 3, 0), GroupRun(5, 6, 2))
    assert (split.full_groups, split.swa_groups, split.group_size) == ([0, 3, 4], [1, 2, 5], 2)


@pytest.mark.parametrize("family", ["gpt2", "mistral"])
def test_multi_head_families_decode_on_the_hybrid_cache_as_by_recomputation(family):
    """G = H models (GPT-2 has no num_key_value_groups at all): the deploy-mode cache
    keeps W − 1 positions per SWA head and greedy decoding equals recomputation."""
    from bosch_eval.caches.hybrid_cache import HybridCache

    model = random_model(family)
    assert ModelShape.from_config(model.config).group_size == 1
    hybridize(model, random_mask(model, 0), backend="blocked")
    ids, _ = left_padded_batch(model.config.vocab_size, [12])
    generated = model.generate(
        ids, past_key_values=HybridCache.for_model(model), max_new_tokens=8, do_sample=False, min_new_tokens=8
    )
    recomputed = ids
    for _ in range(8):
        next_token = logits(model, recomputed)[:, -1].argmax(-1, keepdim=True)
        recomputed = torch.cat([recomputed, next_token], dim=1)
    assert torch.equal(generated, recomputed)
