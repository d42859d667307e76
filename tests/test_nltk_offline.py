"""Offline, lm-eval's RULER tasks printed nltk's download errors and then "Downloaded punkt_tab
on rank 0" (issue 40): one warning that says what is missing and who needs it instead."""

from __future__ import annotations

import logging
import subprocess
import sys
import types
from unittest import mock

import pytest

from bosch_eval.runtime.nltk_offline import FALSE_CLAIM, nltk_download_explained


def fake_nltk(works: bool) -> types.ModuleType:
    module = types.ModuleType("nltk")

    def download(info_or_id=None, quiet=False, print_error_to=sys.stderr, **kwargs):  # noqa: ANN001, ANN003, ANN202
        if not works:
            print("[nltk_data] Error loading punkt_tab: refusing to connect", file=print_error_to)
        return works

    module.download = download
    return module


def ruler_import(nltk: types.ModuleType) -> None:
    """What lm-eval 0.4.13's ruler/prepare_niah.py does at import."""
    nltk.download("punkt_tab")
    print(FALSE_CLAIM)
    print("Generating synthetic samples")


def test_a_failed_download_is_one_warning_and_no_false_claim(
    capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    nltk = fake_nltk(works=False)
    with mock.patch.dict(sys.modules, {"nltk": nltk}), caplog.at_level(logging.WARNING), nltk_download_explained():
        ruler_import(nltk)
    out, err = capsys.readouterr()
    assert out == "Generating synthetic samples\n" and "[nltk_data]" not in err
    (record,) = caplog.records
    assert (
        "punkt_tab" in record.getMessage()
        and "niah_single_2" in record.getMessage()
        and "nltk.downloader" in record.getMessage()
    )
    assert nltk.download("punkt_tab") is False  # restored: the real function again


def test_a_download_that_works_changes_nothing(
    capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    nltk = fake_nltk(works=True)
    with mock.patch.dict(sys.modules, {"nltk": nltk}), nltk_download_explained():
        ruler_import(nltk)
    assert capsys.readouterr().out == f"{FALSE_CLAIM}\nGenerating synthetic samples\n" and not caplog.records


RULER = """
import logging
logging.basicConfig(level=logging.WARNING)
from bosch_eval.runtime.lm_eval_session import load_task, task_manager
from bosch_eval.models.model_check import model_path
path = str(model_path("toy"))
manager = task_manager(["niah_single_1"], None, {"pretrained": path, "tokenizer": path, "max_seq_lengths": [256]})
load_task(manager, "niah_single_1")
"""


@pytest.mark.slow
def test_building_a_ruler_task_offline_says_what_is_missing() -> None:
    nltk = pytest.importorskip("nltk")
    try:
        nltk.data.find("tokenizers/punkt_tab")
        pytest.skip("punkt_tab is installed here: nothing to download")
    except LookupError:
        pass
    out = subprocess.run([sys.executable, "-c", RULER], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    if "could not be downloaded" not in out.stderr:
        pytest.skip("punkt_tab was downloaded: this machine reaches the network")
    assert FALSE_CLAIM not in out.stdout and "[nltk_data]" not in out.stdout + out.stderr
