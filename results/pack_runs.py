"""Pack a comparison's finished runs for committing (results/README.md): each ``samples_*.jsonl``
loses the prompt text (``doc.input`` and ``arguments.gen_args_0.arg_0``, the synthetic haystack:
most of its bytes; ``doc_hash`` still checks a regenerated document), then it and each
``results_*.json`` are gzipped in place, which ``compare`` and the leaderboard read as they are.
Runs in progress (``.partial/``) are left alone, so a comparison may still be running.

    python results/pack_runs.py results/smollm2/leaderboard_r0.75 [...]
"""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path


def strip_prompt(line: str) -> str:
    sample = json.loads(line)
    sample.get("doc", {}).pop("input", None)
    sample.get("arguments", {}).get("gen_args_0", {}).pop("arg_0", None)
    return json.dumps(sample, ensure_ascii=False)


def pack(path: Path, text: str) -> None:
    path.with_name(path.name + ".gz").write_bytes(gzip.compress(text.encode(), mtime=0))
    path.unlink()


def pack_runs(out: Path) -> int:
    packed = 0
    for run in sorted((out / "runs").iterdir()):
        if not (run / "run.json").is_file():
            continue
        for path in sorted(run.rglob("samples_*.jsonl")):
            pack(path, "".join(strip_prompt(line) + "\n" for line in path.read_text().splitlines()))
            packed += 1
        for path in sorted(run.rglob("results_*.json")):
            pack(path, path.read_text())
            packed += 1
    return packed


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    for folder in sys.argv[1:]:
        print(f"{folder}: {pack_runs(Path(folder))} files packed")
