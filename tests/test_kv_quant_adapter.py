"""The ``bosch`` adapter with ``kv_quant``: serving-style scoring (prefill → compress →
continuation through the cache), ``mask=full``, bad arguments, checkpoint round trip."""

from __future__ import annotations

import json

import pytest
import torch
from lm_eval.api.instance import Instance
from transformers import AutoModelForCausalLM, AutoTokenizer

from bosch_eval.attention.hybrid_attention import hybrid_state
from bosch_eval.caches.hybrid_cache import HybridCache
from bosch_eval.caches.kv_quant.config import KVQuantConfig
from bosch_eval.masks.head_mask import HeadMask
from bosch_eval.model_adapters.bosch import BoschLM
from bosch_eval.model_adapters.compressed_scoring import continuation_logits_through_cache
from bosch_eval.models.checkpoint import saved_kv_quant
from bosch_eval.runtime.errors import SettingsError
from tests.helpers import generation_requests, requests

ARGS = dict(device="cpu", batch_size=3, dtype="float32")


def test_window_covering_everything_scores_like_no_quantization(tiny_model_dir):
    plain = BoschLM(pretrained=str(tiny_model_dir), mask="full", **ARGS)
    quant = BoschLM(pretrained=str(tiny_model_dir), mask="full", kv_quant="logquant", kv_bits=2, kv_window=64, **ARGS)
    expected, got = plain.loglikelihood(requests()), quant.loglikelihood(requests())
    assert [g for _, g in got] == [g for _, g in expected]
    torch.testing.assert_close(
        torch.tensor([ll for ll, _ in got]), torch.tensor([ll for ll, _ in expected]), atol=1e-4, rtol=0
    )
    assert quant.get_model_info()["bosch_kv_quant"] == {
        "method": "logquant",
        "bits": 2,
        "window": 64,
        "group_size": 16,
    }  # head dim 16


def test_scoring_goes_through_the_compressed_cache(tiny_model_dir):
    """With W_lq = 1 most of the context is quantized: the scores move; the chunked path
    equals a manual prefill → compress → continuation."""
    plain = BoschLM(pretrained=str(tiny_model_dir), mask="full", **ARGS)
    quant = BoschLM(pretrained=str(tiny_model_dir), mask="full", kv_quant="kivi", kv_bits=2, kv_window=1, **ARGS)
    expected, got = plain.loglikelihood(requests()), quant.loglikelihood(requests())
    assert max(abs(a[0] - b[0]) for a, b in zip(expected, got)) > 1e-3
    context, continuation = requests()[0].args
    ctx, cont = quant.tok_encode(context), quant.tok_encode(continuation)
    row = (ctx + cont)[:-1]
    with torch.no_grad():
        logits = continuation_logits_through_cache(
            quant.model, lambda: HybridCache.for_model(quant.model, quant.kv_quant), row, len(cont), quant.device
        )
        manual_cache = HybridCache.for_model(quant.model, quant.kv_quant)
        quant.model(input_ids=torch.tensor([ctx]), past_key_values=manual_cache, use_cache=True)
        step = quant.model(input_ids=torch.tensor([cont[:-1]]), past_key_values=manual_cache, use_cache=True).logits[0]
    torch.testing.assert_close(logits[1:], step)
    log_likelihood = float(torch.log_softmax(logits, -1).gather(1, torch.tensor(cont)[:, None]).sum())
    assert abs(log_likelihood - got[0][0]) < 1e-4


def test_generation_with_window_covering_everything_equals_plain(tiny_model_dir):
    mask = HeadMask.from_rows([[0, 1, 0, 1], [0, 0, 0, 0], [1, 1, 0, 1]], 8, window=3)
    plain = BoschLM(pretrained=str(tiny_model_dir), mask=mask, **ARGS)
    quant = BoschLM(
        pretrained=str(tiny_model_dir), mask=mask, kv_quant="logquant", kv_bits=4, kv_window=64, kv_group_size=8, **ARGS
    )
    assert quant.generate_until(generation_requests()) == plain.generate_until(generation_requests())


@pytest.mark.parametrize(
    "args, message",
    [
        (dict(kv_quant="awq", kv_window=8), r"kv_quant: expected one of \['logquant', 'kivi', 'none'\], got 'awq'"),
        (dict(kv_quant="logquant", kv_bits=8, kv_window=8), r"kv_bits: expected one of \[2, 4\], got 8"),
        (dict(kv_quant="logquant", kv_window=0), r"kv_window: expected a positive integer"),
        (dict(kv_quant="logquant", kv_window=8, kv_group_size=5), r"kv_group_size: 5 does not divide the head dim"),
        (
            dict(kv_quant="logquant", kv_window=8, kv_cache="dynamic"),
            r"kv_cache: kv_quant=logquant stores its KV in the hybrid cache",
        ),
    ],
)
def test_bad_arguments(tiny_model_dir, args, message):
    with pytest.raises(SettingsError, match=message):
        BoschLM(pretrained=str(tiny_model_dir), mask="full", **ARGS, **args)


def test_checkpoint_keeps_the_kv_quant_settings(tiny_model_dir, tmp_path):
    mask = HeadMask.from_rows([[0, 1, 0, 1], [0, 0, 0, 0], [1, 1, 0, 1]], 8, window=3)
    lm = BoschLM(pretrained=str(tiny_model_dir), mask=mask, kv_quant="kivi", kv_bits=4, kv_window=16, **ARGS)
    lm.model.save_pretrained(tmp_path / "ckpt")
    AutoTokenizer.from_pretrained(tiny_model_dir).save_pretrained(tmp_path / "ckpt")
    saved = json.loads((tmp_path / "ckpt" / "config.json").read_text())["bosch_kv_quant"]
    expected = KVQuantConfig("kivi", 4, 16, 16)  # group size defaults to the head dim (16 < 64)
    assert saved == expected.to_json()
    assert saved_kv_quant(AutoModelForCausalLM.from_pretrained(tmp_path / "ckpt").config) == expected
    restored = BoschLM(pretrained=str(tmp_path / "ckpt"), **ARGS)
    assert restored.kv_quant == expected and hybrid_state(restored.model).mask.bits == mask.bits
    assert BoschLM(pretrained=str(tmp_path / "ckpt"), kv_quant="none", **ARGS).kv_quant is None
    plain = BoschLM(pretrained=str(tiny_model_dir), mask=mask, **ARGS)
    assert not hasattr(plain.model.config, "bosch_kv_quant")


def test_lm_eval_cli_style_string_arguments(tiny_model_dir):
    from lm_eval.api.registry import get_model

    lm = get_model("bosch").create_from_arg_string(
        f"pretrained={tiny_model_dir},mask=full,kv_quant=logquant,kv_bits=2,kv_window=4,kv_group_size=16",
        {"device": "cpu", "batch_size": 2},
    )
    assert lm.kv_quant == KVQuantConfig("logquant", 2, 4, 16)
    pair = ("A needle hides in the haystack:", " 7 3 1.")
    request = Instance(request_type="loglikelihood", doc={}, arguments=pair, idx=0, task_name=None, doc_id=None)
    assert len(lm.loglikelihood([request])) == 1
