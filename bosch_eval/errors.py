"""The errors a user can fix: one base class, so every command reports any of them in one line."""


class BoschError(ValueError):
    """An input or setting that cannot be used as given; the message names it and what was expected.

    Each part raises a specific subclass: ``MaskError`` (masks, rankings), ``ModelError``,
    :class:`SettingsError`, ``ExportError``, ``SearchError``, ...
    """


class SettingsError(BoschError):
    """An option that is not a mask: a cache, backend, quantization, scaling, loader or run setting."""
