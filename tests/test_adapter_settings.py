"""``--model bosch`` model_args: parsed once into frozen settings; a typo is refused before any
weight loads, naming the key, the nearest valid key and the valid ones; ``compare --entry`` and
``search --model-args`` go through the same parser."""

from __future__ import annotations

import dataclasses
import inspect
import subprocess
import sys
from pathlib import Path
from unittest import mock

import pytest
from lm_eval.api.registry import get_model
from lm_eval.models.huggingface import HFLM
from transformers import AutoModelForCausalLM

from bosch_eval.compare.entries import parse_entry
from bosch_eval.model_adapters.bosch import BoschLM
from bosch_eval.model_adapters.loader_args import FROM_PRETRAINED, adapter_settings, loader_parameters, parse_model_args
from bosch_eval.model_adapters.settings import AdapterSettings
from bosch_eval.runtime.errors import EntryError, MaskError, SettingsError

FIXTURE_TASKS = Path(__file__).parent / "fixtures" / "tasks"


@pytest.fixture
def no_weights():
    """Fails the test if any weight loads."""
    with mock.patch.object(
        AutoModelForCausalLM, "from_pretrained", side_effect=AssertionError("weights loaded")
    ) as loader:
        yield loader


class TestTypos:
    @pytest.mark.parametrize(
        ("key", "nearest"), [("maks", "mask"), ("windw", "window"), ("kv_bit", "kv_bits"), ("revison", "revision")]
    )
    def test_a_typo_is_named_with_its_nearest_key_before_weights_load(self, tiny_model_dir, no_weights, key, nearest):
        with pytest.raises(SettingsError) as err:
            BoschLM(pretrained=str(tiny_model_dir), device="cpu", layers="intr", ratio=0.5, window=4, **{key: "16"})
        message = str(err.value)
        assert f"model_arg {key!r} is not one the bosch adapter takes; did you mean {nearest!r}? It takes: " in message
        # The valid keys: the adapter's own and HFLM's, none it refuses.
        offered = set(message.split("It takes: ")[1].split(", "))
        assert {"window", "kv_quant", "max_length", "trust_remote_code"} <= offered
        assert not {"tp_plan", "attn_implementation"} & offered
        no_weights.assert_not_called()

    def test_the_stock_lm_eval_path_refuses_before_weights_load(self, tiny_model_dir, no_weights):
        with pytest.raises(SettingsError, match=r"model_arg 'windw' .* did you mean 'window'\?"):
            get_model("bosch").create_from_arg_string(
                f"pretrained={tiny_model_dir},layers=intr,ratio=0.5,windw=16", {"device": "cpu"}
            )
        no_weights.assert_not_called()

    def test_a_key_far_from_every_valid_one_gets_no_guess(self):
        with pytest.raises(SettingsError) as err:
            adapter_settings({"zzzzzz": 1})
        assert "did you mean" not in str(err.value)

    @pytest.mark.slow
    def test_the_lm_eval_command_prints_one_line(self, tiny_model_dir, tmp_path):
        executable = Path(sys.executable).parent / "lm_eval"
        result = subprocess.run(
            [str(executable), "--model", "bosch", "--model_args", f"pretrained={tiny_model_dir},layers=intr,ratio=0.5,windw=16",
             "--tasks", "bosch_test_choice", "--include_path", str(FIXTURE_TASKS), "--device", "cpu", "--limit", "1"],
            capture_output=True, text=True, cwd=tmp_path, timeout=300, check=False,
        )  # fmt: skip
        assert result.returncode != 0
        (line,) = [line for line in result.stderr.splitlines() if line.startswith("lm_eval: error:")]
        assert line.startswith(
            "lm_eval: error: model_args: model_arg 'windw' is not one the bosch adapter takes; did you mean 'window'? It takes: "
        )
        assert result.stderr.rstrip().endswith(line) and "Traceback" not in result.stderr
        assert "Qwen3ForCausalLM" not in result.stderr


class TestSettings:
    def test_the_adapter_takes_its_fields_and_passes_the_rest_to_hflm(self):
        settings, rest = adapter_settings({"window": 4, "sink": 2, "revision": "main", "dtype": "float32"})
        assert (settings.window, settings.sink) == (4, 2)
        assert rest == {"revision": "main", "dtype": "float32"}

    def test_the_keys_are_the_settings_fields_and_hflm_parameters(self):
        hflm = {name for name in inspect.signature(HFLM.__init__).parameters if name not in ("self", "kwargs")}
        ours = {spec.name for spec in dataclasses.fields(AdapterSettings)}
        assert loader_parameters() == hflm | ours | set(FROM_PRETRAINED)
        assert not ours & hflm, "a key both ours and HFLM's would never reach HFLM"
        assert list(inspect.signature(BoschLM.__init__).parameters) == ["self", "pretrained", "model_args"]

    def test_importing_the_adapter_registers_it_and_does_nothing_else(self):
        """Importing the adapter's module registers ``bosch`` with lm-eval; the keys HFLM takes are read when
        the first model_args are checked, not at import."""
        code = (
            "import bosch_eval.model_adapters.bosch\n"
            "from lm_eval.api.registry import get_model\n"
            "from bosch_eval.model_adapters.loader_args import hflm_parameters\n"
            "assert get_model('bosch') is bosch_eval.model_adapters.bosch.BoschLM\n"
            "print(hflm_parameters.cache_info().currsize)"
        )
        assert (
            subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
            == "0"
        )

    def test_strings_are_converted_explicitly(self):
        settings = AdapterSettings(
            window="16", sink="2", ratio="0.5", memoize_tokens="True", progress_bars="false", prefix_cache_mb="8"
        )
        assert (settings.window, settings.sink, settings.ratio) == (16, 2, 0.5)
        assert (settings.memoize_tokens, settings.progress_bars, settings.prefix_cache_mb) == (True, False, 8)

    @pytest.mark.parametrize(
        ("args", "error", "message"),
        [
            ({"memoize_tokens": "yes"}, SettingsError, r"memoize_tokens: expected True or False, got 'yes'"),
            ({"window": "sixteen"}, SettingsError, r"window: expected an integer, got 'sixteen'"),
            ({"window": "0"}, MaskError, r"window: expected a positive integer"),
            ({"ratio": "half"}, SettingsError, r"ratio: expected a number, got 'half'"),
            ({"ratio": 1.5}, MaskError, r"ratio: expected an SWA ratio in \[0, 1\]"),
            ({"kv_cache": "paged"}, SettingsError, r"kv_cache: expected one of \['hybrid', 'captured', 'dynamic'\]"),
            ({"prefix_cache_mb": -1}, SettingsError, r"prefix_cache_mb: expected a whole number"),
            ({"rope_factor": 2}, SettingsError, r"rope_factor: only used with rope_scaling=yarn"),
            ({"mask": 3}, SettingsError, r"mask: expected a file path"),
        ],
    )
    def test_bad_values_name_the_key(self, args, error, message):
        with pytest.raises(error, match=message):
            AdapterSettings(**args)

    def test_bad_values_fail_before_weights_load(self, tiny_model_dir, no_weights):
        with pytest.raises(SettingsError, match="allow_truncation: expected True or False"):
            BoschLM(pretrained=str(tiny_model_dir), device="cpu", mask="full", allow_truncation="maybe")
        no_weights.assert_not_called()

    def test_the_settings_are_frozen(self):
        with pytest.raises(dataclasses.FrozenInstanceError):
            AdapterSettings().window = 4  # type: ignore[misc]

    def test_a_loaded_adapter_keeps_its_settings(self, tiny_model_dir):
        lm = BoschLM(pretrained=str(tiny_model_dir), device="cpu", layers="intr", ratio="0.5", window="4", sink="1")
        assert lm.settings == AdapterSettings(layers="intr", ratio=0.5, window=4, sink=1)
        assert (lm.hybrid.window, lm.hybrid.sinks) == (4, 1)


class TestOneParser:
    """compare --entry and search --model-args refuse a typo as lm_eval --model bosch does."""

    def test_compare_entries_name_the_nearest_key(self):
        with pytest.raises(EntryError) as entry_err:
            parse_entry("x=mask=m.json,windw=16")
        with pytest.raises(SettingsError) as adapter_err:
            adapter_settings({"mask": "m.json", "windw": "16"})
        assert str(entry_err.value).startswith("--entry 'x': model_arg 'windw'")
        assert str(entry_err.value).removeprefix("--entry 'x'") == str(adapter_err.value).removeprefix("model_args")

    def test_compare_entries_go_through_the_adapters_check(self):
        from bosch_eval.model_adapters import loader_args

        with mock.patch.object(loader_args, "check_keys", wraps=loader_args.check_keys) as check:
            parse_entry("x=mask=m.json,window=16")
        check.assert_called_once_with({"mask": "m.json", "window": "16"}, "--entry 'x'")

    def test_the_search_reserves_only_keys_the_loader_takes(self):
        from bosch_eval.model_adapters.loader_args import RESERVED

        assert set(RESERVED) <= loader_parameters(), "a reserved key the loader does not take: renamed in the settings?"

    def test_search_model_args_name_the_nearest_key(self):
        with pytest.raises(SettingsError, match=r"--model-args: model_arg 'revison' .* did you mean 'revision'\?"):
            parse_model_args("revison=main")
