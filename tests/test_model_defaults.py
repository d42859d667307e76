"""bosch_defaults.json: the model's recommended window and calibration length."""

from __future__ import annotations

import json

import pytest

from bosch_eval.mask_sources import resolve_mask
from bosch_eval.errors import SettingsError
from bosch_eval.masks import MaskError, ModelShape
from bosch_eval.model_defaults import DEFAULTS_FILE, ModelDefaults, model_defaults

SHAPE = ModelShape(num_layers=4, num_heads=8, num_kv_heads=4)


def test_reads_window_and_calib_len(tmp_path):
    (tmp_path / DEFAULTS_FILE).write_text(json.dumps({"window": 32, "calib_len": 1024}))
    assert model_defaults(tmp_path) == ModelDefaults(window=32, calib_len=1024)


def test_hub_ids_and_plain_checkpoints_have_none(tmp_path):
    assert model_defaults("Qwen/Qwen3-8B") == ModelDefaults()
    assert model_defaults(tmp_path) == ModelDefaults()


@pytest.mark.parametrize(
    ("content", "error", "expected"),
    [
        ('{"window": 0}', MaskError, "field 'window'"),
        ('{"calib_len": "long"}', SettingsError, "field 'calib_len'"),
        ('{"windw": 32}', SettingsError, r"unknown fields \['windw'\]"),
        ("[32]", SettingsError, "expected a JSON object"),
        ("{", SettingsError, "not valid JSON"),
    ],
)
def test_bad_files_name_the_file_and_field(tmp_path, content, error, expected):
    (tmp_path / DEFAULTS_FILE).write_text(content)
    with pytest.raises(error, match=expected) as err:
        model_defaults(tmp_path)
    assert DEFAULTS_FILE in str(err.value)


def test_default_window_applies_only_when_nothing_else_sets_one():
    from_default, _ = resolve_mask(SHAPE, layers="intr", ratio=0.5, default_window=32)
    explicit, _ = resolve_mask(SHAPE, layers="intr", ratio=0.5, window=64, default_window=32)
    assert (from_default.window, explicit.window) == (32, 64)
