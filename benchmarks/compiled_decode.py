"""Eager against compiled decode steps on the CPU, the original and the hybrid side by side.

    OMP_NUM_THREADS=1 python benchmarks/compiled_decode.py [--layers 4] [--length 64] [--steps 40] [--sinks 0]

A random Qwen3 (8 query heads, 4 KV groups) whose layers hold every kind (all full, mixed with
the kinds apart, all SWA), W = 8, the hybrid's heads permuted by kind. Each configuration is
prefilled with the same prompt and then decoded greedily for ``--steps`` steps: the original on
transformers' ``DynamicCache`` (eager) and on its ``StaticCache`` (compiled), the hybrid on its
preallocated cache (``HybridCache.for_model(model, max_cache_len=...)``) eager and on its
captured cache (``captured=True``) compiled. The compiled ones run ``torch.compile(model,
dynamic=False)`` (Inductor) over fixed shapes and tensor positions: one graph serves every step,
the graph a GPU would capture with ``mode="reduce-overhead"`` (CUDA graphs need a GPU, so that
mode is not what runs here). Prints the median milliseconds of the second half of the steps,
compiled over eager per model, the graphs and breaks of the compiled runs, and checks that each
compiled run produced the eager run's tokens. Compiles take a minute or two on a CPU; they are
not timed.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
from torch._dynamo.utils import counters
from transformers import DynamicCache, StaticCache

from bosch_eval.attention.hybrid_attention import hybridize
from bosch_eval.caches.hybrid_cache import HybridCache
from bosch_eval.masks.head_mask import HeadMask
from bosch_eval.models.random_model import random_model
from bosch_eval.models.transformers_compat import cache_argument

ROWS = [[1, 1, 1, 1], [0, 1, 0, 0], [0, 0, 0, 0], [1, 0, 1, 0]]


@torch.no_grad()
def decode(
    model: Any, forward: Callable[..., Any], cache: Any, ids: torch.Tensor, steps: int
) -> tuple[float, torch.Tensor]:
    """Median milliseconds of the second half of ``steps`` greedy steps, and the tokens."""
    token = model(input_ids=ids, **{cache_argument(model): cache}, use_cache=True).logits[:, -1:].argmax(-1)
    tokens, times = [token], []
    for _ in range(steps):
        start = time.perf_counter()
        token = forward(input_ids=token, **{cache_argument(model): cache}, use_cache=True).logits[:, -1:].argmax(-1)
        times.append(time.perf_counter() - start)
        tokens.append(token)
    return 1000 * statistics.median(times[steps // 2 :]), torch.cat(tokens, dim=1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--length", type=int, default=64)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--sinks", type=int, default=0)
    args = parser.parse_args()
    model = random_model("qwen3", num_layers=args.layers, seed=5)
    ids = torch.randint(3, model.config.vocab_size, (1, args.length), generator=torch.Generator().manual_seed(0))
    capacity = args.length + args.steps + 1
    compiled = torch.compile(model, dynamic=False)
    eager_ms, eager_tokens = decode(model, model, DynamicCache(), ids, args.steps)
    static = StaticCache(config=model.config, max_cache_len=capacity)
    compiled_ms, compiled_tokens = decode(model, compiled, static, ids, args.steps)
    rows = [("original", eager_ms, compiled_ms, torch.equal(eager_tokens, compiled_tokens))]
    rows_of = [ROWS[layer % len(ROWS)] for layer in range(args.layers)]
    with hybridize(model, HeadMask.from_rows(rows_of, 8, window=8, sinks=args.sinks), backend="blocked", by_kind=True):
        eager_ms, eager_tokens = decode(
            model, model, HybridCache.for_model(model, max_cache_len=capacity), ids, args.steps
        )
        torch._dynamo.reset()  # the hybrid's own graphs, not the original's guards failing over
        compiled = torch.compile(model, dynamic=False)
        compiled_ms, compiled_tokens = decode(
            model, compiled, HybridCache.for_model(model, max_cache_len=capacity, captured=True), ids, args.steps
        )
    rows.append(("hybrid", eager_ms, compiled_ms, torch.equal(eager_tokens, compiled_tokens)))
    graphs, breaks = counters["stats"]["unique_graphs"], sum(counters["graph_break"].values())
    print(
        f"torch {torch.__version__}, {args.layers} layers, prompt {args.length}, {args.steps} steps, W = 8, S = {args.sinks}, threads {torch.get_num_threads()}"
    )
    print("| model | eager ms/step | compiled ms/step | compiled / eager | same tokens |")
    print("|---|---|---|---|---|")
    for label, eager, fast, same in rows:
        print(f"| {label} | {eager:.2f} | {fast:.2f} | {fast / eager:.2f} | {same} |")
    print(f"hybrid / original: eager {rows[1][1] / rows[0][1]:.2f}, compiled {rows[1][2] / rows[0][2]:.2f}")
    print(f"the hybrid's compiled run: {graphs} graphs, {breaks} graph breaks")


if __name__ == "__main__":
    main()
