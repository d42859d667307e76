"""``attn_backend=auto``: the fastest backend that runs here, and why it was chosen.

* CUDA: flash-attn 2 when installed; else compiled FlexAttention when a probe compile
  succeeds on the model's device and dtype; else the blocked kernel (O(T·W), any device),
  with the reason logged once. The masked ``sdpa`` reference is O(T²) and never chosen.
* CPU: the blocked kernel. Compiled flex took 1.81× its time at T = 2048 and 0.95× at
  8192 (W = T/32; ``benchmarks/swa_attention.py``, ``results/benchmarks/swa_attention_cpu.txt``)
  and compiles again for every new sequence length on CPU, which the blocked kernel never does.
* Any other device: the blocked kernel.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass
from typing import Any

import torch

from bosch_eval.attention.kernels import flash, flex

logger = logging.getLogger("bosch_eval")

CPU_CHOICE = "blocked"


@dataclass(frozen=True)
class BackendChoice:
    """A concrete backend and why it runs."""

    name: str
    reason: str


def choose_backend(device: torch.device, dtype: Any = None) -> BackendChoice:
    """What ``auto`` runs on ``device`` for a model in ``dtype`` (default float32)."""
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        return _cuda_choice(f"cuda:{index}", dtype or torch.float32)
    if device.type == "cpu":
        return BackendChoice(
            CPU_CHOICE,
            "auto on CPU: the blocked kernel (measured against compiled flex, which compiles per sequence length)",
        )
    return BackendChoice(
        "blocked", f"auto on {device.type}: the blocked kernel (flash-attn and compiled flex are chosen on CUDA only)"
    )


@functools.cache
def _cuda_choice(device: str, dtype: torch.dtype) -> BackendChoice:
    flash_reason = flash.flash_unavailable(torch.device(device))
    if flash_reason is None:
        choice = BackendChoice("flash_attention_2", "auto on CUDA: flash-attn is installed")
    else:
        flex_reason = flex.compile_failure(device, dtype)
        if flex_reason is None:
            choice = BackendChoice("flex", "auto on CUDA: compiled FlexAttention (flash-attn is not installed)")
        else:
            choice = BackendChoice(
                "blocked",
                f"auto on CUDA fell back to the blocked kernel: flash-attn {flash_reason}; compiled flex fails ({flex_reason})",
            )
            logger.warning("attn_backend=auto: %s", choice.reason)
            return choice
    logger.info("attn_backend=auto: %s on %s", choice.name, device)
    return choice
