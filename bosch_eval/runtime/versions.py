"""The versions recorded beside a result (a mask's provenance, a ranking, a report)."""

from __future__ import annotations

import importlib.metadata
import platform


def versions(*names: str) -> dict[str, str]:
    """``{name: version}`` in the order given: ``python`` is the interpreter, any other name
    an installed distribution (``not installed`` when it is not)."""
    found = {}
    for name in names:
        try:
            found[name] = platform.python_version() if name == "python" else importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = "not installed"
    return found
