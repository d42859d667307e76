"""The KV-quantization methods: which positions an event releases to the quantized store.

Every method keeps an ordered full-precision list ``F`` of positions; whenever ``|F|``
reaches ``3W`` it releases exactly ``W`` of them (:class:`KVQuantMethod`, the rule
:class:`~bosch_eval.caches.kv_quant.selection.Selector` runs). One module per method
(``logquant``, ``kivi``), each registering itself in :data:`KV_QUANT_METHODS` under its
``kv_quant=`` name; a new method is one new module here (docs/extending.md). Nothing here
imports torch: ``bosch-eval bench --help`` lists the methods.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from bosch_eval.runtime.registry import Registry


@dataclass(frozen=True)
class KVQuantMethod:
    """Which positions an event releases to the quantized store.

    Attributes:
        release: ``(full_precision, W) -> (kept, released)`` on a full-precision list of
            ``3W`` positions, ascending; exactly ``W`` are released, the rest kept in order.
        oldest_first: every event releases the oldest full-precision positions, so the
            quantized positions are ``0 … n − 1`` in order (the store dequantizes in place).
    """

    release: Callable[[list[int], int], tuple[list[int], list[int]]]
    oldest_first: bool = False


# ``kv_quant=name`` runs ``KV_QUANT_METHODS[name]``; the built-in methods are listed first.
KV_QUANT_METHODS: Registry[KVQuantMethod] = Registry(
    "KV-quantization method", package=__name__, first=("logquant", "kivi"), field="kv_quant"
)
