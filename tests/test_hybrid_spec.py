"""The hybrid spec as one value, applied reversibly: validation in one place, swaps in place,
the model given back bit for bit, and caches that refuse another spec."""

from __future__ import annotations

import copy
import dataclasses
import logging

import pytest
import torch

from bosch_eval.attention.hybrid_attention import apply_spec, hybrid_state, hybridize
from bosch_eval.attention.hybrid_spec import HybridSpec, RunsOn
from bosch_eval.attention.kernels import choice, flash, flex
from bosch_eval.attention.local_window import LocalWindow
from bosch_eval.caches.hybrid_cache import HybridCache
from bosch_eval.masks.head_mask import HeadMask, ModelShape
from bosch_eval.models.random_model import random_model
from bosch_eval.runtime.errors import MaskError, SettingsError
from tests.helpers import left_padded_batch

WINDOW = 5


@pytest.fixture(autouse=True)
def eager_flex(monkeypatch):
    monkeypatch.setattr(flex, "compile_policy", False)


def mixed_mask(model, seed: int = 0, sinks: int = 0) -> HeadMask:
    shape = ModelShape.from_config(model.config)
    rows = torch.randint(
        0, 2, (shape.num_layers, shape.num_kv_heads), generator=torch.Generator().manual_seed(seed)
    ).tolist()
    rows[0] = [g % 2 for g in range(shape.num_kv_heads)]
    return HeadMask.from_rows(rows, shape.num_heads, window=WINDOW, sinks=sinks)


def logits(model, ids, attention=None) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=attention).logits


def assert_same_model(model: torch.nn.Module, untouched: torch.nn.Module) -> None:
    """Configs, modules (their attributes, parameters, buffers) equal, bit for bit."""
    assert model.config.to_dict() == untouched.config.to_dict()
    assert vars(model.config).keys() == vars(untouched.config).keys()
    assert model.config._attn_implementation == untouched.config._attn_implementation
    modules, originals = dict(model.named_modules()), dict(untouched.named_modules())
    assert modules.keys() == originals.keys()
    for name, module in modules.items():
        original = originals[name]
        assert type(module) is type(original), name
        assert vars(module).keys() == vars(original).keys(), f"{name}: {set(vars(module)) ^ set(vars(original))}"
        for attribute, value in vars(module).items():
            if attribute in ("_parameters", "_buffers"):
                assert value.keys() == vars(original)[attribute].keys()
                for key, tensor in value.items():
                    other = vars(original)[attribute][key]
                    assert (tensor is None and other is None) or torch.equal(tensor, other), f"{name}.{key}"
            elif attribute == "config":
                assert value.to_dict() == vars(original)[attribute].to_dict()
            elif not isinstance(value, (torch.nn.Module, dict, torch.Tensor)) and not callable(value):
                assert value == vars(original)[attribute], f"{name}.{attribute}"


class TestRestore:
    @pytest.mark.parametrize("backend", ["sdpa", "blocked", "flex"])
    @pytest.mark.parametrize("family", ["qwen3", "gpt2"])
    def test_leaving_the_context_gives_the_model_back_bit_for_bit(self, family, backend):
        model = random_model(family, seed=2)
        untouched = copy.deepcopy(model)
        ids, attention = left_padded_batch(model.config.vocab_size, [30, 19], seed=3)
        expected = logits(untouched, ids, attention)
        with hybridize(model, mixed_mask(model, 0, sinks=2), backend=backend) as hybrid:
            assert model.config._attn_implementation == "bosch_sdpa" and "bosch_mask" in vars(model.config)
            assert not torch.equal(logits(model, ids, attention), expected)  # the spec ran
            hybrid.set_mask(mixed_mask(model, 1), window=3)  # and swaps in place
            logits(model, ids, attention)
        assert torch.equal(logits(model, ids, attention), expected)
        assert_same_model(model, untouched)
        assert not hasattr(model, "bosch_hybrid") and "bosch_mask" not in vars(model.config)

    def test_a_saved_mask_in_the_config_is_put_back(self):
        model = random_model("qwen3")
        saved = mixed_mask(model, 3).to_json()
        model.config.bosch_mask = copy.deepcopy(saved)  # as a hybrid checkpoint loads
        with hybridize(model, mixed_mask(model, 0)):
            assert model.config.bosch_mask != saved
        assert model.config.bosch_mask == saved

    def test_the_model_is_restored_when_the_block_raises(self):
        model = random_model("qwen3")
        with pytest.raises(ValueError, match="inside"), hybridize(model, mixed_mask(model)):
            raise ValueError("inside")
        assert model.config._attn_implementation == "sdpa" and not hasattr(model, "bosch_hybrid")

    def test_a_restored_handle_refuses_swaps_and_a_new_one_can_be_applied(self):
        model = random_model("qwen3")
        with hybridize(model, mixed_mask(model)) as hybrid:
            pass
        with pytest.raises(RuntimeError, match="restored to the original"):
            hybrid.set_mask(mixed_mask(model, 1))
        hybrid.restore()  # idempotent
        again = hybridize(model, mixed_mask(model, 1))
        assert again is not hybrid and hybrid_state(model) is again

    def test_nested_blocks_go_back_to_the_spec_each_found_and_the_outer_one_restores(self):
        model = random_model("qwen3", seed=4)
        untouched = copy.deepcopy(model)
        ids, attention = left_padded_batch(model.config.vocab_size, [24, 17], seed=5)
        outer, inner = mixed_mask(model, 0), mixed_mask(model, 1)
        with hybridize(model, outer) as first:
            expected_outer = logits(model, ids, attention)
            with hybridize(model, inner) as second:
                assert second is first and first.mask == inner
                assert not torch.equal(logits(model, ids, attention), expected_outer)
            assert first.mask == outer and not first.restored  # the inner block gave back the outer spec
            assert torch.equal(logits(model, ids, attention), expected_outer)
        assert_same_model(model, untouched)
        assert not hasattr(model, "bosch_hybrid")

    def test_a_block_on_a_model_hybridized_without_one_goes_back_to_that_spec(self):
        model = random_model("qwen3", seed=4)
        kept = hybridize(model, mixed_mask(model, 0))  # as the adapter does: applied for the model's life
        with hybridize(model, mixed_mask(model, 1)):
            pass
        assert hybrid_state(model) is kept and kept.mask == mixed_mask(model, 0) and not kept.restored
        kept.set_mask(mixed_mask(model, 2))  # a swap inside a block is undone by the block's exit
        with hybridize(model, mixed_mask(model, 3)) as hybrid:
            hybrid.set_mask(mixed_mask(model, 1))
        assert kept.mask == mixed_mask(model, 2)

    def test_weights_are_never_copied(self):
        model = random_model("llama")
        pointers = {name: p.data_ptr() for name, p in model.named_parameters()}
        with hybridize(model, mixed_mask(model)) as hybrid:
            for seed in range(5):
                hybrid.set_mask(mixed_mask(model, seed))
        assert {name: p.data_ptr() for name, p in model.named_parameters()} == pointers


class TestSpec:
    def test_built_once_immutable_and_swapped_as_a_whole(self):
        model = random_model("qwen3")
        spec = HybridSpec.build(
            mixed_mask(model), sinks=2, backend="blocked", on=RunsOn(shape=ModelShape.from_config(model.config))
        )
        assert (spec.local, spec.backend) == (LocalWindow(WINDOW, 2), "blocked")
        with pytest.raises(dataclasses.FrozenInstanceError):
            spec.backend = "sdpa"
        hybrid = apply_spec(model, spec)
        assert hybrid.spec is spec and model.config.bosch_mask["sinks"] == 2
        other = spec.with_mask(mixed_mask(model, 1))  # window and sinks stay
        assert other.local == spec.local and other.mask.bits != spec.mask.bits
        hybrid.swap(other)
        assert hybrid.spec is other and hybrid.mask is other.mask and hybrid.window == WINDOW and hybrid.sinks == 2
        hybrid.restore()

    def test_validation_names_the_input(self):
        model = random_model("qwen3")
        shape = ModelShape.from_config(model.config)
        mask = mixed_mask(model)
        with pytest.raises(MaskError, match="mask.json: field 'window' is missing"):
            HybridSpec.build(mask.with_meta(window=None), source="mask.json")
        with pytest.raises(MaskError, match="sink: expected an integer >= 0"):
            HybridSpec.build(mask, sinks=-1)
        with pytest.raises(MaskError, match="window: expected a positive integer"):
            HybridSpec.build(mask, window=0)
        with pytest.raises(SettingsError, match=r"attn_backend: expected one of \['auto'"):
            HybridSpec.build(mask, backend="triton")
        with pytest.raises(SettingsError, match="'flash_attention_2' needs a CUDA model"):
            HybridSpec.build(mask, backend="flash_attention_2")
        with pytest.raises(MaskError, match="field 'num_layers'"):
            HybridSpec.build(
                HeadMask.uniform(
                    ModelShape(shape.num_layers + 1, shape.num_heads, shape.num_kv_heads), full=True, window=4
                ),
                on=RunsOn(shape=shape),
            )
        with pytest.raises(SettingsError, match="a concrete backend"):
            HybridSpec(mask, LocalWindow(4), "auto")

    def test_a_spec_for_another_shape_is_refused_by_the_model(self):
        model = random_model("qwen3")
        shape = ModelShape.from_config(model.config)
        wrong = HybridSpec(
            HeadMask.uniform(ModelShape(shape.num_layers, shape.num_heads, 2), full=False, window=4),
            LocalWindow(4),
            "sdpa",
        )
        with pytest.raises(MaskError, match="num_kv_heads"):
            apply_spec(model, wrong)
        assert not hasattr(model, "bosch_hybrid")


class TestCacheOwnership:
    def generate(self, model, cache, ids):
        return model.generate(
            input_ids=ids, past_key_values=cache, max_new_tokens=3, min_new_tokens=3, do_sample=False, pad_token_id=0
        )

    def test_a_cache_refuses_another_window(self):
        model = random_model("qwen3", num_layers=4, seed=5)
        hybrid = hybridize(model, mixed_mask(model), backend="blocked")
        ids, _ = left_padded_batch(model.config.vocab_size, [6], seed=4)
        cache = HybridCache.for_model(model)
        assert cache.spec is hybrid.spec
        hybrid.set_mask(hybrid.mask, window=WINDOW + 1)  # the same groups, another window
        with pytest.raises(RuntimeError, match="the KV cache was built for another mask, window or sink count"):
            self.generate(model, cache, ids)

    def test_a_cache_runs_under_an_equal_spec(self):
        model = random_model("qwen3", num_layers=4, seed=5)
        hybrid = hybridize(model, mixed_mask(model), backend="blocked")
        ids, _ = left_padded_batch(model.config.vocab_size, [6], seed=4)
        cache = HybridCache.for_model(model)
        hybrid.set_mask(mixed_mask(model))  # a new spec object, the same layout
        self.generate(model, cache, ids)

    def test_a_cache_refuses_a_restored_model(self):
        model = random_model("qwen3", num_layers=4, seed=5)
        hybrid = hybridize(model, mixed_mask(model), backend="blocked")
        cache = HybridCache.for_model(model)
        hybrid.restore()
        with pytest.raises(RuntimeError, match="restored to the original"):
            cache.update(torch.zeros(1, 4, 1, 16), torch.zeros(1, 4, 1, 16), 0)


class TestAuto:
    """``auto``'s choice per device, with CUDA faked: the choice is what runs there."""

    @pytest.fixture(autouse=True)
    def fresh_choice(self):
        choice._cuda_choice.cache_clear()
        yield
        choice._cuda_choice.cache_clear()

    def test_cpu_runs_the_measured_choice(self):
        assert (
            HybridSpec.build(HeadMask.uniform(ModelShape(2, 4, 2), full=False, window=4)).backend
            == choice.CPU_CHOICE
            == "blocked"
        )

    def test_cuda_with_flash_attn_runs_flash(self, monkeypatch):
        monkeypatch.setattr(flash, "flash_unavailable", lambda device: None)
        picked = choice.choose_backend(torch.device("cuda:0"), torch.bfloat16)
        assert picked.name == "flash_attention_2" and "flash-attn is installed" in picked.reason

    def test_cuda_without_flash_attn_runs_compiled_flex_probed_on_its_device_and_dtype(self, monkeypatch):
        probed = []
        monkeypatch.setattr(flex, "compile_failure", lambda device, dtype: probed.append((device, dtype)))
        picked = choice.choose_backend(torch.device("cuda:0"), torch.bfloat16)
        assert picked.name == "flex" and probed == [("cuda:0", torch.bfloat16)]

    def test_cuda_fallback_says_why_once(self, monkeypatch, caplog):
        monkeypatch.setattr(flex, "compile_failure", lambda device, dtype: "BackendCompilerFailed: no Triton")
        with caplog.at_level(logging.WARNING, logger="bosch_eval"):
            picked = [choice.choose_backend(torch.device("cuda:0"), torch.float16) for _ in range(3)]
        assert {p.name for p in picked} == {"blocked"}
        assert "flash-attn needs a CUDA model" in picked[0].reason and "no Triton" in picked[0].reason
        assert caplog.text.count("fell back to the blocked kernel") == 1

    def test_the_reason_travels_with_the_spec(self, monkeypatch):
        monkeypatch.setattr(flex, "compile_failure", lambda device, dtype: None)
        spec = HybridSpec.build(
            HeadMask.uniform(ModelShape(2, 4, 2), full=False, window=4), on=RunsOn("cuda:0", torch.bfloat16)
        )
        assert spec.backend == "flex" and "compiled FlexAttention" in spec.backend_reason
