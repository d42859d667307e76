"""``bosch-eval bench``: prefill/decode speed, peak memory and KV bytes, original vs hybrids."""

from __future__ import annotations

import argparse
from typing import Any

from bosch_eval.device import pick_device
from bosch_eval.masks import HeadMask, ModelShape, check_sinks
from bosch_eval.model_check import ModelError, model_config, resolve_model

# Random-weight models for timing (no download). attn-heavy: hidden width 128 against 16 heads
# × 128, so attention is ~80% of the prefill at T = 8192 (the bench's "attention share").
RANDOM_CONFIGS = {
    "attn-heavy": dict(
        model_type="qwen3", num_hidden_layers=2, hidden_size=128, intermediate_size=256, num_attention_heads=16,
        num_key_value_heads=8, head_dim=128, vocab_size=512, max_position_embeddings=65536,
    ),
}  # fmt: skip


def _bench_model(args: argparse.Namespace) -> Any:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    dtype = getattr(torch, args.dtype)
    device = pick_device(args.device, "--device")  # before minutes of loading
    if args.model.startswith("random:"):
        name = args.model.removeprefix("random:")
        if name not in RANDOM_CONFIGS:
            raise ModelError(f"--model: unknown random config {name!r}, expected one of {sorted(RANDOM_CONFIGS)}")
        fields = dict(RANDOM_CONFIGS[name])
        config = AutoConfig.for_model(fields.pop("model_type"), attn_implementation="sdpa", **fields)
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    else:
        model = AutoModelForCausalLM.from_pretrained(resolve_model(args.model), dtype=dtype, attn_implementation="sdpa")
    return model.to(device).eval()


def _bench(args: argparse.Namespace) -> None:
    import json
    from pathlib import Path

    from bosch_eval.bench import balanced_mask, environment, plot, ratio_table, rows_as_json, run_bench

    if args.mask:
        mask = HeadMask.load(args.mask)
        if args.sink is not None:
            mask = mask.with_meta(sinks=check_sinks(args.sink, "--sink"))
        if not args.model.startswith("random:"):  # a mask for another model fails before the weights load
            mask.check_fits(ModelShape.from_config(model_config(resolve_model(args.model))), args.mask, args.model)
    model = _bench_model(args)
    if args.mask:
        configs: list = [(Path(args.mask).stem, mask)]
    else:
        configs = [(f"ρ={ratio:g}", ratio) for ratio in args.ratios]
    configs += _kv_quant_configs(args, model, configs)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    sinks = check_sinks(args.sink or 0, "--sink")
    rows = run_bench(model, configs, args.lengths, args.decode_tokens, args.window, args.chunk, args.repeats, sinks)
    report = {"command": " ".join(["bosch-eval", *args.argv]), "environment": environment(next(model.parameters()).device), "rows": rows_as_json(rows)}
    budget = int(args.memory_budget_gb * 2**30) if args.memory_budget_gb else None
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    table = ratio_table(rows, budget, weights) if args.kv_quant else ratio_table(rows)
    if budget is not None:
        table += f"\n\nmax batch: (budget {args.memory_budget_gb:g} GiB − weights {weights} B) // KV bytes (formula) per sequence at T"
        report["memory_budget_bytes"], report["weight_bytes"] = budget, weights
    plot(rows, str(out / "bench.png"))
    if args.windows:
        ratio = args.ratios[-1]
        shape = ModelShape.from_config(model.config)
        sweep_configs = [(f"ρ={ratio:g} W={w}", balanced_mask(shape, ratio, w).with_meta(sinks=sinks)) for w in args.windows]
        sweep = run_bench(model, sweep_configs, [max(args.lengths)], args.decode_tokens, None, args.chunk, args.repeats)
        report["window_sweep"] = rows_as_json(sweep)
        table += "\n\nWindow sweep\n" + ratio_table(sweep)
        plot(sweep, str(out / "bench_windows.png"), x="window")
    (out / "bench.json").write_text(json.dumps(report, indent=1) + "\n")
    (out / "bench.md").write_text(f"$ {report['command']}\n\n{json.dumps(report['environment'])}\n\n{table}\n")
    print(table)


def _kv_quant_configs(args: argparse.Namespace, model: Any, configs: list) -> list:
    """``--kv-quant m1,m2``: each method alone, then on each mask configuration."""
    if not args.kv_quant:
        return []
    from bosch_eval.bench import kv_quant_label
    from bosch_eval.kv_quant.config import parse_kv_quant

    head_dim = ModelShape.head_dim_of(model.config)
    extra = []
    for method in args.kv_quant.split(","):
        kv = parse_kv_quant(method, args.kv_bits, args.kv_window, args.kv_group_size, head_dim=head_dim)
        if kv is None:
            continue
        extra.append((kv_quant_label(kv), None, kv))
        extra += [(f"{label} + {kv_quant_label(kv)}", source, kv) for label, source in configs]
    return extra


def add_bench_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``bench`` to the ``bosch-eval`` subcommands."""
    bench = subparsers.add_parser("bench", help="prefill/decode speed, peak memory and KV bytes: original vs hybrids")
    bench.add_argument("--model", required=True, help="HF id or path, toy / toy-l / smollm2, or random:attn-heavy (random weights, for timing)")
    source = bench.add_mutually_exclusive_group()
    source.add_argument("--mask", help="a bosch-mask/1 file to benchmark")
    source.add_argument("--ratios", type=float, nargs="+", default=[0.75], help="SWA ratios (balanced masks)")
    bench.add_argument("--lengths", type=int, nargs="+", default=[2048, 8192], help="sequence lengths T")
    bench.add_argument("--window", type=int, help="SWA window W for --ratios (default T/32 per length)")
    bench.add_argument("--windows", type=int, nargs="+", help="also sweep these windows at the largest T (Fig. 6)")
    bench.add_argument("--sink", type=int, help="attention sinks S of the SWA groups (default: the mask's, else 0); counted in the KV bytes")
    bench.add_argument("--decode-tokens", type=int, default=16, help="greedy decode steps timed after the prefill")
    bench.add_argument("--chunk", type=int, help="prefill in chunks of C tokens (default: one pass)")
    bench.add_argument("--repeats", type=int, default=3, help="interleaved repeats; medians are reported")
    bench.add_argument("--device", help="cpu, cuda or cuda:N (default: cuda when torch sees a GPU, else cpu)")
    bench.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"], help="weights dtype")
    bench.add_argument("--kv-quant", help="also benchmark KV quantization: comma-separated logquant,kivi (alone and on each mask)")
    bench.add_argument("--kv-bits", type=int, default=2, help="bits per quantized element with --kv-quant (2 or 4)")
    bench.add_argument("--kv-window", type=int, default=128, help="W_lq with --kv-quant (full precision keeps 2W..3W tokens)")
    bench.add_argument("--kv-group-size", type=int, help="channels per value scale with --kv-quant (default 64, or the head dim)")
    bench.add_argument("--memory-budget-gb", type=float, help="with --kv-quant: report the largest batch whose KV fits beside the weights")
    bench.add_argument("--out", default="bench", help="directory for bench.json, bench.md and the PNGs")
    bench.set_defaults(run=_bench)
    return bench
