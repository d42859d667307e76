"""The bool-excluding int and number checks (bosch_eval/runtime/checks.py), and that no other
module writes them again (issue 55, item 2): a second copy is where the messages drift apart."""

from __future__ import annotations

import ast

import pytest

from bosch_eval.runtime.checks import check_int, is_int, is_number
from bosch_eval.runtime.errors import MaskError, SettingsError
from tests.source_tree import REPO, source_modules

CHECKS_MODULE = "bosch_eval/runtime/checks.py"


def _isinstance_targets(node: ast.AST, type_name: str) -> set[str]:
    """The expressions ``node`` tests with ``isinstance(x, type_name)`` or a tuple holding it
    but not ``bool`` (``isinstance(x, (str, int, bool))`` lets bools through: no exclusion)."""
    found = set()
    for call in ast.walk(node):
        if (
            isinstance(call, ast.Call)
            and isinstance(call.func, ast.Name)
            and call.func.id == "isinstance"
            and len(call.args) == 2
        ):
            kinds = {
                kind.id
                for kind in (call.args[1].elts if isinstance(call.args[1], ast.Tuple) else [call.args[1]])
                if isinstance(kind, ast.Name)
            }
            if type_name in kinds and (type_name == "bool" or "bool" not in kinds):
                found.add(ast.dump(call.args[0]))
    return found


def bool_excluding_checks(source: str) -> list[int]:
    """Lines of ``source`` where one and/or expression asks of the same value both
    ``isinstance(x, bool)`` and ``isinstance(x, int)`` (or ``(int, float)``)."""
    return sorted(
        node.lineno
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.BoolOp) and _isinstance_targets(node, "bool") & _isinstance_targets(node, "int")
    )


class TestChecks:
    @pytest.mark.parametrize("value", [0, -3, 7])
    def test_ints_are_ints_and_numbers(self, value):
        assert is_int(value) and is_number(value)

    @pytest.mark.parametrize("value", [True, False])
    def test_bools_are_neither(self, value):
        assert not is_int(value) and not is_number(value)

    def test_floats_are_numbers_not_ints(self):
        assert is_number(0.5) and not is_int(0.5) and not is_number("1") and not is_int("1")

    def test_check_int_returns_the_value_at_or_above_the_minimum(self):
        assert check_int(3, "n", minimum=3) == 3 and check_int(-1, "n") == -1

    @pytest.mark.parametrize("value", [True, 2.0, "2", 0])
    def test_check_int_names_the_field_and_what_was_expected(self, value):
        with pytest.raises(SettingsError, match=rf"^n: expected a positive count, got {value!r}$"):
            check_int(value, "n", minimum=1, expected="a positive count")

    def test_check_int_raises_the_error_class_asked_for(self):
        with pytest.raises(MaskError, match="window: expected an integer, got True"):
            check_int(True, "window", error=MaskError)


class TestOneHome:
    def test_the_detector_finds_the_check_in_either_order_and_nothing_else(self):
        source = (
            "a = isinstance(v, bool) or not isinstance(v, int)\n"
            "b = isinstance(w, (int, float)) and not isinstance(w, bool)\n"
            "c = isinstance(v, bool) or v not in (0, 1)\n"  # a bit, not an int check
            "d = isinstance(v, bool) or not isinstance(w, int)\n"  # two different values
            "e = isinstance(v, (str, int, bool)) or v is None\n"  # lets bools through
        )
        assert bool_excluding_checks(source) == [1, 2]

    def test_only_the_checks_module_writes_the_bool_excluding_check(self):
        repeats = {}
        for path in source_modules():
            name = path.relative_to(REPO).as_posix()
            if name != CHECKS_MODULE and (lines := bool_excluding_checks(path.read_text(encoding="utf-8"))):
                repeats[name] = lines
        assert repeats == {}, f"use bosch_eval.runtime.checks (is_int, is_number, check_int) instead: {repeats}"

    def test_the_checks_module_is_found_by_the_detector(self):
        assert bool_excluding_checks((REPO / CHECKS_MODULE).read_text(encoding="utf-8")) != []
