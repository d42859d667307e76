"""The search's normalized score and loss (paper §2.2 Eq. 2–3, Appendix A Eq. 5).

``Ŝ(z) = (S(z) − a) / (b − a)`` with the anchors ``a = S(all SWA)`` and
``b = (1 + γ)·S(all full)``; the loss of a sub-problem over the index set I is
``L(z) = −Ŝ(z) + α·(ρ̄_I(z) − ρ̄)²`` where ``ρ̄_I(z)`` is the share of SWA groups in I.

The paper's S is "higher the better" and positive. For a metric whose lm-eval
``higher_is_better`` is false (perplexity, a loss), the same Ŝ stays the quantity to
maximize if b is put on the *better* side of the original model:

    a = S(all SWA),   b = S(all full) − γ·|S(all full)|   (= (1 − γ)·S(all full) for S > 0)

Then b − a < 0, so Ŝ = (S − a)/(b − a) still is 0 at the all-SWA model, rises as S
falls, reaches (S_full − a)/(b − a) < 1 at the original model and 1 at a model γ·|S_full|
better than it: the headroom γ reserves (§2.2: "reserve headroom for performance
improvements beyond the original model"), mirrored. The loss −Ŝ + α(…)² is unchanged.
Written for both directions, b = S_full + γ·|S_full| when higher is better, which is the
paper's (1 + γ)·S_full for every S_full ≥ 0.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from bosch_eval.runtime.errors import SearchError

DEFAULT_ALPHA = 100.0
DEFAULT_GAMMA = 0.2


@dataclass(frozen=True)
class ScoreScale:
    """What a search knows of S besides its values.

    Attributes:
        higher_is_better: the direction of S (lm-eval's ``higher_is_better`` of the calibration
            metric); ``False`` searches for the lowest S (perplexity).
        best_possible: the best S the metric can take, when it bounds S (``acc``: 1.0;
            ``CalibrationObjective.best_possible``): each sub-problem stops at its first mask
            that scores it, the mask its whole budget would return. ``None``: unknown.
    """

    higher_is_better: bool = True
    best_possible: float | None = None


@dataclass(frozen=True)
class Anchors:
    """The two scores that normalize S: the all-SWA model (a) and the original model.

    ``higher_is_better`` is the calibration metric's direction (lm-eval's
    ``higher_is_better``); b lies γ·|S(all full)| beyond the original model on the better side.
    """

    all_swa: float
    all_full: float
    gamma: float = DEFAULT_GAMMA
    higher_is_better: bool = True

    def __post_init__(self) -> None:
        if self.gamma <= 0:
            raise SearchError(f"gamma: expected a value > 0 (headroom beyond the original model), got {self.gamma}")
        if (self.b - self.a) * self.sign <= 0:
            # Without b on the better side of a the normalization is undefined: the calibration
            # cannot tell the original model from the all-SWA one, so no mask can be preferred.
            relation = "above" if self.higher_is_better else "below"
            raise SearchError(
                f"calibration cannot rank masks: the all-full model scores {self.all_full:.4g} and the all-SWA "
                f"model {self.all_swa:.4g}, so b = {self.b:.4g} (S(full) moved by γ·|S(full)| towards better) is not "
                f"{relation} a = {self.a:.4g} ({'higher' if self.higher_is_better else 'lower'} is better for this metric); "
                "use a calibration task the full model solves (longer --calib-len, other --calib-tasks) or a smaller --window"
            )

    @property
    def sign(self) -> float:
        """+1 when a higher S is better, −1 when a lower one is."""
        return 1.0 if self.higher_is_better else -1.0

    @property
    def a(self) -> float:
        return self.all_swa

    @property
    def b(self) -> float:
        return self.all_full + self.sign * self.gamma * abs(self.all_full)

    def normalize(self, score: float) -> float:
        """Ŝ (Eq. 2): 0 at the all-SWA model, 1 at b; higher Ŝ is better in both directions."""
        return (score - self.a) / (self.b - self.a)


def swa_share(selection: Sequence[int]) -> float:
    """ρ̄_I(z) over a sub-problem's variables, given as 1 = SWA (the optimizers' convention)."""
    return sum(selection) / len(selection)


def subproblem_loss(
    normalized_score: float, swa_fraction: float | Sequence[float], target_ratio: float, alpha: float = DEFAULT_ALPHA
) -> float:
    """Eq. 5: ``−Ŝ + α·(ρ̄_I − ρ̄)²``.

    ``swa_fraction`` may list one share per block of I (per layer, when every layer has its
    own quota); the penalty is then the mean of the blocks' squared deviations, which is
    Eq. 5's for a single block.
    """
    shares = [swa_fraction] if isinstance(swa_fraction, (int, float)) else list(swa_fraction)
    return -normalized_score + alpha * math.fsum((share - target_ratio) ** 2 for share in shares) / len(shares)
