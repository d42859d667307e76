#!/usr/bin/env bash
# The tie-break candidate at ratio R on a lent GPU, in one call: commands.sh tie-break R (the search's tied
# masks scored on bosch_niah_calib_uuid), dev-tiebreak R (the development rule's numbers, README "What is
# left") and compare R (its held-out leaderboard entry, reported whatever the rule decides), each under a
# share of SECONDS and resumable; what they wrote is packed into OUT_DIR.
#
#   results/smollm2/gpu_tiebreak.sh SECONDS OUT_DIR [RATIO]   (default ratio 0.75)
#
# Needs what gpu_session.sh needs (the project and its wheels installed, smollm2 resolvable).
set -uo pipefail
budget=${1:?seconds}; out=${2:?output dir}; ratio=${3:-0.75}
R=results/smollm2
deadline=$((SECONDS + budget))
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false DEVICE=cuda
left() { local s=$((deadline - SECONDS - $1)); echo $((s > 1 ? s : 1)); }  # seconds until the deadline less $1, at least 1
mkdir -p "$out" .gpu_logs
bosch-eval toy-model --path --name smollm2 || exit 1
timeout -k 20 -s INT "$(left 240)" $R/commands.sh tie-break "$ratio" > .gpu_logs/tie_break_r$ratio.log 2>&1
echo "tie-break: rc $? at ${SECONDS}s"
timeout -k 20 -s INT "$(left 120)" $R/commands.sh dev-tiebreak "$ratio" > .gpu_logs/dev_tiebreak_r$ratio.log 2>&1
echo "dev-tiebreak: rc $? at ${SECONDS}s"; tail -2 .gpu_logs/dev_tiebreak_r$ratio.log
timeout -k 20 -s INT "$(left 30)" $R/commands.sh compare "$ratio" > .gpu_logs/compare_r$ratio.log 2>&1
echo "compare: rc $? at ${SECONDS}s"
tar czf "$out/tiebreak_r$ratio.tgz" $R/search/bosch-uuidtie-r$ratio $R/dev_tiebreak_r$ratio $R/leaderboard_r$ratio .gpu_logs 2>/dev/null
ls -l "$out"
