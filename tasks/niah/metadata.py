"""Task settings and the model's tokenizer, read from lm-eval's task metadata.

lm-eval 0.4.13 calls a task's ``custom_dataset`` with the task's metadata as keyword
arguments: the YAML ``metadata`` block, then (overriding it) the TaskManager's metadata.
That is where the settings come from, on both paths:

* CLI: ``lm_eval --model_args pretrained=M,... --metadata '{"seq_len": 4096}'`` merges
  the parsed ``--model_args`` with ``--metadata`` (``EvaluatorConfig``: ``model_args |
  metadata``) into the TaskManager's metadata;
* Python: ``simple_evaluate(model_args=..., metadata=...)`` does the same merge, but only
  when it builds the TaskManager itself. With ``task_manager=TaskManager(metadata=...)``,
  or with an already-built model object, the caller must put ``pretrained`` or
  ``tokenizer`` into that metadata.

Prompts are sized in tokens of the model's own tokenizer, found under ``tokenizer``,
``pretrained`` or ``model`` (lm-eval's RULER convention, reused from its
``common_utils``). Every model arg lands in the same dictionary, which is why our
seeds are called ``calib_seed`` / ``eval_seed``: the ``bosch`` adapter's own ``seed``
model arg (for ``layers=rand``) must not change the data.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from lm_eval.tasks.ruler.common_utils import get_tokenizer, resolve_tokenizer_name
from transformers import PreTrainedTokenizerBase

from bosch_eval.models.model_check import IGNORE_METADATA, check_length, model_config, resolve_model, truthy
from bosch_eval.models.model_defaults import model_defaults

log = logging.getLogger("bosch_eval")

METADATA_HINT = "Custom kwargs can be passed to `--metadata`"


class _OwnTasksMetadataHint(logging.Filter):
    """Drops lm-eval's "Custom kwargs can be passed to `--metadata`" warning for bosch tasks.

    lm-eval 0.4.13 (``ConfigurableTask.download``) logs it for every task with a
    ``custom_dataset``, unconditionally, so ``bosch_niah`` printed it seven times even
    when ``--metadata`` was given. Our tasks' settings are documented (docs/tasks.md, module
    docstrings) and a bad one is an error, so the hint says nothing; other tasks keep it.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not (message.startswith("bosch_") and METADATA_HINT in message)


# Installed when lm-eval imports our dataset functions, which is before it downloads (builds) the task.
_task_logger = logging.getLogger("lm_eval.api.task")
if not any(isinstance(f, _OwnTasksMetadataHint) for f in _task_logger.filters):
    _task_logger.addFilter(_OwnTasksMetadataHint())


def model_tokenizer(metadata: dict[str, Any], task: str) -> PreTrainedTokenizerBase:
    """The tokenizer named in ``metadata`` (loaded once per name and process)."""
    name = resolve_tokenizer_name(metadata)
    if name is None:
        raise ValueError(
            f"{task}: no tokenizer to size the prompts with. Pass the model with "
            "`--model_args pretrained=<name or path>` (or tokenizer=...), or in Python "
            "`TaskManager(metadata={'tokenizer': <name or path>})`."
        )
    return get_tokenizer(resolve_model(name, check=False))  # a tokenizer-only directory has no config.json


def calibration_settings(
    metadata: dict[str, Any], task: str, tokenizer: PreTrainedTokenizerBase | None = None
) -> dict[str, Any]:
    """The settings every calibration set reads: ``tokenizer`` (the one given, else the one
    ``metadata`` names), ``seq_len`` (default: the model's ``calib_len``, else 32768; checked
    against the model's length), ``num_examples`` (64, the paper's) and ``seed`` (``calib_seed``, 0)."""
    seq_len = int_setting(metadata, "seq_len", default_lengths(metadata, "seq_len", (32768,), task)[0], task)
    check_lengths(metadata, (seq_len,), task, "seq_len")
    return {
        "tokenizer": tokenizer if tokenizer is not None else model_tokenizer(metadata, task),
        "seq_len": seq_len,
        "num_examples": int_setting(metadata, "num_examples", 64, task),
        "seed": int_setting(metadata, "calib_seed", 0, task, minimum=0),
    }


def int_setting(metadata: dict[str, Any], key: str, default: int, task: str, minimum: int = 1) -> int:
    """``metadata[key]`` as an int >= ``minimum`` (model args arrive as strings or numbers)."""
    value = metadata.get(key, default)
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise ValueError(f"{task}: metadata {key!r} must be an integer, got {value!r}") from None
    if number < minimum or number != float(value):
        raise ValueError(f"{task}: metadata {key!r} must be an integer >= {minimum}, got {value!r}")
    return number


def int_list_setting(metadata: dict[str, Any], key: str, default: tuple[int, ...], task: str) -> tuple[int, ...]:
    """``metadata[key]`` as a tuple of positive ints; one int or a comma-separated string also work."""
    value = metadata.get(key, default)
    items = value.split(",") if isinstance(value, str) else value if isinstance(value, (list, tuple)) else [value]
    if not items:
        raise ValueError(f"{task}: metadata {key!r} must list at least one length, got {value!r}")
    return tuple(int_setting({key: item}, key, 0, task) for item in items)


def named_model(metadata: dict[str, Any]) -> str | None:
    """The model directory or id in ``metadata`` (``pretrained``, else ``tokenizer``) whose
    config can tell defaults and the longest sequence; None when there is none (a
    tokenizer-only directory, or a model object passed from Python)."""
    for key in ("pretrained", "tokenizer"):
        name = metadata.get(key)
        if isinstance(name, str) and name:
            path = resolve_model(name, check=False)
            if Path(path).is_dir() and not (Path(path) / "config.json").is_file():
                continue  # a tokenizer alone: no config to read
            return path
    return None


def default_lengths(metadata: dict[str, Any], key: str, fallback: tuple[int, ...], task: str) -> tuple[int, ...]:
    """The default of length setting ``key`` when the metadata has none: the model's
    ``bosch_defaults.json`` ``calib_len`` (logged), else ``fallback``."""
    model = named_model(metadata) if key not in metadata else None
    calib_len = model_defaults(model).calib_len if model is not None else None
    if calib_len is None:
        return fallback
    log.info("%s: %s = %d tokens from %s/bosch_defaults.json (pass --metadata to choose)", task, key, calib_len, model)
    return (calib_len,)


def check_lengths(metadata: dict[str, Any], lengths: tuple[int, ...], task: str, key: str) -> None:
    """Refuse lengths the named model cannot hold (its ``max_position_embeddings``): past it
    a prompt is left-truncated or runs on untrained positions, and silently scores ~0.
    ``ignore_max_positions: true`` in the metadata skips this (a config that understates
    the context, e.g. rope scaling; give the adapter ``max_length=`` too)."""
    model = named_model(metadata)
    if model is None or truthy(metadata.get(IGNORE_METADATA, False), f"{task}: metadata {IGNORE_METADATA!r}"):
        return
    config = model_config(model)
    for length in lengths:
        check_length(length, metadata.get("pretrained") or model, config, f"{task}: metadata {key!r} =",
                     f'--metadata \'{{"{IGNORE_METADATA}": true}}\'')  # fmt: skip
