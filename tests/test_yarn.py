"""YaRN on a model config (``bosch_eval.models.rope_scaling``) and through the ``bosch`` adapter:
the keys transformers reads, factor 1 = no scaling, inv_freq = transformers' own YaRN,
and scores that change at factor 2."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from bosch_eval.model_adapters.bosch import BoschLM
from bosch_eval.models.random_model import random_model
from bosch_eval.models.rope_scaling import apply_yarn, check_rope_args, scaled_config
from bosch_eval.runtime.errors import ModelError, SettingsError

MASK = dict(layers="intr", ratio=0.5, window=8)


@pytest.mark.parametrize("family", ["qwen3", "llama"])
def test_config_keys_are_transformers_yarn_keys(family):
    config = random_model(family).config
    apply_yarn(config, 4.0, 128)
    assert config.rope_parameters == {
        "rope_theta": 10000.0,
        "rope_type": "yarn",
        "factor": 4.0,
        "original_max_position_embeddings": 128,
    }
    assert config.max_position_embeddings == 512
    default = random_model(family).config
    apply_yarn(default, 2.0)  # the original length defaults to the config's own
    assert (
        default.rope_parameters["original_max_position_embeddings"] == 512 and default.max_position_embeddings == 1024
    )


@pytest.mark.parametrize("family", ["qwen3", "llama"])
def test_factor_one_is_the_unscaled_model(family):
    plain = random_model(family, seed=3)
    config = AutoConfig.for_model(**{"model_type": plain.config.model_type, **plain.config.to_diff_dict()})
    apply_yarn(config, 1.0)
    torch.manual_seed(3)
    scaled = AutoModelForCausalLM.from_config(config).eval()
    scaled.load_state_dict(plain.state_dict())
    assert scaled.model.rotary_emb.attention_scaling == 1.0
    torch.testing.assert_close(scaled.model.rotary_emb.inv_freq, plain.model.rotary_emb.inv_freq, rtol=0, atol=0)
    ids = torch.randint(0, 300, (2, 40), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(scaled(ids).logits, plain(ids).logits, rtol=0, atol=0)


def test_inv_freq_is_transformers_yarn_and_keeps_fast_dims(tiny_model_dir):
    config = scaled_config(str(tiny_model_dir), 2.0, 128)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, config=config)
    expected, attention = ROPE_INIT_FUNCTIONS["yarn"](config, torch.device("cpu"))
    torch.testing.assert_close(model.model.rotary_emb.inv_freq, expected, rtol=0, atol=0)
    assert model.model.rotary_emb.attention_scaling == pytest.approx(0.1 * math.log(2.0) + 1.0)
    base = 1.0 / 10000.0 ** (torch.arange(0, 16, 2, dtype=torch.float32) / 16)  # head_dim 16
    got = model.model.rotary_emb.inv_freq
    assert got[0] == base[0]  # the fastest dimension is extrapolated (kept)
    torch.testing.assert_close(got[-1], base[-1] / 2.0)  # the slowest is interpolated by the factor
    assert attention == model.model.rotary_emb.attention_scaling


class TestAdapter:
    def test_model_args_set_yarn_and_change_the_scores(self, tiny_model_dir):
        plain = BoschLM(pretrained=str(tiny_model_dir), device="cpu", **MASK)
        yarn = BoschLM(pretrained=str(tiny_model_dir), device="cpu", rope_scaling="yarn", rope_factor="2", **MASK)
        same = BoschLM(pretrained=str(tiny_model_dir), device="cpu", rope_scaling="yarn", rope_factor="1", **MASK)
        assert (
            yarn.model.config.rope_parameters["rope_type"] == "yarn"
            and yarn.model.config.rope_parameters["factor"] == 2.0
        )
        assert (plain.max_length, yarn.max_length) == (512, 1024)
        assert yarn.head_mask.bits == plain.head_mask.bits
        ids = torch.randint(3, 200, (1, 60), generator=torch.Generator().manual_seed(1))
        with torch.no_grad():
            logits = {name: lm.model(ids).logits for name, lm in (("plain", plain), ("yarn", yarn), ("same", same))}
        torch.testing.assert_close(logits["same"], logits["plain"], rtol=0, atol=0)
        assert (logits["yarn"] - logits["plain"]).abs().max() > 1e-3

    def test_bad_rope_args_are_named(self, tiny_model_dir):
        cases = [
            (dict(rope_factor=2), "rope_factor: only used with rope_scaling=yarn"),
            (dict(rope_scaling="ntk", rope_factor=2), "rope_scaling: expected one of ['yarn']"),
            (dict(rope_scaling="yarn"), "rope_factor: rope_scaling=yarn needs a factor"),
            (dict(rope_scaling="yarn", rope_factor="0.5"), "rope_factor: expected a number >= 1"),
            (
                dict(rope_scaling="yarn", rope_factor=2, rope_original_max_positions="-3"),
                "rope_original_max_positions: expected a positive integer",
            ),
        ]
        for args, message in cases:
            with pytest.raises(SettingsError) as error:
                BoschLM(pretrained=str(tiny_model_dir), device="cpu", **MASK, **args)
            assert message in str(error.value)
        with pytest.raises(SettingsError, match="needs pretrained= as a name or path"):
            BoschLM(pretrained=random_model(), device="cpu", rope_scaling="yarn", rope_factor=2, **MASK)

    def test_an_already_scaled_checkpoint_is_refused(self, tiny_model_dir, tmp_path):
        config = scaled_config(str(tiny_model_dir), 2.0)
        AutoModelForCausalLM.from_pretrained(tiny_model_dir, config=config).save_pretrained(tmp_path)
        with pytest.raises(
            ModelError, match=r"config.json: field 'rope_parameters' already has rope_type='yarn' \(factor 2.0\)"
        ):
            scaled_config(str(tmp_path), 2.0)


def test_check_rope_args_passes_no_scaling_through():
    assert check_rope_args(None, None, None, ("a", "b", "c")) == (None, None, None)
    assert check_rope_args("yarn", "2", "1024", ("a", "b", "c")) == ("yarn", 2.0, 1024)
