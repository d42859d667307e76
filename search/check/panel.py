"""Is a calibration set fit for the search? A panel of masks scored on it and on a dev split.

The search optimizes whatever S() measures and finds shortcuts no static ranking exploits
(issue 29: on toy-l, BOSCH's masks scored highest on ``bosch_niah_calib`` and among the
lowest held out). Before a user spends GPU hours, this check scores one panel of masks on
the calibration task and on a development task (never the test set) and says, per SWA
ratio, whether the calibration ranks masks the way the development split does.

The panel (:func:`build_panel`): two anchors (all full, all SWA), one probe per layer (that
layer's groups SWA, the rest full: the Stage-1 drop), and per ratio every given ranking,
the layer heuristics (INTR, BME, RAND) and ``random`` uniformly drawn masks.

Per ratio (:func:`summarize`): the spread of the random masks on the calibration set, the
share of the ratio's masks at or above S(full) (saturation), the masks *floor-tied*: at or
below S(all SWA) on both sides, Spearman's rank correlation between calibration and
development scores over the ratio's other masks (off the floor on at least one side), with a
percentile-bootstrap CI over them, and the top regret: how much dev score the calibration's
favourite mask gives up against the ratio's best. Floor-tied masks are left out of the
correlation because they agree by having nothing to order: on SmolLM2 at ρ = 0.75, 23 of 30
masks sat at the floor on both sides and gave Spearman 0.95, against 0.65 (p = 0.11) over the
other 7 (issue 53). The verdict, first rule that holds:

* ``not solvable``: S(full) on the calibration set is below ``solvable`` (0.8): the model
  cannot do the task with every head, so the scores cannot say which heads it needs;
* ``dev cannot judge``: on the development task full attention scores no higher than every
  group SWA, so it does not tell masks apart either: the model fails it with every head, or
  its scoring misses the model's answers (SmolLM2 on ``bosch_niah_dev``'s UUID format, scored
  prefill-only: 0 for both, since the model answers ": <uuid>" and the criterion wants the
  value as the very next tokens);
* ``saturated``: at least ``saturated_share`` (1/4) of the ratio's masks score at or above
  S(full): the search cannot tell them apart and returns whichever it meets first;
* ``saturated at the floor``: most of the ratio's masks (more than half) are floor-tied: neither
  task tells them apart, so the correlation rests on the few others;
* ``not predictive``: Spearman < ``predictive`` (0.8), or scores that do not vary;
* ``not predictive at the top``: the masks the calibration set likes best lose more than
  ``top_regret`` (a tenth of S(full) on the dev task) against the best dev score at this
  ratio. A search returns the calibration's favourite, so this is the failure that a
  correlation over mostly weak masks hides: on toy-l, ``bosch_niah_calib`` ranks the static
  and random masks like the dev split does (Spearman 0.81–1.00) while the searched masks,
  placed with ``--mask``, top the calibration set and sit near the bottom on dev;
* ``predictive``: otherwise.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from bosch_eval.masks.head_mask import HeadMask, HeadRanking, ModelShape, ceil_count
from bosch_eval.masks.layer_heuristics import LAYER_HEURISTICS, layer_heuristic_mask

SOLVABLE = 0.8
SATURATED_SHARE = 0.25
PREDICTIVE = 0.8
TOP_REGRET = 0.1  # of S(full) on the dev task
BOOTSTRAP = 2000


@dataclass(frozen=True)
class PanelMask:
    """One mask of the panel; ``ratio`` is None for the anchors and layer probes."""

    name: str
    kind: str  # anchor | probe | ranking | layers | random | given
    ratio: float | None
    mask: HeadMask


def build_panel(
    shape: ModelShape,
    window: int,
    ratios: Sequence[float],
    rankings: Mapping[str, HeadRanking],
    random_count: int,
    given: Mapping[str, HeadMask] | None = None,
    probes: bool = True,
) -> list[PanelMask]:
    """Anchors, per-layer probes (unless ``probes`` is False), then per ratio: rankings, layer
    heuristics, random masks.

    ``given`` masks (e.g. earlier search results) join the ratio nearest their SWA ratio.
    Random mask ``i`` at ratio ρ is the same on every run (seeded by ρ and ``i``).
    """
    full, swa = HeadMask.uniform(shape, full=True, window=window), HeadMask.uniform(shape, full=False, window=window)
    panel = [PanelMask("full", "anchor", None, full), PanelMask("all-swa", "anchor", None, swa)]
    for layer in range(shape.num_layers if probes else 0):
        groups = {(layer, group) for group in range(shape.num_kv_heads)}
        panel.append(
            PanelMask(f"probe-L{layer}", "probe", None, HeadMask.from_swa_groups(shape, groups, window=window))
        )
    cells = [(layer, group) for layer in range(shape.num_layers) for group in range(shape.num_kv_heads)]
    for ratio in ratios:
        for name, ranking in rankings.items():
            panel.append(PanelMask(f"{name}-r{ratio}", "ranking", ratio, ranking.to_mask(ratio, window=window)))
        for name in LAYER_HEURISTICS.names():
            mask = layer_heuristic_mask(name, shape, ratio, seed=0).with_meta(window=window)
            panel.append(PanelMask(f"{name}-r{ratio}", "layers", ratio, mask))
        count = ceil_count(ratio, len(cells))
        for index in range(random_count):
            swa_cells = set(random.Random(f"calib-check/{ratio}/{index}").sample(cells, count))
            panel.append(
                PanelMask(
                    f"random{index}-r{ratio}",
                    "random",
                    ratio,
                    HeadMask.from_swa_groups(shape, swa_cells, window=window),
                )
            )
    for name, mask in (given or {}).items():
        nearest = min(ratios, key=lambda ratio: abs(ratio - mask.swa_ratio))
        panel.append(PanelMask(name, "given", nearest, mask.with_meta(window=window)))
    return panel


def spearman(x: Sequence[float], y: Sequence[float]) -> float:
    """Spearman's rank correlation (average ranks for ties); NaN when either side is constant."""
    rx, ry = _ranks(x), _ranks(y)
    if np.std(rx) == 0 or np.std(ry) == 0:
        return math.nan
    return float(np.corrcoef(rx, ry)[0, 1])


def bootstrap_ci(x: Sequence[float], y: Sequence[float], iters: int = BOOTSTRAP, seed: int = 0) -> tuple[float, float]:
    """95% percentile-bootstrap CI of :func:`spearman` over resampled masks (NaN draws dropped)."""
    rng = np.random.default_rng(seed)
    xs, ys = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    draws = [spearman(xs[idx], ys[idx]) for idx in rng.integers(0, len(xs), size=(iters, len(xs)))]
    finite = [value for value in draws if not math.isnan(value)]
    if not finite:
        return math.nan, math.nan
    return float(np.percentile(finite, 2.5)), float(np.percentile(finite, 97.5))


@dataclass(frozen=True)
class RatioSummary:
    """What the check says about one SWA ratio."""

    ratio: float
    masks: int
    random_spread: float
    saturated_share: float
    spearman: float  # over the masks off the floor on at least one side
    ci: tuple[float, float]
    top_regret: float  # best dev score minus the dev score of the calibration's favourite(s)
    verdict: str
    floor_tied: int = 0  # masks at or below S(all SWA) on both sides, left out of the correlation


def summarize(
    panel: Sequence[PanelMask],
    calib: Mapping[str, float],
    dev: Mapping[str, float],
    *,
    solvable: float = SOLVABLE,
    saturated_share: float = SATURATED_SHARE,
    predictive: float = PREDICTIVE,
    top_regret: float = TOP_REGRET,
) -> list[RatioSummary]:
    """One :class:`RatioSummary` per ratio of the panel, in the panel's order."""
    full = calib["full"]
    ratios = list(dict.fromkeys(item.ratio for item in panel if item.ratio is not None))
    out = []
    for ratio in ratios:
        names = [item.name for item in panel if item.ratio == ratio]
        randoms = [calib[item.name] for item in panel if item.ratio == ratio and item.kind == "random"]
        x, y = [calib[name] for name in names], [dev[name] for name in names]
        share = sum(score >= full for score in x) / len(x)
        off_floor = [i for i in range(len(x)) if x[i] > calib["all-swa"] or y[i] > dev["all-swa"]]
        floor_tied = len(x) - len(off_floor)
        x_off, y_off = [x[i] for i in off_floor], [y[i] for i in off_floor]
        rho = spearman(x_off, y_off) if len(off_floor) > 1 else math.nan
        favourites = [dev_score for calib_score, dev_score in zip(x, y, strict=True) if calib_score == max(x)]
        regret = max(y) - sum(favourites) / len(favourites)  # equal favourites: the search may return any
        if full < solvable:
            verdict = "not solvable"
        elif dev["full"] <= dev["all-swa"]:
            verdict = "dev cannot judge"
        elif share >= saturated_share:
            verdict = "saturated"
        elif floor_tied > len(x) / 2:
            verdict = "saturated at the floor"
        elif math.isnan(rho) or rho < predictive:
            verdict = "not predictive"
        elif regret > top_regret * dev["full"]:
            verdict = "not predictive at the top"
        else:
            verdict = "predictive"
        spread = max(randoms) - min(randoms) if randoms else math.nan
        ci = bootstrap_ci(x_off, y_off) if len(off_floor) > 1 else (math.nan, math.nan)
        out.append(RatioSummary(ratio, len(names), spread, share, rho, ci, regret, verdict, floor_tied))
    return out


def layer_drops(panel: Sequence[PanelMask], scores: Mapping[str, float]) -> dict[int, float]:
    """S(full) − S(layer ℓ all SWA) per layer: Stage 1's view of where the task lives."""
    probes = [item.name for item in panel if item.kind == "probe"]
    return {int(name.removeprefix("probe-L")): scores["full"] - scores[name] for name in probes}


def _ranks(values: Sequence[float]) -> np.ndarray:
    array = np.asarray(values, dtype=float)
    order = np.argsort(array, kind="stable")
    ranks = np.empty(len(array))
    ranks[order] = np.arange(len(array), dtype=float)
    for value in np.unique(array):  # ties share their average rank
        tied = array == value
        ranks[tied] = ranks[tied].mean()
    return ranks
