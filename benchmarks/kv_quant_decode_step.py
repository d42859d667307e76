"""Where a LogQuant/KiVi decode step spends its time, against the unquantized cache's step.

    OMP_NUM_THREADS=1 python benchmarks/kv_quant_decode_step.py [--length 8192] [--repeats 15]

One layer of the bench's attention-heavy shape (8 KV groups × 128 dims, 16 query heads),
the context already in the cache. Per decode step the unquantized cache (transformers'
``DynamicLayer``) concatenates the new token onto its keys and values; the quantized store
rebuilds the full-length keys and values (unpack, dequantize, scatter LogQuant's positions)
before attention. Both then run the same SDPA. Prints the median milliseconds of each part,
measured interleaved (one repetition of every part per round), and the ratios.

The store's rebuild is measured both ways: eager (``QuantizedKVStore._expand``: unpack,
dequantize, scatter, in several full-length passes) and fused (``QuantizedKVStore._rebuild``
as a decode step runs it: one pass compiled by torch.compile, ``bosch_eval.caches.kv_quant.fused``),
after checking that the two agree. The first fused call compiles (seconds) and is not timed.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from transformers.cache_utils import DynamicLayer

from bosch_eval.caches.kv_quant import fused
from bosch_eval.caches.kv_quant.config import KVQuantConfig
from bosch_eval.caches.kv_quant.selection import Selector
from bosch_eval.caches.kv_quant.store import QuantizedKVStore

GROUPS, HEAD_DIM, HEADS = 8, 128, 16


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--length", type=int, default=8192)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--kv-window", type=int, default=128)
    args = parser.parse_args()
    torch.manual_seed(0)
    keys, values = torch.randn(1, GROUPS, args.length, HEAD_DIM), torch.randn(1, GROUPS, args.length, HEAD_DIM)
    new_key, new_value = torch.randn(1, GROUPS, 1, HEAD_DIM), torch.randn(1, GROUPS, 1, HEAD_DIM)
    query = torch.randn(1, HEADS, 1, HEAD_DIM)

    def quantized_store(method: str) -> QuantizedKVStore:
        store = QuantizedKVStore(
            KVQuantConfig(method=method, bits=2, window=args.kv_window, group_size=64), Selector(method, args.kv_window)
        )
        store.update(keys, values)
        return store

    stores = {method: quantized_store(method) for method in ("logquant", "kivi")}
    unquantized = DynamicLayer()
    unquantized.update(keys, values)

    def dynamic_step() -> tuple[torch.Tensor, torch.Tensor]:
        # DynamicLayer's own step (a cat of past and new), without keeping the new token.
        return torch.cat([unquantized.keys, new_key], dim=-2), torch.cat([unquantized.values, new_value], dim=-2)

    parts: dict[str, Callable[[], object]] = {"unquantized cat": dynamic_step}
    for method, store in stores.items():
        eager_k, eager_v = store._expand(extra=1)
        eager_k[:, :, -1:], eager_v[:, :, -1:] = new_key, new_value
        fused_k, fused_v = store._rebuild(new_key, new_value)  # compiles, untimed
        assert fused.enabled, "torch.compile failed here: the fused rebuild cannot be measured"
        torch.testing.assert_close((fused_k, fused_v), (eager_k, eager_v))
        parts[f"{method} eager rebuild"] = lambda s=store: s._expand(extra=1)
        parts[f"{method} fused rebuild"] = lambda s=store: s._rebuild(new_key, new_value)
    full_k, full_v = dynamic_step()
    parts["sdpa"] = lambda: F.scaled_dot_product_attention(query, full_k, full_v, enable_gqa=True)
    times: dict[str, list[float]] = {name: [] for name in parts}
    for _ in range(args.repeats + 1):  # the first round warms up
        for name, part in parts.items():
            start = time.perf_counter()
            part()
            times[name].append(time.perf_counter() - start)
    median = {name: statistics.median(values[1:]) * 1e3 for name, values in times.items()}
    print(
        f"T = {args.length}, W_lq = {args.kv_window}, 2 bits, {GROUPS} KV groups × {HEAD_DIM}, threads = {torch.get_num_threads()}"
    )
    for name, ms in median.items():
        print(f"{name:22s} {ms:8.2f} ms")
    unquantized_step = median["unquantized cat"] + median["sdpa"]
    for method in stores:
        for kind in ("eager", "fused"):
            rebuild = median[f"{method} {kind} rebuild"]
            print(
                f"{method} {kind}: rebuild / cat = {rebuild / median['unquantized cat']:.2f}; "
                f"(rebuild + sdpa) / (cat + sdpa) = {(rebuild + median['sdpa']) / unquantized_step:.2f}"
            )


if __name__ == "__main__":
    main()
