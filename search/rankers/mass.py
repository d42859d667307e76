"""DCAM and Fisher (paper B.3.1, B.3.6): the share of a per-lag histogram inside the window.

Both bin a non-negative weight ``w(t, j)`` of every causal (row, key) pair by lag
``d = t − j`` over all rows of all calibration examples, normalise the histogram and
sum it over ``d < W``::

    s = Σ_{d<W} H(d) / Σ_d H(d)

The histogram itself is not needed for ``s``: the streaming accumulators keep only its
in-window and total sums per head.

* DCAM (Eq. 7–8): ``w = α(t, j)``.
* Fisher (Eq. 23–25): ``w = (∂L/∂α(t, j) · α(t, j))²``, with ``L`` the mean next-token
  cross-entropy of the sequence (every position, the standard causal-LM loss).

Both: larger ``s`` = more local (``more_local="higher"``). A head whose total weight is
zero (Fisher: no gradient reaches it) scores 1 — it loses nothing under SWA.
"""

from __future__ import annotations

from abc import abstractmethod

import torch

from bosch_eval.search.rankers import RANKERS
from bosch_eval.search.rankers.base import Ranker
from bosch_eval.search.rankers.blocks import AttentionBlock


class _WindowMass(Ranker):
    more_local = "higher"

    def __init__(self, num_layers: int, num_heads: int, window: int) -> None:
        super().__init__(num_layers, num_heads, window)
        self.inside = torch.zeros(num_layers, num_heads, dtype=torch.float64)
        self.total = torch.zeros(num_layers, num_heads, dtype=torch.float64)

    @abstractmethod
    def weights(self, block: AttentionBlock) -> torch.Tensor:
        """The per-(row, key) weight binned by lag, ``[H, Bq, S]``."""

    def update(self, layer: int, block: AttentionBlock) -> None:
        weight = self.weights(block)  # [H, Bq, S], zero on masked entries
        lags = block.lags()
        in_window = (lags >= 0) & (lags < self.window)
        self.inside[layer] += torch.where(in_window, weight, 0.0).sum(dim=(1, 2)).double().cpu()
        self.total[layer] += weight.sum(dim=(1, 2)).double().cpu()

    def head_scores(self) -> torch.Tensor:
        safe = torch.where(self.total > 0, self.total, 1.0)
        return torch.where(self.total > 0, self.inside / safe, 1.0)


@RANKERS.register("dcam")
class DCAM(_WindowMass):
    """Distance-conditioned attention mass: attention probability inside the window."""

    def weights(self, block: AttentionBlock) -> torch.Tensor:
        return block.probs


@RANKERS.register("fisher")
class Fisher(_WindowMass):
    """Fisher-weighted locality: squared ``∂L/∂α · α`` saliency inside the window."""

    needs_grad = True

    def weights(self, block: AttentionBlock) -> torch.Tensor:
        if block.dprobs is None:
            raise ValueError("fisher: the attention block carries no dL/dP (run with gradients)")
        return (block.dprobs * block.probs) ** 2
