"""Per-layer post-RoPE queries, keys and values (and the gradient of the attention output).

:func:`capture_attention` runs a model with one more attention function registered in
transformers' ``AttentionInterface``: it hands the layer's ``q``, ``k``, ``v`` to a
callback, then calls the stock SDPA function, so the model computes exactly what it
computes with ``attn_implementation="sdpa"``. No modeling code is copied or patched; the
previous implementation is restored on exit.

With ``on_backward``, a tensor hook on the attention output (``[B, T, H, D]``, before
``o_proj``) passes ``dL/dO`` to the callback while a backward pass runs, one layer at a
time; together with ``V`` this gives ``dL/dP = dO·Vᵀ`` (``O = P·V``).

The callbacks see one layer at a time and may drop what they are given; nothing is kept
across layers here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from bosch_eval.attention.hybrid_attention import attention_modules
from bosch_eval.runtime.errors import ModelError, SettingsError

CAPTURE_IMPLEMENTATION = "bosch_rank_capture"

# (layer_idx, module, q [H, T, D], k [G, T, D], v [G, T, D]); batch 1, detached.
ForwardHook = Callable[[int, torch.nn.Module, torch.Tensor, torch.Tensor, torch.Tensor], None]
# Same, plus dO [H, T, D]: the gradient of the loss w.r.t. the attention output.
BackwardHook = Callable[[int, torch.nn.Module, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], None]


class _Capture:
    def __init__(self, on_forward: ForwardHook | None, on_backward: BackwardHook | None) -> None:
        self.on_forward = on_forward
        self.on_backward = on_backward


def _capture_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,  # [B, H, T, D]
    key: torch.Tensor,  # [B, G, T, D]
    value: torch.Tensor,  # [B, G, T, D]
    attention_mask: torch.Tensor | None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    capture: _Capture = module.bosch_rank_capture
    if query.shape[0] != 1:
        raise SettingsError(f"ranking capture: expected batch size 1, got {query.shape[0]}")
    if kwargs.get("sliding_window") is not None:
        # The rankers score heads of full-attention layers; a layer the model itself runs
        # windowed would need its window in every formula.
        raise ModelError(
            f"layer {module.layer_idx} runs with the model's own sliding window ({kwargs['sliding_window']}); "
            "the rankers support full-attention layers only"
        )
    q, k, v = query[0].detach(), key[0].detach(), value[0].detach()
    if capture.on_forward is not None:
        capture.on_forward(module.layer_idx, module, q, k, v)
    out, _ = sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)  # out: [B, T, H, D]
    if capture.on_backward is not None and out.requires_grad:
        on_backward, layer = capture.on_backward, module.layer_idx

        def hook(grad: torch.Tensor) -> None:
            on_backward(layer, module, q, k, v, grad[0].transpose(0, 1))  # dO: [H, T, D]

        out.register_hook(hook)
    return out, None


@contextmanager
def capture_attention(
    model: Any, on_forward: ForwardHook | None = None, on_backward: BackwardHook | None = None
) -> Iterator[None]:
    """Run ``model`` inside the block with the capturing attention function.

    Args:
        model: a transformers decoder whose attention dispatches through
            ``ALL_ATTENTION_FUNCTIONS`` (Llama, Qwen2/3, Mistral, ...); batch size 1.
        on_forward: called in each layer's forward with ``(layer, module, q, k, v)``.
        on_backward: called in each layer's backward with ``(layer, module, q, k, v, dO)``.

    Raises:
        ModelError: the model cannot switch to a custom attention function.
    """
    AttentionInterface.register(CAPTURE_IMPLEMENTATION, _capture_attention_forward)
    AttentionMaskInterface.register(CAPTURE_IMPLEMENTATION, sdpa_mask)
    modules = attention_modules(model)
    previous = model.config._attn_implementation
    capture = _Capture(on_forward, on_backward)
    model.set_attn_implementation(CAPTURE_IMPLEMENTATION)
    try:
        if model.config._attn_implementation != CAPTURE_IMPLEMENTATION or not modules:
            raise ModelError(
                f"{type(model).__name__} does not dispatch attention through transformers' AttentionInterface; "
                "its heads cannot be ranked"
            )
        for module in modules.values():
            module.bosch_rank_capture = capture
        yield
    finally:
        for module in modules.values():
            module.__dict__.pop("bosch_rank_capture", None)
        model.set_attn_implementation(previous)
