"""The ``bosch-eval export`` command: a mask as a plain transformers checkpoint, or as a
``bosch-serving/1`` file for a serving engine (:mod:`bosch_eval.models.export`)."""

from __future__ import annotations

import argparse
from typing import Any

from bosch_eval.masks.head_mask import HeadMask, check_window
from bosch_eval.masks.layer_heuristics import LAYER_HEURISTICS
from bosch_eval.masks.mask_sources import MaskRequest, resolve_mask
from bosch_eval.masks.window import WINDOW_CONVENTIONS
from bosch_eval.models.model_check import resolve_model
from bosch_eval.runtime.errors import ExportError, MaskError

TARGETS = ("transformers", "serving")


def _mask(args: argparse.Namespace) -> tuple[HeadMask, str]:
    """The mask asked for: --mask, --ranking/--layers with --ratio, or the one a hybrid
    checkpoint (--model) embeds."""
    from bosch_eval.attention.hybrid_attention import CONFIG_FIELD  # torch: not for --help
    from bosch_eval.models.resolved_model import ResolvedModel  # torch: likewise

    if args.model is None:
        if args.mask is None:
            raise MaskError(
                "export: pass --model M (with --mask, --ranking or --layers, or a hybrid checkpoint) or --mask FILE"
            )
        mask = HeadMask.load(args.mask)
        window = check_window(args.window, "--window") if args.window is not None else mask.window
        return mask.with_meta(window=window), args.mask
    model = ResolvedModel.named(args.model)
    if args.mask is None and args.ranking is None and args.layers is None:
        if model.saved_mask is None:
            raise MaskError(
                f"{model.config_file}: no field '{CONFIG_FIELD}' (not a hybrid checkpoint); "
                "pass --mask FILE, --ranking FILE --ratio R or --layers NAME --ratio R"
            )
        return resolve_mask(model.shape, MaskRequest(mask=model.saved_mask, window=args.window), model_name=args.model)
    request = MaskRequest(
        mask=args.mask, ranking=args.ranking, layers=args.layers, ratio=args.ratio, seed=args.seed, window=args.window
    )
    return resolve_mask(model.shape, request, default_window=model.defaults.window, model_name=args.model)


def _export(args: argparse.Namespace) -> None:
    from bosch_eval.models.export import export_transformers, write_serving  # torch: not for --help

    mask, source = _mask(args)
    if mask.model is None and args.model is not None:
        mask = mask.with_meta(model=args.model)  # heuristic and ranking masks name no model
    if args.to == "transformers":
        if args.model is None:
            raise ExportError("export --to transformers: pass --model M, the checkpoint whose weights are exported")
        out = export_transformers(resolve_model(args.model), mask, args.out, source)
        print(
            f"{out}: transformers checkpoint (layer_types, sliding_window={mask.window}); load with AutoModelForCausalLM"
        )
    else:
        out = write_serving(mask, args.out, args.window_convention)
        print(f"{out}: bosch-serving/1, window counted {args.window_convention}")


def add_export_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``export`` command to ``subparsers`` (from ``parser.add_subparsers()``)."""
    parser = subparsers.add_parser(
        "export",
        help="run a mask outside bosch-eval: a plain transformers checkpoint, or a file for serving engines",
        description="--to transformers DIR: a whole-layer mask (rows all SWA or all full) as a checkpoint whose "
        "config sets transformers' layer_types/sliding_window, for families whose config declares layer_types "
        "(checked on the weights before DIR appears). --to serving FILE: any mask as bosch-serving/1 JSON "
        "(per layer: full and SWA KV groups, window, sinks).",
    )
    parser.add_argument("--to", required=True, choices=TARGETS, help="export target")
    parser.add_argument("out", help="checkpoint directory (transformers) or JSON file (serving) to write")
    parser.add_argument(
        "--model", help="HF id, checkpoint directory, 'toy' / 'toy-l' / 'smollm2', a .gguf file, or a hybrid checkpoint"
    )
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--mask", help="a bosch-mask/1 file")
    source.add_argument("--ranking", help="a bosch-ranking/1 file (with --ratio)")
    source.add_argument("--layers", help=f"a layer heuristic: {', '.join(LAYER_HEURISTICS.names())} (with --ratio)")
    parser.add_argument("--ratio", type=float, help="SWA ratio for --ranking or --layers")
    parser.add_argument("--seed", type=int, help="seed for --layers rand")
    parser.add_argument(
        "--window", type=int, help="SWA window W (default: the mask's, or the model's bosch_defaults.json)"
    )
    parser.add_argument(
        "--window-convention",
        default="inclusive",
        choices=WINDOW_CONVENTIONS,
        help="serving: inclusive = W keys including the query (transformers, vLLM, SGLang); exclusive = W-1 before it",
    )
    parser.set_defaults(run=_export)
    return parser
