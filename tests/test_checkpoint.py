"""Save -> load of a hybrid model: same logits, the lm-eval path picks the saved mask up."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoTokenizer

from bosch_eval.attention.hybrid_attention import hybrid_state, hybridize
from bosch_eval.masks.head_mask import HeadMask
from bosch_eval.model_adapters.bosch import BoschLM
from bosch_eval.models.checkpoint import load_hybrid_model
from bosch_eval.models.random_model import random_model
from bosch_eval.runtime.errors import MaskError

ROWS = [[0, 1, 0, 1], [0, 0, 0, 0], [1, 1, 1, 0]]


@pytest.fixture
def hybrid_checkpoint(tiny_model_dir, tmp_path):
    model = load_plain(tiny_model_dir)
    hybridize(model, HeadMask.from_rows([[1] * 4] * 3, 8, window=9))
    hybrid_state(model).set_mask(HeadMask.from_rows(ROWS, 8), window=5)  # the saved mask is the current one
    model.save_pretrained(tmp_path / "hybrid")
    AutoTokenizer.from_pretrained(tiny_model_dir).save_pretrained(tmp_path / "hybrid")
    return model, tmp_path / "hybrid"


def load_plain(path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path).eval()


def test_round_trip_gives_identical_logits(hybrid_checkpoint):
    model, path = hybrid_checkpoint
    saved = json.loads((path / "config.json").read_text())["bosch_mask"]
    assert saved["mask"] == ROWS and saved["window"] == 5
    loaded = load_hybrid_model(path).eval()
    assert hybrid_state(loaded).mask.bits == tuple(map(tuple, ROWS)) and hybrid_state(loaded).window == 5
    ids = torch.randint(0, model.config.vocab_size, (2, 30))
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, model(ids).logits)


def test_lm_eval_adapter_restores_the_saved_mask(hybrid_checkpoint):
    _, path = hybrid_checkpoint
    lm = BoschLM(pretrained=str(path), device="cpu")
    assert lm.head_mask.bits == tuple(map(tuple, ROWS)) and lm.hybrid.window == 5
    same = BoschLM(pretrained=str(path), device="cpu", mask=HeadMask.from_rows(ROWS, 8, window=5))
    assert same.head_mask.bits == lm.head_mask.bits
    with pytest.raises(MaskError, match=r"differs from the mask saved in .*config.json"):
        BoschLM(pretrained=str(path), device="cpu", layers="intr", ratio=0.5, window=5)


def test_the_loaded_model_gives_back_the_plain_checkpoint(hybrid_checkpoint):
    _, path = hybrid_checkpoint
    plain = load_plain(path)  # the same weights under the model's own attention
    ids = torch.randint(0, plain.config.vocab_size, (2, 30), generator=torch.Generator().manual_seed(0))
    loaded = load_hybrid_model(path).eval()
    with torch.no_grad(), hybrid_state(loaded):
        assert not torch.equal(loaded(ids).logits, plain(ids).logits)  # ROWS turns heads to SWA with W = 5 < 30
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, plain(ids).logits)
    assert loaded.config._attn_implementation == plain.config._attn_implementation
    with pytest.raises(RuntimeError, match="is not hybridized"):
        hybrid_state(loaded)


def test_plain_checkpoint_is_not_a_hybrid_one(tiny_model_dir):
    with pytest.raises(MaskError, match="no field 'bosch_mask'; this is not a checkpoint of a hybrid model"):
        load_hybrid_model(tiny_model_dir)


@pytest.mark.parametrize("backend", ["sdpa", "blocked"])
def test_gradients_match_the_dense_band_reference(backend):
    """Training through the hybrid attention: parameter gradients against the dense reference."""
    from tests.helpers import reference_logits

    mask = HeadMask.from_rows([[1, 0, 1, 0], [0, 0, 0, 0], [1, 1, 1, 1]], 8, window=4)
    ids = torch.randint(0, 300, (2, 24), generator=torch.Generator().manual_seed(0))
    attention = torch.ones_like(ids)

    def gradients(logits_of):
        model = random_model("qwen3", seed=7).train()
        logits_of(model).logsumexp(-1).mean().backward()
        return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}

    expected = gradients(lambda m: reference_logits(m, mask, ids, attention, grad=True))
    got = gradients(
        lambda m: (hybridize(m, mask, backend=backend), m(input_ids=ids, attention_mask=attention).logits)[1]
    )
    assert expected.keys() == got.keys() and len(got) > 10
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], rtol=1e-5, atol=1e-7, msg=name)


class TestResolvedModel:
    """One object per model: path, config, defaults and what a hybrid checkpoint saved."""

    def test_a_bundled_alias_resolves_to_its_directory_defaults_and_shape(self):
        from bosch_eval.models.model_check import model_path
        from bosch_eval.models.model_defaults import model_defaults
        from bosch_eval.models.resolved_model import ResolvedModel

        toy = ResolvedModel.named("toy")
        assert toy.name == "toy" and toy.path == str(model_path("toy"))
        assert toy.defaults == model_defaults(toy.path) and toy.defaults.window is not None
        assert toy.shape.num_layers == toy.config.num_hidden_layers
        assert (toy.saved_mask, toy.saved_kv_quant) == (None, None)

    def test_a_hybrid_checkpoint_brings_its_saved_mask(self, hybrid_checkpoint):
        from bosch_eval.models.resolved_model import ResolvedModel

        model, path = hybrid_checkpoint
        resolved = ResolvedModel.named(str(path))
        assert [list(row) for row in resolved.saved_mask.bits] == ROWS and resolved.saved_mask.window == 5
        assert ResolvedModel.loaded(model).saved_mask.bits == resolved.saved_mask.bits

    def test_the_adapter_takes_a_resolved_model_as_it_takes_a_name(self, hybrid_checkpoint):
        from bosch_eval.models.resolved_model import ResolvedModel

        _, path = hybrid_checkpoint
        resolved = ResolvedModel.named(str(path))
        lm = BoschLM(pretrained=resolved, device="cpu")
        assert lm.resolved is resolved and lm.head_mask.bits == resolved.saved_mask.bits
