#!/usr/bin/env bash
# Continual pretraining on the bundled toy model (paper B.5 / C.2 at toy scale).
# Usage: results/toy_train/commands.sh {smoke|recovery|extension}
#   smoke      20 steps at rho = 0.75 with BOSCH's mask: proves the command end to end and
#              measures tokens/s (the run in results/toy_train/smoke-bosch-r0.75).
#   recovery   BOSCH vs best static ranking vs INTR at rho = 0.875 and 0.75, same steps,
#              a loadable checkpoint every EXPORT steps, then lm_eval on each (held-out tasks).
#   extension  YaRN x2 (1024 -> 2048): the original model and a BOSCH hybrid, with and without training.
# The same commands run unchanged on a GPU (bf16 autocast is chosen automatically there).
# STEPS / EXPORT / OUT (and RATIOS for recovery) can be overridden from the environment. `recovery` reads the final masks
# from $OUT/masks/bosch-r{0.875,0.75}/mask.json and the best static rankings from $OUT/masks/{fisher,apl}.json
# (copies of results/toy_search/bosch-r*/mask.json and results/toy_compare/rankings/*.json). Step 0 (no training) is the mask applied
# to the toy model itself: evaluate pretrained=toy,<mask source> for the curves' first point.
set -euo pipefail
cd "$(dirname "$0")/../.."
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
STEPS="${STEPS:-200}"
EXPORT="${EXPORT:-50}"
OUT="${OUT:-runs/toy_train}"
TASKS_DIR="$(bosch-eval tasks --path)"
TOY="$(bosch-eval toy-model --path)"  # upstream RULER tokenizes with the pretrained= name: a path, not "toy"
LR="${LR:-3e-4}"  # the toy was pretrained at 3e-3 decaying to 3e-4; 20 steps at 3e-4 keep its calibration score (README.md here)
COMMON=(--model toy --data toy --seq-len 1024 --batch-size 8 --micro-batch-size 1 --lr "$LR" --warmup-ratio 0.1
        --save-every 10 --no-progress-bar)
YARN=(--rope-scaling yarn --rope-factor 2 --rope-original-max-positions 1024)

evaluate() {  # evaluate MODEL_ARGS "L1 L2 ..." OUTPUT  (held-out: upstream niah_single_1 and bosch_niah)
  # One lm_eval call per length: --limit keeps a task's first documents, and upstream RULER
  # tasks list them by length, so a two-length call with --limit would score only the first.
  for length in $2; do
    [ -d "$3/len$length" ] && continue  # done before (a rerun after a kill skips it)
    lm_eval --model bosch --model_args "$1" --device "${DEVICE:-cpu}" --batch_size 8 \
      --tasks niah_single_1,bosch_niah --include_path "$TASKS_DIR" --limit 20 \
      --metadata "{\"max_seq_lengths\": [$length], \"num_samples\": 20}" --output_path "$3/len$length"
  done
}

calib() {  # calib MODEL_ARGS OUTPUT: in-sample bosch_niah_calib at the search's setting (64 x 1024 tokens)
  lm_eval --model bosch --model_args "$1" --tasks bosch_niah_calib --include_path "$TASKS_DIR" --device cpu \
    --batch_size 8 --metadata '{"seq_len": 1024}' --output_path "$2"
}

resume_flag() { [ -f "$1/train_settings.json" ] && echo --resume || true; }

case "${1:-}" in
  smoke)  # the two committed 20-step runs, lr 3e-4 and 3e-5, then the in-sample calibration score of each
    for lr in 3e-4 3e-5; do
      bosch-eval train "${COMMON[@]}" --lr "$lr" --mask-source mask=results/toy_search/bosch-r0.75/mask.json --steps 20 \
        --out "results/toy_train/smoke-bosch-r0.75-lr$lr"
      calib "pretrained=results/toy_train/smoke-bosch-r0.75-lr$lr" "results/toy_train/smoke-bosch-r0.75-lr$lr/lm_eval"
    done
    calib "pretrained=$TOY,mask=results/toy_search/bosch-r0.75/mask.json" results/toy_train/untrained-bosch-r0.75/lm_eval
    ;;
  recovery)
    for ratio in ${RATIOS:-0.875 0.75}; do
      # The best static ranking at each ratio by the exact enumeration (results/toy_optimum): Fisher at 0.875, APL at 0.75.
      static=$([ "$ratio" = 0.875 ] && echo fisher || echo apl)
      for source in "bosch:mask=$OUT/masks/bosch-r$ratio/mask.json" "$static:ranking=$OUT/masks/$static.json,ratio=$ratio" \
                    "intr:layers=intr,ratio=$ratio"; do
        name="${source%%:*}-r$ratio"
        evaluate "pretrained=$TOY,${source#*:}" "512 1024" "$OUT/eval/$name/step-00000000"
        # shellcheck disable=SC2046
        bosch-eval train "${COMMON[@]}" --mask-source "${source#*:}" --steps "$STEPS" --export-every "$EXPORT" \
          --out "$OUT/$name" $(resume_flag "$OUT/$name")
        for checkpoint in "$OUT/$name"/step-*; do
          evaluate "pretrained=$checkpoint" "512 1024" "$OUT/eval/$name/$(basename "$checkpoint")"
        done
        evaluate "pretrained=$OUT/$name" "512 1024" "$OUT/eval/$name/step-$(printf %08d "$STEPS")"
      done
    done
    ;;
  extension)
    for source in "full:layers=intr,ratio=0,window=32" "bosch:mask=results/toy_search/bosch-r0.75/mask.json"; do
      name="yarn2-${source%%:*}"
      evaluate "pretrained=$TOY,${source#*:}" 2048 "$OUT/eval/$name/no-yarn"
      evaluate "pretrained=$TOY,${source#*:},rope_scaling=yarn,rope_factor=2,rope_original_max_positions=1024" 2048 \
        "$OUT/eval/$name/yarn-untrained"
      # shellcheck disable=SC2046
      bosch-eval train "${COMMON[@]}" --mask-source "${source#*:}" --seq-len 2048 --batch-size 4 --steps "$STEPS" \
        "${YARN[@]}" --out "$OUT/$name" $(resume_flag "$OUT/$name")
      evaluate "pretrained=$OUT/$name" 2048 "$OUT/eval/$name/yarn-trained"
    done
    ;;
  *) echo "usage: $0 {smoke|recovery|extension}" >&2; exit 2 ;;
esac
