"""Re-pin the GPU session's runs to the canonical smollm2 checkpoint (run once, 2026-11-27).

The GPU machine converted the GGUF under HF_HUB_OFFLINE=1, and transformers wrote
``"local_files_only": true`` into the checkpoint's tokenizer_config.json (fixed since:
bosch_eval/models/gguf_models.py pins the flag). That file's digest is part of the model's
identity, so the session's comparison runs and search journals named another model and a
resume here refused them. Every other file of the two checkpoints is the same
(model.safetensors a672150f…, tokenizer.json bf346d64…: the weights and the tokenizer), and
the flag only says how the tokenizer was once loaded, so no score depends on it. This script
checks exactly that, in every file that pins the offline digest, and replaces it with the
canonical one:

    python results/smollm2/repin_offline_tokenizer_config.py
"""

from __future__ import annotations

import json
from pathlib import Path

from bosch_eval.models.model_check import resolve_model
from bosch_eval.runtime.digests import file_digest

OFFLINE = "78b3e0cc3e57fd04e57f66e0f8bda1dc8a094922b6401832e239667a267f2a99"
FILES = ["results/smollm2/leaderboard_r*/runs/*/run.json", "results/smollm2/search/bosch-*/journal.jsonl"]


def pinned_files(text: str) -> dict[str, str]:
    """The ``files`` digests of the model identity pinned in a run.json or a journal's header."""
    record = json.loads(text.splitlines()[0] if text.startswith('{"journal"') else text)
    identity = record["header"]["model_identity"] if "header" in record else record["inputs"]["model"]
    return identity["files"]


def main() -> None:
    checkpoint = Path(resolve_model("smollm2"))
    canonical = {path.name: file_digest(path) for path in checkpoint.iterdir() if path.is_file()}
    changed = 0
    for pattern in FILES:
        for path in sorted(Path().glob(pattern)):
            text = path.read_text()
            if OFFLINE not in text:
                continue
            files = pinned_files(text)
            differ = {name for name, digest in files.items() if canonical.get(name) != digest}
            if differ != {"tokenizer_config.json"} or files["tokenizer_config.json"] != OFFLINE:
                raise SystemExit(f"{path}: pins other files than the canonical checkpoint's: {sorted(differ)}")
            path.write_text(text.replace(OFFLINE, canonical["tokenizer_config.json"]))
            changed += 1
    print(f"re-pinned {changed} files to tokenizer_config.json {canonical['tokenizer_config.json'][:12]}…")


if __name__ == "__main__":
    main()
