"""Multi-head models (G = H) through the ``bosch`` adapter: GPT-2 has no
``num_key_value_groups`` and no ``num_key_value_heads``; it was refused before."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from lm_eval.models.huggingface import HFLM

from bosch_eval.model_adapters.bosch import BoschLM
from bosch_eval.models.random_model import save_random_checkpoint
from tests.helpers import requests


@pytest.fixture(scope="module")
def gpt2_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_random_checkpoint(tmp_path_factory.mktemp("tiny-gpt2"), family="gpt2")


def test_gpt2_all_full_scores_like_hflm_and_a_mask_changes_them(gpt2_dir: Path) -> None:
    hf = HFLM(pretrained=str(gpt2_dir), device="cpu", batch_size=3, dtype="float32")
    bosch = BoschLM(
        pretrained=str(gpt2_dir), device="cpu", batch_size=3, dtype="float32", layers="intr", ratio=0.0, window=4
    )
    assert bosch.head_mask.shape.num_kv_heads == bosch.head_mask.shape.num_heads == 4
    expected = torch.tensor([ll for ll, _ in hf.loglikelihood(requests())])
    torch.testing.assert_close(
        torch.tensor([ll for ll, _ in bosch.loglikelihood(requests())]), expected, atol=1e-5, rtol=0
    )
    swa = BoschLM(
        pretrained=str(gpt2_dir), device="cpu", batch_size=3, dtype="float32", layers="intr", ratio=1.0, window=2
    )
    assert not torch.allclose(torch.tensor([ll for ll, _ in swa.loglikelihood(requests())]), expected)
