#!/usr/bin/env bash
# The main job on the bundled toy model (CPU, a few minutes): BOSCH search for a head mask
# with half of the KV groups on sliding-window attention, then the stock lm-eval CLI
# scores that mask on the calibration task and on the NIAH suite.
set -euo pipefail
out="${1:-quickstart}"
tasks="$(bosch-eval tasks --path)"

bosch-eval search --model toy --ratio 0.5 --out "$out/search"
bosch-eval mask show "$out/search/mask.json"
lm_eval --model bosch \
  --model_args "pretrained=toy,mask=$out/search/mask.json" \
  --tasks bosch_niah_calib,bosch_niah --include_path "$tasks" \
  --metadata '{"seq_len": 1024, "num_examples": 64, "max_seq_lengths": [512, 1024], "num_samples": 20}' \
  --device cpu --batch_size 8 --output_path "$out/results"
