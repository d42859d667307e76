"""No function of the package takes more than eight parameters or runs past 80 lines (issue 55,
item 7): past that a reader cannot hold it at once, and settings travel better as one object
than re-listed at every level. Read from the source with ``ast``; ``self``/``cls`` not counted,
a function's lines run from its ``def`` to its last line."""

from __future__ import annotations

import ast
from functools import cache

from tests.source_tree import REPO, source_modules
from tests.test_search_signatures import parameters

MOST_PARAMETERS = 8
MOST_LINES = 80


def oversized(source: str) -> dict[str, str]:
    """Each function of ``source`` over a limit, by name: what it exceeds, with its line."""
    found = {}
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        count, lines = len(parameters(node)), node.end_lineno - node.lineno + 1
        if count > MOST_PARAMETERS or lines > MOST_LINES:
            found[node.name] = f"line {node.lineno}: {count} parameters, {lines} lines"
    return found


@cache  # read once for the whole module's tests
def package_oversized() -> dict[str, str]:
    return {
        f"{path.relative_to(REPO).as_posix()} {name}": why
        for path in source_modules()
        for name, why in oversized(path.read_text(encoding="utf-8")).items()
    }


def test_the_limits_are_counted_as_stated():
    nine = "def f(a, b, c, d, e, f, g, h, i):\n    pass\n"
    eight_with_self = "class C:\n    def m(self, a, b, c, d, e, *f, g, **h):\n        pass\n"
    long = "def g():\n" + "    x = 1\n" * 80  # 81 lines with its def
    short = "def h():\n" + "    x = 1\n" * 79
    assert oversized(nine + eight_with_self + long + short) == {
        "f": "line 1: 9 parameters, 2 lines",
        "g": "line 6: 0 parameters, 81 lines",
    }


def test_no_function_over_eight_parameters_or_eighty_lines():
    assert package_oversized() == {}, (
        "split it into helpers with one job, or group its parameters in a frozen dataclass"
    )
