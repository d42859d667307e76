"""bosch-eval analyze on hand-made masks with known Jaccard, turnover and replacement results."""

from __future__ import annotations

import pytest

from bosch_eval.analyze.mask_stats import jaccard, turnover
from bosch_eval.analyze.replace import replace_heads
from bosch_eval.cli import main
from bosch_eval.masks.head_mask import HeadMask, HeadRanking
from bosch_eval.runtime.errors import MaskError


def mask(rows, **meta):
    return HeadMask.from_rows(rows, 4, window=4, **meta)


def test_jaccard_known_values():
    a = mask([[0, 0, 1, 1], [1, 1, 1, 1]])  # SWA {(0,0), (0,1)}
    b = mask([[0, 1, 0, 1], [1, 1, 1, 1]])  # SWA {(0,0), (0,2)}
    assert jaccard(a, b) == pytest.approx(1 / 3)
    assert jaccard(a, a) == 1.0
    full = mask([[1] * 4, [1] * 4])
    assert jaccard(full, full) == 1.0 and jaccard(a, full) == 0.0


def test_turnover_known_values():
    # 8 groups; ρ_s = 0.25 (2 SWA), ρ_l = 0.5 (4 SWA).
    small = mask([[0, 0, 1, 1], [1, 1, 1, 1]])
    nested = mask([[0, 0, 0, 0], [1, 1, 1, 1]])
    half_out = mask([[0, 1, 1, 1], [0, 0, 0, 1]])  # keeps (0,0), drops (0,1)
    assert turnover(small, nested) == (0.0, 1.0, 0.0)
    assert turnover(small, half_out) == (0.5, 1.0, 0.5)
    # The paper's example: T_max(0.5, 0.75) = 0.5.
    half = mask([[0, 0, 0, 0], [1, 1, 1, 1]])
    three_quarters = mask([[0, 0, 1, 1], [0, 0, 0, 0]])
    t, t_max, norm = turnover(half, three_quarters)
    assert (t, t_max, norm) == (0.5, 0.5, 1.0)
    with pytest.raises(MaskError, match="turnover"):
        turnover(three_quarters, half)


def test_replace_heads():
    # Ranking: higher = more local; its top-2 are (1,3), (1,2). The mask's SWA: (0,0), (1,3).
    scores = [[0.5, 0.1, 0.2, 0.3], [0.0, 0.05, 0.8, 0.9]]
    ranking = HeadRanking(tuple(map(tuple, scores)), "higher", "fisher", 4, window=4)
    m = mask([[0, 1, 1, 1], [1, 1, 1, 0]], provenance={"calibration": {"tasks": ["t"]}})
    forward, reverse = replace_heads(m, ranking, 1)
    assert forward.bits == ((1, 1, 1, 1), (1, 1, 0, 0))  # (0,0) out, (1,2) in
    assert reverse.bits == m.bits  # the ranking's pick with (0,0) in for (1,2)
    assert forward.provenance["calibration"] == {"tasks": ["t"]}  # still in-sample on t
    with pytest.raises(MaskError, match="differ in only 1"):
        replace_heads(m, ranking, 2)


def test_cli_overlap_and_turnover(tmp_path, capsys):
    paths = []
    for name, rows in (("a", [[0, 0, 1, 1], [1, 1, 1, 1]]), ("b", [[0, 1, 0, 1], [0, 0, 1, 1]])):
        path = tmp_path / f"{name}.json"
        mask(rows).save(path)
        paths.append(f"{name}={path}")
    assert main(["analyze", "overlap", *paths, "--out", str(tmp_path / "o")]) == 0
    assert "| a | 1.000 | 0.200 |"  # {(0,0)} over 5 groups in (tmp_path / "o" / "jaccard.md").read_text()
    assert (tmp_path / "o" / "jaccard.png").stat().st_size > 0
    assert main(["analyze", "turnover", *paths, "--out", str(tmp_path / "t.md")]) == 0
    assert "| 0.25 → 0.5 | 50.0% | 100.0% | 50.0% |" in (tmp_path / "t.md").read_text()


def test_cli_replace_and_windows_write_compare_entries(tmp_path):
    from bosch_eval.compare.spec import load_spec

    m = tmp_path / "m.json"
    mask([[0, 1, 1, 1], [1, 1, 1, 0]]).save(m)
    r = tmp_path / "r.json"
    HeadRanking(((0.5, 0.1, 0.2, 0.3), (0.0, 0.05, 0.8, 0.9)), "higher", "fisher", 4, window=4).save(r)
    assert (
        main(["analyze", "replace", "--mask", str(m), "--ranking", str(r), "--k", "1", "--out", str(tmp_path / "rep")])
        == 0
    )
    assert HeadMask.load(tmp_path / "rep" / "mask+1fisher.json").bits == ((1, 1, 1, 1), (1, 1, 0, 0))
    assert (
        main(["analyze", "windows", "--mask", str(m), "--windows", "8", "16", "--out", str(tmp_path / "w.yaml")]) == 0
    )
    for entries in ("rep/entries.yaml", "w.yaml"):  # both are valid leaderboard entries
        lb = tmp_path / f"lb-{entries.replace('/', '-')}"
        lb.write_text("model: toy\ntasks: [t]\n" + (tmp_path / entries).read_text())
        assert len(load_spec(lb).entries) == 2
    assert load_spec(tmp_path / "lb-w.yaml").entries[1].model_args == {"mask": str(m), "window": "16"}
