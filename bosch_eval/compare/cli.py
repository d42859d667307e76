"""``bosch-eval compare``: entries × lm-eval tasks, then the leaderboard.

    bosch-eval compare --model toy --tasks niah_single_1 --limit 10 \\
        --metadata '{"max_seq_lengths": [512, 1024]}' \\
        --entry original= --entry bosch=mask=mask.json --entry intr=layers=intr,ratio=0.75 --out cmp
    bosch-eval compare --config leaderboard.yaml --out cmp [--resume [--new-settings]] [--from-results DIR ...]
    bosch-eval compare --pack --out cmp    # its finished runs made ready to commit (bosch_eval.compare.pack)
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from bosch_eval.compare.entries import parse_entry
from bosch_eval.compare.pack import pack
from bosch_eval.compare.spec import CompareSpec, build_spec, load_spec
from bosch_eval.masks.head_mask import ModelShape
from bosch_eval.runtime.errors import EntryError
from bosch_eval.runtime.versions import versions


def add_compare_parser(subparsers: Any) -> argparse.ArgumentParser:
    parser = subparsers.add_parser("compare", help="leaderboard: entries (masks, rankings, heuristics) × lm-eval tasks")
    parser.add_argument("--config", help="leaderboard YAML (model, tasks, metadata, limit, entries, ...)")
    parser.add_argument(
        "--model", help="HF id or path; toy / toy-l / smollm2 = a bundled or packaged model (overrides the YAML)"
    )
    parser.add_argument("--model-args", help="k=v,... passed to every entry's adapter (device, batch_size, dtype)")
    parser.add_argument(
        "--entry",
        action="append",
        default=[],
        help="NAME=ARGS (--model bosch model_args; empty: the original); repeatable",
    )
    parser.add_argument("--tasks", nargs="+", help="lm-eval task or group names")
    parser.add_argument("--metadata", help="JSON passed to the tasks (e.g. max_seq_lengths)")
    parser.add_argument("--limit", type=float, help="documents per task (per length for RULER-style tasks)")
    parser.add_argument(
        "--doc-seed", type=int,
        help="seed of the documents the synthetic tasks build (RULER's niah_*, bosch_niah's eval_seed): a fresh test draw "
        "(default: their own documents); lm-eval's --seed does not reach documents built before the evaluation",
    )  # fmt: skip
    parser.add_argument("--gen-kwargs", help="lm-eval gen_kwargs (k=v,...)")
    parser.add_argument("--include-path", help="an extra lm-eval task directory")
    parser.add_argument("--reference", help="entry the CIs are differences to (default: original)")
    parser.add_argument(
        "--claimant", help="entry whose claims against every other entry go to claims.md (paired CIs, Holm-adjusted p)"
    )
    parser.add_argument("--kv-length", type=int, help="T of the KV-bytes column (default: the longest task length)")
    parser.add_argument(
        "--from-results", nargs="+", default=[], help="finished lm-eval output directories to add as entries"
    )
    parser.add_argument("--resume", action="store_true", help="skip runs already finished under --out")
    parser.add_argument(
        "--new-settings",
        action="store_true",
        help="with --resume: evaluate again finished runs made with other settings or inputs (a changed mask file, "
        "model, limit, ...), keeping the old runs and leaderboard in --out/previous/; without it such a resume is refused",
    )
    parser.add_argument(
        "--pack",
        action="store_true",
        help="evaluate nothing: pack the finished lm-eval outputs under --out (a comparison, or any lm_eval --output_path) "
        "for committing: prompts stripped, the machine description written once, files gzipped (results/README.md)",
    )
    parser.add_argument(
        "--keep-prompts",
        action="store_true",
        help="with --pack: keep the prompt text, for documents no task can regenerate (their only record)",
    )
    parser.add_argument("--out", required=True, help="output directory")
    parser.set_defaults(run=compare_main)
    return parser


def kv_length_of(spec: Any, model: Any) -> int | None:
    """T of the KV-bytes column: ``kv_length``, else the longest length the metadata names,
    else, when every task is one of ours, the ``model``'s ``calib_len`` (``bosch_defaults.json``),
    which each of them defaults to (a bosch_niah_calib-only comparison said "T = None")."""
    length = spec.default_kv_length()
    if length is None and all(task.startswith("bosch_") for task in spec.tasks):
        length = model.defaults.calib_len
    return length


def compare_main(args: argparse.Namespace) -> None:
    # The comparison itself: numpy, torch, lm-eval, transformers, not for --help.
    from bosch_eval.compare.claims import claims_of, write_claims
    from bosch_eval.compare.leaderboard import (
        build_rows,
        column_order,
        from_compare_dir,
        from_results_dir,
        headline_columns,
        write_leaderboard,
    )
    from bosch_eval.compare.runner import output_lock, resolved_model, run_compare

    if args.pack:
        if not Path(args.out).is_dir():  # before the lock, which would create it
            raise EntryError(
                f"--out {args.out}: not a directory (expected a comparison's --out or an lm_eval --output_path)"
            )
        with output_lock(args.out):  # packing moves finished runs into runs.tar.xz: not while a comparison writes
            print(f"{args.out}: {pack(args.out, keep_prompts=args.keep_prompts)} files packed")
        return
    if args.new_settings and not args.resume:
        raise EntryError("--new-settings: evaluates again finished runs that no longer match; pass it with --resume")
    limit = (
        None if args.limit is None else (int(args.limit) if args.limit >= 1 and args.limit.is_integer() else args.limit)
    )
    try:
        metadata = json.loads(args.metadata) if args.metadata else None
    except json.JSONDecodeError as err:
        raise EntryError(f"--metadata: not valid JSON ({err})") from None
    fields = {"model": args.model, "model_args": args.model_args, "tasks": args.tasks, "metadata": metadata, "limit": limit,
              "gen_kwargs": args.gen_kwargs, "include_path": args.include_path, "reference": args.reference,
              "claimant": args.claimant, "kv_length": args.kv_length, "doc_seed": args.doc_seed}  # fmt: skip
    if args.config:
        spec = load_spec(args.config, fields, args.entry)
    else:
        spec = build_spec(
            {k: v for k, v in fields.items() if v is not None}, [parse_entry(e) for e in args.entry], "command line"
        )
    out = Path(args.out)
    extra = [from_results_dir(d) for d in args.from_results]
    names = [e.name for e in spec.entries]
    clash = [e.name for e in extra if e.name in names]
    if clash:
        raise EntryError(f"--from-results: {clash} has the name of an entry; rename the directory")
    _check_named_entries(spec, names + [e.name for e in extra], args)
    model = resolved_model(spec)
    head_dim = ModelShape.head_dim_of(model.config)  # the packed size of kv_quant entries depends on it
    with output_lock(out):  # the runs and the leaderboard: one writer
        run_compare(spec, out, resume=args.resume, locked=True, new_settings=args.new_settings, model=model)
        entries = from_compare_dir(out, names) + extra
        order = column_order(entries)
        kv_length = kv_length_of(spec, model)
        rows = build_rows(entries, spec.reference, kv_length, head_dim=head_dim, tasks=spec.tasks)
        header = {"command": " ".join(["bosch-eval", *args.argv]), "versions": versions("bosch-eval", "lm_eval", "torch", "transformers"), "reference": spec.reference,
                  "kv_length": kv_length, "settings": spec.settings()}  # fmt: skip
        write_leaderboard(rows, order, out, header, spec.tasks)
        if spec.claimant is not None:
            claims = claims_of(spec.claimant, entries, rows, spec.reference, headline_columns(rows, order, spec.tasks))
            write_claims(out, spec.claimant, claims, header)
    print((out / "leaderboard.md").read_text())
    if spec.claimant is not None:
        print((out / "claims.md").read_text())


def _check_named_entries(spec: CompareSpec, names: list[str], args: argparse.Namespace) -> None:
    """The reference and the claimant name entries (before any run)."""
    for field, flag, name in (("reference", "--reference", spec.reference), ("claimant", "--claimant", spec.claimant)):
        if name is not None and name not in names:
            given = (
                flag
                if getattr(args, field)
                else f"field {field!r}" + (" (default: original)" if field == "reference" else "")
            )
            raise EntryError(f"{given}: {name!r} names no entry; expected one of {names}")
