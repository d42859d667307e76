"""The one home of "an int but not a bool" and "a number but not a bool".

Python's ``bool`` is an ``int``, and JSON, YAML and lm-eval's model_args parser all hand over
``True`` where a user slipped; a count of ``True`` keys or a ratio of ``False`` must be an
error naming the field, not 1 or 0. Every validator of the package asks here, so the rule is
written once (tests/test_checks.py holds the rest of the source to that).
"""

from __future__ import annotations

from typing import Any

from bosch_eval.runtime.errors import BoschError, SettingsError


def is_int(value: Any) -> bool:
    """Whether ``value`` is an integer, ``True`` and ``False`` excluded."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    """Whether ``value`` is an int or a float, ``True`` and ``False`` excluded."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_int(
    value: Any,
    field: str,
    *,
    minimum: int | None = None,
    expected: str = "an integer",
    error: type[BoschError] = SettingsError,
) -> int:
    """Return ``value`` if it is an integer of at least ``minimum``.

    Raises:
        BoschError: ``error``, reading ``"{field}: expected {expected}, got {value!r}"``.
    """
    if not is_int(value) or (minimum is not None and value < minimum):
        raise error(f"{field}: expected {expected}, got {value!r}")
    return value
