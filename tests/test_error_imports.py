"""Error classes are imported from ``bosch_eval.runtime.errors`` only (issue 68, item 4;
docs/conventions.md#errors): never through a module that raises them and so has them in its
namespace (``from bosch_eval.masks.head_mask import MaskError``), never as an attribute of such a
module (``head_mask.MaskError``, ``mock.patch("bosch_eval.masks.head_mask.MaskError")``), and
under their own names (no ``LmEvalError as ObjectiveError``, no ``ObjectiveError = LmEvalError``),
and no other module lists one in its ``__all__``.

The class names are read from ``bosch_eval/runtime/errors.py``, every ``.py`` file of the
checkout (the package, tests, benchmarks, examples, the scripts of results/) is parsed with
``ast``; nothing is imported.
"""

from __future__ import annotations

import ast
import re
import subprocess
from pathlib import Path

from tests.source_tree import REPO, dotted_module

ERRORS_MODULE = "bosch_eval.runtime.errors"
ERRORS_FILE = REPO / "bosch_eval" / "runtime" / "errors.py"
THIS_FILE = "tests/test_error_imports.py"  # plants what it looks for, in strings


def error_classes(path: Path = ERRORS_FILE) -> frozenset[str]:
    """The classes ``bosch_eval/runtime/errors.py`` defines at its top level."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return frozenset(node.name for node in tree.body if isinstance(node, ast.ClassDef))


ERRORS = error_classes()


def is_ours(module: str) -> bool:
    return module == "bosch_eval" or module.startswith("bosch_eval.")


def dotted(node: ast.expr) -> str | None:
    """``a.b.c`` for a chain of names and attributes, None for anything else."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return ".".join([node.id, *reversed(parts)])


def wrong_error_imports(source: str, package: str = "", errors: frozenset[str] = ERRORS) -> list[tuple[int, str]]:
    """Where ``source`` takes an error class other than from :data:`ERRORS_MODULE` under its own
    name: ``(line, what)`` pairs. ``package``: the one its relative imports start from."""
    tree = ast.parse(source)
    wrong = []
    bound: dict[str, str] = {}  # a local name -> the module of ours it is
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if is_ours(alias.name):
                    bound[alias.asname or alias.name.split(".")[0]] = alias.name if alias.asname else "bosch_eval"
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join([*parts[: len(parts) - node.level + 1], *([node.module] if node.module else [])])
            if not is_ours(base):
                continue
            for alias in node.names:
                if alias.name in errors and base != ERRORS_MODULE:
                    wrong.append((node.lineno, f"imports {alias.name} from {base}, not from {ERRORS_MODULE}"))
                elif alias.name in errors and alias.asname not in (None, alias.name):
                    wrong.append((node.lineno, f"imports {alias.name} as {alias.asname}: use its own name"))
                else:
                    bound[alias.asname or alias.name] = f"{base}.{alias.name}"
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in errors and (chain := dotted(node.value)):
            head, _, rest = chain.partition(".")
            if head in bound:
                owner = ".".join(filter(None, [bound[head], rest])) if bound[head] != "bosch_eval" else chain
                if is_ours(owner) and owner != ERRORS_MODULE:
                    wrong.append((node.lineno, f"{chain}.{node.attr}: an attribute of {owner}, not of {ERRORS_MODULE}"))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            for match in re.finditer(r"(?<![\w.])(bosch_eval(?:\.\w+)*)\.(\w+)\b", node.value):
                if match.group(2) in errors and match.group(1) != ERRORS_MODULE:
                    wrong.append((node.lineno, f"{match.group(0)!r}: names the class in {match.group(1)}"))
        elif isinstance(node, ast.Assign) and isinstance(node.value, ast.Name) and node.value.id in errors:
            names = [target.id for target in node.targets if isinstance(target, ast.Name)]
            wrong += [(node.lineno, f"{name} = {node.value.id}: another name for the class") for name in names]
        elif isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            exported = {item.value for item in ast.walk(node.value) if isinstance(item, ast.Constant)}
            wrong += [
                (node.lineno, f"__all__ exports {name}: import it from {ERRORS_MODULE}")
                for name in sorted(exported & errors)
            ]
    return sorted(wrong)


def checked_files() -> list[str]:
    """Every ``.py`` file of the checkout that git knows or would add (not .venv/, not build/)."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "*.py"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout.splitlines()
    return sorted(
        name for name in listed if (REPO / name).is_file() and REPO / name != ERRORS_FILE and name != THIS_FILE
    )


def package_of(name: str) -> str:
    """The package a file's relative imports start from (``search/run/api.py`` -> ``bosch_eval.search``)."""
    try:
        module = dotted_module(REPO / name)
    except ValueError:  # not in the package: tests/x.py -> tests
        module = ".".join(Path(name).with_suffix("").parts)
    return module if Path(name).name == "__init__.py" else module.rpartition(".")[0]


def test_the_error_classes_are_read_from_their_module():
    assert {"BoschError", "MaskError", "SettingsError", "SearchError", "LmEvalError", "TemplateTooLong"} <= ERRORS
    assert "exit_status" not in ERRORS  # a function, not a class


def test_the_check_finds_each_way_of_reaching_an_error_class():
    planted = (
        "from bosch_eval.runtime.errors import MaskError, exit_status\n"  # 1: the one right way
        "from bosch_eval.masks.head_mask import HeadMask, MaskError\n"  # 2
        "from bosch_eval.runtime.lm_eval_session import LmEvalError as ObjectiveError\n"  # 3
        "from bosch_eval.runtime.errors import SearchError as Failed\n"  # 4
        "from bosch_eval.masks import head_mask\n"
        "import bosch_eval.search.objective.scoring as scoring\n"
        "import bosch_eval.models.model_check\n"
        "from bosch_eval.runtime import errors\n"
        "def f():\n"
        "    from .head_mask import MaskError\n"  # 10: relative, inside a function
        "    raise head_mask.MaskError(scoring.SearchError)\n"  # 11: two attributes
        "    raise bosch_eval.models.model_check.ModelError()\n"  # 12
        "    raise errors.MaskError()\n"  # fine: the errors module's
        "mock.patch('bosch_eval.compare.entries.EntryError')\n"  # 14
        "mock.patch('bosch_eval.runtime.errors.EntryError')\n"  # fine
        "Other = MaskError\n"  # 16
        "from json import JSONDecodeError\n"  # not ours
        "__all__ = ['HeadMask', 'MaskError']\n"  # 18
    )
    found = wrong_error_imports(planted, package="bosch_eval.masks")
    assert [line for line, _ in found] == [2, 3, 4, 10, 11, 11, 12, 14, 16, 18], found
    assert "imports MaskError from bosch_eval.masks.head_mask" in found[0][1]
    assert wrong_error_imports("from bosch_eval.runtime.errors import BoschError\nraise BoschError('x')\n") == []
    assert wrong_error_imports("from .errors import MaskError\n", package="bosch_eval.runtime") == []
    assert wrong_error_imports("from ..masks.head_mask import MaskError\n", package="bosch_eval.runtime") == [
        (1, "imports MaskError from bosch_eval.masks.head_mask, not from bosch_eval.runtime.errors")
    ]


def test_error_classes_are_imported_from_their_module_only():
    wrong = [
        f"{name}:{line}: {what}"
        for name in checked_files()
        for line, what in wrong_error_imports((REPO / name).read_text(encoding="utf-8"), package_of(name))
    ]
    assert not wrong, f"error classes reached other than from {ERRORS_MODULE} (docs/conventions.md#errors): {wrong}"
