"""The BOSCH pipeline on any score function: anchors, then the stages of the chosen variant.

``run_search(score_fn, shape, settings)`` is model-agnostic — ``score_fn`` maps a
:class:`HeadMask` to S(z) (the lm-eval objective in real runs, a synthetic function in
tests). The variants (paper §3.4: ``bosch``, ``single``, ``multi``, ``layer``; beyond it,
``nested`` and the default ``guarded``) are the modules of :mod:`bosch_eval.search.variants`,
each registered in :data:`VARIANTS` (imported here, where the settings check their name).

``refine > 0`` adds coordinate descent after Stage 3 (beyond the paper; off by default).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from bosch_eval.masks.head_mask import HeadMask, ModelShape, ceil_count, check_ratio
from bosch_eval.runtime.checks import is_int
from bosch_eval.runtime.errors import SearchError
from bosch_eval.search.guard.verdict import Guard
from bosch_eval.search.journal.store import Journal, mask_key
from bosch_eval.search.objective.score_book import ScoreBook
from bosch_eval.search.objective.scoring import DEFAULT_ALPHA, DEFAULT_GAMMA, Anchors, ScoreScale
from bosch_eval.search.check.saturation import TopTies, top_ties
from bosch_eval.search.stages.optimizers import NOMAD_MAX_VARIABLES, optimizer_methods
from bosch_eval.search.stages.stage2 import Stage2Result, _bucket_counts, default_buckets
from bosch_eval.search.stages.subproblems import QUOTAS, StageOutcome, StageSettings, SubResult, unfit_for_chunks
from bosch_eval.search.objective.tie_break import TieBreak
from bosch_eval.search.variants import VARIANTS, SearchRun, VariantOutcome

log = logging.getLogger("bosch_eval.search")


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
    variant: str = "guarded"  # the paper's search is "bosch"
    optimizer: str = "auto"
    budget_per_layer: int = 100  # κ (paper B.2)
    alpha: float = DEFAULT_ALPHA
    gamma: float = DEFAULT_GAMMA
    seed: int = 0
    buckets: tuple[float, ...] | None = None  # None: stage2.default_buckets(G), the paper's where G allows
    max_variables: int = NOMAD_MAX_VARIABLES
    chunk_layers: int | None = None  # None: default_chunk_layers(G, max_variables), the paper's B.2
    quota: str = "layer"  # "chunk": the old per-chunk count, a deviation from Algorithm 3
    refine: int = 0  # coordinate-descent passes after Stage 3 (0 = the paper's BOSCH)
    local_calls: int = 100  # the guarded variant's local search: new S() calls, over both starts
    # The guarded variant's incumbents besides the layer heuristics: (name, journal mask key)
    # pairs, the static rankings' masks at the ratio (search/run/api.py computes them).
    incumbents: tuple[tuple[str, str], ...] = ()
    # The rankings search/run/api.py turns into incumbents: a ranker's name (computed on the
    # calibration set) or NAME=FILE (a bosch-ranking/1 file); None: every registered ranker.
    rankings: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        check_ratio(self.ratio, "ratio")
        variant = VARIANTS.lookup(self.variant)
        if self.optimizer not in optimizer_methods():
            raise SearchError(f"optimizer: expected one of {list(optimizer_methods())}, got {self.optimizer!r}")
        if self.budget_per_layer < 1:
            raise SearchError(f"budget_per_layer: expected an integer >= 1, got {self.budget_per_layer}")
        if self.alpha <= 0:
            raise SearchError(f"alpha: expected a value > 0, got {self.alpha}")
        if self.max_variables < 1:
            raise SearchError(f"max_variables: expected an integer >= 1, got {self.max_variables}")
        chunk = self.chunk_layers
        if chunk is not None and (not is_int(chunk) or chunk < 1):
            raise SearchError(f"chunk_layers: expected an integer >= 1 (layers per Stage-3 sub-problem), got {chunk!r}")
        if self.quota not in QUOTAS:
            raise SearchError(f"quota: expected one of {list(QUOTAS)}, got {self.quota!r}")
        if not is_int(self.refine) or self.refine < 0:
            raise SearchError(f"refine: expected an integer >= 0 (coordinate-descent passes), got {self.refine!r}")
        if self.refine and not variant.stage2:
            stage3_variants = [name for name, other in VARIANTS.items() if other.stage2]
            raise SearchError(
                f"refine: runs after Stage 3, so only with variant {' or '.join(map(repr, stage3_variants))}, got variant {self.variant!r}"
            )
        if not is_int(self.local_calls) or self.local_calls < 0:
            raise SearchError(
                f"local_calls: expected an integer >= 0 (S() calls of the local search), got {self.local_calls!r}"
            )
        names = [pair[0] for pair in self.incumbents if isinstance(pair, tuple) and len(pair) == 2]
        if len(names) != len(self.incumbents) or not all(
            isinstance(name, str) and isinstance(key, str) for name, key in self.incumbents
        ):
            raise SearchError(f"incumbents: expected (name, mask key) pairs of strings, got {self.incumbents!r}")
        if len(set(names)) != len(names):
            raise SearchError(f"incumbents: expected distinct names, got {names}")
        if self.incumbents and not variant.incumbents:
            guarded = [name for name, other in VARIANTS.items() if other.incumbents]
            raise SearchError(
                f"incumbents: scored only by variant {' or '.join(map(repr, guarded))}, got variant {self.variant!r}"
            )

    def chunk_layers_for(self, shape: ModelShape) -> int:
        """``chunk_layers``, or the paper's default for the model's G."""
        return (
            self.chunk_layers
            if self.chunk_layers is not None
            else default_chunk_layers(shape.num_kv_heads, self.max_variables)
        )

    def buckets_for(self, shape: ModelShape) -> tuple[float, ...]:
        """``buckets``, or Stage 2's default for the model's G (:func:`stage2.default_buckets`).

        A ``nested`` variant keeps those below Stage 1's per-layer ratio ⌈ρG⌉/G and adds that
        ratio as the top bucket: no layer gets more SWA groups than Stage 1 measured in it.
        """
        buckets = self.buckets if self.buckets is not None else default_buckets(shape.num_kv_heads)
        if not VARIANTS[self.variant].nested:
            return buckets
        top = self.stage3_pool(shape) / shape.num_kv_heads
        return (*(bucket for bucket in buckets if bucket < top), top)

    def stage3_pool(self, shape: ModelShape) -> int:
        """The KV groups of a layer Stage 3 chooses among: all G, or Stage 1's ⌈ρG⌉ (``nested``)."""
        return ceil_count(self.ratio, shape.num_kv_heads) if VARIANTS[self.variant].nested else shape.num_kv_heads

    def to_json(self) -> dict[str, Any]:
        return dict(
            asdict(self),
            buckets=None if self.buckets is None else list(self.buckets),
            incumbents=[list(pair) for pair in self.incumbents],
            rankings=None if self.rankings is None else list(self.rankings),
        )

    def pinned_json(self, shape: ModelShape) -> dict[str, Any]:
        """The settings as a journal pins them for a model of ``shape``: ``buckets`` as Stage 2
        uses them there (:meth:`buckets_for`), so that the default and the same buckets named
        are one setting (every journal written before the default depended on G names the
        paper's buckets); ranking files by name only, never by a path, since their masks are
        pinned in ``incumbents`` (a committed search resumes from any clone)."""
        rankings = None if self.rankings is None else [entry.partition("=")[0] for entry in self.rankings]
        return dict(self.to_json(), buckets=list(self.buckets_for(shape)), rankings=rankings)


@dataclass(frozen=True)
class SearchResult:
    """The mask a search found and how it got there (built once, when the search ends; a
    tie-break or a resumed journal's earlier time make a new one with ``dataclasses.replace``)."""

    mask: HeadMask
    score: float
    anchors: Anchors
    settings: SearchSettings
    stage1_scores: tuple[float, ...] | None = None
    stage1_probes: bool = False  # Stage 1 measured each layer alone (stages.stage1_probes), not cumulatively
    stage2: Stage2Result | None = None
    subproblems: tuple[SubResult, ...] = ()
    stage3_score: float | None = None  # S before refinement (None without --refine)
    stage3_evaluations: int | None = None  # distinct masks scored up to the end of Stage 3
    evaluations: int = 0  # distinct masks scored by the whole search (journaled ones included)
    new_evaluations: int = 0  # of those, scored by this process run (0 after a complete resume)
    pruned: int = 0  # of the evaluations, masks racing stopped early (a bound, not a score)
    wall_s: float = 0.0
    work: dict[str, float] = field(default_factory=dict)  # the objective's own counts (CalibrationObjective.work)
    costs: dict[str, dict[str, float]] = field(default_factory=dict)  # per stage: calls, pruned, seconds (this run)
    ties: TopTies | None = None  # masks of the found ratio at the found S (None: one mask allowed, nothing searched)
    tie_break: TieBreak | None = None  # how --tie-break-tasks ordered them (None: not asked)
    guard: Guard | None = None  # the guarded variant's incumbents and local search (None: another variant)
    best_possible: float | None = None  # the best S the metric can take, where each sub-problem stopped (None: unknown)

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
            "stage1_scores": None if self.stage1_scores is None else list(self.stage1_scores),
            "stage1_probes": self.stage1_probes,
            "stage2": None
            if stage2 is None
            else {
                "ratios": list(stage2.ratios),
                "buckets": list(stage2.buckets),
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
            "ties": None if self.ties is None else {"scored": self.ties.scored, "may_tie": self.ties.may_tie},
            "tie_break": None if self.tie_break is None else self.tie_break.to_json(),
            "guard": None if self.guard is None else self.guard.to_json(),
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
    scale: ScoreScale = ScoreScale(),
    racing: bool = False,
) -> SearchResult:
    """Find a head mask with SWA ratio ``settings.ratio`` that optimizes ``score_fn``.

    Args:
        score_fn: S(z); called once per distinct mask, never for a mask ``resumed`` scored.
        shape: the model's L, H and G.
        resumed: what a resumed journal holds (scores, racing bounds, per-example values).
        journal: where each new score is appended before the next evaluation (main process only).
        progress: tqdm bars and log lines.
        scale: the direction of S and, where the metric bounds it, its best value.
        racing: stop candidates early that provably cannot win (``score_fn`` needs a
            ``race`` method, see :class:`ScoreBook`); the mask and every full score stay the same.

    Raises:
        SearchError: settings that do not fit ``shape``, or anchors that cannot rank masks.
    """
    validate_for_shape(settings, shape)
    started = time.perf_counter()
    resumed = resumed if resumed is not None else Resumed()
    book = ScoreBook(
        score_fn,
        shape,
        resumed.scores,
        journal,
        racing=racing,
        bounds=resumed.bounds,
        examples=resumed.examples,
        best_possible=scale.best_possible,
    )
    full = HeadMask.uniform(shape, full=True).bits
    swa = HeadMask.uniform(shape, full=False).bits
    all_swa = book.score(swa, "anchor")
    with book.varying_from(shape.num_layers - 1):  # Stage 1's first layers start from its prefix states
        all_full = book.score(full, "anchor")
    anchors = Anchors(
        all_swa=all_swa,
        all_full=all_full,
        gamma=settings.gamma,
        higher_is_better=scale.higher_is_better,
    )
    stage_settings = StageSettings(
        budget_per_layer=settings.budget_per_layer,
        optimizer=settings.optimizer,
        alpha=settings.alpha,
        seed=settings.seed,
        chunk_layers=settings.chunk_layers_for(shape),
        quota=settings.quota,
        higher_is_better=scale.higher_is_better,
    )
    outcome = VARIANTS[settings.variant].run(SearchRun(book, anchors, shape, settings, stage_settings, progress))
    if isinstance(outcome, StageOutcome):  # a variant that records nothing but its stages' masks
        outcome = VariantOutcome.of(outcome)
    score = book.score(outcome.bits, "final")
    ties = top_ties(book.all_scores(), book.all_bounds(), mask_key(outcome.bits), score)
    (log.warning if ties.scored else log.info)("search: %s", ties.message())
    records = {name: getattr(outcome, name) for name in VARIANT_RECORDS}
    return SearchResult(
        mask=HeadMask(outcome.bits, shape.num_heads, method=_method_name(settings.variant)), score=score, anchors=anchors,
        settings=settings, **records, evaluations=book.evaluations, new_evaluations=book.new_evaluations, pruned=book.pruned,
        costs=book.costs, ties=ties, wall_s=time.perf_counter() - started, best_possible=scale.best_possible,
    )  # fmt: skip


# The fields a search result takes as its variant recorded them.
VARIANT_RECORDS = (
    "subproblems",
    "stage1_scores",
    "stage1_probes",
    "stage2",
    "stage3_score",
    "stage3_evaluations",
    "guard",
)


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
    variant = VARIANTS[settings.variant]
    if variant.stage2:
        buckets = settings.buckets_for(shape)
        try:
            counts = _bucket_counts(buckets, groups)
        except ValueError as err:
            raise SearchError(f"--{err}") from None
        # Stage 2 gives every layer one bucket: totals outside L·[min, max] cannot be reached.
        target = ceil_count(settings.ratio, shape.num_layers * groups)
        low, high = shape.num_layers * counts[0], shape.num_layers * counts[-1]
        if not low <= target <= high:
            raise SearchError(
                f"--buckets: ratio {settings.ratio:g} asks for {target} SWA groups, but buckets "
                f"{list(buckets)} give {low} to {high} over {shape.num_layers} layers × "
                f"{groups} groups; include a bucket of {'0' if target < low else '1'}"
            )
    _check_incumbents(settings, shape)
    chunk = min(settings.chunk_layers_for(shape), shape.num_layers)
    unfit = unfit_for_chunks(settings.optimizer, groups, chunk, settings.quota) if variant.chunks else None
    if unfit is not None:
        raise SearchError(
            f"--optimizer {settings.optimizer}: Stage 3's sub-problems are {chunk} layers × {groups} KV groups = "
            f"{chunk * groups} variables (--chunk-layers, --quota {settings.quota}), and {unfit}; or pass --optimizer auto"
        )


def _check_incumbents(settings: SearchSettings, shape: ModelShape) -> None:
    """Each given incumbent is a mask of the model with at least the target's SWA groups (a
    cheaper mask may compete on S; a dearer one would beat the search by spending more)."""
    target = ceil_count(settings.ratio, shape.num_layers * shape.num_kv_heads)
    for name, key in settings.incumbents:
        rows = key.split("/")
        if len(rows) != shape.num_layers or any(
            len(row) != shape.num_kv_heads or set(row) - {"0", "1"} for row in rows
        ):
            raise SearchError(
                f"incumbents: {name}: expected a mask key of {shape.num_layers} rows of {shape.num_kv_heads} digits 0/1 "
                f"joined by '/', got {key[:80]!r}"
            )
        if key.count("0") < target:
            raise SearchError(
                f"incumbents: {name} has {key.count('0')} SWA groups, expected at least {target} "
                f"(⌈ρ·L·G⌉ at ratio {settings.ratio:g})"
            )
