"""Per-model defaults a checkpoint can ship in ``bosch_defaults.json``.

A model directory may hold ``{"window": W, "calib_len": T}``: the SWA window and the
calibration length its authors recommend (the bundled toy model does). The CLI and the
``bosch`` adapter use them when the user gives no ``--window``/``window=`` or
``--calib-len``; an explicit value always wins (:func:`~bosch_eval.masks.window.resolve_window`,
the one place W is chosen, with the window's other rules; re-exported here with
:data:`UNREAD_WINDOW` for the callers that import them from here; :class:`WindowError` is
imported from :mod:`bosch_eval.runtime.errors`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from bosch_eval.masks.window import DEFAULTS_FILE, UNREAD_WINDOW, check_window, resolve_window
from bosch_eval.runtime.checks import is_int
from bosch_eval.runtime.errors import SettingsError

__all__ = ["DEFAULTS_FILE", "UNREAD_WINDOW", "ModelDefaults", "model_defaults", "resolve_window"]


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
