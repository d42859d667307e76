"""LogQuant / KiVi KV quantization: the selection rule against a direct implementation of
the seed's rule, quantization error bounds, packing, bytes = formula, and the model-level
oracles (window covering everything = bit-identical, greedy generation unchanged)."""

from __future__ import annotations

import logging
import sys

import pytest
import torch

from bosch_eval.attention.hybrid_attention import hybrid_state, hybridize
from bosch_eval.caches.hybrid_cache import HybridCache, HybridHeadLayer, kv_cache_bytes
from bosch_eval.caches.kv_quant import fused as fused_module
from bosch_eval.caches.kv_quant import methods
from bosch_eval.caches.kv_quant.config import KVQuantConfig, parse_kv_quant
from bosch_eval.caches.kv_quant.formula import KVLayout, kv_cache_bytes_formula
from bosch_eval.caches.kv_quant.layer import QuantizedFullLayer
from bosch_eval.caches.kv_quant.methods import KV_QUANT_METHODS
from bosch_eval.caches.kv_quant.packing import (
    dequantize_keys,
    dequantize_values,
    pack,
    quantize_keys,
    quantize_values,
    unpack,
)
from bosch_eval.caches.kv_quant.selection import Selector
from bosch_eval.caches.kv_quant.store import QuantizedKVStore
from bosch_eval.masks.head_mask import HeadMask
from bosch_eval.models.random_model import random_model
from bosch_eval.runtime.errors import SettingsError
from tests.helpers import left_padded_batch


def seed_rule(length: int, window: int, method: str) -> list[int]:
    """The seed's Fig. 6, directly: reserved tokens grow from 2W to 3W; then the first 2W
    are filtered, half of them quantized (every second one), leaving 2W. KiVi: the oldest
    W of the 3W are quantized."""
    reserved: list[int] = []
    for t in range(length):
        reserved.append(t)
        if len(reserved) == 3 * window:
            first, rest = reserved[: 2 * window], reserved[2 * window :]
            reserved = ([first[i] for i in range(0, 2 * window, 2)] if method == "logquant" else first[window:]) + rest
    return reserved


def lengths_for(window: int) -> list[int]:
    return sorted(
        {
            1,
            window,
            2 * window,
            2 * window + 1,
            3 * window - 1,
            3 * window,
            3 * window + 1,
            4 * window,
            7 * window + 3,
            16 * window,
        }
    )


class TestSelection:
    @pytest.mark.parametrize("method", ["logquant", "kivi"])
    @pytest.mark.parametrize("window", [1, 2, 3, 4, 8])
    def test_token_by_token_equals_the_seed_rule(self, method, window):
        for length in lengths_for(window):
            selector = Selector(method, window)
            for t in range(1, length + 1):
                selector.advance_to(t)
            assert selector.full_precision == seed_rule(length, window, method), (window, length)

    def test_logquant_density_halves_with_distance(self):
        kept = seed_rule(16 * 8, 8, "logquant")
        assert len(kept) == 16 and kept[0] == 0  # 2W after an event, the sink survives
        assert kept[-8:] == list(range(120, 128))  # the recent W


class TestPacking:
    @pytest.mark.parametrize("bits", [2, 4])
    def test_pack_roundtrip(self, bits):
        codes = torch.randint(0, 2**bits, (3, 5, 16), generator=torch.Generator().manual_seed(0))
        packed = pack(codes, bits)
        assert packed.dtype == torch.uint8 and packed.shape[-1] == 16 * bits // 8
        assert torch.equal(unpack(packed, bits), codes.to(torch.uint8))

    def test_error_at_most_half_a_step_and_4_bit_below_2_bit(self):
        x = torch.randn(2, 3, 64, 32, generator=torch.Generator().manual_seed(1)) * 3
        errors = {}
        for bits in (2, 4):
            k = quantize_keys(x, bits)
            k_err = (dequantize_keys(k, bits, x.dtype) - x).abs()
            assert (k_err <= k.scale / 2 + 1e-5).all()
            v = quantize_values(x, bits, 8)
            v_err = (dequantize_values(v, bits, x.dtype) - x).abs()
            assert (v_err <= v.scale.repeat_interleave(8, dim=-1) / 2 + 1e-5).all()
            errors[bits] = (k_err.mean() + v_err.mean()).item()
        assert errors[4] < errors[2]

    def test_constant_channel_is_exact(self):
        x = torch.full((1, 1, 8, 4), 0.3)
        assert torch.equal(dequantize_keys(quantize_keys(x, 2), 2, x.dtype), x)


class TestArguments:
    @pytest.mark.parametrize(
        "args, message",
        [
            (dict(kv_quant="gptq", kv_window=8), "kv_quant: expected one of ['logquant', 'kivi', 'none']"),
            (dict(kv_quant="logquant", kv_bits=3, kv_window=8), "kv_bits: expected one of [2, 4]"),
            (dict(kv_quant="logquant", kv_window=0), "kv_window: expected a positive integer"),
            (dict(kv_quant="logquant", kv_window=-4), "kv_window: expected a positive integer"),
            (dict(kv_quant="logquant", kv_window="x"), "kv_window: expected an integer"),
            (dict(kv_quant="logquant"), "kv_window: kv_quant=logquant needs kv_window"),
            (
                dict(kv_quant="kivi", kv_window=8, kv_group_size=6),
                "kv_group_size: 6 does not divide the head dim 16; expected one of [1, 2, 4, 8, 16]",
            ),
            (dict(kv_quant="none", kv_bits=2), "kv_bits: only used with kv_quant=logquant|kivi"),
        ],
    )
    def test_bad_input_names_the_argument_and_allowed_values(self, args, message):
        with pytest.raises(SettingsError) as error:
            parse_kv_quant(head_dim=16, **args)
        assert message in str(error.value)

    def test_defaults(self):
        assert parse_kv_quant("none") is None
        assert parse_kv_quant("logquant", kv_window="8", head_dim=16) == KVQuantConfig("logquant", 2, 8, 16)
        assert parse_kv_quant("kivi", kv_bits="4", kv_window=8, head_dim=128).group_size == 64


def quantized_model(rows, seed=5):
    model = random_model("qwen3", num_layers=4, seed=seed)
    hybridize(model, HeadMask.from_rows(rows, 8, window=8), backend="blocked")
    return model


ALL_FULL = [[1, 1, 1, 1]] * 4
MIXED = [[1, 1, 1, 1], [0, 1, 0, 0], [0, 0, 0, 0], [1, 0, 1, 0]]


def prefill_and_decode(model, ids, cache, prefill):
    """Logits of every position: ``prefill`` tokens in one pass, the rest one at a time."""
    with torch.no_grad():
        out = [model(input_ids=ids[:, :prefill], past_key_values=cache, use_cache=True).logits]
        for t in range(prefill, ids.shape[1]):
            out.append(model(input_ids=ids[:, t : t + 1], past_key_values=cache, use_cache=True).logits)
    return torch.cat(out, dim=1)


class TestCache:
    @pytest.mark.parametrize("rows", [ALL_FULL, MIXED], ids=["full", "mixed"])
    @pytest.mark.parametrize("method", ["logquant", "kivi"])
    def test_window_covering_everything_is_bit_identical(self, rows, method):
        model = quantized_model(rows)
        ids = torch.randint(3, model.config.vocab_size, (2, 30), generator=torch.Generator().manual_seed(3))
        plain = prefill_and_decode(model, ids, HybridCache.for_model(model), 12)
        config = KVQuantConfig(method, 2, 11, 16)  # 3W = 33 > 30 positions: nothing is ever quantized
        cache = HybridCache.for_model(model, config)
        assert torch.equal(prefill_and_decode(model, ids, cache, 12), plain)
        assert all(layer.store.key_codes is None for layer in cache.layers if isinstance(layer, QuantizedFullLayer))

    @pytest.mark.parametrize("method", ["logquant", "kivi"])
    @pytest.mark.parametrize(
        "window, prefill", [(2, 5), (3, 9), (4, 1), (4, 8), (4, 11), (4, 12), (4, 13), (4, 17)]
    )  # 2W, 3W − 1, 3W, 3W + 1
    def test_stored_index_sets_follow_the_rule_after_prefill_and_decode(self, method, window, prefill):
        model = quantized_model(MIXED)
        length = 13 * window + 1
        ids = torch.randint(3, model.config.vocab_size, (1, length), generator=torch.Generator().manual_seed(4))
        cache = HybridCache.for_model(model, KVQuantConfig(method, 2, window, 16))
        with torch.no_grad():
            model(input_ids=ids[:, :prefill], past_key_values=cache, use_cache=True)
            for t in range(prefill, length):
                model(input_ids=ids[:, t : t + 1], past_key_values=cache, use_cache=True)
                expected = seed_rule(t + 1, window, method)
                for layer in cache.layers:
                    store = layer.quantized if isinstance(layer, HybridHeadLayer) else layer.store
                    if store is None:
                        continue
                    assert store.fp_positions.tolist() == expected
                    assert sorted(store.quantized_positions.tolist()) == sorted(set(range(t + 1)) - set(expected))
                    assert store.fp_keys.shape[2] == len(expected)

    @pytest.mark.parametrize("method", ["logquant", "kivi"])
    def test_quantized_positions_hold_dequantized_states_in_place(self, method):
        """What attention sees = the unquantized states at full-precision positions and
        within half a step of them elsewhere; positions (RoPE) unchanged."""
        model = quantized_model(ALL_FULL)
        ids = torch.randint(3, model.config.vocab_size, (1, 40), generator=torch.Generator().manual_seed(6))
        plain, quant = HybridCache.for_model(model), HybridCache.for_model(model, KVQuantConfig(method, 4, 4, 8))
        with torch.no_grad():
            model(input_ids=ids, past_key_values=plain, use_cache=True)
            model(input_ids=ids, past_key_values=quant, use_cache=True)
        layer = quant.layers[1]
        keys, values = layer.store.past()
        fp = layer.store.fp_positions
        assert torch.equal(keys[:, :, fp], plain.layers[1].keys[:, :, fp])
        assert not torch.equal(keys, plain.layers[1].keys)
        step = (plain.layers[1].keys.amax() - plain.layers[1].keys.amin()) / 15
        assert (keys - plain.layers[1].keys).abs().max() <= step / 2 + 1e-5
        plain_values = plain.layers[1].values
        assert torch.equal(values[:, :, fp], plain_values[:, :, fp])
        assert (values - plain_values).abs().max() <= (plain_values.amax() - plain_values.amin()) / 15 / 2 + 1e-5

    @pytest.mark.parametrize("rows", [ALL_FULL, MIXED], ids=["full", "mixed"])
    @pytest.mark.parametrize(
        "method, bits, window, length",
        [("logquant", 2, 4, 3), ("logquant", 2, 4, 12), ("logquant", 4, 4, 45), ("kivi", 2, 3, 41)],
    )
    @pytest.mark.parametrize("sinks", [0, 3])
    def test_bytes_equal_the_formula(self, rows, method, bits, window, length, sinks):
        model = quantized_model(rows)
        hybrid_state(model).set_mask(hybrid_state(model).mask, sinks=sinks)  # sinks compose with the quantized store
        config = KVQuantConfig(method, bits, window, 8)
        cache = HybridCache.for_model(model, config)
        ids = torch.randint(3, model.config.vocab_size, (1, length), generator=torch.Generator().manual_seed(7))
        with torch.no_grad():
            model(input_ids=ids, past_key_values=cache, use_cache=True)
        expected = kv_cache_bytes_formula(
            rows, KVLayout(4, 4, model.config.head_dim), length, window=8, kv_quant=config, dtype_bytes=4, sinks=sinks
        )
        assert kv_cache_bytes(cache) == expected

    def test_quantized_bytes_are_below_full_precision(self):
        full = kv_cache_bytes_formula(None, KVLayout(2, 8, 128), 8192, dtype_bytes=2)
        logquant = kv_cache_bytes_formula(
            None, KVLayout(2, 8, 128), 8192, kv_quant=KVQuantConfig("logquant", 2, 128, 64), dtype_bytes=2
        )
        assert logquant / full < 0.2

    @pytest.mark.parametrize("rows", [ALL_FULL, MIXED], ids=["full", "mixed"])
    def test_greedy_generation_with_4_bit_window_covering_everything_equals_plain(self, rows):
        model = quantized_model(rows)
        ids, attention = left_padded_batch(model.config.vocab_size, [11, 5, 17], seed=2)
        kwargs = dict(
            input_ids=ids,
            attention_mask=attention,
            max_new_tokens=24,
            min_new_tokens=24,
            do_sample=False,
            pad_token_id=0,
        )
        plain = model.generate(past_key_values=HybridCache.for_model(model), **kwargs)
        quant = model.generate(
            past_key_values=HybridCache.for_model(model, KVQuantConfig("logquant", 4, 14, 16)), **kwargs
        )
        assert torch.equal(plain, quant)

    def test_generation_with_quantization_runs_and_quantizes(self):
        model = quantized_model(MIXED)
        ids, attention = left_padded_batch(model.config.vocab_size, [11, 5, 17], seed=2)
        cache = HybridCache.for_model(model, KVQuantConfig("logquant", 2, 4, 16))
        out = model.generate(
            input_ids=ids,
            attention_mask=attention,
            past_key_values=cache,
            max_new_tokens=20,
            do_sample=False,
            pad_token_id=0,
        )
        assert out.shape[1] == 17 + 20
        assert cache.layers[0].store.key_codes is not None and cache.layers[0].store.key_codes.dtype == torch.uint8

    @pytest.mark.parametrize(
        "method, bits, dtype",
        [("logquant", 2, torch.float32), ("kivi", 2, torch.float32), ("logquant", 4, torch.bfloat16)],
    )
    def test_fused_rebuild_equals_the_eager_rebuild(self, method, bits, dtype, monkeypatch):
        """The compiled one-pass rebuild (what a decode step uses) against the store's eager
        rebuild, after a prefill and through decode steps that release more tokens: full-precision
        positions copied exactly, quantized ones equal up to rounding."""
        try:
            torch.compile(lambda x: x * 2 + 1)(torch.ones(3))
        except Exception as err:  # noqa: BLE001 - this machine cannot compile anything (no C++ compiler or headers)
            pytest.skip(f"torch.compile cannot run here ({type(err).__name__}); the store rebuilds eagerly")
        # Whether an earlier test's configuration fell back is not this test's question.
        monkeypatch.setattr(fused_module, "enabled", True)
        monkeypatch.setattr(fused_module, "disabled_reason", "")
        store, states = self._prefilled_store(method, bits, dtype)
        for t in range(23, 40):
            new_keys, new_values = states[0, :, :, t : t + 1], states[1, :, :, t : t + 1]
            fused = store._rebuild(new_keys, new_values)
            assert fused_module.enabled, (
                f"the compiled rebuild failed and the store fell back to the eager one: {fused_module.disabled_reason}"
            )
            monkeypatch.setattr(fused_module, "enabled", False)
            eager = store._rebuild(new_keys, new_values)
            monkeypatch.setattr(fused_module, "enabled", True)
            fp = store.fp_positions
            for got, want in zip(fused, eager):
                assert got.shape == want.shape == (2, 2, t + 1, 16) and got.dtype == dtype
                assert torch.equal(got[:, :, fp], want[:, :, fp]) and torch.equal(got[:, :, -1:], want[:, :, -1:])
                # bf16: eager rounds codes·scale, then adds; the fused pass rounds once
                torch.testing.assert_close(got, want, **({"atol": 2**-6, "rtol": 0} if dtype == torch.bfloat16 else {}))
            store.update(new_keys, new_values)
        assert store.key_codes is not None and store.quantized_positions.numel() > 0

    def test_a_failing_compile_falls_back_to_the_eager_rebuild_and_says_so(self, monkeypatch, caplog):
        store, states = self._prefilled_store("logquant", 2, torch.float32)
        new_keys, new_values = states[0, :, :, 23:24], states[1, :, :, 23:24]
        monkeypatch.setattr(fused_module, "enabled", False)
        eager = store._rebuild(new_keys, new_values)

        def no_compiler(*tensors):
            raise RuntimeError("InvalidCxxCompiler: No working C++ compiler found")

        monkeypatch.setattr(fused_module, "enabled", True)
        monkeypatch.setattr(fused_module, "disabled_reason", "")
        monkeypatch.setattr(fused_module, "_compiled", lambda packing: no_compiler)
        with caplog.at_level(logging.WARNING, logger="bosch_eval.caches.kv_quant.fused"):
            got = store._rebuild(new_keys, new_values)
        assert all(torch.equal(a, b) for a, b in zip(got, eager))
        assert (
            not fused_module.enabled
            and "rebuilding with eager PyTorch" in caplog.text
            and "No working C++ compiler" in caplog.text
        )
        assert fused_module.disabled_reason == "RuntimeError: InvalidCxxCompiler: No working C++ compiler found"

    @staticmethod
    def _prefilled_store(method: str, bits: int, dtype: torch.dtype) -> tuple[QuantizedKVStore, torch.Tensor]:
        """A store after a 23-token prefill (W = 4: tokens already quantized) and the
        ``[2 (K/V), B=2, G=2, 40, D=16]`` states it was filled from."""
        store = QuantizedKVStore(KVQuantConfig(method, bits, 4, 8), Selector(method, 4))
        states = torch.randn(2, 2, 2, 40, 16, generator=torch.Generator().manual_seed(9)).to(dtype)
        store.update(states[0, :, :, :23], states[1, :, :, :23])
        return store, states


class TestMethods:
    def test_unknown_methods_are_named(self):
        with pytest.raises(
            SettingsError,
            match=r"kv_quant: unknown KV-quantization method 'kiwi', expected one of \['kivi', 'logquant'\] \(did you mean 'kivi'\?\)",
        ):
            Selector("kiwi", 4)

    def test_a_method_is_one_new_module_of_the_package(self, tmp_path, monkeypatch):
        """KiVi's rule again, from a new module of ``bosch_eval.caches.kv_quant.methods`` and without
        ``oldest_first``: the store's general rebuild (positions copied by index) gives the
        logits KiVi's in-place rebuild gives, bit for bit."""
        (tmp_path / "bosch_test_kivi_indexed.py").write_text(
            "from bosch_eval.caches.kv_quant.methods import KV_QUANT_METHODS, KVQuantMethod\n"
            "KV_QUANT_METHODS.register('kivi-indexed', KVQuantMethod(KV_QUANT_METHODS['kivi'].release))\n"
        )
        monkeypatch.setattr(methods, "__path__", [*methods.__path__, str(tmp_path)])
        monkeypatch.setattr(KV_QUANT_METHODS, "members", dict(KV_QUANT_METHODS.members))
        monkeypatch.setattr(fused_module, "enabled", False)  # the eager rebuild, where the two paths differ
        model = quantized_model(MIXED)
        ids = torch.randint(3, model.config.vocab_size, (2, 40), generator=torch.Generator().manual_seed(8))
        try:
            config = parse_kv_quant("kivi-indexed", kv_window="4", head_dim=16)
            assert config == KVQuantConfig("kivi-indexed", 2, 4, 16)
            assert not Selector("kivi-indexed", 4).rule.oldest_first and Selector("kivi", 4).rule.oldest_first
            indexed = prefill_and_decode(model, ids, HybridCache.for_model(model, config), 13)
        finally:
            sys.modules.pop(f"{methods.__name__}.bosch_test_kivi_indexed", None)
        in_place = prefill_and_decode(model, ids, HybridCache.for_model(model, KVQuantConfig("kivi", 2, 4, 16)), 13)
        assert torch.equal(indexed, in_place)
        assert not torch.equal(
            in_place, prefill_and_decode(model, ids, HybridCache.for_model(model), 13)
        )  # tokens were quantized


def test_bench_measures_quantized_configs_and_matches_the_formula():
    from bosch_eval.bench.report import max_batch, ratio_table
    from bosch_eval.bench.runner import BenchPlan, run_bench

    model = random_model("qwen3", num_layers=4)
    kv = KVQuantConfig("logquant", 2, 4, 8)
    rows = run_bench(model, [("r", 0.75), ("lq", None, kv), ("r+lq", 0.75, kv)], BenchPlan([64], 2, repeats=1))
    assert [r.label for r in rows] == ["original", "r", "lq", "r+lq"]
    assert all(r.kv_cache_bytes == r.kv_bytes_formula for r in rows)
    original, hybrid, lq, both = rows
    assert (
        both.kv_cache_bytes < lq.kv_cache_bytes < original.kv_cache_bytes
        and both.kv_cache_bytes < hybrid.kv_cache_bytes
    )
    assert lq.kv_quant == "logquant-2bit-W4" and lq.swa_ratio == 0.0
    table = ratio_table(rows, budget_bytes=10**6, weight_bytes=0)
    assert f"| logquant-2bit-W4 | {lq.kv_bytes_formula} | {max_batch(10**6, 0, lq.kv_bytes_formula)} |" in table
    assert max_batch(1000, 100, 300) == 3
