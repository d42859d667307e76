"""flash-attn 2 kernels (CUDA). The model builds flash's mask: ``[B, K]`` key padding or None.

Without sinks, SWA is transformers' own flash path with ``sliding_window=W`` (it maps to
``window_size=(W − 1, W − 1)``, which under causality is exactly our window). flash-attn has
no sink option, so with sinks the window is one flash call that also returns its
log-sum-exp, and the sinks outside the window are merged in exactly
(:mod:`bosch_eval.attention.kernels.lse_merge`).
"""

from __future__ import annotations

import importlib.util
from typing import Any

import torch

from bosch_eval.attention.kernels import BACKENDS, Backend
from bosch_eval.attention.kernels.lse_merge import sink_merged_attention
from bosch_eval.attention.local_window import LocalWindow
from bosch_eval.runtime.errors import SettingsError


def flash_unavailable(device: torch.device) -> str | None:
    """Why flash-attn cannot run on ``device`` (None: it can)."""
    installed = importlib.util.find_spec("flash_attn") is not None
    if device.type == "cuda" and installed:
        return None
    return (
        "needs a CUDA model and the flash-attn package (pip install 'bosch-eval[flash]'); "
        f"model is on {device}, flash-attn {'installed' if installed else 'not installed'}"
    )


def flash_full_attention(module: torch.nn.Module, *args: Any, **kwargs: Any) -> torch.Tensor:
    from transformers.integrations.flash_attention import flash_attention_forward  # needs flash_attn, CUDA

    return flash_attention_forward(module, *args, **kwargs)[0]


def flash_swa_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    local: LocalWindow,
    **kwargs: Any,
) -> torch.Tensor:
    """Windowed flash attention; with sinks, the window and the sinks merged by log-sum-exp
    (flash's mask is the ``[B, K]`` key padding, from which the merge finds each row's sinks)."""
    kwargs.pop("sliding_window", None)
    if not local.sinks:
        return flash_full_attention(module, query, key, value, attention_mask, sliding_window=local.window, **kwargs)
    scaling = kwargs.get("scaling") or query.shape[-1] ** -0.5
    return sink_merged_attention(query, key, value, attention_mask, local, scaling, _flash_windowed)


def _flash_windowed(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    key_padding: torch.Tensor | None,
    window: int,
    scaling: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """flash-attn over the last ``window`` keys, with its log-sum-exp ``[B, H, T]``.

    Right padding (lm-eval's scoring batches) needs no mask: under causality a real query
    never reaches a later padded key, and padded queries' outputs are dropped. Left padding
    puts padded keys inside real queries' windows, which this call cannot mask (flash's
    variable-length path would, with another log-sum-exp layout); it is refused.
    """
    from flash_attn import flash_attn_func  # needs flash_attn, CUDA

    if key_padding is not None and not _right_padded(key_padding):
        raise SettingsError(
            "attn_backend=flash_attention_2 with sink>0: left-padded batches are not supported "
            "(flash-attn has no sink option and its variable-length call is not merged); use attn_backend=sdpa, "
            "blocked or flex, or batch_size=1"
        )
    out, lse, _ = flash_attn_func(
        query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2),
        softmax_scale=scaling, causal=True, window_size=(window - 1, 0), return_attn_probs=True,
    )  # fmt: skip
    return out, lse


def _right_padded(key_padding: torch.Tensor) -> bool:
    """True when every row is real tokens followed only by padding."""
    real = key_padding.bool()
    return bool((real[:, 1:] <= real[:, :-1]).all())


# flash-attn itself is imported only when a kernel runs: this module, and the name, load without it.
BACKENDS.register(
    "flash_attention_2",
    Backend(swa=flash_swa_attention, full=flash_full_attention, mask_format="flash", unavailable=flash_unavailable),
)
