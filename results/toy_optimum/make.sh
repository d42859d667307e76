#!/usr/bin/env bash
# The exact optimum of BOSCH's calibration objective on the bundled toy model, and where
# BOSCH, its ablations, the six static rankings and the layer heuristics rank among all masks.
# Run from the repo root:  bash results/toy_optimum/make.sh
# Each enumeration is resumable (kill it, run this again); ~3 s per mask on one CPU thread.
set -euo pipefail
here=results/toy_optimum
export OMP_NUM_THREADS=1
mkdir -p "$here/masks"

# 1. Every mask with ceil(rho*16) SWA groups, scored by the search's own S(z) (bosch_niah_calib acc).
for ratio in 0.875 0.75; do
  resume=(); { [ -f "$here/r$ratio/journal.jsonl" ] || [ -f "$here/r$ratio/journal.jsonl.gz" ]; } && resume=(--resume)  # .gz: committed, unpacked on --resume
  python -m bosch_eval.search.run.enumerate --model toy --ratio "$ratio" --out "$here/r$ratio" "${resume[@]}"
done

# 2. The masks to place: static rankings (results/toy_compare/rankings, from `bosch-eval rank`)
#    and layer heuristics at the same SWA count, BOSCH runs from results/toy_search. Only masks
#    with exactly ceil(rho*16) SWA groups are comparable: at 0.875 `single` (Stage 1 as is) turns
#    ceil(0.875*4) = 4 groups of every layer to SWA (16, not 14) and the layer heuristics 4 whole
#    layers, so neither is placed there.
for ratio in 0.875 0.75; do
  for method in apl fisher razor dcam proxy qada; do
    bosch-eval mask from-ranking "results/toy_compare/rankings/$method.json" --ratio "$ratio" \
      --out "$here/masks/$method-r$ratio.json" > /dev/null
  done
done
for heuristic in intr bme; do  # 3 whole layers = 12 groups
  bosch-eval mask from-layers $heuristic --model toy --ratio 0.75 --window 32 --out "$here/masks/$heuristic-r0.75.json" > /dev/null
done
for seed in 0 1 2; do
  bosch-eval mask from-layers rand --seed $seed --model toy --ratio 0.75 --window 32 --out "$here/masks/rand$seed-r0.75.json" > /dev/null
done

# 3. Place them (evaluates nothing: every score is in the journal).
places() { for item in "$@"; do printf -- '--place %s ' "$item"; done; }
ranked() { for method in apl fisher razor dcam proxy qada; do echo "$method=$here/masks/$method-r$1.json"; done; }
python -m bosch_eval.search.run.enumerate --model toy --ratio 0.875 --out "$here/r0.875" --resume \
  $(places bosch=results/toy_search/bosch-r0.875/mask.json $(ranked 0.875))
python -m bosch_eval.search.run.enumerate --model toy --ratio 0.75 --out "$here/r0.75" --resume \
  $(places bosch=results/toy_search/bosch-r0.75/mask.json single=results/toy_search/single-r0.75/mask.json \
    bosch-refine2=results/toy_search/refine2-r0.75/mask.json bosch-oneplusone=results/toy_search/oneplusone-r0.75/mask.json \
    multi=results/toy_search/multi-r0.75/mask.json layer=results/toy_search/layer-r0.75/mask.json \
    $(ranked 0.75) intr=$here/masks/intr-r0.75.json bme=$here/masks/bme-r0.75.json \
    rand0=$here/masks/rand0-r0.75.json rand1=$here/masks/rand1-r0.75.json rand2=$here/masks/rand2-r0.75.json)
