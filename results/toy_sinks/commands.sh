#!/bin/bash
# Makes results/toy_sinks/run (leaderboard, lm-eval results and samples per entry) and run.log.
# One CPU thread, on a shared 2-core machine; from the repo root.
set -euo pipefail
cd "$(dirname "$0")/../.."
OMP_NUM_THREADS=1 /usr/bin/time -v bosch-eval compare --config results/toy_sinks/sinks.yaml --out results/toy_sinks/run
