"""Does Stage 1 see the calibration set saturate? The cheap part of ``calib-check``.

Stage 1 converts each layer's share ρ of KV groups to SWA, one layer at a time with the
rest of the model full, and keeps the best score ``s_best`` per layer. Stage 2 then spreads
the SWA budget by the drops ``S(full) − s_best``. When most layers lose nothing, Stage 2
has no drops to order them by and Stage 3's sub-problems end on plateaus of equal scores:
the calibration set cannot tell the search which heads a held-out task needs (issue 29;
on toy-l at ρ ≤ 0.75 six of eight layers lost nothing on ``bosch_niah_calib``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

SATURATED_LAYER_SHARE = 0.5


@dataclass(frozen=True)
class Stage1Saturation:
    """Layers whose Stage-1 best reaches S(full), out of ``num_layers``."""

    no_drop_layers: tuple[int, ...]
    num_layers: int

    @property
    def saturated(self) -> bool:
        return len(self.no_drop_layers) >= SATURATED_LAYER_SHARE * self.num_layers

    def message(self) -> str:
        layers = ", ".join(map(str, self.no_drop_layers)) or "none"
        head = f"{len(self.no_drop_layers)} of {self.num_layers} layers lose nothing in Stage 1 (layers {layers})"
        if not self.saturated:
            return head
        return (
            f"{head}: the calibration set is saturated at this ratio, so Stage 2 cannot order those layers "
            "and Stage 3 will choose among equal scores; check it with `bosch-eval calib-check` before trusting the mask"
        )


def stage1_saturation(stage1_scores: Sequence[float], all_full: float, higher_is_better: bool = True) -> Stage1Saturation:
    """Which layers' Stage-1 best is at least as good as S(full) (in the metric's direction)."""
    no_drop = tuple(
        layer for layer, score in enumerate(stage1_scores) if (score >= all_full if higher_is_better else score <= all_full)
    )
    return Stage1Saturation(no_drop, len(stage1_scores))
