"""``bosch-eval --help`` and every sub-command's ``--help`` print at once (issue 40: 15–20 s on a
busy machine, 5.8 s of CPU each, because the CLI imported torch, transformers and lm-eval
before parsing), and what the help says is what the commands do."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from bosch_eval.cli import TASK_FAMILIES, build_parser
from bosch_eval.tasks import TASKS_DIR
from tests.helpers import TaskYaml
from tests.source_tree import dotted_module, imported_names, locate
from tests.test_layers import DEFERRED, relative

HEAVY = ("torch", "transformers", "lm_eval", "accelerate", "numpy")

IMPORTS = """
import json, sys
from bosch_eval.cli import build_parser
build_parser()
print(json.dumps(sorted(name for name in sys.modules if name.split(".")[0] in {heavy!r})))
"""


IMPORT_ONE = """
import importlib, json, sys
importlib.import_module({module!r})
print(json.dumps(sorted(name for name in sys.modules if name.split(".")[0] in {heavy!r})))
"""


def cli_deferred_modules() -> dict[str, set[str]]:
    """Each module of ours that a CLI module imports inside a function (tests/test_layers.py,
    ``Deferred.is_the_clis``), with where."""
    modules: dict[str, set[str]] = {}
    for item in DEFERRED:
        if item.is_the_clis:
            for line, name in imported_names(item.path):
                if line == item.line and (located := locate(name)) is not None:
                    modules.setdefault(dotted_module(located[0]), set()).add(f"{relative(item.path)}:{line}")
    return modules


def subcommands() -> list[str]:
    parser = build_parser()
    (commands,) = [action for action in parser._actions if action.dest == "command"]
    return sorted(commands.choices)


def test_building_the_parser_loads_no_heavy_library() -> None:
    out = subprocess.run(
        [sys.executable, "-c", IMPORTS.format(heavy=set(HEAVY))],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert json.loads(out.stdout) == []


@pytest.mark.slow
@pytest.mark.parametrize("module", sorted(cli_deferred_modules()))
def test_the_cli_defers_only_modules_that_load_a_heavy_library(module: str) -> None:
    """A command's work imported inside its function is there for --help's start-up time: were it
    free of torch, lm-eval and numpy, it would belong at the top of the CLI module."""
    code = IMPORT_ONE.format(module=module, heavy=set(HEAVY))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert json.loads(out.stdout), (
        f"{module} loads none of {HEAVY}: import it at the top of {cli_deferred_modules()[module]}"
    )


@pytest.mark.slow
@pytest.mark.parametrize("command", [None, *subcommands()])
def test_help_prints_within_a_second(command: str | None) -> None:
    argv = [sys.executable, "-m", "bosch_eval.cli", *([command] if command else []), "--help"]
    walls = []
    for _ in range(3):  # the best of three: a busy machine delays single runs
        started = time.perf_counter()
        out = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=dict(os.environ))
        walls.append(time.perf_counter() - started)
        assert out.returncode == 0 and "usage: bosch-eval" in out.stdout, out.stderr
    assert min(walls) < 1.0, f"{command or 'bosch-eval'} --help took {min(walls):.2f} s (best of 3)"


def top_level_task_families() -> set[str]:
    """Every task or group name under tasks/ that no bundled group lists as a member."""
    names, members = set(), set()
    for path in Path(TASKS_DIR).rglob("*.yaml"):
        data = yaml.load(path.read_text(), Loader=TaskYaml) or {}
        name = data.get("group") or (data.get("task") if isinstance(data.get("task"), str) else None)
        if name is not None:
            names.add(name)
        if "group" in data:
            members |= {item if isinstance(item, str) else item.get("task") for item in data.get("task", [])}
    return names - members


def test_tasks_help_lists_every_task_family(capsys: pytest.CaptureFixture[str]) -> None:
    families = top_level_task_families()
    assert set(TASK_FAMILIES) == families
    with pytest.raises(SystemExit):
        build_parser().parse_args(["tasks", "--help"])
    text = capsys.readouterr().out
    assert all(name in text for name in families)


def test_calib_check_help_shows_no_markup_and_says_what_a_second_run_does(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["calib-check", "--help"])
    text = capsys.readouterr().out
    assert "``" not in text
    assert "resumes" in text and "--new-settings" in text
