"""``bosch-eval calib-check``: score the check's panel of masks on a calibration and a dev task.

    bosch-eval calib-check --model toy-l --calib bosch_niah_calib --dev bosch_niah_dev \
        --dev-metadata '{"dev_lengths": [512, 1024]}' --ranking fisher=fisher.json --out check

Every score is appended to ``<out>/scores.jsonl`` as it is made, so a killed check resumes
where it stopped when run again with the same settings (``<out>/settings.json``); other
settings on that ``--out`` are refused unless ``--new-settings`` (the old files then move to
``<out>/previous/``). ``check.json`` and ``report.md`` (the command and versions first) are
rewritten as scores arrive, marked partial until every mask is scored: a check that takes a
day on a CPU shows each ratio's verdict as soon as that ratio's masks are all scored.
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bosch_eval.masks.head_mask import HeadMask, HeadRanking, check_ratio, check_sinks
from bosch_eval.models.model_identity import portable_name
from bosch_eval.runtime.digests import file_digest
from bosch_eval.runtime.errors import CalibCheckError
from bosch_eval.runtime.outdir_lock import OutputLock
from bosch_eval.runtime.previous_results import keep_aside
from bosch_eval.runtime.versions import versions
from bosch_eval.search.defaults import DEFAULT_CALIB_METRIC, DEFAULT_CALIB_TASK

if TYPE_CHECKING:
    from bosch_eval.search.calib_check import PanelMask, RatioSummary
    from bosch_eval.search.objective.objective import CalibrationObjective

DEFAULT_DEV = "bosch_niah_dev"
CHECK_FILES = ("scores.jsonl", "check.json", "report.md", "settings.json")  # what --new-settings keeps aside

# What --help shows (the module docstring is for the code: its markup would print as is).
DESCRIPTION = """\
Score one panel of masks on a calibration task and on a development task, per SWA ratio, and
say whether the calibration ranks masks the way the development split does.

example:
  bosch-eval calib-check --model toy-l --calib bosch_niah_calib --dev bosch_niah_dev \\
      --dev-metadata '{"dev_lengths": [512, 1024]}' --ranking fisher=fisher.json --out check

Every score is appended to OUT/scores.jsonl as it is made: a killed check, run again with the
same settings, resumes where it stopped. Other settings on the same --out are refused unless
--new-settings is given (the old files then move to OUT/previous/). OUT/check.json and
OUT/report.md are rewritten as scores arrive, marked partial until every mask is scored; a
ratio's verdict appears once all its masks are scored.
"""


def add_calib_check_parser(subparsers: Any) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "calib-check",
        help="is a calibration set fit for the search? masks scored on it and on a dev split, per ratio",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--model",
        required=True,
        help="HF id or local directory; toy / toy-l are the bundled models, smollm2 the packaged one, or a .gguf file",
    )
    parser.add_argument("--calib", default=DEFAULT_CALIB_TASK, help=f"calibration task (default {DEFAULT_CALIB_TASK})")
    parser.add_argument("--calib-metadata", type=json.loads, default={}, help="JSON metadata for the calibration task")
    parser.add_argument(
        "--calib-metric",
        nargs="+",
        default=[DEFAULT_CALIB_METRIC],
        help=f"metric of the calibration task, as the search's --calib-metric (default {DEFAULT_CALIB_METRIC}); several (e.g. acc acc_tiebreak "
        "prob) are read from the same evaluation of each mask and each gets its Spearman and verdict, the first the headline",
    )
    parser.add_argument(
        "--dev", default=DEFAULT_DEV, help=f"development task, never the test set (default {DEFAULT_DEV})"
    )
    parser.add_argument("--dev-metadata", type=json.loads, default={}, help="JSON metadata for the dev task")
    parser.add_argument(
        "--dev-metric", default="acc", help="metric of the dev task (default acc; score for bosch_niah_dev_gen)"
    )
    parser.add_argument(
        "--dev-gen-kwargs",
        type=json.loads,
        default={},
        help="JSON generation settings of a generation-scored dev task, e.g. '{\"max_gen_toks\": 64}'",
    )
    parser.add_argument("--ratios", type=float, nargs="+", default=[0.5, 0.75, 0.875], help="SWA ratios to check")
    parser.add_argument("--random", type=int, default=20, help="random masks per ratio")
    parser.add_argument(
        "--ranking", action="append", default=[], metavar="NAME=FILE", help="a bosch-ranking/1 file (repeatable)"
    )
    parser.add_argument(
        "--mask", action="append", default=[], metavar="NAME=FILE", help="a bosch-mask/1 file to place (repeatable)"
    )
    parser.add_argument("--window", type=int, help="SWA window (default: the model's bosch_defaults.json)")
    parser.add_argument(
        "--sink",
        type=int,
        help="attention-sink positions every SWA query also sees, for every mask scored (default 0, as the paper's SWA)",
    )
    parser.add_argument("--calib-len", type=int, help="calibration length in tokens (default: bosch_defaults.json)")
    parser.add_argument("--calib-examples", type=int, help="calibration examples (default 64)")
    parser.add_argument("--device", help="cpu or cuda (default: cuda when torch sees a GPU, else cpu)")
    parser.add_argument("--batch-size", type=int, default=8, help="lm-eval batch size")
    parser.add_argument("--dtype", help="model dtype, e.g. bfloat16 (default: the checkpoint's); use the search's")
    parser.add_argument(
        "--no-probes",
        action="store_true",
        help="leave out the one-layer probes (the layer drops, two scores per layer) when only the ratios' verdicts are wanted",
    )
    parser.add_argument(
        "--out", type=Path, required=True, help="output directory (a killed check resumes there with the same settings)"
    )
    parser.add_argument(
        "--dev-scores-from",
        type=Path,
        metavar="CHECK",
        help="take the dev scores of the same masks from another check's output directory, made with the same "
        "model, dev task, window, dtype, sinks and mask files (a check of another calibration set or metric "
        "then scores only its calibration side)",
    )
    parser.add_argument(
        "--new-settings",
        action="store_true",
        help="--out holds a check made with other settings: move its files to --out/previous/ and start afresh "
        "(without it, such a check is refused)",
    )
    parser.set_defaults(run=run_from_args)
    return parser


def run_from_args(args: argparse.Namespace) -> None:
    # The check itself: numpy, torch, lm-eval, not for --help.
    from bosch_eval.search.calib_check import build_panel
    from bosch_eval.search.objective.objective import CalibrationObjective
    from bosch_eval.search.objective.objective_loading import CalibrationSettings, LoadSettings, build_objective

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
        _pin_settings(args.out, settings, args.new_settings, check_only=True)  # before the model loads
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
            calib.lm, [args.dev], metadata={**_model_metadata(calib), **args.dev_metadata}, metric=args.dev_metric,
            gen_kwargs=args.dev_gen_kwargs,
        )  # fmt: skip
        panel = build_panel(
            calib.shape, calib.lm.head_mask.window, ratios, rankings, args.random, given, probes=not args.no_probes
        )
        # Only once the tasks and masks are known to be good.
        _pin_settings(args.out, settings, args.new_settings)
        command = " ".join(["bosch-eval", *map(shlex.quote, args.argv)])
        if shared_files is not None:
            shared = {item.name for item in panel if _scored_alike(item, shared_files)}
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


def calib_side(metric: str, metrics: list[str]) -> str:
    """A calibration metric's side in ``scores.jsonl``: ``calib`` for the first (the headline,
    as every check before several metrics wrote it), ``calib:METRIC`` for the others."""
    return "calib" if metric == metrics[0] else f"calib:{metric}"


class SharedEvaluation:
    """The calibration side's metrics from one evaluation per mask: ``score_panel`` asks for a
    mask's sides one after another, and the model runs on the first of them only."""

    def __init__(self, objective: CalibrationObjective, metrics: list[str]) -> None:
        self.objective, self.metrics = objective, list(metrics)
        self._mask: object = None
        self._scores: dict[str, float] = {}

    def side(self, metric: str) -> Callable[[Any], float]:
        def score(mask: Any) -> float:
            if len(self.metrics) == 1:
                return self.objective(mask)
            if mask is not self._mask:
                self._scores, self._mask = self.objective.scores(mask, self.metrics), mask
            return self._scores[metric]

        return score


def check_settings(
    args: argparse.Namespace, rankings: list[tuple[str, str]], masks: list[tuple[str, str]]
) -> dict[str, Any]:
    """What decides the check's scores, pinned in ``settings.json``: the model by its name (a
    bundled model's alias, wherever the checkout lies), ranking and mask files by content."""
    settings = {key: getattr(args, key) for key in (
        "calib", "calib_metadata", "dev", "dev_metadata", "ratios", "random", "window", "calib_len", "calib_examples")}  # fmt: skip
    if args.dtype is not None:  # absent from checks made before --dtype existed, which resume unchanged
        settings["dtype"] = args.dtype
    if args.no_probes:  # likewise
        settings["probes"] = False
    if args.sink is not None:  # likewise (before --sink, every check ran without sinks)
        settings["sink"] = args.sink
    if args.calib_metric != ["acc"]:  # likewise (before --calib-metric, every check scored acc)
        settings["calib_metric"] = args.calib_metric[0] if len(args.calib_metric) == 1 else args.calib_metric
    if args.dev_metric != "acc":  # likewise (before --dev-metric, every dev task was scored by acc)
        settings["dev_metric"] = args.dev_metric
    if args.dev_gen_kwargs:  # likewise
        settings["dev_gen_kwargs"] = args.dev_gen_kwargs
    settings["model"] = portable_name(args.model)
    settings["ranking"] = {name: {"sha256": file_digest(path)} for name, path in rankings}
    settings["mask"] = {name: {"sha256": file_digest(path)} for name, path in masks}
    return settings


# The settings a dev score depends on, besides the mask: two checks that agree on them score
# a mask of the same name and file alike on the dev side.
DEV_SETTINGS = ("model", "dev", "dev_metadata", "dev_metric", "dev_gen_kwargs", "window", "dtype", "sink")


def check_dev_source(source: Path, settings: dict[str, Any]) -> dict[str, set[str]]:
    """Refuse ``--dev-scores-from`` a check whose dev scores this check's would not equal:
    other dev settings, or a ranking or mask file of the same name with other content.
    Returns the names of this check's rankings and masks that the source had too (by content):
    only their masks, and the generated ones, may take the source's dev scores."""
    path = source / "settings.json"
    for needed in (path, source / "scores.jsonl"):
        if not needed.is_file():
            raise CalibCheckError(
                f"--dev-scores-from: {needed} does not exist; expected the output directory of a calib-check"
            )
    theirs = _comparable(json.loads(path.read_text()))
    changed = [key for key in DEV_SETTINGS if settings.get(key) != theirs.get(key)]
    for key in ("ranking", "mask"):
        changed += [
            f"{key} {name}" for name, digest in settings[key].items() if theirs.get(key, {}).get(name, digest) != digest
        ]
    if changed:
        raise CalibCheckError(
            f"--dev-scores-from: {path} was made with other dev settings ({', '.join(changed)}); its dev scores do not apply"
        )
    return {
        key: {name for name, digest in settings[key].items() if theirs.get(key, {}).get(name) == digest}
        for key in ("ranking", "mask")
    }


def _scored_alike(item: PanelMask, shared_files: dict[str, set[str]]) -> bool:
    """Whether the source check scored this panel mask: a generated one, or one from a file it shared."""
    if item.kind == "ranking":
        return item.name.rsplit("-r", 1)[0] in shared_files["ranking"]
    if item.kind == "given":
        return item.name in shared_files["mask"]
    return True


def copy_dev_scores(source: Path, journal: Path, names: set[str]) -> None:
    """Append to ``journal`` the dev scores in ``source`` of the masks in ``names`` that it has
    no dev score for yet (a resumed run copies nothing twice)."""
    have = set()
    if journal.is_file():
        have = {
            record["name"] for record in map(json.loads, journal.read_text().splitlines()) if record["side"] == "dev"
        }
    copied = [record for record in map(json.loads, source.read_text().splitlines())
              if record["side"] == "dev" and record["name"] in names - have]  # fmt: skip
    with journal.open("a") as out:
        out.writelines(json.dumps(record) + "\n" for record in copied)


def score_panel(
    panel: list[PanelMask],
    objectives: dict[str, Callable[[HeadMask], float]],
    journal: Path,
    on_scores: Callable[[dict[str, dict[str, float]]], None] | None = None,
) -> dict[str, dict[str, float]]:
    """Every panel mask's score on every objective, resumed from and appended to ``journal``;
    ``on_scores`` sees the scores once the journal is read and after each new score."""
    from tqdm import tqdm

    scores: dict[str, dict[str, float]] = {side: {} for side in objectives}
    if journal.is_file():
        for line in journal.read_text().splitlines():
            record = json.loads(line)
            scores.setdefault(record["side"], {})[record["name"]] = record["score"]
    todo = [(item, side) for item in panel for side in objectives if item.name not in scores[side]]
    if on_scores is not None:
        on_scores(scores)
    with (
        journal.open("a") as out,
        tqdm(
            total=len(panel) * len(objectives), initial=len(panel) * len(objectives) - len(todo), desc="calib-check"
        ) as bar,
    ):
        for item, side in todo:
            score = objectives[side](item.mask)
            scores[side][item.name] = score
            out.write(json.dumps({"side": side, "name": item.name, "score": score}) + "\n")
            out.flush()
            bar.update()
            if on_scores is not None:
                on_scores(scores)
    return scores


def make_report(
    panel: list[PanelMask], scores: dict[str, dict[str, float]], settings: dict[str, Any], command: str
) -> dict[str, Any] | None:
    """The check's report from the masks scored on both sides so far: the probes among them, and
    only the ratios whose masks are all scored (a verdict on part of a ratio's panel would be
    another test). None until both anchors are scored on both sides."""
    from bosch_eval.search.calib_check import SOLVABLE, layer_drops, summarize  # numpy: not for --help

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


def _pin_settings(out: Path, settings: dict[str, Any], new_settings: bool, check_only: bool = False) -> None:
    """The first run pins its settings; a later run with other settings is refused, naming
    them, unless ``new_settings``: then the old check's files move to ``out/previous/``.
    ``check_only``: refuse, but move and write nothing (before the model loads: settings are
    pinned only once the tasks and masks are known to be good)."""
    path = out / "settings.json"
    pinned = _comparable(json.loads(path.read_text())) if path.is_file() else None
    if pinned is not None:
        changed = sorted(key for key in settings.keys() | pinned.keys() if settings.get(key) != pinned.get(key))
        if not changed:
            return
        if not new_settings:
            raise CalibCheckError(
                f"{path}: this output directory was made with other settings ({', '.join(changed)}); use another --out, "
                "or pass --new-settings to keep the old check in previous/ and start afresh"
            )
    if check_only:
        return
    if pinned is not None:
        keep_aside(out, CHECK_FILES, pinned)
    path.write_text(json.dumps(settings, indent=1) + "\n")


def _comparable(pinned: dict[str, Any]) -> dict[str, Any]:
    """Pinned settings as this version writes them: a bundled model's path becomes its alias,
    and files an older bosch-eval pinned as ``NAME=PATH`` are read where they were named
    (one that is gone cannot match)."""
    pinned = dict(pinned)
    if isinstance(pinned.get("model"), str):
        pinned["model"] = portable_name(pinned["model"])
    for key in ("ranking", "mask"):
        if isinstance(pinned.get(key), list):
            named = (item.partition("=")[::2] for item in pinned[key])
            pinned[key] = {
                name: {"sha256": file_digest(path)} if Path(path).is_file() else {"file": path} for name, path in named
            }
    return pinned


def _named_files(items: list[str], flag: str) -> list[tuple[str, str]]:
    pairs = []
    for item in items:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise CalibCheckError(f"{flag}: expected NAME=FILE, got {item!r}")
        pairs.append((name, path))
    return pairs


def _model_metadata(objective: CalibrationObjective) -> dict[str, Any]:
    """The tokenizer/model keys the dev task sizes its prompts with (as the calibration got them)."""
    return {key: objective.metadata[key] for key in ("pretrained", "tokenizer") if key in objective.metadata}


def _plain(value: Any) -> Any:
    return str(value) if isinstance(value, Path) else value


def _finite(value: float) -> float | None:
    return None if math.isnan(value) else value


def _number(value: float | None) -> str:
    return "n/a" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.2f}"
