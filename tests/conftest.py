"""Shared fixtures: tiny models built in the test session (no download)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from bosch_eval.random_model import save_random_checkpoint


def left_padded_batch(vocab: int, lengths: list[int], seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """Input ids and attention mask of rows with different lengths, left-padded."""
    generator = torch.Generator().manual_seed(seed)
    total = max(lengths)
    ids = torch.randint(3, vocab, (len(lengths), total), generator=generator)
    attention = torch.zeros(len(lengths), total, dtype=torch.long)
    for row, length in enumerate(lengths):
        attention[row, total - length :] = 1
        ids[row, : total - length] = 0
    return ids, attention


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A local Qwen3 checkpoint directory (weights + tokenizer), as a user would pass by path."""
    return save_random_checkpoint(tmp_path_factory.mktemp("tiny-qwen3"))
