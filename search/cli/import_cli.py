"""``bosch-eval import``: turn a published head pattern into a bosch ranking or mask file.

::

    bosch-eval import --format duo full_attention_heads.tsv --model M --out ranking.json
    lm_eval --model bosch --model_args pretrained=M,ranking=ranking.json,ratio=0.75,window=1024 ...

``duo`` and ``retrieval-json`` give a ``bosch-ranking/1`` file (use with ``ranking=``,
``ratio=``); ``prulong`` gives a ``bosch-mask/1`` file (its ratio is fixed; use with
``mask=``). The formats are described in :mod:`bosch_eval.search.importers`.
"""

from __future__ import annotations

import argparse
from typing import Any

from bosch_eval.masks.head_mask import HeadMask
from bosch_eval.search.importers import IMPORTERS, UPSTREAM, import_pattern, model_shape


def add_import_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``import`` command to ``subparsers`` (from ``parser.add_subparsers()``)."""
    formats = "; ".join(f"{name}: {source}" for name, source in UPSTREAM.items())
    parser = subparsers.add_parser(
        "import",
        help="turn a published head pattern (DuoAttention, PruLong, Retrieval-Head JSON) into a ranking or mask",
        description="Turn a published head pattern into a bosch-ranking/1 file (duo, retrieval-json: use with "
        f"ranking=FILE,ratio=R) or a bosch-mask/1 file (prulong: use with mask=FILE). Formats — {formats}.",
    )
    parser.add_argument("file", help="the pattern file (full_attention_heads.tsv, masks.tsv or a head-score JSON)")
    parser.add_argument(
        "--format",
        required=True,
        choices=sorted(IMPORTERS),
        help="duo: DuoAttention gates (ranking); prulong: PruLong 0/1 masks (mask); "
        "retrieval-json: {'layer-head': [scores]} (ranking)",
    )
    parser.add_argument("--model", required=True, help="HF model id or local path; its config gives L, H and G")
    parser.add_argument(
        "--out", required=True, help="where to write the bosch-ranking/1 (or, for prulong, bosch-mask/1) JSON"
    )
    parser.add_argument(
        "--window", type=int, help="SWA window W to store in the output (default: none; pass window= at use)"
    )
    parser.set_defaults(run=import_main)
    return parser


def import_main(args: argparse.Namespace) -> None:
    """Run ``bosch-eval import``; raises a :class:`~bosch_eval.runtime.errors.BoschError` on any bad input."""
    shape = model_shape(args.model)
    result = import_pattern(args.format, args.file, shape, model=args.model, window=args.window)
    result.save(args.out)
    kind = "mask (bosch-mask/1)" if isinstance(result, HeadMask) else "ranking (bosch-ranking/1)"
    print(
        f"{args.out}: {kind} from {args.format} file {args.file}, "
        f"L={shape.num_layers} × G={shape.num_kv_heads} KV groups (H={shape.num_heads}); "
        f"group scores: {result.provenance['group_score']}"
    )
    if isinstance(result, HeadMask):
        print(f"  SWA ratio {result.swa_ratio:.4f} ({result.num_swa_groups} SWA groups); use it with mask={args.out}")
    else:
        print(f"  more local = {result.more_local} score; use it with ranking={args.out},ratio=R")
