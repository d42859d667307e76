"""The search's normalized score and loss (paper §2.2 Eq. 2–3, Appendix A Eq. 5).

``Ŝ(z) = (S(z) − a) / (b − a)`` with the anchors ``a = S(all SWA)`` and
``b = (1 + γ)·S(all full)``; the loss of a sub-problem over the index set I is
``L(z) = −Ŝ(z) + α·(ρ̄_I(z) − ρ̄)²`` where ``ρ̄_I(z)`` is the share of SWA groups in I.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

DEFAULT_ALPHA = 100.0
DEFAULT_GAMMA = 0.2


class SearchError(RuntimeError):
    """A search that cannot produce a meaningful result (bad anchors, bad settings)."""


@dataclass(frozen=True)
class Anchors:
    """The two scores that normalize S: the all-SWA model (a) and the original model."""

    all_swa: float
    all_full: float
    gamma: float = DEFAULT_GAMMA

    def __post_init__(self) -> None:
        if self.gamma <= 0:
            raise SearchError(f"gamma: expected a value > 0 (headroom above the original model), got {self.gamma}")
        if self.b <= self.a:
            # Without b > a the normalization is undefined: the calibration cannot tell the
            # original model from the all-SWA one, so no mask can be preferred over another.
            raise SearchError(
                f"calibration cannot rank masks: the all-full model scores {self.all_full:.4g} and the all-SWA "
                f"model {self.all_swa:.4g}, so b = (1+γ)·{self.all_full:.4g} = {self.b:.4g} is not above "
                f"a = {self.a:.4g}; use a calibration task the full model solves (longer --calib-len, "
                "other --calib-tasks) or a smaller --window"
            )

    @property
    def a(self) -> float:
        return self.all_swa

    @property
    def b(self) -> float:
        return (1.0 + self.gamma) * self.all_full

    def normalize(self, score: float) -> float:
        """Ŝ (Eq. 2): 0 at the all-SWA model, 1/(1+γ) at the original one."""
        return (score - self.a) / (self.b - self.a)


def swa_share(selection: Sequence[int]) -> float:
    """ρ̄_I(z) over a sub-problem's variables, given as 1 = SWA (the optimizers' convention)."""
    return sum(selection) / len(selection)


def subproblem_loss(normalized_score: float, swa_fraction: float, target_ratio: float, alpha: float = DEFAULT_ALPHA) -> float:
    """Eq. 5: ``−Ŝ + α·(ρ̄_I − ρ̄)²``."""
    return -normalized_score + alpha * (swa_fraction - target_ratio) ** 2
