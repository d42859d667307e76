"""The model a user names: one resolver for every command (``toy`` included), a missing
model said first and plainly, a length the model cannot hold refused, and mask errors
before any weight loads."""

from __future__ import annotations

import json
from pathlib import Path
from unittest import mock

import pytest

from bosch_eval.cli import main
from bosch_eval.masks.head_mask import HeadMask, ModelShape
from bosch_eval.models.model_check import (
    check_length,
    check_model_exists,
    max_positions,
    model_config,
    model_path,
    resolve_model,
)
from bosch_eval.runtime.errors import MaskError, ModelError


class TestExistence:
    def test_a_checkpoint_directory_and_the_toy_alias(self, tiny_model_dir: Path) -> None:
        assert check_model_exists(str(tiny_model_dir)) == str(tiny_model_dir)
        assert resolve_model("toy") == str(model_path())

    @pytest.mark.parametrize("name", ["/no/such/model", "./runs/missing", "~/missing/model/dir"])
    def test_a_missing_path_is_named_without_asking_the_hub(self, name: str) -> None:
        with mock.patch("transformers.utils.cached_file", side_effect=AssertionError("asked the hub")):
            with pytest.raises(ModelError, match=rf"model '{name}': no such directory"):
                resolve_model(name)

    def test_a_directory_without_config(self, tmp_path: Path) -> None:
        with pytest.raises(ModelError, match="has no config.json"):
            resolve_model(str(tmp_path))

    def test_offline_mode_looks_only_in_the_cache(self, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
        monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
        monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path))
        monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)
        with pytest.raises(
            ModelError, match=r"model 'no-org/no-such-model': not a local directory, .*local Hugging Face cache"
        ):
            check_model_exists("no-org/no-such-model")


class TestEveryCommandResolvesToy:
    def test_import(self, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
        scores = {f"{layer}-{head}": [float(layer * 8 + head)] for layer in range(4) for head in range(8)}
        (tmp_path / "heads.json").write_text(json.dumps(scores))
        out = tmp_path / "ranking.json"
        assert (
            main(
                [
                    "import",
                    "--format",
                    "retrieval-json",
                    str(tmp_path / "heads.json"),
                    "--model",
                    "toy",
                    "--out",
                    str(out),
                ]
            )
            == 0
        )
        assert json.loads(out.read_text())["num_kv_heads"] == 4

    def test_bench(self, tmp_path: Path) -> None:
        argv = ["bench", "--model", "toy", "--lengths", "64", "--decode-tokens", "1", "--repeats", "1", "--window", "8"]
        assert main([*argv, "--out", str(tmp_path)]) == 0
        assert json.loads((tmp_path / "bench.json").read_text())["rows"]

    def test_bench_refuses_a_mask_for_another_model_before_loading(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        HeadMask.uniform(ModelShape(3, 8, 4), full=True, window=8).save(tmp_path / "other.json")
        with mock.patch("bosch_eval.bench.cli._bench_model", side_effect=AssertionError("loaded the weights")):
            assert (
                main(["bench", "--model", "toy", "--mask", str(tmp_path / "other.json"), "--out", str(tmp_path)]) == 2
            )
        assert "field 'num_layers' is 3" in capsys.readouterr().err


@pytest.mark.parametrize(
    "command",
    [["search", "--ratio", "0.5"], ["rank", "--method", "dcam"], ["import", "--format", "duo", "x.tsv"], ["bench"]],
)
def test_a_missing_model_is_reported_as_missing(
    command: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [*command, "--model", str(tmp_path / "nope"), "--out", str(tmp_path / "out")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "nope': no such directory" in err and "--window" not in err


class TestLength:
    def test_max_positions_of_gqa_and_gpt2_configs(self) -> None:
        from transformers import AutoConfig

        assert max_positions(model_config(str(model_path()))) == 2048
        assert max_positions(AutoConfig.for_model("gpt2", n_positions=1024)) == 1024

    def test_a_length_past_the_maximum_names_length_model_and_maximum(self) -> None:
        config = model_config(str(model_path()))
        check_length(2048, "toy", config, "--calib-len", "--ignore-max-positions")
        with pytest.raises(
            ModelError, match=r"--calib-len 4096: longer than model 'toy' .*= 2048.*--ignore-max-positions"
        ):
            check_length(4096, "toy", config, "--calib-len", "--ignore-max-positions")


class TestAdapterValidatesBeforeLoading:
    """Mask, ranking and window errors come from the config, before HFLM loads any weight."""

    @pytest.mark.parametrize(
        ("args", "message"),
        [
            ({"mask": "other.json"}, r"field 'num_kv_heads' is 2"),
            ({"mask": "missing.json"}, r"no such file"),
            ({"layers": "intr", "ratio": 0.5}, r"field 'window' is missing"),
        ],
    )
    def test_errors_before_weights(
        self, tiny_model_dir: Path, tmp_path: Path, args: dict, message: str, monkeypatch
    ) -> None:
        from lm_eval.models.huggingface import HFLM

        from bosch_eval.model_adapters.bosch import BoschLM

        monkeypatch.chdir(tmp_path)
        HeadMask.uniform(ModelShape(3, 8, 2), full=True, window=4).save(tmp_path / "other.json")
        with mock.patch.object(HFLM, "__init__", side_effect=AssertionError("loaded the weights")):
            with pytest.raises(MaskError, match=message):
                BoschLM(pretrained=str(tiny_model_dir), device="cpu", **args)

    def test_a_missing_model_is_named(self, tmp_path: Path) -> None:
        from bosch_eval.model_adapters.bosch import BoschLM

        with pytest.raises(ModelError, match="no such directory"):
            BoschLM(pretrained=str(tmp_path / "absent"), layers="intr", ratio=0.5, window=4)

    def test_toy_l_runs_through_the_adapter_and_refuses_a_toy_mask(self, tmp_path: Path) -> None:
        from bosch_eval.model_adapters.bosch import BoschLM

        apl = Path(__file__).resolve().parents[1] / "results" / "toy_l" / "rankings" / "apl.json"
        lm = BoschLM(pretrained="toy-l", ranking=str(apl), ratio=0.75, device="cpu")
        assert (lm.hybrid.mask.shape.num_layers, lm.hybrid.mask.shape.num_kv_heads, lm.hybrid.window) == (8, 8, 32)
        assert lm.hybrid.mask.swa_ratio == 0.75
        HeadMask.uniform(ModelShape(4, 8, 4), full=False, window=32).save(tmp_path / "toy_mask.json")
        with pytest.raises(MaskError, match="toy_mask.json"):
            BoschLM(pretrained="toy-l", mask=str(tmp_path / "toy_mask.json"), device="cpu")

    def test_the_default_window_is_logged(self, caplog: pytest.LogCaptureFixture) -> None:
        from bosch_eval.model_adapters.bosch import BoschLM

        with caplog.at_level("INFO", logger="bosch_eval"):
            lm = BoschLM(pretrained="toy", layers="intr", ratio=0.5, device="cpu")
        assert lm.hybrid.window == 32
        assert "window=32 from" in caplog.text and "bosch_defaults.json" in caplog.text
