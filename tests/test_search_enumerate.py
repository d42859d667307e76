"""Exact optimum by enumeration: the mask space, placements, resume, and refusals before loading."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from bosch_eval.masks.head_mask import HeadMask, ModelShape
from bosch_eval.runtime.errors import SearchError
from bosch_eval.search.run.enumerate import enumerate_scores, main, masks_with_swa_count, place, render_optimum
from bosch_eval.search.journal.store import Journal, mask_key

SHAPE = ModelShape(num_layers=3, num_heads=4, num_kv_heads=2)
HEADER = {"model": "synthetic", "window": 8}


class Killed(Exception):
    """Stands for a kill in the middle of an evaluation."""


def planted_score(mask: HeadMask) -> float:
    """A unique optimum for 2 SWA groups among 6: layer 2 full, (1, 1) and (0, 0) kept full."""
    bits = mask.bits
    return 0.5 * bits[2][0] + 0.3 * bits[2][1] + 0.1 * bits[1][1] + 0.01 * bits[0][0]


class TestMaskSpace:
    @pytest.mark.parametrize("swa", [0, 1, 2, 3, 6])
    def test_every_mask_once_with_exact_count(self, swa: int) -> None:
        masks = list(masks_with_swa_count(SHAPE, swa))
        assert len(masks) == math.comb(6, swa)
        assert len({mask_key(bits) for bits in masks}) == len(masks)
        assert all(sum(row.count(0) for row in bits) == swa for bits in masks)

    def test_order_is_lexicographic_in_swa_cells(self) -> None:
        first, second = list(masks_with_swa_count(SHAPE, 2))[:2]
        assert first == ((0, 0), (1, 1), (1, 1))
        assert second == ((0, 1), (0, 1), (1, 1))


class TestPlace:
    SCORES = {"a": 0.9, "b": 0.8, "c": 0.8, "d": 0.5, "e": 0.1}

    def test_rank_ties_and_share_below(self) -> None:
        item = place("mine", "b", self.SCORES)
        assert (item.rank, item.ties, item.below_share) == (2, 1, 0.4)
        assert item.gap == pytest.approx(0.1)
        best = place("best", "a", self.SCORES)
        assert (best.rank, best.ties, best.gap, best.below_share) == (1, 0, 0.0, 0.8)

    def test_unknown_mask_is_named(self) -> None:
        with pytest.raises(SearchError, match="mine: mask zz is not among the 5"):
            place("mine", "zz", self.SCORES)

    def test_report_names_optimum_and_placements(self) -> None:
        text = render_optimum(self.SCORES, [place("mine", "b", self.SCORES)], "# t")
        assert "optimum S = 0.9000 (1 mask(s) reach it: `a`)" in text
        assert "| mine (`b`) | 0.8000 | 0.1000 | 2 of 5 | 1 | 40.0% |" in text


class TestEnumerateScores:
    def test_finds_planted_optimum(self, tmp_path: Path) -> None:
        journal = Journal(tmp_path / "journal.jsonl", HEADER, resume=False)
        scores = enumerate_scores(planted_score, SHAPE, 2, journal, progress=False)
        assert len(scores) == 15 and len(journal) == 15
        assert max(scores, key=scores.get) == "10/01/11"  # SWA at (0, 1) and (1, 0)

    def test_resume_evaluates_only_missing_masks(self, tmp_path: Path) -> None:
        path = tmp_path / "journal.jsonl"
        calls: list[str] = []
        kill_at = [6]  # the first run is killed during its sixth evaluation

        def counted(mask: HeadMask) -> float:
            calls.append(mask_key(mask.bits))
            if len(calls) == kill_at[0]:
                raise Killed
            return planted_score(mask)

        with pytest.raises(Killed):
            enumerate_scores(counted, SHAPE, 2, Journal(path, HEADER, resume=False), progress=False)
        assert len(Journal(path, HEADER, resume=True)) == 5
        calls.clear()
        kill_at[0] = 0
        scores = enumerate_scores(counted, SHAPE, 2, Journal(path, HEADER, resume=True), progress=False)
        assert len(calls) == 10 and len(set(calls)) == 10
        assert scores == {mask_key(bits): planted_score(HeadMask(bits, 4)) for bits in masks_with_swa_count(SHAPE, 2)}


class TestCommandLine:
    def test_too_many_masks_refused_before_loading(self, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
        assert main(["--model", "toy", "--ratio", "0.5", "--out", str(tmp_path / "o"), "--max-masks", "100"]) == 2
        assert "C(16, 8) = 12870 masks, more than --max-masks 100" in capsys.readouterr().err
        assert not (tmp_path / "o").exists()

    def test_place_with_other_swa_count_refused(self, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
        mask = tmp_path / "m.json"
        HeadMask.uniform(ModelShape(4, 8, 4), full=True, window=32).save(mask)
        assert (
            main(["--model", "toy", "--ratio", "0.875", "--out", str(tmp_path / "o"), "--place", f"full={mask}"]) == 2
        )
        assert "--place full: " in capsys.readouterr().err
        assert not (tmp_path / "o").exists()

    def test_bad_ratio_named(self, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
        assert main(["--model", "toy", "--ratio", "1.5", "--out", str(tmp_path / "o")]) == 2
        assert "--ratio: expected an SWA ratio in [0, 1], got 1.5" in capsys.readouterr().err


def test_journal_header_is_search_compatible(tmp_path: Path) -> None:
    """Scores are keyed like a search's journal, so the two can be compared line by line."""
    journal = Journal(tmp_path / "j.jsonl", HEADER, resume=False)
    enumerate_scores(planted_score, SHAPE, 1, journal, progress=False)
    first = json.loads((tmp_path / "j.jsonl").read_text().splitlines()[1])
    assert set(first) == {"key", "score", "stage", "seconds"} and first["stage"] == "enumerate"
