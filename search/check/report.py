"""calib-check's report: the panel's scores summarized per ratio (``check.json``) and rendered (``report.md``)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from bosch_eval.runtime.versions import versions
from bosch_eval.search.check.panel import SOLVABLE, PanelMask, RatioSummary, layer_drops, summarize
from bosch_eval.search.check.scores import calib_side


def make_report(
    panel: list[PanelMask], scores: dict[str, dict[str, float]], settings: dict[str, Any], command: str
) -> dict[str, Any] | None:
    """The check's report from the masks scored on both sides so far: the probes among them, and
    only the ratios whose masks are all scored (a verdict on part of a ratio's panel would be
    another test). None until both anchors are scored on both sides."""
    metrics = settings.get("calib_metric", "acc")
    metrics = [metrics] if isinstance(metrics, str) else list(metrics)
    sides = [scores.get(calib_side(metric, metrics), {}) for metric in metrics] + [scores["dev"]]
    calib, dev = sides[0], sides[-1]
    scored = [item for item in panel if all(item.name in side for side in sides)]
    names = {item.name for item in scored}
    if not {"full", "all-swa"} <= names:
        return None
    unfinished = {item.ratio for item in panel if item.name not in names}
    reported = [item for item in scored if item.ratio is None or item.ratio not in unfinished]
    done = sum(item.name in side for item in panel for side in sides)
    # Whether the model can do the task at all is the headline metric's question (an answer's
    # probability under full attention says nothing of the kind: 0.55 on SmolLM2 that answers all).
    solvable = -math.inf if calib["full"] >= SOLVABLE else math.inf
    by_metric = {
        metric: {"ratios": [_summary_json(summary) for summary in summarize(reported, side, dev, solvable=solvable)],
                 "masks": {item.name: side[item.name] for item in scored}}
        for metric, side in zip(metrics[1:], sides[1:-1], strict=True)
    }  # fmt: skip
    return {
        "command": command,
        "versions": versions("bosch-eval", "lm_eval", "torch", "transformers"),
        "settings": settings,
        "status": "complete" if done == len(sides) * len(panel) else f"partial: {done} of {len(sides) * len(panel)} scores",
        "full": {"calib": calib["full"], "dev": dev["full"]},
        "all_swa": {"calib": calib["all-swa"], "dev": dev["all-swa"]},
        "layer_drops": {"calib": layer_drops(reported, calib), "dev": layer_drops(reported, dev)},
        "ratios": [_summary_json(summary) for summary in summarize(reported, calib, dev)],
        "masks": [{"name": item.name, "kind": item.kind, "ratio": item.ratio, "calib": calib[item.name], "dev": dev[item.name]} for item in scored],
        **({"by_metric": by_metric} if by_metric else {}),
    }  # fmt: skip


def render(report: dict[str, Any]) -> str:
    settings = report["settings"]
    metrics = settings.get("calib_metric", "acc")
    headline = metrics if isinstance(metrics, str) else metrics[0]
    lines = [
        f"$ {report['command']}", "", f"versions: {json.dumps(report['versions'])}", "",
        *_partial_note(report.get("status", "complete")),
        f"calibration `{settings['calib']}` {json.dumps(settings['calib_metadata'])} scored by "
        f"`{headline}`; development `{settings['dev']}` scored by `{settings.get('dev_metric', 'acc')}` "
        f"{json.dumps(settings['dev_metadata'])}; SWA groups see {settings.get('sink', 0)} sink positions besides their window",
        "", f"S(full) calib {report['full']['calib']:.3f} / dev {report['full']['dev']:.3f}; "
        f"S(all SWA) calib {report['all_swa']['calib']:.3f} / dev {report['all_swa']['dev']:.3f}", "",
        *_layer_drops(report["layer_drops"]),
        "| ratio | masks | random spread (calib) | share ≥ S(full) | at the floor on both sides | Spearman calib~dev, off the floor [95% CI] | top regret (dev) | verdict |",
        "|---|---|---|---|---|---|---|---|",
    ]  # fmt: skip
    lines += map(_ratio_row, report["ratios"])
    lines += _other_metrics(report.get("by_metric", {}), headline)
    lines += [
        "",
        "At the floor: masks that score at or below S(all SWA) on both tasks; Spearman and the verdict leave "
        "them out (they agree by having nothing to order), and most of a ratio's masks there is "
        '"saturated at the floor".',
        "",
        "Top regret: the best dev score at the ratio minus the dev score of the calibration's favourite mask "
        "(the mean over equal favourites): what a search that finds that favourite gives up on the dev task.",
        "",
    ]
    others = report.get("by_metric", {})
    lines += ["| mask | ratio | calib | " + "".join(f"calib {metric} | " for metric in others) + "dev |",
              "|---|---|---|" + "---|" * len(others) + "---|"]  # fmt: skip
    for m in report["masks"]:
        extra = "".join(f"{other['masks'][m['name']]:.4f} | " for other in others.values())
        lines.append(
            f"| {m['name']} | {m['ratio'] if m['ratio'] is not None else ''} | {m['calib']:.3f} | {extra}{m['dev']:.3f} |"
        )
    return "\n".join(lines) + "\n"


def _ratio_row(row: dict[str, Any]) -> str:
    low, high = row["ci"]
    return (
        f"| {row['ratio']} | {row['masks']} | {row['random_spread']:.3f} | {row['saturated_share']:.2f} | "
        f"{row['floor_tied']} | {_number(row['spearman'])} [{_number(low)}, {_number(high)}] | {row['top_regret']:.3f} | **{row['verdict']}** |"
    )


def _other_metrics(by_metric: dict[str, Any], headline: str) -> list[str]:
    """The same table for every calibration metric besides the headline, read from the same evaluations."""
    lines = []
    for metric, summary in by_metric.items():
        lines += ["", f"Scored by `{metric}` instead of `{headline}` (the same evaluations, the same dev scores; "
                  f"whether the model can do the task at all is `{headline}`'s verdict):", "",
                  "| ratio | masks | random spread (calib) | share ≥ S(full) | at the floor on both sides | Spearman calib~dev, off the floor [95% CI] | top regret (dev) | verdict |",
                  "|---|---|---|---|---|---|---|---|", *map(_ratio_row, summary["ratios"])]  # fmt: skip
    return lines


def _layer_drops(drops: dict[str, dict[int, float]]) -> list[str]:
    if not drops["calib"]:  # --no-probes, or none scored yet
        return []
    return [
        "Layer drops, S(full) − S(layer all SWA) (Stage 1's view):", "",
        "| layer | " + " | ".join(str(layer) for layer in drops["calib"]) + " |",
        "|---|" + "---|" * len(drops["calib"]),
        *(f"| {side} | " + " | ".join(f"{drop:+.3f}" for drop in drops[side].values()) + " |" for side in ("calib", "dev")),
        "",
    ]  # fmt: skip


def _partial_note(status: str) -> list[str]:
    if status == "complete":
        return []
    return [
        f"**Partial check** ({status}): the probes and the ratios whose masks are all scored so far; "
        "the check resumes from `scores.jsonl`.",
        "",
    ]


def _summary_json(summary: RatioSummary) -> dict[str, Any]:
    return {"ratio": summary.ratio, "masks": summary.masks, "random_spread": summary.random_spread,
            "saturated_share": summary.saturated_share, "spearman": _finite(summary.spearman),
            "ci": [_finite(value) for value in summary.ci], "top_regret": summary.top_regret,
            "floor_tied": summary.floor_tied, "verdict": summary.verdict}  # fmt: skip


def _plain(value: Any) -> Any:
    return str(value) if isinstance(value, Path) else value


def _finite(value: float) -> float | None:
    return None if math.isnan(value) else value


def _number(value: float | None) -> str:
    return "n/a" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.2f}"
