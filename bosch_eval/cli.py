"""The ``bosch-eval`` command line."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from bosch_eval.analyze.cli import add_analyze_parser
from bosch_eval.compare.cli import add_compare_parser
from bosch_eval.compare.entries import EntryError
from bosch_eval.device import pick_device
from bosch_eval.export_cli import add_export_parser
from bosch_eval.lm_eval_logs import quiet_per_length_warnings
from bosch_eval.masks import HeadMask, HeadRanking, MaskError, ModelShape, check_sinks
from bosch_eval.model_check import BUNDLED_MODELS, model_config, resolve_model
from bosch_eval.search.calib_check_cli import CalibCheckError, add_calib_check_parser
from bosch_eval.search.import_cli import add_import_parser
from bosch_eval.search.rank_cli import add_rank_parser
from bosch_eval.search.search_cli import ERRORS as SEARCH_ERRORS
from bosch_eval.search.search_cli import add_search_parser
from bosch_eval.train.cli import add_train_parser

FULL, SWA = "█", "·"


def format_mask(mask: HeadMask, source: str) -> str:
    """A readable summary of a mask: model, L×G grid, ratio, window, method."""
    shape = mask.shape
    total = shape.num_layers * shape.num_kv_heads
    lines = [
        source,
        f"  model      {mask.model or '(not recorded)'}",
        f"  shape      L={shape.num_layers} layers × G={shape.num_kv_heads} KV groups (H={shape.num_heads} query heads)",
        f"  SWA ratio  {mask.swa_ratio:.4f} ({mask.num_swa_groups} of {total} KV groups)",
        f"  window     {mask.window if mask.window is not None else '(not set)'}",
        f"  method     {mask.method or '(not recorded)'}",
        f"  grid       one row per layer, one column per KV group ({FULL} full, {SWA} SWA)",
    ]
    width = len(str(shape.num_layers - 1))
    for layer, row in enumerate(mask.bits):
        lines.append(f"  layer {layer:>{width}}    {''.join(FULL if bit else SWA for bit in row)}")
    return "\n".join(lines)


def _mask_show(args: argparse.Namespace) -> None:
    print(format_mask(HeadMask.load(args.file), args.file))


def _mask_from_ranking(args: argparse.Namespace) -> None:
    mask = HeadRanking.load(args.ranking).to_mask(args.ratio, window=args.window)
    mask = mask.with_meta(provenance={**mask.provenance, "ranking_file": args.ranking})
    if mask.window is None:
        raise MaskError(f"{args.ranking}: field 'window' is missing; pass --window W")
    mask.save(args.out)
    print(format_mask(mask, args.out))


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
            raise MaskError(f"--model: unknown random config {name!r}, expected one of {sorted(RANDOM_CONFIGS)}")
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


def _toy_model(args: argparse.Namespace) -> None:
    from bosch_eval.model_check import model_path

    print(model_path(args.name))


def _tasks_dir(args: argparse.Namespace) -> None:
    from bosch_eval.tasks import TASKS_DIR

    print(TASKS_DIR)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="bosch-eval", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    mask = commands.add_parser("mask", help="inspect and build head masks").add_subparsers(dest="mask_command", required=True)
    show = mask.add_parser("show", help="print a summary of a bosch-mask/1 file")
    show.add_argument("file", help="path of a bosch-mask/1 JSON file")
    show.set_defaults(run=_mask_show)
    from_ranking = mask.add_parser("from-ranking", help="turn the most local groups of a ranking into SWA")
    from_ranking.add_argument("ranking", help="path of a bosch-ranking/1 JSON file")
    from_ranking.add_argument("--ratio", type=float, required=True, help="share of KV groups to turn into SWA, in [0, 1]")
    from_ranking.add_argument("--window", type=int, help="SWA window W (default: the ranking's)")
    from_ranking.add_argument("--out", required=True, help="where to write the bosch-mask/1 file")
    from_ranking.set_defaults(run=_mask_from_ranking)

    bench = commands.add_parser("bench", help="prefill/decode speed, peak memory and KV bytes: original vs hybrids")
    bench.add_argument("--model", required=True, help="HF id or path, or random:attn-heavy (random weights, for timing)")
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

    toy = commands.add_parser("toy-model", help="the bundled toy models (small trained Qwen3s)")
    toy.add_argument("--path", action="store_true", required=True, help="print the directory to pass as pretrained=")
    toy.add_argument(
        "--name", default="toy", choices=sorted(BUNDLED_MODELS), help="toy: 4 layers x 4 KV groups; toy-l: 8 x 8 (default: toy)"
    )
    toy.set_defaults(run=_toy_model)

    tasks = commands.add_parser("tasks", help="the bundled lm-eval tasks (bosch_niah_calib, bosch_niah, bosch_longbench)")
    tasks.add_argument("--path", action="store_true", required=True, help="print the directory to pass as --include_path")
    tasks.set_defaults(run=_tasks_dir)

    add_search_parser(commands)
    add_rank_parser(commands)
    add_import_parser(commands)
    add_train_parser(commands)
    add_compare_parser(commands)
    add_analyze_parser(commands)
    add_calib_check_parser(commands)
    add_export_parser(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    args.argv = argv
    quiet_per_length_warnings()  # compare and search build lm-eval tasks before any adapter exists
    try:
        args.run(args)
    except (MaskError, EntryError, CalibCheckError, *SEARCH_ERRORS) as err:
        print(f"bosch-eval: error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
