"""Each setting has one home where it is validated (issue 55 item 2): the window, the sinks and
the SWA ratio are checked by one function each, and every entry point reaches that function,
so a bad value gets the same words wherever it is given."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from bosch_eval.masks.head_mask import check_ratio
from bosch_eval.masks.window import check_sinks, check_window
from bosch_eval.model_adapters.settings import AdapterSettings
from bosch_eval.runtime.errors import BoschError

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("bosch_eval", "search", "model_adapters", "tasks")

# setting -> (its one check, the words that check uses, the module it lives in)
HOMES = {
    "window": (check_window, "a positive integer window", "bosch_eval/masks/window.py"),
    "sink": (check_sinks, "(attention-sink positions, 0 = none)", "bosch_eval/masks/window.py"),
    "ratio": (check_ratio, "an SWA ratio in [0, 1]", "bosch_eval/masks/head_mask.py"),
}
BAD = {"window": 0, "sink": -1, "ratio": 2.0}


def string_constants(path: Path) -> set[str]:
    return {
        node.value
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
    }


@pytest.mark.parametrize("setting", sorted(HOMES))
def test_the_setting_is_checked_in_one_module(setting: str):
    _, words, home = HOMES[setting]
    holders = sorted(
        str(path.relative_to(ROOT))
        for package in PACKAGES
        for path in (ROOT / package).rglob("*.py")
        if any(words in text for text in string_constants(path))
    )
    assert holders == [home], (
        f"{setting} is validated in {holders}; its one home is {home} ({HOMES[setting][0].__name__})"
    )


@pytest.mark.parametrize("setting", sorted(HOMES))
def test_the_adapter_says_what_the_home_says(setting: str):
    check, words, _ = HOMES[setting]
    with pytest.raises(BoschError, match=rf"{setting}: expected") as home:
        check(BAD[setting], setting)
    with pytest.raises(BoschError) as adapter:
        AdapterSettings(**{setting: BAD[setting]})
    assert words in str(adapter.value) and words in str(home.value)
