"""The package's source read as files, for the structural tests: nothing is imported.

The installed name space ``bosch_eval`` spans four source folders (setup.py's
``PACKAGE_DIRS``): ``bosch_eval.model_adapters`` is ``model_adapters/``, ``bosch_eval.search``
is ``search/``, ``bosch_eval.tasks`` is ``tasks/``, and everything else is ``bosch_eval/``.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# Installed package -> source folder; the card's folders first (they sit inside bosch_eval's name space).
SOURCE_FOLDERS = {
    "bosch_eval.model_adapters": "model_adapters",
    "bosch_eval.search": "search",
    "bosch_eval.tasks": "tasks",
    "bosch_eval": "bosch_eval",
}


def source_modules() -> list[Path]:
    """Every Python module of the package, in its source folder."""
    return sorted(path for folder in SOURCE_FOLDERS.values() for path in (REPO / folder).rglob("*.py"))


def locate(dotted: str) -> tuple[Path, tuple[str, ...]] | None:
    """The module a dotted name starts with and the names after it:
    ``bosch_eval.masks.head_mask.HeadMask`` -> (``bosch_eval/masks/head_mask.py``, ``("HeadMask",)``);
    a package is its ``__init__.py``. None for a name outside ``bosch_eval``. Whether the names
    after the module exist is the caller's to check (:func:`top_level_names`)."""
    for package, folder in SOURCE_FOLDERS.items():
        if dotted == package or dotted.startswith(package + "."):
            break
    else:
        return None
    here = REPO / folder
    parts = tuple(dotted[len(package) :].split(".")[1:])
    for index, part in enumerate(parts):
        if (here / part / "__init__.py").is_file():
            here = here / part
        elif (here / f"{part}.py").is_file():
            return here / f"{part}.py", parts[index + 1 :]
        else:
            return here / "__init__.py", parts[index:]
    return here / "__init__.py", ()


def imported_names(path: Path) -> list[tuple[int, str]]:
    """Every name ``path`` imports, anywhere in it (``from a import b`` gives ``a.b``), with its line."""
    names = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against the module's own package
                package = dotted_module(path).split(".")
                package = package[: len(package) - node.level + (path.name == "__init__.py")]
                base = ".".join([*package, *([node.module] if node.module else [])])
            else:
                base = node.module or ""
            names += [(node.lineno, f"{base}.{alias.name}") for alias in node.names]
    return names


def dotted_module(path: Path) -> str:
    """The installed name of a source module (``search/run/api.py`` -> ``bosch_eval.search.run.api``)."""
    relative = path.resolve().relative_to(REPO)
    for package, folder in SOURCE_FOLDERS.items():
        if relative.parts[0] == folder:
            tail = [part for part in relative.with_suffix("").parts[1:] if part != "__init__"]
            return ".".join([package, *tail])
    raise ValueError(f"{path} is not in a source folder of the package ({sorted(SOURCE_FOLDERS.values())})")


def top_level_names(path: Path) -> set[str]:
    """The names a module defines or imports at its top level (inside ``if``/``try`` too)."""
    names: set[str] = set()

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                names.update(sub.id for target in targets for sub in ast.walk(target) if isinstance(sub, ast.Name))
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                names.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
            elif isinstance(node, (ast.If, ast.Try)):
                visit(node.body)
                visit(node.orelse)
                for handler in getattr(node, "handlers", []):
                    visit(handler.body)
                visit(getattr(node, "finalbody", []))

    visit(ast.parse(path.read_text(encoding="utf-8")).body)
    return names
