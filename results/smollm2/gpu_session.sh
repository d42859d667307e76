#!/usr/bin/env bash
# A study's guarded searches and their comparison on its test draw, on a lent GPU machine, side by side, inside one
# call's time: commands.sh's own steps (the same commands as on the CPU), each resumable, so a
# step the deadline stops goes on from its journal or finished runs in a later call, anywhere.
#
#   [STUDY=67] results/smollm2/gpu_session.sh SECONDS OUT_DIR [RATIO:SEED ...]
#   (RATIO:- : that ratio's leaderboard without a search)
#
# STUDY=53 (the default): issue 53's study, commands.sh study-search / study-compare, default 0.875:0 0.75:0 0.5:0.
# STUDY=67: issue 67's (doc_seed 6), commands.sh rank67 first where its rankings are missing, then search67 /
# compare67, default 0.875:0 0.875:1 0.75:0 0.9375:0.
#
# Per ratio named: the static entries of the study's YAML are scored while that ratio's
# searches run; once those end (done, or stopped DRAIN seconds before the
# deadline), the comparison resumes with the masks that exist. Few searches at a time: the
# processes share one GPU, and a search's calls are what the headline waits for.
# Everything under results/smollm2/{search/guarded[67]-r*,study[67]_r*} and the logs are packed into OUT_DIR.
# Needs: the project and its wheels installed, smollm2 resolvable (gguf_parts.sh), rankings/ (STUDY=53).
set -uo pipefail
budget=${1:?seconds}; out=${2:?output dir}; shift 2
case ${STUDY:-53} in
  53) search_step=study-search compare_step=study-compare tag="" defaults=(0.875:0 0.75:0 0.5:0) ;;
  67) search_step=search67 compare_step=compare67 tag=67 defaults=(0.875:0 0.875:1 0.75:0 0.9375:0) ;;
  *) echo "gpu_session.sh: STUDY: expected 53 or 67, got '$STUDY'" >&2; exit 2 ;;
esac
if [ $# -gt 0 ]; then searches=("$@"); else searches=("${defaults[@]}"); fi
ratios=$(printf '%s\n' "${searches[@]%%:*}" | sort -u)
R=results/smollm2
deadline=$((SECONDS + budget)); drain=${DRAIN:-110}  # seconds left to the comparisons after the searches
export OMP_NUM_THREADS=2 PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
logs=.gpu_logs; mkdir -p "$out" $logs
left() { local s=$((deadline - SECONDS - ${1:-0})); echo $((s > 1 ? s : 1)); }  # seconds until the deadline less $1, at least 1
# Convert the GGUF once, before the parallel steps all ask for it.
bosch-eval toy-model --path --name smollm2 || exit 1
# Issue 67's searches start from its rankings (minutes on a GPU; resumable: a finished one is kept).
if [ "$tag" = 67 ]; then $R/commands.sh rank67 > $logs/rank67.log 2>&1 || { tail -5 $logs/rank67.log; exit 1; }; fi
gpu() { command -v nvidia-smi > /dev/null && nvidia-smi --query-gpu="$1" --format=csv,noheader; }
gpu name,memory.total
ratio_pipeline() {
  local ratio=$1 compare searches=(); shift
  timeout -k 20 -s INT "$(left 30)" $R/commands.sh $compare_step "$ratio" > "$logs/compare${tag}_r$ratio.a.log" 2>&1 &
  compare=$!
  for seed in "$@"; do
    timeout -k 20 -s INT "$(left "$drain")" $R/commands.sh $search_step "$ratio" "$seed" > "$logs/search${tag}_r${ratio}_s$seed.log" 2>&1 &
    searches+=($!)
  done
  [ ${#searches[@]} -gt 0 ] && wait "${searches[@]}"
  echo "ratio $ratio: searches ended at ${SECONDS}s"
  # The searches are done or stopped: the static entries still to score yield to the searched
  # masks (the comparison loses only its batch in progress, its request cache the rest, and resumes with them first).
  [ ${#searches[@]} -gt 0 ] && kill -INT "$compare" 2> /dev/null
  wait "$compare"
  [ ${#searches[@]} -gt 0 ] && timeout -k 20 -s INT "$(left 30)" $R/commands.sh $compare_step "$ratio" > "$logs/compare${tag}_r$ratio.b.log" 2>&1
  echo "ratio $ratio: pipeline ended at ${SECONDS}s"
}
for ratio in $ratios; do
  seeds=(); for search in "${searches[@]}"; do [ "${search%%:*}" = "$ratio" ] && [ "${search#*:}" != - ] && seeds+=("${search#*:}"); done
  ratio_pipeline "$ratio" "${seeds[@]}" &
done
while [ "$(jobs -r | wc -l)" -gt 0 ]; do sleep 10; gpu utilization.gpu,memory.used; done
wait
for ratio in $ratios; do
  tar czf "$out/r$ratio.tgz" $R/search/guarded$tag-r$ratio* $R/study${tag}_r$ratio 2>/dev/null
done
tar czf "$out/logs.tgz" $logs
ls -l "$out"
