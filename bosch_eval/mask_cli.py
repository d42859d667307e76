"""``bosch-eval mask``: inspect a mask file, or build one from a ranking or a layer heuristic."""

from __future__ import annotations

import argparse
from typing import Any

from bosch_eval.masks.head_mask import HeadMask, HeadRanking
from bosch_eval.masks.mask_sources import MaskRequest, resolve_mask
from bosch_eval.runtime.errors import MaskError

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


def _mask_from_layers(args: argparse.Namespace) -> None:
    from bosch_eval.models.resolved_model import ResolvedModel  # transformers, torch: not for --help

    model = ResolvedModel.named(args.model)
    request = MaskRequest(layers=args.heuristic, ratio=args.ratio, seed=args.seed, window=args.window)
    mask, _ = resolve_mask(model.shape, request, default_window=model.defaults.window)
    mask = mask.with_meta(model=args.model)
    mask.save(args.out)
    print(format_mask(mask, args.out))


def add_mask_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``mask show``, ``mask from-ranking`` and ``mask from-layers`` to the ``bosch-eval`` subcommands."""
    parser = subparsers.add_parser("mask", help="inspect and build head masks")
    mask = parser.add_subparsers(dest="mask_command", required=True)
    show = mask.add_parser("show", help="print a summary of a bosch-mask/1 file")
    show.add_argument("file", help="path of a bosch-mask/1 JSON file")
    show.set_defaults(run=_mask_show)
    from_ranking = mask.add_parser("from-ranking", help="turn the most local groups of a ranking into SWA")
    from_ranking.add_argument("ranking", help="path of a bosch-ranking/1 JSON file")
    from_ranking.add_argument(
        "--ratio", type=float, required=True, help="share of KV groups to turn into SWA, in [0, 1]"
    )
    from_ranking.add_argument("--window", type=int, help="SWA window W (default: the ranking's)")
    from_ranking.add_argument("--out", required=True, help="where to write the bosch-mask/1 file")
    from_ranking.set_defaults(run=_mask_from_ranking)
    from_layers = mask.add_parser(
        "from-layers", help="turn whole layers into SWA by a layer heuristic (INTR, BME, RAND)"
    )
    from_layers.add_argument("heuristic", help="a layer heuristic's name: intr, bme or rand (docs/masks.md)")
    from_layers.add_argument("--model", required=True, help="HF id or path, or toy / toy-l / smollm2: the mask's shape")
    from_layers.add_argument(
        "--ratio", type=float, required=True, help="share of KV groups to turn into SWA, in [0, 1]"
    )
    from_layers.add_argument("--seed", type=int, help="rand's seed")
    from_layers.add_argument("--window", type=int, help="SWA window W (default: the model's)")
    from_layers.add_argument("--out", required=True, help="where to write the bosch-mask/1 file")
    from_layers.set_defaults(run=_mask_from_layers)
    return parser
