"""What applying a hybrid spec changes on a model, recorded so that it can be put back.

``set_attn_implementation`` writes ``_attn_implementation_internal`` on the model's config,
on its sub-models' configs and on their sub-configs; the spec is saved in one config field
(``bosch_mask``) for ``save_pretrained``. A :class:`RestorePoint` records each of those as it
was (or that it was absent) and restores exactly that. Attributes set on modules are the
handle's to remove (``bosch_eval.attention.hybrid_attention``).
"""

from __future__ import annotations

import copy
from typing import Any

_MISSING = object()


class RestorePoint:
    """Each config's attention implementation and one field of the model's config, as they were."""

    def __init__(self, model: Any, field: str, implementations: list[tuple[Any, Any]], saved: Any) -> None:
        self.model, self.field, self.implementations, self.saved = model, field, implementations, saved

    @classmethod
    def take(cls, model: Any, field: str) -> RestorePoint:
        """Record ``model``'s state before a spec is applied; ``field`` is the config field it writes."""
        implementations = [
            (config, config.__dict__.get("_attn_implementation_internal", _MISSING)) for config in _configs(model)
        ]
        saved = model.config.__dict__.get(field, _MISSING)
        return cls(model, field, implementations, saved if saved is _MISSING else copy.deepcopy(saved))

    def put_back(self) -> None:
        for config, implementation in self.implementations:
            _put(config, "_attn_implementation_internal", implementation)
        _put(self.model.config, self.field, self.saved)


def _put(obj: Any, name: str, value: Any) -> None:
    if value is _MISSING:
        obj.__dict__.pop(name, None)
    else:
        setattr(obj, name, value)


def _configs(model: Any) -> list[Any]:
    """Every config ``set_attn_implementation`` may write: the model's and its sub-models',
    and their sub-configs at any depth."""
    found: dict[int, Any] = {}
    pending = [model.config] + [getattr(module, "config", None) for module in model.modules()]
    while pending:
        config = pending.pop()
        if config is None or id(config) in found or not hasattr(config, "sub_configs"):
            continue
        found[id(config)] = config
        pending += [getattr(config, key, None) for key in config.sub_configs]
    return list(found.values())
