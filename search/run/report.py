"""``report.md``: a search's result for people — settings, anchors, per-stage decisions, the mask."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from bosch_eval.masks.head_mask import HeadMask
from bosch_eval.search.run.cost import estimate_calls, render_cost
from bosch_eval.search.guard.verdict import Guard
from bosch_eval.search.objective.racing import RaceBound
from bosch_eval.search.run.pipeline import SearchResult
from bosch_eval.search.check.saturation import TopTies, stage1_saturation
from bosch_eval.search.objective.tie_break import TIE_BREAK_FILE


def render_report(result: SearchResult, model: str, window: int, calibration: Mapping[str, Any]) -> str:
    """Markdown summary of ``result`` (the same numbers as the mask's provenance)."""
    lines = [*_summary(result, model, window, calibration), ""]
    if result.guard is not None:
        lines += _guard(result.guard)
    if result.stage1_scores is not None:
        lines += _stages_1_and_2(result)
    lines += _subproblems(result)
    if result.costs:
        lines += ["", *_costs(result)]
    lines += ["", *_mask_drawing(result.mask), ""]
    return "\n".join(lines)


def _summary(result: SearchResult, model: str, window: int, calibration: Mapping[str, Any]) -> list[str]:
    """The title, the settings, the calibration and the table of the run's numbers."""
    settings = result.settings
    return [
        f"# BOSCH search: {model}",
        "",
        f"Variant `{settings.variant}`, target SWA ratio ρ = {settings.ratio}, window W = {window}, "
        f"seed {settings.seed}, optimizer `{settings.optimizer}`, κ = {settings.budget_per_layer} evaluations per layer, "
        f"α = {settings.alpha}, γ = {settings.gamma}, quota per `{settings.quota}`, "
        f"chunk layers {settings.chunk_layers if settings.chunk_layers is not None else 'paper default'}, refine passes {settings.refine}.",
        "",
        f"Calibration: {_describe(calibration)}.",
        "",
        "| quantity | value |",
        "|---|---|",
        *_score_rows(result),
        *_work_rows(result),
        # wall_s counts every run of a resumed journal (search/run/api.py adds the earlier runs')
        f"| search time, every run of this journal | {result.wall_s:.1f} s |",
    ]


def _score_rows(result: SearchResult) -> list[str]:
    """The anchors, the found mask's score and ratio."""
    anchors, mask = result.anchors, result.mask
    return [
        f"| S(all full) | {anchors.all_full:.4f} |",
        f"| S(all SWA) = a | {anchors.a:.4f} |",
        f"| b = S(all full) {'+' if anchors.higher_is_better else '−'} γ·abs(S(all full)) | {anchors.b:.4f} |",
        f"| metric direction | {'higher' if anchors.higher_is_better else 'lower'} is better (lm-eval's higher_is_better) |",
        f"| S(found mask) | {result.score:.4f} |",
        f"| Ŝ(found mask) | {anchors.normalize(result.score):.4f} |",
        f"| SWA ratio reached | {mask.swa_ratio:.4f} ({mask.num_swa_groups} of {mask.shape.num_layers * mask.shape.num_kv_heads} KV groups) |",
    ]


def _work_rows(result: SearchResult) -> list[str]:
    """What the search evaluated, and the rows only some runs have (racing, the prefix cache,
    refinement, ties, a tie-break)."""
    rows = [
        f"| masks evaluated (distinct masks whose S was computed) | {result.evaluations} ({result.new_evaluations} in the last run; "
        f"{result.pruned} stopped early by racing, with a bound instead of a score) |"
    ]
    if result.work.get("calls"):
        rows.append(
            f"| calibration examples forwarded per S() call | {result.work['examples_per_call']:g} of {result.work['examples_per_full_call']:g} |"
        )
    if "layers_skipped_share" in result.work:
        rows.append(
            f"| decoder-layer computations skipped by the prefix cache | {result.work['layers_skipped_share']:.1%} |"
        )
    if result.stage3_score is not None:
        rows.append(
            f"| S after Stage 3, before refinement | {result.stage3_score:.4f} ({result.stage3_evaluations} masks evaluated by then) |"
        )
    if result.ties is not None:
        rows.append(
            f"| masks the calibration set cannot tell from the found one (as many SWA groups, the same S) | {_ties(result.ties)} |"
        )
    if result.tie_break is not None:
        rows.append(
            f"| tie-break on {', '.join(result.tie_break.tasks)} ({TIE_BREAK_FILE}) | {result.tie_break.message()} |"
        )
    return rows


def _stages_1_and_2(result: SearchResult) -> list[str]:
    """Stage 1's score and Stage 2's drop, weight and ratio per layer, top first, and whether
    Stage 1 saturated."""
    stage1, stage2, anchors = result.stage1_scores, result.stage2, result.anchors
    lines = ["## Stage 1 and Stage 2 (per layer, top first)", ""]
    if result.stage1_probes:
        lines += ["Stage 1 measured each layer alone from the full model (every group of that layer SWA, "
                  "⌈ρG⌉ = G): the `guarded` variant's deviation from Algorithm 1.", ""]  # fmt: skip
    header = (
        "| layer | S, that layer alone SWA (Stage 1 probe) |"
        if result.stage1_probes
        else "| layer | s_best (Stage 1) |"
    )
    rule = "|---|---|"
    if stage2 is not None:
        header += " drop d_l | weight w_l | ratio r_l |"
        rule += "---|---|---|"
    lines += [header, rule]
    for layer in range(result.mask.shape.num_layers - 1, -1, -1):
        row = f"| {layer} | {stage1[layer]:.4f} |"
        if stage2 is not None:
            row += f" {stage2.drops[layer]:.4f} | {stage2.weights[layer]:.3f} | {stage2.ratios[layer]:g} |"
        lines.append(row)
    if stage2 is not None:
        lines += ["", f"Stage 2 assigned {stage2.assigned_groups} SWA groups for a target of {stage2.target_groups}."]
    saturation = stage1_saturation(stage1, anchors.all_full, anchors.higher_is_better)
    return lines + ["", f"{'**Saturated.** ' if saturation.saturated else ''}{saturation.message()}.", ""]


def _subproblems(result: SearchResult) -> list[str]:
    """One row per sub-problem, in search order, and a line per NOMAD crash."""
    lines = [
        "## Sub-problems (in search order)",
        "",
        "A mask asked is one answer an optimizer got, evaluated then or answered from memory (a mask seen before).",
        *(
            []
            if result.best_possible is None
            else [
                f"A sub-problem ends at its first mask with S = {result.best_possible:.4f}, the best the metric can take: "
                "the first of equal scores wins, so no later mask could be chosen."
            ]
        ),
        "",
        "| stage | layers | target ratio | SWA / variables | optimizer | masks asked (stopped early) | S | loss |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for sub in result.subproblems:
        layers = ",".join(map(str, sub.layers))
        method = f"{sub.method} (crashed)" if sub.crash else sub.method
        lines.append(
            f"| {sub.stage} | {layers} | {sub.target_ratio:g} | {sub.converted}/{sub.variables} | {method} "
            f"| {sub.evaluations} ({sub.pruned}) | {sub.score:.4f} | {sub.loss:.4f} |"
        )
    crashed = [sub for sub in result.subproblems if sub.crash]
    if crashed:
        lines.append("")
        lines += [
            f"NOMAD crashed in {sub.stage} layers {','.join(map(str, sub.layers))} after {sub.evaluations} masks asked "
            f"({sub.crash}); the best feasible mask among those evaluated was kept."
            for sub in crashed
        ]
    return lines


def _costs(result: SearchResult) -> list[str]:
    """The S() calls made against the cost model's range (and its range once Stage 2's ratios are known)."""
    shape, settings = result.mask.shape, result.settings
    ratios = result.stage2.ratios if result.stage2 is not None else None
    after = estimate_calls(shape, settings, ratios) if ratios is not None and not settings.refine else None
    return render_cost(result.costs, estimate_calls(shape, settings), after)


def _mask_drawing(mask: HeadMask) -> list[str]:
    """The mask, one row per layer, top first."""
    lines = ["## Mask (F = full attention, S = sliding window; one column per KV group)", "", "```"]
    for layer in range(mask.shape.num_layers - 1, -1, -1):
        lines.append(f"layer {layer:>3}  {''.join('F' if bit else 'S' for bit in mask.bits[layer])}")
    return lines + ["```"]


def _guard(guard: Guard) -> list[str]:
    """The incumbents' scores and what the guard returned (a bound for one racing stopped)."""
    lines = ["## Incumbents", "",
             "Scored before Stage 1; the local search over the whole model ran from the stages' mask and from the best.", "",
             "| incumbent | SWA groups | S |", "|---|---|---|"]  # fmt: skip
    for name, key in guard.incumbents.items():
        value = guard.scores[key]
        shown = f"≤ {value.score:.4f} (stopped early by racing)" if isinstance(value, RaceBound) else f"{value:.4f}"
        lines.append(f"| {name}{' (the best)' if name == guard.best else ''} | {key.count('0')} | {shown} |")
    runs = [
        f"from {lineage.origin}: S {lineage.score:.4f} ({lineage.calls} S() calls at most)"
        for lineage in guard.lineages
    ]
    lines += ["", f"Local search {'; '.join(runs)}.", "", f"The search {guard.message()}.", ""]
    return lines


def _ties(ties: TopTies) -> str:
    racing = f"; {ties.may_tie} more stopped early by racing could at best tie" if ties.may_tie else ""
    return f"{ties.scored} scored to the end{racing}"


def _describe(calibration: Mapping[str, Any]) -> str:
    return ", ".join(f"{key} = {value}" for key, value in calibration.items())
