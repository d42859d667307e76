"""The bosch-eval command line: mask show, mask from-ranking and mask from-layers."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from bosch_eval.cli import main
from bosch_eval.masks.head_mask import HeadMask, HeadRanking


@pytest.fixture
def ranking_file(tmp_path):
    scores = ((0.9, 0.1, 0.5, 0.2), (0.3, 0.8, 0.4, 0.7))
    path = tmp_path / "ranking.json"
    HeadRanking(scores, "higher", "dcam", 8, window=16, model="tiny").save(path)
    return path


def test_from_ranking_writes_mask_and_show_prints_it(ranking_file, tmp_path, capsys):
    out = tmp_path / "mask.json"
    assert main(["mask", "from-ranking", str(ranking_file), "--ratio", "0.5", "--out", str(out)]) == 0
    mask = HeadMask.load(out)
    assert mask.bits == ((0, 1, 0, 1), (1, 0, 1, 0)) and mask.window == 16 and mask.method == "dcam"
    capsys.readouterr()
    assert main(["mask", "show", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "L=2 layers × G=4 KV groups (H=8 query heads)" in printed
    assert "SWA ratio  0.5000 (4 of 8 KV groups)" in printed
    assert "window     16" in printed and "method     dcam" in printed
    assert "layer 0    ·█·█" in printed and "layer 1    █·█·" in printed


def test_from_layers_writes_the_heuristics_mask_for_the_models_shape(tmp_path):
    out = tmp_path / "mask.json"
    assert (
        main(["mask", "from-layers", "bme", "--model", "toy", "--ratio", "0.75", "--window", "32", "--out", str(out)])
        == 0
    )
    mask = HeadMask.load(out)
    # toy: 4 layers x 4 groups; BME keeps one layer full, the begin block (docs/masks.md)
    assert mask.bits == ((1, 1, 1, 1), (0, 0, 0, 0), (0, 0, 0, 0), (0, 0, 0, 0))
    assert (mask.window, mask.method, mask.model) == (32, "bme", "toy")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["mask", "show", "nope.json"], "nope.json: no such file"),
        (
            ["mask", "from-layers", "nope", "--model", "toy", "--ratio", "0.5", "--out", "x.json"],
            "unknown layer heuristic 'nope'",
        ),
        (
            ["mask", "from-ranking", "RANKING", "--ratio", "1.2", "--out", "x.json"],
            "expected an SWA ratio in [0, 1], got 1.2",
        ),
    ],
)
def test_errors_exit_2_with_message(ranking_file, tmp_path, capsys, argv, message):
    argv = [str(ranking_file) if a == "RANKING" else a for a in argv]
    assert main(argv) == 2
    assert message in capsys.readouterr().err


@pytest.mark.slow
def test_console_script_is_installed():
    executable = Path(sys.executable).parent / "bosch-eval"
    assert executable.exists(), f"no {executable}: install the package (pip install -e .)"
    result = subprocess.run([str(executable), "mask", "--help"], capture_output=True, text=True, check=True)
    assert "from-ranking" in result.stdout
