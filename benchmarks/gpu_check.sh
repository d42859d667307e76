#!/usr/bin/env bash
# The GPU check of issue 38 in one command, on a bare CUDA machine without network:
#
#   benchmarks/gpu_check.sh [--no-install] [gpu_check.py options, e.g. --out "$OUT"]
#
# 1. Installs the wheels in .whl/ (made beforehand on a machine with the package registry by
#    ../shared/gpu/wheels.sh from the project root; ignored by git, carried beside the
#    checkout) with the install line of that script's header, then this checkout
#    (pip install -e .). --no-install, or no .whl/ while bosch_eval and lm_eval import: the
#    installed packages are used as they are.
# 2. Runs benchmarks/gpu_check.py (default --device cuda; see its --help): every stage under a
#    time limit, results in <out>/<device name>/ (default results/gpu/), about 8 minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
install=1
if [ "${1:-}" = "--no-install" ]; then install=0; shift; fi
wheels=(.whl/*.whl)
if [ "$install" = 1 ] && [ -e "${wheels[0]}" ]; then
  started=$SECONDS
  # --no-deps: the image's torch, numpy, ... stay; .whl/ holds exactly what it lacks.
  # PIP_BREAK_SYSTEM_PACKAGES: a system Python marked externally managed would refuse otherwise.
  export PIP_BREAK_SYSTEM_PACKAGES=1
  timeout 180 python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir "${wheels[@]}"
  timeout 120 python3 -m pip install -q --no-index --no-deps --no-build-isolation -e .
  export PATH="$(python3 -c 'import sys, os; print(os.path.dirname(sys.executable))'):$PATH"  # bosch-eval, lm_eval
  export GPU_CHECK_INSTALLED="${#wheels[@]} wheels from .whl/ and pip install -e . in $((SECONDS - started)) s"
  echo "gpu_check.sh: installed $GPU_CHECK_INSTALLED"
elif python3 -c 'import bosch_eval, lm_eval' 2>/dev/null; then
  echo "gpu_check.sh: no install (--no-install or no .whl/); using the installed packages"
else
  echo "gpu_check.sh: error: no .whl/*.whl here and bosch_eval or lm_eval does not import;" \
       "run ../shared/gpu/wheels.sh from the project root on a machine with the package registry first" >&2
  exit 2
fi
exec python3 benchmarks/gpu_check.py "$@"
