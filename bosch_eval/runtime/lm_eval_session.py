"""lm-eval session helpers shared by the search's objective, compare and the scripts:
task loading (a TaskManager that skips lm-eval's own ~11 s index when it can; tasks built
with the global generators seeded as ``simple_evaluate`` seeds them), the reversible
patches around a repeated ``evaluate`` call (generators kept, quiet logging, no per-task
context bars, templates compiled once) and the metric helpers (direction and value of a
``name`` or ``name,filter`` metric in lm-eval's results).

Core, layer 1 (docs/conventions.md#layers): it imports lm-eval, torch and our tasks folder's
location, nothing of search or the adapter.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import logging
import random
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from bosch_eval.runtime.errors import LmEvalError
from bosch_eval.runtime.nltk_offline import nltk_download_explained

if TYPE_CHECKING:
    from lm_eval.tasks import TaskDict, TaskManager

FEWSHOT_SEED = 1234  # simple_evaluate's default fewshot_random_seed (lm_eval.defaults)


def bundled_tasks_dir() -> str:
    """The folder of bosch-eval's own lm-eval tasks, located without importing it: the tasks
    sit above the core (their code imports it), so importing them here would be a circle."""
    spec = importlib.util.find_spec("bosch_eval.tasks")
    assert spec is not None and spec.submodule_search_locations, "bosch_eval.tasks is part of this distribution"
    return str(next(iter(spec.submodule_search_locations)))


def task_manager(tasks: Sequence[str], include_path: str | None, metadata: Mapping[str, Any]) -> TaskManager:
    """A TaskManager that knows ``tasks``; lm-eval's own ~11 s index only when needed."""
    from lm_eval.tasks import TaskManager

    paths = [bundled_tasks_dir()] + ([include_path] if include_path else [])
    light = TaskManager(include_path=paths, include_defaults=False, metadata=dict(metadata))
    if all(name in light.all_tasks or Path(name).is_file() for name in tasks):
        return light
    manager = TaskManager(include_path=paths, metadata=dict(metadata))
    unknown = [name for name in tasks if name not in manager.all_tasks and not Path(name).is_file()]
    if unknown:
        where = f" or in {include_path}" if include_path else " (add --include-path for your own)"
        raise LmEvalError(f"tasks: {unknown} are not lm-eval tasks, groups or tags{where}")
    return manager


def load_task(manager: TaskManager, name: str, doc_seed: int | None = None) -> TaskDict:
    """``manager.load([name])`` with the global generators seeded as ``simple_evaluate`` seeds them.

    lm-eval's RULER tasks draw their needles from Python's global ``random`` while they build
    their documents: built without a seed, every process scores other documents (a resumed
    search, a comparison resumed with more entries, two leaderboards of one YAML). Seeded per
    task name, a task's documents do not depend on which tasks are built before it. The
    caller's generator state is restored afterwards.

    Args:
        doc_seed: the seed of that draw (None: ``simple_evaluate``'s, the tasks' default
            documents); another seed is another draw of documents, e.g. a fresh test split.
    """
    from lm_eval.defaults import DEFAULT_OTHER_SEED, DEFAULT_RANDOM_SEED

    with global_rng_kept(), nltk_download_explained():  # RULER's import-time nltk.download, offline
        random.seed(DEFAULT_RANDOM_SEED if doc_seed is None else doc_seed)
        np.random.seed(DEFAULT_OTHER_SEED)
        torch.manual_seed(DEFAULT_OTHER_SEED)
        return manager.load([name])


def merge_task_dicts(loaded: Iterable[TaskDict]) -> TaskDict:
    tasks: dict[str, Any] = {}
    groups: dict[str, Any] = {}
    group_map: dict[str, list[str]] = {}
    for part in loaded:
        tasks.update(part["tasks"])
        groups.update(part.get("groups", {}))
        group_map.update(part.get("group_map", {}))
    return {"tasks": tasks, "groups": groups, "group_map": group_map}


def metric_direction(tasks: Mapping[str, Any], metric: str) -> bool:
    """lm-eval's ``higher_is_better`` of ``metric`` (``name`` or ``name,filter``), the same in every task.

    A task's ``higher_is_better()`` holds its ``metric_list`` entry's value, or lm-eval's
    registry default for a metric it knows; a metric with neither cannot be optimized.
    """
    name = metric.split(",")[0]
    directions: dict[str, bool] = {}
    for task_name, task in tasks.items():
        declared = task.higher_is_better() or {}
        if name not in declared:
            raise LmEvalError(
                f"metric: task {task_name!r} computes no {name!r} (its metrics: {sorted(declared)}); "
                "pass --calib-metric with one of those"
            )
        direction = declared[name]
        if not isinstance(direction, bool):
            raise LmEvalError(
                f"metric: {name!r} of task {task_name!r} declares no higher_is_better (got {direction!r}), so the search "
                "cannot tell whether to raise or lower it; set 'higher_is_better' in the task's metric_list entry"
            )
        directions[task_name] = direction
    if len(set(directions.values())) > 1:
        raise LmEvalError(
            f"metric: {name!r} is higher-is-better in some calibration tasks and not in others: {directions}"
        )
    return next(iter(directions.values()))


def metric_value(row: Mapping[str, Any], metric: str) -> float | None:
    """``row[metric]`` for ``name,filter``; for a bare name, its only filter's value."""
    if "," in metric:
        value = row.get(metric)
    elif f"{metric},none" in row:
        value = row[f"{metric},none"]
    else:
        keys = [key for key in row if key.split(",")[0] == metric]
        if len(keys) > 1:
            raise LmEvalError(f"metric: {metric!r} is reported under several filters {sorted(keys)}; name one")
        value = row[keys[0]] if keys else None
    if value is None or isinstance(value, str):
        return None
    return float(value)


@contextlib.contextmanager
def global_rng_kept() -> Iterator[None]:
    """Restore Python's, numpy's and torch's global generators afterwards: the search draws
    from its own generators, and a task that seeds or draws must not change them."""
    python, numpy_state, cpu = random.getstate(), np.random.get_state(), torch.get_rng_state()
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
    try:
        yield
    finally:
        random.setstate(python)
        np.random.set_state(numpy_state)
        torch.set_rng_state(cpu)
        if cuda is not None:
            torch.cuda.set_rng_state_all(cuda)


@contextlib.contextmanager
def no_context_bars() -> Iterator[None]:
    """No "building contexts" bar per task and call: lm-eval 0.4.13 draws one in
    ``Task.build_all_requests`` with no switch to turn it off, and thousands of them would
    tangle with the search's stage bar. The module's ``tqdm`` is swapped for a disabled
    one during the call and restored after it."""
    import lm_eval.api.task as task_module

    bar = task_module.tqdm
    task_module.tqdm = functools.partial(bar, disable=True)
    try:
        yield
    finally:
        task_module.tqdm = bar


@contextlib.contextmanager
def templates_compiled_once() -> Iterator[None]:
    """lm-eval 0.4.13 compiles a task's Jinja templates (``doc_to_text``, ``doc_to_target``)
    again for every document of every call (``utils.apply_template``: ``env.from_string``),
    ~2 ms each, 8% of a toy-model call. During the call, each template string is compiled
    once, in lm-eval's own environment, and rendered as lm-eval renders it."""
    import lm_eval.utils as utils

    apply = utils.apply_template
    compiled = functools.lru_cache(maxsize=256)(utils.env.from_string)
    utils.apply_template = lambda template, doc: compiled(template).render(**doc)
    try:
        yield
    finally:
        utils.apply_template = apply


@contextlib.contextmanager
def quiet(logger_name: str) -> Iterator[None]:
    """lm-eval logs a few INFO lines per evaluation; thousands of calls would bury the search's log."""
    logger = logging.getLogger(logger_name)
    level = logger.level
    logger.setLevel(max(level, logging.WARNING))
    try:
        yield
    finally:
        logger.setLevel(level)
