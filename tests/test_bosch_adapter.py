"""The `bosch` lm-eval adapter: same scores as HFLM under an all-full mask, masks from
every source, in-place swaps, and continuation-only logits."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path
from unittest import mock

import lm_eval
import pytest
import torch
from lm_eval.api.instance import Instance
from lm_eval.models.huggingface import HFLM
from lm_eval.tasks import TaskManager
from transformers import AutoModelForCausalLM, AutoTokenizer

from bosch_eval.masks.head_mask import HeadMask, HeadRanking, ModelShape
from bosch_eval.model_adapters.bosch import BoschLM
from bosch_eval.model_adapters.continuation_logits import logits_at, scored_positions
from bosch_eval.models.random_model import random_model
from bosch_eval.runtime.errors import DeviceError, MaskError, ModelError, SettingsError
from tests.helpers import generation_requests, requests

FIXTURE_TASKS = Path(__file__).parent / "fixtures" / "tasks"


def all_full_mask(model_dir: Path, window: int = 4) -> HeadMask:
    shape = ModelShape.from_config(AutoModelForCausalLM.from_pretrained(model_dir).config)
    return HeadMask.uniform(shape, full=True, window=window)


@pytest.fixture
def lms(tiny_model_dir):
    hf = HFLM(pretrained=str(tiny_model_dir), device="cpu", batch_size=3, dtype="float32")
    bosch = BoschLM(
        pretrained=str(tiny_model_dir), device="cpu", batch_size=3, dtype="float32", layers="intr", ratio=0.0, window=4
    )
    return hf, bosch


def test_all_full_mask_scores_like_hflm(lms):
    hf, bosch = lms
    expected = hf.loglikelihood(requests())
    got = bosch.loglikelihood(requests())
    assert [greedy for _, greedy in got] == [greedy for _, greedy in expected]
    torch.testing.assert_close(
        torch.tensor([ll for ll, _ in got]), torch.tensor([ll for ll, _ in expected]), atol=1e-5, rtol=0
    )


def test_logits_are_built_only_for_scored_positions(lms):
    _, bosch = lms
    shapes = []
    head = bosch.model.get_output_embeddings()
    handle = head.register_forward_hook(lambda _m, _args, out: shapes.append(tuple(out.shape)))
    try:
        bosch.loglikelihood(requests())
    finally:
        handle.remove()
    longest_continuation = max(len(bosch.tok_encode(cont)) for _, cont in (r.args for r in requests()))
    longest_input = max(len(bosch.tok_encode(ctx + cont)) for ctx, cont in (r.args for r in requests()))
    assert shapes and all(positions <= longest_continuation < longest_input for _, positions, _ in shapes)


def test_rolling_loglikelihood_goes_through_the_same_scoring(lms):
    hf, bosch = lms
    args = ("The quick brown fox jumps over the lazy dog. " * 6,)
    text = [Instance(request_type="loglikelihood_rolling", doc={}, arguments=args, idx=0, task_name=None, doc_id=None)]
    torch.testing.assert_close(
        torch.tensor(bosch.loglikelihood_rolling(text)), torch.tensor(hf.loglikelihood_rolling(text)), atol=1e-4, rtol=0
    )


def test_set_mask_swaps_scores_and_back(lms):
    _, bosch = lms
    full = bosch.loglikelihood(requests())
    all_swa = HeadMask.uniform(ModelShape.from_config(bosch.model.config), full=False, window=2)
    bosch.set_mask(all_swa)
    assert bosch.head_mask == all_swa and bosch.hybrid.window == 4  # window= from construction wins
    swa = bosch.loglikelihood(requests())
    assert max(abs(a[0] - b[0]) for a, b in zip(full, swa)) > 1e-3
    bosch.set_mask(HeadMask.uniform(ModelShape.from_config(bosch.model.config), full=True))
    assert bosch.loglikelihood(requests()) == full


def test_preloaded_model_and_model_info(tiny_model_dir):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    lm = BoschLM(pretrained=model, tokenizer=tokenizer, mask=all_full_mask(tiny_model_dir, window=8), batch_size=2)
    assert lm.model is model and lm.hybrid.window == 8
    info = lm.get_model_info()
    assert info["bosch_swa_ratio"] == 0.0 and info["bosch_window"] == 8
    assert info["bosch_attn_backend"] == "blocked" and info["bosch_attn_backend_reason"].startswith("auto on CPU")


def test_generation_on_the_hybrid_cache_equals_the_dynamic_cache(tiny_model_dir, lms):
    hf, _ = lms
    args = dict(pretrained=str(tiny_model_dir), device="cpu", batch_size=3, dtype="float32")
    full = BoschLM(**args, layers="intr", ratio=0.0, window=4)
    assert full.generate_until(generation_requests()) == hf.generate_until(generation_requests())
    mask = HeadMask.from_rows([[0, 1, 0, 1], [0, 0, 0, 0], [1, 1, 0, 1]], 8, window=3)
    hybrid = BoschLM(**args, mask=mask)
    dynamic = BoschLM(**args, mask=mask, kv_cache="dynamic")
    captured = BoschLM(
        **args, mask=mask, kv_cache="captured"
    )  # on a CPU generate does not compile: the captured cache eagerly
    assert hybrid.kv_cache == "hybrid" and hybrid.get_model_info()["bosch_kv_cache"] == "hybrid"
    generated = hybrid.generate_until(generation_requests())
    assert generated == dynamic.generate_until(generation_requests()) == captured.generate_until(generation_requests())


class TestMaskSources:
    def test_mask_file(self, tiny_model_dir, tmp_path):
        mask = HeadMask.from_rows([[0, 1, 1, 1], [1, 1, 1, 1], [0, 0, 0, 0]], 8, window=6)
        mask.save(tmp_path / "mask.json")
        lm = BoschLM(pretrained=str(tiny_model_dir), device="cpu", mask=str(tmp_path / "mask.json"))
        assert lm.head_mask.bits == mask.bits and lm.hybrid.window == 6
        assert (
            BoschLM(
                pretrained=str(tiny_model_dir), device="cpu", mask=str(tmp_path / "mask.json"), window=3
            ).hybrid.window
            == 3
        )

    def test_ranking_file(self, tiny_model_dir, tmp_path):
        scores = [[float(layer * 4 + g) for g in range(4)] for layer in range(3)]
        HeadRanking(tuple(map(tuple, scores)), "higher", "dcam", 8, window=5).save(tmp_path / "ranking.json")
        lm = BoschLM(pretrained=str(tiny_model_dir), device="cpu", ranking=str(tmp_path / "ranking.json"), ratio=0.25)
        assert lm.head_mask.bits == ((1, 1, 1, 1), (1, 1, 1, 1), (1, 0, 0, 0))
        assert lm.hybrid.window == 5

    @pytest.mark.parametrize(("layers", "seed"), [("intr", None), ("bme", None), ("rand", 1)])
    def test_layer_heuristics(self, tiny_model_dir, layers, seed):
        lm = BoschLM(pretrained=str(tiny_model_dir), device="cpu", layers=layers, ratio=0.5, seed=seed, window=4)
        assert sum(not any(row) for row in lm.head_mask.bits) == 2  # ⌈0.5·3⌉ layers

    @pytest.mark.parametrize(
        ("args", "error", "message"),
        [
            ({}, MaskError, r"expected exactly one mask source .* got none"),
            ({"layers": "intr", "ratio": 0.5, "mask": "m.json"}, MaskError, r"got \['layers', 'mask'\]"),
            ({"layers": "intr", "window": 4}, MaskError, r"ratio: layers= needs ratio=R"),
            (
                {"layers": "intr", "ratio": 1.5, "window": 4},
                MaskError,
                r"ratio: expected an SWA ratio in \[0, 1\], got 1.5",
            ),
            ({"layers": "top", "ratio": 0.5, "window": 4}, MaskError, r"unknown layer heuristic 'top'"),
            ({"layers": "intr", "ratio": 0.5}, MaskError, r"layers=intr: field 'window' is missing"),
            ({"layers": "bme", "ratio": 0.5, "seed": 3, "window": 4}, MaskError, r"seed: only layers=rand is random"),
            ({"mask": "missing.json"}, MaskError, r"missing.json: no such file"),
            (
                {"layers": "intr", "ratio": 0.5, "window": 4, "attn_backend": "xformers"},
                SettingsError,
                r"attn_backend: expected one of",
            ),
            ({"layers": "intr", "ratio": 0.5, "window": 0}, MaskError, r"window: expected a positive integer"),
            (
                {"layers": "intr", "ratio": 0.5, "window": 4, "kv_cache": "paged"},
                SettingsError,
                r"kv_cache: expected one of",
            ),
            (
                {"layers": "intr", "ratio": 0.5, "window": 4, "tp_plan": "auto"},
                SettingsError,
                r"tp_plan='auto': tensor parallelism is not supported",
            ),
        ],
    )
    def test_bad_arguments(self, tiny_model_dir, args, error, message):
        with pytest.raises(error, match=message):
            BoschLM(pretrained=str(tiny_model_dir), device="cpu", **args)

    def test_mask_for_another_model(self, tiny_model_dir, tmp_path):
        HeadMask.uniform(ModelShape(3, 8, 2), full=True, window=4).save(tmp_path / "other.json")
        with pytest.raises(
            MaskError, match=r"other.json: field 'num_kv_heads' is 2, but the model .* has num_kv_heads=4"
        ):
            BoschLM(pretrained=str(tiny_model_dir), device="cpu", mask=str(tmp_path / "other.json"))


class TestContinuationLogits:
    def test_positions_per_row(self):
        positions = scored_positions([10, 6], [3, 1], torch.device("cpu"))
        assert positions.tolist() == [[7, 8, 9], [5, 5, 5]]

    def test_equal_to_full_logits_and_only_k_positions_computed(self):
        model = random_model("llama")
        ids = torch.randint(0, 300, (2, 30))
        positions = scored_positions([30, 17], [4, 2], torch.device("cpu"))
        with torch.no_grad():
            full = model(ids).logits
            got = logits_at(model, ids, positions)
        assert got.shape == (2, 4, 300)
        expected = full.gather(1, positions[..., None].expand(-1, -1, 300))
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)
        assert not model.get_output_embeddings()._forward_pre_hooks  # the hook does not outlive the call


@pytest.mark.slow
def test_simple_evaluate_bosch_equals_hf_per_sample(tiny_model_dir):
    """lm-eval end to end, both models on the same local data, per-sample log-likelihoods."""
    task_manager = TaskManager(include_path=str(FIXTURE_TASKS), include_defaults=False)
    per_model = {}
    for model, extra in (("hf", ""), ("bosch", ",layers=bme,ratio=0,window=4")):
        out = lm_eval.simple_evaluate(
            model=model,
            model_args=f"pretrained={tiny_model_dir},dtype=float32{extra}",
            tasks=["bosch_test_choice", "bosch_test_continuation"],
            task_manager=task_manager,
            device="cpu",
            batch_size=4,
            log_samples=True,
            bootstrap_iters=0,
        )
        per_model[model] = out
    for task in ("bosch_test_choice", "bosch_test_continuation"):
        hf_samples, bosch_samples = per_model["hf"]["samples"][task], per_model["bosch"]["samples"][task]
        assert len(hf_samples) == len(bosch_samples) == 12
        for hf_doc, bosch_doc in zip(hf_samples, bosch_samples, strict=True):
            hf_ll = [float(resp[0][0]) for resp in hf_doc["resps"]]
            bosch_ll = [float(resp[0][0]) for resp in bosch_doc["resps"]]
            assert bosch_ll == pytest.approx(hf_ll, abs=1e-5)
            assert [resp[0][1] for resp in hf_doc["resps"]] == [resp[0][1] for resp in bosch_doc["resps"]]
        assert per_model["hf"]["results"][task]["acc,none"] == per_model["bosch"]["results"][task]["acc,none"]
    assert json.dumps(per_model["bosch"]["config"]["model_args"])  # the mask args are recorded with results


def _sample_log_likelihoods(output_dir: Path, task: str) -> list[list[tuple[float, bool]]]:
    (samples_file,) = output_dir.rglob(f"samples_{task}_*.jsonl")
    rows = [json.loads(line) for line in samples_file.read_text().splitlines()]
    rows.sort(key=lambda row: row["doc_id"])
    return [[(float(resp[0][0]), resp[0][1] in (True, "True")) for resp in row["resps"]] for row in rows]


@pytest.mark.slow
def test_stock_lm_eval_cli_bosch_equals_hf_per_sample(tiny_model_dir, tmp_path):
    """`lm_eval --model bosch` (found through the start-up hook) against `--model hf`."""
    lm_eval_cli = Path(sys.executable).parent / "lm_eval"
    mask_file = tmp_path / "full.json"
    all_full_mask(tiny_model_dir, window=4).save(mask_file)
    for model, extra in (("hf", ""), ("bosch", f",mask={mask_file}")):
        subprocess.run(
            [
                str(lm_eval_cli),
                "--model", model,
                "--model_args", f"pretrained={tiny_model_dir},dtype=float32{extra}",
                "--tasks", "bosch_test_continuation",
                "--include_path", str(FIXTURE_TASKS),
                "--device", "cpu", "--batch_size", "4",
                "--log_samples", "--output_path", str(tmp_path / model),
            ],
            check=True,
            capture_output=True,
            text=True,
        )  # fmt: skip
    hf = _sample_log_likelihoods(tmp_path / "hf", "bosch_test_continuation")
    bosch = _sample_log_likelihoods(tmp_path / "bosch", "bosch_test_continuation")
    assert len(hf) == len(bosch) == 12
    for hf_doc, bosch_doc in zip(hf, bosch, strict=True):
        assert [greedy for _, greedy in bosch_doc] == [greedy for _, greedy in hf_doc]
        assert [ll for ll, _ in bosch_doc] == pytest.approx([ll for ll, _ in hf_doc], abs=1e-5)


class TestDevice:
    def test_no_device_given_picks_one_that_exists(self, tiny_model_dir):
        from bosch_eval.runtime.device import default_device

        lm = BoschLM(pretrained=str(tiny_model_dir), mask="full")  # HFLM's own default would be "cuda"
        assert lm.device.type == default_device()

    def test_lm_eval_cli_default_falls_back_to_the_cpu_without_a_gpu(self, tiny_model_dir):
        with mock.patch("torch.cuda.is_available", return_value=False):
            lm = BoschLM(pretrained=str(tiny_model_dir), mask="full", device="cuda:0")
        assert lm.device.type == "cpu"

    def test_cuda_without_cuda_is_an_error_before_loading(self, tiny_model_dir):
        from bosch_eval.runtime import device as device_module

        with mock.patch.object(device_module, "_cuda_problem", return_value="no CUDA here"):
            with pytest.raises(DeviceError, match=r"device 'cuda': no CUDA here; use device cpu"):
                BoschLM(pretrained=str(tiny_model_dir), mask="full", device="cuda")


def test_an_encoder_is_refused_as_not_a_causal_decoder(tmp_path):
    from transformers import BertConfig

    BertConfig(
        vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64
    ).save_pretrained(tmp_path)
    # config.json only: the refusal comes before any weight loads
    with pytest.raises(ModelError, match=r"model_type 'bert' is an encoder .* not a causal decoder"):
        BoschLM(pretrained=str(tmp_path), device="cpu", mask="full")


def _instances(kind: str, args: list[tuple], task: str = "long_task") -> list[Instance]:
    # By keyword; metadata for lm-eval 0.4, task_name and doc_id for 0.5 (required fields there).
    return [
        Instance(request_type=kind, doc={}, arguments=a, idx=idx, metadata=(task, idx, 1), task_name=task, doc_id=idx)
        for idx, a in enumerate(args)
    ]


class TestInputsLongerThanTheModel:
    """A request lm-eval would left-truncate is refused, naming the task, the length and the limit,
    unless allow_truncation=true, and then the results say which tasks were truncated."""

    LONG = ("word " * 40, " end")  # ~40 tokens against max_length=16

    def lm(self, tiny_model_dir, **kwargs):
        return BoschLM(pretrained=str(tiny_model_dir), device="cpu", mask="full", max_length=16, **kwargs)

    def test_loglikelihood_is_refused(self, tiny_model_dir):
        lm = self.lm(tiny_model_dir)
        length = len(lm.tok_encode(self.LONG[0] + self.LONG[1])) - 1
        with pytest.raises(
            ModelError,
            match=rf"task 'long_task': 1 request\(s\) .* the longest context \+ continuation {length} tokens > 16 \(max_length 16.*allow_truncation=true",
        ):
            lm.loglikelihood(_instances("loglikelihood", [self.LONG, ("short", " one")]))

    def test_generation_is_refused(self, tiny_model_dir):
        lm = self.lm(tiny_model_dir)
        kwargs = {"until": ["\n"], "max_gen_toks": 4, "do_sample": False}
        with pytest.raises(
            ModelError,
            match=r"task 'long_task': 1 request\(s\) .* the longest context \d+ tokens > 12 \(max_length 16.*less the tokens to generate",
        ):
            lm.generate_until(_instances("generate_until", [(self.LONG[0], kwargs)]))

    def test_inputs_that_fit_are_scored_and_marked_clean(self, tiny_model_dir):
        lm = self.lm(tiny_model_dir)
        assert len(lm.loglikelihood(_instances("loglikelihood", [("short", " one")]))) == 1
        info = lm.get_model_info()
        assert info["bosch_truncated"] == {} and info["bosch_allow_truncation"] is False

    def test_allow_truncation_scores_and_marks_the_task(self, tiny_model_dir, caplog):
        lm = self.lm(tiny_model_dir, allow_truncation=True)
        with caplog.at_level(logging.WARNING, logger="bosch_eval"):
            for _ in range(2):  # a second evaluation of the same documents (compare's next entry)
                assert len(lm.loglikelihood(_instances("loglikelihood", [self.LONG, ("short", " one")]))) == 2
        length = len(lm.tok_encode(self.LONG[0] + self.LONG[1])) - 1
        info = lm.get_model_info()
        assert info["bosch_allow_truncation"] is True
        assert info["bosch_truncated"] == {
            "long_task": {"documents": 1, "longest_input_tokens": length, "max_length": 16}
        }
        assert json.dumps(info["bosch_truncated"])  # lands in the results JSON
        assert sum("left truncation" in r.getMessage() for r in caplog.records) == 1  # warned once

    def test_an_empty_context_counts_the_prefix_token_as_lm_eval_does(self, tiny_model_dir):
        lm = self.lm(tiny_model_dir)
        fits, too_long = "word " * 3, "word " * 40
        assert (
            len(lm.tok_encode(fits, add_special_tokens=False))
            < 16
            < len(lm.tok_encode(too_long, add_special_tokens=False)) - 1
        )
        assert len(lm.loglikelihood(_instances("loglikelihood", [("", fits)]))) == 1
        with pytest.raises(ModelError, match="task 'long_task': 1 request"):
            lm.loglikelihood(_instances("loglikelihood", [("", too_long)]))

    def test_the_overrides_leave_no_state_behind(self, tiny_model_dir):
        """Each HFLM override works from its own arguments: nothing set in one is read in another."""
        lm = self.lm(tiny_model_dir)
        before = set(vars(lm))
        lm.loglikelihood(_instances("loglikelihood", [("short", " one")]))
        lm.generate_until(
            _instances("generate_until", [("short", {"until": ["\n"], "max_gen_toks": 2, "do_sample": False})])
        )
        assert set(vars(lm)) == before

    def test_rolling_windows_always_fit(self, tiny_model_dir):
        lm = self.lm(tiny_model_dir)
        assert len(lm.loglikelihood_rolling(_instances("loglikelihood_rolling", [("word " * 40,)]))) == 1


def test_perplexity_with_kv_quant_is_refused_naming_the_task(tiny_model_dir):
    lm = BoschLM(pretrained=str(tiny_model_dir), device="cpu", mask="full", kv_quant="logquant", kv_window=4)
    with pytest.raises(
        ModelError,
        match=r"task 'wikitext': perplexity \(loglikelihood_rolling\) with kv_quant=logquant would not measure",
    ):
        lm.loglikelihood_rolling(_instances("loglikelihood_rolling", [("some text",)], task="wikitext"))
