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
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from transformers.cache_utils import Cache

from bosch_eval.transformers_compat import cache_argument


def continuation_logits_through_cache(
    model: torch.nn.Module, make_cache: Callable[[], Cache], row: Sequence[int], continuation_length: int, device: torch.device
) -> torch.Tensor:
    """Logits ``[k, V]`` predicting the ``k`` continuation tokens of ``row`` (see module doc)."""
    n, k = len(row), continuation_length
    if not 1 <= k <= n:
        raise ValueError(f"continuation of {k} tokens does not fit an input of {n} tokens")
    ids = torch.tensor([list(row)], dtype=torch.long, device=device)  # [1, n]
    cache = make_cache()
    context, chunk = ids[:, : n - k + 1], ids[:, n - k + 1 :]
    logits = [model(input_ids=context, **{cache_argument(model): cache}, use_cache=True, logits_to_keep=1).logits[0]]  # [1, V]
    if chunk.shape[1]:
        logits.append(model(input_ids=chunk, **{cache_argument(model): cache}, use_cache=True).logits[0])  # [k − 1, V]
    return torch.cat(logits, dim=0)
