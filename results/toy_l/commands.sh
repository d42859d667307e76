#!/usr/bin/env bash
# Everything under results/toy_l, from the repo root. Each step is resumable; run one at a time
# or, on 2 cores, the two searches side by side with OMP_NUM_THREADS=1.
set -euo pipefail
step=${1:?usage: results/toy_l/commands.sh train|check|rank|search RATIO|compare}
case $step in
  train)   examples/train_toy_l.sh ;;  # writes bosch_eval/toy/model_l
  check)   python benchmarks/toy_model_checks.py --model bosch_eval/toy/model_l --out results/toy_l/checks \
             --random-ratios 0.5 0.75 ;;
  rank)    for method in dcam apl proxy qada razor fisher; do
             bosch-eval rank --method $method --model toy-l --out results/toy_l/rankings/$method.json
           done ;;
  search)  ratio=${2:?ratio}; out=results/toy_l/search/bosch-r$ratio
             resume=(); { [ -f $out/journal.jsonl ] || [ -f $out/journal.jsonl.gz ]; } && resume=(--resume)  # .gz: committed, unpacked on --resume
             bosch-eval search --model toy-l --ratio $ratio --variant bosch --calib-metric acc --out $out "${resume[@]}" ;;  # the paper's variant, as run
  compare) bosch-eval compare --config results/toy_l/leaderboard.yaml --out results/toy_l/leaderboard --resume ;;
esac
