"""Which cached positions stay at full precision, advanced token by token (:class:`Selector`).

Append each new position to the ordered full-precision list ``F``; whenever ``|F|`` reaches
``3W``, the method's rule (:mod:`bosch_eval.caches.kv_quant.methods`: LogQuant's log-sparse
set, KiVi's recent window, ...) releases exactly ``W`` of them to the quantized store. Every
method thus holds ``2W … 3W`` full-precision tokens and releases ``W`` tokens per event, at
the same steps (``t = 3W, 4W, 5W, …``).

Events depend only on how many tokens were seen, never on the model's values, so one
:class:`Selector` is shared by every layer of a cache and a chunked prefill ends in the
same state as token-by-token decoding.
"""

from __future__ import annotations

import torch

# Re-exported: the registry's old home, named by callers and docs.
from bosch_eval.caches.kv_quant.methods import KV_QUANT_METHODS, KVQuantMethod

__all__ = ["KV_QUANT_METHODS", "KVQuantMethod", "Selector"]


class Selector:
    """The full-precision position set of one cache, advanced as tokens arrive.

    Args:
        method: a name in :data:`KV_QUANT_METHODS` (``logquant``, ``kivi``).
        window: W, the LogQuant window (full precision holds ``2W … 3W`` tokens).
    """

    def __init__(self, method: str, window: int) -> None:
        self.method, self.window = method, window
        self.rule = KV_QUANT_METHODS.lookup(method)
        self.seen = 0
        self.full_precision: list[int] = []
        self.events: list[torch.Tensor] = []  # positions released by each event, in order
        self._fp_tensor: torch.Tensor | None = None

    def advance_to(self, seen: int) -> None:
        """Account for every position below ``seen`` (idempotent for earlier values)."""
        if seen <= self.seen:
            return
        limit = 3 * self.window
        for position in range(self.seen, seen):
            self.full_precision.append(position)
            if len(self.full_precision) == limit:
                self.full_precision, released = self.rule.release(self.full_precision, self.window)
                self.events.append(torch.tensor(released, dtype=torch.long))
        self.seen = seen
        self._fp_tensor = None

    def full_precision_positions(self) -> torch.Tensor:
        """``[n_fp]`` positions currently at full precision, ascending."""
        if self._fp_tensor is None:
            self._fp_tensor = torch.tensor(self.full_precision, dtype=torch.long)
        return self._fp_tensor

    def reset(self) -> None:
        self.__init__(self.method, self.window)  # type: ignore[misc]
