"""SWA-only attention against full causal attention on the CPU path, side by side.

    python benchmarks/swa_attention.py [--lengths 2048 8192] [--heads 16 --kv-heads 8 --head-dim 128]

For each T the window is W = T/32 (the paper's ratio). Prints the time of the blocked
SWA kernel over all heads divided by the time of full causal SDPA over the same heads,
next to the work ratio T·W/T² = W/T; the target is a time ratio within 2× of it. Note
that PyTorch's causal CPU kernel skips the masked upper triangle (T²/2 scores), so an
SWA kernel doing exactly T·W scores would sit at 2·W/T, already at the target's edge;
the "vs 2W/T" column is the time ratio against that causal-aware work ratio.

The last two columns time compiled FlexAttention (the ``flex`` backend's kernel with its
block mask, built once per shape as in a model) on the same inputs: its time over full
SDPA, and over the blocked kernel (below 1: flex is faster). The compile is done before
timing (``--no-flex`` skips it). ``attn_backend=auto`` on CPU runs the faster of the two
(``bosch_eval/attention/kernels/choice.py``). All kernels run interleaved in one process, so
machine noise hits them alike; the median of the repeats is reported. Ratios only:
absolute seconds on shared machines mean little.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

import torch
import torch.nn.functional as F

from bosch_eval.attention.kernels import flex
from bosch_eval.attention.kernels.blocked import blocked_attention, default_block_size
from bosch_eval.attention.kernels.flex_blocks import BlockMaskCache
from bosch_eval.attention.local_window import LocalWindow


def time_call(fn, repeats: int) -> list[float]:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", type=int, nargs="+", default=[2048, 8192], help="sequence lengths T")
    parser.add_argument("--heads", type=int, default=16, help="query heads H (Qwen3-1.7B: 16)")
    parser.add_argument("--kv-heads", type=int, default=8, help="KV groups G (Qwen3-1.7B: 8)")
    parser.add_argument("--head-dim", type=int, default=128, help="head dimension D")
    parser.add_argument("--t-over-w", type=int, default=32, help="T / W")
    parser.add_argument("--repeats", type=int, default=5, help="timed repeats per kernel (after one warm-up)")
    parser.add_argument("--block", type=int, help="query-block size C of the blocked kernel (default: its own choice)")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"], help="activation dtype")
    parser.add_argument("--no-flex", action="store_true", help="time the blocked kernel only (no compile)")
    args = parser.parse_args()
    if not args.no_flex:
        flex.compile_policy = True  # a compile failure is an error here, not a silent eager run

    dtype = getattr(torch, args.dtype)
    print(
        f"# torch {torch.__version__}, {platform.processor() or platform.machine()}, threads={torch.get_num_threads()}"
    )
    print(f"# H={args.heads} G={args.kv_heads} D={args.head_dim} batch=1 {args.dtype}, W = T/{args.t_over_w}")
    flex_header = "" if args.no_flex else f" {'flex/full':>10} {'flex/blocked':>13}"
    print(
        f"{'T':>6} {'W':>5} {'block':>5} {'work W/T':>9} {'time SWA/full':>14} {'vs W/T':>7} {'target <=2x':>12} {'vs 2W/T':>8}{flex_header}"
    )
    for length in args.lengths:
        window = length // args.t_over_w
        generator = torch.Generator().manual_seed(length)
        query = torch.randn(1, args.heads, length, args.head_dim, generator=generator, dtype=dtype)
        key = torch.randn(1, args.kv_heads, length, args.head_dim, generator=generator, dtype=dtype)
        value = torch.randn(1, args.kv_heads, length, args.head_dim, generator=generator, dtype=dtype)

        def full() -> torch.Tensor:
            return F.scaled_dot_product_attention(query, key, value, is_causal=True, enable_gqa=True)

        def swa() -> torch.Tensor:
            return blocked_attention(query, key, value, None, LocalWindow(window), block_size=args.block)

        block_masks = BlockMaskCache()

        def flex_swa() -> torch.Tensor:
            return flex.flex_attention_layer(query, key, value, None, LocalWindow(window), block_masks=block_masks)

        kernels = {"full": full, "blocked": swa} | ({} if args.no_flex else {"flex": flex_swa})
        times: dict[str, list[float]] = {name: [] for name in kernels}
        with torch.no_grad():
            for kernel in kernels.values():
                kernel()  # warm-up (flex: its compile and block mask)
            for _ in range(args.repeats):  # interleaved
                for name, kernel in kernels.items():
                    times[name] += time_call(kernel, 1)
        medians = {name: statistics.median(values) for name, values in times.items()}
        ratio = medians["blocked"] / medians["full"]
        work = window / length
        verdict = "ok" if ratio <= 2 * work else "MISSED"
        block = args.block or default_block_size(window)
        flex_columns = (
            ""
            if args.no_flex
            else f" {medians['flex'] / medians['full']:>10.4f} {medians['flex'] / medians['blocked']:>13.3f}"
        )
        print(
            f"{length:>6} {window:>5} {block:>5} {work:>9.4f} {ratio:>14.4f} {ratio / work:>6.2f}x {verdict:>12} "
            f"{ratio / (2 * work):>7.2f}x{flex_columns}",
            flush=True,
        )


if __name__ == "__main__":
    main()
