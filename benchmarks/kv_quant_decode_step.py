"""Where a LogQuant/KiVi decode step spends its time, against the unquantized cache's step.

    OMP_NUM_THREADS=1 python benchmarks/kv_quant_decode_step.py [--length 8192] [--repeats 15]

One layer of the bench's attention-heavy shape (8 KV groups × 128 dims, 16 query heads),
the context already in the cache. Per decode step the unquantized cache (transformers'
``DynamicLayer``) concatenates the new token onto its keys and values; the quantized store
rebuilds the full-length keys and values (unpack, dequantize, scatter LogQuant's positions)
before attention. Both then run the same SDPA. Prints the median milliseconds of each part,
measured interleaved (one repetition of every part per round), and the ratios.

Also measured: attention computed straight from the codes (``quantized_domain_attention``,
eager PyTorch), the candidate cure. A decode query sees every past position, so LogQuant's
scattered tokens need no scatter; with keys k = c·s_e + z_e per event and channel, and
values v = c·s_tn + z_tn per token and channel group::

    q·k_t = Σ_d (q_d s_ed) c_td + Σ_d q_d z_ed
    Σ_t p_t v_td = Σ_t (p_t s_tn) c_td + Σ_t p_t z_tn

Its output is checked against rebuild + SDPA before timing.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from transformers.cache_utils import DynamicLayer

from bosch_eval.kv_quant.config import KVQuantConfig
from bosch_eval.kv_quant.selection import Selector
from bosch_eval.kv_quant.store import QuantizedKVStore

GROUPS, HEAD_DIM, HEADS = 8, 128, 16


def _codes(packed: torch.Tensor, bits: int, dtype: torch.dtype) -> torch.Tensor:
    """``[..., D·bits/8]`` packed codes → ``[..., D]`` numbers, by one table lookup per byte."""
    table = ((torch.arange(256)[:, None] >> torch.arange(0, 8, bits)) & ((1 << bits) - 1)).to(dtype)  # [256, per_byte]
    return table.to(packed.device)[packed.long()].flatten(-2)  # [..., D/per_byte, per_byte] → [..., D]


def quantized_domain_attention(query: torch.Tensor, store: QuantizedKVStore, key: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    """Attention of ``query [B, H, 1, D]`` over the store's past and this step's ``key``/``value``
    ``[B, G, 1, D]`` (H = G·r query heads share a group), softmax scale 1/√D; ``[B, H, 1, D]``.

    No attention mask: every stored position is visible (a left-padded batch needs one).
    """
    b, h, _, d = query.shape
    g = key.shape[1]
    q = query.reshape(b, g, h // g, d) / math.sqrt(d)  # [B, G, r, D]
    bits, dtype = store.config.bits, query.dtype
    keys = [store.fp_keys, key] if store.fp_keys is not None else [key]
    values = [store.fp_values, value] if store.fp_values is not None else [value]
    exact_keys, exact_values = torch.cat(keys, dim=2), torch.cat(values, dim=2)  # [B, G, n, D]
    scores = [torch.einsum("bgrd,bgnd->bgrn", q, exact_keys)]
    if store.key_codes is not None:
        events = store.key_scale.shape[2]
        codes = _codes(store.key_codes, bits, dtype).unflatten(2, (events, -1))  # [B, G, E, W, D]
        scaled = q[:, :, :, None, :] * store.key_scale[:, :, None, :, 0, :].to(dtype)  # [B, G, r, E, D]
        shift = torch.einsum("bgrd,bged->bgre", q, store.key_zero[:, :, :, 0, :].to(dtype))  # [B, G, r, E]
        quantized = torch.einsum("bgred,bgewd->bgrew", scaled, codes) + shift[..., None]
        scores.append(quantized.flatten(-2))  # [B, G, r, E·W]
    weights = torch.softmax(torch.cat(scores, dim=-1), dim=-1)
    exact = weights[..., : exact_keys.shape[2]]
    out = torch.einsum("bgrn,bgnd->bgrd", exact, exact_values)
    if store.value_codes is not None:
        p = weights[..., exact_keys.shape[2] :]  # [B, G, r, T_q]
        scale, zero = store.value_scale.to(dtype), store.value_zero.to(dtype)  # [B, G, T_q, D/gs]
        codes = _codes(store.value_codes, bits, dtype).unflatten(-1, (scale.shape[-1], -1))  # [B, G, T_q, D/gs, gs]
        weighted = p[..., None] * scale[:, :, None]  # [B, G, r, T_q, D/gs]
        out = out + torch.einsum("bgrtn,bgtnk->bgrnk", weighted, codes).flatten(-2)
        out = out + torch.einsum("bgrt,bgtn->bgrn", p, zero).repeat_interleave(codes.shape[-1], dim=-1)
    return out.reshape(b, h, 1, d)



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
        store = QuantizedKVStore(KVQuantConfig(method=method, bits=2, window=args.kv_window, group_size=64), Selector(method, args.kv_window))
        store.update(keys, values)
        return store

    stores = {method: quantized_store(method) for method in ("logquant", "kivi")}
    unquantized = DynamicLayer()
    unquantized.update(keys, values)

    def dynamic_step() -> tuple[torch.Tensor, torch.Tensor]:
        # DynamicLayer's own step (a cat of past and new), without keeping the new token.
        return torch.cat([unquantized.keys, new_key], dim=-2), torch.cat([unquantized.values, new_value], dim=-2)

    parts: dict[str, Callable[[], object]] = {"unquantized cat": dynamic_step}
    parts |= {f"{method} rebuild": (lambda s=store: s._expand(extra=1)) for method, store in stores.items()}
    full_k, full_v = dynamic_step()
    parts["sdpa"] = lambda: F.scaled_dot_product_attention(query, full_k, full_v, enable_gqa=True)
    for method, store in stores.items():
        rebuilt_k, rebuilt_v = store._expand(extra=1)
        rebuilt_k[:, :, -1:], rebuilt_v[:, :, -1:] = new_key, new_value
        reference = F.scaled_dot_product_attention(query, rebuilt_k, rebuilt_v, enable_gqa=True)
        direct = quantized_domain_attention(query, store, new_key, new_value)
        assert torch.allclose(direct, reference, atol=1e-4), f"{method}: quantized-domain attention differs from rebuild + SDPA"
        parts[f"{method} codes attn"] = lambda s=store: quantized_domain_attention(query, s, new_key, new_value)
    times: dict[str, list[float]] = {name: [] for name in parts}
    for _ in range(args.repeats + 1):  # the first round warms up
        for name, part in parts.items():
            start = time.perf_counter()
            part()
            times[name].append(time.perf_counter() - start)
    median = {name: statistics.median(values[1:]) * 1e3 for name, values in times.items()}
    print(f"T = {args.length}, W_lq = {args.kv_window}, 2 bits, {GROUPS} KV groups × {HEAD_DIM}, threads = {torch.get_num_threads()}")
    for name, ms in median.items():
        print(f"{name:22s} {ms:8.2f} ms")
    unquantized_step = median["unquantized cat"] + median["sdpa"]
    for method in stores:
        rebuild = median[f"{method} rebuild"]
        print(f"{method}: rebuild / cat = {rebuild / median['unquantized cat']:.2f}; "
              f"(rebuild + sdpa) / (cat + sdpa) = {(rebuild + median['sdpa']) / unquantized_step:.2f}; "
              f"codes attn / (cat + sdpa) = {median[f'{method} codes attn'] / unquantized_step:.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
