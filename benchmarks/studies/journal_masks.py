"""Masks read off a finished search's journal, for the checks that score them (results/smollm2).

    python benchmarks/studies/journal_masks.py ties SEARCH [SEARCH ...]
    python benchmarks/studies/journal_masks.py tied SEARCH COUNT OUT
    python benchmarks/studies/journal_masks.py stage1 SEARCH OUT
    python benchmarks/studies/journal_masks.py copy-scores SEARCH OUT [--also OTHER ...]

``ties``: how many masks the calibration set ties with the returned one (the count a search
made since prints and writes to ``provenance.ties``; older searches' journals give it here).
``tied``: COUNT of those masks, the returned one first, as ``OUT/tied{i}.json``: the tie rule
is the search's own (:func:`bosch_eval.search.check.saturation.search_ties`), the masks spread evenly
over the order the journal first scored them, each with the returned mask's window and sinks.
``stage1``: the mask Stage 1 kept (Algorithm 1), as ``OUT/stage1.json``: the first Stage-1
record with ⌈ρ·G⌉ SWA groups in every layer at the best score such records reach.
``copy-scores``: SEARCH's journal as ``OUT/journal.jsonl.gz`` with its header, scores and racing
bounds, not its per-example values: a search of the same objective resumes from it (``--resume
--new-settings``) and asks none of those masks again. The values of journals written before the
racing fix (``60a6ae2``) sit under other documents of their chunk, so no race may read them;
bounds and scores, sums over whole chunks, hold. ``--also``: the scores and bounds of other
searches of the same objective (the headers' model, model files, calibration, window, model
arguments and dtype equal; only the search settings may differ) follow, each mask once.
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
from collections.abc import Sequence
from pathlib import Path

from bosch_eval.masks.head_mask import HeadMask
from bosch_eval.search.journal.store import read_records
from bosch_eval.search.check.saturation import search_ties


def bits(key: str) -> list[list[int]]:
    """A journal key (one 0/1 string per layer, 0 = SWA) as mask rows."""
    return [[int(bit) for bit in row] for row in key.split("/")]


def tied_in_journal_order(search: Path) -> list[str]:
    """The returned mask's key and the keys the search ties with it, in the order the journal first scored them."""
    found, ties = search_ties(search)
    tied = {found, *ties.keys}
    order = list(
        dict.fromkeys(record["key"] for record in read_records(search / "journal.jsonl") if record.get("key") in tied)
    )
    if order[0] != found:
        raise SystemExit(
            f"{search}: mask.json is not the first of its tied masks in the journal (expected the search to keep the first)"
        )
    return order


def write_tied(search: Path, count: int, out: Path) -> list[Path]:
    """COUNT tied masks spread evenly over the journal's order, the returned one first."""
    if count < 1:
        raise SystemExit(f"count: {count}; expected at least 1")
    returned = HeadMask.load(search / "mask.json")
    keys = tied_in_journal_order(search)
    count = min(count, len(keys))
    picked = [keys[round(i * (len(keys) - 1) / max(count - 1, 1))] for i in range(count)]
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for index, key in enumerate(picked):
        mask = HeadMask.from_rows(bits(key), returned.num_heads, window=returned.window, sinks=returned.sinks, model=returned.model,
                                  method="bosch-tied", provenance={"search": str(search), "journal_order": keys.index(key)})  # fmt: skip
        written.append(out / f"tied{index}.json")
        mask.save(written[-1])
    return written


def stage1_mask(search: Path) -> HeadMask:
    """The mask Stage 1 kept: ⌈ρ·G⌉ SWA groups in every layer, the first at the best score."""
    records = list(read_records(search / "journal.jsonl"))
    ratio = records[0]["header"]["settings"]["ratio"]
    returned = HeadMask.load(search / "mask.json")
    per_layer = math.ceil(ratio * returned.shape.num_kv_heads)
    candidates = [
        r
        for r in records
        if r.get("stage") == "stage1"
        and "score" in r
        and all(row.count("0") == per_layer for row in r["key"].split("/"))
    ]
    if not candidates:
        raise SystemExit(f"{search}: no Stage-1 mask with {per_layer} SWA groups in every layer in the journal")
    best = max(record["score"] for record in candidates)
    key = next(record["key"] for record in candidates if record["score"] == best)
    return HeadMask.from_rows(bits(key), returned.num_heads, window=returned.window, sinks=returned.sinks, model=returned.model,
                              method="bosch-stage1")  # fmt: skip


def copy_scores(search: Path, out: Path, also: Sequence[Path] = ()) -> int:
    """Write SEARCH's journal without its per-example values to ``OUT/journal.jsonl.gz``, then the
    scores and bounds of the ``also`` searches' masks it does not hold (their search time is
    theirs: ``wall_s`` is left out); the records kept."""
    kept = [record for record in read_records(search / "journal.jsonl") if "values" not in record]
    objective = _objective(kept[0]["header"])
    for other in also:
        records = list(read_records(other / "journal.jsonl"))
        theirs = _objective(records[0]["header"])
        differs = sorted(key for key in objective.keys() | theirs.keys() if objective.get(key) != theirs.get(key))
        if differs:
            raise SystemExit(
                f"{other / 'journal.jsonl'}: another objective than {search / 'journal.jsonl'} (header fields {differs} differ)"
            )
        held = {record["key"] for record in kept[1:]}
        # Without wall_s: a resume takes the largest one as this journal's earlier search time.
        kept += [
            {k: v for k, v in record.items() if k != "wall_s"}
            for record in records[1:]
            if "values" not in record and record["key"] not in held
        ]
    out.mkdir(parents=True, exist_ok=True)
    lines = "".join(json.dumps(record) + "\n" for record in kept)
    (out / "journal.jsonl.gz").write_bytes(gzip.compress(lines.encode("utf-8"), compresslevel=9, mtime=0))
    return len(kept)


def _objective(header: dict) -> dict:
    """What a journal's scores depend on: its header but the search settings (a journal written
    before the dtype was pinned has its runs' dtype, bfloat16 in results/smollm2)."""
    return {"dtype": "bfloat16", **{key: value for key, value in header.items() if key != "settings"}}


def ties_line(search: Path) -> str:
    """One search's tie count, as a search made since reports it."""
    mask = HeadMask.load(search / "mask.json")
    score = json.loads((search / "mask.json").read_text())["provenance"]["score"]
    _, ties = search_ties(search)
    return (f"{search.name}: S = {score:.4f}, {mask.num_swa_groups} SWA groups; {ties.scored} other masks tie, "
            f"{ties.may_tie} stopped early by racing could at best tie")  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    ties = commands.add_parser("ties", help="count the masks tied with each search's returned mask")
    ties.add_argument("searches", type=Path, nargs="+", help="finished searches' directories (mask.json and journal)")
    tied = commands.add_parser("tied", help="write tied masks for calib-check --mask")
    tied.add_argument("search", type=Path)
    tied.add_argument("count", type=int, help="how many tied masks to write, the returned one first")
    tied.add_argument("out", type=Path, help="directory for tied{i}.json")
    stage1 = commands.add_parser("stage1", help="write the mask Stage 1 kept")
    stage1.add_argument("search", type=Path)
    stage1.add_argument("out", type=Path, help="directory for stage1.json")
    copy = commands.add_parser("copy-scores", help="copy a journal without its per-example values")
    copy.add_argument("search", type=Path)
    copy.add_argument("out", type=Path, help="directory for journal.jsonl.gz")
    copy.add_argument(
        "--also", type=Path, nargs="+", default=[], help="other searches of the same objective whose masks to add"
    )
    args = parser.parse_args(argv)
    if args.command == "ties":
        for search in args.searches:
            print(ties_line(search))
    elif args.command == "tied":
        written = write_tied(args.search, args.count, args.out)
        print(
            f"{len(tied_in_journal_order(args.search))} masks tie with {args.search / 'mask.json'}; wrote {len(written)} to {args.out}"
        )
    elif args.command == "copy-scores":
        print(
            f"{args.out / 'journal.jsonl.gz'}: {copy_scores(args.search, args.out, args.also)} records of {args.search / 'journal.jsonl'}"
        )
    else:
        args.out.mkdir(parents=True, exist_ok=True)
        stage1_mask(args.search).save(args.out / "stage1.json")


if __name__ == "__main__":
    main()
