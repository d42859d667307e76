"""How many aten ops a decode step runs: what a launch-bound step costs, counted on any device.

A decode step on a GPU is bound by kernel launches, not arithmetic, so the number of ops that
compute (every aten op but views, which launch nothing) is the cost that a cache layout or an
attention path adds, and it can be counted on a CPU. :func:`decode_step_ops` prefills a batch,
decodes until the step asked for, and counts that step's ops under a ``TorchDispatchMode``.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from bosch_eval.models.transformers_compat import cache_argument


class NonViewOps(TorchDispatchMode):
    """Counts the aten ops run inside the block, views left out, by name."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: Counter[str] = Counter()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if not func.is_view:
            self.counts[str(func.overloadpacket)] += 1
        return func(*args, **(kwargs or {}))

    @property
    def total(self) -> int:
        return sum(self.counts.values())


@torch.no_grad()
def decode_step_ops(model: Any, cache: Any, ids: torch.Tensor, attention: torch.Tensor, step: int = 3) -> NonViewOps:
    """The ops of decode step ``step`` (1: the first) after prefilling ``ids [B, T]``
    (``attention``: its padding mask, 1 = real), positions counted per row as ``generate`` does."""
    positions = (attention.cumsum(-1) - 1).clamp(min=0)
    past = {cache_argument(model): cache}
    logits = model(input_ids=ids, attention_mask=attention, position_ids=positions, use_cache=True, **past).logits
    for _ in range(step):
        attention = torch.cat([attention, attention.new_ones(attention.shape[0], 1)], dim=1)
        positions = positions[:, -1:] + 1
        with NonViewOps() as ops:
            logits = model(
                input_ids=logits[:, -1:].argmax(-1),
                attention_mask=attention,
                position_ids=positions,
                use_cache=True,
                **past,
            ).logits
    return ops
