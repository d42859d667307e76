"""The claimant's paired comparisons against every rival, Holm-adjusted (issue 53, item 6)."""

from __future__ import annotations

import json

import pytest

from bosch_eval.compare.claims import claims_of, holm_adjusted, write_claims
from bosch_eval.compare.leaderboard import EntryRuns, build_rows
from bosch_eval.compare.paired_ci import paired_bootstrap_ci
from bosch_eval.compare.results import RunResults
from bosch_eval.masks.head_mask import HeadMask

MASK = HeadMask.from_rows([[1, 1]], 2, window=4)


def test_holm_adjusts_in_step_down_order_and_keeps_the_input_order():
    # Sorted 0.01, 0.02, 0.03, 0.5 of m = 4: 0.04, 0.06, 0.06 (made non-decreasing from 0.06), 0.5.
    assert holm_adjusted([0.03, 0.5, 0.01, 0.02]) == pytest.approx([0.06, 0.5, 0.04, 0.06])
    assert holm_adjusted([0.4, 0.3]) == pytest.approx([0.6, 0.6])  # 2 · 0.3, then at least that
    assert holm_adjusted([0.9, 0.8]) == [1.0, 1.0]  # capped
    assert holm_adjusted([]) == []


def test_the_p_value_is_two_sided_and_near_one_without_a_difference():
    ref = {(None, i): float(i % 2) for i in range(200)}
    same = paired_bootstrap_ci(dict(ref), ref)
    assert same.difference == 0 and same.p_value == 1.0
    # One document of 200 gains 1: +0.005, which 200 documents cannot resolve.
    better = paired_bootstrap_ci({key: value + (key[1] == 3) for key, value in ref.items()}, ref)
    assert better.difference == pytest.approx(0.005) and 0.3 < better.p_value <= 1.0


def _entry(name: str, values: list[float]) -> EntryRuns:
    run = RunResults(
        results={"t": {"acc,none": sum(values) / len(values)}},
        samples={"t": [{"doc_id": i, "acc": v} for i, v in enumerate(values)]},
    )
    return EntryRuns(name, [run], {}, MASK)


def test_claims_pair_the_claimant_with_each_rival_best_first_and_skip_the_reference(tmp_path):
    n = 60
    entries = [
        _entry("original", [1.0] * n),
        _entry("bosch", [1.0] * (n - 6) + [0.0] * 6),  # 0.9
        _entry("weak", [1.0] * (n // 2) + [0.0] * (n // 2)),  # 0.5: bosch is higher, resolved
        _entry("close", [1.0] * (n - 7) + [0.0] * 7),  # 0.883: one document apart, not resolved
    ]
    rows = build_rows(entries, "original", None, tasks=["t"])
    claims = claims_of("bosch", entries, rows, "original", ["t"])
    assert [c.rival for c in claims] == ["close", "weak"]
    close, weak = claims
    assert close.difference == pytest.approx(1 / n) and close.verdict == "not resolved"
    assert weak.difference == pytest.approx(0.4) and weak.verdict == "higher" and weak.p_holm < 0.05
    # The smaller p of two is doubled, the other kept at least as large.
    assert weak.p_holm == pytest.approx(min(1.0, 2 * weak.p_value)) and close.p_holm == pytest.approx(
        max(weak.p_holm, close.p_value)
    )
    assert weak.n_docs == n

    write_claims(tmp_path, "bosch", claims, {"command": "bosch-eval compare ..."})
    table = (tmp_path / "claims.md").read_text()
    assert "| weak | 0.500 | +0.400 [" in table and "Holm-adjusted over the 2 rivals" in table
    assert json.loads((tmp_path / "claims.json").read_text())["claims"][1]["verdict"] == "higher"


def test_no_claims_before_the_claimant_has_run():
    entries = [_entry("original", [1.0, 1.0]), _entry("weak", [1.0, 0.0])]
    rows = build_rows(entries, "original", None, tasks=["t"])
    assert claims_of("bosch", entries, rows, "original", ["t"]) == []
