"""calib-check's scores: what a check is pinned to (``settings.json``), the panel scored on each side
(``scores.jsonl``, resumed), and dev scores taken from another check made under the same dev settings."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bosch_eval.masks.head_mask import HeadMask
from bosch_eval.models.model_identity import portable_name
from bosch_eval.runtime.digests import file_digest
from bosch_eval.runtime.errors import CalibCheckError
from bosch_eval.runtime.previous_results import keep_aside

if TYPE_CHECKING:
    from bosch_eval.search.check.panel import PanelMask
    from bosch_eval.search.objective.calibration import CalibrationObjective


CHECK_FILES = ("scores.jsonl", "check.json", "report.md", "settings.json")  # what --new-settings keeps aside


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
    theirs = comparable(json.loads(path.read_text()))
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


def scored_alike(item: PanelMask, shared_files: dict[str, set[str]]) -> bool:
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


def pin_settings(out: Path, settings: dict[str, Any], new_settings: bool, check_only: bool = False) -> None:
    """The first run pins its settings; a later run with other settings is refused, naming
    them, unless ``new_settings``: then the old check's files move to ``out/previous/``.
    ``check_only``: refuse, but move and write nothing (before the model loads: settings are
    pinned only once the tasks and masks are known to be good)."""
    path = out / "settings.json"
    pinned = comparable(json.loads(path.read_text())) if path.is_file() else None
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


def comparable(pinned: dict[str, Any]) -> dict[str, Any]:
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


def model_metadata(objective: CalibrationObjective) -> dict[str, Any]:
    """The tokenizer/model keys the dev task sizes its prompts with (as the calibration got them)."""
    return {key: objective.metadata[key] for key in ("pretrained", "tokenizer") if key in objective.metadata}
