"""Shared fixtures: tiny models built in the test session (no download). Helpers that
tests import live in ``tests/helpers.py``."""

from __future__ import annotations

from pathlib import Path

import pytest

from bosch_eval.models.random_model import save_random_checkpoint


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A local Qwen3 checkpoint directory (weights + tokenizer), as a user would pass by path."""
    return save_random_checkpoint(tmp_path_factory.mktemp("tiny-qwen3"))
