"""The errors a user can fix: one base class, so every command reports any of them in one line."""

from __future__ import annotations

import sys
from collections.abc import Callable


class BoschError(ValueError):
    """An input or setting that cannot be used as given; the message names it and what was expected.

    Each part raises a specific subclass: ``MaskError`` (masks, rankings), ``ModelError``,
    :class:`SettingsError`, ``ExportError``, ``SearchError``, ...
    """


class SettingsError(BoschError):
    """An option that is not a mask: a cache, backend, quantization, scaling, loader or run setting."""


def exit_status(prog: str, run: Callable[[], object]) -> int:
    """Run a command: 0 when it finishes; a BoschError is one ``prog: error: ...`` line on stderr and 2."""
    try:
        run()
    except BoschError as err:
        print(f"{prog}: error: {err}", file=sys.stderr)
        return 2
    return 0
