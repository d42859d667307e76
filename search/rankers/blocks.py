"""Causal attention probabilities of one layer, streamed in blocks of query rows.

For the rows ``t0 ≤ t < t1`` of a block, :func:`query_blocks` forms, for every query
head at once, the logits ``τ·q(t)·k(j)`` over the causal keys ``j < t1`` (``j > t``
masked), their softmax ``P`` and, when ``dO`` and ``V`` are given, ``dL/dP = dO·Vᵀ``.
Keys and values stay at their KV-group count: the H query heads are viewed as G groups
of H/G, so no repeated key tensor is built.

Peak memory per block: a few ``[H, Bq, t1]`` tensors, i.e. O(H·Bq·T) floats in
``dtype`` (logits, probabilities, their gradient and the rankers' temporaries on them),
on top of the one layer's ``q``, ``k``, ``v`` (``dO``) the caller holds, O((H+2G)·T·D).
A full ``[H, T, T]`` map is never formed. Around it, the model's own forward of one
sequence (no KV cache) and, for Fisher, what autograd saves for the backward pass:
O(L·T·d) activations with a fused SDPA kernel (CPU; CUDA flash/memory-efficient) — SDPA's
math fallback (e.g. float64 on CUDA) would save a T×T map per layer. Measured by
``benchmarks/ranker_memory.py``.

Rows and lags follow the project's window convention: query ``t`` sees keys ``j`` with
``t − W < j ≤ t``, i.e. lag ``d = t − j < W`` is inside the window.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class AttentionBlock:
    """Attention of all query heads of one layer, for query rows ``start … stop − 1``.

    Columns are keys ``0 … stop − 1``; entries with ``j > t`` are masked
    (``logits = −inf``, ``probs = 0``, ``dprobs = 0``).
    """

    start: int
    logits: torch.Tensor  # [H, Bq, S]  τ·q·k, −inf above the diagonal
    probs: torch.Tensor  # [H, Bq, S]
    dprobs: torch.Tensor | None  # [H, Bq, S]  dL/dP, or None without dO

    @property
    def stop(self) -> int:
        return self.start + self.probs.shape[1]

    def lags(self) -> torch.Tensor:
        """``d = t − j`` for every (row, column) of the block, ``[Bq, S]`` (negative: masked)."""
        device = self.probs.device
        rows = torch.arange(self.start, self.stop, device=device)
        cols = torch.arange(self.probs.shape[2], device=device)
        return rows[:, None] - cols[None, :]


def query_blocks(
    query: torch.Tensor,
    key: torch.Tensor,
    scaling: float,
    block_size: int,
    *,
    start: int = 0,
    value: torch.Tensor | None = None,
    grad_out: torch.Tensor | None = None,
    dtype: torch.dtype = torch.float32,
) -> Iterator[AttentionBlock]:
    """Yield the attention of rows ``start … T − 1`` in blocks of ``block_size`` rows.

    Args:
        query: ``[H, T, D]`` post-RoPE queries of one layer (one sequence).
        key: ``[G, T, D]`` post-RoPE keys; query head ``h`` uses group ``h // (H/G)``.
        scaling: the softmax temperature τ the model uses (``module.scaling``).
        block_size: query rows per block, Bq.
        start: first query row.
        value: ``[G, T, D]``; with ``grad_out``, each block carries ``dprobs``.
        grad_out: ``[H, T, D]`` gradient of the loss w.r.t. the attention output.
        dtype: precision of the block computation.
    """
    heads, length, dim = query.shape
    groups = key.shape[0]
    per_group = heads // groups
    k = key.to(dtype)
    v = value.to(dtype) if value is not None else None
    for t0 in range(start, length, block_size):
        t1 = min(length, t0 + block_size)
        rows = t1 - t0
        q = query[:, t0:t1].to(dtype).reshape(groups, per_group, rows, dim)
        # logits: [G, H/G, Bq, D] @ [G, 1, D, t1] -> [H, Bq, t1]
        logits = (q @ k[:, None, :t1].transpose(-1, -2)).reshape(heads, rows, t1) * scaling
        future = torch.arange(t1, device=query.device)[None, :] > torch.arange(t0, t1, device=query.device)[:, None]
        logits = logits.masked_fill(future, float("-inf"))
        probs = torch.softmax(logits, dim=-1)
        dprobs = None
        if grad_out is not None and v is not None:
            d_out = grad_out[:, t0:t1].to(dtype).reshape(groups, per_group, rows, dim)
            dprobs = (d_out @ v[:, None, :t1].transpose(-1, -2)).reshape(heads, rows, t1).masked_fill(future, 0.0)
        yield AttentionBlock(t0, logits, probs, dprobs)
