"""The search's variants (paper §3.4): what a search runs after its anchors.

One module per variant, or per two that share a run, each registering a :class:`Variant` in
:data:`VARIANTS` under its ``--variant`` name; a new variant is a new module here
(docs/extending.md), found when a name is looked up or the names are listed:

* ``bosch``: Stage 1 → Stage 2 → Stage 3 (Algorithms 1–3), and ``nested`` (beyond the paper):
  ``bosch`` with no layer given more SWA groups than the ⌈ρG⌉ Stage 1 measured in it, chosen
  among the groups Stage 1 made SWA there (:mod:`.bosch`);
* ``guarded`` (beyond the paper, the default): ``bosch`` that first scores the incumbents
  (static rankings' and layer heuristics' masks), measures Stage 1 by one-layer probes when
  ⌈ρG⌉ = G, runs a local search over the whole model after Stage 3 and never returns less than
  the best incumbent (:mod:`.guarded`);
* ``single``: the Stage-1 mask as is (B-single), and ``multi``: Stage 1 over chunks of
  ``chunk_layers`` layers (B-multi) (:mod:`.stage1`);
* ``layer``: a single search over whole layers, budget κ·L (B-layer) (:mod:`.layer`).

:mod:`.common` holds the runs they share (Stage 1; BOSCH's Stages 1–3). The built-in modules
are imported first, in this order, the order ``--variant``'s choices are listed in.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from bosch_eval.masks.head_mask import ModelShape
from bosch_eval.runtime.errors import SearchError
from bosch_eval.runtime.registry import Registry
from bosch_eval.search.guard.verdict import Guard
from bosch_eval.search.objective.score_book import Bits, ScoreBook
from bosch_eval.search.objective.scoring import Anchors
from bosch_eval.search.stages.stage2 import Stage2Result
from bosch_eval.search.stages.subproblems import StageOutcome, StageSettings, SubResult


@dataclass(frozen=True)
class Variant:
    """One search variant (paper §3.4).

    Attributes:
        run: the stages after the anchors; returns what they found and measured
            (:class:`VariantOutcome`, or a plain ``StageOutcome``; run_search scores its mask
            and builds the result).
        stage2: runs Stages 2 and 3, so ``buckets`` and ``refine`` apply.
        chunks: its sub-problems may span ``chunk_layers`` layers.
        nested: Stages 2–3 stay within Stage 1's mask (see :meth:`SearchSettings.buckets_for`
            and :class:`stages.LayerQuotas`).
        probes: when ⌈ρG⌉ = G, Stage 1 measures each layer alone from the full model
            (:func:`stages.stage1_probes`) instead of Algorithm 1's cumulative pass.
        incumbents: scores the incumbents first and runs the local search after the stages
            (``SearchSettings.incumbents`` and ``local_calls`` apply).
    """

    run: Callable[[SearchRun], VariantOutcome | StageOutcome]
    stage2: bool = False
    chunks: bool = False
    nested: bool = False
    probes: bool = False
    incumbents: bool = False


VARIANTS: Registry[Variant] = Registry(
    "search variant",
    package=__name__,
    first=("bosch", "guarded", "stage1", "layer"),
    field="variant",
    error=SearchError,
)


@dataclass(frozen=True)
class VariantOutcome:
    """What a variant's stages found and measured: the mask's bits and each stage's record."""

    bits: Bits
    subproblems: tuple[SubResult, ...] = ()
    stage1_scores: tuple[float, ...] | None = None
    stage1_probes: bool = False  # Stage 1 measured each layer alone (stages.stage1_probes), not cumulatively
    stage1_bits: Bits | None = None  # Stage 1's own mask, where a variant ran Stages 2–3 after Algorithm 1
    stage2: Stage2Result | None = None
    stage3_score: float | None = None  # S before refinement (None without --refine)
    stage3_evaluations: int | None = None  # distinct masks scored up to the end of Stage 3
    guard: Guard | None = None  # the guarded variant's incumbents and local search (None: another variant)

    @classmethod
    def of(cls, outcome: StageOutcome, **records: Any) -> VariantOutcome:
        return cls(outcome.bits, tuple(outcome.subproblems), **records)


@dataclass(frozen=True)
class SearchRun:
    """One search after its anchors, as a variant sees it: the score book, the anchors and the settings."""

    book: ScoreBook
    anchors: Anchors
    shape: ModelShape
    # The search's SearchSettings. Not named as a type: it lives in search/run/pipeline.py, which
    # imports this package, and a room of the search never imports the top (tests/test_layers.py).
    settings: Any
    stages: StageSettings
    progress: bool
