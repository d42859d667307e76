"""The local-attention value of an SWA KV group, and its one band predicate.

``LocalWindow(window=W, sinks=S)``: query ``t`` sees key ``j`` iff

    j ≤ t  and  (j < S  or  t − W < j)

i.e. the ``W`` most recent keys (itself included) plus the first ``S`` positions (attention
sinks, StreamingLLM). ``S = 0`` is exactly transformers' ``sliding_attention``
(``masking_utils.sliding_window_causal_mask_function``). Every kernel, the hybrid cache's
retention rule, the KV-bytes formulas and the prefix cache's key derive from this value.

The predicates are written like transformers' mask functions, ``(batch, head, q, kv) ->
bool``, and combined with its ``and_masks``/``or_masks``; on index tensors they broadcast,
so :meth:`LocalWindow.dense` is the predicate evaluated on a grid, and FlexAttention takes
the same function as its ``mask_mod``.

Positions are those of a row's real tokens: the sinks are each row's first ``S`` real keys,
never padding, so a row's output does not depend on its batch. A padded row's key index and
position differ by its padding; the window's difference ``t − j`` does not change under left
(or right) padding, the sinks do, so they come from the key padding of each row
(:func:`sink_keys`): ``[B, K]``, True at the first ``S`` real keys. Without padding (``None``)
they are the first ``S`` key indices.

Index convention: kernels see keys ``0 … K−1`` and queries that are the last ``T`` of them
(query ``i`` at key index ``K − T + i``). A hybrid cache that dropped positions hands its SWA
groups the first ``S`` positions followed by a contiguous run ending at the last query; the
dropped middle was out of every query's window, so the predicate on these indices is still
exact (``bosch_eval.caches.hybrid_cache``).

This module imports no torch at load: the KV-bytes formula is pure arithmetic.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from bosch_eval.runtime.checks import is_int
from bosch_eval.runtime.errors import BoschError

# How a serving engine counts a window of W (bosch_eval.models.export): "inclusive", W keys
# including the query (this value's own count: transformers, vLLM, SGLang), or
# "exclusive", W − 1 keys before it.
WINDOW_CONVENTIONS = ("inclusive", "exclusive")

# Where the sinks are, recorded beside every result (the adapter's ``bosch_sink_rule``): results
# from before this rule took a padded row's first S key indices, padding in a left-padded row.
SINK_RULE = "first S real tokens of each row"

# (batch, head, q_idx, kv_idx) -> bool, or a bool tensor when the indices are tensors.
MaskFunction = Callable[[Any, Any, Any, Any], Any]


class LocalWindowError(BoschError):
    """A window or sink count that cannot be used."""


def causal(batch: Any, head: Any, q: Any, kv: Any) -> Any:
    """Keys at or before the query."""
    return kv <= q


def recent(window: int) -> MaskFunction:
    """The ``window`` keys ending at the query (with :func:`causal`): ``q − W < kv``."""

    def inner(batch: Any, head: Any, q: Any, kv: Any) -> Any:
        return kv > q - window

    return inner


def sink(sinks: int) -> MaskFunction:
    """The first ``sinks`` key indices (a batch without padding)."""

    def inner(batch: Any, head: Any, q: Any, kv: Any) -> Any:
        return kv < sinks

    return inner


def row_sink(sink_keys: Any) -> MaskFunction:
    """Each row's sink keys, ``sink_keys [B, K]`` (:func:`sink_keys`)."""

    def inner(batch: Any, head: Any, q: Any, kv: Any) -> Any:
        return sink_keys[batch, kv]

    return inner


def sink_keys(key_padding: Any, sinks: int) -> Any:
    """``[B, K]`` bool, True at each row's first ``sinks`` real keys.

    Args:
        key_padding: ``[B, K]``, true (nonzero) where a key is a real token; None: no padding.

    Returns:
        None when ``key_padding`` is None (the sinks are the first ``sinks`` indices).
    """
    if key_padding is None:
        return None
    real = key_padding.bool()
    return real & (real.cumsum(-1) <= sinks)


def sink_indices(key_padding: Any, sinks: int, kv_len: int) -> tuple[Any, Any]:
    """Where each row's sink keys are: ``(index [B, S'], found [B, S'])`` with
    ``S' = min(sinks, K)``; ``found`` is False where a row has fewer real keys than ``S'``
    (its index is then clamped to a real index of the row, or 0, and must be masked).

    Args:
        key_padding: ``[B, K]`` real keys, or None (no padding: the first ``S'`` indices).
    """
    import torch

    count = min(sinks, kv_len)
    if key_padding is None:
        index = torch.arange(count)[None]
        return index, torch.ones_like(index, dtype=torch.bool)
    real = key_padding.bool()
    ranks = real.cumsum(-1)  # [B, K]: real keys up to and including each key
    wanted = torch.arange(1, count + 1, device=real.device).expand(real.shape[0], count).contiguous()
    index = torch.searchsorted(ranks, wanted)  # the first key whose rank reaches s + 1
    found = index < kv_len
    return index.clamp(max=kv_len - 1), found


@dataclass(frozen=True)
class LocalWindow:
    """W keys seen per SWA query (itself included) plus S attention-sink positions.

    Raises:
        LocalWindowError: W not a positive integer, or S not an integer ≥ 0.
    """

    window: int
    sinks: int = 0

    def __post_init__(self) -> None:
        if not is_int(self.window) or self.window < 1:
            raise LocalWindowError(f"window: expected a positive integer (keys seen per SWA query), got {self.window!r}")
        if not is_int(self.sinks) or self.sinks < 0:
            raise LocalWindowError(f"sink: expected an integer >= 0 (attention-sink positions), got {self.sinks!r}")

    def mask_function(self, sink_keys: Any = None) -> MaskFunction:
        """The band predicate: ``causal ∧ (recent ∨ sink)``; with ``S = 0``, ``causal ∧ recent``.

        Args:
            sink_keys: ``[B, K]`` each row's sink keys (:func:`sink_keys`); None: the first
                ``S`` key indices (no padding).
        """
        from transformers.masking_utils import and_masks, or_masks

        if not self.sinks:
            return and_masks(causal, recent(self.window))
        sinks = sink(self.sinks) if sink_keys is None else row_sink(sink_keys)
        return and_masks(causal, or_masks(recent(self.window), sinks))

    def grid(self, q_positions: Any, kv_positions: Any, sink_keys: Any = None) -> Any:
        """The predicate on index tensors, broadcast: ``q_positions [..., Q, 1]`` against
        ``kv_positions [..., 1, K]`` gives a boolean ``[..., Q, K]``; with ``sink_keys
        [B, K]`` (indexed by ``kv_positions``, which must then lie in ``0 … K − 1``), a
        boolean ``[B, ..., Q, K]``."""
        zero = q_positions.new_zeros(())
        if self.sinks and sink_keys is not None:
            import torch

            rows = torch.arange(sink_keys.shape[0], device=sink_keys.device).view(-1, *([1] * kv_positions.dim()))
            return self.mask_function(sink_keys)(rows, zero, q_positions, kv_positions)
        return self.mask_function()(zero, zero, q_positions, kv_positions)

    def dense(self, q_len: int, kv_len: int, device: Any = None, sink_keys: Any = None) -> Any:
        """Boolean ``[q_len, kv_len]`` tensor of the predicate, query ``i`` at key index
        ``kv_len − q_len + i``; ``[B, q_len, kv_len]`` with ``sink_keys [B, kv_len]``."""
        import torch

        q_positions = torch.arange(kv_len - q_len, kv_len, device=device)[:, None]
        return self.grid(q_positions, torch.arange(kv_len, device=device)[None, :], sink_keys)

    def narrowed(self, model_window: int | None) -> LocalWindow:
        """This window within a layer the model itself already runs with ``model_window``."""
        return self if not model_window or model_window >= self.window else LocalWindow(model_window, self.sinks)

    def retained(self, seen: int) -> tuple[int, int]:
        """What a cache must keep after ``seen`` positions so that every later query (at
        ``t ≥ seen``) sees all its keys: ``(sink_count, recent_start)``, i.e. positions
        ``0 … sink_count − 1`` and ``recent_start … seen − 1``.

        These are the positions the predicate allows for the next query ``t = seen``; the
        two spans never overlap (``recent_start ≥ sink_count``).
        """
        sink_count = min(self.sinks, seen)
        return sink_count, max(sink_count, seen - (self.window - 1))

    def retained_count(self, seen: int) -> int:
        """How many positions :meth:`retained` keeps: ``min(T, S) + min(max(T − S, 0), W − 1)``."""
        sink_count, recent_start = self.retained(seen)
        return sink_count + seen - recent_start
