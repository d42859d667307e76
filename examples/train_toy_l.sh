#!/usr/bin/env bash
# toy-l (issue 15): the bundled toy model's recipe with 8 layers x 8 KV groups (16 query heads
# of 16 dims on a 128-wide model; 64 head-selection variables). Resumable: run again to continue
# from results/toy_l/train/train_state.pt (checkpointed every 100 steps). About 4.8 h on 2 cores.
# Its first run learned no retrieval by step 1100 (results/toy_l/NOTES.md): change the recipe
# (learning rate, warm-up, curriculum) and watch train_acc in short runs before a long one.
set -euo pipefail
cd "$(dirname "$0")/.."
resume=()
[ -f results/toy_l/train/train_state.pt ] && resume=(--resume)
exec python -m bosch_eval.toy.train --out results/toy_l/train --layers 8 --heads 16 --kv-heads 8 --head-dim 16 \
  --hidden 128 --steps 3000 --eval-every 100 "${resume[@]}"
