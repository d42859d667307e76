#!/usr/bin/env bash
# Issue 53's study (the guarded searches and their comparison on the fresh draw) on a lent GPU machine, side by side, inside one
# call's time: commands.sh's own steps (the same commands as on the CPU), each resumable, so a
# step the deadline stops goes on from its journal or finished runs in a later call, anywhere.
#
#   results/smollm2/gpu_session.sh SECONDS OUT_DIR [RATIO:SEED ...]   (default: 0.875:0 0.75:0 0.5:0)
#   (RATIO:- : that ratio's leaderboard without a search)
#
# Per ratio named: the static entries of study_rR.yaml are scored while that ratio's
# searches run; once those end (done, or stopped DRAIN seconds before the
# deadline), the comparison resumes with the masks that exist. Few searches at a time: the
# processes share one GPU, and a search's calls are what the headline waits for.
# Everything under results/smollm2/{search/guarded-r*,study_r*} and the logs are packed into OUT_DIR.
# METRIC: the calibration metric objective_choice.md chose (commands.sh study-search reads it).
# Needs: the project and its wheels installed, smollm2 resolvable (gguf_parts.sh), rankings/.
set -uo pipefail
budget=${1:?seconds}; out=${2:?output dir}; shift 2
if [ $# -gt 0 ]; then searches=("$@"); else searches=(0.875:0 0.75:0 0.5:0); fi
ratios=$(printf '%s\n' "${searches[@]%%:*}" | sort -u)
R=results/smollm2
deadline=$((SECONDS + budget)); drain=${DRAIN:-110}  # seconds left to the comparisons after the searches
export OMP_NUM_THREADS=2 PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
logs=.gpu_logs; mkdir -p "$out" $logs
left() { local s=$((deadline - SECONDS - ${1:-0})); echo $((s > 1 ? s : 1)); }  # seconds until the deadline less $1, at least 1
# Convert the GGUF once, before the parallel steps all ask for it.
bosch-eval toy-model --path --name smollm2 || exit 1
gpu() { command -v nvidia-smi > /dev/null && nvidia-smi --query-gpu="$1" --format=csv,noheader; }
gpu name,memory.total
ratio_pipeline() {
  local ratio=$1 compare searches=(); shift
  timeout -k 20 -s INT "$(left 30)" $R/commands.sh study-compare "$ratio" > "$logs/compare_r$ratio.a.log" 2>&1 &
  compare=$!
  for seed in "$@"; do
    timeout -k 20 -s INT "$(left "$drain")" $R/commands.sh study-search "$ratio" "$seed" > "$logs/search_r${ratio}_s$seed.log" 2>&1 &
    searches+=($!)
  done
  [ ${#searches[@]} -gt 0 ] && wait "${searches[@]}"
  echo "ratio $ratio: searches ended at ${SECONDS}s"
  # The searches are done or stopped: the static entries still to score yield to the searched
  # masks (the comparison loses only its batch in progress, its request cache the rest, and resumes with them first).
  [ ${#searches[@]} -gt 0 ] && kill -INT "$compare" 2> /dev/null
  wait "$compare"
  [ ${#searches[@]} -gt 0 ] && timeout -k 20 -s INT "$(left 30)" $R/commands.sh study-compare "$ratio" > "$logs/compare_r$ratio.b.log" 2>&1
  echo "ratio $ratio: pipeline ended at ${SECONDS}s"
}
for ratio in $ratios; do
  seeds=(); for search in "${searches[@]}"; do [ "${search%%:*}" = "$ratio" ] && [ "${search#*:}" != - ] && seeds+=("${search#*:}"); done
  ratio_pipeline "$ratio" "${seeds[@]}" &
done
while [ "$(jobs -r | wc -l)" -gt 0 ]; do sleep 10; gpu utilization.gpu,memory.used; done
wait
for ratio in $ratios; do
  tar czf "$out/r$ratio.tgz" $R/search/guarded-r$ratio* $R/study_r$ratio 2>/dev/null
done
tar czf "$out/logs.tgz" $logs
ls -l "$out"
