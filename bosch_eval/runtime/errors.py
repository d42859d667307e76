"""The errors a user can fix, all in this one module: one base class, so every command reports
any of them in one line, and one place to see them all (docs/conventions.md#errors).

Every part of the package raises these (the core, the tasks, the features and the CLI), and
this module imports nothing of the package, so no module has to import another one for its
error class. They are imported from here only (``from bosch_eval.runtime.errors import
MaskError``), never through a module that raises them, and under their own names
(tests/test_error_imports.py).
"""

from __future__ import annotations

import sys
from collections.abc import Callable


class BoschError(ValueError):
    """An input or setting that cannot be used as given; the message names it and what was expected.

    Each part raises a specific subclass: :class:`MaskError` (masks, rankings), :class:`ModelError`,
    :class:`SettingsError`, :class:`ExportError`, :class:`SearchError`, ...
    """


class SettingsError(BoschError):
    """An option that is not a mask: a cache, backend, quantization, scaling, loader or run setting."""


class MaskError(BoschError):
    """A mask, ranking or ratio that cannot be used as given."""


class WindowError(MaskError, SettingsError):
    """No SWA window can be chosen, or the one given is not a positive integer: a mask's
    setting and a command's at once, so callers catching either see it."""


class LocalWindowError(BoschError):
    """A window or sink count that cannot be used."""


class ModelError(BoschError):
    """A model that does not exist or cannot be used, or a length it cannot hold."""


class DeviceError(ModelError):
    """A device that this machine or this torch build cannot use."""


class ExportError(BoschError):
    """A mask or model that the chosen export target cannot represent."""


class LmEvalError(BoschError):
    """A task, metric or result that lm-eval cannot give as asked (the search's objective raises
    it too)."""


class LaunchError(LmEvalError):
    """Processes that cannot share an evaluation as launched. An :class:`LmEvalError`: lm-eval
    could not give the scores as asked."""


class TemplateTooLong(BoschError):
    """The fixed parts of a NIAH example do not fit its token budget (``tasks/niah/haystack.py``)."""


class EntryError(BoschError):
    """A ``compare`` entry or leaderboard file that cannot be run as written."""


class SearchError(BoschError, RuntimeError):
    """A search that cannot produce a meaningful result (bad anchors, bad settings)."""


class JournalError(BoschError, RuntimeError):
    """A search journal that cannot be opened, resumed or appended to as asked."""


class CalibCheckError(BoschError):
    """A ``calib-check`` setting or output directory that cannot be used."""


def exit_status(prog: str, run: Callable[[], object]) -> int:
    """Run a command: 0 when it finishes; a BoschError is one ``prog: error: ...`` line on stderr and 2."""
    try:
        run()
    except BoschError as err:
        print(f"{prog}: error: {err}", file=sys.stderr)
        return 2
    return 0
