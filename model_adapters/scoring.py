"""lm-eval's loglikelihood requests scored with logits only where continuation tokens are.

Why HFLM's whole loop is copied rather than one hook overridden: HFLM log-softmaxes all of
``_model_call``'s ``[B, T, V]`` output before ``_select_cont_toks`` slices the continuation
out, and ``_model_call`` gets only the padded ids, not where each continuation lies. At a
150k vocabulary and 32k tokens that is ~19 GB a row in fp32 for the few positions scored.
lm-eval 0.4.13 and 0.5.0.dev1 share that loop; what of it is used here is pinned by
``tests/test_hflm_privates.py``, the scores by ``test_all_full_mask_scores_like_hflm``. Only
the logits differ: :class:`ForwardLogits` (one forward pass), :class:`PrefixCachedLogits` or :class:`~bosch_eval.model_adapters.compressed_scoring.CompressedScoring` (KV
quantization, scored as served).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch
import torch.nn.functional as F
from lm_eval.models.huggingface import HFLM
from lm_eval.models.utils import Collator
from lm_eval.models.utils_hf import pad_and_concat
from tqdm import tqdm

from bosch_eval.attention.hybrid_spec import HybridSpec
from bosch_eval.caches.prefix_cache import PrefixActivations
from bosch_eval.model_adapters.continuation_logits import logits_at, scored_positions

# ((context, continuation) strings, context ids, continuation ids): what HFLM's loop receives.
Request = tuple[tuple[str, str], list[int], list[int]]


class ContinuationLogits(Protocol):
    def __call__(self, inputs: list[list[int]], continuation_lengths: list[int], device: torch.device) -> torch.Tensor:
        """``[B, k_max, V]`` logits predicting each row's continuation tokens (``inputs``: the
        model's input rows, context + continuation, left-truncated, last token dropped; rows
        with fewer than ``k_max`` continuation tokens are padded, dropped by the caller)."""
        ...


def _padded_ids(inputs: list[list[int]], device: torch.device) -> torch.Tensor:
    rows = [torch.tensor(row, dtype=torch.long, device=device) for row in inputs]
    return pad_and_concat(max(map(len, inputs)), rows, padding_side="right")  # [B, T]


@dataclass(frozen=True)
class ForwardLogits:
    """One forward pass per batch, the LM head applied only at the scored positions."""

    model: torch.nn.Module

    def __call__(self, inputs: list[list[int]], continuation_lengths: list[int], device: torch.device) -> torch.Tensor:
        positions = scored_positions([len(row) for row in inputs], continuation_lengths, device)  # [B, k_max]
        return logits_at(self.model, _padded_ids(inputs, device), positions)


@dataclass(frozen=True)
class PrefixCachedLogits:
    """:class:`ForwardLogits` through the prefix-activation cache (the search's, keyed by the
    hybrid spec applied at call time: ``applied_spec``)."""

    model: torch.nn.Module
    cache: PrefixActivations
    applied_spec: Callable[[], HybridSpec]

    def __call__(self, inputs: list[list[int]], continuation_lengths: list[int], device: torch.device) -> torch.Tensor:
        positions = scored_positions([len(row) for row in inputs], continuation_lengths, device)  # [B, k_max]
        return self.cache.run(
            lambda ids: logits_at(self.model, ids, positions), _padded_ids(inputs, device), self.applied_spec()
        )


@dataclass(frozen=True)
class ContinuationScorer:
    """HFLM's ``_loglikelihood_tokens`` (same ordering, batching and caching) on ``logits``."""

    logits: ContinuationLogits

    def loglikelihood_tokens(
        self, lm: HFLM, requests: Sequence[Request], disable_tqdm: bool, override_bs: int | None
    ) -> list[tuple[float, bool]]:
        """``(log P(continuation | context), continuation is greedy)`` per request, in order."""
        collator = Collator(
            requests,
            sort_fn=lambda req: (-len(req[1] + req[2]), tuple(req[1] + req[2])),
            group_by="contexts" if lm.logits_cache else None,
            group_fn=lambda req: req[-2] + req[-1][:-1],  # same context + continuation[:-1]: one forward pass
        )
        if lm.batch_size == "auto" and not override_bs:
            lm.batch_sizes = {}  # detect again for these requests, as HFLM does
            batches = collator.get_batched(n=0, batch_fn=lm._batch_scheduler if len(collator) else None)
        else:
            batches = collator.get_batched(n=override_bs if lm.batch_size == "auto" else lm.batch_size)
        results: list[tuple[float, bool]] = []
        progress = tqdm(
            total=len(requests), disable=disable_tqdm or lm.rank != 0, desc="Running loglikelihood requests"
        )
        for batch in batches:
            log_probs = self.log_probs(
                lm, [context + continuation for _, context, continuation in batch], [c for *_, c in batch]
            )
            for (request, context, continuation), row in zip(batch, log_probs, strict=True):
                row = row[: len(continuation)].unsqueeze(0)  # [1, k, V]
                greedy = row.argmax(dim=-1)
                for request, cont_tokens, cached in collator.get_cache(
                    req_str=request, cxt_toks=context, cont_toks=continuation, logits=row
                ):
                    target = torch.tensor(cont_tokens, dtype=torch.long, device=lm.device)[None]  # [1, k']
                    k = target.shape[1]  # same-context requests may score a shorter suffix of the continuation
                    answer = (
                        float(cached[:, -k:].gather(2, target[..., None]).sum()),
                        bool((greedy[:, -k:] == target).all()),
                    )
                    results.append(answer)
                    if request is not None:
                        lm.cache_hook.add_partial("loglikelihood", request, answer)
                    progress.update(1)
        progress.close()
        return collator.get_original(results)

    def log_probs(self, lm: Any, sequences: list[list[int]], continuations: list[list[int]]) -> torch.Tensor:
        """``[B, k_max, V]`` log-probabilities at the positions that predict each row's
        continuation (``sequences``: context + continuation; rows past their ``k`` are padding)."""
        inputs = [
            row[-(lm.max_length + 1) :][:-1] for row in sequences
        ]  # HFLM's causal input: left-truncated, last dropped
        with (
            torch.no_grad(),
            torch.autocast(
                device_type=lm.device.type, dtype=lm.mixed_precision_dtype, enabled=lm.mixed_precision_dtype is not None
            ),
        ):
            logits = self.logits(inputs, [len(c) for c in continuations], lm.device)
            return F.log_softmax(logits, dim=-1, dtype=lm.softmax_dtype)
