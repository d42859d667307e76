#!/usr/bin/env bash
# toy-l (issue 15): 8 layers x 8 KV groups (64 head-selection variables), 16 query heads of 16 dims
# on a 128-wide Qwen3, W = 32 at 1024 tokens. Two stages, each resumable (run the script again
# after an interruption; states are checkpointed at every evaluation):
#   1. the first 2500 of 6000 steps of the recipe that learned retrieval (peak lr 1e-3, 300
#      warm-up steps, curriculum over 3000 steps; the toy's lr 3e-3 learned none by step 1100,
#      results/toy_l/NOTES.md): 7 minutes on an H100 shared with four other runs, ~2.5 h on 2 CPU cores;
#   2. 500 steps at the full 1152-token length from stage 1's weights with a fresh optimizer
#      (peak lr 5e-4, cosine to 10%): ~35 minutes on 2 CPU cores.
# The trainer uses CUDA when it is there; the same script runs unchanged on a GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
shape=(--layers 8 --heads 16 --kv-heads 8 --head-dim 16 --hidden 128)
stage1=results/toy_l/stage1 stage2=results/toy_l/stage2
resume_if_started() { [ -f "$1/train_state.pt" ] && echo --resume || true; }
if [ ! -f $stage1/model.safetensors ]; then
  python -m bosch_eval.toy.train --out $stage1 "${shape[@]}" --lr 1e-3 --warmup 300 --curriculum-steps 3000 \
    --steps 6000 --stop-after 2500 --eval-every 250 $(resume_if_started $stage1)
fi
python -m bosch_eval.toy.train --out $stage2 "${shape[@]}" --init-from $stage1 --start-len 1152 --curriculum-steps 1 \
  --lr 5e-4 --warmup 50 --steps 500 --eval-every 100 $(resume_if_started $stage2)
mkdir -p bosch_eval/toy/model_l
cp $stage2/{config.json,generation_config.json,model.safetensors,tokenizer.json,tokenizer_config.json,training.json} \
  bosch_eval/toy/model_l/
