"""``bosch-eval import``: turn a published head pattern into a bosch ranking or mask file.

::

    bosch-eval import --format duo full_attention_heads.tsv --model M --out ranking.json
    lm_eval --model bosch --model_args pretrained=M,ranking=ranking.json,ratio=0.75,window=1024 ...

A format that gives a ranking (``duo``, ``retrieval-json``) writes a ``bosch-ranking/1`` file
(use with ``ranking=``, ``ratio=``); one that gives a mask (``prulong``) a ``bosch-mask/1``
file (its ratio is fixed; use with ``mask=``). The formats are the modules of
:mod:`bosch_eval.search.importers`; ``--format`` lists what it finds there.
"""

from __future__ import annotations

import argparse
from typing import Any

from bosch_eval.masks.head_mask import HeadMask
from bosch_eval.search.importers import IMPORTERS, import_pattern, model_shape


def add_import_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``import`` command to ``subparsers`` (from ``parser.add_subparsers()``); the
    formats are the importers registered in :data:`IMPORTERS` (listing them imports no heavy package)."""
    importers = IMPORTERS.items()
    formats = "; ".join(f"{name}: {importer.upstream}" for name, importer in importers)
    parser = subparsers.add_parser(
        "import",
        help=f"turn a published head pattern ({', '.join(name for name, _ in importers)}) into a ranking or mask",
        description="Turn a published head pattern into a bosch-ranking/1 file (a format that gives a ranking: use "
        f"with ranking=FILE,ratio=R) or a bosch-mask/1 file (one that gives a mask: use with mask=FILE). Formats — {formats}.",
    )
    parser.add_argument("file", help="the pattern file (full_attention_heads.tsv, masks.tsv, a head-score JSON, ...)")
    parser.add_argument(
        "--format",
        required=True,
        choices=sorted(name for name, _ in importers),
        help="; ".join(f"{name}: {importer.what} ({importer.gives})" for name, importer in importers),
    )
    parser.add_argument("--model", required=True, help="HF model id or local path; its config gives L, H and G")
    parser.add_argument(
        "--out",
        required=True,
        help="where to write the bosch-ranking/1 (or, for a format that gives a mask, bosch-mask/1) JSON",
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
