"""No module writes another object's private fields (issue 55 item 3): an object changes its own
state, through its methods; a write such as ``lm._rank = 0`` from outside hides who owns the state."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("bosch_eval", "search", "model_adapters", "tasks")


def private_writes(source: str) -> list[str]:
    """``obj._field = ...`` (or ``+=``, or a tuple target) where ``obj`` is not ``self`` or ``cls``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        targets = (
            node.targets
            if isinstance(node, ast.Assign)
            else [node.target]
            if isinstance(node, (ast.AugAssign, ast.AnnAssign))
            else []
        )
        for target in targets:
            for leaf in ast.walk(target):
                if not isinstance(leaf, ast.Attribute) or not isinstance(leaf.ctx, ast.Store):
                    continue
                private = leaf.attr.startswith("_") and not leaf.attr.startswith("__")
                own = isinstance(leaf.value, ast.Name) and leaf.value.id in ("self", "cls")
                if private and not own:
                    found.append(f"line {leaf.lineno}: {ast.unparse(leaf)}")
    return found


def test_the_scan_finds_a_write_from_outside():
    assert private_writes("lm._rank = 0\nself._x = 1\na, b._y = 1, 2\nobj.__class__ = C\n") == [
        "line 1: lm._rank",
        "line 3: b._y",
    ]


def test_no_module_writes_another_objects_private_fields():
    writes = {
        f"{path.relative_to(ROOT)} {write}"
        for package in PACKAGES
        for path in sorted((ROOT / package).rglob("*.py"))
        for write in private_writes(path.read_text())
    }
    assert not writes, f"give the owner a method instead: {sorted(writes)}"
