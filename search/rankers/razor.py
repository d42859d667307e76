"""Razor, RazorAttention's echo/induction probe (paper B.3.5, Eq. 20–22).

The probe is a block of ``K`` random tokens repeated four times (``T = 4K``, ``K`` a
quarter of the calibration length, as B.3.5 sets it); one probe per calibration
example, drawn from the tokenizer's non-special ids with a generator seeded by the
calibration seed. For rows ``m ∈ {K, …, 4K − 1}``:

* echo: attention to the previous occurrence of the same token, ``j = m − K``;
* induction: attention to the token that *followed* that occurrence, ``j = m − K + 1``.

Index decision: Eq. 20 prints ``j_ind = m − 1 − K`` ("valid for m ≥ K+1"), which is the
token *before* the previous occurrence; the wording of B.3.5 and RazorAttention itself
define induction as attending to the token that follows it. We follow the definition
(``m − K + 1``, always ≤ m, so valid for every ``m ≥ K``); a head that copies the
preceding token is not what the probe is meant to find.

``E_h`` and ``I_h`` are the means over all probe rows; each becomes a z-score across all
``L·H`` query heads of the model (population std; a constant column gives z = 0) and
``s = max(z(E), z(I))``.

Direction: a high echo or induction score marks a retrieval head, which needs the far
context (the previous occurrence is ``K`` tokens back), so **smaller ``s`` = more local**
(``more_local="lower"``), as B.3.5 states. Here the wording ("smaller values indicate
more local heads") and the formula agree; only the name "locality score" reads the other
way.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from transformers import PreTrainedTokenizerBase

from bosch_eval.runtime.errors import SettingsError
from bosch_eval.search.rankers import RANKERS
from bosch_eval.search.rankers.base import Ranker
from bosch_eval.search.rankers.blocks import AttentionBlock


def repeated_probes(
    tokenizer: PreTrainedTokenizerBase, vocab_size: int, num: int, period: int, seed: int
) -> list[torch.Tensor]:
    """``num`` probes of ``period`` random non-special token ids repeated 4 times, ``[4·period]`` each."""
    special = set(tokenizer.all_special_ids)
    candidates = torch.tensor([i for i in range(min(len(tokenizer), vocab_size)) if i not in special])
    generator = torch.Generator().manual_seed(seed)
    return [candidates[torch.randint(len(candidates), (period,), generator=generator)].repeat(4) for _ in range(num)]


@RANKERS.register("razor")
class Razor(Ranker):
    """Max of the z-scored echo and induction attention on a repeated random block."""

    more_local = "lower"
    inputs = "random block of K = calib_len // 4 tokens repeated 4 times"

    def __init__(self, num_layers: int, num_heads: int, window: int) -> None:
        super().__init__(num_layers, num_heads, window)
        self.period = 0
        self.echo = torch.zeros(num_layers, num_heads, dtype=torch.float64)
        self.induction = torch.zeros(num_layers, num_heads, dtype=torch.float64)
        self.rows = torch.zeros(num_layers, dtype=torch.float64)

    def sequences(
        self,
        tokenizer: PreTrainedTokenizerBase,
        vocab_size: int,
        num: int,
        length: int,
        seed: int,
        task: str,
        include_paths: Sequence[str] = (),
    ) -> list[torch.Tensor]:
        """Repeated random probes: Razor reads no calibration set, so ``task`` and ``include_paths`` are not used."""
        if length < 8:
            raise SettingsError(f"razor: the probe needs a calibration length of at least 8 tokens, got {length}")
        self.period = length // 4
        return repeated_probes(tokenizer, vocab_size, num, self.period, seed)

    def first_row(self, length: int) -> int:
        if not self.period or length != 4 * self.period:
            raise ValueError(f"razor: expected a probe of 4·K tokens with K={self.period}, got {length}")
        return self.period

    def update(self, layer: int, block: AttentionBlock) -> None:
        probs = block.probs  # [H, Bq, S], rows m = start … stop − 1, all ≥ K
        heads, rows, _ = probs.shape
        echo_col = torch.arange(block.start, block.stop, device=probs.device) - self.period
        echo = torch.gather(probs, 2, echo_col.expand(heads, rows)[..., None])[..., 0]
        induction = torch.gather(probs, 2, (echo_col + 1).expand(heads, rows)[..., None])[..., 0]
        self.echo[layer] += echo.sum(-1).double().cpu()
        self.induction[layer] += induction.sum(-1).double().cpu()
        self.rows[layer] += rows

    def head_scores(self) -> torch.Tensor:
        echo = self.echo / self.rows[:, None]
        induction = self.induction / self.rows[:, None]
        return torch.maximum(_zscore(echo), _zscore(induction))

    def settings(self) -> dict[str, Any]:
        return {"period": self.period, "probe": "random block repeated 4 times", "induction_offset": "m - K + 1"}


def _zscore(values: torch.Tensor) -> torch.Tensor:
    """z-scores across every entry (all heads of all layers); zeros when all are equal."""
    std = values.std(correction=0)
    if std == 0:
        return torch.zeros_like(values)
    return (values - values.mean()) / std
