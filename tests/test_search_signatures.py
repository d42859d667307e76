"""Settings travel as objects, not as re-listed parameters (issue 39): no function in
``search/`` takes more than eight (``self`` not counted), so a new setting is added in one
dataclass instead of at every level a search passes it through."""

from __future__ import annotations

import ast
from pathlib import Path

SEARCH = Path(__file__).resolve().parents[1] / "search"
MOST = 8


def parameters(function: ast.FunctionDef | ast.AsyncFunctionDef) -> list[str]:
    args = function.args
    names = [a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)]
    names += [f"*{a.arg}" for a in (args.vararg, args.kwarg) if a is not None]
    return names[1:] if names[:1] in (["self"], ["cls"]) else names


def test_no_search_function_takes_more_than_eight_parameters() -> None:
    crowded = [
        f"{path.relative_to(SEARCH.parent)}:{node.lineno} {node.name} ({len(parameters(node))})"
        for path in sorted(SEARCH.rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and len(parameters(node)) > MOST
    ]
    assert crowded == []
