"""Count, for committed searches, the masks their calibration set ties with the mask returned.

    python results/smollm2/search_ties.py results/smollm2/search/bosch-*

A search made since the count existed prints it when it ends and writes it to report.md and
mask.json (``provenance.ties``); these searches ran before, so the count is taken here from
their journals with the same function (``bosch_eval.search.saturation.search_ties``): the other
masks with as many SWA groups at exactly the returned S, and the masks racing stopped early
that could at best tie.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from bosch_eval.masks.head_mask import HeadMask
from bosch_eval.search.saturation import search_ties


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("searches", type=Path, nargs="+", help="finished searches' directories (mask.json and journal)")
    for search in parser.parse_args().searches:
        mask = HeadMask.load(search / "mask.json")
        score = json.loads((search / "mask.json").read_text())["provenance"]["score"]
        _, ties = search_ties(search)
        print(
            f"{search.name}: S = {score:.4f}, {mask.num_swa_groups} SWA groups; {ties.scored} other masks tie, "
            f"{ties.may_tie} stopped early by racing could at best tie"
        )


if __name__ == "__main__":
    main()
