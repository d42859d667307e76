"""bosch_defaults.json: the model's recommended window and calibration length."""

from __future__ import annotations

import json

import pytest

from bosch_eval.masks.head_mask import ModelShape
from bosch_eval.masks.mask_sources import MaskRequest, resolve_mask
from bosch_eval.models.model_defaults import DEFAULTS_FILE, UNREAD_WINDOW, ModelDefaults, model_defaults, resolve_window
from bosch_eval.runtime.errors import MaskError, SettingsError

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
    from_default, _ = resolve_mask(SHAPE, MaskRequest(layers="intr", ratio=0.5), default_window=32)
    explicit, _ = resolve_mask(SHAPE, MaskRequest(layers="intr", ratio=0.5, window=64), default_window=32)
    assert (from_default.window, explicit.window) == (32, 64)


class TestResolveWindow:
    """The one place W is chosen: the user's value, else the mask's, else the model's default."""

    def test_precedence(self):
        assert resolve_window(8, carried=16, default=32) == 8
        assert resolve_window(None, carried=16, default=32) == 16
        assert resolve_window(None, carried=None, default=32) == 32

    def test_the_default_is_logged_with_the_flag_to_choose(self, caplog):
        with caplog.at_level("INFO", logger="bosch_eval"):
            resolve_window(default=32, source="toy", flag="--window W")
        assert "toy: window=32 from the model's bosch_defaults.json (pass --window W to choose)" in caplog.text

    def test_nothing_names_a_window(self):
        with pytest.raises(MaskError, match=r"layers=intr: field 'window' is missing .* pass --window W") as err:
            resolve_window(source="layers=intr", flag="--window W")
        assert isinstance(err.value, SettingsError)  # a command's setting too (search, rank)

    def test_an_all_full_mask_never_reads_it(self):
        assert resolve_window(all_full=True) == UNREAD_WINDOW
        assert resolve_window(all_full=True, default=32) == 32  # a named window still wins

    def test_a_bad_given_window_names_the_flag(self):
        with pytest.raises(MaskError, match=r"--window: expected a positive integer"):
            resolve_window(0, flag="--window W")
