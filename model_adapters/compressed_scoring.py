"""Loglikelihood scoring through a compressed (quantized) KV cache, as serving would see it.

For one request whose model input is ``row`` (context + continuation, left-truncated, last
token dropped, as HFLM builds it) with ``k`` continuation tokens:

1. prefill the context ``row[: n − k + 1]`` at full precision; its last position's logits
   predict the first continuation token (a served model's first token comes from the
   prefill too);
2. the cache compresses itself (LogQuant/KiVi quantize what leaves the full-precision set);
3. the remaining ``k − 1`` input tokens (the continuation minus its last token) go through
   the compressed cache in one chunk: each attends to the compressed context plus the
   continuation tokens before it at full precision, and its logits predict the next token.

:class:`CompressedScoring` is what the ``bosch`` adapter holds when ``kv_quant`` is set: the
logits above for a batch, the quantized cache for generation, and the refusal of perplexity
tasks (whose numbers would not measure the quantization).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from lm_eval.api.instance import Instance
from transformers.cache_utils import Cache

from bosch_eval.caches.hybrid_cache import HybridCache
from bosch_eval.caches.kv_quant.config import KVQuantConfig
from bosch_eval.models.transformers_compat import cache_argument
from bosch_eval.runtime.errors import ModelError


def continuation_logits_through_cache(
    model: torch.nn.Module,
    make_cache: Callable[[], Cache],
    row: Sequence[int],
    continuation_length: int,
    device: torch.device,
) -> torch.Tensor:
    """Logits ``[k, V]`` predicting the ``k`` continuation tokens of ``row`` (see module doc)."""
    n, k = len(row), continuation_length
    if not 1 <= k <= n:
        raise ValueError(f"continuation of {k} tokens does not fit an input of {n} tokens")
    ids = torch.tensor([list(row)], dtype=torch.long, device=device)  # [1, n]
    cache = make_cache()
    context, chunk = ids[:, : n - k + 1], ids[:, n - k + 1 :]
    logits = [
        model(input_ids=context, **{cache_argument(model): cache}, use_cache=True, logits_to_keep=1).logits[0]
    ]  # [1, V]
    if chunk.shape[1]:
        logits.append(model(input_ids=chunk, **{cache_argument(model): cache}, use_cache=True).logits[0])  # [k − 1, V]
    return torch.cat(logits, dim=0)


@dataclass(frozen=True)
class CompressedScoring:
    """KV quantization (``kv_quant``) at scoring and generation time, for one model."""

    model: torch.nn.Module
    config: KVQuantConfig

    def cache(self) -> HybridCache:
        """A fresh hybrid cache whose full-attention groups are quantized by ``config``."""
        return HybridCache.for_model(self.model, self.config)

    def __call__(self, inputs: list[list[int]], continuation_lengths: list[int], device: torch.device) -> torch.Tensor:
        """``[B, k_max, V]`` logits, each row prefilled, compressed, then its continuation
        forwarded through its own quantized cache (rows with shorter continuations are
        padded with zeros, dropped by the caller)."""
        rows = [
            continuation_logits_through_cache(self.model, self.cache, row, length, device)
            for row, length in zip(inputs, continuation_lengths, strict=True)
        ]
        out = rows[0].new_zeros(len(rows), max(r.shape[0] for r in rows), rows[0].shape[-1])
        for i, row in enumerate(rows):
            out[i, : row.shape[0]] = row
        return out

    def refuse_rolling(self, requests: Sequence[Instance]) -> None:
        """Perplexity (``loglikelihood_rolling``) is refused: each window is scored as one
        continuation after a one-token context, so its tokens see each other at full precision.

        Raises:
            ModelError: naming the first task, when there are requests.
        """
        if not requests:
            return
        tasks = sorted({str(r.task_name) for r in requests})
        raise ModelError(
            f"task {tasks[0]!r}{f' (and {len(tasks) - 1} more)' if len(tasks) > 1 else ''}: perplexity "
            f"(loglikelihood_rolling) with kv_quant={self.config.method} would not measure the quantization "
            "(each window is scored as one continuation after a one-token context, so its tokens see each other "
            "at full precision); run this task without kv_quant"
        )
