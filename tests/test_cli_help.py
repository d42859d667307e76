"""``bosch-eval --help`` and every sub-command's ``--help`` print at once (issue 40: 15–20 s on a
busy machine, 5.8 s of CPU each, because the CLI imported torch, transformers and lm-eval
before parsing), and what the help says is what the commands do."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from bosch_eval.cli import build_parser
from bosch_eval.tasks import families as families_module
from bosch_eval.tasks.families import task_families
from tests.source_tree import dotted_module, imported_names, locate
from tests.test_layers import DEFERRED, SCRIPT_DEFERRED, relative

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
    """Each module of ours that a CLI module (tests/test_layers.py, ``Deferred.is_the_clis``) or
    a script of benchmarks/ imports inside a function, with where."""
    modules: dict[str, set[str]] = {}
    for item in [*(item for item in DEFERRED if item.is_the_clis), *SCRIPT_DEFERRED]:
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
    free of torch, lm-eval and numpy, it would belong at the top of the CLI module (or script)."""
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


def test_tasks_help_lists_every_task_family(capsys: pytest.CaptureFixture[str], tmp_path, monkeypatch) -> None:
    """Each family is read from its YAML: the top-level tasks and groups, described by their first line."""
    families = task_families()
    assert set(families) == {
        "bosch_niah_calib", "bosch_niah_calib_uuid", "bosch_niah_calib_formats", "bosch_retrieval_calib",
        "bosch_niah_dev", "bosch_niah_dev_gen", "bosch_niah", "bosch_longbench",
    }  # fmt: skip
    assert families["bosch_niah_dev"] == "the development split that calib-check ranks masks on (never the test set)"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["tasks", "--help"])
    text = capsys.readouterr().out
    assert all(f"{name}: {what}" in text for name, what in families.items())
    # A family whose YAML does not say what it is for is refused, naming it.
    (tmp_path / "mine.yaml").write_text("task: mine\n")
    monkeypatch.setattr(families_module, "TASKS_DIR", tmp_path)
    task_families.cache_clear()
    try:
        with pytest.raises(ValueError, match="task family 'mine' must open with"):
            task_families()
    finally:
        task_families.cache_clear()


def test_calib_check_help_shows_no_markup_and_says_what_a_second_run_does(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["calib-check", "--help"])
    text = capsys.readouterr().out
    assert "``" not in text
    assert "resumes" in text and "--new-settings" in text
