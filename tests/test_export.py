"""``bosch-eval export``: whole-layer masks as plain transformers checkpoints, any mask as
``bosch-serving/1``. The oracle is the hybrid model: the exported checkpoint, loaded with
nothing but ``AutoModelForCausalLM``, must give its logits and lm-eval scores."""

from __future__ import annotations

import json
from pathlib import Path
from unittest import mock

import lm_eval
import pytest
import torch
from lm_eval.tasks import TaskManager
from transformers import AutoConfig, AutoModelForCausalLM

from bosch_eval.attention.hybrid_attention import hybridize
from bosch_eval.cli import main
from bosch_eval.masks.head_mask import HeadMask, ModelShape
from bosch_eval.models import export
from bosch_eval.models.export import export_transformers, serving_json, sliding_config, whole_layer_types
from bosch_eval.models.model_check import resolve_model
from bosch_eval.models.random_model import FAMILIES, save_random_checkpoint, train_tokenizer
from bosch_eval.runtime.errors import ExportError

FIXTURE_TASKS = Path(__file__).parent / "fixtures" / "tasks"
WINDOW = 4
# What transformers 5.24's code says (configuration_*.py / modeling_*.py): Qwen2/3 and
# Ministral configs declare layer_types and their decoders build a sliding mask per layer
# from it; LlamaConfig and GPT2Config have no such field, and MistralConfig drops it (its
# modeling applies one sliding_window to every layer).
HONOURS_LAYER_TYPES = {"qwen3": True, "qwen2": True, "llama": False, "mistral": False, "gpt2": False}


def alternating_mask(shape: ModelShape, window: int = WINDOW) -> HeadMask:
    """Even layers all SWA, odd layers all full."""
    rows = [[layer % 2] * shape.num_kv_heads for layer in range(shape.num_layers)]
    return HeadMask.from_rows(rows, shape.num_heads, window=window)


def ministral_checkpoint(path: Path) -> Path:
    """A tiny random Ministral (Mistral with per-layer layer_types), saved with a tokenizer. Its
    layers slide at 512 keys (longer than any input here): Ministral builds a sliding mask even
    when no layer uses one, and fails without a sliding_window."""
    tokenizer = train_tokenizer()
    config = AutoConfig.for_model(
        "ministral", vocab_size=len(tokenizer), hidden_size=64, intermediate_size=96, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=512,
        initializer_range=0.1, sliding_window=512, tie_word_embeddings=False,
    )  # fmt: skip
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def checkpoint(family: str, path: Path) -> Path:
    return ministral_checkpoint(path) if family == "ministral" else save_random_checkpoint(path, family)


def logits(model, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=ids).logits


class TestWholeLayers:
    def test_layer_types_follow_the_rows(self):
        mask = HeadMask.from_rows([[0, 0], [1, 1], [0, 0]], 4, window=8)
        assert whole_layer_types(mask) == ["sliding_attention", "full_attention", "sliding_attention"]

    def test_mixed_layer_is_refused_naming_it(self):
        mask = HeadMask.from_rows([[0, 0], [1, 0]], 4, window=8)
        with pytest.raises(
            ExportError, match=r"mask.json: layer 1 mixes full and SWA KV groups \(\[1, 0\]\).*--to serving"
        ):
            whole_layer_types(mask, "mask.json")


class TestFamilies:
    @pytest.mark.parametrize("family", sorted(FAMILIES))
    def test_config_class_decides(self, family, tmp_path):
        config = AutoConfig.from_pretrained(save_random_checkpoint(tmp_path / family, family))
        mask = alternating_mask(ModelShape.from_config(config))
        if HONOURS_LAYER_TYPES[family]:
            exported = sliding_config(config, mask, WINDOW)
            assert exported.layer_types == whole_layer_types(mask) and exported.sliding_window == WINDOW
        else:
            with pytest.raises(ExportError, match=rf"{type(config).__name__} has no field 'layer_types'"):
                sliding_config(config, mask, WINDOW)

    def test_every_family_is_decided(self):
        assert set(HONOURS_LAYER_TYPES) == set(FAMILIES)

    @pytest.mark.parametrize("family", ["qwen3", "qwen2", "ministral"])
    def test_exported_checkpoint_gives_the_hybrid_logits(self, family, tmp_path):
        source = checkpoint(family, tmp_path / "source")
        model = AutoModelForCausalLM.from_pretrained(source).eval()
        mask = alternating_mask(ModelShape.from_config(model.config))
        export_transformers(source, mask, tmp_path / "out")
        config = json.loads((tmp_path / "out" / "config.json").read_text())
        assert "bosch_mask" not in config and config["sliding_window"] == WINDOW
        ids = torch.randint(0, model.config.vocab_size, (2, 5 * WINDOW), generator=torch.Generator().manual_seed(1))
        unmasked = logits(model, ids)
        hybridize(model, mask)
        hybrid = logits(model, ids)
        plain = logits(AutoModelForCausalLM.from_pretrained(tmp_path / "out").eval(), ids)
        torch.testing.assert_close(plain, hybrid, atol=1e-5, rtol=0)
        assert (unmasked - hybrid).abs().max() > 0.1  # the probe sees the window

    def test_qwen_sets_use_sliding_window_and_suffix_max_window_layers(self, tmp_path):
        config = AutoConfig.from_pretrained(save_random_checkpoint(tmp_path / "q", "qwen2"))
        suffix = HeadMask.from_rows([[1, 1], [0, 0], [0, 0]], 4, window=WINDOW)
        exported = sliding_config(config, suffix, WINDOW)
        assert exported.use_sliding_window and exported.max_window_layers == 1

    def test_family_whose_modeling_ignores_layer_types_is_refused(self, tmp_path):
        """Simulated: a config that leaves every layer full gives the unmasked logits."""
        source = save_random_checkpoint(tmp_path / "source", "qwen3")
        mask = alternating_mask(ModelShape.from_config(AutoConfig.from_pretrained(source)))
        with mock.patch.object(export, "sliding_config", side_effect=lambda config, *args: config):
            with pytest.raises(ExportError, match="does not run the mask.*ignores layer_types"):
                export_transformers(source, mask, tmp_path / "out")
        assert sorted(p.name for p in tmp_path.iterdir()) == ["source"]  # nothing half-written

    def test_sinks_are_refused(self):
        mask = HeadMask.from_rows([[0, 0], [1, 1]], 4, window=8, sinks=4)
        with pytest.raises(
            ExportError, match="mask.json: field 'sinks' is 4; transformers' sliding_attention layers have no"
        ):
            sliding_config(None, mask, 8, "mask.json")

    def test_non_empty_output_is_refused(self, tmp_path):
        (tmp_path / "out").mkdir()
        (tmp_path / "out" / "x").write_text("")
        mask = HeadMask.from_rows([[0] * 4] * 4, 8, window=WINDOW)
        with pytest.raises(ExportError, match="out: directory exists and is not empty"):
            export_transformers(resolve_model("toy"), mask, tmp_path / "out")


def _per_sample(out: dict, task: str) -> list[list[tuple[float, bool]]]:
    return [[(float(r[0][0]), r[0][1]) for r in doc["resps"]] for doc in out["samples"][task]]


@pytest.mark.slow
@pytest.mark.parametrize("family", ["toy", "qwen2"])
def test_stock_hf_on_export_scores_as_bosch_with_the_mask(family, tmp_path):
    """lm-eval ``--model hf`` on the export == ``--model bosch`` with the mask, per sample."""
    source = resolve_model("toy") if family == "toy" else save_random_checkpoint(tmp_path / "source", family)
    mask = alternating_mask(ModelShape.from_config(AutoConfig.from_pretrained(source)))
    mask.save(tmp_path / "mask.json")
    assert (
        main(
            [
                "export",
                "--to",
                "transformers",
                str(tmp_path / "out"),
                "--model",
                str(source),
                "--mask",
                str(tmp_path / "mask.json"),
            ]
        )
        == 0
    )
    task_manager = TaskManager(include_path=str(FIXTURE_TASKS), include_defaults=False)
    tasks = ["bosch_test_choice", "bosch_test_continuation"]
    runs = {}
    for name, model, args in (
        ("export", "hf", f"pretrained={tmp_path / 'out'}"),
        ("bosch", "bosch", f"pretrained={source},mask={tmp_path / 'mask.json'}"),
        ("unmasked", "hf", f"pretrained={source}"),
    ):
        runs[name] = lm_eval.simple_evaluate(
            model=model, model_args=f"{args},dtype=float32", tasks=tasks, task_manager=task_manager,
            device="cpu", batch_size=4, log_samples=True, bootstrap_iters=0,
        )  # fmt: skip
    for task in tasks:
        exported, bosch = _per_sample(runs["export"], task), _per_sample(runs["bosch"], task)
        for got, want in zip(exported, bosch, strict=True):
            # Equal to fp32 rounding: on CPU the bosch adapter's SWA groups run its blocked kernel.
            assert [ll for ll, _ in got] == pytest.approx([ll for ll, _ in want], rel=1e-5, abs=1e-5)
            assert [greedy for _, greedy in got] == [greedy for _, greedy in want]
        assert runs["export"]["results"][task]["acc,none"] == runs["bosch"]["results"][task]["acc,none"]
    # The tasks' contexts are longer than the window: the mask changes the scores.
    moved = [
        abs(a[0] - b[0])
        for task in tasks
        for doc_a, doc_b in zip(_per_sample(runs["unmasked"], task), _per_sample(runs["bosch"], task), strict=True)
        for a, b in zip(doc_a, doc_b, strict=True)
    ]
    assert max(moved) > 0.1


class TestServing:
    MASK = HeadMask.from_rows([[1, 0, 0, 1], [1, 1, 1, 1], [0, 0, 0, 0]], 8, window=16, method="bosch")

    def test_layers_list_full_and_swa_groups(self):
        data = serving_json(self.MASK)
        assert data["format"] == "bosch-serving/1" and data["window_convention"] == "inclusive"
        assert data["layers"] == [
            {"layer": 0, "full_kv_groups": [0, 3], "swa_kv_groups": [1, 2], "window": 16, "sinks": 0},
            {"layer": 1, "full_kv_groups": [0, 1, 2, 3], "swa_kv_groups": [], "window": None, "sinks": 0},
            {"layer": 2, "full_kv_groups": [], "swa_kv_groups": [0, 1, 2, 3], "window": 16, "sinks": 0},
        ]

    def test_rebuilds_the_mask(self):
        data = serving_json(self.MASK)
        rows = [[int(g in layer["full_kv_groups"]) for g in range(data["num_kv_heads"])] for layer in data["layers"]]
        assert HeadMask.from_rows(rows, data["num_heads"], window=16, method="bosch") == self.MASK

    def test_sinks_are_written_for_sliding_layers(self):
        layers = serving_json(self.MASK.with_meta(sinks=4))["layers"]
        assert [layer["sinks"] for layer in layers] == [4, 0, 4]

    def test_exclusive_counts_the_keys_before_the_query(self):
        assert serving_json(self.MASK, "exclusive")["layers"][0]["window"] == 15

    def test_unknown_convention_is_refused(self):
        with pytest.raises(ExportError, match=r"expected one of \['inclusive', 'exclusive'\], got 'open'"):
            serving_json(self.MASK, "open")


class TestCli:
    def test_serving_from_a_layer_heuristic(self, tmp_path, capsys):
        out = tmp_path / "serve.json"
        assert (
            main(["export", "--to", "serving", str(out), "--model", "toy", "--layers", "intr", "--ratio", "0.5"]) == 0
        )
        data = json.loads(out.read_text())
        assert data["model"] == "toy" and data["method"] == "intr" and data["layers"][0]["window"] == 32

    def test_llama_is_refused_with_the_reason(self, tmp_path, capsys):
        source = save_random_checkpoint(tmp_path / "llama", "llama")
        code = main(
            [
                "export",
                "--to",
                "transformers",
                str(tmp_path / "out"),
                "--model",
                str(source),
                "--layers",
                "intr",
                "--ratio",
                "0.5",
                "--window",
                "4",
            ]
        )
        assert code == 2
        assert "LlamaConfig has no field 'layer_types'" in capsys.readouterr().err
        assert not (tmp_path / "out").exists()

    def test_plain_model_without_a_mask_source_is_refused(self, capsys):
        assert main(["export", "--to", "serving", "x.json", "--model", "toy"]) == 2
        assert "no field 'bosch_mask' (not a hybrid checkpoint)" in capsys.readouterr().err
