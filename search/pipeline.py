"""The BOSCH pipeline on any score function: anchors, then the stages of the chosen variant.

``run_search(score_fn, shape, settings)`` is model-agnostic — ``score_fn`` maps a
:class:`HeadMask` to S(z) (the lm-eval objective in real runs, a synthetic function in
tests). Variants (paper §3.4):

* ``bosch``: Stage 1 → Stage 2 → Stage 3 (Algorithms 1–3);
* ``single``: the Stage-1 mask as is (B-single);
* ``multi``: Stage 1 over chunks of ``chunk_layers`` layers (B-multi);
* ``layer``: a single search over whole layers, budget κ·L (B-layer).

``refine > 0`` adds coordinate descent after Stage 3 (beyond the paper; off by default).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from bosch_eval.masks import HeadMask, ModelShape, ceil_count, check_ratio
from bosch_eval.search.journal import Journal
from bosch_eval.search.optimizers import METHODS, NOMAD_MAX_VARIABLES
from bosch_eval.search.saturation import stage1_saturation
from bosch_eval.search.scoring import DEFAULT_ALPHA, DEFAULT_GAMMA, Anchors, SearchError
from bosch_eval.search.stage2 import DEFAULT_BUCKETS, Stage2Result, assign_layer_ratios
from bosch_eval.search.score_book import ScoreBook
from bosch_eval.search.stages import QUOTAS, StageSettings, SubResult, layer_level, refine, stage1, stage3

log = logging.getLogger("bosch_eval.search")

VARIANTS = ("bosch", "single", "multi", "layer")


def default_chunk_layers(groups_per_layer: int, max_variables: int = NOMAD_MAX_VARIABLES) -> int:
    """The most layers one Stage-3 sub-problem searches jointly, by the paper's example (B.2).

    B.2: "with 50 variables we can group at most four layers (i.e., enforce max|G_g| ≤ 4 in
    Algorithm 3) for the 1.7B, 8B, and 14B Qwen3 models, each with 8 KV heads." ⌊50/8⌋ = 6
    layers (48 variables) would fit, so the paper's rule is not ⌊50/G⌋. The largest power
    of two p with p·G ≤ 50 gives its 4 for G = 8 (and 8 for the 4 KV heads of Q3-30B);
    that is the rule we read into the one example the paper gives. At least 1 layer.
    """
    layers = 1
    while 2 * layers * groups_per_layer <= max_variables:
        layers *= 2
    return layers


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
    chunk_layers: int | None = None  # None: default_chunk_layers(G, max_variables), the paper's B.2
    quota: str = "layer"  # "chunk": the old per-chunk count, a deviation from Algorithm 3
    refine: int = 0  # coordinate-descent passes after Stage 3 (0 = the paper's BOSCH)

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
        chunk = self.chunk_layers
        if chunk is not None and (isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1):
            raise SearchError(f"chunk_layers: expected an integer >= 1 (layers per Stage-3 sub-problem), got {chunk!r}")
        if self.quota not in QUOTAS:
            raise SearchError(f"quota: expected one of {list(QUOTAS)}, got {self.quota!r}")
        if isinstance(self.refine, bool) or not isinstance(self.refine, int) or self.refine < 0:
            raise SearchError(f"refine: expected an integer >= 0 (coordinate-descent passes), got {self.refine!r}")
        if self.refine and self.variant != "bosch":
            raise SearchError(f"refine: runs after Stage 3, so only with variant 'bosch', got variant {self.variant!r}")

    def chunk_layers_for(self, shape: ModelShape) -> int:
        """``chunk_layers``, or the paper's default for the model's G."""
        return self.chunk_layers if self.chunk_layers is not None else default_chunk_layers(shape.num_kv_heads, self.max_variables)

    def to_json(self) -> dict[str, Any]:
        return dict(asdict(self), buckets=list(self.buckets))


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
    stage3_score: float | None = None  # S before refinement (None without --refine)
    stage3_evaluations: int | None = None  # distinct masks scored up to the end of Stage 3
    evaluations: int = 0  # distinct masks scored by the whole search (journaled ones included)
    new_evaluations: int = 0  # of those, scored by this process run (0 after a complete resume)
    pruned: int = 0  # of the evaluations, masks racing stopped early (a bound, not a score)
    wall_s: float = 0.0
    work: dict[str, float] = field(default_factory=dict)  # the objective's own counts (CalibrationObjective.work)
    costs: dict[str, dict[str, float]] = field(default_factory=dict)  # per stage: calls, pruned, seconds (this run)

    def provenance(self) -> dict[str, Any]:
        """The mask file's ``provenance`` block (paper quantities, settings, cost)."""
        stage2 = self.stage2
        return {
            "search": self.settings.to_json(),
            "anchors": {
                "a": self.anchors.a,
                "b": self.anchors.b,
                "all_full": self.anchors.all_full,
                "all_swa": self.anchors.all_swa,
                "higher_is_better": self.anchors.higher_is_better,
            },
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
            "refine": None
            if self.stage3_score is None
            else {"stage3_score": self.stage3_score, "stage3_evaluations": self.stage3_evaluations},
            "evaluations": self.evaluations,
            "new_evaluations": self.new_evaluations,
            "pruned": self.pruned,
            "work": self.work,
            "costs": self.costs,
            "wall_s": round(self.wall_s, 2),
        }


@dataclass(frozen=True)
class Resumed:
    """What a resumed journal holds, keyed by ``mask_key``.

    Attributes:
        scores: S of every mask evaluated to the end.
        bounds: racing bounds of masks stopped early (the best S each could still reach).
        examples: per-example values, ``{mask_key: {task: {document: value}}}``: a racing
            search replays the masks they cover and never scores them again.
    """

    scores: dict[str, float] = field(default_factory=dict)
    bounds: dict[str, float] = field(default_factory=dict)
    examples: dict[str, dict[str, dict[int, float]]] = field(default_factory=dict)

    @classmethod
    def of(cls, journal: Journal) -> Resumed:
        return cls({record["key"]: record["score"] for record in journal.records}, journal.bounds, journal.examples)


def run_search(
    score_fn: Callable[[HeadMask], float],
    shape: ModelShape,
    settings: SearchSettings,
    *,
    resumed: Resumed | None = None,
    journal: Journal | None = None,
    progress: bool = True,
    higher_is_better: bool = True,
    racing: bool = False,
) -> SearchResult:
    """Find a head mask with SWA ratio ``settings.ratio`` that optimizes ``score_fn``.

    Args:
        score_fn: S(z); called once per distinct mask, never for a mask ``resumed`` scored.
        shape: the model's L, H and G.
        resumed: what a resumed journal holds (scores, racing bounds, per-example values).
        journal: where each new score is appended before the next evaluation (main process only).
        progress: tqdm bars and log lines.
        higher_is_better: the direction of S (lm-eval's ``higher_is_better`` of the
            calibration metric); ``False`` searches for the lowest S (perplexity).
        racing: stop candidates early that provably cannot win (``score_fn`` needs a
            ``race`` method, see :class:`ScoreBook`); the mask and every full score stay the same.

    Raises:
        SearchError: settings that do not fit ``shape``, or anchors that cannot rank masks.
    """
    validate_for_shape(settings, shape)
    started = time.perf_counter()
    resumed = resumed if resumed is not None else Resumed()
    book = ScoreBook(score_fn, shape, resumed.scores, journal, racing=racing, bounds=resumed.bounds, examples=resumed.examples)
    full = HeadMask.uniform(shape, full=True).bits
    swa = HeadMask.uniform(shape, full=False).bits
    all_swa = book.score(swa, "anchor")
    with book.varying_from(shape.num_layers - 1):  # Stage 1's first layers start from its prefix states
        all_full = book.score(full, "anchor")
    anchors = Anchors(
        all_swa=all_swa,
        all_full=all_full,
        gamma=settings.gamma,
        higher_is_better=higher_is_better,
    )
    stage_settings = StageSettings(
        budget_per_layer=settings.budget_per_layer,
        optimizer=settings.optimizer,
        alpha=settings.alpha,
        seed=settings.seed,
        chunk_layers=settings.chunk_layers_for(shape),
        quota=settings.quota,
        higher_is_better=higher_is_better,
    )
    result = SearchResult(mask=HeadMask(full, shape.num_heads), score=anchors.all_full, anchors=anchors, settings=settings)
    if settings.variant == "layer":
        outcome = layer_level(book, anchors, shape, settings.ratio, stage_settings, progress)
    else:
        layers_per_problem = stage_settings.chunk_layers if settings.variant == "multi" else 1
        outcome, result.stage1_scores = stage1(
            book, anchors, shape, settings.ratio, stage_settings, layers_per_problem, progress
        )
        saturation = stage1_saturation(result.stage1_scores, anchors.all_full, higher_is_better)
        (log.warning if saturation.saturated else log.info)("stage 1: %s", saturation.message())
        if settings.variant == "bosch":
            result.subproblems.extend(outcome.subproblems)
            result.stage2 = assign_layer_ratios(
                result.stage1_scores,
                anchors.all_full,
                settings.ratio,
                shape.num_kv_heads,
                settings.buckets,
                higher_is_better=higher_is_better,
            )
            outcome = stage3(book, anchors, shape, result.stage2.ratios, stage_settings, progress)
            if settings.refine:
                result.subproblems.extend(outcome.subproblems)
                result.stage3_score = book.score(outcome.bits, "final")
                result.stage3_evaluations = len(book.known) + len(book.bounds)
                outcome = refine(
                    book, anchors, shape, outcome.bits, result.stage2.ratios, stage_settings, settings.refine, progress
                )
    result.subproblems.extend(outcome.subproblems)
    result.mask = HeadMask(outcome.bits, shape.num_heads, method=_method_name(settings.variant))
    result.score = book.score(outcome.bits, "final")
    result.evaluations = book.evaluations
    result.new_evaluations = book.new_evaluations
    result.pruned = book.pruned
    result.costs = book.costs
    result.wall_s = time.perf_counter() - started
    return result


def _method_name(variant: str) -> str:
    return "bosch" if variant == "bosch" else f"bosch-{variant}"



def validate_for_shape(settings: SearchSettings, shape: ModelShape) -> None:
    """Every check of ``settings`` that needs the model's shape, run before the first
    evaluation (the search CLI calls it with the shape read from the config, before any
    weight loads), so that no evaluation is spent on a search that would fail later.

    Raises:
        SearchError: naming the setting and what the model allows, e.g. Stage-2 buckets that
            are not whole numbers of KV groups per layer.
    """
    groups = shape.num_kv_heads
    if settings.variant == "bosch":  # only B-full runs Stage 2
        from bosch_eval.search.stage2 import _bucket_counts

        try:
            counts = _bucket_counts(settings.buckets, groups)
        except ValueError as err:
            raise SearchError(f"--{err}") from None
        # Stage 2 gives every layer one bucket: totals outside L·[min, max] cannot be reached.
        target = ceil_count(settings.ratio, shape.num_layers * groups)
        low, high = shape.num_layers * counts[0], shape.num_layers * counts[-1]
        if not low <= target <= high:
            raise SearchError(
                f"--buckets: ratio {settings.ratio:g} asks for {target} SWA groups, but buckets "
                f"{list(settings.buckets)} give {low} to {high} over {shape.num_layers} layers × "
                f"{groups} groups; include a bucket of {'0' if target < low else '1'}"
            )
    chunk = min(settings.chunk_layers_for(shape), shape.num_layers)
    searches_chunks = settings.optimizer == "nomad" and settings.variant in ("bosch", "multi")
    if searches_chunks and settings.quota == "layer" and chunk > 1:
        raise SearchError(
            f"optimizer: nomad cannot keep a quota in each of the {chunk} layers of a sub-problem "
            "(see bosch_eval.search.optimizers); pass --chunk-layers 1 (one layer per sub-problem), --quota chunk, "
            "or --optimizer auto (the (1+1)-EA takes those sub-problems)"
        )
    if searches_chunks and chunk * groups > NOMAD_MAX_VARIABLES:
        raise SearchError(
            f"chunk_layers: {chunk} layers × {groups} KV groups = {chunk * groups} variables, more than "
            f"the {NOMAD_MAX_VARIABLES} NOMAD handles (B.2); lower --chunk-layers to {max(1, NOMAD_MAX_VARIABLES // groups)} "
            "or use --optimizer auto/oneplusone"
        )
