#!/usr/bin/env bash
# The main job end to end on a local model, until the bundled toy model lands:
# write a random-weight Qwen3 checkpoint, build an INTR head mask at rho = 0.5,
# print it, and evaluate it with the stock lm-eval CLI as `--model bosch`.
set -euo pipefail
out="${1:-quickstart}"
here="$(cd "$(dirname "$0")/.." && pwd)"

python - "$out" <<'PY'
import sys
from pathlib import Path

from transformers import AutoConfig

from bosch_eval.masks import ModelShape
from bosch_eval.random_model import save_random_checkpoint
from bosch_eval.search.layer_heuristics import layer_heuristic_mask

out = Path(sys.argv[1])
model_dir = save_random_checkpoint(out / "model")
shape = ModelShape.from_config(AutoConfig.from_pretrained(model_dir))
layer_heuristic_mask("intr", shape, ratio=0.5).with_meta(window=8, model=str(model_dir)).save(out / "mask.json")
PY

bosch-eval mask show "$out/mask.json"
lm_eval --model bosch \
  --model_args "pretrained=$out/model,mask=$out/mask.json,dtype=float32" \
  --tasks bosch_test_choice,bosch_test_continuation --include_path "$here/tests/fixtures/tasks" \
  --device cpu --batch_size 4 --output_path "$out/results"
