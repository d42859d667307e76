"""QAdA, query-adaptive local-mass fraction (paper B.3.4, Eq. 15–19).

For row ``t`` (0-indexed) the window is ``N_W(t) = {j : t − W < j ≤ t}`` and the far
keys are ``F_W(t) = {j : 0 ≤ j ≤ t − W}``. The local softmax mass is exact,
``A_local = Σ_{j∈N_W} exp(τ q·k_j)``; the far mass is modelled by a Gaussian fitted to
the ``buffer`` keys just outside the window, ``B(t) = {t−W−B+1, …, t−W} ∩ [0, ∞)``:

    Â_global = |F_W(t)| · exp(τ q·μ̂ + ½ τ² qᵀ Σ̂ q),   π̂(t) = A_local / (A_local + Â_global)

with ``μ̂`` and ``Σ̂`` the (1/|B|-normalised) mean and covariance of those keys; ``s`` is
the mean of ``π̂`` over every row of every example, including rows ``t < W`` where
``F_W`` is empty and ``π̂ = 1`` (this adds the same constant to every head).

Streaming: with ``x_j = τ q·k_j`` (the block's logits), ``τ q·μ̂`` is the mean of ``x``
over the buffer and ``τ² qᵀΣ̂q`` its variance, so no ``D×D`` covariance is formed.
Everything is evaluated in log space (``π̂ = sigmoid(log A_local − log Â_global)``), so
large logits cannot overflow. ``τ`` is the model's own softmax scale.

Larger ``s`` = more local (``more_local="higher"``). Setting: ``buffer`` (B, default
128 keys). The Gaussian model is only as good as the buffer logits are Gaussian: where
they fall steadily with lag (a strongly local head), their variance grows as B² and
``Â_global`` is overestimated; a far spike outside the buffer is not seen at all.
"""

from __future__ import annotations

from typing import Any

import torch

from bosch_eval.runtime.errors import SettingsError
from bosch_eval.runtime.registry import Flag
from bosch_eval.search.rankers import RANKERS
from bosch_eval.search.rankers.base import Ranker
from bosch_eval.search.rankers.blocks import AttentionBlock


@RANKERS.register("qada")
class QAdA(Ranker):
    """Gaussian estimate of the share of softmax mass inside the window."""

    more_local = "higher"
    flags = (Flag("--qada-buffer", "buffer", int, "qada: buffer keys B outside the window (default 128)"),)

    def __init__(self, num_layers: int, num_heads: int, window: int, buffer: int = 128) -> None:
        super().__init__(num_layers, num_heads, window)
        if buffer < 1:
            raise SettingsError(f"qada: buffer must be a positive number of keys, got {buffer}")
        self.buffer = buffer
        self.local_share = torch.zeros(num_layers, num_heads, dtype=torch.float64)
        self.rows = torch.zeros(num_layers, dtype=torch.float64)

    def update(self, layer: int, block: AttentionBlock) -> None:
        logits = block.logits  # [H, Bq, S], x_j = τ q·k_j, −inf for j > t
        lags = block.lags()
        in_window = (lags >= 0) & (lags < self.window)
        in_buffer = (lags >= self.window) & (lags < self.window + self.buffer)
        log_local = torch.logsumexp(logits.masked_fill(~in_window, float("-inf")), dim=-1)  # [H, Bq]
        count = in_buffer.sum(-1).clamp(min=1).to(logits.dtype)  # |B(t)|, [Bq]
        mean = torch.where(in_buffer, logits, 0.0).sum(-1) / count
        variance = torch.where(in_buffer, (logits - mean[..., None]) ** 2, 0.0).sum(-1) / count
        t = torch.arange(block.start, block.stop, device=logits.device)
        far = (t - self.window + 1).clamp(min=0)  # |F_W(t)|
        log_global = torch.log(far.to(logits.dtype)) + mean + 0.5 * variance  # −inf where F_W is empty
        share = torch.sigmoid(log_local - log_global)
        self.local_share[layer] += share.sum(-1).double().cpu()
        self.rows[layer] += block.probs.shape[1]

    def head_scores(self) -> torch.Tensor:
        return self.local_share / self.rows[:, None]

    def settings(self) -> dict[str, Any]:
        return {"buffer": self.buffer, "tau": "model softmax scale"}
