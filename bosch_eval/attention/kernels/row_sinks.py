"""Each row's attention sinks, as every kernel finds them in the model's mask.

The sinks of a row are its first S real keys (:func:`~bosch_eval.attention.local_window.sink_keys`).
Which keys are real, every kernel reads from the mask it is handed (:func:`key_padding`), so
a row's sinks never depend on its batch or padding. Under left padding they sit at another
index in every row: kernels that attend them apart from the window (the blocked kernel, the
flash log-sum-exp merge) gather them per row (:class:`RowSinks`).
"""

from __future__ import annotations

import torch

from bosch_eval.attention.local_window import LocalWindow, sink_indices, sink_keys


def key_padding(attention_mask: torch.Tensor | None) -> torch.Tensor | None:
    """``[B, K]`` True where a key is a real token, from the model's mask: flash's ``[B, K]``
    mask is that; of a 4D ``[B, 1, T, K]`` mask (causal ∧ padding, as transformers' mask
    functions build it, or a cache's part of one) the last query row, which sees every key
    at or before it, i.e. all of them. None: no padding."""
    if attention_mask is None:
        return None
    if attention_mask.dim() == 2:
        return attention_mask.bool()
    row = attention_mask[:, 0, -1, :]
    return row if row.dtype == torch.bool else row == 0  # an additive mask: 0 where allowed


def row_sinks(attention_mask: torch.Tensor | None, local: LocalWindow) -> torch.Tensor | None:
    """``[B, K]`` each row's sink keys (its first S real keys), or None: no sinks, or no
    padding (the first S key indices)."""
    return sink_keys(key_padding(attention_mask), local.sinks) if local.sinks else None


class RowSinks:
    """Each row's sink keys: ``index [B or 1, S']`` and ``found`` (False where a row has
    fewer real keys), the keys and values gathered there on demand, and the per-key flag
    ``at [B or 1, K]`` (None: the first S' indices)."""

    def __init__(self, attention_mask: torch.Tensor | None, local: LocalWindow, key: torch.Tensor) -> None:
        self.at = row_sinks(attention_mask, local)
        self.index, self.found = sink_indices(self.at, local.sinks, key.shape[2])
        self.index, self.found = self.index.to(key.device), self.found.to(key.device)
        self.count = self.index.shape[1]

    def gather(self, states: torch.Tensor) -> torch.Tensor:
        """``[B, G, K, D]`` -> ``[B, G, S', D]``: each row's sink keys (or values)."""
        return gather_keys(states, self.index)

    def in_span(self, key_pos: torch.Tensor, kv_len: int) -> torch.Tensor:
        """Whether the keys at ``key_pos`` (any shape, any integers) are sinks:
        ``[B or 1, *key_pos.shape]``."""
        if self.at is None:
            return ((key_pos >= 0) & (key_pos < self.count))[None]
        inside = (key_pos >= 0) & (key_pos < kv_len)
        return self.at[:, key_pos.clamp(0, kv_len - 1)] & inside

    def mask_columns(self, attention_mask: torch.Tensor, rows: slice) -> torch.Tensor:
        """The model's ``[B, 1, T, K]`` mask at each row's sink columns: ``[B, 1, T', S']``."""
        mask = attention_mask[:, :, rows]
        index = self.index.expand(mask.shape[0], -1)[:, None, None, :].expand(-1, 1, mask.shape[2], -1)
        return mask.gather(3, index)


def gather_keys(states: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``states [B, G, K, D]`` at ``index [B or 1, S']`` of each row: ``[B, G, S', D]``."""
    index = index.expand(states.shape[0], -1)[:, None, :, None].expand(-1, states.shape[1], -1, states.shape[3])
    return states.gather(2, index)
