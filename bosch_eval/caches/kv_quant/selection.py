"""Which cached positions stay at full precision: LogQuant's log-sparse rule, and KiVi's window.

LogQuant (arXiv 2503.19950, Fig. 6), quoted from the seed:

    "LogQuant's KV cache compression workflow. The number of reserved original-precision
    tokens increases from 2W to 3W. We then apply a log-sparse strategy to filter the
    first 2W tokens, quantize half of these tokens, and compress the reserved token
    length back to 2W."

    "Initially, 3W tokens are kept at full precision. A log-sparse filtering strategy is
    then applied to the first 2W tokens, resulting in half of them being quantized."

As implemented, token by token: append each new position to the ordered full-precision
list ``F``; whenever ``|F|`` reaches ``3W``, the first ``2W`` entries of ``F`` are thinned by
2 (entries 0, 2, 4, … stay at full precision, entries 1, 3, 5, … are released to the
quantized store) and the last ``W`` stay. After the first event ``F`` is a log-sparse part
of ``W`` tokens followed by a recent window of ``W`` to ``2W``; each later event thins the
log-sparse part and the older half of the recent window by 2 each, so the density of
kept tokens halves with every doubling of the distance. The seed does not say which
half survives; keeping the even entries keeps position 0 (the attention sink, which the
seed's Table 1 shows matters) at full precision forever.

KiVi at the same full-precision budget: ``F`` is the recent window; when ``|F|`` reaches
``3W`` its oldest ``W`` are released. Both methods thus hold ``2W … 3W`` full-precision
tokens and release exactly ``W`` tokens per event, at the same steps
(``t = 3W, 4W, 5W, …``).

Events depend only on how many tokens were seen, never on the model's values, so one
:class:`Selector` is shared by every layer of a cache and a chunked prefill ends in the
same state as token-by-token decoding.

Each method registers itself in :data:`KV_QUANT_METHODS` under its ``kv_quant=`` name; a
module of its own in this package is found when the name is first asked for.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

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


KV_QUANT_METHODS: Registry[KVQuantMethod] = Registry("KV-quantization method", package="bosch_eval.caches.kv_quant", field="kv_quant")


def _log_sparse(full_precision: list[int], window: int) -> tuple[list[int], list[int]]:
    """LogQuant: the first ``2W`` entries thinned by 2 (even ones kept), the last ``W`` kept."""
    head, tail = full_precision[: 2 * window], full_precision[2 * window :]
    return head[0::2] + tail, head[1::2]


def _recent_window(full_precision: list[int], window: int) -> tuple[list[int], list[int]]:
    """KiVi: the oldest ``W`` released, the recent ``2W`` kept."""
    return full_precision[window:], full_precision[:window]


KV_QUANT_METHODS.register("logquant", KVQuantMethod(_log_sparse))
KV_QUANT_METHODS.register("kivi", KVQuantMethod(_recent_window, oldest_first=True))


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
