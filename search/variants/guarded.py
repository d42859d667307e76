"""``guarded`` (beyond the paper, the default): incumbents, then ``bosch``, then a local search;
never less than the best incumbent (:mod:`bosch_eval.search.guard`)."""

from __future__ import annotations

import logging
from dataclasses import replace

from bosch_eval.masks.head_mask import HeadMask
from bosch_eval.search.guard.verdict import STAGE1, STAGES, Guard, Lineage, choose, source_of
from bosch_eval.search.guard.incumbents import best_incumbent, incumbent_masks, score_incumbents
from bosch_eval.search.guard.local_walk import local_search
from bosch_eval.search.journal.store import mask_key
from bosch_eval.search.objective.racing import RaceBound
from bosch_eval.search.objective.score_book import Bits
from bosch_eval.search.objective.tie_break import tie_key_bits
from bosch_eval.search.variants import VARIANTS, SearchRun, Variant, VariantOutcome
from bosch_eval.search.variants.common import run_bosch

log = logging.getLogger("bosch_eval.search")


def run_guarded(run: SearchRun) -> VariantOutcome:
    """Incumbents, then ``bosch`` (with Stage-1 probes where ⌈ρG⌉ = G), then the local search
    from the stages' mask (or Stage 1's, :func:`_stages_start`) and from the best incumbent; the
    best mask those runs end with (:mod:`bosch_eval.search.guard.verdict`)."""
    book, anchors, shape, settings = run.book, run.anchors, run.shape, run.settings
    higher = anchors.higher_is_better
    masks = incumbent_masks(shape, settings.ratio, settings.incumbents, settings.seed)
    scores = score_incumbents(book, anchors, masks)
    best = best_incumbent(masks, scores, higher)
    for name, mask in masks.items():
        outcome = scores[mask_key(mask)]
        shown = (
            f"S <= {outcome.score:.4f} (stopped early by racing)"
            if isinstance(outcome, RaceBound)
            else f"S = {outcome:.4f}"
        )
        log.info("incumbent %s: %s%s", name, shown, " (the best)" if name == best else "")
    outcome = run_bosch(run)
    subproblems = list(outcome.subproblems)
    stages_score = book.score(outcome.bits, "final")
    starts = [_stages_start(run, outcome.bits, outcome.stage1_bits, stages_score), (best, masks[best])]
    if mask_key(masks[best]) == mask_key(starts[0][1]):
        starts = starts[:1]
    lineages = []
    for number, (origin, start) in enumerate(starts):
        calls = settings.local_calls // len(starts) + (number < settings.local_calls % len(starts))
        end, summary = (
            local_search(book, anchors, shape, start, calls, run.stages, origin, run.progress)
            if calls
            else (start, None)
        )
        if summary is not None:
            subproblems.append(summary)
        lineages.append(Lineage(origin, mask_key(start), mask_key(end), book.score(end, "final"), calls))
    chosen = choose(lineages, higher)
    guard = Guard(
        {name: mask_key(mask) for name, mask in masks.items()},
        scores, best, mask_key(outcome.bits), stages_score, tuple(lineages), chosen.end, source_of(chosen), higher,
    )  # fmt: skip
    log.info("search: %s", guard.message())
    return replace(outcome, bits=tie_key_bits(chosen.end), subproblems=tuple(subproblems), guard=guard)


def _stages_start(run: SearchRun, stages_bits: Bits, stage1_bits: Bits | None, stages_score: float) -> tuple[str, Bits]:
    """Where the stages' local search starts: Stage 1's own mask where it has as many SWA groups
    as the stages' mask and scored strictly better, else the stages' mask."""
    if stage1_bits is None:
        return STAGES, stages_bits
    swa = HeadMask(stages_bits, run.shape.num_heads).num_swa_groups
    gain = (run.book.score(stage1_bits, "stage1") - stages_score) * run.anchors.sign  # scored in Stage 1: no call
    if HeadMask(stage1_bits, run.shape.num_heads).num_swa_groups == swa and gain > 0:
        return STAGE1, stage1_bits
    return STAGES, stages_bits


VARIANTS.register("guarded", Variant(run_guarded, stage2=True, chunks=True, probes=True, incumbents=True))
