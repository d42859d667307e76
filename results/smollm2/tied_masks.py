"""Write mask files for masks a search's Stage 3 tied with the mask it returned.

    python results/smollm2/tied_masks.py results/smollm2/search/bosch-r0.75 8 results/smollm2/check_ties_r0.75/masks

The tied masks: Stage-3 masks of the journal scored to the end at the returned mask's score,
with as many SWA groups. COUNT of them, spread evenly over the journal's order from the first
(the search keeps the first it meets: the returned mask) to the last, become
``tied{i}.json`` with the returned mask's window and sinks, for ``calib-check --mask``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from bosch_eval.masks.head_mask import HeadMask
from bosch_eval.search.journal import mask_key, read_records


def tied_keys(search: Path, returned: HeadMask) -> list[str]:
    """The tied masks' keys in the order the journal first scored them."""
    scores: dict[str, float] = {}
    for record in read_records(search / "journal.jsonl"):
        if record.get("stage") == "stage3" and "score" in record:
            scores.setdefault(record["key"], record["score"])
    target = scores[mask_key(returned.bits)]
    return [key for key, score in scores.items() if score == target and key.count("0") == returned.num_swa_groups]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("search", type=Path, help="a finished search's directory (mask.json and its journal)")
    parser.add_argument("count", type=int, help="how many tied masks to write, the returned one first")
    parser.add_argument("out", type=Path, help="directory for tied{i}.json")
    args = parser.parse_args()
    returned = HeadMask.load(args.search / "mask.json")
    keys = tied_keys(args.search, returned)
    if keys[0] != mask_key(returned.bits):
        raise SystemExit(f"{args.search}: mask.json is not the first tied mask of the journal's Stage 3")
    count = min(args.count, len(keys))
    picked = [keys[round(i * (len(keys) - 1) / max(count - 1, 1))] for i in range(count)]
    args.out.mkdir(parents=True, exist_ok=True)
    for index, key in enumerate(picked):
        rows = [[int(bit) for bit in row] for row in key.split("/")]
        mask = HeadMask.from_rows(rows, returned.num_heads, window=returned.window, sinks=returned.sinks, model=returned.model,
                                  method="bosch-tied", provenance={"search": str(args.search), "journal_order": keys.index(key)})  # fmt: skip
        mask.save(args.out / f"tied{index}.json")
    print(f"{len(keys)} masks tie with {args.search / 'mask.json'}; wrote {count} to {args.out}")


if __name__ == "__main__":
    main()
