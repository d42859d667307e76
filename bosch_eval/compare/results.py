"""Read lm-eval output directories back: scores per task/group and per-document values.

Main metric of a task: ``score`` where the task reports it (``bosch_niah``: mean over
lengths), the mean over its per-length metrics (upstream RULER reports only ``"512"``,
``"1024"``, ...; ``-1`` marks a length with no documents), else ``acc``, else its first
metric. Per-document values carry a stratum (the document's length for length-wise
tasks), matching how the score averages them (see :mod:`bosch_eval.compare.paired_ci`).
Tasks the ``bosch`` adapter scored after left truncation (``allow_truncation=true``) are
read from each file's ``config.bosch_truncated``.
"""

from __future__ import annotations

import gzip
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class RunResults:
    """One run's merged lm-eval results (every results_*.json[.gz] under its directory)."""

    results: dict[str, dict[str, Any]] = field(default_factory=dict)
    group_subtasks: dict[str, list[str]] = field(default_factory=dict)
    samples: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)
    # leaf task -> {"documents", "longest_input_tokens", "max_length"}: scored after left truncation
    truncated: dict[str, dict[str, Any]] = field(default_factory=dict)


def read_run(directory: str | Path) -> RunResults:
    """Merge every lm-eval results and samples file below ``directory``.

    Raises:
        FileNotFoundError: no ``results_*.json`` (or ``.json.gz``) below it.
        ValueError: a results or samples file that is not JSON, or a ``.gz`` that is not
            gzip (naming it).
    """
    directory = Path(directory)
    # Committed runs keep their results and samples gzipped (results/, issue 38); lm-eval writes them plain.
    files = sorted([*directory.rglob("results_*.json"), *directory.rglob("results_*.json.gz")])
    if not files:
        raise FileNotFoundError(f"{directory}: no lm-eval results_*.json below it")
    run = RunResults()
    for path in files:
        data = _read_json(path, _read_text(path))
        run.results.update(data.get("results", {}))
        run.group_subtasks.update(data.get("group_subtasks", {}))
        run.config = run.config or data.get("config", {})
        run.truncated.update(_truncated_tasks(data))
    for path in sorted([*directory.rglob("samples_*.jsonl"), *directory.rglob("samples_*.jsonl.gz")]):
        task = path.name[len("samples_") :].rsplit("_", 1)[0]
        run.samples[task] = [_read_json(path, line) for line in _read_text(path).splitlines() if line.strip()]
    return run


def _read_text(path: Path) -> str:
    """The file's text, decompressed if its name ends in ``.gz`` (a ValueError naming it if it is not gzip)."""
    if path.suffix != ".gz":
        return path.read_text()
    try:
        with gzip.open(path, "rt", encoding="utf-8") as handle:
            return handle.read()
    except (OSError, EOFError) as err:
        raise ValueError(f"{path}: not a readable gzip file ({err})") from None


def _truncated_tasks(data: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The file's own leaf tasks that ``config.bosch_truncated`` names.

    An adapter reused across evaluations (``compare`` loads the model once) lists every task
    it truncated so far, so an earlier evaluation's tasks are left to that evaluation's file.
    """
    truncated = (data.get("config") or {}).get("bosch_truncated") or {}
    own = data.get("configs") or data.get("results") or {}
    return {task: info for task, info in truncated.items() if task in own}


def _read_json(path: Path, text: str | None = None) -> Any:
    """``text`` (default: the file's content) as JSON, or a ValueError naming ``path``."""
    try:
        return json.loads(path.read_text() if text is None else text)
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: not valid JSON ({err})") from None


def _metrics(row: dict[str, Any]) -> dict[str, float]:
    out = {}
    for key, value in row.items():
        name = key.split(",")[0]
        if "," in key and not name.endswith("_stderr") and isinstance(value, (int, float)):
            out.setdefault(name, float(value))
    return out


def main_score(row: dict[str, Any]) -> tuple[str, float] | None:
    """``(metric, value)`` of a results row, by the rule in the module docstring."""
    metrics = _metrics(row)
    if not metrics:
        return None
    if "score" in metrics:
        return "score", metrics["score"]
    lengths = {k: v for k, v in metrics.items() if k.isdigit() and v != -1}
    if lengths and all(k.isdigit() for k in metrics):
        return "mean over lengths", math.fsum(lengths.values()) / len(lengths)
    if "acc" in metrics:
        return "acc", metrics["acc"]
    name = next(iter(metrics))
    return name, metrics[name]


def doc_values(samples: list[dict[str, Any]], metric: str) -> dict[tuple[Any, int], float]:
    """``(stratum, doc_id) → value`` of ``metric`` (as :func:`main_score` names it)."""
    values = {}
    for sample in samples:
        if metric == "score" and isinstance(sample.get("score"), list):
            stratum, value = sample["score"]
        elif metric == "mean over lengths":
            stratum = int(sample["doc"]["max_length"])
            value = sample[str(stratum)]
        else:
            stratum, value = None, sample[metric]
        values[(stratum, int(sample["doc_id"]))] = float(value)
    return values
