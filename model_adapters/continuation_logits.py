"""Logits only where continuation tokens are scored.

HFLM's ``_model_call`` returns ``[B, T, V]`` logits and log-softmaxes all of them; at
T = 8192 and V = 128k in bf16 that is +5.8 GiB of peak memory for the few positions a
loglikelihood request actually scores. Here the hidden states of the scored positions
are gathered *before* the LM head, so logits cost ``[B, k_max, V]``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def scored_positions(
    input_lengths: Sequence[int], continuation_lengths: Sequence[int], device: torch.device
) -> torch.Tensor:
    """``[B, k_max]`` input positions whose logits predict each row's continuation.

    Row ``i`` scores positions ``inplen_i − contlen_i … inplen_i − 1``; rows with fewer
    than ``k_max`` continuation tokens repeat their last position (dropped later).
    """
    k_max = max(continuation_lengths)
    offsets = torch.arange(k_max, device=device)
    starts = torch.tensor([n - k for n, k in zip(input_lengths, continuation_lengths, strict=True)], device=device)
    lengths = torch.tensor(list(continuation_lengths), device=device)
    return starts[:, None] + torch.minimum(offsets[None, :], lengths[:, None] - 1)


def logits_at(model: torch.nn.Module, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Run a causal LM on ``input_ids [B, T]`` and return logits ``[B, k, V]`` at ``positions [B, k]``.

    A forward pre-hook on the output embedding replaces its input ``[B, T, D]`` with the
    gathered ``[B, k, D]``, so whatever the model does after the LM head (logit
    soft-capping, scaling) still applies, and no ``[B, T, V]`` tensor is ever built.
    """
    head = model.get_output_embeddings()
    if head is None:
        raise TypeError(f"{type(model).__name__} has no output embedding to score continuations with")

    def gather_scored(_module: torch.nn.Module, args: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        hidden = args[0]  # [B, T, D]
        index = positions[:, :, None].expand(-1, -1, hidden.shape[-1])
        return (hidden.gather(1, index), *args[1:])

    handle = head.register_forward_pre_hook(gather_scored)
    try:
        return model(input_ids).logits
    finally:
        handle.remove()
