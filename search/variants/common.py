"""The runs the variants share: Stage 1 (Algorithm 1, or one probe per layer), and BOSCH's
Stages 1–3 (Algorithms 1–3), on which ``nested`` and ``guarded`` build. Registers nothing."""

from __future__ import annotations

import logging
from dataclasses import replace

from bosch_eval.masks.head_mask import HeadMask, ceil_count
from bosch_eval.search.objective.score_book import Bits
from bosch_eval.search.check.saturation import stage1_saturation
from bosch_eval.search.stages.stage2 import assign_layer_ratios, cumulative_from_probes
from bosch_eval.search.stages.subproblems import LayerQuotas, refine, stage1, stage1_probes, stage3
from bosch_eval.search.variants import VARIANTS, SearchRun, VariantOutcome

log = logging.getLogger("bosch_eval.search")


def stage1_outcome(run: SearchRun, layers_per_problem: int) -> VariantOutcome:
    """Stage 1 (Algorithm 1), or one probe per layer where the variant asks for them and ⌈ρG⌉ = G,
    with its per-layer scores; its saturation goes into the log."""
    groups = run.shape.num_kv_heads
    probes = (
        VARIANTS[run.settings.variant].probes
        and layers_per_problem == 1
        and ceil_count(run.settings.ratio, groups) == groups
    )
    if probes:
        log.info(
            "stage 1: ⌈ρG⌉ = G = %d, so each layer is measured alone from the full model (one probe per layer)", groups
        )
        outcome, scores = stage1_probes(run.book, run.anchors, run.shape, run.stages, run.progress)
    else:
        outcome, scores = stage1(
            run.book, run.anchors, run.shape, run.settings.ratio, run.stages, layers_per_problem, run.progress
        )
    saturation = stage1_saturation(scores, run.anchors.all_full, run.stages.higher_is_better)
    (log.warning if saturation.saturated else log.info)("stage 1: %s", saturation.message())
    return VariantOutcome.of(outcome, stage1_scores=tuple(scores), stage1_probes=probes)


def run_bosch(run: SearchRun) -> VariantOutcome:
    """Stages 1–3 (Algorithms 1–3), then ``refine`` passes of coordinate descent if asked;
    a ``nested`` variant keeps Stages 2–3 (and ``refine``) within Stage 1's mask."""
    book, anchors, shape, settings = run.book, run.anchors, run.shape, run.settings
    nested = VARIANTS[settings.variant].nested
    first = stage1_outcome(run, 1)
    # Probes' drops are each layer's own; Stage 2 reads cumulative scores, so they are given as such.
    drops_from = (
        cumulative_from_probes(list(first.stage1_scores), anchors.all_full)
        if first.stage1_probes
        else list(first.stage1_scores)
    )
    stage2 = assign_layer_ratios(
        drops_from,
        anchors.all_full,
        settings.ratio,
        shape.num_kv_heads,
        settings.buckets_for(shape) if nested else settings.buckets,  # None: the default, which Stage 2 logs
        higher_is_better=run.stages.higher_is_better,
    )
    quotas = LayerQuotas(stage2.ratios, pool=first.bits if nested else None)
    outcome = stage3(book, anchors, shape, quotas, run.stages, run.progress)
    subproblems, refined = first.subproblems, {}
    if settings.refine:
        subproblems += tuple(outcome.subproblems)
        refined = {
            "stage3_score": book.score(outcome.bits, "final"),
            "stage3_evaluations": len(book.known) + len(book.bounds),
        }
        outcome = refine(book, anchors, shape, outcome.bits, quotas, run.stages, settings.refine, run.progress)
    if not first.stage1_probes:  # probes leave no Stage-1 mask but all-SWA, which cannot score better
        _warn_if_stage1_scores_better(run, first, outcome.bits)
    stage1_bits = None if first.stage1_probes else first.bits
    return replace(
        first,
        bits=outcome.bits,
        subproblems=subproblems + tuple(outcome.subproblems),
        stage2=stage2,
        stage1_bits=stage1_bits,
        **refined,
    )


def _warn_if_stage1_scores_better(run: SearchRun, first: VariantOutcome, final_bits: Bits) -> None:
    """Warn when Stage 1's own mask scores better than the mask Stages 2–3 return.

    Stage 1 converts ⌈ρG⌉ groups in every layer, never fewer SWA groups in all than the
    target ⌈ρLG⌉, so its mask is at least as cheap. It scores better when Stage 2 gave
    layers more SWA groups than the ⌈ρG⌉ Stage 1 measured in them, a ratio no stage scored
    layer by layer: with a saturated calibration set Stage 2 orders the layers that lost
    nothing by index (SmolLM2 at ρ = 0.5: its top eight layers got all three groups SWA
    and the mask lost half the calibration score Stage 1's mask kept). The paper's mask is still returned; the
    warning names the layers and the variant that returns Stage 1's mask.
    """
    stage1_bits, stage1_score = (
        first.bits,
        first.stage1_scores[0],
    )  # s_best of layer 0: every layer converted, Stage 1's mask
    final_score = run.book.score(final_bits, "final")
    better = stage1_score > final_score if run.anchors.higher_is_better else stage1_score < final_score
    if not better:
        return
    measured = ceil_count(run.settings.ratio, run.shape.num_kv_heads)
    above = [layer for layer, row in enumerate(final_bits) if row.count(0) > measured]
    why = (
        f"Stage 2 gave layers {above} more than the {measured} of {run.shape.num_kv_heads} SWA groups Stage 1 measured in each; "
        "`--variant nested` keeps every layer within Stage 1's groups, "
        if above
        else ""
    )
    log.warning(
        "stage 1's mask (%d SWA groups, S=%.4f) scores better than the mask returned (%d SWA groups, S=%.4f): "
        "%s`--variant single` returns Stage 1's mask",
        HeadMask(stage1_bits, run.shape.num_heads).num_swa_groups, stage1_score,
        HeadMask(final_bits, run.shape.num_heads).num_swa_groups, final_score, why,
    )  # fmt: skip
