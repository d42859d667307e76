"""Per-model defaults a checkpoint can ship in ``bosch_defaults.json``, and the one place the
SWA window W is chosen.

A model directory may hold ``{"window": W, "calib_len": T}``: the SWA window and the
calibration length its authors recommend (the bundled toy model does). The CLI and the
``bosch`` adapter use them when the user gives no ``--window``/``window=`` or
``--calib-len``; an explicit value always wins (:func:`resolve_window`).
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bosch_eval.masks.head_mask import MaskError, check_window
from bosch_eval.runtime.checks import is_int
from bosch_eval.runtime.errors import SettingsError

DEFAULTS_FILE = "bosch_defaults.json"
# The W an all-full mask gets when nothing names one: no group is SWA, so W is never read.
UNREAD_WINDOW = 1

log = logging.getLogger("bosch_eval")


class WindowError(MaskError, SettingsError):
    """No SWA window can be chosen, or the one given is not a positive integer: a mask's
    setting and a command's at once, so callers catching either see it."""


@dataclass(frozen=True)
class ModelDefaults:
    """Recommended settings of one model; ``None`` where it recommends nothing."""

    window: int | None = None
    calib_len: int | None = None


def model_defaults(model: str | Path) -> ModelDefaults:
    """The defaults in ``<model>/bosch_defaults.json``, or none for hub ids and plain checkpoints."""
    path = Path(model) / DEFAULTS_FILE
    if not path.is_file():
        return ModelDefaults()
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise SettingsError(f"{path}: not valid JSON ({err})") from err
    if not isinstance(data, dict):
        raise SettingsError(f"{path}: expected a JSON object with 'window' and 'calib_len', got {type(data).__name__}")
    unknown = set(data) - {"window", "calib_len"}
    if unknown:
        raise SettingsError(f"{path}: unknown fields {sorted(unknown)}; expected 'window', 'calib_len'")
    window = check_window(data["window"], f"{path}: field 'window'") if "window" in data else None
    calib_len = data.get("calib_len")
    if calib_len is not None and (not is_int(calib_len) or calib_len < 1):
        raise SettingsError(f"{path}: field 'calib_len' must be a positive integer, got {calib_len!r}")
    return ModelDefaults(window=window, calib_len=calib_len)


def resolve_window(
    given: Any = None,
    *,
    carried: int | None = None,
    default: int | None = None,
    all_full: bool = False,
    source: str = "window",
    flag: str = "window=W",
) -> int:
    """The SWA window W, from the first of these that names one:

    1. ``given``: the user's ``window=`` / ``--window`` (checked: a positive integer);
    2. ``carried``: the window a mask or ranking file carries;
    3. ``default``: the model's ``bosch_defaults.json`` (``model_defaults(path).window``;
       logged, since the user did not choose it);
    4. for an ``all_full`` mask only, :data:`UNREAD_WINDOW` (no group is SWA: W is never read).

    Args:
        source: what the window is for, in messages (a mask file, ``layers=intr``, a model).
        flag: how the user passes a window where this is called (``window=W``, ``--window W``),
            for the messages.

    Raises:
        WindowError: ``given`` is not a positive integer, or nothing names a window.
    """
    try:
        if given is not None:
            return check_window(given, re.split("[= ]", flag)[0])
        if carried is not None:
            return check_window(carried, f"{source}: field 'window'")
    except MaskError as err:
        raise WindowError(str(err)) from None
    if default is not None:
        log.info("%s: window=%d from the model's %s (pass %s to choose)", source, default, DEFAULTS_FILE, flag)
        return default
    if all_full:
        return UNREAD_WINDOW
    raise WindowError(f"{source}: field 'window' is missing and the model ships no {DEFAULTS_FILE} with one; pass {flag} (keys seen per SWA query)")
