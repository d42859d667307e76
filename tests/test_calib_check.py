"""``bosch-eval calib-check``: the panel, the statistics and verdicts on constructed scores,
and one run end to end on the bundled toy model (resume, settings pinned)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from scipy.stats import spearmanr

from bosch_eval.cli import main
from bosch_eval.masks.head_mask import HeadMask, HeadRanking, ModelShape
from bosch_eval.runtime.errors import CalibCheckError
from bosch_eval.search.check.panel import bootstrap_ci, build_panel, layer_drops, spearman, summarize
from bosch_eval.search.check.report import make_report, render
from bosch_eval.search.check.scores import (
    SharedEvaluation,
    calib_side,
    check_dev_source,
    check_settings,
    copy_dev_scores,
    pin_settings,
    score_panel,
    scored_alike,
)

SHAPE = ModelShape(num_layers=4, num_heads=8, num_kv_heads=4)


def ranking() -> HeadRanking:
    scores = [[float(layer * 4 + group) for group in range(4)] for layer in range(4)]
    return HeadRanking(method="synthetic", scores=scores, more_local="higher", num_heads=8)


class TestPanel:
    def test_anchors_probes_then_each_ratios_masks(self):
        panel = build_panel(SHAPE, 32, [0.5, 0.75], {"syn": ranking()}, random_count=3)
        names = [item.name for item in panel]
        assert names[:6] == ["full", "all-swa", "probe-L0", "probe-L1", "probe-L2", "probe-L3"]
        assert names[6:13] == [
            "syn-r0.5",
            "intr-r0.5",
            "bme-r0.5",
            "rand-r0.5",
            "random0-r0.5",
            "random1-r0.5",
            "random2-r0.5",
        ]
        for item in panel:
            assert item.mask.window == 32
            if item.ratio is not None:
                assert item.mask.swa_ratio == item.ratio
        probe = panel[3].mask  # layer 1 all SWA, the rest full
        assert [sum(row) for row in probe.bits] == [4, 0, 4, 4]

    def test_without_probes_the_ratios_follow_the_anchors_and_the_report_has_no_layer_drops(self):
        panel = build_panel(SHAPE, 32, [0.5], {"syn": ranking()}, random_count=2, probes=False)
        assert [item.name for item in panel][:3] == ["full", "all-swa", "syn-r0.5"]
        scores = {side: {item.name: item.mask.swa_ratio for item in panel} for side in ("calib", "dev")}
        report = make_report(panel, scores, {"calib": "c", "calib_metadata": {}, "dev": "d", "dev_metadata": {}}, "cmd")
        assert report["layer_drops"] == {"calib": {}, "dev": {}} and [row["ratio"] for row in report["ratios"]] == [0.5]
        assert "Layer drops" not in render(report)

    def test_random_masks_are_the_same_on_every_run_and_differ_from_each_other(self):
        first, again = (build_panel(SHAPE, 32, [0.5], {}, random_count=4) for _ in range(2))
        randoms = [item.mask.bits for item in first if item.kind == "random"]
        assert randoms == [item.mask.bits for item in again if item.kind == "random"]
        assert len({json.dumps(mask) for mask in randoms}) == 4

    def test_a_given_mask_joins_the_nearest_ratio(self):
        given = HeadMask.from_swa_groups(
            SHAPE, {(0, 0), (1, 1), (2, 2), (3, 3), (3, 0), (2, 0), (1, 0), (0, 1)}, window=16
        )
        panel = build_panel(SHAPE, 32, [0.5, 0.875], {}, random_count=2, given={"mine": given})
        assert (panel[-1].name, panel[-1].ratio, panel[-1].mask.window) == ("mine", 0.5, 32)


class TestStatistics:
    def test_spearman_equals_scipys_with_ties(self):
        rng = np.random.default_rng(0)
        for _ in range(5):
            x, y = rng.integers(0, 4, 12).astype(float), rng.integers(0, 4, 12).astype(float)
            assert spearman(x, y) == pytest.approx(spearmanr(x, y).statistic)

    def test_constant_scores_have_no_correlation(self):
        assert math.isnan(spearman([0.5, 0.5, 0.5], [0.1, 0.2, 0.3]))

    def test_bootstrap_ci_brackets_a_strong_correlation(self):
        x = list(range(30))
        low, high = bootstrap_ci(x, [value + (3 if value % 2 else -3) for value in x])
        assert 0.8 < low <= spearman(x, x) and high <= 1.0


def panel_scores(calib_of, dev_of, full=0.9, random_count=20):
    panel = build_panel(SHAPE, 32, [0.5], {}, random_count=random_count)
    calib, dev = {"full": full, "all-swa": 0.0}, {"full": 0.9, "all-swa": 0.0}
    for index, item in enumerate(panel[2:]):
        calib[item.name], dev[item.name] = calib_of(index), dev_of(index)
    return panel, calib, dev


class TestVerdicts:
    def test_a_predictive_calibration_passes(self):
        panel, calib, dev = panel_scores(lambda i: i / 40, lambda i: i / 40 + (0.01 if i % 2 else 0))
        (summary,) = summarize(panel, calib, dev)
        assert summary.verdict == "predictive" and summary.spearman > 0.95 and summary.masks == 23

    def test_a_saturated_calibration_is_flagged(self):
        # every other mask scores at S(full) on the calibration; the dev split still separates them
        panel, calib, dev = panel_scores(lambda i: 0.9 if i % 2 else i / 40, lambda i: i / 40)
        (summary,) = summarize(panel, calib, dev)
        assert summary.verdict == "saturated" and summary.saturated_share >= 0.25

    def test_a_calibration_that_ranks_masks_otherwise_is_not_predictive(self):
        panel, calib, dev = panel_scores(lambda i: i / 40, lambda i: ((i * 7) % 24) / 40)
        (summary,) = summarize(panel, calib, dev)
        assert summary.verdict == "not predictive"

    def test_a_calibration_whose_favourite_fails_on_dev_is_flagged_despite_the_correlation(self):
        # 43 masks ranked alike on both tasks, except the calibration's favourite, which the dev task scores 0
        panel, calib, dev = panel_scores(
            lambda i: 0.85 if i == 42 else i / 100, lambda i: 0.0 if i == 42 else i / 100, random_count=40
        )
        (summary,) = summarize(panel, calib, dev)
        assert summary.spearman >= 0.8 and summary.top_regret == pytest.approx(
            0.46
        )  # the best dev mask (i = 46) scores 0.46
        assert summary.verdict == "not predictive at the top"

    def test_equal_favourites_count_by_their_mean_dev_score(self):
        # the ratio's masks are i = 4 … 26 (after four probes); two favourites, i = 25 and 26
        panel, calib, dev = panel_scores(lambda i: 0.8 if i >= 25 else i / 100, lambda i: 0.0 if i == 26 else i / 100)
        (summary,) = summarize(panel, calib, dev)
        assert summary.top_regret == pytest.approx(0.25 - (0.25 + 0.0) / 2)

    def test_a_calibration_the_model_cannot_solve_says_so_first(self):
        panel, calib, dev = panel_scores(lambda i: i / 400, lambda i: i / 40, full=0.05)
        assert summarize(panel, calib, dev)[0].verdict == "not solvable"

    def test_a_dev_task_that_full_attention_fails_cannot_judge(self):
        # a predictive-looking calibration, but the dev task scores full attention as every group SWA
        panel, calib, dev = panel_scores(lambda i: i / 40, lambda i: 0.0)
        dev["full"] = 0.0
        assert summarize(panel, calib, dev)[0].verdict == "dev cannot judge"
        dev["full"] = 0.01  # above the all-SWA floor: the other rules decide
        assert summarize(panel, calib, dev)[0].verdict == "not predictive"

    def test_floor_tied_masks_are_left_out_of_the_correlation(self):
        # 8 of the ratio's 23 masks sit at the floor on both sides; the others are ranked otherwise on dev
        panel, calib, dev = panel_scores(
            lambda i: 0.0 if i < 12 else i / 40, lambda i: 0.0 if i < 12 else ((i * 7) % 24 + 1) / 40
        )
        (summary,) = summarize(panel, calib, dev)
        names = [item.name for item in panel if item.ratio == 0.5]
        off = [name for name in names if calib[name] > 0 or dev[name] > 0]
        assert summary.floor_tied == 8 == len(names) - len(off)
        assert summary.spearman == pytest.approx(spearman([calib[n] for n in off], [dev[n] for n in off]))
        assert summary.spearman < spearman([calib[n] for n in names], [dev[n] for n in names])  # the ties flattered it
        assert summary.verdict == "not predictive"

    def test_most_masks_at_the_floor_is_saturated_at_the_floor(self):
        # 14 of 23 at the floor on both sides; the other 9 ranked alike, which alone would pass
        panel, calib, dev = panel_scores(lambda i: 0.0 if i < 18 else i / 40, lambda i: 0.0 if i < 18 else i / 40)
        (summary,) = summarize(panel, calib, dev)
        assert summary.floor_tied == 14 and summary.spearman == pytest.approx(1.0)
        assert summary.verdict == "saturated at the floor"

    def test_a_mask_off_the_floor_on_one_side_counts(self):
        # at the calibration floor but not on dev: the calibration misses what dev sees, so it is kept
        panel, calib, dev = panel_scores(lambda i: 0.0 if i < 18 else i / 40, lambda i: i / 40)
        (summary,) = summarize(panel, calib, dev)
        assert summary.floor_tied == 0 and summary.verdict != "saturated at the floor"

    def test_layer_drops_are_full_minus_each_probe(self):
        panel = build_panel(SHAPE, 32, [0.5], {}, random_count=2)
        scores = {"full": 0.9, "probe-L0": 0.2, "probe-L1": 0.9, "probe-L2": 0.95, "probe-L3": 0.0}
        assert layer_drops(panel, scores) == pytest.approx({0: 0.7, 1: 0.0, 2: -0.05, 3: 0.9})


def test_scores_are_journaled_and_a_resumed_run_scores_nothing_twice(tmp_path: Path):
    panel = build_panel(SHAPE, 32, [0.5], {}, random_count=2)
    calls: list[str] = []

    def objective(side: str):
        def score(mask: HeadMask) -> float:
            calls.append(side)
            if len(calls) == 5:
                raise KeyboardInterrupt  # killed mid-run
            return mask.swa_ratio

        return score

    journal = tmp_path / "scores.jsonl"
    with pytest.raises(KeyboardInterrupt):
        score_panel(panel, {"calib": objective("calib"), "dev": objective("dev")}, journal)
    assert len(journal.read_text().splitlines()) == 4
    scores = score_panel(panel, {"calib": objective("calib"), "dev": objective("dev")}, journal)
    assert len(calls) == 5 + 2 * len(panel) - 4
    assert len(journal.read_text().splitlines()) == 2 * len(panel)
    assert scores["calib"]["all-swa"] == 1.0 and scores["dev"]["full"] == 0.0


def test_several_calibration_metrics_share_one_evaluation_and_each_gets_its_verdict(tmp_path: Path):

    panel = build_panel(SHAPE, 32, [0.5], {"syn": ranking()}, random_count=3)
    evaluations: list[HeadMask] = []

    def kept(mask: HeadMask) -> float:  # fewer SWA groups, then full groups in lower layers, score higher
        return (
            1.0 - mask.swa_ratio + 0.001 * sum(bit / (layer + 1) for layer, row in enumerate(mask.bits) for bit in row)
        )

    class Objective:  # "acc" agrees with dev, "anti" orders masks the other way round
        def scores(self, mask: HeadMask, metrics: list[str]) -> dict[str, float]:
            evaluations.append(mask)
            anchor = mask.swa_ratio in (0.0, 1.0)  # the anchors as acc scores them, the other masks reversed
            return {"acc": kept(mask), "anti": kept(mask) if anchor else 1.0 - kept(mask), "half": kept(mask) / 2}

    metrics = ["acc", "anti", "half"]
    shared = SharedEvaluation(Objective(), metrics)
    sides = {calib_side(metric, metrics): shared.side(metric) for metric in metrics}
    assert list(sides) == ["calib", "calib:anti", "calib:half"]  # the headline keeps the journal's old side
    scores = score_panel(panel, {**sides, "dev": kept}, tmp_path / "scores.jsonl")
    assert len(evaluations) == len(panel)  # one evaluation per mask, both metrics read from it
    settings = {
        "calib": "c",
        "calib_metadata": {},
        "dev": "d",
        "dev_metadata": {},
        "calib_metric": metrics,
        "dev_metric": "score",
    }
    report = make_report(panel, scores, settings, "cmd")
    assert report["status"] == "complete"
    (headline,), (other,) = report["ratios"], report["by_metric"]["anti"]["ratios"]
    assert headline["spearman"] > 0.9 and other["spearman"] < -0.9
    assert headline["verdict"] == "predictive" and other["verdict"] == "not predictive"
    # A probability-like metric below 0.8 under full attention: solvability is the headline's to say.
    assert report["by_metric"]["half"]["ratios"][0]["verdict"] == "predictive"
    text = render(report)
    assert "scored by `acc`" in text and "Scored by `anti` instead of `acc`" in text and "scored by `score`" in text
    assert "| mask | ratio | calib | calib anti | calib half | dev |" in text


def test_a_partial_check_reports_the_probes_and_only_the_ratios_whose_masks_are_all_scored(tmp_path: Path):
    panel = build_panel(SHAPE, 32, [0.5, 0.75], {"syn": ranking()}, random_count=3)
    reports: list[dict | None] = []

    def objective(side: str):
        def score(mask: HeadMask) -> float:
            return 1.0 - mask.swa_ratio + (0.01 if side == "dev" else 0.0)

        return score

    def on_scores(scores: dict[str, dict[str, float]]) -> None:
        reports.append(
            make_report(panel, scores, {"calib": "c", "calib_metadata": {}, "dev": "d", "dev_metadata": {}}, "cmd")
        )

    score_panel(
        panel, {"calib": objective("calib"), "dev": objective("dev")}, tmp_path / "scores.jsonl", on_scores=on_scores
    )
    assert reports[0] is None and reports[3] is None  # nothing, then one anchor, until both anchors have both sides
    first_ratio = 2 * (2 + SHAPE.num_layers + sum(item.ratio == 0.5 for item in panel))
    before, at = reports[first_ratio - 1], reports[first_ratio]  # reports[k]: after k scores
    assert before["status"] == f"partial: {first_ratio - 1} of {2 * len(panel)} scores" and before["ratios"] == []
    assert set(before["layer_drops"]["calib"]) == set(range(SHAPE.num_layers))
    assert [row["ratio"] for row in at["ratios"]] == [0.5]
    assert all(mask["ratio"] in (None, 0.5) for mask in at["masks"])
    assert "**Partial check**" in render(at)
    final = reports[-1]
    assert final["status"] == "complete" and [row["ratio"] for row in final["ratios"]] == [0.5, 0.75]
    assert "Partial" not in render(final)


@pytest.mark.slow
def test_calib_check_end_to_end_on_the_toy_model(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    out = tmp_path / "check"
    argv = ["calib-check", "--model", "toy", "--calib-len", "256", "--calib-examples", "4", "--ratios", "0.5",
            "--random", "2", "--dev-metadata", '{"dev_lengths": [384], "dev_samples": 1}', "--out", str(out)]  # fmt: skip
    assert main(argv) == 0
    report = json.loads((out / "check.json").read_text())
    assert [row["ratio"] for row in report["ratios"]] == [0.5]
    assert report["ratios"][0]["verdict"] in {
        "not solvable",
        "dev cannot judge",
        "saturated",
        "predictive",
        "not predictive",
    }
    assert {m["name"] for m in report["masks"]} >= {"full", "all-swa", "probe-L3", "intr-r0.5", "random1-r0.5"}
    assert "Spearman calib~dev" in (out / "report.md").read_text()
    lines = (out / "scores.jsonl").read_text()
    assert main(argv) == 0  # resumed: nothing scored again
    assert (out / "scores.jsonl").read_text() == lines
    capsys.readouterr()
    other = [item if item != "2" else "3" for item in argv]  # --random 3
    from unittest import mock

    with mock.patch("bosch_eval.search.check.runner.build_objective", side_effect=AssertionError("loaded the model")):
        assert main(other) == 2  # refused before the model loads
    assert "made with other settings (random)" in capsys.readouterr().err
    check = (out / "check.json").read_text()
    assert main([*other, "--new-settings"]) == 0  # asked for: the old check is kept beside the new one
    (kept,) = (out / "previous").iterdir()
    assert (kept / "check.json").read_text() == check and (kept / "scores.jsonl").read_text() == lines
    assert json.loads((kept / "settings.json").read_text())["random"] == 2
    assert json.loads((out / "settings.json").read_text())["random"] == 3


@pytest.mark.slow
def test_a_failed_check_pins_no_settings(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    out = tmp_path / "check"
    common = ["calib-check", "--model", "toy", "--calib-len", "256", "--calib-examples", "2", "--ratios", "0.5",
              "--random", "2", "--dev-metadata", '{"dev_lengths": [384], "dev_samples": 1}', "--out", str(out)]  # fmt: skip
    assert main([*common, "--calib", "no_such_task"]) == 2
    assert "no_such_task" in capsys.readouterr().err
    assert not (out / "settings.json").exists()
    assert main(common) == 0  # the corrected command is not refused


def _objective_settings(monkeypatch: pytest.MonkeyPatch, out: Path, *flags: str) -> tuple:
    """The (calibration, load) settings that ``calib-check --model toy FLAGS`` builds its objective with."""
    from bosch_eval.search.check import runner

    seen = []

    def loaded(model, calibration, load):
        seen.append((calibration, load))
        raise CalibCheckError("stop before scoring")

    monkeypatch.setattr(runner, "build_objective", loaded)
    assert main(["calib-check", "--model", "toy", *flags, "--out", str(out)]) == 2
    return seen[0]


def test_sinks_reach_every_score_through_the_adapter(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    _, load = _objective_settings(monkeypatch, tmp_path / "check", "--sink", "4")
    assert load.model_args == {"sink": 4}  # the adapter's sink= overrides every mask's own sinks
    _, load = _objective_settings(monkeypatch, tmp_path / "plain")
    assert load.model_args is None


def test_the_calibration_metric_reaches_the_calibration_objective(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    calibration, _ = _objective_settings(monkeypatch, tmp_path / "check", "--calib-metric", "acc")
    assert calibration.metric == "acc"
    calibration, _ = _objective_settings(monkeypatch, tmp_path / "plain")
    assert calibration.metric == "acc_tiebreak"  # the search's default (issue 67)


def test_a_negative_sink_count_is_refused_before_the_model_loads(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    from unittest import mock

    with mock.patch("bosch_eval.search.check.runner.build_objective", side_effect=AssertionError("loaded the model")):
        assert main(["calib-check", "--model", "toy", "--sink", "-1", "--out", str(tmp_path / "check")]) == 2
    assert "--sink: expected an integer >= 0" in capsys.readouterr().err


class TestPinnedSettings:
    """settings.json pins files by content and a bundled model by its alias: a check resumes
    from any clone, and one an older bosch-eval pinned by paths still does."""

    def args(self, tmp_path: Path, ranking: Path) -> tuple:
        from argparse import Namespace

        args = Namespace(model="toy", calib="bosch_niah_calib", calib_metadata={}, dev="bosch_niah_dev", dev_metadata={},
                         ratios=[0.5], random=2, window=None, calib_len=None, calib_examples=None, dtype=None, no_probes=False, sink=None,
                         calib_metric=["acc"], dev_metric="acc", dev_gen_kwargs={})  # fmt: skip
        return args, [("apl", str(ranking))], []

    @pytest.mark.parametrize(
        ("attribute", "value", "key"),
        [("dtype", "bfloat16", "dtype"), ("sink", 4, "sink"), ("calib_metric", ["acc_tiebreak"], "calib_metric"),
         ("calib_metric", ["acc", "prob"], "calib_metric"), ("dev_metric", "score", "dev_metric"), ("dev_gen_kwargs", {"max_gen_toks": 64}, "dev_gen_kwargs"), ("no_probes", True, "probes")],
    )  # fmt: skip
    def test_a_setting_is_pinned_only_when_given(self, tmp_path: Path, attribute: str, value: Any, key: str) -> None:
        """A check made before the flag existed (its default) resumes; another value is refused, named."""

        ranking = tmp_path / "apl.json"
        ranking.write_text('{"scores": 1}')
        args, rankings, masks = self.args(tmp_path, ranking)
        assert key not in check_settings(args, rankings, masks)
        out = tmp_path / "out"
        out.mkdir()
        pin_settings(out, check_settings(args, rankings, masks), new_settings=False)
        setattr(args, attribute, value)
        with pytest.raises(CalibCheckError, match=rf"other settings \({key}\)"):
            pin_settings(out, check_settings(args, rankings, masks), new_settings=False)

    def test_a_moved_file_with_the_same_content_matches(self, tmp_path: Path) -> None:

        first, second = tmp_path / "a" / "apl.json", tmp_path / "b" / "apl.json"
        for path in (first, second):
            path.parent.mkdir()
            path.write_text('{"scores": 1}')
        out = tmp_path / "out"
        out.mkdir()
        pin_settings(out, check_settings(*self.args(tmp_path, first)), new_settings=False)
        pin_settings(out, check_settings(*self.args(tmp_path, second)), new_settings=False)  # no error
        second.write_text('{"scores": 2}')
        with pytest.raises(CalibCheckError, match=r"other settings \(ranking\)"):
            pin_settings(out, check_settings(*self.args(tmp_path, second)), new_settings=False)

    def test_settings_pinned_by_path_still_match(self, tmp_path: Path) -> None:

        ranking = tmp_path / "apl.json"
        ranking.write_text('{"scores": 1}')
        args, rankings, masks = self.args(tmp_path, ranking)
        old = {**check_settings(args, rankings, masks), "ranking": [f"apl={ranking}"], "mask": [],
               "model": "/elsewhere/bosch_eval/toy/model"}  # fmt: skip
        out = tmp_path / "out"
        out.mkdir()
        (out / "settings.json").write_text(json.dumps(old))
        pin_settings(out, check_settings(args, rankings, masks), new_settings=False)  # no error


class TestDevScoresFrom:
    """--dev-scores-from: a check of another calibration reuses the dev scores of the same masks,
    and only from a check whose dev side would have scored them alike."""

    def settings(self, **changes: Any) -> dict:
        settings = {"calib": "bosch_niah_calib", "calib_metadata": {}, "dev": "bosch_niah_dev", "dev_metadata": {"dev_samples": 8},
                    "ratios": [0.5], "random": 2, "window": None, "calib_len": None, "calib_examples": None, "dtype": "bfloat16",
                    "sink": 4, "model": "toy", "ranking": {"apl": {"sha256": "a" * 64}}, "mask": {}}  # fmt: skip
        return {**settings, **changes}

    def source(self, tmp_path: Path, **changes: Any) -> Path:
        source = tmp_path / "source"
        source.mkdir()
        (source / "settings.json").write_text(json.dumps(self.settings(**changes)))
        (source / "scores.jsonl").write_text("")
        return source

    def test_a_check_of_another_calibration_or_metric_may_take_the_dev_scores(self, tmp_path: Path) -> None:

        source = self.source(tmp_path, calib="bosch_retrieval_calib", ratios=[0.75, 0.5], random=21, probes=False)
        check_dev_source(source, self.settings(calib_metric="acc_tiebreak"))  # no error

    @pytest.mark.parametrize(
        ("changes", "named"),
        [({"dev_metadata": {"dev_samples": 24}}, "dev_metadata"), ({"sink": 0}, "sink"), ({"dtype": None}, "dtype"),
         ({"ranking": {"apl": {"sha256": "b" * 64}}}, "ranking apl")],
    )  # fmt: skip
    def test_a_check_whose_dev_side_differs_is_refused_naming_the_setting(
        self, tmp_path: Path, changes: dict, named: str
    ) -> None:

        source = self.source(tmp_path, **changes)
        with pytest.raises(
            CalibCheckError, match=rf"{source}/settings.json was made with other dev settings \({named}\)"
        ):
            check_dev_source(source, self.settings())

    def test_only_masks_the_source_scored_alike_take_its_dev_scores(self, tmp_path: Path) -> None:
        from bosch_eval.search.check.panel import PanelMask

        source = self.source(tmp_path, mask={"mine": {"sha256": "c" * 64}})
        ours = self.settings(ranking={"apl": {"sha256": "a" * 64}, "new": {"sha256": "d" * 64}},
                             mask={"mine": {"sha256": "c" * 64}, "rand-r0.5": {"sha256": "e" * 64}})  # fmt: skip
        shared = check_dev_source(source, ours)
        assert shared == {"ranking": {"apl"}, "mask": {"mine"}}
        mask = HeadMask.uniform(ModelShape(2, 4, 2), full=True)
        kinds = {"full": "anchor", "random0-r0.5": "random", "apl-r0.5": "ranking", "new-r0.5": "ranking", "mine": "given",
                 "rand-r0.5": "given"}  # a file named like the source's layer heuristic is not that mask  # fmt: skip
        alike = {name for name, kind in kinds.items() if scored_alike(PanelMask(name, kind, 0.5, mask), shared)}
        assert alike == {"full", "random0-r0.5", "apl-r0.5", "mine"}

    def test_a_directory_that_is_no_check_is_refused(self, tmp_path: Path) -> None:

        with pytest.raises(
            CalibCheckError, match=r"settings.json does not exist; expected the output directory of a calib-check"
        ):
            check_dev_source(tmp_path, self.settings())
        (self.source(tmp_path) / "scores.jsonl").unlink()  # settings pinned, nothing scored
        with pytest.raises(
            CalibCheckError, match=r"scores.jsonl does not exist; expected the output directory of a calib-check"
        ):
            check_dev_source(tmp_path / "source", self.settings())

    def test_a_bad_source_is_refused_before_the_model_loads(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        from unittest import mock

        argv = [
            "calib-check",
            "--model",
            "toy",
            "--dev-scores-from",
            str(tmp_path / "nothing"),
            "--out",
            str(tmp_path / "check"),
        ]
        with mock.patch(
            "bosch_eval.search.check.runner.build_objective",
            side_effect=AssertionError("loaded the model"),
        ):
            assert main(argv) == 2
        assert "--dev-scores-from: " in capsys.readouterr().err
        assert not (tmp_path / "check" / "settings.json").exists()

    def test_only_the_panels_missing_dev_scores_are_copied_once(self, tmp_path: Path) -> None:

        source = tmp_path / "scores.jsonl"
        records = [{"side": "calib", "name": "full", "score": 0.9}, {"side": "dev", "name": "full", "score": 0.8},
                   {"side": "dev", "name": "other", "score": 0.1}, {"side": "dev", "name": "all-swa", "score": 0.2}]  # fmt: skip
        source.write_text("".join(json.dumps(record) + "\n" for record in records))
        journal = tmp_path / "check" / "scores.jsonl"
        journal.parent.mkdir()
        journal.write_text(json.dumps({"side": "dev", "name": "all-swa", "score": 0.3}) + "\n")  # scored here already
        for _ in range(2):
            copy_dev_scores(source, journal, {"full", "all-swa"})
        lines = [json.loads(line) for line in journal.read_text().splitlines()]
        assert lines == [
            {"side": "dev", "name": "all-swa", "score": 0.3},
            {"side": "dev", "name": "full", "score": 0.8},
        ]
        assert score_panel([], {"calib": None, "dev": None}, journal) == {
            "calib": {},
            "dev": {"all-swa": 0.3, "full": 0.8},
        }
