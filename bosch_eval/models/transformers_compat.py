"""Names that differ between the transformers releases we support (``>=5.0,<6``).

transformers 5.24 renamed the cache argument of ``forward`` and ``generate`` from
``past_key_values`` to ``cache``; the old name still works but warns, and is removed from
``forward`` in 5.40. Every call of ours that hands a model a cache takes the name from
:func:`cache_argument`, so the same code runs warning-free on either side of the rename.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any


@functools.cache
def _cache_argument(model_class: type) -> str:
    # transformers' deprecate_kwarg keeps the wrapped signature (functools.wraps), so the
    # installed forward's own parameters say which name it takes. A class without a ``cache``
    # parameter (older transformers, remote code) would swallow ``cache=`` into **kwargs
    # and silently run without the cache: there the old name is the only correct one.
    return "cache" if "cache" in inspect.signature(model_class.forward).parameters else "past_key_values"


def cache_argument(model: Any) -> str:
    """The keyword under which ``model(...)`` and ``model.generate(...)`` take a KV cache:
    ``cache`` where the installed model class accepts it, else ``past_key_values``
    (decided once per class; the rename reached ``forward`` and ``generate`` together)."""
    return _cache_argument(type(model))
