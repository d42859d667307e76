"""``bosch-eval bench``: prefill/decode speed, peak memory and KV bytes, original vs hybrids."""

from __future__ import annotations

import argparse
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from bosch_eval.caches.kv_quant.methods import KV_QUANT_METHODS
from bosch_eval.masks.head_mask import HeadMask, ModelShape, check_sinks
from bosch_eval.runtime.device import pick_device
from bosch_eval.runtime.errors import ModelError, SettingsError

if TYPE_CHECKING:
    from bosch_eval.models.resolved_model import ResolvedModel

# Random-weight models for timing (no download). attn-heavy: hidden width 128 against 16 heads
# × 128, so attention is ~80% of the prefill at T = 8192 (the bench's "attention share").
# qwen3-1.7b: Qwen3-1.7B's shape (28 layers, 16 heads, 8 KV groups, head dim 128, its vocabulary
# and tied embeddings), the model of issue 38's GPU targets.
RANDOM_CONFIGS = {
    "attn-heavy": dict(
        model_type="qwen3", num_hidden_layers=2, hidden_size=128, intermediate_size=256, num_attention_heads=16,
        num_key_value_heads=8, head_dim=128, vocab_size=512, max_position_embeddings=65536,
    ),
    "qwen3-1.7b": dict(
        model_type="qwen3", num_hidden_layers=28, hidden_size=2048, intermediate_size=6144, num_attention_heads=16,
        num_key_value_heads=8, head_dim=128, vocab_size=151936, max_position_embeddings=65536, tie_word_embeddings=True,
        rope_theta=1000000.0,
    ),
}  # fmt: skip


def random_bench_model(name: str, dtype: Any, device: Any) -> Any:
    """The random-weight model ``random:<name>`` (:data:`RANDOM_CONFIGS`), initialized on ``device``
    (a 1.7B model initializes in a fraction of a second on a GPU, in many on a CPU)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    if name not in RANDOM_CONFIGS:
        raise ModelError(f"--model: unknown random config {name!r}, expected one of {sorted(RANDOM_CONFIGS)}")
    fields = dict(RANDOM_CONFIGS[name])
    config = AutoConfig.for_model(fields.pop("model_type"), attn_implementation="sdpa", **fields)
    torch.manual_seed(0)
    with torch.device(device):
        return AutoModelForCausalLM.from_config(config, dtype=dtype).eval()


def _bench_model(args: argparse.Namespace, resolved: ResolvedModel | None, device: Any) -> Any:
    """The model to measure: ``random:<name>`` (``resolved`` None) or the resolved model's weights."""
    import torch
    from transformers import AutoModelForCausalLM

    dtype = getattr(torch, args.dtype)
    if resolved is None:
        model = random_bench_model(args.model.removeprefix("random:"), dtype, device)
    else:
        model = AutoModelForCausalLM.from_pretrained(resolved.path, dtype=dtype, attn_implementation="sdpa")
    return model.to(device).eval()


def _bench(args: argparse.Namespace) -> None:
    import json
    from pathlib import Path

    import torch

    # The command's work (torch, transformers, matplotlib), imported when it runs: --help stays free of them.
    from bosch_eval.attention.hybrid_spec import backend_names, resolve_backend
    from bosch_eval.bench.report import environment, peak_note, plot, ratio_table, rows_as_json
    from bosch_eval.bench.runner import BenchPlan, drawn_mask, run_bench
    from bosch_eval.models.resolved_model import ResolvedModel

    if args.backend not in backend_names():
        raise SettingsError(f"--backend: expected one of {backend_names()}, got {args.backend!r}")
    if args.compile and args.kv_quant:
        raise SettingsError(
            "--compile: KV quantization is not compiled (its store grows and quantizes in steps of W); drop --kv-quant or --compile"
        )
    device = pick_device(args.device, "--device")  # before minutes of loading
    resolve_backend(
        args.backend, torch.device(device)
    )  # a backend this device cannot run fails before the weights load
    resolved = None if args.model.startswith("random:") else ResolvedModel.named(args.model)  # its files, no weights
    if args.mask:
        mask = HeadMask.load(args.mask)
        if args.sink is not None:
            mask = mask.with_meta(sinks=check_sinks(args.sink, "--sink"))
        if resolved is not None:  # a mask for another model fails before the weights load
            mask.check_fits(resolved.shape, args.mask, args.model)
    model = _bench_model(args, resolved, device)
    if args.mask:
        configs: list = [(Path(args.mask).stem, mask)]
    else:
        configs = [(f"ρ={ratio:g}", ratio) for ratio in args.ratios]
    configs += _kv_quant_configs(args, model, configs)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    sinks = check_sinks(args.sink or 0, "--sink")
    plan = BenchPlan(
        tuple(args.lengths), args.decode_tokens, args.window, args.chunk, args.repeats, sinks,
        decode_batch=args.decode_batch, warmup=args.warmup, backend=args.backend, profile=args.profile, compile_decode=args.compile,
    )  # fmt: skip
    report = {
        "command": " ".join(["bosch-eval", *args.argv]),
        "environment": environment(next(model.parameters()).device),
        "peak_memory": peak_note(next(model.parameters()).device, args.profile),  # how the peak columns were measured
    }
    budget = int(args.memory_budget_gb * 2**30) if args.memory_budget_gb else None
    weights = sum(p.numel() * p.element_size() for p in model.parameters())

    def write(rows: list) -> str:
        """bench.json and bench.md with the rows so far (after each length: a run cut short keeps them)."""
        table = ratio_table(rows, budget, weights) if args.kv_quant else ratio_table(rows)
        table += f"\n\n{report['peak_memory']}"
        (out / "bench.json").write_text(json.dumps({**report, "rows": rows_as_json(rows)}, indent=1) + "\n")
        (out / "bench.md").write_text(f"$ {report['command']}\n\n{json.dumps(report['environment'])}\n\n{table}\n")
        return table

    rows = run_bench(model, configs, plan, progress=write)
    table = write(rows)
    report["rows"] = rows_as_json(rows)
    if budget is not None:
        table += f"\n\nmax batch: (budget {args.memory_budget_gb:g} GiB − weights {weights} B) // KV bytes (formula) per sequence at T"
        report["memory_budget_bytes"], report["weight_bytes"] = budget, weights
    plot(rows, str(out / "bench.png"))
    if args.windows:
        ratio = args.ratios[-1]
        shape = ModelShape.from_config(model.config)
        sweep_configs = [
            (f"ρ={ratio:g} W={w}", drawn_mask(shape, ratio, w).with_meta(sinks=sinks)) for w in args.windows
        ]
        sweep = run_bench(model, sweep_configs, replace(plan, lengths=(max(args.lengths),), window=None, sinks=0))
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
    # Here, not at the top: the runner loads torch (--help stays free of it).
    from bosch_eval.bench.runner import kv_quant_label
    from bosch_eval.caches.kv_quant.config import parse_kv_quant

    head_dim = ModelShape.head_dim_of(model.config)
    extra = []
    for method in args.kv_quant.split(","):
        kv = parse_kv_quant(method, args.kv_bits, args.kv_window, args.kv_group_size, head_dim=head_dim)
        if kv is None:
            continue
        extra.append((kv_quant_label(kv), None, kv))
        extra += [(f"{label} + {kv_quant_label(kv)}", source, kv) for label, source in configs]
    return extra


def _at_least(least: int) -> Any:
    """An argparse type: an integer ≥ ``least`` (argparse names the flag in its error)."""

    def parse(text: str) -> int:
        value = int(text)
        if value < least:
            raise argparse.ArgumentTypeError(f"expected an integer >= {least}, got {value}")
        return value

    return parse


def add_bench_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``bench`` to the ``bosch-eval`` subcommands."""
    bench = subparsers.add_parser("bench", help="prefill/decode speed, peak memory and KV bytes: original vs hybrids")
    bench.add_argument(
        "--model",
        required=True,
        help="HF id or path, toy / toy-l / smollm2 / a .gguf file, or random:attn-heavy / random:qwen3-1.7b (random weights, for timing)",
    )
    source = bench.add_mutually_exclusive_group()
    source.add_argument("--mask", help="a bosch-mask/1 file to benchmark")
    source.add_argument("--ratios", type=float, nargs="+", default=[0.75], help="SWA ratios (balanced masks)")
    bench.add_argument("--lengths", type=int, nargs="+", default=[2048, 8192], help="sequence lengths T")
    bench.add_argument("--window", type=int, help="SWA window W for --ratios (default T/32 per length)")
    bench.add_argument("--windows", type=int, nargs="+", help="also sweep these windows at the largest T (Fig. 6)")
    bench.add_argument(
        "--sink",
        type=int,
        help="attention sinks S of the SWA groups (default: the mask's, else 0); counted in the KV bytes",
    )
    bench.add_argument(
        "--decode-tokens",
        type=int,
        default=16,
        help="greedy decode steps timed after the prefill, at batch 1 and at --decode-batch",
    )
    bench.add_argument(
        "--decode-batch",
        type=_at_least(1),
        default=8,
        help="B of the batched decode (the prefilled cache repeated B times; default 8)",
    )
    bench.add_argument("--chunk", type=int, help="prefill in chunks of C tokens (default: one pass)")
    bench.add_argument(
        "--repeats",
        type=_at_least(1),
        default=3,
        help="timed, interleaved repeats per configuration; medians are reported (default 3)",
    )
    bench.add_argument(
        "--warmup",
        type=_at_least(0),
        default=1,
        help="untimed runs of every configuration before the timed ones (default 1)",
    )
    bench.add_argument(
        "--backend",
        default="auto",
        help="attention backend of the hybrids: auto (default) or one registered in bosch_eval.attention.kernels (a wrong name lists them)",
    )
    bench.add_argument(
        "--no-profile", dest="profile", action="store_false",
        help="skip the attention-share and decode-peak runs (two more runs per configuration; their columns read -)",
    )  # fmt: skip
    bench.add_argument(
        "--compile", action="store_true",
        help="decode steps under torch.compile over static caches (CUDA graphs on a GPU), every configuration alike: the original on "
        "transformers' StaticCache, the hybrids on their captured cache; the warm-up runs compile (refused with --kv-quant)",
    )  # fmt: skip
    bench.add_argument("--device", help="cpu, cuda or cuda:N (default: cuda when torch sees a GPU, else cpu)")
    bench.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"], help="weights dtype")
    methods = ", ".join(KV_QUANT_METHODS.names())
    bench.add_argument(
        "--kv-quant",
        help=f"also benchmark KV quantization: comma-separated methods ({methods}), alone and on each mask",
    )
    bench.add_argument("--kv-bits", type=int, default=2, help="bits per quantized element with --kv-quant (2 or 4)")
    bench.add_argument(
        "--kv-window", type=int, default=128, help="W_lq with --kv-quant (full precision keeps 2W..3W tokens)"
    )
    bench.add_argument(
        "--kv-group-size", type=int, help="channels per value scale with --kv-quant (default 64, or the head dim)"
    )
    bench.add_argument(
        "--memory-budget-gb",
        type=float,
        help="with --kv-quant: report the largest batch whose KV fits beside the weights",
    )
    bench.add_argument("--out", default="bench", help="directory for bench.json, bench.md and the PNGs")
    bench.set_defaults(run=_bench)
    return bench
