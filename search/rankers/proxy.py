"""Proxy, ProxyAttn's budget estimator as a head score (paper B.3.3, Eq. 11–14).

For each row ``t`` the causal keys ``0 … t`` fall into ``n_B = ⌈(t+1)/B⌉`` contiguous
blocks of ``B`` keys, aligned at position 0 (the last one may be short). A pooled proxy
``α̃(t, j) = max_{h∈P} α_h(t, j)`` over the layer's proxy heads ``P`` gives block masses
``S(b, t)``, sorted in descending order (ties: lower block index first, a stable sort).
Each head ``h`` then needs the ``m_h(t)`` top-ranked blocks whose own mass first reaches
``γ`` of its total; ``q_h(t) = m_h(t)/n_B`` and ``s_h`` is the mean of ``q_h(t)`` over
every row of every example.

Direction — decided from the formula, not the prose. B.3.3 says that a larger ``s``
means "mass concentrated in fewer nearby blocks … more local", yet also that heads are
ranked in ascending order. ``q = m/n_B`` is the *fraction of blocks needed*: mass
concentrated in few blocks gives a *small* ``q``, a diffuse head a large one. So the
formula and the ascending order agree and the sentence has the direction reversed:
**smaller ``s`` = more local** (``more_local="lower"``). Note what the score measures:
concentration, not distance — a head that reads one far block (a needle) also scores
low. The tests pin both facts.

Settings: ``block`` (B, default 64), ``gamma`` (γ, default 0.9) and ``proxy_heads``
(``P``, default ``(0,)``: the layer's first query head; the paper's default
``|P| = 1`` does not say which head). Heads are query-head indices within the layer.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F

from bosch_eval.runtime.errors import SettingsError
from bosch_eval.runtime.registry import Flag
from bosch_eval.search.rankers import RANKERS
from bosch_eval.search.rankers.base import Ranker
from bosch_eval.search.rankers.blocks import AttentionBlock


@RANKERS.register("proxy")
class Proxy(Ranker):
    """Fraction of proxy-ranked key blocks a head needs to cover γ of its attention."""

    more_local = "lower"
    flags = (
        Flag("--proxy-block", "block", int, "proxy: keys per block B (default 64)"),
        Flag("--proxy-gamma", "gamma", float, "proxy: mass fraction γ a head must cover (default 0.9)"),
        Flag(
            "--proxy-heads", "proxy_heads", int, "proxy: the layer's proxy query heads P (default: head 0)", nargs="+"
        ),
    )

    def __init__(
        self,
        num_layers: int,
        num_heads: int,
        window: int,
        block: int = 64,
        gamma: float = 0.9,
        proxy_heads: Sequence[int] = (0,),
    ) -> None:
        super().__init__(num_layers, num_heads, window)
        if block < 1:
            raise SettingsError(f"proxy: block must be a positive number of keys, got {block}")
        if not 0.0 < gamma <= 1.0:
            raise SettingsError(f"proxy: gamma must be in (0, 1], got {gamma}")
        if not proxy_heads or any(not 0 <= h < num_heads for h in proxy_heads):
            raise SettingsError(f"proxy: proxy_heads must be query-head indices in [0, {num_heads}), got {proxy_heads}")
        self.block, self.gamma, self.proxy_heads = block, gamma, tuple(proxy_heads)
        self.budget = torch.zeros(num_layers, num_heads, dtype=torch.float64)
        self.rows = torch.zeros(num_layers, dtype=torch.float64)

    def update(self, layer: int, block: AttentionBlock) -> None:
        probs = block.probs  # [H, Bq, S]
        heads, rows, keys = probs.shape
        pad = -keys % self.block
        # Own and pooled masses per key block; blocks past row t hold zero mass.
        own = F.pad(probs, (0, pad)).reshape(heads, rows, -1, self.block).sum(-1)  # [H, Bq, nb]
        pooled = probs[list(self.proxy_heads)].amax(0)  # [Bq, S]
        pooled = F.pad(pooled, (0, pad)).reshape(rows, -1, self.block).sum(-1)  # [Bq, nb]
        # Stable descending sort: equal pooled masses keep block order, so every block of
        # 0 … t precedes the empty blocks past t and m never counts those.
        order = torch.sort(pooled, dim=-1, descending=True, stable=True).indices
        cumulative = torch.gather(own, 2, order.expand(heads, -1, -1)).cumsum(-1)
        threshold = self.gamma * cumulative[..., -1:]
        needed = (cumulative < threshold).sum(-1) + 1  # m_h(t): [H, Bq]
        t = torch.arange(block.start, block.stop, device=probs.device)
        n_blocks = torch.div(t, self.block, rounding_mode="floor") + 1  # ⌈(t+1)/B⌉
        self.budget[layer] += (needed.double() / n_blocks.double()).sum(-1).cpu()
        self.rows[layer] += rows

    def head_scores(self) -> torch.Tensor:
        return self.budget / self.rows[:, None]

    def settings(self) -> dict[str, Any]:
        return {"block": self.block, "gamma": self.gamma, "proxy_heads": list(self.proxy_heads)}
