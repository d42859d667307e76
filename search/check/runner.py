"""One calib-check, from its command line's arguments: the panel built and checked before the model loads,
then scored on the calibration set and the dev split, resumably, the report rewritten after each score."""

from __future__ import annotations

import argparse
import json
import shlex

from bosch_eval.masks.head_mask import HeadMask, HeadRanking, check_ratio, check_sinks
from bosch_eval.runtime.errors import CalibCheckError
from bosch_eval.runtime.outdir_lock import OutputLock
from bosch_eval.search.objective.calibration import CalibrationObjective
from bosch_eval.search.objective.defaults import default_calib_task
from bosch_eval.search.objective.loading import CalibrationSettings, LoadSettings, build_objective
from bosch_eval.search.check.panel import build_panel
from bosch_eval.search.check.report import make_report, render
from bosch_eval.search.check.scores import (
    SharedEvaluation,
    calib_side,
    check_dev_source,
    check_settings,
    copy_dev_scores,
    model_metadata,
    pin_settings,
    score_panel,
    scored_alike,
)


def run_check(args: argparse.Namespace) -> None:
    """Run ``bosch-eval calib-check`` with its parsed ``args``; raises a ``BoschError`` on any bad input."""
    args.calib = args.calib or default_calib_task(args.model)  # pinned in settings.json as resolved
    ratios = [check_ratio(ratio, "--ratios") for ratio in args.ratios]
    if args.random < 2:
        raise CalibCheckError(
            f"--random: expected at least 2 random masks per ratio (their spread is reported), got {args.random}"
        )
    if args.sink is not None:
        check_sinks(args.sink, "--sink")
    if len(set(args.calib_metric)) != len(args.calib_metric):
        raise CalibCheckError(f"--calib-metric: expected distinct metric names, got {args.calib_metric}")
    ranking_files, mask_files = _named_files(args.ranking, "--ranking"), _named_files(args.mask, "--mask")
    rankings = {name: HeadRanking.load(path) for name, path in ranking_files}
    given = {name: HeadMask.load(path) for name, path in mask_files}
    settings = check_settings(args, ranking_files, mask_files)
    shared_files = check_dev_source(args.dev_scores_from, settings) if args.dev_scores_from is not None else None
    args.out.mkdir(parents=True, exist_ok=True)
    with OutputLock(args.out, "calib-check", CalibCheckError):
        pin_settings(args.out, settings, args.new_settings, check_only=True)  # before the model loads
        calib = build_objective(
            args.model,
            CalibrationSettings(
                tasks=(args.calib,),
                metric=args.calib_metric[0],
                length=args.calib_len,
                examples=args.calib_examples,
                metadata=args.calib_metadata,
            ),  # fmt: skip
            LoadSettings(
                window=args.window,
                device=args.device,
                batch_size=args.batch_size,
                dtype=args.dtype,
                model_args={"sink": args.sink} if args.sink is not None else None,
            ),  # fmt: skip
        )
        dev = CalibrationObjective(
            calib.lm, [args.dev], metadata={**model_metadata(calib), **args.dev_metadata}, metric=args.dev_metric,
            gen_kwargs=args.dev_gen_kwargs,
        )  # fmt: skip
        panel = build_panel(
            calib.shape, calib.lm.head_mask.window, ratios, rankings, args.random, given, probes=not args.no_probes
        )
        # Only once the tasks and masks are known to be good.
        pin_settings(args.out, settings, args.new_settings)
        command = " ".join(["bosch-eval", *map(shlex.quote, args.argv)])
        if shared_files is not None:
            shared = {item.name for item in panel if scored_alike(item, shared_files)}
            copy_dev_scores(args.dev_scores_from / "scores.jsonl", args.out / "scores.jsonl", shared)

        def write_report(scores: dict[str, dict[str, float]]) -> None:
            report = make_report(panel, scores, settings, command)
            if report is not None:
                (args.out / "check.json").write_text(json.dumps(report, indent=1) + "\n")
                (args.out / "report.md").write_text(render(report))

        calib_sides = SharedEvaluation(calib, args.calib_metric)
        objectives = {calib_side(metric, args.calib_metric): calib_sides.side(metric) for metric in args.calib_metric}
        scores = score_panel(panel, {**objectives, "dev": dev}, args.out / "scores.jsonl", on_scores=write_report)
    print(render(make_report(panel, scores, settings, command)))


def _named_files(items: list[str], flag: str) -> list[tuple[str, str]]:
    pairs = []
    for item in items:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise CalibCheckError(f"{flag}: expected NAME=FILE, got {item!r}")
        pairs.append((name, path))
    return pairs
