"""The floor of the layers (docs/conventions.md#layers): the core never imports upward.

Core (layer 1) is every module under ``bosch_eval/`` except the features that live there
(``compare/``, ``train/``, ``analyze/``, ``bench.py``, and ``toy/``, the bundled models' training
data: layer 3) and the CLI (``cli.py`` and the ``*_cli.py`` modules of its commands: layer 4,
may import anything). It must not import ``bosch_eval.search`` (a feature),
``bosch_eval.model_adapters`` (layer 2) or ``bosch_eval.tasks`` (the task code imports the
core; the core finds the task folder without importing it), at module level or inside a
function: a lazy import is still an upward dependency. Read from the source with ``ast``, nothing imported.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "bosch_eval"
NOT_CORE = ("cli.py", "mask_cli.py", "export_cli.py", "bench", "compare", "train", "analyze", "toy")
UPPER = ("bosch_eval.search", "bosch_eval.model_adapters", "bosch_eval.tasks")


def core_modules() -> list[Path]:
    return sorted(
        path for path in PACKAGE.rglob("*.py") if path.relative_to(PACKAGE).parts[0] not in NOT_CORE
    )


def imported_names(path: Path) -> list[tuple[int, str]]:
    """Every module name ``path`` imports (``from a import b`` gives ``a.b``), with its line."""
    names = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against the module's own package
                package = path.relative_to(PACKAGE.parent).with_suffix("").parts[: -node.level]
                base = ".".join([*package, *([node.module] if node.module else [])])
            else:
                base = node.module or ""
            names += [(node.lineno, f"{base}.{alias.name}") for alias in node.names]
    return names


def test_the_walk_sees_the_core():
    names = {path.relative_to(PACKAGE).as_posix() for path in core_modules()}
    assert {"masks/head_mask.py", "models/model_check.py", "runtime/lm_eval_session.py", "masks/mask_sources.py"} <= names
    assert not any(name.startswith(("compare/", "cli.py")) for name in names)


@pytest.mark.parametrize("path", core_modules(), ids=lambda path: path.relative_to(PACKAGE).as_posix())
def test_core_module_imports_nothing_above_it(path):
    upward = [f"line {line}: {name}" for line, name in imported_names(path) if name.startswith(UPPER)]
    assert not upward, f"{path.relative_to(PACKAGE.parent)} imports from a layer above the core: {upward}"
