"""APL, answer-centric peak lag (paper B.3.2, Eq. 9–10).

For each calibration example, ``t*`` is the last answer token (the last position of the
sequence, since the answer ends it). A head's peak lag is ``λ = t* − argmax_j α(t*, j)``;
over the examples ``λ̄`` is their median (for an even count the mean of the two middle
values, as ``numpy.median``; not ``torch.median``'s lower middle), and

    s = 1 − min(1, λ̄ / W)

Larger ``s`` = more local (``more_local="higher"``). Ties in the argmax go to the
earliest key (the largest lag), as in ``numpy.argmax``. A head whose peak is an
attention sink at position 0 has ``λ = t*`` and reads as global when ``t* ≥ W``: that is
the definition, not a special case.

Only row ``t*`` is read, so each layer costs one ``[H, 1, T]`` block.
"""

from __future__ import annotations

import torch

from bosch_eval.search.rankers import RANKERS
from bosch_eval.search.rankers.base import Ranker
from bosch_eval.search.rankers.blocks import AttentionBlock


@RANKERS.register("apl")
class APL(Ranker):
    """Answer-centric peak lag."""

    more_local = "higher"

    def __init__(self, num_layers: int, num_heads: int, window: int) -> None:
        super().__init__(num_layers, num_heads, window)
        self.peak_lags: list[list[torch.Tensor]] = [[] for _ in range(num_layers)]

    def first_row(self, length: int) -> int:
        return length - 1

    def update(self, layer: int, block: AttentionBlock) -> None:
        last = block.probs[:, -1]  # [H, T]: row t* = T − 1
        peak = torch.argmax(last, dim=-1)  # first maximal index
        self.peak_lags[layer].append((block.stop - 1 - peak).double().cpu())

    def head_scores(self) -> torch.Tensor:
        if not self.peak_lags[0]:
            raise ValueError("apl: no calibration example was seen")
        lags = torch.stack([torch.stack(per_layer) for per_layer in self.peak_lags])  # [L, N, H]
        ordered = lags.sort(dim=1).values
        count = ordered.shape[1]
        median = (ordered[:, (count - 1) // 2] + ordered[:, count // 2]) / 2
        return 1.0 - torch.clamp(median / self.window, max=1.0)
