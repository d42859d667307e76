"""Aten ops and wall time of one eager decode step: the original on transformers' DynamicCache
against the hybrid on its preallocated cache, with the heads permuted by kind and without.

    OMP_NUM_THREADS=1 python benchmarks/decode_step_ops.py [--layers 4] [--length 30] [--steps 40]

A random Qwen3 (8 query heads, 4 KV groups) whose layers hold every kind: all full, mixed with
the kinds apart ([0, 1, 0, 0], [1, 0, 1, 0]) and all SWA, repeated to ``--layers``; W = 8. For a
batch of one row and a left-padded batch of two, S = 0 and S = 4: the non-view aten ops of the
third decode step (``bosch_eval.bench.op_count``, a launch-bound step's cost, counted on a CPU)
and the median milliseconds of ``--steps`` decode steps after the prefill.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import torch
from transformers import DynamicCache

from bosch_eval.attention.hybrid_attention import hybridize
from bosch_eval.bench.op_count import decode_step_ops
from bosch_eval.caches.hybrid_cache import HybridCache
from bosch_eval.masks.head_mask import HeadMask
from bosch_eval.models.random_model import random_model
from bosch_eval.models.transformers_compat import cache_argument

ROWS = [[1, 1, 1, 1], [0, 1, 0, 0], [0, 0, 0, 0], [1, 0, 1, 0]]


@torch.no_grad()
def step_ms(model: Any, cache: Any, ids: torch.Tensor, attention: torch.Tensor, steps: int) -> float:
    """Median milliseconds of a greedy decode step after prefilling ``ids``."""
    past = {cache_argument(model): cache}
    positions = (attention.cumsum(-1) - 1).clamp(min=0)
    token = (
        model(input_ids=ids, attention_mask=attention, position_ids=positions, use_cache=True, **past)
        .logits[:, -1:]
        .argmax(-1)
    )
    times = []
    for _ in range(steps):
        attention = torch.cat([attention, attention.new_ones(attention.shape[0], 1)], dim=1)
        positions = positions[:, -1:] + 1
        start = time.perf_counter()
        token = (
            model(input_ids=token, attention_mask=attention, position_ids=positions, use_cache=True, **past)
            .logits[:, -1:]
            .argmax(-1)
        )
        times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--length", type=int, default=30)
    parser.add_argument("--steps", type=int, default=40)
    args = parser.parse_args()
    model = random_model("qwen3", num_layers=args.layers, seed=5)
    rows = [ROWS[layer % len(ROWS)] for layer in range(args.layers)]
    print(f"torch {torch.__version__}, {args.layers} layers, prompt {args.length}, W = 8")
    print("| batch | S | original ops | hybrid ops | hybrid by_kind ops | original ms | hybrid ms | by_kind ms |")
    print("|---|---|---|---|---|---|---|---|")
    for lengths in ([args.length], [args.length, args.length // 2 + 2]):
        ids = torch.randint(
            3, model.config.vocab_size, (len(lengths), args.length), generator=torch.Generator().manual_seed(0)
        )
        attention = torch.zeros(len(lengths), args.length, dtype=torch.long)
        for row, length in enumerate(lengths):
            attention[row, args.length - length :] = 1
        for sinks in (0, 4):
            mask = HeadMask.from_rows(rows, 8, window=8, sinks=sinks)
            ops = [decode_step_ops(model, DynamicCache(), ids, attention).total]
            ms = [step_ms(model, DynamicCache(), ids, attention, args.steps)]
            for permuted in (False, True):
                with hybridize(model, mask, backend="blocked", by_kind=permuted):
                    ops.append(decode_step_ops(model, HybridCache.for_model(model), ids, attention).total)
                    ms.append(step_ms(model, HybridCache.for_model(model), ids, attention, args.steps))
            print(f"| {len(lengths)} | {sinks} | {' | '.join(map(str, ops))} | {' | '.join(f'{m:.2f}' for m in ms)} |")


if __name__ == "__main__":
    main()
