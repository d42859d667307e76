"""A journal's header against the run that opens it: what a journal pins (model, window,
calibration, the search's settings) compared field by field, and the refusal that names every
field a resume would change (:class:`~bosch_eval.search.journal.journal.Journal` applies it on open,
:func:`refuse_other_settings` before a model loads)."""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from bosch_eval.runtime.errors import JournalError


def refuse_other_settings(
    path: str | Path, field: str, value: Any, migrate: Callable[[dict[str, Any]], dict[str, Any]] | None = None
) -> None:
    """Before anything expensive (a model load): the refusal :class:`Journal` would give for a
    resume whose header ``field`` differs from ``value`` (the stored header read through
    ``migrate``, as :class:`Journal` reads it); nothing if there is no readable journal at
    ``path``, plain or gzipped (opening it later says what is wrong)."""
    path = Path(path)
    packed = path.with_name(path.name + ".gz")  # a committed journal, unpacked only once the resume goes on
    try:
        with open(path, "rb") if path.exists() or not packed.exists() else gzip.open(packed, "rb") as handle:
            stored = json.loads(handle.readline())["header"]
    except (OSError, EOFError, ValueError, KeyError, TypeError):
        return
    if migrate is not None and isinstance(stored, dict):
        stored = migrate(stored)
    mine = normalized_header({field: value})
    changed = [f"{where}: {theirs} → {now}" for where, theirs, now in differences({field: stored.get(field)}, mine)]
    if field in stored and changed:
        raise other_settings_error(path, changed)


def other_settings_error(path: Path, changed: Sequence[str]) -> JournalError:
    return JournalError(
        f"{path}: the journaled search ran under other settings ({'; '.join(changed)}); resuming would replace its "
        "result. Resume with the journal's settings, choose another --out, or pass --new-settings to run these "
        "settings on its scores (the old mask.json and report.md are kept)"
    )


def normalized_header(header: Mapping[str, Any]) -> dict[str, Any]:
    """The header as it will read back from the file, so comparisons see what JSON keeps."""
    if not isinstance(header, Mapping):
        raise JournalError(f"journal header: expected a mapping of search settings, got {type(header).__name__}")
    try:
        return json.loads(json.dumps(dict(header)))
    except (TypeError, ValueError) as err:
        raise JournalError(f"journal header: not JSON-serializable: {err}") from None


def differences(old: Any, new: Any, path: str = "") -> list[tuple[str, str, str]]:
    """(dotted field, old value, new value) of every leaf where two JSON values differ."""
    if isinstance(old, dict) and isinstance(new, dict):
        found = []
        for name in [*new, *(name for name in old if name not in new)]:
            where = f"{path}.{name}" if path else str(name)
            if name not in old or name not in new:
                was = _short(old[name]) if name in old else "(absent)"
                found.append((where, was, _short(new[name]) if name in new else "(absent)"))
            else:
                found.extend(differences(old[name], new[name], where))
        return found
    if type(old) is type(new) and old == new:
        return []
    return [(path, _short(old), _short(new))]


def _short(value: Any, limit: int = 60) -> str:
    text = json.dumps(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"
