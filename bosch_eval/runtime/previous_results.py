"""Keeping a finished result aside before a run under new settings replaces it.

``search --resume --new-settings``, ``compare --resume --new-settings`` and ``calib-check
--new-settings`` run other settings in an output directory that holds a finished result.
Its files are moved, not deleted, into ``<out>/previous/<UTC time>/`` beside a
``settings.json`` of the settings that made them, so the old result stays readable next to
the new one. A move within one directory is a rename: a kill leaves each file either in
its old place or in the new one.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

PREVIOUS_DIR = "previous"

log = logging.getLogger("bosch_eval")


def keep_aside(out: str | Path, names: Sequence[str], settings: Mapping[str, Any]) -> Path | None:
    """Move the files or folders ``names`` of ``out`` that exist into a new
    ``out/previous/<time>/`` and write ``settings`` there; return that folder (None when
    none of them exists: nothing to keep)."""
    out = Path(out)
    present = [name for name in names if (out / name).exists()]
    if not present:
        return None
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    folder = out / PREVIOUS_DIR / stamp
    number = 1
    while folder.exists():  # two replacements within one second
        number += 1
        folder = out / PREVIOUS_DIR / f"{stamp}-{number}"
    folder.mkdir(parents=True)
    (folder / "settings.json").write_text(json.dumps(dict(settings), indent=1) + "\n")
    for name in present:
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        os.replace(out / name, folder / name)
    log.warning("%s: the result of the earlier settings (%s) is kept in %s", out, ", ".join(present), folder)
    return folder
