#!/usr/bin/env bash
# The main job on the bundled toy model (CPU): BOSCH search for a head mask with half of the
# KV groups on sliding-window attention, then the stock lm-eval CLI scores that mask on the
# calibration task (in-sample: the search optimized it) and on the held-out NIAH suite.
# Usage: examples/quickstart.sh [OUT_DIR]   (default: quickstart; an existing search resumes)
set -euo pipefail
out="${1:-quickstart}"
tasks="$(bosch-eval tasks --path)"
started=$SECONDS

echo "[1/3] BOSCH search on the toy model (ratio 0.5) -> $out/search"
resume=()
[ -f "$out/search/journal.jsonl" ] && resume=(--resume)  # a second run reuses the journaled scores
bosch-eval search --model toy --ratio 0.5 --out "$out/search" "${resume[@]}"
bosch-eval mask show "$out/search/mask.json"

echo "[2/3] lm_eval --model bosch on bosch_niah_calib and bosch_niah (512 and 1024 tokens) -> $out/results"
lm_eval --model bosch \
  --model_args "pretrained=toy,mask=$out/search/mask.json" \
  --tasks bosch_niah_calib,bosch_niah --include_path "$tasks" \
  --metadata '{"seq_len": 1024, "num_examples": 64, "max_seq_lengths": [512, 1024], "num_samples": 20}' \
  --device cpu --batch_size 8 --output_path "$out/results"

echo "[3/3] summary ($((SECONDS - started)) s)"
python - "$out" <<'EOF'
import json
import sys
from pathlib import Path

out = Path(sys.argv[1])
provenance = json.loads((out / "search" / "mask.json").read_text())["provenance"]
results_file = max((out / "results").rglob("results_*.json"), key=lambda path: path.stat().st_mtime)
results = json.loads(results_file.read_text())["results"]
value = lambda task, metric: next(v for k, v in results[task].items() if k.split(",")[0] == metric)
print(f"mask:    {out / 'search' / 'mask.json'} (S = {provenance['score']:.3f} on bosch_niah_calib, "
      f"full model {provenance['anchors']['all_full']:.3f}; {provenance['evaluations']} masks, {provenance['wall_s']:.0f} s of search)")
print(f"results: {results_file}")
print(f"bosch_niah_calib acc = {value('bosch_niah_calib', 'acc'):.3f} (in-sample: the search's own calibration set)")
print(f"bosch_niah score     = {value('bosch_niah', 'score'):.3f} (held out; 512 and 1024 tokens, 20 per length)")
EOF
