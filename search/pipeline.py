"""The BOSCH pipeline on any score function: anchors, then the stages of the chosen variant.

``run_search(score_fn, shape, settings)`` is model-agnostic — ``score_fn`` maps a
:class:`HeadMask` to S(z) (the lm-eval objective in real runs, a synthetic function in
tests). Variants (paper §3.4):

* ``bosch``: Stage 1 → Stage 2 → Stage 3 (Algorithms 1–3);
* ``single``: the Stage-1 mask as is (B-single);
* ``multi``: Stage 1 over groups of up to ``max_variables // G`` layers (B-multi);
* ``layer``: a single search over whole layers, budget κ·L (B-layer).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from bosch_eval.masks import HeadMask, ModelShape, ceil_count, check_ratio
from bosch_eval.search.journal import Journal
from bosch_eval.search.optimizers import METHODS, NOMAD_MAX_VARIABLES
from bosch_eval.search.scoring import DEFAULT_ALPHA, DEFAULT_GAMMA, Anchors, SearchError
from bosch_eval.search.stage2 import DEFAULT_BUCKETS, Stage2Result, assign_layer_ratios
from bosch_eval.search.stages import ScoreBook, StageSettings, SubResult, layer_level, stage1, stage3

VARIANTS = ("bosch", "single", "multi", "layer")


@dataclass(frozen=True)
class SearchSettings:
    """Everything that determines a search's result (and so its journal header)."""

    ratio: float
    variant: str = "bosch"
    optimizer: str = "auto"
    budget_per_layer: int = 100  # κ (paper B.2)
    alpha: float = DEFAULT_ALPHA
    gamma: float = DEFAULT_GAMMA
    seed: int = 0
    buckets: tuple[float, ...] = DEFAULT_BUCKETS
    max_variables: int = NOMAD_MAX_VARIABLES

    def __post_init__(self) -> None:
        check_ratio(self.ratio, "ratio")
        if self.variant not in VARIANTS:
            raise SearchError(f"variant: expected one of {list(VARIANTS)}, got {self.variant!r}")
        if self.optimizer not in METHODS:
            raise SearchError(f"optimizer: expected one of {list(METHODS)}, got {self.optimizer!r}")
        if self.budget_per_layer < 1:
            raise SearchError(f"budget_per_layer: expected an integer >= 1, got {self.budget_per_layer}")
        if self.alpha <= 0:
            raise SearchError(f"alpha: expected a value > 0, got {self.alpha}")
        if self.max_variables < 1:
            raise SearchError(f"max_variables: expected an integer >= 1, got {self.max_variables}")

    def to_json(self) -> dict[str, Any]:
        return dict(asdict(self), buckets=list(self.buckets))


def validate_for_shape(settings: SearchSettings, shape: ModelShape) -> None:
    """Every check of ``settings`` that needs the model's shape, run before the first
    evaluation (the search CLI calls it with the shape read from the config, before any
    weight loads), so that no evaluation is spent on a search that would fail later.

    Raises:
        SearchError: naming the setting, e.g. Stage-2 buckets that are not whole numbers of
            KV groups per layer.
    """
    if settings.variant == "bosch":  # only B-full runs Stage 2
        from bosch_eval.search.stage2 import _bucket_counts

        try:
            counts = _bucket_counts(settings.buckets, shape.num_kv_heads)
        except ValueError as err:
            raise SearchError(f"--{err}") from None
        # Stage 2 gives every layer one bucket: totals outside L·[min, max] cannot be reached.
        target = ceil_count(settings.ratio, shape.num_layers * shape.num_kv_heads)
        low, high = shape.num_layers * counts[0], shape.num_layers * counts[-1]
        if not low <= target <= high:
            raise SearchError(
                f"--buckets: ratio {settings.ratio:g} asks for {target} SWA groups, but buckets "
                f"{list(settings.buckets)} give {low} to {high} over {shape.num_layers} layers × "
                f"{shape.num_kv_heads} groups; include a bucket of {'0' if target < low else '1'}"
            )


@dataclass
class SearchResult:
    """The mask a search found and how it got there."""

    mask: HeadMask
    score: float
    anchors: Anchors
    settings: SearchSettings
    stage1_scores: list[float] | None = None
    stage2: Stage2Result | None = None
    subproblems: list[SubResult] = field(default_factory=list)
    evaluations: int = 0  # distinct masks scored by the whole search (journaled ones included)
    new_evaluations: int = 0  # of those, scored by this process run (0 after a complete resume)
    wall_s: float = 0.0

    def provenance(self) -> dict[str, Any]:
        """The mask file's ``provenance`` block (paper quantities, settings, cost)."""
        stage2 = self.stage2
        return {
            "search": self.settings.to_json(),
            "anchors": {"a": self.anchors.a, "b": self.anchors.b, "all_full": self.anchors.all_full, "all_swa": self.anchors.all_swa},
            "score": self.score,
            "normalized_score": self.anchors.normalize(self.score),
            "stage1_scores": self.stage1_scores,
            "stage2": None
            if stage2 is None
            else {
                "ratios": list(stage2.ratios),
                "weights": list(stage2.weights),
                "drops": list(stage2.drops),
                "target_groups": stage2.target_groups,
                "assigned_groups": stage2.assigned_groups,
            },
            "subproblems": [sub.to_json() for sub in self.subproblems],
            "evaluations": self.evaluations,
            "new_evaluations": self.new_evaluations,
            "wall_s": round(self.wall_s, 2),
        }


def run_search(
    score_fn: Callable[[HeadMask], float],
    shape: ModelShape,
    settings: SearchSettings,
    *,
    known: dict[str, float] | None = None,
    journal: Journal | None = None,
    progress: bool = True,
) -> SearchResult:
    """Find a head mask with SWA ratio ``settings.ratio`` that maximizes ``score_fn``.

    Args:
        score_fn: S(z); called once per distinct mask, never for a mask in ``known``.
        shape: the model's L, H and G.
        known: scores of masks already evaluated (a resumed journal), keyed by ``mask_key``.
        journal: where each new score is appended before the next evaluation (main process only).
        progress: tqdm bars and log lines.
    """
    started = time.perf_counter()
    book = ScoreBook(score_fn, shape, known, journal)
    full = HeadMask.uniform(shape, full=True).bits
    swa = HeadMask.uniform(shape, full=False).bits
    anchors = Anchors(all_swa=book.score(swa, "anchor"), all_full=book.score(full, "anchor"), gamma=settings.gamma)
    stage_settings = StageSettings(
        budget_per_layer=settings.budget_per_layer,
        optimizer=settings.optimizer,
        alpha=settings.alpha,
        seed=settings.seed,
        max_variables=settings.max_variables,
    )
    result = SearchResult(mask=HeadMask(full, shape.num_heads), score=anchors.all_full, anchors=anchors, settings=settings)
    if settings.variant == "layer":
        outcome = layer_level(book, anchors, shape, settings.ratio, stage_settings, progress)
    else:
        layers_per_problem = max(1, settings.max_variables // shape.num_kv_heads) if settings.variant == "multi" else 1
        outcome, result.stage1_scores = stage1(
            book, anchors, shape, settings.ratio, stage_settings, layers_per_problem, progress
        )
        if settings.variant == "bosch":
            result.subproblems.extend(outcome.subproblems)
            result.stage2 = assign_layer_ratios(
                result.stage1_scores, anchors.all_full, settings.ratio, shape.num_kv_heads, settings.buckets
            )
            outcome = stage3(book, anchors, shape, result.stage2.ratios, stage_settings, progress)
    result.subproblems.extend(outcome.subproblems)
    result.mask = HeadMask(outcome.bits, shape.num_heads, method=_method_name(settings.variant))
    result.score = book.score(outcome.bits, "final")
    result.evaluations = len(book.known)
    result.new_evaluations = book.new_evaluations
    result.wall_s = time.perf_counter() - started
    return result


def _method_name(variant: str) -> str:
    return "bosch" if variant == "bosch" else f"bosch-{variant}"

