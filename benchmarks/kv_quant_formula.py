"""KV bytes relative to the unquantized cache, in closed form, for the bench model
(``random:attn-heavy``: 2 layers, 8 KV groups, head dim 128) at T = 8192.

    python benchmarks/kv_quant_formula.py > results/benchmarks/kv_quant_formula.txt
"""

from __future__ import annotations

from bosch_eval.bench.runner import balanced_mask
from bosch_eval.caches.kv_quant.config import KVQuantConfig
from bosch_eval.caches.kv_quant.formula import KVLayout, kv_cache_bytes_formula
from bosch_eval.masks.head_mask import ModelShape

LAYERS, HEADS, GROUPS, HEAD_DIM, T, W_LQ = 2, 16, 8, 128, 8192, 128


def main() -> None:
    mask = balanced_mask(ModelShape(LAYERS, HEADS, GROUPS), 0.75, T // 32).bits
    configs = [
        ("LogQuant 2-bit", None, KVQuantConfig("logquant", 2, W_LQ, 64)),
        ("KiVi 2-bit", None, KVQuantConfig("kivi", 2, W_LQ, 64)),
        ("LogQuant 4-bit", None, KVQuantConfig("logquant", 4, W_LQ, 64)),
        ("BOSCH rho=0.75 (W=T/32)", mask, None),
        ("BOSCH rho=0.75 + LogQuant 2-bit", mask, KVQuantConfig("logquant", 2, W_LQ, 64)),
    ]
    print(
        f"$ python benchmarks/kv_quant_formula.py   (T={T}, W_lq={W_LQ}, group size 64, L={LAYERS}, G={GROUPS}, head dim {HEAD_DIM})"
    )
    print("| config | KV / 16-bit cache (fp16 states, fp16 scales) | KV / 32-bit cache (fp32) |")
    print("|---|---|---|")
    for label, bits, kv in configs:
        ratios = []
        for dtype_bytes in (2, 4):
            base = kv_cache_bytes_formula(None, KVLayout(LAYERS, GROUPS, HEAD_DIM), T, dtype_bytes=dtype_bytes)
            ratios.append(
                kv_cache_bytes_formula(
                    bits, KVLayout(LAYERS, GROUPS, HEAD_DIM), T, window=T // 32, kv_quant=kv, dtype_bytes=dtype_bytes
                )
                / base
            )
        print(f"| {label} | {ratios[0]:.4f} | {ratios[1]:.4f} |")


if __name__ == "__main__":
    main()
