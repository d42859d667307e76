"""What a run's scores depend on beyond its model_args strings, pinned in its ``run.json``.

``mask=runs/q3/mask.json`` names a path, not a mask: a new search writes another mask to
the same path, and a resumed comparison that compared only the strings kept the old row.
So every run records the content of what it read, not where it was
(:mod:`bosch_eval.models.model_identity`), and a comparison resumes from any clone:

* ``model``: the model's identity (a local directory: the SHA-256 of its files, a bundled
  model also by its alias; a hub id: the commit of the cached snapshot);
* ``mask`` / ``ranking``: the SHA-256 of the file named (the name is kept for messages);
* ``bits`` and ``window``: the mask the run applied, which also covers ``layers=``
  heuristics (code, not files).

A resumed comparison finds a run whose inputs differ (:func:`changed`) and, asked to
(``--new-settings``), evaluates it again.
"""

from __future__ import annotations

from typing import Any

from bosch_eval.masks.head_mask import HeadMask
from bosch_eval.models.model_identity import same_model
from bosch_eval.runtime.digests import file_digest

FILE_SOURCES = ("mask", "ranking")


def run_inputs(args: dict[str, str], mask: HeadMask, model: dict[str, Any]) -> dict[str, Any]:
    """What a run with model_args ``args`` that applies ``mask`` depends on."""
    inputs: dict[str, Any] = {"model": model, "bits": [list(row) for row in mask.bits], "window": mask.window}
    for key in FILE_SOURCES:
        if key in args and not (key == "mask" and args[key] == "full"):
            inputs[key] = {"file": args[key], "sha256": file_digest(args[key])}
    return inputs


def changed(saved: dict[str, Any] | None, current: dict[str, Any]) -> list[str]:
    """What differs between a finished run's pinned inputs and the current ones, in words
    (empty: the run stands)."""
    if saved is None:
        return ["its run.json pins no inputs (made by an older bosch-eval)"]
    reasons = []
    if not same_model(saved.get("model"), current["model"]):
        reasons.append(f"the model changed ({_model_change(saved.get('model') or {}, current['model'])})")
    for key in FILE_SOURCES:
        before, now = saved.get(key), current.get(key)
        if (before or {}).get("sha256") != (now or {}).get("sha256"):  # the content, wherever the file lies
            what = f"{key} file {(now or before)['file']}"
            if before and now:
                reasons.append(f"{what} changed (sha256 {before['sha256'][:12]} → {now['sha256'][:12]})")
            else:
                reasons.append(f"{what} {'is new' if now else 'is no longer used'}")
    if (saved.get("bits"), saved.get("window")) != (current["bits"], current["window"]) and not reasons:
        reasons.append(
            f"the mask resolves differently now (window {saved.get('window')} → {current['window']}, or other bits)"
        )
    return reasons


def _model_change(before: dict[str, Any], now: dict[str, Any]) -> str:
    if "files" in before and "files" in now:
        names = set(before["files"]) | set(now["files"])
        return "files " + ", ".join(sorted(n for n in names if before["files"].get(n) != now["files"].get(n)))
    return f"{_describe(before)} → {_describe(now)}"


def _describe(model: dict[str, Any]) -> str:
    if "files" in model:
        return "a local directory"
    return f"{model.get('hub')} at commit {model.get('commit') or '(not cached)'}"
