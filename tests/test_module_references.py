"""Every ``bosch_eval.<dotted>`` name and ``bosch_eval/<path>`` in the code, tests and docs exists.

Imports are not the only way code names a module: ``mock.patch("bosch_eval.x.y")`` and
``monkeypatch.setattr`` strings, a registry's package name, the start-up hook's ``.pth`` line,
``python -m`` commands, and the module paths that docs and comments cite. A module that
moves leaves those behind silently until the one call that needs them, so they are all read
here (nothing imported): a dotted name must be a module of the package or a name its module
defines, a path a file or folder of the checkout. Paths are not checked in ``tests/``, which
builds paths that need not exist (a wheel's file list). Committed results (``results/``
except its scripts) keep the commands and paths as they were run.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from tests.source_tree import REPO, SOURCE_FOLDERS, locate, top_level_names

ROOTS = ("bosch_eval", "model_adapters", "search", "tasks", "tests", "benchmarks", "examples", "docs", ".ci", "results")
FILES = ("README.md", "setup.py", "pyproject.toml", ".gitignore")
SUFFIXES = {".py", ".md", ".sh", ".toml", ".yaml", ".yml", ".cfg", ".txt", ""}
RESULTS_SUFFIXES = {".py", ".sh"}  # the rest of results/ is a record of what ran
DOTTED = re.compile(r"(?<![\w.])bosch_eval(?:\.[A-Za-z_]\w*)+")
SLASHED = re.compile(r"(?<![\w/.])bosch_eval/[\w/.]*\w")
THIS_FILE = "tests/test_module_references.py"  # names what does not exist, on purpose


def checked_files() -> list[str]:
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout.splitlines()
    chosen = []
    for name in listed:
        path = Path(name)
        if not (REPO / path).is_file() or (path.parts[0] not in ROOTS and name not in FILES):
            continue
        if path.suffix in (RESULTS_SUFFIXES if path.parts[0] == "results" else SUFFIXES) and name != THIS_FILE:
            chosen.append(name)
    return chosen


def dotted_exists(dotted: str) -> str | None:
    """Why ``dotted`` names nothing, or None when it names a module or a name its module defines."""
    target, names = locate(dotted)
    if not names or names[0].startswith("__") or names[0] in top_level_names(target):
        return None
    if (target.parent / names[0]).is_dir():  # a data folder (bosch_eval.toy.model)
        return None
    return f"{target.relative_to(REPO).as_posix()} defines no {names[0]!r}"


def slashed_exists(path: str) -> bool:
    parts = path.split("/")
    installed = f"bosch_eval.{parts[1]}"
    if installed in SOURCE_FOLDERS and len(parts) > 1:
        return (REPO / SOURCE_FOLDERS[installed]).joinpath(*parts[2:]).exists()
    return (REPO / path).exists()


def test_the_check_sees_code_tests_and_docs():
    files = set(checked_files())
    assert {"setup.py", "pyproject.toml", "docs/architecture.md", "tests/test_layers.py", "search/run/api.py"} <= files
    assert "bosch_eval/toy/model/README.md" in files
    assert not any(name.startswith("results/") and name.endswith(".json") for name in files)


def test_the_check_tells_names_apart():
    assert dotted_exists("bosch_eval.masks.head_mask.HeadMask") is None
    assert dotted_exists("bosch_eval.search.journal.store.os.fsync") is None  # an imported name, patched
    assert dotted_exists("bosch_eval.attention.kernels") is None
    assert dotted_exists("bosch_eval.__version__") is None
    assert dotted_exists("bosch_eval.masks.HeadMask") == "bosch_eval/masks/__init__.py defines no 'HeadMask'"
    assert dotted_exists("bosch_eval.hybrid_cache") == "bosch_eval/__init__.py defines no 'hybrid_cache'"
    assert slashed_exists("bosch_eval/search/rankers/apl.py") and slashed_exists("bosch_eval/caches/kv_quant")
    assert not slashed_exists("bosch_eval/swa_kernels")


@pytest.mark.parametrize("name", checked_files())
def test_references_exist(name):
    missing = []
    for number, line in enumerate((REPO / name).read_text(encoding="utf-8").splitlines(), 1):
        for match in DOTTED.finditer(line):
            if why := dotted_exists(match.group(0)):
                missing.append(f"line {number}: {match.group(0)}: {why}")
        if not name.startswith("tests/"):
            missing += [
                f"line {number}: {match.group(0)}: no such file or folder"
                for match in SLASHED.finditer(line)
                if not slashed_exists(match.group(0))
            ]
    assert not missing, f"{name} names what does not exist: {missing}"
