"""A development-split rule's numbers: two masks' lm_eval runs on the same documents (``--log_samples``),
their scores, and the mean paired difference with its standard error (per document, B − A).

    python results/smollm2/paired_dev.py RUN_A RUN_B

RUN_A, RUN_B: lm_eval ``--output_path`` folders of one task each. A document's value is its
``acc`` (prefill tasks) or its ``score`` (bosch_niah_dev_gen: [length, value]).
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path


def document_values(run: Path) -> dict[tuple[str, int], float]:
    """(task, doc_id) -> the document's value, from every samples file under ``run``."""
    values = {}
    for path in sorted(run.rglob("samples_*.jsonl")):
        task = path.name.removeprefix("samples_").rsplit("_", 1)[0]
        for record in map(json.loads, path.read_text().splitlines()):
            value = record["acc"] if "acc" in record else record["score"]
            values[task, record["doc_id"]] = float(value[-1] if isinstance(value, list) else value)
    if not values:
        sys.exit(f"{run}: no samples_*.jsonl (run lm_eval with --log_samples)")
    return values


def main(run_a: str, run_b: str) -> None:
    a, b = document_values(Path(run_a)), document_values(Path(run_b))
    if a.keys() != b.keys():
        sys.exit(f"{run_a} and {run_b} scored different documents ({len(a)} and {len(b)})")
    differences = [b[key] - a[key] for key in a]
    n = len(differences)
    mean = sum(differences) / n
    se = math.sqrt(sum((d - mean) ** 2 for d in differences) / (n - 1) / n)
    print(f"{n} documents: A {sum(a.values()) / n:.3f}, B {sum(b.values()) / n:.3f}, B − A {mean:+.3f} ± {se:.3f} (SE)")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(*sys.argv[1:])
