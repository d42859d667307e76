"""The bundled task families, read from the YAMLs under ``tasks/``: each task or group that no
bundled group lists as a member, with the first line of its YAML's opening comment as what it
is for. A new family is its YAML alone (``bosch-eval tasks --help`` lists it).

Plain YAML, no lm-eval: ``--help`` must stay fast (tests/test_cli_help.py).
"""

from __future__ import annotations

import functools
from typing import Any

import yaml

from bosch_eval.tasks import TASKS_DIR


class _TaskYaml(yaml.SafeLoader):
    """Reads a task YAML's fields, ignoring lm-eval's tags (``!function``: not imported here)."""


_TaskYaml.add_multi_constructor("!", lambda loader, suffix, node: None)


@functools.cache
def task_families() -> dict[str, str]:
    """``{family: what it is for}``, in name order.

    Raises:
        ValueError: a family's YAML opens with no comment line to describe it.
    """
    described: dict[str, str] = {}
    members: set[str] = set()
    for path in sorted(TASKS_DIR.rglob("*.yaml")):
        text = path.read_text(encoding="utf-8")
        config: dict[str, Any] = yaml.load(text, Loader=_TaskYaml) or {}
        name = config.get("group") or (config.get("task") if isinstance(config.get("task"), str) else None)
        if "group" in config:
            members |= {item if isinstance(item, str) else item.get("task") for item in config.get("task", [])}
        if name is not None:
            first = text.splitlines()[0] if text else ""
            described[name] = first[1:].strip() if first.startswith("#") else ""
    families = {name: what for name, what in sorted(described.items()) if name not in members}
    undescribed = [name for name, what in families.items() if not what]
    if undescribed:
        raise ValueError(f"tasks/: the YAML of task family {undescribed[0]!r} must open with a '# what it is for' line")
    return families
