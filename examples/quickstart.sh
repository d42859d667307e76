#!/usr/bin/env bash
# The main job on the bundled toy model (CPU): BOSCH search for a head mask with half of the
# KV groups on sliding-window attention, then a leaderboard at the same ratio (bosch-eval
# compare, every score through lm-eval): the original model, the BOSCH mask, the best static
# ranking (APL) and a layer heuristic (INTR), on held-out NIAH tasks and on the calibration
# task (in-sample for BOSCH and APL, both chosen on it), with KV-cache bytes and paired 95% CIs against the original.
# Usage: examples/quickstart.sh [OUT_DIR]   (default: quickstart; an existing search resumes)
# Threads: each command uses one less than the cores it may use (bosch_eval/runtime/threads.py), so a
# busy machine does not slow it down tenfold; OMP_NUM_THREADS=N overrides.
set -euo pipefail
out="${1:-quickstart}"
started=$SECONDS

echo "[1/4] BOSCH search on the toy model (ratio 0.5) -> $out/search"
resume=()
[ -f "$out/search/journal.jsonl" ] && resume=(--resume)  # a second run reuses the journaled scores
search_started=$SECONDS
bosch-eval search --model toy --ratio 0.5 --out "$out/search" "${resume[@]}"
search_s=$((SECONDS - search_started))  # the whole command: the incumbents' rankings and the model load too
bosch-eval mask show "$out/search/mask.json"

echo "[2/4] the best static ranking on the toy (APL, seconds) -> $out/apl.json"
bosch-eval rank --method apl --model toy --out "$out/apl.json"

echo "[3/4] leaderboard: original vs BOSCH vs APL vs a layer heuristic, all through lm_eval -> $out/leaderboard"
bosch-eval compare --config "$(dirname "$0")/quickstart_leaderboard.yaml" --out "$out/leaderboard" --resume \
  --entry "bosch-r0.5=mask=$out/search/mask.json" \
  --entry "apl-r0.5=ranking=$out/apl.json,ratio=0.5" > "$out/leaderboard.log"

echo "[4/4] summary ($((SECONDS - started)) s)"
python - "$out" "$search_s" <<'PY'
import json
import sys
from pathlib import Path

out, search_s = Path(sys.argv[1]), sys.argv[2]
provenance = json.loads((out / "search" / "mask.json").read_text())["provenance"]
calibration = provenance["calibration"]
print(f"mask:        {out / 'search' / 'mask.json'} (S = {provenance['score']:.3f}, {calibration['metric']} on "
      f"{', '.join(calibration['tasks'])}; full model {provenance['anchors']['all_full']:.3f}; "
      f"{provenance['evaluations']} masks evaluated; the search command ran {search_s} s)")
print(f"leaderboard: {out / 'leaderboard'}/leaderboard.md (.csv, .json, pareto.png; lm-eval's results and samples in runs/)")
print()
print((out / "leaderboard" / "leaderboard.md").read_text().split("\n\n", 2)[2])
PY
