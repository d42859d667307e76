"""The calibration sets, found by reading the task YAMLs: no list to edit for a new one.

A calibration set is a task whose YAML takes its documents (``custom_dataset``) from a
generator module that also defines ``calibration_examples(metadata, tokenizer)``: its YAML and
that module are all a new set takes (docs/extending.md, "Add a calibration set"). The bundled
YAMLs under ``tasks/`` are read, and those of any ``include_path`` given, as lm-eval reads them
(``include:`` merged, ``!function`` imported), so the rankers read exactly the documents that
the search's S() scores, with the options of the YAML's ``metadata``.

Nothing is read at import time (the rank command's parser must not import torch); the YAMLs are
read, and the generators imported, the first time a set is asked for.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bosch_eval.tasks import TASKS_DIR

GENERATOR = "calibration_examples"  # what a generator module defines, beside its lm-eval ``dataset``


@dataclass(frozen=True)
class CalibrationSet:
    """One calibration task: its YAML, its generator and the metadata its YAML sets."""

    name: str
    path: Path
    generator: Callable[..., tuple[dict[str, Any], ...]]
    metadata: dict[str, Any]


def calibration_sets(include_paths: Sequence[str | Path] = ()) -> dict[str, CalibrationSet]:
    """Every calibration set under ``tasks/`` and ``include_paths``, by task name."""
    return dict(_sets(tuple(str(Path(path).resolve()) for path in include_paths)))


def is_calibration_set(task: str, include_paths: Sequence[str | Path] = ()) -> bool:
    """Whether ``task`` names a calibration set (a task, not a group or a YAML path)."""
    return task in calibration_sets(include_paths)


def calibration_examples(
    task: str,
    tokenizer: Any,
    seq_len: int,
    num_examples: int,
    seed: int,
    include_paths: Sequence[str | Path] = (),
) -> tuple[dict[str, Any], ...]:
    """The examples of calibration set ``task`` (``input``, ``target``, ...), as its lm-eval task builds them
    with ``seq_len``, ``num_examples`` and ``calib_seed`` = ``seed`` over its YAML's metadata.

    Raises:
        ValueError: ``task`` is not a calibration set, naming the ones there are.
    """
    sets = calibration_sets(include_paths)
    if task not in sets:
        raise ValueError(f"calibration task {task!r}: expected one of {sorted(sets)}")
    found = sets[task]
    metadata = {**found.metadata, "seq_len": seq_len, "num_examples": num_examples, "calib_seed": seed}
    return found.generator(metadata, tokenizer)


@functools.cache
def _sets(include_paths: tuple[str, ...]) -> tuple[tuple[str, CalibrationSet], ...]:
    # lm-eval's own YAML reader and function import: a task is read as lm-eval reads it. The YAMLs
    # are read without importing their functions; only a custom_dataset's module is imported.
    from lm_eval.tasks._yaml_loader import _import_func_in_yml, load_yaml  # lm-eval: not for --help

    found: dict[str, CalibrationSet] = {}
    for folder in (TASKS_DIR, *map(Path, include_paths)):
        for path in sorted(folder.rglob("*.yaml")):
            config = load_yaml(path, resolve_func=False)
            name, dataset = config.get("task"), config.get("custom_dataset")
            if not isinstance(name, str) or not isinstance(dataset, str) or name in found:
                continue
            # Unresolved, a "!function module.name" reads "<folder of the YAML that wrote it>/module.name".
            function = _import_func_in_yml(Path(dataset).name, Path(dataset).parent)
            generator = function.__globals__.get(GENERATOR)
            if callable(generator):
                found[name] = CalibrationSet(name, path, generator, dict(config.get("metadata") or {}))
    return tuple(found.items())
