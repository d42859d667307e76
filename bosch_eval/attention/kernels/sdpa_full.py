"""Causal attention exactly as the unpatched model runs it: the full groups' kernel of every
backend whose mask is SDPA's (``Backend.full``'s default), in a module that registers nothing,
so :mod:`~bosch_eval.attention.kernels.backend` can take it as its default without importing a
backend's module (which imports ``backend`` to register itself)."""

from __future__ import annotations

from typing import Any

import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward


def sdpa_full_attention(module: torch.nn.Module, *args: Any, **kwargs: Any) -> torch.Tensor:
    """Causal attention exactly as the unpatched model runs it (SDPA and the model's mask)."""
    return sdpa_attention_forward(module, *args, **kwargs)[0]
