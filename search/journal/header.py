"""A journal's header against the run that opens it: what a journal pins (model, window,
calibration, the search's settings) compared field by field, and the refusal that names every
field a resume would change (:class:`~bosch_eval.search.journal.store.Journal` applies it on open,
:func:`header_changes` before a model loads)."""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from bosch_eval.runtime.errors import JournalError


def header_changes(
    path: str | Path, field: str, value: Any, migrate: Callable[[dict[str, Any]], dict[str, Any]] | None = None
) -> list[str]:
    """``dotted.field: stored → value`` for each leaf of the stored header's ``field`` that
    ``value`` changes; [] where there is no readable journal or no such field."""
    stored = stored_header(path)
    if stored is None:
        return []
    if migrate is not None:
        stored = migrate(stored)
    if field not in stored:
        return []
    mine = normalized_header({field: value})
    return [f"{where}: {theirs} → {now}" for where, theirs, now in differences({field: stored.get(field)}, mine)]


def stored_header(path: str | Path) -> dict[str, Any] | None:
    """The header of the journal at ``path`` or of its committed ``.gz``; None where neither is readable."""
    path = Path(path)
    packed = path.with_name(path.name + ".gz")  # a committed journal, unpacked only once the resume goes on
    try:
        with open(path, "rb") if path.exists() or not packed.exists() else gzip.open(packed, "rb") as handle:
            stored = json.loads(handle.readline())["header"]
    except (OSError, EOFError, ValueError, KeyError, TypeError):
        return None
    return stored if isinstance(stored, dict) else None


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
