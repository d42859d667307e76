#!/bin/bash
# Old (d34dd5c, before this session) against new (main) on the same idle machine, alternating.
set -u
export OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
out=${1:?usage: run.sh OUT (old checkout at /work/wt/old, new at /work/main, each with its .venv)}; rm -rf $out; mkdir -p $out
for rep in 1 2 3; do
  for v in old main; do
    dir=$([ $v = old ] && echo /work/wt/old || echo /work/main)
    ( cd $dir && . .venv/bin/activate && s=$(date +%s.%N) && \
      lm_eval --model bosch --model_args pretrained=toy,layers=bme,ratio=0.5 --device cpu --batch_size 8 \
        --tasks bosch_niah_calib --include_path $dir/tasks --metadata '{"seq_len": 1024, "num_examples": 64}' > $out/lm_eval_${v}_$rep.log 2>&1; \
      e=$(date +%s.%N); echo "lm_eval $v $rep $(echo "$e - $s" | bc)" >> $out/times.txt )
  done
done
for v in old main; do
  dir=$([ $v = old ] && echo /work/wt/old || echo /work/main)
  ( cd $dir && . .venv/bin/activate && s=$(date +%s.%N) && bosch-eval search --model toy --ratio 0.5 --out $out/search_$v > $out/search_$v.log 2>&1; \
    e=$(date +%s.%N); echo "search $v 1 $(echo "$e - $s" | bc)" >> $out/times.txt )
  ( cd $dir && . .venv/bin/activate && python benchmarks/swa_attention.py --lengths 2048 8192 > $out/swa_attention_$v.txt 2>&1 )
done
cat $out/times.txt
