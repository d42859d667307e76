"""Where an SWA group's sinks are in the kernels' index space: each row's first ``S`` real keys.

The window's rules (``LocalWindow(window=W, sinks=S)``, its band predicate and the checks of W
and S) live in :mod:`bosch_eval.masks.window`, beside the mask that carries them; this module
re-exports what the kernels use of them, so ``from bosch_eval.attention.local_window import
LocalWindow`` keeps working.

Positions are those of a row's real tokens: the sinks are each row's first ``S`` real keys,
never padding, so a row's output does not depend on its batch. A padded row's key index and
position differ by its padding; the window's difference ``t − j`` does not change under left
(or right) padding, the sinks do, so they come from the key padding of each row
(:func:`sink_keys`): ``[B, K]``, True at the first ``S`` real keys. Without padding (``None``)
they are the first ``S`` key indices.

Index convention: kernels see keys ``0 … K−1`` and queries that are the last ``T`` of them
(query ``i`` at key index ``K − T + i``). What the hybrid cache's SWA groups hand the kernels
in this convention (a decode step: the sink slots and the ring as they are, no band; a chunk:
the sink slots, the ring's run before it in order, then the chunk) is stated in
:mod:`bosch_eval.caches.swa_ring`.
"""

from __future__ import annotations

from typing import Any

# Re-exported: the kernels, the spec and the caches import the window's rules from here.
from bosch_eval.masks.window import LocalWindow, causal, recent

__all__ = ["SINK_RULE", "LocalWindow", "causal", "recent", "sink_indices", "sink_keys"]

# Where the sinks are, recorded beside every result (the adapter's ``bosch_sink_rule``): results
# from before this rule took a padded row's first S key indices, padding in a left-padded row.
SINK_RULE = "first S real tokens of each row"


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
