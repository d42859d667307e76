"""What a run's scores depend on beyond its model_args strings, pinned in its ``run.json``.

``mask=runs/q3/mask.json`` names a path, not a mask: a new search writes another mask to
the same path, and a resumed comparison that compared only the strings kept the old row.
So every run records the content of what it read:

* ``model``: the model's identity. A local directory: the SHA-256 of every file in it
  except Markdown (a model card does not change a score; weights, config, tokenizer and
  ``bosch_defaults.json``, which sets the default window, do). A hub id: the commit of the
  cached snapshot it loads (the cache stores a snapshot per commit; hashing a
  multi-GB download again on every start would cost more than the check is worth). A hub
  model that was not cached yet when a run was pinned has no commit, so its first resume
  evaluates it again.
* ``mask`` / ``ranking``: the SHA-256 of the file named.
* ``bits`` and ``window``: the mask the run applied, which also covers ``layers=``
  heuristics (code, not files).

A resumed comparison evaluates a run again when any of these differ (:func:`changed`).
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from bosch_eval.masks import HeadMask

CHUNK = 1 << 20
FILE_SOURCES = ("mask", "ranking")
NOT_READ_AT_LOAD = (".md",)  # model cards


def file_digest(path: str | Path) -> str:
    """SHA-256 of a file's content (hex)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(CHUNK):
            digest.update(block)
    return digest.hexdigest()


def model_identity(path: str, revision: str | None = None) -> dict[str, Any]:
    """The identity of a resolved model (a checkpoint directory or a hub id), as described above."""
    directory = Path(path).expanduser()
    if directory.is_dir():
        files = sorted(p for p in directory.rglob("*") if p.is_file() and p.suffix not in NOT_READ_AT_LOAD and not _hidden(p, directory))
        return {"files": {str(p.relative_to(directory)): file_digest(p) for p in files}}
    from huggingface_hub import try_to_load_from_cache

    # .../snapshots/<commit>/config.json; None when not cached yet (the load downloads it).
    cached = try_to_load_from_cache(path, "config.json", revision=revision)
    commit = Path(cached).parent.name if isinstance(cached, str) else None
    return {"hub": path, "revision": revision, "commit": commit}


def _hidden(path: Path, root: Path) -> bool:
    """Dotfiles and dot-directories (``.cache``, lock files) are not part of a checkpoint."""
    return any(part.startswith(".") for part in path.relative_to(root).parts)


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
    if saved.get("model") != current["model"]:
        reasons.append(f"the model changed ({_model_change(saved.get('model') or {}, current['model'])})")
    for key in FILE_SOURCES:
        before, now = saved.get(key), current.get(key)
        if before != now:
            what = f"{key} file {(now or before)['file']}"
            if before and now:
                reasons.append(f"{what} changed (sha256 {before['sha256'][:12]} → {now['sha256'][:12]})")
            else:
                reasons.append(f"{what} {'is new' if now else 'is no longer used'}")
    if (saved.get("bits"), saved.get("window")) != (current["bits"], current["window"]) and not reasons:
        reasons.append(f"the mask resolves differently now (window {saved.get('window')} → {current['window']}, or other bits)")
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
