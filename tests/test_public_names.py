"""The names users and plugins rely on keep working (issue 55, item 8): the entry points in
pyproject.toml, the start-up hook's target, and every ``bosch_eval`` module or attribute the
README and docs name for Python use (``from ... import ...`` lines, ``python -m`` modules,
dotted names in prose). Unlike tests/test_module_references.py, which reads the source, these
import: a name that is re-exported, or made at import time, counts; a module that moved must
leave a re-export behind or its docs updated."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import re
import site
import tomllib
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import pytest

from bosch_eval.model_adapters import lm_eval_hook
from tests.source_tree import REPO

DOCUMENTS = sorted([REPO / "README.md", *(REPO / "docs").glob("*.md")])
DOTTED = re.compile(r"(?<![\w.])bosch_eval(?:\.[A-Za-z_]\w*)+")
RUN_MODULE = re.compile(r"(?<![\w-])-m (bosch_eval(?:\.\w+)*)")
FROM_IMPORT = re.compile(r"^\s*from (bosch_eval(?:\.\w+)*) import ([\w, ]+)$", re.MULTILINE)


def resolve(dotted: str) -> Any:
    """The object ``dotted`` names: the longest importable module, then attributes of it."""
    parts = dotted.split(".")
    for split in range(len(parts), 0, -1):
        try:
            found = importlib.import_module(".".join(parts[:split]))
        except ModuleNotFoundError as err:
            if not ".".join(parts[:split]).startswith(err.name or ""):
                raise  # the module exists and a dependency of it is missing: not our question
            continue
        for attribute in parts[split:]:
            found = getattr(found, attribute)
        return found
    raise ModuleNotFoundError(dotted)


def entry_point_target(value: str) -> Any:
    """What a ``module:attribute`` (or bare ``module``) entry point loads."""
    module, _, attribute = value.partition(":")
    return resolve(f"{module}.{attribute}" if attribute else module)


def documented_names() -> list[str]:
    """Every ``bosch_eval`` name the README and docs give: dotted, and imported with ``from``."""
    names = set()
    for path in DOCUMENTS:
        text = path.read_text(encoding="utf-8")
        names.update(DOTTED.findall(text))
        for module, imported in FROM_IMPORT.findall(text):
            names.update(f"{module}.{name.strip()}" for name in imported.split(",") if name.strip())
    return sorted(names)


def run_modules() -> list[str]:
    """The modules the README and docs run with ``python -m`` (or ``accelerate launch -m``)."""
    return sorted({module for path in DOCUMENTS for module in RUN_MODULE.findall(path.read_text(encoding="utf-8"))})


def pyproject_entry_points() -> list[tuple[str, str]]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    groups = {"console_scripts": project["scripts"], **project["entry-points"]}
    return sorted((f"{group}:{name}", value) for group, members in groups.items() for name, value in members.items())


def setup_constant(name: str) -> str:
    """A string constant of setup.py (``PTH_NAME``, ``PTH_LINE``), read without running it."""
    for node in ast.walk(ast.parse((REPO / "setup.py").read_text(encoding="utf-8"))):
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            return str(ast.literal_eval(node.value))
    raise AssertionError(f"setup.py: no {name}")


def hook_line_targets() -> list[str]:
    """The modules the ``.pth`` start-up line of setup.py imports."""
    return re.findall(r"import (bosch_eval[\w.]*)", setup_constant("PTH_LINE"))


def test_the_readers_find_what_the_docs_and_setup_name():
    names = documented_names()
    assert {"bosch_eval.attention.hybrid_attention.hybridize", "bosch_eval.models.checkpoint.load_hybrid_model",
            "bosch_eval.model_adapters.bosch.BoschLM", "bosch_eval.search.run.api.search_model"} <= set(names)  # fmt: skip
    assert ("lm_eval.models:bosch", "bosch_eval.model_adapters.bosch:BoschLM") in pyproject_entry_points()
    assert hook_line_targets() == ["bosch_eval.model_adapters.lm_eval_hook"]
    assert {"bosch_eval.search", "bosch_eval.train", "bosch_eval.toy.train"} <= set(run_modules())


def test_resolve_tells_a_missing_name():
    errors = resolve("bosch_eval.runtime.errors")
    assert resolve("bosch_eval.runtime.errors.BoschError") is errors.BoschError
    with pytest.raises(AttributeError):  # the name is built: tests/test_module_references.py reads literal ones
        resolve(f"{errors.__name__}.NoSuchError")
    with pytest.raises(ModuleNotFoundError):
        resolve("bosch_eval_gone.errors")


@pytest.mark.parametrize("name", documented_names())
def test_each_documented_name_imports(name):
    resolve(name)


@pytest.mark.parametrize(("entry", "value"), pyproject_entry_points())
def test_each_entry_point_of_pyproject_resolves(entry, value):
    assert entry_point_target(value) is not None


def test_the_installed_entry_points_are_pyprojects():
    """An install made before a move keeps the old targets until reinstalled: this says so."""
    declared = pyproject_entry_points()
    groups = {entry.split(":")[0] for entry, _ in declared}
    installed = {(f"{ep.group}:{ep.name}", ep.value) for group in groups for ep in entry_points(group=group)}
    assert set(declared) <= installed


def test_the_installed_start_up_line_is_setup_pys():
    """An install made before the hook moved (from bosch_eval.runtime to bosch_eval.model_adapters)
    imports a module that is gone, which its ``try`` turns into nothing: this says so."""
    name = setup_constant("PTH_NAME")
    installed = [path for directory in site.getsitepackages() if (path := Path(directory, name)).is_file()]
    assert installed, f"{name} is not installed: pip install -e ."
    assert all(path.read_text(encoding="utf-8") == setup_constant("PTH_LINE") for path in installed), (
        f"{installed}: not setup.py's start-up line; reinstall the package (pip install -e .)"
    )


@pytest.mark.parametrize("module", run_modules())
def test_each_documented_python_dash_m_module_runs(module):
    """``python -m`` needs a module, or a package with a ``__main__``."""
    spec = importlib.util.find_spec(module)
    assert spec is not None and (
        spec.submodule_search_locations is None or importlib.util.find_spec(f"{module}.__main__")
    )


def test_the_lm_eval_model_is_the_adapter_class_the_hook_registers():
    from bosch_eval.model_adapters.bosch import BoschLM

    module, _, name = lm_eval_hook.MODEL_TARGET.partition(":")
    assert entry_point_target(lm_eval_hook.MODEL_TARGET) is BoschLM and (BoschLM.__module__, BoschLM.__name__) == (
        module,
        name,
    )
    assert dict(pyproject_entry_points())["lm_eval.models:bosch"] == lm_eval_hook.MODEL_TARGET


@pytest.mark.parametrize("module", hook_line_targets())
def test_the_start_up_hooks_target_imports(module):
    assert callable(importlib.import_module(module).register)  # what the hook runs when lm_eval.models loads
