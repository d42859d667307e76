"""``kivi``: KiVi's recent window at LogQuant's full-precision budget.

``F`` is the recent window: whenever ``|F|`` reaches ``3W`` its oldest ``W`` are released, so
full precision holds ``2W … 3W`` tokens and events come at the same steps as LogQuant's
(``t = 3W, 4W, 5W, …``).
"""

from __future__ import annotations

from bosch_eval.caches.kv_quant.methods import KV_QUANT_METHODS, KVQuantMethod


def recent_window(full_precision: list[int], window: int) -> tuple[list[int], list[int]]:
    """The oldest ``W`` released, the recent ``2W`` kept."""
    return full_precision[window:], full_precision[:window]


KV_QUANT_METHODS.register("kivi", KVQuantMethod(recent_window, oldest_first=True))
